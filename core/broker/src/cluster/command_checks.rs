//! The checks of a metadata command against the image it would change: pure
//! functions, run before a command is proposed and again at the start of
//! `MetadataImage::apply`, so a malformed command never enters the quorum log
//! through this broker, and one that is in the log anyway (an old log, a
//! forged `MetadataWrite`) is refused, naming what is wrong, instead of
//! panicking the state machine on every broker and again on every replay.
//!
//! Two levels:
//! - [`check`] (at apply and before proposing): everything apply relies on —
//!   valid topic names and ids (they become directory and object-store
//!   paths), partition counts within `1..=PARTITIONS_PER_TOPIC_MAX`, every
//!   replica list non-empty, without duplicates, of registered brokers, broker
//!   ids `>= 0`, addresses `HOST:PORT`, ISR changes that hold the leader, and a
//!   bound on every list and string a command carries.
//! - [`check_proposal`] (before proposing only): [`check`] plus the rules a
//!   committed command need not have met when it was written — config entries
//!   through the table of topic configs, no duplicate ISR members, a bound on
//!   the topics of a preferred election.
//!
//! Invariant: [`check`] accepts every command a broker of this or an earlier
//! version proposed through its own validated paths (topic changes,
//! registration, the ISR loop, the controller's timers), so brokers replaying
//! an old log reach the same image as brokers that applied it before; it
//! refuses only what apply would have panicked on, or what no such broker
//! writes. A rule that could refuse an old legitimate command belongs in
//! [`check_proposal`].

use super::image::{Command, MetadataImage};
use crate::config::PARTITIONS_PER_TOPIC_MAX;
use crate::topic_configs;
use crate::topics::validate_topic_name;
use rill_proto::wire::{ErrorCode, ErrorInfo};
use std::collections::{BTreeMap, BTreeSet};

/// Longest cluster id.
pub const CLUSTER_ID_LEN_MAX: usize = 255;
/// Longest topic id (ours are 32 hex digits).
pub const TOPIC_ID_LEN_MAX: usize = 64;
/// Longest broker address, `HOST:PORT`.
pub const BROKER_ADDR_LEN_MAX: usize = 261;
/// Most config overrides one command may carry (the table has fewer keys).
pub const CONFIG_ENTRIES_MAX: usize = 256;
/// Longest config key.
pub const CONFIG_KEY_LEN_MAX: usize = 255;
/// Longest config value.
pub const CONFIG_VALUE_LEN_MAX: usize = 4096;
/// Most ISR changes one `AlterIsrBatch` may carry (the ISR loop sends at most
/// `replication::ISR_CHANGES_PER_PROPOSAL_MAX`).
pub const ISR_CHANGES_PER_COMMAND_MAX: usize = 65_536;
/// Most members one ISR change may name (a broker repeated included).
pub const ISR_MEMBERS_MAX: usize = 1024;
/// Most topics one preferred-leader election may name (proposals only).
pub const ELECT_TOPICS_MAX: usize = 10_000;

const _: () =
    assert!(super::replication::ISR_CHANGES_PER_PROPOSAL_MAX <= ISR_CHANGES_PER_COMMAND_MAX);

fn refuse(code: ErrorCode, message: String) -> Result<(), ErrorInfo> {
    Err(ErrorInfo::new(code, message))
}

fn invalid(message: String) -> Result<(), ErrorInfo> {
    refuse(ErrorCode::InvalidRequest, message)
}

/// Everything `apply` relies on; see the module doc.
pub fn check(image: &MetadataImage, command: &Command) -> Result<(), ErrorInfo> {
    match command {
        Command::CreateAcls { rules } | Command::DeleteAcls { rules } => {
            if rules.len() > super::image::ACL_RULES_MAX {
                return invalid(format!(
                    "{} ACL rules in one command, more than {}",
                    rules.len(),
                    super::image::ACL_RULES_MAX
                ));
            }
            super::image::check_acl_rules(rules).or_else(invalid)
        }
        Command::SetQuota { principal, quota } => {
            if let Err(e) = rill_net::identity::check_principal_name(principal) {
                return invalid(e.to_string());
            }
            if quota.produce_bytes_per_s == Some(0) || quota.fetch_bytes_per_s == Some(0) {
                return invalid(format!(
                    "a quota of 0 bytes/s for {principal:?} would stop it for good; \
                     remove the quota or give a rate >= 1"
                ));
            }
            Ok(())
        }
        Command::SetUser { name, credentials } => {
            if let Err(e) = rill_net::identity::check_principal_name(name) {
                return invalid(e.to_string());
            }
            let mut seen = Vec::new();
            for c in credentials {
                let m = match c.check() {
                    Ok(m) => m,
                    Err(why) => return invalid(format!("user {name}: {why}")),
                };
                if seen.contains(&m) {
                    return invalid(format!("user {name}: two {} credentials", m.name()));
                }
                seen.push(m);
            }
            if image.users.len() >= USERS_MAX
                && !credentials.is_empty()
                && !image.users.contains_key(name)
            {
                return refuse(
                    ErrorCode::PolicyViolation,
                    format!("the cluster has {USERS_MAX} SCRAM users already; remove one first"),
                );
            }
            Ok(())
        }
        Command::SetClusterId { cluster_id } => {
            if cluster_id.is_empty()
                || cluster_id.len() > CLUSTER_ID_LEN_MAX
                || cluster_id.chars().any(char::is_control)
            {
                return invalid(format!(
                    "cluster id {cluster_id:?} is not valid: use 1 to {CLUSTER_ID_LEN_MAX} \
                     characters without control characters"
                ));
            }
            Ok(())
        }
        Command::RegisterBroker {
            id,
            addr,
            listeners,
        } => {
            broker_id(*id, "broker")?;
            check_broker_addr(addr)
                .or_else(|why| invalid(format!("broker {id} registers address {addr:?}: {why}")))?;
            if listeners.len() > LISTENERS_MAX {
                return invalid(format!(
                    "broker {id} registers {} listeners; at most {LISTENERS_MAX}",
                    listeners.len()
                ));
            }
            for (name, addr) in listeners {
                if name.is_empty()
                    || name.len() > LISTENER_NAME_LEN_MAX
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                {
                    return invalid(format!(
                        "broker {id} registers a listener named {name:?}: a name is 1 to \
                         {LISTENER_NAME_LEN_MAX} letters, digits, '-' or '_'"
                    ));
                }
                check_broker_addr(addr).or_else(|why| {
                    invalid(format!(
                        "broker {id} registers its {name} listener at {addr:?}: {why}"
                    ))
                })?;
            }
            Ok(())
        }
        Command::CreateTopic {
            name,
            id,
            internal,
            configs,
            assignment,
        } => {
            validate_topic_name(name, *internal).map_err(|e| ErrorInfo {
                code: e.code,
                message: format!("create topic: {}", e.message),
            })?;
            check_topic_id(name, id)?;
            check_config_sizes(name, configs)?;
            if assignment.is_empty() || assignment.len() > PARTITIONS_PER_TOPIC_MAX as usize {
                return refuse(
                    ErrorCode::InvalidPartitions,
                    format!(
                        "topic {name}: partition count {} is not valid; use 1 to \
                         {PARTITIONS_PER_TOPIC_MAX}",
                        assignment.len()
                    ),
                );
            }
            for (p, replicas) in assignment.iter().enumerate() {
                check_replicas(image, name, p, replicas)?;
            }
            Ok(())
        }
        Command::CreatePartitions { name, assignment } => {
            let Some(t) = image.topics.get(name) else {
                return refuse(
                    ErrorCode::UnknownTopicOrPartition,
                    format!("topic {name:?} does not exist"),
                );
            };
            if t.internal {
                return refuse(
                    ErrorCode::InvalidRequest,
                    format!("{name} is an internal topic; its partition count is the broker's"),
                );
            }
            let total = t.partitions.len() + assignment.len();
            if assignment.is_empty() || total > PARTITIONS_PER_TOPIC_MAX as usize {
                return refuse(
                    ErrorCode::InvalidPartitions,
                    format!(
                        "topic {name}: {} more partitions on its {} is not valid; a topic has 1 \
                         to {PARTITIONS_PER_TOPIC_MAX}",
                        assignment.len(),
                        t.partitions.len()
                    ),
                );
            }
            for (i, replicas) in assignment.iter().enumerate() {
                check_replicas(image, name, t.partitions.len() + i, replicas)?;
            }
            Ok(())
        }
        Command::DeleteTopic { .. } | Command::AllocateProducerId => Ok(()),
        Command::SetTopicConfigs { name, configs } => check_config_sizes(name, configs),
        Command::FenceBroker { id } | Command::UnfenceBroker { id } => broker_id(*id, "broker"),
        Command::AlterIsr {
            broker_id: leader,
            topic,
            partition,
            new_isr,
            ..
        } => check_isr_change(*leader, topic, *partition, new_isr),
        Command::AlterIsrBatch {
            broker_id: leader,
            changes,
        } => {
            broker_id(*leader, "leader")?;
            if changes.len() > ISR_CHANGES_PER_COMMAND_MAX {
                return invalid(format!(
                    "an ISR batch of broker {leader} carries {} changes, more than \
                     {ISR_CHANGES_PER_COMMAND_MAX}",
                    changes.len()
                ));
            }
            // Each change is checked (and applied or refused) alone.
            Ok(())
        }
        Command::ElectPreferred { .. } => Ok(()),
    }
}

/// [`check`] plus the rules for a command about to be proposed; see the module doc.
pub fn check_proposal(image: &MetadataImage, command: &Command) -> Result<(), ErrorInfo> {
    check(image, command)?;
    match command {
        Command::CreateTopic { name, configs, .. } | Command::SetTopicConfigs { name, configs } => {
            for (key, value) in configs {
                topic_configs::check_entry(key, value).map_err(|e| ErrorInfo {
                    code: e.code,
                    message: format!("topic {name}: {}", e.message),
                })?;
            }
            Ok(())
        }
        Command::AlterIsr {
            topic,
            partition,
            new_isr,
            ..
        } => no_duplicate_members(topic, *partition, new_isr),
        Command::AlterIsrBatch { changes, .. } => {
            for c in changes {
                no_duplicate_members(&c.topic, c.partition, &c.new_isr)?;
            }
            Ok(())
        }
        Command::ElectPreferred {
            topics: Some(topics),
        } if topics.len() > ELECT_TOPICS_MAX => invalid(format!(
            "a preferred-leader election names {} topics, more than {ELECT_TOPICS_MAX}; \
             name none to elect over every topic",
            topics.len()
        )),
        _ => Ok(()),
    }
}

/// A broker address as brokers register and join with: `HOST:PORT`, the host
/// a name or an IP address (IPv6 in brackets), the port a number 1 to 65535.
/// Most SCRAM users the image holds.
pub const USERS_MAX: usize = 10_000;

/// Most listeners a broker registers besides its own address.
pub const LISTENERS_MAX: usize = 8;
/// Longest listener name.
pub const LISTENER_NAME_LEN_MAX: usize = 32;

pub fn check_broker_addr(addr: &str) -> Result<(), String> {
    if addr.is_empty() || addr.len() > BROKER_ADDR_LEN_MAX {
        return Err(format!(
            "an address is 1 to {BROKER_ADDR_LEN_MAX} characters, HOST:PORT"
        ));
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return Err("it is not HOST:PORT (no port)".into());
    };
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("port {port:?} is not a number from 1 to 65535"));
    }
    let name_ok = |h: &str| {
        !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => name_ok(host),
    };
    if !host_ok {
        return Err(format!(
            "host {host:?} is not a host name or an IP address (IPv6 in brackets)"
        ));
    }
    Ok(())
}

fn broker_id(id: i32, role: &str) -> Result<(), ErrorInfo> {
    if id < 0 {
        return invalid(format!("{role} id {id} is not valid: broker ids are >= 0"));
    }
    Ok(())
}

fn check_topic_id(name: &str, id: &str) -> Result<(), ErrorInfo> {
    if id.is_empty()
        || id.len() > TOPIC_ID_LEN_MAX
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    {
        return invalid(format!(
            "topic {name}: topic id {id:?} is not valid: use 1 to {TOPIC_ID_LEN_MAX} of \
             a-z, A-Z, 0-9, '-' and '_'"
        ));
    }
    Ok(())
}

fn check_config_sizes(name: &str, configs: &BTreeMap<String, String>) -> Result<(), ErrorInfo> {
    if configs.len() > CONFIG_ENTRIES_MAX {
        return refuse(
            ErrorCode::InvalidConfig,
            format!(
                "topic {name}: {} config overrides, more than {CONFIG_ENTRIES_MAX}",
                configs.len()
            ),
        );
    }
    if let Some((k, v)) = configs
        .iter()
        .find(|(k, v)| k.len() > CONFIG_KEY_LEN_MAX || v.len() > CONFIG_VALUE_LEN_MAX)
    {
        return refuse(
            ErrorCode::InvalidConfig,
            format!(
                "topic {name}: config {:?} ({} bytes) = ({} bytes) is longer than allowed \
                 (keys {CONFIG_KEY_LEN_MAX}, values {CONFIG_VALUE_LEN_MAX} bytes)",
                k.chars().take(64).collect::<String>(),
                k.len(),
                v.len()
            ),
        );
    }
    Ok(())
}

/// One partition's replicas in a new topic: non-empty, distinct, registered.
fn check_replicas(
    image: &MetadataImage,
    name: &str,
    partition: usize,
    replicas: &[i32],
) -> Result<(), ErrorInfo> {
    let bad = |why: String| {
        refuse(
            ErrorCode::InvalidReplicationFactor,
            format!("topic {name} partition {partition}: replicas {replicas:?} {why}"),
        )
    };
    if replicas.is_empty() {
        return bad("are empty: every partition needs at least one replica".into());
    }
    let mut seen = BTreeSet::new();
    for &b in replicas {
        if !seen.insert(b) {
            return bad(format!("name broker {b} twice"));
        }
        if !image.brokers.contains_key(&b) {
            return bad(format!("name broker {b}, which is not a registered broker"));
        }
    }
    Ok(())
}

/// One ISR change's shape (whether it fits the partition is apply's to judge).
fn check_isr_change(
    leader: i32,
    topic: &str,
    partition: u32,
    new_isr: &[i32],
) -> Result<(), ErrorInfo> {
    broker_id(leader, "leader")?;
    if new_isr.is_empty() || new_isr.len() > ISR_MEMBERS_MAX || !new_isr.contains(&leader) {
        return invalid(format!(
            "partition {topic}-{partition}: new ISR {:?} must hold the leader {leader} \
             and at most {ISR_MEMBERS_MAX} members",
            &new_isr[..new_isr.len().min(16)]
        ));
    }
    Ok(())
}

fn no_duplicate_members(topic: &str, partition: u32, new_isr: &[i32]) -> Result<(), ErrorInfo> {
    let mut seen = BTreeSet::new();
    if let Some(b) = new_isr.iter().find(|b| !seen.insert(**b)) {
        return invalid(format!(
            "partition {topic}-{partition}: new ISR {new_isr:?} names broker {b} twice"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::{IsrChange, Outcome, assign_replicas};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use rill_proto::LeaderEpoch;

    /// Brokers 0..3 registered, topic "t" (2 partitions, RF 3) and "u" (RF 1).
    fn image() -> MetadataImage {
        let mut m = MetadataImage::default();
        for id in 0..3 {
            let out = m.apply(&Command::RegisterBroker {
                id,
                addr: format!("127.0.0.1:{}", 9092 + id),
                listeners: Default::default(),
            });
            assert!(!matches!(out, Outcome::Refused { .. }), "{out:?}");
        }
        for (name, rf) in [("t", 3), ("u", 1)] {
            let out = m.apply(&create(
                name,
                assign_replicas(&m.live_brokers(), 2, rf, 0).unwrap(),
            ));
            assert_eq!(out, Outcome::Done);
        }
        m
    }

    fn create(name: &str, assignment: Vec<Vec<i32>>) -> Command {
        create_as(
            name,
            &format!("id-{name}"),
            false,
            BTreeMap::new(),
            assignment,
        )
    }

    fn create_as(
        name: &str,
        id: &str,
        internal: bool,
        configs: BTreeMap<String, String>,
        assignment: Vec<Vec<i32>>,
    ) -> Command {
        Command::CreateTopic {
            name: name.into(),
            id: id.into(),
            internal,
            configs,
            assignment,
        }
    }

    fn isr(leader: i32, new_isr: Vec<i32>) -> Command {
        Command::AlterIsr {
            broker_id: leader,
            topic: "t".into(),
            partition: 0,
            leader_epoch: LeaderEpoch(0),
            new_isr,
        }
    }

    fn scram(m: rill_proto::scram::Mechanism) -> rill_proto::scram::ScramCredential {
        rill_proto::scram::ScramCredential::derive(m, b"pw", &[9; 16], 4096)
    }

    fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Applies `command` and expects a refusal with `code` whose message holds
    /// `text`, the image unchanged.
    fn refused(m: &mut MetadataImage, command: Command, code: ErrorCode, text: &str) {
        let before = m.clone();
        match m.apply(&command) {
            Outcome::Refused { code: c, message } => {
                assert_eq!(c, code, "{message}");
                assert!(message.contains(text), "{text:?} not in {message:?}");
            }
            other => panic!("{command:?} was not refused: {other:?}"),
        }
        assert_eq!(*m, before, "a refused command changed the image");
    }

    #[test]
    fn every_malformed_command_kind_is_refused_and_changes_nothing() {
        use ErrorCode::*;
        let mut m = image();
        let cases: Vec<(Command, ErrorCode, &str)> = vec![
            (
                Command::SetClusterId {
                    cluster_id: String::new(),
                },
                InvalidRequest,
                "cluster id",
            ),
            (
                Command::SetClusterId {
                    cluster_id: "a\nb".into(),
                },
                InvalidRequest,
                "control",
            ),
            (
                Command::RegisterBroker {
                    id: -1,
                    addr: "127.0.0.1:1".into(),
                    listeners: Default::default(),
                },
                InvalidRequest,
                "id -1",
            ),
            (
                Command::RegisterBroker {
                    id: 4,
                    addr: "nowhere".into(),
                    listeners: Default::default(),
                },
                InvalidRequest,
                "no port",
            ),
            (
                Command::RegisterBroker {
                    id: 4,
                    addr: "host:0".into(),
                    listeners: Default::default(),
                },
                InvalidRequest,
                "port \"0\"",
            ),
            (
                Command::RegisterBroker {
                    id: 4,
                    addr: "a b:9092".into(),
                    listeners: Default::default(),
                },
                InvalidRequest,
                "host \"a b\"",
            ),
            (
                Command::RegisterBroker {
                    id: 4,
                    addr: "127.0.0.1:9092".into(),
                    listeners: [("kafka".to_string(), "127.0.0.1:0".to_string())].into(),
                },
                InvalidRequest,
                "its kafka listener at \"127.0.0.1:0\"",
            ),
            (
                Command::RegisterBroker {
                    id: 4,
                    addr: "127.0.0.1:9092".into(),
                    listeners: [("ka fka".to_string(), "127.0.0.1:9093".to_string())].into(),
                },
                InvalidRequest,
                "a listener named \"ka fka\"",
            ),
            (
                Command::SetUser {
                    name: "alice".into(),
                    credentials: vec![
                        scram(rill_proto::scram::Mechanism::Sha256),
                        scram(rill_proto::scram::Mechanism::Sha256),
                    ],
                },
                InvalidRequest,
                "two SCRAM-SHA-256 credentials",
            ),
            (
                Command::SetUser {
                    name: "alice".into(),
                    credentials: vec![{
                        let mut c = scram(rill_proto::scram::Mechanism::Sha512);
                        c.iterations = 10;
                        c
                    }],
                },
                InvalidRequest,
                "10 iterations",
            ),
            (
                Command::SetUser {
                    name: "a b".into(),
                    credentials: Vec::new(),
                },
                InvalidRequest,
                "a b",
            ),
            (create("a/b", vec![vec![0]]), InvalidTopic, "not allowed"),
            (create("..", vec![vec![0]]), InvalidTopic, "reserved"),
            (create("__x", vec![vec![0]]), InvalidTopic, "internal"),
            (
                create_as("v", "../../x", false, BTreeMap::new(), vec![vec![0]]),
                InvalidRequest,
                "topic id",
            ),
            (
                create_as("v", "", false, BTreeMap::new(), vec![vec![0]]),
                InvalidRequest,
                "topic id",
            ),
            (create("v", vec![]), InvalidPartitions, "partition count 0"),
            (
                create("v", vec![vec![0]; PARTITIONS_PER_TOPIC_MAX as usize + 1]),
                InvalidPartitions,
                "partition count 10001",
            ),
            (
                create("v", vec![vec![0], vec![]]),
                InvalidReplicationFactor,
                "topic v partition 1: replicas [] are empty",
            ),
            (
                create("v", vec![vec![1, 1]]),
                InvalidReplicationFactor,
                "broker 1 twice",
            ),
            (
                create("v", vec![vec![0, 9]]),
                InvalidReplicationFactor,
                "broker 9, which is not a registered broker",
            ),
            (
                create_as(
                    "v",
                    "id-v",
                    false,
                    (0..=CONFIG_ENTRIES_MAX)
                        .map(|i| (format!("k{i}"), "v".to_string()))
                        .collect(),
                    vec![vec![0]],
                ),
                InvalidConfig,
                "257 config overrides",
            ),
            (
                Command::SetTopicConfigs {
                    name: "t".into(),
                    configs: configs(&[("retention.ms", &"9".repeat(5000))]),
                },
                InvalidConfig,
                "longer than allowed",
            ),
            (Command::FenceBroker { id: -3 }, InvalidRequest, "id -3"),
            (Command::UnfenceBroker { id: -3 }, InvalidRequest, "id -3"),
            (isr(-1, vec![-1]), InvalidRequest, "leader id -1"),
            (isr(0, vec![]), InvalidRequest, "must hold the leader 0"),
            (isr(0, vec![1, 2]), InvalidRequest, "must hold the leader 0"),
            (
                isr(0, vec![0; ISR_MEMBERS_MAX + 1]),
                InvalidRequest,
                "at most 1024",
            ),
            (
                Command::AlterIsrBatch {
                    broker_id: 0,
                    changes: vec![
                        IsrChange {
                            topic: "t".into(),
                            partition: 0,
                            leader_epoch: LeaderEpoch(0),
                            new_isr: vec![0],
                        };
                        ISR_CHANGES_PER_COMMAND_MAX + 1
                    ],
                },
                InvalidRequest,
                "65537 changes",
            ),
        ];
        for (command, code, text) in cases {
            refused(&mut m, command, code, text);
        }
        // A malformed change in an ISR batch is refused alone, as any other.
        let before = m.clone();
        let out = m.apply(&Command::AlterIsrBatch {
            broker_id: 0,
            changes: vec![IsrChange {
                topic: "t".into(),
                partition: 0,
                leader_epoch: LeaderEpoch(0),
                new_isr: vec![],
            }],
        });
        assert!(
            matches!(&out, Outcome::Refused { message, .. } if message.contains("1 of 1")),
            "{out:?}"
        );
        assert_eq!(m, before);
        // Producer ids do not wrap.
        m.next_producer_id = i64::MAX;
        refused(
            &mut m,
            Command::AllocateProducerId,
            PolicyViolation,
            "exhausted",
        );
    }

    #[test]
    fn good_commands_pass_both_levels() {
        let m = image();
        for command in [
            Command::SetClusterId {
                cluster_id: "rill-0123abcd".into(),
            },
            Command::RegisterBroker {
                id: 3,
                addr: "broker-3.example.com:9092".into(),
                listeners: Default::default(),
            },
            Command::RegisterBroker {
                id: 3,
                addr: "[::1]:9092".into(),
                listeners: [("kafka".to_string(), "[::1]:9093".to_string())].into(),
            },
            create_as(
                "__consumer_offsets",
                "0123456789abcdef0123456789abcdef",
                true,
                configs(&[("cleanup.policy", "compact")]),
                vec![vec![0, 1], vec![1, 2]],
            ),
            Command::SetTopicConfigs {
                name: "t".into(),
                configs: configs(&[("retention.ms", "1000")]),
            },
            isr(0, vec![0, 1]),
            Command::ElectPreferred {
                topics: Some(vec!["t".into(), "gone".into()]),
            },
            Command::SetUser {
                name: "alice".into(),
                credentials: vec![
                    scram(rill_proto::scram::Mechanism::Sha256),
                    scram(rill_proto::scram::Mechanism::Sha512),
                ],
            },
            Command::SetUser {
                name: "nobody".into(),
                credentials: Vec::new(),
            },
            Command::FenceBroker { id: 2 },
            Command::AllocateProducerId,
        ] {
            check_proposal(&m, &command).unwrap_or_else(|e| panic!("{command:?}: {e}"));
        }
    }

    #[test]
    fn proposals_are_held_to_the_config_table_and_distinct_isr_members() {
        let m = image();
        let e = check_proposal(
            &m,
            &Command::SetTopicConfigs {
                name: "t".into(),
                configs: configs(&[("retention.mss", "1")]),
            },
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig);
        assert!(
            e.message.starts_with("topic t: ") && e.message.contains("retention.mss"),
            "{}",
            e.message
        );
        let e = check_proposal(&m, &isr(0, vec![0, 1, 1])).unwrap_err();
        assert!(e.message.contains("broker 1 twice"), "{}", e.message);
        let e = check_proposal(
            &m,
            &Command::ElectPreferred {
                topics: Some(vec!["t".into(); ELECT_TOPICS_MAX + 1]),
            },
        )
        .unwrap_err();
        assert!(e.message.contains("10001 topics"), "{}", e.message);
        // The same commands committed anyway apply as they always did (older
        // brokers wrote them): check alone takes them.
        check(&m, &isr(0, vec![0, 1, 1])).unwrap();
    }

    /// Random (mostly malformed) commands never panic `apply`, a refusal never
    /// changes the image, and the image's invariants hold after each command
    /// (asserted by `apply` in debug builds). Seed from `RILL_IMAGE_SEED`
    /// (one), else 0..40.
    #[test]
    fn seeded_random_commands_never_panic_and_refusals_change_nothing() {
        let seeds: Vec<u64> = match std::env::var("RILL_IMAGE_SEED") {
            Ok(s) => vec![s.parse().expect("RILL_IMAGE_SEED is a number")],
            Err(_) => (0..40).collect(),
        };
        for seed in seeds {
            random_run(seed);
        }
    }

    fn random_run(seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut m = image();
        const NAMES: [&str; 6] = ["t", "u", "v", "", "a/b", "__w"];
        for step in 0..2_000 {
            let id = |rng: &mut StdRng| rng.random_range(-2..6);
            let ids = |rng: &mut StdRng| {
                let n = rng.random_range(0..5);
                (0..n)
                    .map(|_| rng.random_range(-1..5))
                    .collect::<Vec<i32>>()
            };
            let name = |rng: &mut StdRng| NAMES[rng.random_range(0..NAMES.len())].to_string();
            let command = match rng.random_range(0..11) {
                0 => Command::SetClusterId {
                    cluster_id: ["", "c", "x\u{7}"][rng.random_range(0..3)].into(),
                },
                1 => Command::RegisterBroker {
                    id: id(&mut rng),
                    addr: ["127.0.0.1:9092", "bad", "h:0", "[::1]:1"][rng.random_range(0..4)]
                        .into(),
                    listeners: Default::default(),
                },
                2 => Command::CreateTopic {
                    name: name(&mut rng),
                    id: ["id", "", "../x"][rng.random_range(0..3)].into(),
                    internal: rng.random_bool(0.2),
                    configs: BTreeMap::new(),
                    assignment: (0..rng.random_range(0..4)).map(|_| ids(&mut rng)).collect(),
                },
                3 => Command::DeleteTopic {
                    name: name(&mut rng),
                },
                4 => Command::SetTopicConfigs {
                    name: name(&mut rng),
                    configs: configs(&[(
                        UNCLEAN_ELECTION,
                        ["true", "false"][rng.random_range(0..2)],
                    )]),
                },
                5 => Command::FenceBroker { id: id(&mut rng) },
                6 => Command::UnfenceBroker { id: id(&mut rng) },
                7 => Command::AlterIsr {
                    broker_id: id(&mut rng),
                    topic: name(&mut rng),
                    partition: rng.random_range(0..3),
                    leader_epoch: LeaderEpoch(rng.random_range(0..4)),
                    new_isr: ids(&mut rng),
                },
                8 => Command::AlterIsrBatch {
                    broker_id: id(&mut rng),
                    changes: (0..rng.random_range(0..3))
                        .map(|_| IsrChange {
                            topic: name(&mut rng),
                            partition: rng.random_range(0..3),
                            leader_epoch: LeaderEpoch(rng.random_range(0..4)),
                            new_isr: ids(&mut rng),
                        })
                        .collect(),
                },
                9 => Command::ElectPreferred {
                    topics: rng.random_bool(0.5).then(|| vec![name(&mut rng)]),
                },
                _ => Command::AllocateProducerId,
            };
            let before = m.clone();
            let outcome = m.apply(&command);
            if let Outcome::Refused { message, .. } = &outcome
                && !matches!(command, Command::AlterIsrBatch { .. })
            {
                assert_eq!(
                    m, before,
                    "seed {seed} step {step}: refused {command:?} ({message}) changed the image"
                );
            }
        }
    }

    const UNCLEAN_ELECTION: &str = crate::topic_configs::UNCLEAN_ELECTION_CONFIG;
}
