//! The records a transform reads and writes, and the deployment configuration.
//!
//! These are what the user's function sees: one whole record, owning its
//! bytes. On the wire (the WIT contract) a batch travels as spans into one
//! byte list; the glue in `lib.rs` turns it into these and back.

use std::collections::BTreeMap;

/// A record header: a name and opaque bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Vec<u8>,
}

/// One record read from an input topic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    /// The input topic it was read from.
    pub topic: String,
    pub partition: u32,
    pub offset: i64,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    pub key: Option<Vec<u8>>,
    /// `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<Header>,
}

impl Record {
    /// A record with this value (for tests): topic `input`, partition 0, offset 0.
    pub fn new(value: impl Into<Vec<u8>>) -> Record {
        Record {
            topic: "input".into(),
            value: Some(value.into()),
            ..Record::default()
        }
    }

    /// A tombstone for `key` (for tests).
    pub fn tombstone(key: impl Into<Vec<u8>>) -> Record {
        Record {
            topic: "input".into(),
            key: Some(key.into()),
            ..Record::default()
        }
    }

    /// Sets the key (builder style, for tests).
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Record {
        self.key = Some(key.into());
        self
    }

    /// Sets the offset (builder style, for tests).
    pub fn with_offset(mut self, offset: i64) -> Record {
        self.offset = offset;
        self
    }

    /// Sets the timestamp (builder style, for tests).
    pub fn with_timestamp_ms(mut self, timestamp_ms: i64) -> Record {
        self.timestamp_ms = timestamp_ms;
        self
    }

    /// Adds a header (builder style, for tests).
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Record {
        self.headers.push(Header {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// The value as UTF-8 (`None` for a tombstone); an error names the offset.
    pub fn value_str(&self) -> Result<Option<&str>, String> {
        self.value
            .as_deref()
            .map(|v| {
                std::str::from_utf8(v).map_err(|e| {
                    format!(
                        "value of {}-{}@{} is not UTF-8: {e}",
                        self.topic, self.partition, self.offset
                    )
                })
            })
            .transpose()
    }

    /// The key as UTF-8 (`None` without a key); an error names the offset.
    pub fn key_str(&self) -> Result<Option<&str>, String> {
        self.key
            .as_deref()
            .map(|k| {
                std::str::from_utf8(k).map_err(|e| {
                    format!(
                        "key of {}-{}@{} is not UTF-8: {e}",
                        self.topic, self.partition, self.offset
                    )
                })
            })
            .transpose()
    }

    /// The value of the first header named `key`.
    pub fn header(&self, key: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_slice())
    }
}

/// One record the transform writes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// One of the deployment's output topics; `None` is the first.
    pub topic: Option<String>,
    pub key: Option<Vec<u8>>,
    /// `None` writes a tombstone.
    pub value: Option<Vec<u8>>,
    pub headers: Vec<Header>,
}

impl Output {
    /// A record with this value, to the first output topic, without a key.
    pub fn new(value: impl Into<Vec<u8>>) -> Output {
        Output {
            value: Some(value.into()),
            ..Output::default()
        }
    }

    /// A tombstone for `key` (deletes it from a compacted output topic).
    pub fn tombstone(key: impl Into<Vec<u8>>) -> Output {
        Output {
            key: Some(key.into()),
            ..Output::default()
        }
    }

    /// Sets the key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Output {
        self.key = Some(key.into());
        self
    }

    /// Sets or clears the key (e.g. to keep the input record's key).
    pub fn key_opt(mut self, key: Option<Vec<u8>>) -> Output {
        self.key = key;
        self
    }

    /// Sends it to `topic`, which must be one of the deployment's outputs.
    pub fn topic(mut self, topic: impl Into<String>) -> Output {
        self.topic = Some(topic.into());
        self
    }

    /// Adds a header.
    pub fn header(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Output {
        self.headers.push(Header {
            key: key.into(),
            value: value.into(),
        });
        self
    }
}

/// What a transform function may return on success: zero or more outputs.
pub trait IntoOutputs {
    fn into_outputs(self) -> Vec<Output>;
}

impl IntoOutputs for Vec<Output> {
    fn into_outputs(self) -> Vec<Output> {
        self
    }
}

impl IntoOutputs for Output {
    fn into_outputs(self) -> Vec<Output> {
        vec![self]
    }
}

impl IntoOutputs for Option<Output> {
    fn into_outputs(self) -> Vec<Output> {
        self.into_iter().collect()
    }
}

impl IntoOutputs for () {
    fn into_outputs(self) -> Vec<Output> {
        Vec::new()
    }
}

/// The deployment's configuration: `--config KEY=VALUE` pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    entries: BTreeMap<String, String>,
}

impl Config {
    /// From pairs; a later pair for the same key wins.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Config {
        Config {
            entries: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries.get(key).map(String::as_str)
    }

    /// The value of `key` parsed as `T`, or `default` when unset; an error names
    /// the key and the value.
    pub fn parse_or<T: std::str::FromStr>(&self, key: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|e| format!("config {key}={v:?} is not valid: {e}")),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}
