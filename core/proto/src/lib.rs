//! rill-proto: what Rill says on the wire and writes to disk, with no I/O.
//!
//! This crate owns the record-batch format (Kafka's v2 layout, see [`batch`]), the
//! per-batch compression codecs, the domain newtypes (`Offset`, `LeaderEpoch`), and
//! the request/response messages with their error codes (see [`wire`]). It is not a
//! transport: sockets, TLS and QUIC live in rill-net.
//!
//! Invariants: decoding any byte string never panics and never allocates more than
//! the input (or an explicit bound) justifies; an error names the field at fault.
//! Encoding then decoding any valid value gives the value back (property-tested).

pub mod batch;
pub mod compression;
pub mod control;
pub mod crc;
pub mod error;
pub mod rope;
pub mod scram;
pub mod types;
pub mod validation;
pub mod varint;
pub mod wire;

pub use batch::{BatchBuilder, BatchHeader, BatchView, Header, Record, StoredRecord};
pub use compression::Compression;
pub use error::DecodeError;
pub use rope::Rope;
pub use types::{LeaderEpoch, Offset, ProducerId, TimestampMs};
