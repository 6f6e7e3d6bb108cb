//! `rill produce TOPIC`: each line of stdin becomes one record.
//!
//! With `--key-separator S`, a line is split at the first `S` into key and value; a
//! line without `S` stops the command with an error naming its line number (records
//! read before it are still flushed and acknowledged, and the error says how many).
//! Without a separator the whole line is the value and the key is empty (null).
//! Line endings (`\n`, `\r\n`) are not part of the record.
//!
//! On end of input (or Ctrl-C / SIGTERM, which end the input early) the producer
//! is flushed and every acknowledgement awaited; any failed record makes the
//! command exit non-zero with the first failure named.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use rill_client::{ClientError, ProducerConfig, ProducerRecord};
use rill_proto::wire::Acks;
use tokio::io::AsyncBufReadExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::client_args::{ClientArgs, client_error};

/// Bound on delivery reports kept while reading stdin; past it, the oldest is
/// awaited before the next line is read (the producer's buffer memory bounds the
/// records themselves).
const PENDING_DELIVERIES_MAX: usize = 100_000;
/// Read buffer for stdin.
const STDIN_BUFFER_BYTES: usize = 256 * 1024;

#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Topic to write to.
    pub topic: String,
    /// Split each line into KEY<S>VALUE at the first occurrence of S.
    #[arg(long, value_name = "S")]
    pub key_separator: Option<String>,
    /// Acknowledgements to wait for: 0 (none), 1 (leader), all (in-sync replicas).
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    pub acks: rill_proto::wire::Acks,
    /// Write every record to this partition (default: by key hash, or spread when no key).
    #[arg(long, value_name = "N")]
    pub partition: Option<u32>,
    /// Batch compression, with Kafka's codecs: none, gzip, snappy, lz4, zstd.
    #[arg(long, value_enum, default_value_t = CompressionArg::None)]
    pub compression: CompressionArg,
    /// How long a batch may wait for more records before it is sent.
    #[arg(long, value_name = "MS")]
    pub linger_ms: Option<u64>,
    /// The most bytes in one batch.
    #[arg(long, value_name = "BYTES")]
    pub batch_size: Option<usize>,
    /// Write all of stdin as one transaction under this transactional id:
    /// committed at the end of input, aborted on an error or Ctrl-C, so a
    /// read-committed consumer sees all of it or none. A second producer with
    /// the same id fences this one.
    #[arg(long, value_name = "ID")]
    pub transactional_id: Option<String>,
    /// With --transactional-id: how long the transaction may stay open before
    /// the coordinator aborts it.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 60_000,
        requires = "transactional_id"
    )]
    pub transaction_timeout_ms: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompressionArg {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl From<CompressionArg> for rill_proto::Compression {
    fn from(c: CompressionArg) -> Self {
        match c {
            CompressionArg::None => rill_proto::Compression::None,
            CompressionArg::Gzip => rill_proto::Compression::Gzip,
            CompressionArg::Snappy => rill_proto::Compression::Snappy,
            CompressionArg::Lz4 => rill_proto::Compression::Lz4,
            CompressionArg::Zstd => rill_proto::Compression::Zstd,
        }
    }
}

fn parse_acks(s: &str) -> Result<rill_proto::wire::Acks, String> {
    s.parse()
}

pub async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let topic = args.topic.clone();
    let what = format!("cannot produce to topic {topic}");
    let client = args.client.connect().await?;
    // Fail before reading any input if the topic or partition does not exist.
    let partitions = client
        .partition_count(&topic)
        .await
        .map_err(|e| client_error(&what, e))?;
    if let Some(p) = args.partition {
        anyhow::ensure!(
            p < partitions,
            "{what}: partition {p} does not exist: the topic has {partitions} partition(s), 0..={}. Pass a valid --partition",
            partitions.saturating_sub(1)
        );
    }

    let mut config = ProducerConfig {
        acks: args.acks,
        compression: args.compression.into(),
        ..ProducerConfig::default()
    };
    if let Some(ms) = args.linger_ms {
        config.linger = Duration::from_millis(ms);
    }
    if let Some(bytes) = args.batch_size {
        config.batch_size = bytes;
    }
    config.transactional_id = args.transactional_id.clone();
    config.transaction_timeout = Duration::from_millis(args.transaction_timeout_ms);
    let producer = client
        .producer(config)
        .map_err(|e| client_error(&what, e))?;
    if let Some(id) = &args.transactional_id {
        let what = format!("{what} in a transaction as {id:?}");
        producer
            .init_transactions()
            .await
            .map_err(|e| client_error(&what, e))?;
        producer
            .begin_transaction()
            .await
            .map_err(|e| client_error(&what, e))?;
    }
    let mut interrupted = false;

    let separator = args.key_separator.as_deref().map(str::as_bytes);
    let mut stdin = tokio::io::BufReader::with_capacity(STDIN_BUFFER_BYTES, tokio::io::stdin());
    let mut line = Vec::new();
    let mut line_number = 0u64;
    let mut pending: VecDeque<(u64, rill_client::DeliveryFuture)> = VecDeque::new();
    let mut outcome = Outcome::default();
    // Why input stopped early, and what to do about it.
    let mut input_error: Option<(String, &str)> = None;

    let mut interrupt =
        signal(SignalKind::interrupt()).context("cannot install the Ctrl-C handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    loop {
        line.clear();
        let read = tokio::select! {
            read = stdin.read_until(b'\n', &mut line) => read,
            // Ctrl-C is how an interactive producer ends (as in Kafka): stop reading,
            // then flush and await what was sent, as at end of input.
            _ = interrupt.recv() => { interrupted = true; break }
            _ = terminate.recv() => { interrupted = true; break }
        };
        let read = match read {
            Ok(n) => n,
            Err(e) => {
                input_error = Some((
                    format!("cannot read line {} of stdin: {e}", line_number + 1),
                    "Check the input",
                ));
                break;
            }
        };
        if read == 0 {
            break;
        }
        line_number += 1;
        let (key, value) = match split_line(trim_line_end(&line), separator, line_number) {
            Ok(kv) => kv,
            Err(msg) => {
                input_error = Some((msg, "Put the separator between key and value on every line"));
                break;
            }
        };
        let mut record = ProducerRecord::new(topic.clone(), Bytes::copy_from_slice(value));
        if let Some(key) = key {
            record = record.key(Bytes::copy_from_slice(key));
        }
        if let Some(p) = args.partition {
            record = record.partition(p);
        }
        match producer.send(record).await {
            Ok(delivery) => pending.push_back((line_number, delivery)),
            Err(e) => {
                outcome.fail(line_number, e);
                break;
            }
        }
        while pending.len() >= PENDING_DELIVERIES_MAX {
            let (n, delivery) = pending.pop_front().expect("non-empty");
            outcome.record(n, delivery.await);
        }
        if outcome.first_failure.is_some() {
            break;
        }
    }

    // Send what is queued and wait for every acknowledgement.
    if let Err(e) = producer.flush().await {
        outcome.fail(line_number, e);
    }
    for (n, delivery) in pending {
        outcome.record(n, delivery.await);
    }
    if let Some(id) = &args.transactional_id {
        let txn_what = format!("{what}: the transaction of {id:?}");
        if outcome.first_failure.is_some() || input_error.is_some() || interrupted {
            producer
                .abort_transaction()
                .await
                .map_err(|e| client_error(&txn_what, e))?;
            if interrupted && outcome.first_failure.is_none() && input_error.is_none() {
                anyhow::bail!(
                    "{txn_what} was aborted: input was interrupted after {} record(s); none of them is visible to read-committed consumers",
                    outcome.acked
                );
            }
        } else {
            producer
                .commit_transaction()
                .await
                .map_err(|e| client_error(&txn_what, e))?;
        }
    }
    if let Err(e) = producer.close().await {
        tracing::warn!("closing the producer: {e}");
    }
    if args.acks == Acks::None {
        // With acks=0 the producer considers a request done once it is queued on
        // its QUIC stream; exiting right away would drop what quinn has not sent
        // yet. A round trip on the same connection, requested after every produce
        // stream was written, lets those streams drain first. (Best effort: acks=0
        // promises no delivery; rill-client could wait for the streams instead.)
        let _ = client.metadata(Some(vec![topic.clone()])).await;
    }

    if let Some((n, err)) = outcome.first_failure {
        let failed = outcome.failed;
        let acked = outcome.acked;
        return Err(client_error(
            format!(
                "{what}: record from line {n} of stdin failed ({failed} failed, {acked} acknowledged)"
            ),
            err,
        ));
    }
    if let Some((why, todo)) = input_error {
        let acked = outcome.acked;
        return Err(anyhow!(
            "{what}: {why} ({acked} record(s) before it acknowledged). {todo}"
        ));
    }
    tracing::info!("produced {} record(s) to {topic}", outcome.acked);
    Ok(())
}

/// Counts delivery results and keeps the first failure.
#[derive(Debug, Default)]
struct Outcome {
    acked: u64,
    failed: u64,
    first_failure: Option<(u64, ClientError)>,
}

impl Outcome {
    fn record(&mut self, line: u64, result: Result<rill_client::RecordMetadata, ClientError>) {
        match result {
            Ok(_) => self.acked += 1,
            Err(e) => self.fail(line, e),
        }
    }

    fn fail(&mut self, line: u64, err: ClientError) {
        self.failed += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some((line, err));
        }
    }
}

/// Splits one input line into (key, value). `line_number` is 1-based.
pub fn split_line<'a>(
    line: &'a [u8],
    separator: Option<&[u8]>,
    line_number: u64,
) -> Result<(Option<&'a [u8]>, &'a [u8]), String> {
    let Some(sep) = separator else {
        return Ok((None, line));
    };
    match find(line, sep) {
        Some(at) => Ok((Some(&line[..at]), &line[at + sep.len()..])),
        None => Err(format!(
            "line {line_number} of stdin has no key separator {:?}",
            String::from_utf8_lossy(sep)
        )),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Strips one trailing `\n` or `\r\n`.
pub fn trim_line_end(mut line: &[u8]) -> &[u8] {
    if let Some(rest) = line.strip_suffix(b"\n") {
        line = rest;
        if let Some(rest) = line.strip_suffix(b"\r") {
            line = rest;
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_at_first_separator() {
        assert_eq!(
            split_line(b"k:v:w", Some(b":"), 1).unwrap(),
            (Some(&b"k"[..]), &b"v:w"[..])
        );
        assert_eq!(
            split_line(b":v", Some(b":"), 1).unwrap(),
            (Some(&b""[..]), &b"v"[..])
        );
        assert_eq!(
            split_line(b"k::v", Some(b"::"), 1).unwrap(),
            (Some(&b"k"[..]), &b"v"[..])
        );
        assert_eq!(
            split_line(b"plain", None, 1).unwrap(),
            (None, &b"plain"[..])
        );
        let err = split_line(b"nosep", Some(b":"), 7).unwrap_err();
        assert!(err.contains("line 7"), "{err}");
    }

    #[test]
    fn line_endings_are_stripped() {
        assert_eq!(trim_line_end(b"a\r\n"), b"a");
        assert_eq!(trim_line_end(b"a\n"), b"a");
        assert_eq!(trim_line_end(b"a"), b"a");
        assert_eq!(trim_line_end(b"a\r"), b"a\r");
    }
}
