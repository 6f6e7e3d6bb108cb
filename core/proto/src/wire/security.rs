//! Access control messages: ACL rules (Kafka's model: allow rules of principal,
//! operation and resource) and client quotas, kept in the metadata quorum.
//!
//! Invariants: a rule names one principal (or `*`, everyone authenticated), one
//! operation and one resource; rules only allow — with authentication on, what
//! no rule allows is denied. The types derive rkyv as well as serde because the
//! quorum's log and snapshot archive them.

use super::messages::{ApiKey, ApiRequest};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a rule allows doing.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub enum AclOperation {
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    /// Every operation.
    All,
}

impl AclOperation {
    pub const ALL: [AclOperation; 7] = [
        AclOperation::Read,
        AclOperation::Write,
        AclOperation::Create,
        AclOperation::Delete,
        AclOperation::Alter,
        AclOperation::Describe,
        AclOperation::All,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AclOperation::Read => "read",
            AclOperation::Write => "write",
            AclOperation::Create => "create",
            AclOperation::Delete => "delete",
            AclOperation::Alter => "alter",
            AclOperation::Describe => "describe",
            AclOperation::All => "all",
        }
    }

    pub fn parse(s: &str) -> Option<AclOperation> {
        AclOperation::ALL.into_iter().find(|o| o.name() == s)
    }

    /// Whether a rule with this operation allows `wanted`. As in Kafka, read,
    /// write, delete and alter each imply describe.
    pub fn allows(self, wanted: AclOperation) -> bool {
        self == AclOperation::All
            || self == wanted
            || (wanted == AclOperation::Describe
                && matches!(
                    self,
                    AclOperation::Read
                        | AclOperation::Write
                        | AclOperation::Delete
                        | AclOperation::Alter
                ))
    }
}

/// What a rule is about.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub enum AclResource {
    /// One topic, by name.
    Topic(String),
    /// Every topic whose name starts with this prefix.
    TopicPrefix(String),
    Group(String),
    Transform(String),
    /// The cluster: topic creation for any name, ACLs and quotas, leadership.
    Cluster,
}

impl fmt::Display for AclResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AclResource::Topic(t) => write!(f, "topic {t:?}"),
            AclResource::TopicPrefix(p) => write!(f, "topics prefixed {p:?}"),
            AclResource::Group(g) => write!(f, "group {g:?}"),
            AclResource::Transform(n) => write!(f, "transform {n:?}"),
            AclResource::Cluster => write!(f, "the cluster"),
        }
    }
}

/// One allow rule.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(compare(PartialEq), derive(Debug))]
pub struct AclRule {
    /// The principal (a client certificate's common name), or `*` for every
    /// authenticated principal.
    pub principal: String,
    pub operation: AclOperation,
    pub resource: AclResource,
}

impl fmt::Display for AclRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "allow {} to {} {}",
            self.principal,
            self.operation.name(),
            self.resource
        )
    }
}

/// A principal's byte-rate quotas (Kafka's `producer_byte_rate` and
/// `consumer_byte_rate`); `None`: unlimited.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub struct Quota {
    pub produce_bytes_per_s: Option<u64>,
    pub fetch_bytes_per_s: Option<u64>,
}

// ---------------------------------------------------------------- ACL apis

/// Adds allow rules (needs alter on the cluster). Adding a rule that exists is
/// not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateAclsRequest {
    pub rules: Vec<AclRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateAclsResponse {
    /// Rules that were not there before.
    pub created: u32,
}

impl ApiRequest for CreateAclsRequest {
    const KEY: ApiKey = ApiKey::CreateAcls;
    type Response = CreateAclsResponse;
}

/// Lists rules (needs describe on the cluster), of one principal or all.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeAclsRequest {
    pub principal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeAclsResponse {
    pub rules: Vec<AclRule>,
}

impl ApiRequest for DescribeAclsRequest {
    const KEY: ApiKey = ApiKey::DescribeAcls;
    type Response = DescribeAclsResponse;
}

/// Removes rules (needs alter on the cluster).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteAclsRequest {
    pub rules: Vec<AclRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteAclsResponse {
    /// Rules that were there and are gone.
    pub deleted: u32,
}

impl ApiRequest for DeleteAclsRequest {
    const KEY: ApiKey = ApiKey::DeleteAcls;
    type Response = DeleteAclsResponse;
}

// ---------------------------------------------------------------- quotas

/// Sets a principal's quotas (needs alter on the cluster); both `None` removes
/// them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterQuotasRequest {
    pub principal: String,
    pub quota: Quota,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterQuotasResponse {}

impl ApiRequest for AlterQuotasRequest {
    const KEY: ApiKey = ApiKey::AlterQuotas;
    type Response = AlterQuotasResponse;
}

/// Lists quotas (needs describe on the cluster).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeQuotasRequest {
    pub principal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeQuotasResponse {
    pub quotas: Vec<(String, Quota)>,
}

impl ApiRequest for DescribeQuotasRequest {
    const KEY: ApiKey = ApiKey::DescribeQuotas;
    type Response = DescribeQuotasResponse;
}

// ---------------------------------------------------------------- transforms

/// The record header in which a broker stamps, on every record of
/// `__transforms`, the principal the deployment runs as (see
/// [`TransformWriteRequest`]).
pub const DEPLOYER_HEADER: &str = "rill.principal";

/// Writes one deployment record of `__transforms` (key `name`), or deletes
/// one (`value: None`, a tombstone). Sent to the leader of `__transforms`-0.
///
/// Needs alter on transform `name`, read on every input and write on every
/// output (delete on the transform for a tombstone). The broker stamps the
/// record with the principal it runs as ([`DEPLOYER_HEADER`]): the caller's, or
/// `owner` when a broker writes on behalf of the deployment's principal (a
/// supervisor recording that a transform halted). Nobody else may name
/// another principal. `inputs` and `outputs` must be what `value` holds
/// (its [`DeploymentHead`]; `outputs` with the dead-letter topic when failed
/// records go there): the broker refuses a record that says otherwise. The
/// runners check the deployer's rights again before they read and write
/// ([`CheckAccessRequest`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformWriteRequest {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    /// The deployment record (rill-transforms' format); `None` deletes.
    pub value: Option<Vec<u8>>,
    /// The principal to run as (brokers only), in [`TransformWriteResponse::principal`]'s form.
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransformWriteResponse {
    /// The record's offset in `__transforms`-0.
    pub offset: i64,
    /// The principal stamped on it: `User:NAME`, `Anonymous` or `Broker:ID`.
    pub principal: String,
}

impl ApiRequest for TransformWriteRequest {
    const KEY: ApiKey = ApiKey::TransformWrite;
    type Response = TransformWriteResponse;
}

/// The start of a deployment record (rill-transforms' `Deployment`, format
/// versions 1 and 2: the version byte, then postcard fields in this order), which is
/// all a broker needs to check who may deploy it: the name, the topics it
/// reads and writes, and whether failed records go to `<name>.dlq`. Postcard
/// is not self-describing, so this mirror must keep the order and types of the
/// first fields of `Deployment` (a test in rill-transforms decodes real
/// records with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentHead {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub on_error: DeploymentErrorPolicy,
}

/// `ErrorPolicy` of rill-transforms, variant for variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeploymentErrorPolicy {
    Skip,
    DeadLetter,
    Halt,
}

/// The newest deployment record format version [`DeploymentHead`] reads
/// (version 2 added `delivery` after the head: both share the head).
pub const DEPLOYMENT_FORMAT_VERSION: u8 = 2;

impl DeploymentHead {
    /// Reads the head of a deployment record; the error says what is wrong.
    pub fn decode(value: &[u8]) -> Result<DeploymentHead, String> {
        match value.split_first() {
            Some((1..=DEPLOYMENT_FORMAT_VERSION, rest)) => postcard::take_from_bytes(rest)
                .map(|(head, _)| head)
                .map_err(|e| format!("the deployment record does not decode: {e}")),
            Some((v, _)) => Err(format!(
                "the deployment record has format version {v}; this broker reads version \
                 {DEPLOYMENT_FORMAT_VERSION}"
            )),
            None => Err("the deployment record is empty".into()),
        }
    }

    /// Every topic the deployment writes: its outputs, and its dead-letter
    /// topic when failed records go there.
    pub fn written_topics(&self) -> Vec<String> {
        let mut out = self.outputs.clone();
        if self.on_error == DeploymentErrorPolicy::DeadLetter {
            out.push(format!("{}.dlq", self.name));
        }
        out
    }
}

/// Asks whether `principal` may do each of `checks` (brokers only: the
/// transform runners checking a deployment's rights before they read or
/// write for it, and the web console checking what a signed-in user may see
/// and do).
///
/// Version 1: the response names each refused check by its index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAccessRequest {
    /// `User:NAME`, `Anonymous` or `Broker:ID`.
    pub principal: String,
    pub checks: Vec<(AclOperation, AclResource)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckAccessResponse {
    /// Each refused check: its index in `checks`, and why (empty: all allowed).
    pub denied: Vec<(u32, String)>,
}

impl ApiRequest for CheckAccessRequest {
    const KEY: ApiKey = ApiKey::CheckAccess;
    const VERSION: u16 = 1;
    type Response = CheckAccessResponse;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_parse_and_imply_describe() {
        for op in AclOperation::ALL {
            assert_eq!(AclOperation::parse(op.name()), Some(op));
            assert!(AclOperation::All.allows(op));
            assert!(op.allows(op));
        }
        assert!(AclOperation::Read.allows(AclOperation::Describe));
        assert!(AclOperation::Write.allows(AclOperation::Describe));
        assert!(!AclOperation::Describe.allows(AclOperation::Read));
        assert!(!AclOperation::Read.allows(AclOperation::Write));
        assert!(!AclOperation::Create.allows(AclOperation::Describe));
        assert_eq!(AclOperation::parse("admin"), None);
    }
}

// ---------------------------------------------------------------- SCRAM users

/// Sets a user's SCRAM credentials, one per mechanism (needs alter on the
/// cluster); an empty list removes the user. The client derives them
/// ([`crate::scram::ScramCredential::derive`]); the password is not sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterUserRequest {
    pub name: String,
    pub credentials: Vec<crate::scram::ScramCredential>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlterUserResponse {
    /// Whether the user existed before.
    pub existed: bool,
}

impl ApiRequest for AlterUserRequest {
    const KEY: ApiKey = ApiKey::AlterUser;
    type Response = AlterUserResponse;
}

/// Lists the users and their mechanisms (needs describe on the cluster);
/// never a salt or a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeUsersRequest {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserDescription {
    pub name: String,
    /// (mechanism, iterations) per credential.
    pub mechanisms: Vec<(String, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescribeUsersResponse {
    pub users: Vec<UserDescription>,
}

impl ApiRequest for DescribeUsersRequest {
    const KEY: ApiKey = ApiKey::DescribeUsers;
    type Response = DescribeUsersResponse;
}
