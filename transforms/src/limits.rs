//! The bounds of what a transform may take: the operator's maxima a
//! deployment is checked against ([`HostMaxima`]), and the per-instance cap
//! wasmtime enforces while the instance runs ([`InstanceLimiter`]).
//!
//! Why a limiter of our own: wasmtime's `StoreLimits::memory_size` bounds each
//! linear memory on its own, and a component holds several core instances,
//! each with its memories and tables, so an instance could take that cap many
//! times over. [`InstanceLimiter`] keeps the sum of every memory's size and
//! every table's elements (at [`TABLE_ELEMENT_BYTES`] each) of one store —
//! one store is one transform instance — under the deployment's
//! `memory_bytes_max`, and bounds how many core instances, memories and tables
//! it may create.
//!
//! Invariants: the sum only grows (a store's memories and tables live until
//! the store is dropped, and a trapped instance gets a new store); a growth the
//! limiter refuses, or one that fails after it was allowed, traps the call (as
//! before, with `trap_on_grow_failure`), so a module never runs on with a
//! half-failed allocation.

use wasmtime::ResourceLimiter;

use crate::error::TransformError;

/// Default `transforms.memory_mb_max` of a host, in bytes.
pub const MEMORY_BYTES_MAX_DEFAULT_MAXIMUM: u64 = 512 * 1024 * 1024;
/// Default `transforms.call_timeout_ms_max` of a host.
pub const CALL_TIMEOUT_MS_MAX_DEFAULT: u64 = 60_000;
/// The largest memory cap any host accepts: a 32-bit guest addresses 4 GiB.
pub const MEMORY_BYTES_CEILING: u64 = 4096 * 1024 * 1024;
/// The longest call deadline any host accepts (10 minutes).
pub const CALL_TIMEOUT_MS_CEILING: u64 = 600_000;
/// The smallest memory cap a deployment may ask for.
pub const MEMORY_BYTES_MIN: u64 = 1024 * 1024;

/// What one table element is counted as against the memory cap (wasmtime
/// keeps a pointer or two per element).
pub const TABLE_ELEMENT_BYTES: usize = 16;
/// Most core instances one transform instance may create (a component built
/// by `rill transform build` creates a handful).
pub const CORE_INSTANCES_MAX: usize = 64;
/// Most linear memories of one transform instance, all core instances together.
pub const MEMORIES_MAX: usize = 16;
/// Most tables of one transform instance, all core instances together.
pub const TABLES_MAX: usize = 64;

/// The operator's maxima for deployments run by a host (a `rill broker`'s
/// `[transforms]` config, or the defaults for `rill transform run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMaxima {
    /// The largest `memory_bytes_max` a deployment may ask for.
    pub memory_bytes_max: u64,
    /// The longest `call_timeout_ms` a deployment may ask for.
    pub call_timeout_ms_max: u64,
}

impl Default for HostMaxima {
    fn default() -> HostMaxima {
        HostMaxima {
            memory_bytes_max: MEMORY_BYTES_MAX_DEFAULT_MAXIMUM,
            call_timeout_ms_max: CALL_TIMEOUT_MS_MAX_DEFAULT,
        }
    }
}

impl HostMaxima {
    /// The bounds no host goes beyond (what `rill transform deploy` checks,
    /// since the hosts' own maxima are in their configs).
    pub const CEILING: HostMaxima = HostMaxima {
        memory_bytes_max: MEMORY_BYTES_CEILING,
        call_timeout_ms_max: CALL_TIMEOUT_MS_CEILING,
    };

    /// Maxima from a broker's `transforms.memory_mb_max` and
    /// `transforms.call_timeout_ms_max`, capped at [`HostMaxima::CEILING`].
    pub fn from_config(memory_mb_max: u64, call_timeout_ms_max: u64) -> HostMaxima {
        HostMaxima {
            memory_bytes_max: memory_mb_max
                .saturating_mul(1024 * 1024)
                .min(MEMORY_BYTES_CEILING),
            call_timeout_ms_max: call_timeout_ms_max.min(CALL_TIMEOUT_MS_CEILING),
        }
    }

    /// Checks a deployment's limits against these maxima; the error names the
    /// limit, the config key that sets it and what to do.
    pub fn check(&self, memory_bytes_max: u64, call_timeout_ms: u64) -> Result<(), TransformError> {
        let err = |m: String| Err(TransformError::Deployment(m));
        if memory_bytes_max < MEMORY_BYTES_MIN {
            return err(format!(
                "the memory cap of {memory_bytes_max} bytes is below the smallest, 1 MiB: pass --memory-mb 1 or more"
            ));
        }
        let ceiling = *self == HostMaxima::CEILING;
        if memory_bytes_max > self.memory_bytes_max && ceiling {
            return err(format!(
                "the deployment asks for {} MiB of memory per instance, more than any host allows \
                 ({} MiB: a 32-bit guest addresses 4 GiB): pass a smaller --memory-mb",
                memory_bytes_max.div_ceil(1024 * 1024),
                MEMORY_BYTES_CEILING / (1024 * 1024)
            ));
        }
        if memory_bytes_max > self.memory_bytes_max {
            return err(format!(
                "the deployment asks for {} MiB of memory per instance, more than this host allows \
                 (transforms.memory_mb_max = {} MiB): deploy with --memory-mb {} or less, or raise \
                 transforms.memory_mb_max in the config of the brokers that run transforms",
                memory_bytes_max.div_ceil(1024 * 1024),
                self.memory_bytes_max / (1024 * 1024),
                self.memory_bytes_max / (1024 * 1024)
            ));
        }
        if call_timeout_ms == 0 {
            return err("the call timeout must be above 0 ms: pass --timeout-ms 1 or more".into());
        }
        if call_timeout_ms > self.call_timeout_ms_max && ceiling {
            return err(format!(
                "the deployment asks for a call timeout of {call_timeout_ms} ms, more than any host \
                 allows ({CALL_TIMEOUT_MS_CEILING} ms): pass a smaller --timeout-ms"
            ));
        }
        if call_timeout_ms > self.call_timeout_ms_max {
            return err(format!(
                "the deployment asks for a call timeout of {call_timeout_ms} ms, more than this host \
                 allows (transforms.call_timeout_ms_max = {} ms): deploy with --timeout-ms {} or \
                 less, or raise transforms.call_timeout_ms_max in the config of the brokers that run \
                 transforms",
                self.call_timeout_ms_max, self.call_timeout_ms_max
            ));
        }
        Ok(())
    }
}

/// Text every refusal of [`InstanceLimiter`] starts with (`instance.rs` names
/// the cap in the trap it reports).
pub(crate) const CAP_EXCEEDED: &str = "growing memory or a table past the instance's cap";

/// One transform instance's cap on all its memories and tables together.
#[derive(Debug)]
pub struct InstanceLimiter {
    cap_bytes: usize,
    /// Bytes of every memory plus counted bytes of every table, so far.
    used_bytes: usize,
}

impl InstanceLimiter {
    pub fn new(cap_bytes: usize) -> InstanceLimiter {
        InstanceLimiter {
            cap_bytes,
            used_bytes: 0,
        }
    }

    /// Bytes counted so far (memories and tables).
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    fn grow(&mut self, what: &str, more_bytes: usize) -> wasmtime::Result<bool> {
        let after = self.used_bytes.saturating_add(more_bytes);
        if after > self.cap_bytes {
            wasmtime::bail!(
                "{CAP_EXCEEDED}: {what} would take the instance's memories and tables to {after} \
                 bytes, more than its cap of {} bytes",
                self.cap_bytes
            );
        }
        self.used_bytes = after;
        Ok(true)
    }
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            wasmtime::bail!(
                "growing memory to {desired} bytes exceeds the memory's own maximum of {} bytes",
                maximum.unwrap_or(0)
            );
        }
        self.grow(
            &format!("growing a memory from {current} to {desired} bytes"),
            desired.saturating_sub(current),
        )
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing memory failed"))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|max| desired > max) {
            wasmtime::bail!(
                "growing a table to {desired} elements exceeds its own maximum of {} elements",
                maximum.unwrap_or(0)
            );
        }
        self.grow(
            &format!("growing a table from {current} to {desired} elements"),
            desired
                .saturating_sub(current)
                .saturating_mul(TABLE_ELEMENT_BYTES),
        )
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        Err(error.context("growing a table failed"))
    }

    fn instances(&self) -> usize {
        CORE_INSTANCES_MAX
    }

    fn tables(&self) -> usize {
        TABLES_MAX
    }

    fn memories(&self) -> usize {
        MEMORIES_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::{Instance, Module, Store};

    const PAGE: usize = 64 * 1024;

    /// A core module with `memories` memories of `pages` pages each (minimum,
    /// no maximum), exported as `m0`, `m1`, ...: hand-encoded, since the
    /// workspace has no `wat` crate.
    fn module_with_memories(memories: u8, pages: u8) -> Vec<u8> {
        assert!(memories < 10 && pages < 128);
        let mut out = b"\0asm\x01\0\0\0".to_vec();
        // Memory section (5): count, then per memory: flags 0 (min only), min.
        let mut mem = vec![memories];
        for _ in 0..memories {
            mem.extend_from_slice(&[0x00, pages]);
        }
        out.push(5);
        out.push(mem.len() as u8);
        out.extend_from_slice(&mem);
        // Export section (7): count, then name, kind 2 (memory), index.
        let mut exp = vec![memories];
        for i in 0..memories {
            exp.extend_from_slice(&[2, b'm', b'0' + i, 2, i]);
        }
        out.push(7);
        out.push(exp.len() as u8);
        out.extend_from_slice(&exp);
        out
    }

    fn store(cap: usize) -> Store<InstanceLimiter> {
        let mut store = Store::new(crate::engine::engine(), InstanceLimiter::new(cap));
        store.limiter(|l| l);
        store.set_epoch_deadline(1_000_000);
        store
    }

    #[test]
    fn two_memories_are_capped_together() {
        let engine = crate::engine::engine();
        // Two memories of 8 pages (512 KiB) each: each fits a cap of 768 KiB,
        // both together do not.
        let module = Module::new(engine, module_with_memories(2, 8)).unwrap();
        let mut s = store(12 * PAGE);
        let e = Instance::new(&mut s, &module, &[]).unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains(CAP_EXCEEDED), "{text}");
        assert!(text.contains(&(12 * PAGE).to_string()), "{text}");
        // With room for both, they instantiate; growing one past the cap then fails.
        let mut s = store(20 * PAGE);
        let instance = Instance::new(&mut s, &module, &[]).unwrap();
        assert_eq!(s.data().used_bytes(), 16 * PAGE);
        let m0 = instance.get_memory(&mut s, "m0").unwrap();
        let m1 = instance.get_memory(&mut s, "m1").unwrap();
        m0.grow(&mut s, 2).unwrap();
        assert_eq!(s.data().used_bytes(), 18 * PAGE);
        let e = m1.grow(&mut s, 4).unwrap_err();
        assert!(format!("{e:#}").contains(CAP_EXCEEDED), "{e:#}");
        assert_eq!(
            s.data().used_bytes(),
            18 * PAGE,
            "a refused growth is not counted"
        );
        m1.grow(&mut s, 2).unwrap();
        assert_eq!(s.data().used_bytes(), 20 * PAGE);
    }

    #[test]
    fn memory_count_is_bounded() {
        let engine = crate::engine::engine();
        // Below the memory count: fine.
        let module = Module::new(engine, module_with_memories(3, 1)).unwrap();
        let mut s = store(1 << 30);
        Instance::new(&mut s, &module, &[]).unwrap();
        // Instantiating the same module again and again in one store stops at
        // MEMORIES_MAX memories (or CORE_INSTANCES_MAX instances).
        let mut made = 1;
        while Instance::new(&mut s, &module, &[]).is_ok() {
            made += 1;
            assert!(made <= MEMORIES_MAX, "more than {MEMORIES_MAX} memories");
        }
        assert_eq!(made * 3, MEMORIES_MAX / 3 * 3);
    }

    /// A real component (the identity example built with rill-sdk for
    /// contract 0.1.0, kept in tests/guests/prebuilt) runs under the default
    /// cap, counting all its core instances' memories and tables, and fails to
    /// instantiate, named, under a cap it cannot fit.
    #[test]
    fn a_real_component_runs_within_the_cap_and_is_refused_below_it() {
        use crate::instance::{Limits, TransformInstance};
        let wasm = include_bytes!("../../tests/guests/prebuilt/identity-contract-0.1.0.wasm");
        let module = crate::module::TransformModule::compile(wasm).unwrap();
        TransformInstance::new(
            module.clone(),
            "identity",
            vec![],
            Limits::default(),
            crate::state::StateStore::default(),
        )
        .unwrap();
        let e = TransformInstance::new(
            module,
            "identity",
            vec![],
            Limits {
                memory_bytes_max: 64 * 1024,
                ..Limits::default()
            },
            crate::state::StateStore::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "exceeded its memory cap of 65536 bytes (all its memories and tables together)"
            ),
            "{e}"
        );
    }

    #[test]
    fn maxima_name_the_limit_and_the_config_key() {
        let m = HostMaxima::from_config(128, 5_000);
        m.check(128 << 20, 5_000).unwrap();
        let e = m.check(129 << 20, 1_000).unwrap_err().to_string();
        assert!(e.contains("transforms.memory_mb_max = 128 MiB"), "{e}");
        assert!(e.contains("--memory-mb 128"), "{e}");
        let e = m.check(64 << 20, 5_001).unwrap_err().to_string();
        assert!(
            e.contains("transforms.call_timeout_ms_max = 5000 ms"),
            "{e}"
        );
        assert!(m.check(1000, 1_000).is_err());
        assert!(m.check(64 << 20, 0).is_err());
        assert_eq!(
            HostMaxima::from_config(1 << 40, u64::MAX),
            HostMaxima::CEILING
        );
        let e = HostMaxima::CEILING
            .check(MEMORY_BYTES_CEILING + 1, 1_000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than any host allows (4096 MiB"), "{e}");
    }
}
