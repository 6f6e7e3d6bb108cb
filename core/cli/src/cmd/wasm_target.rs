//! The wasm32-wasip2 target that `rill transform build` compiles guests for.
//!
//! rustup adds the targets that a `rust-toolchain.toml` lists only when it installs
//! the toolchain itself, so a machine that already had stable Rust has no
//! wasm32-wasip2 and cargo fails deep inside the first dependency. Before it runs
//! cargo, `rill transform build` looks for the target in the sysroot of the rustc
//! that cargo will use in the crate's directory; when it is missing and rustup is
//! on PATH it runs `rustup target add wasm32-wasip2` there (saying so on stderr),
//! otherwise it stops with an error that says how to add the target.
//!
//! Invariant: at most one `rustup target add` runs at a time on a machine (builds
//! in parallel, as the tests make, share a lock file and check again under it).

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The target every transform is built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// The programs the check runs; tests point them at stand-ins.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// `rustc`, asked for its sysroot (cargo's `RUSTC`, else `rustc`).
    pub rustc: OsString,
    /// `rustup`, when it is on PATH.
    pub rustup: Option<PathBuf>,
}

impl Toolchain {
    /// The rustc cargo would use and the rustup on PATH.
    pub fn from_env() -> Toolchain {
        let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
        Toolchain {
            rustc,
            rustup: find_on_path("rustup"),
        }
    }
}

/// What [`ensure_installed`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetCheck {
    /// The target was there already.
    Present,
    /// The target was missing and rustup added it.
    Installed,
}

/// Makes sure the toolchain that builds in `dir` has [`WASM_TARGET`]: adds it with
/// rustup when it is missing, or fails saying how to add it.
pub fn ensure_installed(dir: &Path, tools: &Toolchain) -> anyhow::Result<TargetCheck> {
    let sysroot = sysroot(dir, &tools.rustc)?;
    if has_target(&sysroot) {
        return Ok(TargetCheck::Present);
    }
    let Some(rustup) = &tools.rustup else {
        bail!(
            "the {WASM_TARGET} target is not installed in {} and rustup is not on PATH to add it: \
             install it the way this Rust toolchain was installed (with rustup: rustup target add {WASM_TARGET})",
            sysroot.display()
        );
    };
    // Parallel builds (the test suite runs several) must not run rustup at once.
    let lock_path = std::env::temp_dir().join("rill-rustup-target-add.lock");
    let lock = File::create(&lock_path)
        .with_context(|| format!("cannot create the lock file {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("cannot lock {}", lock_path.display()))?;
    if has_target(&sysroot) {
        return Ok(TargetCheck::Present);
    }
    eprintln!("rill: installing the {WASM_TARGET} target (rustup target add {WASM_TARGET})");
    let status = Command::new(rustup)
        .args(["target", "add", WASM_TARGET])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("cannot run {}", rustup.display()))?;
    if !status.success() {
        bail!(
            "`rustup target add {WASM_TARGET}` failed ({status}); its errors are above. \
             Run it by hand, then build again."
        );
    }
    if !has_target(&sysroot) {
        bail!(
            "`rustup target add {WASM_TARGET}` succeeded but {} still has no {WASM_TARGET}: \
             is rustup managing a different toolchain than {}?",
            sysroot.display(),
            tools.rustc.to_string_lossy()
        );
    }
    Ok(TargetCheck::Installed)
}

/// The sysroot of the rustc that builds in `dir`.
fn sysroot(dir: &Path, rustc: &OsString) -> anyhow::Result<PathBuf> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .current_dir(dir)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| {
            format!(
                "cannot run {} to find the toolchain: is Rust installed?",
                rustc.to_string_lossy()
            )
        })?;
    if !out.status.success() {
        bail!(
            "`{} --print sysroot` failed in {} ({})",
            rustc.to_string_lossy(),
            dir.display(),
            out.status
        );
    }
    let path =
        String::from_utf8(out.stdout).context("rustc printed a sysroot that is not UTF-8")?;
    Ok(PathBuf::from(path.trim()))
}

/// Whether the standard library for [`WASM_TARGET`] lies in `sysroot`.
fn has_target(sysroot: &Path) -> bool {
    sysroot
        .join("lib/rustlib")
        .join(WASM_TARGET)
        .join("lib")
        .is_dir()
}

fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A shell script at `dir/name` that runs `body`.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// A stand-in rustc whose sysroot is `root/sysroot`, and that sysroot.
    fn fake_rustc(root: &Path) -> (OsString, PathBuf) {
        let sysroot = root.join("sysroot");
        std::fs::create_dir_all(sysroot.join("lib/rustlib/x86_64-unknown-linux-gnu/lib")).unwrap();
        let rustc = script(root, "rustc", &format!("echo {}", sysroot.display()));
        (rustc.into_os_string(), sysroot)
    }

    #[test]
    fn a_missing_target_is_added_with_rustup_in_the_crate_directory() {
        let root = tempfile::tempdir().unwrap();
        let (rustc, sysroot) = fake_rustc(root.path());
        let calls = root.path().join("rustup-calls");
        // The stand-in rustup records its arguments and directory, then installs
        // the target into the sysroot as the real one would.
        let rustup = script(
            root.path(),
            "rustup",
            &format!(
                "echo \"$* in $(pwd)\" >> {}\nmkdir -p {}/lib/rustlib/{WASM_TARGET}/lib",
                calls.display(),
                sysroot.display()
            ),
        );
        let crate_dir = root.path().join("my-transform");
        std::fs::create_dir(&crate_dir).unwrap();
        let tools = Toolchain {
            rustc,
            rustup: Some(rustup),
        };

        assert_eq!(
            ensure_installed(&crate_dir, &tools).unwrap(),
            TargetCheck::Installed
        );
        let recorded = std::fs::read_to_string(&calls).unwrap();
        assert_eq!(
            recorded.trim(),
            format!(
                "target add {WASM_TARGET} in {}",
                crate_dir.canonicalize().unwrap().display()
            )
        );
        // Once there, rustup is not run again.
        assert_eq!(
            ensure_installed(&crate_dir, &tools).unwrap(),
            TargetCheck::Present
        );
        assert_eq!(std::fs::read_to_string(&calls).unwrap(), recorded);
    }

    #[test]
    fn without_rustup_the_error_says_how_to_add_the_target() {
        let root = tempfile::tempdir().unwrap();
        let (rustc, _) = fake_rustc(root.path());
        let tools = Toolchain {
            rustc,
            rustup: None,
        };
        let err = ensure_installed(root.path(), &tools)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rustup target add wasm32-wasip2"), "{err}");
        assert!(err.contains("not installed"), "{err}");
    }

    #[test]
    fn a_rustup_that_fails_or_installs_elsewhere_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let (rustc, _) = fake_rustc(root.path());
        let failing = script(root.path(), "rustup-fails", "exit 3");
        let tools = Toolchain {
            rustc: rustc.clone(),
            rustup: Some(failing),
        };
        let err = ensure_installed(root.path(), &tools)
            .unwrap_err()
            .to_string();
        assert!(err.contains("failed"), "{err}");

        let elsewhere = script(root.path(), "rustup-elsewhere", "exit 0");
        let tools = Toolchain {
            rustc,
            rustup: Some(elsewhere),
        };
        let err = ensure_installed(root.path(), &tools)
            .unwrap_err()
            .to_string();
        assert!(err.contains("still has no wasm32-wasip2"), "{err}");
    }

    #[test]
    fn the_real_toolchain_is_found() {
        // The rustc that runs these tests has a sysroot with its host target.
        let root = tempfile::tempdir().unwrap();
        let sysroot = sysroot(root.path(), &Toolchain::from_env().rustc).unwrap();
        assert!(
            sysroot.join("lib/rustlib").is_dir(),
            "{}",
            sysroot.display()
        );
    }
}
