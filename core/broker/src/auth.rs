//! Who may do what: principals, and the one authorization check the router
//! makes for every request.
//!
//! A connection's principal comes from the certificate its peer presented
//! (verified against the CA during the handshake, see `rill_net::identity`): a
//! certificate with the broker mark is [`Principal::Broker`], any other
//! [`Principal::User`] (its common name); none is [`Principal::Anonymous`].
//!
//! The rules, in the order [`Authorizer::authorize`] applies them:
//! 1. The cluster-internal apis ([`broker_only`]) and a Fetch with a
//!    `replica_id` are accepted only from a broker principal, and a replica
//!    fetch only from the broker it names, for partitions it is a replica of —
//!    in every auth mode. Anything else is CLUSTER_AUTHORIZATION_FAILED naming
//!    the api.
//! 2. Internal topics (`__*`) are written, deleted and altered only by brokers
//!    (super users included in the refusal), with two exceptions for the
//!    transform host: a transform's state changelog
//!    (`__transform-<name>-state`) by a principal allowed to alter (to delete:
//!    delete) that transform, and the status and log topics
//!    (`__transform_status`, `__transform_logs`, what standalone workers
//!    report) written (not deleted or altered) by one allowed to alter the
//!    cluster. A transform's consumer group (`__transform-<name>`) is used only
//!    by brokers and by who may alter (delete) that transform. The deployments
//!    (`__transforms`) are written only through TransformWrite, which checks
//!    the deployer's rights and stamps the record with its principal.
//! 3. With `--auth none` everything else is allowed. With `--auth mtls` a super
//!    user is allowed everything else, and any other principal only what an
//!    ACL rule allows (deny by default); a denial names the principal, the
//!    operation, the resource and the api.
//!
//! Invariant: this is the only place a request is allowed or refused for who
//! sent it; handlers only filter what they list (`Metadata`, `ListGroups`)
//! through [`Authorizer::allowed`].

use crate::cluster::image::MetadataImage;
use crate::config::{AuthConfig, AuthMode};
use rill_net::PeerIdentity;
use rill_proto::wire::{AclOperation, AclResource, AclRule, ApiKey, ErrorCode, ErrorInfo};
use std::fmt;
use std::net::SocketAddr;

/// Who is calling: the identity of the connection a request came on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// A connection that presented no certificate (only with `--auth none`).
    Anonymous,
    /// A broker of this cluster (its certificate carries the broker mark).
    Broker(i32),
    /// A client, by its certificate's common name.
    User(String),
}

impl Principal {
    /// The principal a verified peer certificate names (`None`: no certificate,
    /// or one that names nobody).
    pub fn of(identity: Option<PeerIdentity>) -> Principal {
        match identity {
            Some(PeerIdentity::Broker(id)) => Principal::Broker(id),
            Some(PeerIdentity::Named(name)) => Principal::User(name),
            None => Principal::Anonymous,
        }
    }
}

impl Principal {
    /// The principal in the form stamped on deployment records and named in
    /// [`rill_proto::wire::CheckAccessRequest`] (Kafka's `User:NAME`).
    pub fn stamp(&self) -> String {
        match self {
            Principal::Anonymous => "Anonymous".into(),
            Principal::Broker(id) => format!("Broker:{id}"),
            Principal::User(name) => format!("User:{name}"),
        }
    }

    /// Reads [`Self::stamp`]'s form.
    pub fn parse_stamp(s: &str) -> Option<Principal> {
        match s.split_once(':') {
            None if s == "Anonymous" => Some(Principal::Anonymous),
            Some(("User", name)) if !name.is_empty() => Some(Principal::User(name.into())),
            Some(("Broker", id)) => id.parse().ok().map(Principal::Broker),
            _ => None,
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Anonymous => write!(f, "anonymous"),
            Principal::Broker(id) => write!(f, "broker {id}"),
            Principal::User(name) => write!(f, "principal {name:?}"),
        }
    }
}

/// The connection a request came on.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    pub peer: SocketAddr,
}

/// What a request acts on, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    /// The cluster as a whole.
    Cluster(AclOperation),
    Topic(AclOperation, &'a str),
    Group(AclOperation, &'a str),
    Transform(AclOperation, &'a str),
    /// An idempotent producer's id (InitProducerId): as in Kafka, allowed by
    /// write on the cluster or write on any topic.
    IdempotentWrite,
    /// A follower's fetch: the caller must be broker `broker`, a replica of
    /// `topic`-`partition`.
    Replica {
        broker: i32,
        topic: &'a str,
        partition: u32,
    },
}

/// The apis only brokers call.
pub fn broker_only(api: ApiKey) -> bool {
    matches!(
        api,
        ApiKey::RaftRpc
            | ApiKey::JoinCluster
            | ApiKey::BrokerHeartbeat
            | ApiKey::MetadataWrite
            | ApiKey::AlterPartition
            | ApiKey::CheckAccess
            | ApiKey::WriteTxnMarkers
            | ApiKey::CommitTxnOffsets
    )
}

/// Rule 1 for the cluster-internal apis: refused unless `principal` is a broker.
pub fn check_broker_only(principal: &Principal, api: ApiKey) -> Result<(), ErrorInfo> {
    if broker_only(api) && !matches!(principal, Principal::Broker(_)) {
        return Err(ErrorInfo::new(
            ErrorCode::ClusterAuthorizationFailed,
            format!(
                "{} is a cluster-internal api, accepted only from the cluster's brokers; \
                 {principal} may not call it",
                api.name()
            ),
        ));
    }
    Ok(())
}

/// Whether `topic` is internal (written by the brokers' own paths only).
pub fn is_internal_topic(topic: &str) -> bool {
    topic.starts_with("__")
}

/// The transform whose consumer group `group` is (`__transform-<name>`).
fn transform_group(group: &str) -> Option<&str> {
    group.strip_prefix("__transform-").filter(|n| !n.is_empty())
}

/// Who besides the brokers may create, write, delete or alter an internal
/// topic of the transform host (rule 2's exceptions); `None`: nobody, or (to
/// create, read, describe) whom the ACLs allow.
fn transform_topic_owner(topic: &str, op: AclOperation) -> Option<Resource<'_>> {
    if !matches!(
        op,
        AclOperation::Write | AclOperation::Delete | AclOperation::Alter | AclOperation::Create
    ) {
        // Reading and describing: what the ACLs allow.
        return None;
    }
    // A transform's own state changelog belongs to that transform (creating,
    // writing and altering it: alter on the transform).
    if let Some(name) = topic
        .strip_prefix("__transform-")
        .and_then(|t| t.strip_suffix("-state"))
    {
        let op = if op == AclOperation::Delete {
            AclOperation::Delete
        } else {
            AclOperation::Alter
        };
        return Some(Resource::Transform(op, name));
    }
    // The instances' status and log lines (standalone `rill transform run`
    // workers report there; `rill transform delete` removes a status).
    if (topic == "__transform_status" || topic == "__transform_logs")
        && matches!(op, AclOperation::Write | AclOperation::Create)
    {
        return Some(Resource::Cluster(AclOperation::Alter));
    }
    // `__transforms` (the deployments) is written only through TransformWrite,
    // which checks the deployer and stamps the record.
    None
}

/// The auth settings of a broker, and the checks made with them.
#[derive(Debug, Clone)]
pub struct Authorizer {
    mode: AuthMode,
    super_users: Vec<String>,
}

impl Authorizer {
    pub fn new(config: &AuthConfig) -> Authorizer {
        Authorizer {
            mode: config.mode,
            super_users: config.super_users.clone(),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// Whether `caller` may call `api` on `resources`, given the cluster's
    /// image (its ACLs and partition replicas). `Err` is the whole request's
    /// answer.
    pub fn authorize(
        &self,
        image: &MetadataImage,
        caller: &Caller,
        api: ApiKey,
        resources: &[Resource<'_>],
    ) -> Result<(), ErrorInfo> {
        let principal = &caller.principal;
        let is_broker = matches!(principal, Principal::Broker(_));
        check_broker_only(principal, api)?;
        for r in resources {
            match *r {
                Resource::Replica {
                    broker,
                    topic,
                    partition,
                } => {
                    check_replica(image, principal, api, broker, topic, partition)?;
                    continue;
                }
                // A transform's consumer group: who may alter (delete) that
                // transform, not who an ACL on the group names.
                Resource::Group(op, group) if !is_broker && transform_group(group).is_some() => {
                    let name = transform_group(group).expect("matched above");
                    let op = if op == AclOperation::Delete {
                        AclOperation::Delete
                    } else {
                        AclOperation::Alter
                    };
                    let owner = Resource::Transform(op, name);
                    if self.allowed(image, principal, owner) {
                        continue;
                    }
                    return Err(ErrorInfo::new(
                        ErrorCode::GroupAuthorizationFailed,
                        format!(
                            "{group:?} is the consumer group of transform {name:?}: only the brokers and \
                             principals allowed to {} the transform use it ({principal}, {})",
                            op.name(),
                            api.name()
                        ),
                    ));
                }
                Resource::Topic(op, topic) if is_internal_topic(topic) && !is_broker => {
                    // A transform's own topics: by who may alter (delete) it.
                    if transform_topic_owner(topic, op)
                        .is_some_and(|owner| self.allowed(image, principal, owner))
                    {
                        continue;
                    }
                    if matches!(
                        op,
                        AclOperation::Write | AclOperation::Delete | AclOperation::Alter
                    ) {
                        return Err(ErrorInfo::new(
                            ErrorCode::TopicAuthorizationFailed,
                            format!(
                                "{topic:?} is an internal topic: only the brokers write, delete or alter it \
                                 ({principal} asked to {} it with {})",
                                op.name(),
                                api.name()
                            ),
                        ));
                    }
                }
                _ => {}
            }
            if !self.allowed(image, principal, *r) {
                let (code, what) = match *r {
                    Resource::Cluster(_) => {
                        (ErrorCode::ClusterAuthorizationFailed, "the cluster".into())
                    }
                    Resource::Topic(_, t) => {
                        (ErrorCode::TopicAuthorizationFailed, format!("topic {t:?}"))
                    }
                    Resource::Group(_, g) => {
                        (ErrorCode::GroupAuthorizationFailed, format!("group {g:?}"))
                    }
                    Resource::Transform(_, n) => (
                        ErrorCode::TransformAuthorizationFailed,
                        format!("transform {n:?}"),
                    ),
                    Resource::IdempotentWrite => (
                        ErrorCode::ClusterAuthorizationFailed,
                        "an idempotent producer id (write on the cluster or on some topic)".into(),
                    ),
                    Resource::Replica { .. } => unreachable!("replica fetches are checked above"),
                };
                let op = operation_of(*r).map_or("use", AclOperation::name);
                return Err(ErrorInfo::new(
                    code,
                    format!(
                        "{principal} may not {op} {what} ({}): no ACL rule allows it; \
                         a super user can add one with `rill acl add --principal NAME --operation {op} ...`",
                        api.name()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether `principal` may do what `resource` says (rule 3; brokers may do
    /// everything). Used by [`Self::authorize`] and to filter listings.
    pub fn allowed(
        &self,
        image: &MetadataImage,
        principal: &Principal,
        resource: Resource<'_>,
    ) -> bool {
        let name = match principal {
            Principal::Broker(_) => return true,
            _ if self.mode == AuthMode::None => return true,
            Principal::Anonymous => return false,
            Principal::User(name) => name,
        };
        if self.super_users.iter().any(|s| s == name) {
            return true;
        }
        let Some(wanted) = operation_of(resource) else {
            return false;
        };
        image.acls.iter().any(|rule| {
            (rule.principal == *name || rule.principal == "*") && matches(rule, wanted, resource)
        })
    }
}

fn operation_of(r: Resource<'_>) -> Option<AclOperation> {
    match r {
        Resource::Cluster(op)
        | Resource::Topic(op, _)
        | Resource::Group(op, _)
        | Resource::Transform(op, _) => Some(op),
        Resource::IdempotentWrite => Some(AclOperation::Write),
        Resource::Replica { .. } => None,
    }
}

/// Whether `rule` allows `wanted` on `resource`.
fn matches(rule: &AclRule, wanted: AclOperation, resource: Resource<'_>) -> bool {
    if !rule.operation.allows(wanted) {
        return false;
    }
    match (&rule.resource, resource) {
        (AclResource::Cluster, Resource::Cluster(_)) => true,
        (
            AclResource::Cluster | AclResource::Topic(_) | AclResource::TopicPrefix(_),
            Resource::IdempotentWrite,
        ) => true,
        // As in Kafka, create on the cluster creates any topic.
        (AclResource::Cluster, Resource::Topic(AclOperation::Create, _)) => true,
        (AclResource::Topic(t), Resource::Topic(_, name)) => t == name,
        (AclResource::TopicPrefix(p), Resource::Topic(_, name)) => name.starts_with(p.as_str()),
        (AclResource::Group(g), Resource::Group(_, name)) => g == name,
        (AclResource::Transform(t), Resource::Transform(_, name)) => t == name,
        _ => false,
    }
}

/// Rule 1 for a follower's fetch.
fn check_replica(
    image: &MetadataImage,
    principal: &Principal,
    api: ApiKey,
    broker: i32,
    topic: &str,
    partition: u32,
) -> Result<(), ErrorInfo> {
    let refuse = |why: String| {
        Err(ErrorInfo::new(
            ErrorCode::ClusterAuthorizationFailed,
            format!(
                "{} as replica {broker} of {topic}-{partition} refused: {why}",
                api.name()
            ),
        ))
    };
    match principal {
        Principal::Broker(id) if *id == broker => {}
        Principal::Broker(id) => {
            return refuse(format!("the caller is broker {id}, not broker {broker}"));
        }
        other => {
            return refuse(format!(
                "replica fetches are accepted only from the cluster's brokers, and the caller is {other}"
            ));
        }
    }
    let replicas = image
        .topics
        .get(topic)
        .and_then(|t| t.partitions.get(partition as usize))
        .map(|p| p.replicas.as_slice());
    match replicas {
        Some(r) if r.contains(&broker) => Ok(()),
        Some(r) => refuse(format!("broker {broker} is not one of its replicas {r:?}")),
        // An unknown partition: the handler answers UNKNOWN_TOPIC_OR_PARTITION.
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::image::{Command, MetadataImage};

    fn caller(p: Principal) -> Caller {
        Caller {
            principal: p,
            peer: "127.0.0.1:1".parse().unwrap(),
        }
    }

    fn user(n: &str) -> Caller {
        caller(Principal::User(n.into()))
    }

    fn rule(p: &str, op: AclOperation, r: AclResource) -> AclRule {
        AclRule {
            principal: p.into(),
            operation: op,
            resource: r,
        }
    }

    fn mtls(super_users: &[&str]) -> Authorizer {
        Authorizer {
            mode: AuthMode::Mtls,
            super_users: super_users.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn image_with(rules: Vec<AclRule>) -> MetadataImage {
        let mut image = MetadataImage::default();
        image.apply(&Command::RegisterBroker {
            id: 0,
            addr: "127.0.0.1:9092".into(),
            listeners: Default::default(),
        });
        image.apply(&Command::RegisterBroker {
            id: 1,
            addr: "127.0.0.1:9093".into(),
            listeners: Default::default(),
        });
        image.apply(&Command::CreateTopic {
            name: "orders".into(),
            id: "t1".into(),
            internal: false,
            configs: Default::default(),
            assignment: vec![vec![0]],
        });
        image.apply(&Command::CreateAcls { rules });
        image
    }

    #[test]
    fn internal_apis_only_from_brokers_in_every_mode() {
        let image = image_with(vec![rule("alice", AclOperation::All, AclResource::Cluster)]);
        for auth in [Authorizer::new(&AuthConfig::default()), mtls(&["alice"])] {
            for api in ApiKey::ALL.into_iter().filter(|a| broker_only(*a)) {
                for who in [Principal::Anonymous, Principal::User("alice".into())] {
                    let e = auth
                        .authorize(
                            &image,
                            &caller(who.clone()),
                            api,
                            &[Resource::Cluster(AclOperation::Alter)],
                        )
                        .unwrap_err();
                    assert_eq!(e.code, ErrorCode::ClusterAuthorizationFailed);
                    assert!(e.message.contains(api.name()), "{e}");
                }
                auth.authorize(&image, &caller(Principal::Broker(1)), api, &[])
                    .unwrap();
            }
        }
    }

    #[test]
    fn replica_fetches_only_from_that_replica() {
        let image = image_with(vec![]);
        let auth = Authorizer::new(&AuthConfig::default());
        let fetch = |who: Principal, broker: i32| {
            auth.authorize(
                &image,
                &caller(who),
                ApiKey::Fetch,
                &[Resource::Replica {
                    broker,
                    topic: "orders",
                    partition: 0,
                }],
            )
        };
        fetch(Principal::Broker(0), 0).unwrap();
        for (who, broker) in [
            (Principal::Anonymous, 0),
            (Principal::User("x".into()), 0),
            (Principal::Broker(1), 0),
            (Principal::Broker(1), 1),
        ] {
            let e = fetch(who, broker).unwrap_err();
            assert_eq!(e.code, ErrorCode::ClusterAuthorizationFailed, "{e}");
        }
    }

    #[test]
    fn internal_topics_are_never_written_by_clients() {
        let image = image_with(vec![]);
        for auth in [Authorizer::new(&AuthConfig::default()), mtls(&["root"])] {
            for op in [
                AclOperation::Write,
                AclOperation::Delete,
                AclOperation::Alter,
            ] {
                let e = auth
                    .authorize(
                        &image,
                        &user("root"),
                        ApiKey::Produce,
                        &[Resource::Topic(op, "__consumer_offsets")],
                    )
                    .unwrap_err();
                assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed);
                assert!(e.message.contains("internal topic"), "{e}");
            }
            // Reading is not writing.
            auth.authorize(
                &image,
                &user("root"),
                ApiKey::Fetch,
                &[Resource::Topic(AclOperation::Read, "__consumer_offsets")],
            )
            .unwrap();
            auth.authorize(
                &image,
                &caller(Principal::Broker(0)),
                ApiKey::Produce,
                &[Resource::Topic(AclOperation::Write, "__consumer_offsets")],
            )
            .unwrap();
        }
    }

    #[test]
    fn the_transform_hosts_topics_belong_to_whom_they_serve() {
        use AclOperation::*;
        let image = image_with(vec![
            rule("alice", Alter, AclResource::Transform("copy".into())),
            rule("ops", Alter, AclResource::Cluster),
        ]);
        let auth = mtls(&["root"]);
        let may = |who: &str, op, topic| {
            auth.authorize(
                &image,
                &user(who),
                ApiKey::Produce,
                &[Resource::Topic(op, topic)],
            )
        };
        // The deployments: nobody but the brokers, super users included
        // (clients go through TransformWrite).
        for who in ["root", "alice", "ops"] {
            let e = may(who, Write, "__transforms").unwrap_err();
            assert!(e.message.contains("internal topic"), "{e}");
        }
        // A transform's state changelog: who may alter that transform.
        may("alice", Create, "__transform-copy-state").unwrap();
        may("alice", Write, "__transform-copy-state").unwrap();
        may("alice", Delete, "__transform-copy-state").unwrap_err();
        may("alice", Write, "__transform-other-state").unwrap_err();
        may("ops", Write, "__transform-copy-state").unwrap_err();
        // Status and log lines: who may alter the cluster.
        may("ops", Write, "__transform_status").unwrap();
        may("ops", Delete, "__transform_status").unwrap_err();
        may("ops", Alter, "__transform_logs").unwrap_err();
        may("alice", Write, "__transform_status").unwrap_err();
        // A transform's consumer group: who may alter it, whatever the group ACLs.
        let group = |who: &str, op, g| {
            auth.authorize(
                &image,
                &user(who),
                ApiKey::OffsetCommit,
                &[Resource::Group(op, g)],
            )
        };
        group("alice", Read, "__transform-copy").unwrap();
        group("alice", Delete, "__transform-copy").unwrap_err();
        let e = group("ops", Read, "__transform-copy").unwrap_err();
        assert_eq!(e.code, ErrorCode::GroupAuthorizationFailed);
        assert!(e.message.contains("transform \"copy\""), "{e}");
        group("alice", Read, "__transform-other").unwrap_err();
        // With --auth none everyone may alter the cluster and every transform,
        // but still not write the deployments directly.
        let none = Authorizer::new(&AuthConfig::default());
        let anon = caller(Principal::Anonymous);
        for (op, topic, ok) in [
            (Write, "__transforms", false),
            (Write, "__transform-copy-state", true),
            (Delete, "__transform-copy-state", true),
            (Write, "__transform_logs", true),
        ] {
            let r = none.authorize(
                &image,
                &anon,
                ApiKey::Produce,
                &[Resource::Topic(op, topic)],
            );
            assert_eq!(r.is_ok(), ok, "{op:?} {topic}: {r:?}");
        }
    }

    #[test]
    fn principals_stamp_and_parse() {
        for p in [
            Principal::Anonymous,
            Principal::Broker(3),
            Principal::User("alice".into()),
        ] {
            assert_eq!(Principal::parse_stamp(&p.stamp()), Some(p));
        }
        assert_eq!(Principal::parse_stamp("User:"), None);
        assert_eq!(Principal::parse_stamp("Broker:x"), None);
        assert_eq!(Principal::parse_stamp("alice"), None);
    }

    #[test]
    fn acl_matrix() {
        use AclOperation::*;
        let image = image_with(vec![
            rule("alice", Read, AclResource::Topic("orders".into())),
            rule("alice", Write, AclResource::TopicPrefix("logs.".into())),
            rule("bob", All, AclResource::Group("g1".into())),
            rule("*", Describe, AclResource::Topic("public".into())),
            rule("carol", Create, AclResource::Cluster),
        ]);
        let auth = mtls(&["root"]);
        let ok = |who: &str, r: Resource<'_>| auth.allowed(&image, &Principal::User(who.into()), r);
        // Each operation allowed and denied.
        assert!(ok("alice", Resource::Topic(Read, "orders")));
        assert!(ok("alice", Resource::Topic(Describe, "orders")));
        assert!(!ok("alice", Resource::Topic(Write, "orders")));
        assert!(!ok("alice", Resource::Topic(Delete, "orders")));
        assert!(!ok("alice", Resource::Topic(Alter, "orders")));
        assert!(!ok("alice", Resource::Topic(Read, "orders2")));
        // Prefix rules.
        assert!(ok("alice", Resource::Topic(Write, "logs.web")));
        assert!(!ok("alice", Resource::Topic(Write, "logsweb")));
        assert!(!ok("alice", Resource::Topic(Read, "logs.web")));
        // All.
        for op in AclOperation::ALL {
            assert!(ok("bob", Resource::Group(op, "g1")));
        }
        assert!(!ok("bob", Resource::Group(Read, "g2")));
        assert!(!ok("bob", Resource::Topic(Read, "orders")));
        // Wildcard principal.
        assert!(ok("dave", Resource::Topic(Describe, "public")));
        assert!(!ok("dave", Resource::Topic(Read, "public")));
        // Cluster.
        assert!(ok("carol", Resource::Cluster(Create)));
        assert!(!ok("carol", Resource::Cluster(Alter)));
        // An idempotent producer id: write on some topic (alice) or on the
        // cluster, not read or create (carol).
        assert!(ok("alice", Resource::IdempotentWrite));
        assert!(!ok("carol", Resource::IdempotentWrite));
        assert!(!ok("dave", Resource::IdempotentWrite));
        // Super users and brokers: everything; anonymous: nothing.
        assert!(ok("root", Resource::Topic(Delete, "anything")));
        assert!(auth.allowed(&image, &Principal::Broker(3), Resource::Cluster(Alter)));
        assert!(!auth.allowed(
            &image,
            &Principal::Anonymous,
            Resource::Topic(Describe, "public")
        ));
        // A denial names the principal, the operation, the resource and the api.
        let e = auth
            .authorize(
                &image,
                &user("alice"),
                ApiKey::Produce,
                &[Resource::Topic(Write, "orders")],
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed);
        for part in ["\"alice\"", "write", "\"orders\"", "produce"] {
            assert!(e.message.contains(part), "{part}: {e}");
        }
        // With auth none every non-internal thing is allowed.
        let none = Authorizer::new(&AuthConfig::default());
        assert!(none.allowed(
            &image,
            &Principal::Anonymous,
            Resource::Topic(Delete, "orders")
        ));
    }
}
