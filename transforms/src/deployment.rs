//! A deployment: a named transform module with its inputs, outputs, error
//! policy, configuration and run state, as stored in the compacted topic
//! [`TRANSFORMS_TOPIC`] (key = the name, value = the record below; a tombstone
//! deletes the transform).
//!
//! Format of the value (version 1): one byte `1`, then the postcard encoding of
//! [`Deployment`]. A reader refuses another version with an error naming it.
//!
//! Names of the topics a deployment owns: `<name>.dlq` (dead letters),
//! `__transform-<name>-state` (the state changelog, compacted). The consumer
//! group is `__transform-<name>`.

use rill_client::{AclOperation, AclResource, TransformWriteRequest};
use serde::{Deserialize, Serialize};

use crate::error::TransformError;
use crate::limits::HostMaxima;
use crate::module::MODULE_BYTES_MAX;

/// The compacted topic that holds every deployment.
pub const TRANSFORMS_TOPIC: &str = "__transforms";
/// The format version of a deployment record.
pub const DEPLOYMENT_FORMAT_VERSION: u8 = 2;
/// The format before `delivery` (read, converted to at-least-once).
const DEPLOYMENT_FORMAT_V1: u8 = 1;
/// The default commit interval of an exactly-once transform.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 100;
/// The longest transform name.
pub const NAME_LEN_MAX: usize = 100;
/// Bound on input and on output topics of one deployment.
pub const TOPICS_PER_DEPLOYMENT_MAX: usize = 16;
/// Bound on `--config` entries.
pub const CONFIG_ENTRIES_MAX: usize = 256;

/// What happens to a record the module fails on (an error, a trap, a deadline).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ErrorPolicy {
    /// Count it, log it and go on.
    Skip,
    /// Write the input record to `<name>.dlq` with the error in a header, go on.
    #[default]
    DeadLetter,
    /// Stop the transform; `describe` shows the record and the error.
    Halt,
}

impl std::str::FromStr for ErrorPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<ErrorPolicy, String> {
        match s {
            "skip" => Ok(ErrorPolicy::Skip),
            "dead-letter" => Ok(ErrorPolicy::DeadLetter),
            "halt" => Ok(ErrorPolicy::Halt),
            other => Err(format!(
                "unknown error policy {other:?}: use skip, dead-letter or halt"
            )),
        }
    }
}

impl std::fmt::Display for ErrorPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorPolicy::Skip => "skip",
            ErrorPolicy::DeadLetter => "dead-letter",
            ErrorPolicy::Halt => "halt",
        })
    }
}

/// Where a partition starts when the transform has no committed offset for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum StartFrom {
    #[default]
    Earliest,
    Latest,
}

impl std::str::FromStr for StartFrom {
    type Err = String;
    fn from_str(s: &str) -> Result<StartFrom, String> {
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            other => Err(format!(
                "unknown start position {other:?}: use earliest or latest"
            )),
        }
    }
}

/// Whether the transform should run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
    Running,
    /// `rill transform pause`: stopped, offsets and state kept.
    Paused,
    /// Stopped by the `halt` policy (or a failing init); why, and where.
    Halted {
        reason: String,
    },
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunState::Running => f.write_str("running"),
            RunState::Paused => f.write_str("paused"),
            RunState::Halted { reason } => write!(f, "halted: {reason}"),
        }
    }
}

/// How a transform's outputs, state writes and input offsets are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Delivery {
    /// Outputs are acknowledged, then the state and the input offsets are
    /// committed; a restart does not write an output twice (checkpoints and
    /// origin headers, see `checkpoint.rs`), but a reader can see outputs of
    /// input records whose offsets are not committed yet.
    #[default]
    AtLeastOnce,
    /// Each input partition's outputs, state writes and input offsets are
    /// committed in one transaction, at most every `commit_interval_ms`, under
    /// a transactional id of its own: a new owner of the partition fences the
    /// old one, and `read_committed` readers see every output exactly once.
    ExactlyOnce { commit_interval_ms: u64 },
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Delivery::AtLeastOnce => f.write_str("at-least-once"),
            Delivery::ExactlyOnce { commit_interval_ms } => {
                write!(f, "exactly-once (commit every {commit_interval_ms} ms)")
            }
        }
    }
}

/// One deployed transform.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    pub name: String,
    pub inputs: Vec<String>,
    /// The first is where outputs without a topic go.
    pub outputs: Vec<String>,
    pub on_error: ErrorPolicy,
    pub from: StartFrom,
    pub config: Vec<(String, String)>,
    pub state: RunState,
    /// Bumped by every deploy of this name (a new module restarts the instances).
    pub version: u64,
    pub deployed_at_ms: i64,
    /// Memory cap of one instance.
    pub memory_bytes_max: u64,
    /// Deadline of one call into the module.
    pub call_timeout_ms: u64,
    pub delivery: Delivery,
    /// The component's bytes.
    pub module: Vec<u8>,
    /// The principal the transform runs as (`User:NAME`, `Anonymous`,
    /// `Broker:ID`): not part of the encoded record but the header the broker
    /// stamped on it ([`rill_client::DEPLOYER_HEADER`]) when the deployer's
    /// rights were checked; `None` on a record written before deployments
    /// carried it, or not yet written.
    #[serde(skip)]
    pub owner: Option<String>,
}

/// A deployment record of format 1 (before `delivery`).
#[derive(Deserialize)]
struct DeploymentV1 {
    name: String,
    inputs: Vec<String>,
    outputs: Vec<String>,
    on_error: ErrorPolicy,
    from: StartFrom,
    config: Vec<(String, String)>,
    state: RunState,
    version: u64,
    deployed_at_ms: i64,
    memory_bytes_max: u64,
    call_timeout_ms: u64,
    module: Vec<u8>,
}

impl From<DeploymentV1> for Deployment {
    fn from(v: DeploymentV1) -> Deployment {
        Deployment {
            name: v.name,
            inputs: v.inputs,
            outputs: v.outputs,
            on_error: v.on_error,
            from: v.from,
            config: v.config,
            state: v.state,
            version: v.version,
            deployed_at_ms: v.deployed_at_ms,
            memory_bytes_max: v.memory_bytes_max,
            call_timeout_ms: v.call_timeout_ms,
            delivery: Delivery::AtLeastOnce,
            module: v.module,
            owner: None,
        }
    }
}

impl Deployment {
    /// The consumer group the transform runs as.
    pub fn group_id(&self) -> String {
        group_id(&self.name)
    }

    /// The dead-letter topic.
    pub fn dlq_topic(&self) -> String {
        dlq_topic(&self.name)
    }

    /// The state changelog topic.
    pub fn state_topic(&self) -> String {
        state_topic(&self.name)
    }

    /// What the transform's principal must be allowed to do for it to run:
    /// read every input, write every output (and the dead-letter topic when
    /// failed records go there).
    pub fn access_checks(&self) -> Vec<(AclOperation, AclResource)> {
        let mut out: Vec<(AclOperation, AclResource)> = self
            .inputs
            .iter()
            .map(|t| (AclOperation::Read, AclResource::Topic(t.clone())))
            .collect();
        out.extend(
            self.outputs
                .iter()
                .map(|t| (AclOperation::Write, AclResource::Topic(t.clone()))),
        );
        if self.on_error == ErrorPolicy::DeadLetter {
            out.push((AclOperation::Write, AclResource::Topic(self.dlq_topic())));
        }
        out
    }

    /// The record's request to the broker that writes it (see
    /// [`rill_client::Admin::write_transform`]).
    pub fn write_request(&self, owner: Option<String>) -> TransformWriteRequest {
        let mut outputs = self.outputs.clone();
        if self.on_error == ErrorPolicy::DeadLetter {
            outputs.push(self.dlq_topic());
        }
        TransformWriteRequest {
            name: self.name.clone(),
            inputs: self.inputs.clone(),
            outputs,
            value: Some(self.encode()),
            owner,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![DEPLOYMENT_FORMAT_VERSION];
        out.extend_from_slice(&postcard::to_stdvec(self).expect("a deployment encodes"));
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Deployment, TransformError> {
        match bytes.split_first() {
            Some((&DEPLOYMENT_FORMAT_V1, rest)) => postcard::from_bytes::<DeploymentV1>(rest)
                .map(Deployment::from)
                .map_err(|e| {
                    TransformError::Decode(format!(
                        "a deployment record in {TRANSFORMS_TOPIC} does not decode: {e}"
                    ))
                }),
            Some((&DEPLOYMENT_FORMAT_VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| {
                TransformError::Decode(format!(
                    "a deployment record in {TRANSFORMS_TOPIC} does not decode: {e}"
                ))
            }),
            Some((v, _)) => Err(TransformError::Decode(format!(
                "a deployment record in {TRANSFORMS_TOPIC} has format version {v}; this Rill reads version {DEPLOYMENT_FORMAT_VERSION}: upgrade it"
            ))),
            None => Err(TransformError::Decode(format!(
                "an empty deployment record in {TRANSFORMS_TOPIC}"
            ))),
        }
    }

    /// Checks what can be checked without the cluster, with the limits
    /// bounded only by what any host accepts ([`HostMaxima::CEILING`]; each
    /// host checks its own maxima with [`Deployment::validate_for`]).
    pub fn validate(&self) -> Result<(), TransformError> {
        self.validate_for(&HostMaxima::CEILING)
    }

    /// Checks what can be checked without the cluster, the memory cap and the
    /// call timeout against a host's `maxima`. Every error names the setting.
    pub fn validate_for(&self, maxima: &HostMaxima) -> Result<(), TransformError> {
        validate_name(&self.name)?;
        let err = |m: String| Err(TransformError::Deployment(m));
        if self.inputs.is_empty() {
            return err("a transform needs an input topic: pass --input TOPIC".into());
        }
        if self.outputs.is_empty() {
            return err("a transform needs an output topic: pass --output TOPIC".into());
        }
        if self.inputs.len() > TOPICS_PER_DEPLOYMENT_MAX
            || self.outputs.len() > TOPICS_PER_DEPLOYMENT_MAX
        {
            return err(format!(
                "at most {TOPICS_PER_DEPLOYMENT_MAX} input and {TOPICS_PER_DEPLOYMENT_MAX} output topics"
            ));
        }
        for out in &self.outputs {
            if self.inputs.contains(out) {
                return err(format!(
                    "topic {out} is both an input and an output: the transform would read its own outputs forever"
                ));
            }
        }
        if self.config.len() > CONFIG_ENTRIES_MAX {
            return err(format!("at most {CONFIG_ENTRIES_MAX} --config entries"));
        }
        if self.module.len() > MODULE_BYTES_MAX {
            return err(format!(
                "the module is {} bytes, more than the bound of {MODULE_BYTES_MAX} bytes",
                self.module.len()
            ));
        }
        maxima.check(self.memory_bytes_max, self.call_timeout_ms)
    }
}

pub fn group_id(name: &str) -> String {
    format!("__transform-{name}")
}

pub fn dlq_topic(name: &str) -> String {
    // The same as rill_proto's DeploymentHead::written_topics.
    format!("{name}.dlq")
}

pub fn state_topic(name: &str) -> String {
    format!("__transform-{name}-state")
}

/// A name is 1..=100 of `[A-Za-z0-9._-]` (it becomes part of topic names).
pub fn validate_name(name: &str) -> Result<(), TransformError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_LEN_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(TransformError::Deployment(format!(
            "invalid transform name {name:?}: use 1 to {NAME_LEN_MAX} letters, digits, '.', '_' or '-'"
        )))
    }
}

/// Parses `KEY=VALUE`.
pub fn parse_config_entry(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("invalid --config {s:?}: expected KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Deployment {
        Deployment {
            name: "clean".into(),
            inputs: vec!["articles".into()],
            outputs: vec!["articles-clean".into()],
            on_error: ErrorPolicy::DeadLetter,
            from: StartFrom::Earliest,
            config: vec![("a".into(), "1".into())],
            state: RunState::Halted { reason: "x".into() },
            version: 3,
            deployed_at_ms: 17,
            memory_bytes_max: 64 << 20,
            call_timeout_ms: 1000,
            delivery: Default::default(),
            module: vec![0, 1, 2],
            owner: None,
        }
    }

    #[test]
    fn encodes_and_decodes_with_a_version() {
        let d = sample();
        let bytes = d.encode();
        assert_eq!(bytes[0], DEPLOYMENT_FORMAT_VERSION);
        assert_eq!(Deployment::decode(&bytes).unwrap(), d);
        let mut other = bytes.clone();
        other[0] = 9;
        let e = Deployment::decode(&other).unwrap_err().to_string();
        assert!(e.contains("format version 9"), "{e}");
    }

    /// The broker reads the start of the record with its own mirror of these
    /// fields (rill_proto's DeploymentHead): it must agree with the record.
    #[test]
    fn the_brokers_head_reads_what_this_writes() {
        use rill_proto::wire::{DEPLOYMENT_FORMAT_VERSION as BROKER_READS, DeploymentHead};
        assert_eq!(BROKER_READS, DEPLOYMENT_FORMAT_VERSION);
        for policy in [
            ErrorPolicy::Skip,
            ErrorPolicy::DeadLetter,
            ErrorPolicy::Halt,
        ] {
            let mut d = sample();
            d.on_error = policy;
            d.inputs = vec!["a".into(), "b".into()];
            let head = DeploymentHead::decode(&d.encode()).unwrap();
            assert_eq!(head.name, d.name);
            assert_eq!(head.inputs, d.inputs);
            assert_eq!(head.outputs, d.outputs);
            assert_eq!(format!("{:?}", head.on_error), format!("{policy:?}"));
            // What the request declares is what the broker derives.
            let req = d.write_request(None);
            assert_eq!(req.outputs, head.written_topics());
            assert_eq!(req.inputs, head.inputs);
        }
    }

    #[test]
    fn limits_are_checked_against_the_host_maxima() {
        let mut d = sample();
        let small = HostMaxima::from_config(32, 500);
        let e = d.validate_for(&small).unwrap_err().to_string();
        assert!(e.contains("transforms.memory_mb_max = 32 MiB"), "{e}");
        d.memory_bytes_max = 32 << 20;
        let e = d.validate_for(&small).unwrap_err().to_string();
        assert!(e.contains("transforms.call_timeout_ms_max = 500 ms"), "{e}");
        d.call_timeout_ms = 500;
        d.validate_for(&small).unwrap();
        // Without a host's maxima, only the ceiling applies.
        d.memory_bytes_max = 4096 << 20;
        d.validate().unwrap();
        d.memory_bytes_max += 1;
        assert!(d.validate().is_err());
        d.memory_bytes_max = 1 << 20;
        d.module = vec![0; MODULE_BYTES_MAX + 1];
        let e = d.validate().unwrap_err().to_string();
        assert!(e.contains("more than the bound"), "{e}");
    }

    #[test]
    fn validation_names_the_problem() {
        let mut d = sample();
        d.validate().unwrap();
        d.outputs.push("articles".into());
        assert!(
            d.validate()
                .unwrap_err()
                .to_string()
                .contains("both an input and an output")
        );
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("rss-clean_1.v2").is_ok());
        assert_eq!(
            parse_config_entry("k=v=w").unwrap(),
            ("k".into(), "v=w".into())
        );
        assert!(parse_config_entry("=v").is_err());
        assert!(
            "stop"
                .parse::<ErrorPolicy>()
                .unwrap_err()
                .contains("skip, dead-letter or halt")
        );
    }
}
