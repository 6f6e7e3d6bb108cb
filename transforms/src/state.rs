//! The key-value state of one transform instance (one input partition), with a
//! per-call overlay and the changelog of writes not yet written to the state
//! topic.
//!
//! A call into the guest sees its own writes at once (the overlay); when the
//! call's record succeeds the overlay is applied to the table and its writes are
//! queued for the changelog topic in the order they were made; when it fails
//! (an error or a trap) the overlay is dropped, so a failed record leaves no
//! trace in the state. Bounds: [`STATE_KEY_BYTES_MAX`], [`STATE_VALUE_BYTES_MAX`]
//! and [`STATE_BYTES_MAX`] per instance; a write over a bound traps the guest
//! with a message naming it.

use std::collections::HashMap;

/// The largest state key.
pub const STATE_KEY_BYTES_MAX: usize = 16 * 1024;
/// The largest state value.
pub const STATE_VALUE_BYTES_MAX: usize = 512 * 1024;
/// Bound on the keys and values one instance keeps.
pub const STATE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// A write to the state: `None` deletes the key.
pub type StateWrite = (Vec<u8>, Option<Vec<u8>>);

#[derive(Debug, Default)]
pub struct StateStore {
    table: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
    overlay: HashMap<Vec<u8>, Option<Vec<u8>>>,
    overlay_order: Vec<Vec<u8>>,
    changelog: Vec<StateWrite>,
}

impl StateStore {
    /// Applies a write read back from the changelog topic (restore).
    pub fn restore(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        self.apply(key, value);
    }

    fn apply(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) {
        match value {
            Some(v) => {
                let add = key.len() + v.len();
                if let Some(old) = self.table.insert(key.clone(), v) {
                    self.bytes -= key.len() + old.len();
                }
                self.bytes += add;
            }
            None => {
                if let Some(old) = self.table.remove(&key) {
                    self.bytes -= key.len() + old.len();
                }
            }
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self.overlay.get(key) {
            Some(v) => v.clone(),
            None => self.table.get(key).cloned(),
        }
    }

    /// Records a write in the current call's overlay; refuses one over a bound.
    pub fn write(&mut self, key: Vec<u8>, value: Option<Vec<u8>>) -> Result<(), String> {
        if key.len() > STATE_KEY_BYTES_MAX {
            return Err(format!(
                "state key of {} bytes exceeds the bound of {STATE_KEY_BYTES_MAX} bytes",
                key.len()
            ));
        }
        if let Some(v) = &value {
            if v.len() > STATE_VALUE_BYTES_MAX {
                return Err(format!(
                    "state value of {} bytes exceeds the bound of {STATE_VALUE_BYTES_MAX} bytes",
                    v.len()
                ));
            }
            if self.bytes + key.len() + v.len() > STATE_BYTES_MAX {
                return Err(format!(
                    "the instance's state would exceed {STATE_BYTES_MAX} bytes: delete keys you no longer need"
                ));
            }
        }
        if self.overlay.insert(key.clone(), value).is_none() {
            self.overlay_order.push(key);
        }
        Ok(())
    }

    /// The current call's record succeeded: apply its writes.
    pub fn commit_call(&mut self) {
        let order = std::mem::take(&mut self.overlay_order);
        for key in order {
            if let Some(value) = self.overlay.remove(&key) {
                self.changelog.push((key.clone(), value.clone()));
                self.apply(key, value);
            }
        }
        debug_assert!(self.overlay.is_empty());
    }

    /// The current call failed: forget its writes.
    pub fn rollback_call(&mut self) {
        self.overlay.clear();
        self.overlay_order.clear();
    }

    /// The writes to send to the changelog topic since the last take, in order.
    pub fn take_changelog(&mut self) -> Vec<StateWrite> {
        std::mem::take(&mut self.changelog)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_calls_leave_no_trace_and_commits_keep_order() {
        let mut s = StateStore::default();
        s.write(b"a".to_vec(), Some(b"1".to_vec())).unwrap();
        assert_eq!(s.get(b"a"), Some(b"1".to_vec()));
        s.rollback_call();
        assert_eq!(s.get(b"a"), None);
        s.write(b"b".to_vec(), Some(b"2".to_vec())).unwrap();
        s.write(b"a".to_vec(), Some(b"3".to_vec())).unwrap();
        s.write(b"b".to_vec(), None).unwrap();
        s.commit_call();
        assert_eq!(s.get(b"a"), Some(b"3".to_vec()));
        assert_eq!(s.get(b"b"), None);
        let log = s.take_changelog();
        assert_eq!(
            log,
            vec![(b"b".to_vec(), None), (b"a".to_vec(), Some(b"3".to_vec()))]
        );
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn writes_over_a_bound_are_refused_by_name() {
        let mut s = StateStore::default();
        let err = s
            .write(vec![0; STATE_KEY_BYTES_MAX + 1], Some(vec![]))
            .unwrap_err();
        assert!(err.contains("state key"), "{err}");
        let err = s
            .write(b"k".to_vec(), Some(vec![0; STATE_VALUE_BYTES_MAX + 1]))
            .unwrap_err();
        assert!(err.contains("state value"), "{err}");
    }
}
