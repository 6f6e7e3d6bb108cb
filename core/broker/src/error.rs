//! The errors of rill-broker that reach the operator: starting, configuring and
//! stopping a broker. (Errors of single requests travel to clients as
//! `ErrorInfo` values instead and never stop the broker.)
//!
//! Invariant: every message names what failed (file, key, partition directory,
//! address) and, where the operator can act, what to do.

use std::net::SocketAddr;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The config file could not be read.
    #[error("could not read the broker config file {}: {source}", path.display())]
    ConfigRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The config file is not valid TOML or has an unknown / mistyped key.
    #[error("invalid broker config file {}: {reason}", path.display())]
    ConfigParse { path: PathBuf, reason: String },

    /// A config value is out of range or inconsistent with another.
    #[error("invalid broker config: {key}: {reason}")]
    ConfigInvalid { key: String, reason: String },

    /// The data directory (or something in it) cannot be created, read or written.
    #[error(
        "data directory {} is unusable: could not {action}: {source} \
         (check that it exists, is a directory, and is writable by the broker)",
        path.display()
    )]
    DataDir {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The persisted topic metadata could not be parsed.
    #[error(
        "topic metadata {} is corrupt: {reason} (restore it from a backup, or move it aside \
         to start without topics)",
        path.display()
    )]
    MetadataCorrupt { path: PathBuf, reason: String },

    /// A partition's log could not be opened or recovered.
    #[error(
        "partition {topic}-{partition}: could not recover the log in {}: {source} \
         — move the directory aside or restore it, then start the broker again",
        dir.display()
    )]
    LogRecovery {
        topic: String,
        partition: u32,
        dir: PathBuf,
        #[source]
        source: rill_log::LogError,
    },

    /// Closing a partition's log on shutdown failed (data may not be flushed).
    #[error("partition {topic}-{partition}: could not flush and close the log: {source}")]
    LogClose {
        topic: String,
        partition: u32,
        #[source]
        source: rill_log::LogError,
    },

    /// TLS could not be set up (certificate files, development CA).
    #[error("could not set up TLS: {0}")]
    Tls(#[source] rill_net::NetError),

    /// The QUIC endpoint could not be bound.
    #[error("could not listen on {addr} (UDP): {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: rill_net::NetError,
    },

    /// The metrics endpoint could not be started.
    #[error("could not start the metrics endpoint on {addr}: {reason}")]
    Metrics { addr: SocketAddr, reason: String },

    /// A background task panicked or could not be joined.
    #[error("broker task failed: {0}")]
    Task(String),
}
