//! `rill consume TOPIC`: print records, one value per line.
//!
//! Start position: the end of each partition (only new records), like Kafka's
//! console consumer, unless `--from-beginning` or `--offset N`. Output per record:
//! `[offset<S>][key<S>]value\n` where `<S>` is `--key-separator` (default tab),
//! the offset printed as `P:O` (partition:offset) with `--print-offset`, and a null
//! key printed as `null` with `--print-key`.
//!
//! Stops after `--max-messages` records, or when no new record arrived for
//! `--timeout-ms` (without it: runs until interrupted). stdout is buffered and
//! flushed on exit; a closed pipe (`| head`) ends the command quietly with exit 0.
//!
//! With `--group G` the command is a member of consumer group G: the
//! coordinator assigns it partitions, it starts at the group's committed offsets
//! (without one: the end, or the beginning with `--from-beginning`), and after
//! each batch of printed records is flushed it commits the offsets after them
//! (so a record is committed only once printed; a crash may print it again). On
//! Ctrl-C / SIGTERM / `--max-messages` / `--timeout-ms` it commits and leaves the
//! group, so the partitions move to the other members at once.

use rill_proto::wire::Isolation;
use std::io::{BufWriter, ErrorKind, Write};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use std::collections::HashMap;

use rill_client::{
    Consumer, ConsumerConfig, ConsumerRecord, GroupConfig, GroupConsumer, GroupEvent, Offset,
    OffsetReset, TopicPartition,
};
use tokio::signal::unix::{SignalKind, signal};

use crate::client_args::{ClientArgs, client_error};

/// Longest single poll when no --timeout-ms is given (the loop just polls again).
const POLL_WAIT_MAX: Duration = Duration::from_secs(1);
/// stdout buffer; flushed after every batch of records and on exit.
const STDOUT_BUFFER_BYTES: usize = 64 * 1024;

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Topic to read.
    pub topic: String,
    /// Start at the earliest offset kept instead of the end.
    #[arg(long, conflicts_with = "offset")]
    pub from_beginning: bool,
    /// Start at this offset (in every partition read).
    #[arg(long, value_name = "N", conflicts_with = "group")]
    pub offset: Option<i64>,
    /// Read only this partition (default: all).
    #[arg(long, value_name = "N", conflicts_with = "group")]
    pub partition: Option<u32>,
    /// Consume as a member of this consumer group (partitions assigned by the
    /// group's coordinator; resumes from and commits the group's offsets).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// With --group: a static member id (group.instance.id) that keeps its
    /// partitions across a restart quicker than the session timeout.
    #[arg(long, value_name = "ID", requires = "group")]
    pub group_instance_id: Option<String>,
    /// With --group: how long without a heartbeat before the member is removed.
    #[arg(long, value_name = "MS", requires = "group", default_value_t = rill_client::DEFAULT_SESSION_TIMEOUT_MS)]
    pub session_timeout_ms: u32,
    /// With --group: how often the member heartbeats.
    #[arg(long, value_name = "MS", requires = "group", default_value_t = rill_client::DEFAULT_HEARTBEAT_INTERVAL_MS)]
    pub heartbeat_interval_ms: u32,
    /// With --group: the assignor, uniform or range.
    #[arg(
        long,
        value_name = "NAME",
        requires = "group",
        default_value = "uniform"
    )]
    pub assignor: String,
    /// read-uncommitted (default): every record below the high watermark;
    /// read-committed: only committed transactions' records (and
    /// non-transactional ones), below the last stable offset.
    #[arg(long, value_name = "LEVEL", default_value = "read-uncommitted", value_parser = parse_isolation)]
    pub isolation: Isolation,
    /// Exit after printing this many records.
    #[arg(long, value_name = "N")]
    pub max_messages: Option<u64>,
    /// Exit when no new record arrived for this long.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// How long the broker may hold a fetch while no new record arrives
    /// (Kafka's fetch.max.wait.ms; a record arriving answers it at once).
    #[arg(long, value_name = "MS", default_value_t = 500, value_parser = clap::value_parser!(u32).range(0..=60_000))]
    pub fetch_max_wait_ms: u32,
    /// Print each record's key before its value.
    #[arg(long)]
    pub print_key: bool,
    /// Print each record's partition:offset before it.
    #[arg(long)]
    pub print_offset: bool,
    /// Separator between offset, key and value.
    #[arg(long, value_name = "S", default_value = "\t")]
    pub key_separator: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Where the records come from: assigned partitions, or a consumer group.
enum Source {
    Plain(Consumer),
    Group {
        member: GroupConsumer,
        /// The next offset to commit per partition (after the last printed record).
        printed: HashMap<TopicPartition, Offset>,
    },
}

impl Source {
    async fn poll(
        &mut self,
        wait: Duration,
    ) -> Result<Vec<ConsumerRecord>, rill_client::ClientError> {
        match self {
            Source::Plain(c) => c.poll(wait).await,
            Source::Group { member, .. } => member.poll(wait).await,
        }
    }

    /// After `records` were printed and flushed: commit past them (group only).
    async fn printed(
        &mut self,
        records: &[ConsumerRecord],
    ) -> Result<(), rill_client::ClientError> {
        let Source::Group { member, printed } = self else {
            return Ok(());
        };
        for r in records {
            printed.insert(
                TopicPartition::new(r.topic.to_string(), r.partition),
                r.offset.plus(1),
            );
        }
        let revoked: Vec<TopicPartition> = member
            .take_events()
            .into_iter()
            .flat_map(|e| match e {
                GroupEvent::Revoked(tps) => tps,
                GroupEvent::Assigned(tps) => {
                    for tp in &tps {
                        tracing::info!("assigned {tp}");
                    }
                    Vec::new()
                }
            })
            .collect();
        let offsets: Vec<(TopicPartition, Offset)> =
            printed.iter().map(|(tp, o)| (tp.clone(), *o)).collect();
        // Commits the revoked partitions too (they are still ours until this
        // call acknowledges the revocation).
        match member.commit_offsets(&offsets).await {
            Ok(()) => {}
            Err(e) if e.is_fenced() => {
                // Removed from the group (session ended, or a new coordinator has
                // not seen us yet): rejoin and go on from the committed offsets.
                tracing::warn!(
                    error = %e,
                    "the group no longer counts this consumer; rejoining (records since the last commit may print again)"
                );
                printed.clear();
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        for tp in revoked {
            tracing::info!("revoked {tp}");
            printed.remove(&tp);
        }
        Ok(())
    }

    /// At exit: commit and leave the group.
    async fn finish(self) -> Result<(), rill_client::ClientError> {
        match self {
            Source::Plain(_) => Ok(()),
            Source::Group {
                mut member,
                printed,
            } => {
                let offsets: Vec<(TopicPartition, Offset)> = printed.into_iter().collect();
                let committed = member.commit_offsets(&offsets).await;
                let left = member.close().await;
                committed.and(left)
            }
        }
    }
}

async fn group_source(
    args: &ConsumeArgs,
    client: &rill_client::Client,
    group: &str,
) -> Result<Source, rill_client::ClientError> {
    let mut config = GroupConfig::new(group, vec![args.topic.clone()]);
    config.group_instance_id = args.group_instance_id.clone();
    config.session_timeout_ms = args.session_timeout_ms;
    config.heartbeat_interval_ms = args.heartbeat_interval_ms;
    config.assignor = args.assignor.clone();
    config.auto_offset_reset = if args.from_beginning {
        OffsetReset::Earliest
    } else {
        OffsetReset::Latest
    };
    config.consumer.isolation = args.isolation;
    config.consumer.fetch_max_wait = Duration::from_millis(args.fetch_max_wait_ms.into());
    // Commits are explicit: after the records are printed.
    config.enable_auto_commit = false;
    client.partition_count(&args.topic).await?;
    let member = client.group_consumer(config).await?;
    Ok(Source::Group {
        member,
        printed: HashMap::new(),
    })
}

pub async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let topic = args.topic.clone();
    let what = format!("cannot consume from topic {topic}");
    let client = args.client.connect().await?;
    if let Some(group) = &args.group {
        let what = format!("cannot consume from topic {topic} in group {group}");
        let source = group_source(&args, &client, group)
            .await
            .map_err(|e| client_error(&what, e))?;
        return print_records(&args, source, &what).await;
    }
    let config = ConsumerConfig {
        auto_offset_reset: if args.from_beginning {
            OffsetReset::Earliest
        } else {
            OffsetReset::Latest
        },
        isolation: args.isolation,
        fetch_max_wait: Duration::from_millis(args.fetch_max_wait_ms.into()),
        ..ConsumerConfig::default()
    };
    let mut consumer = client
        .consumer(config)
        .map_err(|e| client_error(&what, e))?;

    let tps = match args.partition {
        None => consumer
            .assign_topic(&topic)
            .await
            .map_err(|e| client_error(&what, e))?,
        Some(p) => {
            let count = client
                .partition_count(&topic)
                .await
                .map_err(|e| client_error(&what, e))?;
            anyhow::ensure!(
                p < count,
                "{what}: partition {p} does not exist: the topic has {count} partition(s), 0..={}. Pass a valid --partition",
                count.saturating_sub(1)
            );
            let tps = vec![TopicPartition::new(topic.clone(), p)];
            consumer.assign(tps.clone());
            tps
        }
    };
    match (args.from_beginning, args.offset) {
        (true, _) => consumer.seek_to_beginning(&tps).await,
        (false, Some(offset)) => {
            anyhow::ensure!(
                offset >= 0,
                "{what}: --offset {offset} is negative. Pass an offset >= 0"
            );
            tps.iter()
                .try_for_each(|tp| consumer.seek(tp, Offset(offset)))
        }
        (false, None) => consumer.seek_to_end(&tps).await,
    }
    .map_err(|e| client_error(format!("{what}: cannot find the start offset"), e))?;
    for tp in &tps {
        let position = consumer.position(tp).await.map_err(|e| {
            client_error(format!("{what}: cannot find the start offset of {tp}"), e)
        })?;
        tracing::info!("consuming from {tp} at offset {}", position.0);
    }
    print_records(&args, Source::Plain(consumer), &what).await
}

/// The print loop: poll, print, flush, commit (group), until a stop condition.
async fn print_records(args: &ConsumeArgs, mut source: Source, what: &str) -> anyhow::Result<()> {
    let mut interrupt =
        signal(SignalKind::interrupt()).context("cannot install the Ctrl-C handler")?;
    let mut terminate =
        signal(SignalKind::terminate()).context("cannot install the SIGTERM handler")?;
    let mut out = BufWriter::with_capacity(STDOUT_BUFFER_BYTES, std::io::stdout().lock());
    let idle_timeout = args.timeout_ms.map(Duration::from_millis);
    let mut last_record = Instant::now();
    let mut printed = 0u64;
    let mut line = Vec::new();

    let result: anyhow::Result<()> = async {
        loop {
            if args.max_messages.is_some_and(|max| printed >= max) {
                return Ok(());
            }
            let wait = match idle_timeout {
                Some(t) => match t.checked_sub(last_record.elapsed()) {
                    Some(left) if !left.is_zero() => left,
                    _ => return Ok(()),
                },
                None => POLL_WAIT_MAX,
            };
            let records = tokio::select! {
                r = source.poll(wait) => r.map_err(|e| client_error(what, e))?,
                _ = interrupt.recv() => return Ok(()),
                _ = terminate.recv() => return Ok(()),
            };
            if records.is_empty() {
                source
                    .printed(&[])
                    .await
                    .map_err(|e| client_error(what, e))?;
                continue;
            }
            last_record = Instant::now();
            let mut count = 0;
            for r in &records {
                line.clear();
                format_record(
                    &mut line,
                    args,
                    r.partition,
                    r.offset.0,
                    r.key.as_deref(),
                    r.value.as_deref(),
                );
                out.write_all(&line)?;
                printed += 1;
                count += 1;
                if args.max_messages.is_some_and(|max| printed >= max) {
                    break;
                }
            }
            out.flush()?;
            source
                .printed(&records[..count])
                .await
                .map_err(|e| client_error(what, e))?;
        }
    }
    .await;
    let result = result.and_then(|()| out.flush().map_err(anyhow::Error::from));
    // Commit and leave the group whatever ended the loop (after an error the
    // first error is what is reported).
    let finished = source.finish().await.map_err(|e| client_error(what, e));
    let result = result.and(finished);
    match result {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        Err(e) if e.downcast_ref::<std::io::Error>().is_some() => {
            Err(e.context("cannot write records to stdout"))
        }
        other => other,
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == ErrorKind::BrokenPipe)
}

/// Formats one record line (with trailing newline) into `out`.
pub fn format_record(
    out: &mut Vec<u8>,
    args: &ConsumeArgs,
    partition: u32,
    offset: i64,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) {
    let sep = args.key_separator.as_bytes();
    if args.print_offset {
        out.extend_from_slice(format!("{partition}:{offset}").as_bytes());
        out.extend_from_slice(sep);
    }
    if args.print_key {
        out.extend_from_slice(key.unwrap_or(b"null"));
        out.extend_from_slice(sep);
    }
    out.extend_from_slice(value.unwrap_or(b"null"));
    out.push(b'\n');
}

pub(crate) fn parse_isolation(s: &str) -> Result<Isolation, String> {
    match s {
        "read-uncommitted" | "read_uncommitted" => Ok(Isolation::ReadUncommitted),
        "read-committed" | "read_committed" => Ok(Isolation::ReadCommitted),
        other => Err(format!(
            "unknown isolation level {other:?}: use read-uncommitted or read-committed"
        )),
    }
}
