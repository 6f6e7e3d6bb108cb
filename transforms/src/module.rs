//! A transform module: validated against the WIT world and compiled once, then
//! instantiated per input partition (see `instance.rs`).
//!
//! Validation, in order, each failure a [`TransformError::InvalidModule`] that
//! says what is wrong and what to do: the size bound; the WebAssembly header (a
//! core module instead of a component is named as such); compilation; every
//! import is one the host provides (the contract's `log`/`state`/`types` of a
//! version the host runs, or WASI preview 2); the exports `init` and `process`
//! exist with the types of the current contract or, for a module built with an
//! older rill-sdk, of contract 0.1.0.

use std::sync::{Arc, OnceLock};

use wasmtime::component::{Component, Linker, types::ComponentItem};

use crate::engine::engine;
use crate::error::TransformError;
use crate::instance::HostState;
use crate::wit::{CONTRACT_VERSION, CONTRACT_VERSIONS, TransformPre, WORLD, v0_1};

/// The largest module accepted (it is stored in one record of `__transforms`).
pub const MODULE_BYTES_MAX: usize = 8 * 1024 * 1024;

const WASM_MAGIC: &[u8; 4] = b"\0asm";
const CORE_VERSION: [u8; 4] = [1, 0, 0, 0];
const COMPONENT_VERSION: [u8; 4] = [0x0d, 0, 1, 0];

/// The functions the world exports.
const EXPORTS: [&str; 2] = ["init", "process"];
/// The interfaces of the contract a module may import (any version is looked at
/// so that a mismatch can be named).
const CONTRACT_PACKAGE: &str = "rill:transform/";

/// A module ready to instantiate, by the contract version it was built for.
#[derive(Clone)]
pub(crate) enum ContractPre {
    Current(TransformPre<HostState>),
    V0_1(v0_1::TransformPre<HostState>),
}

/// A compiled, validated transform module. Cheap to clone.
#[derive(Clone)]
pub struct TransformModule {
    pub(crate) pre: ContractPre,
    bytes_len: usize,
}

impl std::fmt::Debug for TransformModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransformModule")
            .field("bytes_len", &self.bytes_len)
            .finish_non_exhaustive()
    }
}

/// The linker with WASI preview 2 and the contract's imports (built once).
pub(crate) fn linker() -> &'static Linker<HostState> {
    static LINKER: OnceLock<Linker<HostState>> = OnceLock::new();
    LINKER.get_or_init(|| {
        let mut linker = Linker::new(engine());
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).expect("WASI links");
        crate::wit::Transform::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .expect("the contract's imports link");
        v0_1::Transform::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )
        .expect("contract 0.1.0's imports link");
        linker
    })
}

impl TransformModule {
    /// Validates and compiles `bytes`.
    pub fn compile(bytes: &[u8]) -> Result<Arc<TransformModule>, TransformError> {
        check_header(bytes)?;
        let engine = engine();
        let component = Component::new(engine, bytes).map_err(|e| {
            TransformError::invalid(format!(
                "the component does not compile: {e:#}; rebuild it with `rill transform build`"
            ))
        })?;
        let ty = component.component_type();
        for (name, _) in ty.imports(engine) {
            check_import(name)?;
        }
        let exports: Vec<(String, bool)> = ty
            .exports(engine)
            .map(|(name, item)| {
                (
                    name.to_string(),
                    matches!(item.ty, ComponentItem::ComponentFunc(_)),
                )
            })
            .collect();
        for want in EXPORTS {
            if !exports
                .iter()
                .any(|(name, is_func)| name == want && *is_func)
            {
                let found: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).collect();
                return Err(TransformError::invalid(format!(
                    "the component does not export the function `{want}` of world {WORLD} (it exports: {}); is it built with rill-sdk and a #[rill_sdk::transform] function?",
                    if found.is_empty() {
                        "nothing".to_string()
                    } else {
                        found.join(", ")
                    }
                )));
            }
        }
        let instance_pre = linker().instantiate_pre(&component).map_err(|e| {
            TransformError::invalid(format!(
                "the component's imports cannot be satisfied: {e:#}"
            ))
        })?;
        // The newest contract first; a module built for an older one still runs.
        let pre = match TransformPre::new(instance_pre.clone()) {
            Ok(pre) => ContractPre::Current(pre),
            Err(current) => match v0_1::TransformPre::new(instance_pre) {
                Ok(pre) => ContractPre::V0_1(pre),
                Err(_) => {
                    return Err(TransformError::invalid(format!(
                        "the component's exports do not match world {WORLD}: {current:#}; rebuild it against rill-sdk {CONTRACT_VERSION}"
                    )));
                }
            },
        };
        Ok(Arc::new(TransformModule {
            pre,
            bytes_len: bytes.len(),
        }))
    }

    /// The contract version the module was built for.
    pub fn contract_version(&self) -> &'static str {
        match self.pre {
            ContractPre::Current(_) => CONTRACT_VERSION,
            ContractPre::V0_1(_) => v0_1::CONTRACT_VERSION,
        }
    }

    /// The size of the module's bytes.
    pub fn bytes_len(&self) -> usize {
        self.bytes_len
    }
}

fn check_header(bytes: &[u8]) -> Result<(), TransformError> {
    if bytes.len() > MODULE_BYTES_MAX {
        return Err(TransformError::invalid(format!(
            "the module is {} bytes, more than the bound of {MODULE_BYTES_MAX} bytes; build it with --release (rill transform build does)",
            bytes.len()
        )));
    }
    if bytes.len() < 8 || &bytes[..4] != WASM_MAGIC {
        return Err(TransformError::invalid(
            "the file is not WebAssembly (no \\0asm header): pass the .wasm file that `rill transform build` printed",
        ));
    }
    let version: [u8; 4] = bytes[4..8].try_into().expect("4 bytes");
    if version == CORE_VERSION {
        return Err(TransformError::invalid(
            "the file is a core WebAssembly module, not a component: build it for --target wasm32-wasip2 (`rill transform build` does)",
        ));
    }
    if version != COMPONENT_VERSION {
        return Err(TransformError::invalid(format!(
            "the file is a WebAssembly binary of an unknown version/layer {version:02x?}"
        )));
    }
    Ok(())
}

fn check_import(name: &str) -> Result<(), TransformError> {
    if name.starts_with("wasi:") {
        // WASI preview 2, provided without file system, network or environment;
        // an interface of a version the host lacks fails at instantiate_pre.
        return Ok(());
    }
    if let Some(rest) = name.strip_prefix(CONTRACT_PACKAGE) {
        let (interface, version) = rest.split_once('@').unwrap_or((rest, "none"));
        if !["log", "state", "types"].contains(&interface) {
            return Err(TransformError::invalid(format!(
                "the component imports `{name}`, which is not part of the contract {WORLD} (it has log, state and types)"
            )));
        }
        if !CONTRACT_VERSIONS.contains(&version) {
            return Err(TransformError::invalid(format!(
                "the component was built for contract version {version} (import `{name}`); this host runs {}: rebuild it against rill-sdk {CONTRACT_VERSION}",
                CONTRACT_VERSIONS.join(" and ")
            )));
        }
        return Ok(());
    }
    Err(TransformError::invalid(format!(
        "the component imports `{name}`, which the host does not provide (only the contract {WORLD} and WASI preview 2)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(bytes: &[u8]) -> String {
        TransformModule::compile(bytes).unwrap_err().to_string()
    }

    #[test]
    fn refuses_what_is_not_a_component_by_name() {
        assert!(err(b"hello world").contains("not WebAssembly"));
        let core = [b'\0', b'a', b's', b'm', 1, 0, 0, 0];
        assert!(err(&core).contains("core WebAssembly module"));
        let big = vec![0u8; MODULE_BYTES_MAX + 1];
        assert!(err(&big).contains("bound"));
    }

    #[test]
    fn refuses_a_component_without_the_exports() {
        // The smallest valid component: header only, no imports, no exports.
        let mut empty = WASM_MAGIC.to_vec();
        empty.extend_from_slice(&COMPONENT_VERSION);
        let e = err(&empty);
        assert!(e.contains("does not export the function `init`"), "{e}");
    }

    #[test]
    fn names_foreign_imports_and_version_mismatches() {
        assert!(check_import("wasi:cli/stderr@0.2.0").is_ok());
        assert!(check_import("rill:transform/state@0.2.0").is_ok());
        // Built with an older SDK: still runs.
        assert!(check_import("rill:transform/state@0.1.0").is_ok());
        let e = check_import("rill:transform/state@0.3.0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("contract version 0.3.0"), "{e}");
        assert!(e.contains("this host runs 0.2.0 and 0.1.0"), "{e}");
        assert!(e.contains("rebuild it against rill-sdk 0.2.0"), "{e}");
        let e = check_import("acme:thing/x").unwrap_err().to_string();
        assert!(e.contains("acme:thing/x"), "{e}");
    }
}
