//! `rill topic create|list|describe|delete|alter`: topic administration.
//!
//! `describe` prints Kafka's `kafka-topics.sh --describe` layout exactly
//! (tab-separated; tests and scripts parse it):
//!
//! ```text
//! Topic:NAME<TAB>PartitionCount:N<TAB>ReplicationFactor:R<TAB>Configs:k=v,k=v
//! <TAB>Topic: NAME<TAB>Partition: P<TAB>Leader: L<TAB>Replicas: a,b<TAB>Isr: a,b
//! ```
//!
//! `Configs` lists only the topic's non-default configs, sorted by key; a partition
//! without a leader prints `Leader: none`.

use std::io::Write;

use anyhow::Context;
use clap::{Args, Subcommand};
use rill_proto::wire::NewTopic;

use crate::client_args::{ClientArgs, client_error};

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic.
    Create(CreateArgs),
    /// List topic names, one per line.
    List(ListArgs),
    /// Describe a topic: partitions, leaders, replicas, non-default configs
    /// (every topic when no name is given, as Kafka's `--describe` without `--topic`).
    Describe(DescribeArgs),
    /// Delete a topic and all its data.
    Delete(NameArgs),
    /// Set or remove per-topic configs.
    Alter(AlterArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Topic name.
    pub name: String,
    /// Number of partitions (default: the broker's num.partitions).
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Copies of each partition (default: the broker's default.replication.factor).
    #[arg(long)]
    pub replication_factor: Option<u16>,
    /// A topic config, KEY=VALUE (repeatable), e.g. retention.ms=60000.
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub configs: Vec<(String, String)>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Also list the internal topics (`__consumer_offsets`, `__transforms`, ...).
    #[arg(long)]
    pub include_internal: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct NameArgs {
    /// Topic name.
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// Topic name; every topic, sorted by name, when left out.
    pub name: Option<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct AlterArgs {
    /// Topic name.
    pub name: String,
    /// A topic config to set, KEY=VALUE (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub configs: Vec<(String, String)>,
    /// A topic config to remove, back to the broker default (repeatable).
    #[arg(long = "delete-config", value_name = "KEY")]
    pub delete_configs: Vec<String>,
    /// Raise the partition count to N (it can only grow; keys then map to
    /// other partitions than before).
    #[arg(long, value_name = "N")]
    pub partitions: Option<u32>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub async fn run(command: TopicCommand) -> anyhow::Result<()> {
    match command {
        TopicCommand::Create(args) => {
            let admin = args.client.connect().await?.admin();
            let name = args.name.clone();
            admin
                .create_topic(NewTopic {
                    name: args.name,
                    partitions: args.partitions,
                    replication_factor: args.replication_factor,
                    configs: args.configs,
                })
                .await
                .map_err(|e| client_error(format!("cannot create topic {name}"), e))?;
            print_out(&format!("Created topic {name}.\n"))
        }
        TopicCommand::List(args) => {
            let admin = args.client.connect().await?.admin();
            let names = admin
                .list_topics()
                .await
                .map_err(|e| client_error("cannot list topics", e))?;
            let mut out = String::new();
            for name in names {
                if name.starts_with("__") && !args.include_internal {
                    continue;
                }
                out.push_str(&name);
                out.push('\n');
            }
            print_out(&out)
        }
        TopicCommand::Describe(DescribeArgs { name: None, client }) => {
            let admin = client.connect().await?.admin();
            let topics = admin
                .describe_topics()
                .await
                .map_err(|e| client_error("cannot describe the topics", e))?;
            let mut out = String::new();
            for topic in topics {
                let partitions: Vec<PartitionLine> = topic
                    .partitions
                    .iter()
                    .map(|p| PartitionLine::of(p, None))
                    .collect();
                out.push_str(&format_describe(
                    &topic.name,
                    &partitions,
                    &non_default(&topic.configs),
                ));
            }
            print_out(&out)
        }
        TopicCommand::Describe(DescribeArgs {
            name: Some(name),
            client,
        }) => {
            let args = NameArgs { name, client };
            let admin = args.client.connect().await?.admin();
            let topic = admin
                .describe_topic(&args.name)
                .await
                .map_err(|e| client_error(format!("cannot describe topic {}", args.name), e))?;
            // Tiered storage columns, when the broker tiers to an object store.
            let storage = admin
                .describe_storage(&args.name)
                .await
                .map_err(|e| client_error(format!("cannot describe topic {}", args.name), e))?
                .filter(|s| s.object_store.is_some());
            let partitions: Vec<PartitionLine> = topic
                .partitions
                .iter()
                .map(|p| {
                    let columns = storage.as_ref().and_then(|s| {
                        s.partitions
                            .iter()
                            .find(|sp| sp.partition == p.partition && sp.error.is_none())
                            .map(|sp| StorageColumns {
                                log_start_offset: sp.log_start_offset.0,
                                local_log_start_offset: sp.local_log_start_offset.0,
                                remote_size_bytes: sp.remote_size_bytes,
                            })
                    });
                    PartitionLine::of(p, columns)
                })
                .collect();
            print_out(&format_describe(
                &topic.name,
                &partitions,
                &non_default(&topic.configs),
            ))
        }
        TopicCommand::Delete(args) => {
            let admin = args.client.connect().await?.admin();
            admin
                .delete_topic(&args.name)
                .await
                .map_err(|e| client_error(format!("cannot delete topic {}", args.name), e))?;
            print_out(&format!("Deleted topic {}.\n", args.name))
        }
        TopicCommand::Alter(args) => {
            let configs = !args.configs.is_empty() || !args.delete_configs.is_empty();
            anyhow::ensure!(
                configs || args.partitions.is_some(),
                "nothing to alter on topic {}: pass --config KEY=VALUE, --delete-config KEY or \
                 --partitions N",
                args.name
            );
            let admin = args.client.connect().await?.admin();
            let mut done = String::new();
            if let Some(count) = args.partitions {
                admin
                    .create_partitions(&args.name, count)
                    .await
                    .map_err(|e| {
                        client_error(format!("cannot add partitions to topic {}", args.name), e)
                    })?;
                done.push_str(&format!("Topic {} has {count} partitions.\n", args.name));
            }
            if configs {
                admin
                    .alter_configs(&args.name, args.configs, args.delete_configs)
                    .await
                    .map_err(|e| {
                        client_error(format!("cannot alter configs of topic {}", args.name), e)
                    })?;
                done.push_str(&format!("Altered configs of topic {}.\n", args.name));
            }
            print_out(&done)
        }
    }
}

/// Writes command output to stdout; a closed stdout (`| head`) is not an error.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to stdout"),
    }
}

/// Parses `KEY=VALUE` (splitting at the first `=`; the value may contain `=`).
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// The configs `describe` lists: those that are not the broker's default.
fn non_default(configs: &[rill_proto::wire::ConfigEntry]) -> Vec<(String, String)> {
    configs
        .iter()
        .filter(|c| !c.is_default)
        .map(|c| (c.name.clone(), c.value.clone()))
        .collect()
}

/// One partition as `describe` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLine {
    pub partition: u32,
    pub leader: Option<i32>,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// Shown after Kafka's columns when the broker has tiered storage.
    pub storage: Option<StorageColumns>,
}

impl PartitionLine {
    /// Kafka's columns from the partition's metadata, and the storage columns.
    fn of(
        p: &rill_proto::wire::PartitionMetadata,
        storage: Option<StorageColumns>,
    ) -> PartitionLine {
        PartitionLine {
            partition: p.partition,
            leader: p.leader,
            replicas: p.replicas.clone(),
            isr: p.isr.clone(),
            storage,
        }
    }
}

/// The tiered-storage columns of `describe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageColumns {
    pub log_start_offset: i64,
    pub local_log_start_offset: i64,
    pub remote_size_bytes: u64,
}

/// Renders the Kafka describe layout (every line ends with `\n`).
pub fn format_describe(
    topic: &str,
    partitions: &[PartitionLine],
    non_default_configs: &[(String, String)],
) -> String {
    let mut configs: Vec<&(String, String)> = non_default_configs.iter().collect();
    configs.sort();
    let configs = configs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let replication_factor = partitions.first().map_or(0, |p| p.replicas.len());
    let mut out = format!(
        "Topic:{topic}\tPartitionCount:{}\tReplicationFactor:{replication_factor}\tConfigs:{configs}\n",
        partitions.len()
    );
    let mut sorted: Vec<&PartitionLine> = partitions.iter().collect();
    sorted.sort_by_key(|p| p.partition);
    for p in sorted {
        let leader = p
            .leader
            .map_or_else(|| "none".to_string(), |l| l.to_string());
        out.push_str(&format!(
            "\tTopic: {topic}\tPartition: {}\tLeader: {leader}\tReplicas: {}\tIsr: {}",
            p.partition,
            join_ids(&p.replicas),
            join_ids(&p.isr)
        ));
        if let Some(s) = &p.storage {
            out.push_str(&format!(
                "\tLogStartOffset: {}\tLocalLogStartOffset: {}\tRemoteSize: {}",
                s.log_start_offset, s.local_log_start_offset, s.remote_size_bytes
            ));
        }
        out.push('\n');
    }
    out
}

fn join_ids(ids: &[i32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_matches_kafka_layout() {
        let parts = vec![
            PartitionLine {
                partition: 1,
                leader: None,
                replicas: vec![2, 1],
                isr: vec![2],
                storage: None,
            },
            PartitionLine {
                partition: 0,
                leader: Some(1),
                replicas: vec![1, 2],
                isr: vec![1, 2],
                storage: None,
            },
        ];
        let configs = vec![
            ("retention.ms".to_string(), "1000".to_string()),
            ("cleanup.policy".to_string(), "compact".to_string()),
        ];
        assert_eq!(
            format_describe("t", &parts, &configs),
            "Topic:t\tPartitionCount:2\tReplicationFactor:2\tConfigs:cleanup.policy=compact,retention.ms=1000\n\
             \tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1,2\tIsr: 1,2\n\
             \tTopic: t\tPartition: 1\tLeader: none\tReplicas: 2,1\tIsr: 2\n"
        );
        assert_eq!(
            format_describe("t", &parts[1..], &[]),
            "Topic:t\tPartitionCount:1\tReplicationFactor:2\tConfigs:\n\tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1,2\tIsr: 1,2\n"
        );
        let mut tiered = parts[1].clone();
        tiered.storage = Some(StorageColumns {
            log_start_offset: 0,
            local_log_start_offset: 500,
            remote_size_bytes: 12345,
        });
        assert_eq!(
            format_describe("t", &[tiered], &[]),
            "Topic:t\tPartitionCount:1\tReplicationFactor:2\tConfigs:\n\tTopic: t\tPartition: 0\tLeader: 1\tReplicas: 1,2\tIsr: 1,2\tLogStartOffset: 0\tLocalLogStartOffset: 500\tRemoteSize: 12345\n"
        );
    }

    #[test]
    fn key_value_parsing() {
        assert_eq!(
            parse_key_value("a=b=c").unwrap(),
            ("a".into(), "b=c".into())
        );
        assert_eq!(parse_key_value("a=").unwrap(), ("a".into(), "".into()));
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=x").is_err());
    }
}
