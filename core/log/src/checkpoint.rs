//! Crash-safe small files: the one place a checkpoint or metadata file is written.
//!
//! `write_atomically` writes `<name>.tmp`, fsyncs it, renames it over `<name>` and
//! fsyncs the directory, so after a crash the file holds either the old or the new
//! contents, never a mix. Leftover `*.tmp` files are deleted by recovery on open.
//!
//! On-disk format of a checkpoint (Kafka's, text, version 0):
//!
//! ```text
//! 0                 <- format version
//! 2                 <- number of entries
//! 3 0               <- one entry per line, fields separated by one space
//! 5 1200
//! ```
//!
//! Invariants: a checkpoint that does not parse (wrong version, count mismatch,
//! bad number) is an error naming the file and line, never silently read as empty.

use crate::error::{LogError, io_context};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

/// Version written in (and required of) the first line of every checkpoint file.
pub const CHECKPOINT_VERSION: u32 = 0;
/// Suffix of the temporary file a checkpoint is written to before the rename.
pub const TEMP_SUFFIX: &str = ".tmp";
/// Upper bound on the entries a checkpoint may hold (bounds memory on read).
pub const CHECKPOINT_ENTRIES_MAX: usize = 1 << 20;

std::thread_local! {
    static DIR_FSYNCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many directory fsyncs this thread has asked for (for tests and
/// benchmarks of code that runs on one thread, such as a compaction swap).
pub fn dir_fsyncs_on_this_thread() -> u64 {
    DIR_FSYNCS.with(|n| n.get())
}

/// fsyncs a directory so that creations, renames and deletions in it are durable.
pub fn fsync_dir(dir: &Path) -> Result<(), LogError> {
    DIR_FSYNCS.with(|n| n.set(n.get() + 1));
    let d = File::open(dir).map_err(io_context(|| {
        format!("opening directory {}", dir.display())
    }))?;
    d.sync_all().map_err(io_context(|| {
        format!("fsyncing directory {}", dir.display())
    }))
}

/// Replaces `dir/name` with `contents` crash-safely: temp file, fsync, rename, fsync dir.
pub fn write_atomically(dir: &Path, name: &str, contents: &[u8]) -> Result<(), LogError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}{TEMP_SUFFIX}"));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(io_context(|| format!("creating {}", tmp.display())))?;
        f.write_all(contents)
            .map_err(io_context(|| format!("writing {}", tmp.display())))?;
        f.sync_all()
            .map_err(io_context(|| format!("fsyncing {}", tmp.display())))?;
    }
    std::fs::rename(&tmp, &path).map_err(io_context(|| {
        format!("renaming {} to {}", tmp.display(), path.display())
    }))?;
    fsync_dir(dir)
}

/// Writes a checkpoint of `(a, b)` entries in the versioned text format above.
pub fn write_checkpoint(dir: &Path, name: &str, entries: &[(i64, i64)]) -> Result<(), LogError> {
    let mut text = format!("{CHECKPOINT_VERSION}\n{}\n", entries.len());
    for (a, b) in entries {
        text.push_str(&format!("{a} {b}\n"));
    }
    write_atomically(dir, name, text.as_bytes())
}

/// Reads a checkpoint; `Ok(None)` if the file does not exist.
pub fn read_checkpoint(path: &Path) -> Result<Option<Vec<(i64, i64)>>, LogError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(io_context(|| {
                format!("reading checkpoint {}", path.display())
            })(e));
        }
    };
    let bad = |line: usize, reason: String| LogError::Corrupt {
        path: path.to_path_buf(),
        position: line as u64,
        reason: format!("checkpoint line {line}: {reason}"),
    };
    let mut lines = text.lines();
    let version = lines
        .next()
        .ok_or_else(|| bad(1, "missing version".into()))?;
    if version.trim() != CHECKPOINT_VERSION.to_string() {
        return Err(bad(
            1,
            format!("unsupported version {version:?} (expected {CHECKPOINT_VERSION})"),
        ));
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| bad(2, "missing or invalid entry count".into()))?;
    if count > CHECKPOINT_ENTRIES_MAX {
        return Err(bad(
            2,
            format!("{count} entries exceeds the bound {CHECKPOINT_ENTRIES_MAX}"),
        ));
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let line_no = i + 3;
        let line = lines
            .next()
            .ok_or_else(|| bad(line_no, format!("expected {count} entries, found {i}")))?;
        let mut fields = line.split(' ');
        let mut field = || -> Option<i64> { fields.next()?.parse().ok() };
        let (a, b) = match (field(), field()) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(bad(line_no, format!("malformed entry {line:?}"))),
        };
        entries.push((a, b));
    }
    if lines.any(|l| !l.trim().is_empty()) {
        return Err(bad(
            count + 3,
            "trailing lines after the declared entries".into(),
        ));
    }
    Ok(Some(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), "cp", &[(1, 0), (4, 100)]).unwrap();
        let text = std::fs::read_to_string(dir.path().join("cp")).unwrap();
        assert_eq!(text, "0\n2\n1 0\n4 100\n");
        assert_eq!(
            read_checkpoint(&dir.path().join("cp")).unwrap(),
            Some(vec![(1, 0), (4, 100)])
        );
        assert!(
            !dir.path().join("cp.tmp").exists(),
            "temp file is renamed away"
        );
        // Overwrite replaces.
        write_checkpoint(dir.path(), "cp", &[]).unwrap();
        assert_eq!(
            read_checkpoint(&dir.path().join("cp")).unwrap(),
            Some(vec![])
        );
    }

    #[test]
    fn missing_is_none_and_garbage_is_error() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_checkpoint(&dir.path().join("nope")).unwrap(), None);
        std::fs::write(dir.path().join("bad"), "0\n2\n1 0\n").unwrap();
        let e = read_checkpoint(&dir.path().join("bad"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad") && e.contains("expected 2 entries"), "{e}");
        std::fs::write(dir.path().join("v9"), "9\n0\n").unwrap();
        let e = read_checkpoint(&dir.path().join("v9"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported version"), "{e}");
    }
}
