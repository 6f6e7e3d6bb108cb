//! Security end to end over loopback QUIC: principals from certificates, the
//! broker-only apis, replica fetches, internal topics, ACLs (surviving a
//! restart) and byte-rate quotas. Brokers run in-process on 127.0.0.1:0 with
//! temp data and Rill-home directories; clients speak rill-net frames with
//! certificates issued by the broker's development CA.

use bytes::Bytes;
use rill_broker::cluster::image::Command;
use rill_broker::config::AuthMode;
use rill_broker::{Broker, BrokerConfig, BrokerHandle};
use rill_net::{ClientTls, NetError, TransportLimits};
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, LeaderEpoch, Offset, Record};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bound on every test step, so a hang fails instead of blocking CI.
const STEP: Duration = Duration::from_secs(30);

struct Env {
    data: tempfile::TempDir,
    home: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            data: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn config(&self, mode: AuthMode, super_users: &[&str]) -> BrokerConfig {
        let mut config = BrokerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: self.data.path().to_path_buf(),
            rill_home: Some(self.home.path().to_path_buf()),
            shutdown_timeout_ms: 5000,
            ..BrokerConfig::default()
        };
        config.auth.mode = mode;
        config.auth.super_users = super_users.iter().map(|s| s.to_string()).collect();
        config
    }

    async fn start(&self, mode: AuthMode, super_users: &[&str]) -> BrokerHandle {
        self.start_with(self.config(mode, super_users)).await
    }

    async fn start_with(&self, config: BrokerConfig) -> BrokerHandle {
        tokio::time::timeout(STEP, Broker::start(config))
            .await
            .unwrap()
            .unwrap()
    }

    /// A client certificate for `name` from the broker's CA: (cert, key) files.
    fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        let ca = rill_net::ensure_dev_ca(self.home.path()).unwrap();
        let (chain, key) = ca.issue_client_cert(name).unwrap();
        rill_net::write_cert_files(&self.home.path().join("certs"), name, &chain, &key).unwrap()
    }

    fn ca(&self) -> PathBuf {
        rill_net::dev_ca_cert_path(self.home.path())
    }

    async fn anonymous(&self, addr: SocketAddr) -> Conn {
        Conn::open(ClientTls::CaFile(self.ca()), addr).await
    }

    async fn as_user(&self, name: &str, addr: SocketAddr) -> Conn {
        let (cert, key) = self.issue(name);
        Conn::open(
            ClientTls::Mutual {
                ca: self.ca(),
                cert,
                key,
            },
            addr,
        )
        .await
    }
}

struct Conn {
    _endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl Conn {
    async fn open(tls: ClientTls, addr: SocketAddr) -> Conn {
        let endpoint = rill_net::client_endpoint(&tls, &TransportLimits::default()).unwrap();
        let conn = rill_net::connect(&endpoint, addr).await.unwrap();
        Conn {
            _endpoint: endpoint,
            conn,
        }
    }

    async fn try_call_raw(
        &self,
        key: u16,
        version: u16,
        meta: &[u8],
        payload: &[Bytes],
    ) -> Result<rill_net::Frame, NetError> {
        tokio::time::timeout(
            STEP,
            rill_net::call(
                &self.conn,
                key,
                version,
                meta,
                payload,
                DEFAULT_MAX_RESPONSE_BYTES,
            ),
        )
        .await
        .unwrap()
    }

    async fn call<R: ApiRequest>(
        &self,
        req: &R,
        payload: &[Bytes],
    ) -> (ResponseMeta<R::Response>, Bytes) {
        let frame = self
            .try_call_raw(R::KEY as u16, R::VERSION, &encode_meta(req), payload)
            .await
            .unwrap();
        (decode_meta(&frame.meta).unwrap(), frame.payload)
    }

    async fn ok<R: ApiRequest>(&self, req: &R) -> R::Response {
        self.call(req, &[])
            .await
            .0
            .unwrap_or_else(|e| panic!("{} failed: {e}", R::KEY.name()))
    }

    async fn refused<R: ApiRequest>(&self, req: &R, payload: &[Bytes]) -> ErrorInfo {
        match self.call(req, payload).await.0 {
            Err(e) => e,
            Ok(r) => panic!("{} was not refused: {r:?}", R::KEY.name()),
        }
    }

    async fn create(&self, name: &str) -> Option<ErrorInfo> {
        let req = CreateTopicsRequest {
            topics: vec![NewTopic {
                name: name.into(),
                partitions: Some(1),
                replication_factor: None,
                configs: Vec::new(),
            }],
            validate_only: false,
        };
        match self.call(&req, &[]).await.0 {
            Ok(r) => r.results.into_iter().next().unwrap().error,
            Err(e) => Some(e),
        }
    }

    /// Produces one record; the whole-request or the partition's error, if any.
    async fn produce(&self, topic: &str, value: &[u8]) -> Result<(), ErrorInfo> {
        let batch = batch(value);
        let req = ProduceRequest {
            acks: Acks::All,
            timeout_ms: 10_000,
            partitions: vec![ProducePartition {
                topic: topic.into(),
                partition: 0,
                bytes_len: batch.len() as u32,
            }],
        };
        let resp = self.call(&req, &[batch]).await.0?;
        match resp.partitions.into_iter().next().unwrap().error {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    async fn fetch(
        &self,
        topic: &str,
        replica_id: Option<i32>,
    ) -> Result<FetchPartitionResponse, ErrorInfo> {
        let req = FetchRequest {
            max_wait_ms: 0,
            min_bytes: 0,
            max_bytes: 1 << 20,
            replica_id,
            isolation: rill_proto::wire::Isolation::ReadUncommitted,
            partitions: vec![FetchPartition {
                topic: topic.into(),
                partition: 0,
                offset: Offset(0),
                max_bytes: 1 << 20,
                current_leader_epoch: None,
            }],
        };
        let resp = self.call(&req, &[]).await.0?;
        let p = resp.partitions.into_iter().next().unwrap();
        match &p.error {
            None => Ok(p),
            Some(e) => Err(e.clone()),
        }
    }

    async fn partition(&self, topic: &str) -> PartitionMetadata {
        let resp = self
            .ok(&MetadataRequest {
                topics: Some(vec![topic.into()]),
            })
            .await;
        resp.topics
            .into_iter()
            .next()
            .unwrap()
            .partitions
            .into_iter()
            .next()
            .unwrap()
    }

    async fn topic_names(&self) -> Vec<String> {
        let resp = self.ok(&MetadataRequest { topics: None }).await;
        resp.topics.into_iter().map(|t| t.name).collect()
    }

    async fn allow(&self, principal: &str, operation: AclOperation, resource: AclResource) {
        self.ok(&CreateAclsRequest {
            rules: vec![AclRule {
                principal: principal.into(),
                operation,
                resource,
            }],
        })
        .await;
    }
}

fn batch(value: &[u8]) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None);
    b.push(&Record::from_value(
        Bytes::copy_from_slice(value),
        rill_proto::types::now_ms(),
    ));
    b.build()
}

/// A request of each broker-only api, well formed.
fn internal_requests() -> Vec<(ApiKey, Vec<u8>)> {
    let create = Command::CreateTopic {
        name: "forged".into(),
        id: "forged-id".into(),
        internal: false,
        configs: Default::default(),
        assignment: vec![vec![]],
    };
    vec![
        (
            ApiKey::RaftRpc,
            encode_meta(&RaftRpcRequest {
                from: 7,
                to: 0,
                kind: RaftRpcKind::InstallSnapshot,
                body: b"{}".to_vec(),
            }),
        ),
        (
            ApiKey::JoinCluster,
            encode_meta(&JoinClusterRequest {
                broker_id: 7,
                addr: "192.0.2.1:9092".into(),
            }),
        ),
        (
            ApiKey::BrokerHeartbeat,
            encode_meta(&BrokerHeartbeatRequest {
                broker_id: 7,
                addr: "192.0.2.1:9092".into(),
            }),
        ),
        (
            ApiKey::MetadataWrite,
            encode_meta(&MetadataWriteRequest {
                command: serde_json::to_vec(&create).unwrap(),
            }),
        ),
        (
            ApiKey::AlterPartition,
            encode_meta(&AlterPartitionRequest {
                broker_id: 0,
                topic: "orders".into(),
                partition: 0,
                leader_epoch: LeaderEpoch(0),
                new_isr: vec![0, 7],
            }),
        ),
        // A transaction marker: only a coordinator (a broker) may have one written.
        (
            ApiKey::WriteTxnMarkers,
            encode_meta(&WriteTxnMarkersRequest {
                producer_id: 1,
                producer_epoch: 0,
                kind: rill_proto::control::MarkerKind::Commit,
                coordinator_epoch: 0,
                topics: vec![TxnTopic {
                    topic: "orders".into(),
                    partitions: vec![0],
                }],
            }),
        ),
        // A committed transaction's offsets, stored whatever the group's members.
        (
            ApiKey::CommitTxnOffsets,
            encode_meta(&CommitTxnOffsetsRequest {
                transactional_id: "t".into(),
                group_id: "g".into(),
                partitions: Vec::new(),
                pending_for_ms: None,
            }),
        ),
        // Whether a principal may do something: brokers' transform runners ask.
        (
            ApiKey::CheckAccess,
            encode_meta(&CheckAccessRequest {
                principal: "User:mallory".into(),
                checks: vec![(AclOperation::Write, AclResource::Topic("orders".into()))],
            }),
        ),
    ]
}

#[tokio::test]
async fn internal_apis_refuse_clients_and_change_nothing() {
    let env = Env::new();
    let broker = env.start(AuthMode::None, &[]).await;
    let addr = broker.local_addr();
    let anonymous = env.anonymous(addr).await;
    let mallory = env.as_user("mallory", addr).await;
    assert_eq!(anonymous.create("orders").await, None);
    anonymous.produce("orders", b"one").await.unwrap();
    let before = anonymous.partition("orders").await;
    let topics_before = anonymous.topic_names().await;

    let requests = internal_requests();
    assert_eq!(
        requests.len(),
        ApiKey::ALL
            .iter()
            .filter(|k| rill_broker::auth::broker_only(**k))
            .count(),
        "every broker-only api is tried"
    );
    for client in [&anonymous, &mallory] {
        for (api, meta) in &requests {
            let frame = client
                .try_call_raw(*api as u16, 0, meta, &[])
                .await
                .unwrap();
            let error = decode_meta::<ResponseMeta<()>>(&frame.meta)
                .unwrap()
                .unwrap_err();
            assert_eq!(error.code, ErrorCode::ClusterAuthorizationFailed, "{error}");
            assert!(error.message.contains(api.name()), "{error}");
        }
    }
    // Nothing changed: no forged topic, no new broker, the partition as it was.
    assert_eq!(anonymous.topic_names().await, topics_before);
    let resp = anonymous.ok(&MetadataRequest { topics: None }).await;
    assert_eq!(
        resp.brokers.iter().map(|b| b.id).collect::<Vec<_>>(),
        vec![0]
    );
    assert_eq!(anonymous.partition("orders").await, before);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_spoofed_replica_fetch_leaves_hw_and_isr_as_they_were() {
    let env = Env::new();
    let broker = env.start(AuthMode::None, &[]).await;
    let addr = broker.local_addr();
    let client = env.as_user("mallory", addr).await;
    assert_eq!(client.create("orders").await, None);
    for v in [b"a", b"b", b"c"] {
        client.produce("orders", v).await.unwrap();
    }
    let before = client.partition("orders").await;
    assert_eq!(before.high_watermark, Offset(3));
    // As the leader itself, as another broker, and as a made-up one.
    for replica in [0, 1, 7] {
        let e = client.fetch("orders", Some(replica)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::ClusterAuthorizationFailed, "{e}");
        assert!(e.message.contains("fetch"), "{e}");
    }
    let after = client.partition("orders").await;
    assert_eq!(after.isr, before.isr);
    assert_eq!(after.high_watermark, before.high_watermark);
    // An ordinary fetch still works.
    assert_eq!(
        client.fetch("orders", None).await.unwrap().high_watermark,
        Offset(3)
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn internal_topics_are_not_written_by_clients_not_even_super_users() {
    let env = Env::new();
    let broker = env.start(AuthMode::Mtls, &["root"]).await;
    let root = env.as_user("root", broker.local_addr()).await;
    for topic in ["__consumer_offsets", "__anything"] {
        let e = root.produce(topic, b"forged").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed, "{e}");
        assert!(e.message.contains("internal topic"), "{e}");
        let e = root
            .refused(
                &DeleteTopicsRequest {
                    names: vec![topic.into()],
                },
                &[],
            )
            .await;
        assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed, "{e}");
        let e = root
            .refused(
                &AlterConfigsRequest {
                    topic: topic.into(),
                    set: vec![("retention.ms".into(), "0".into())],
                    delete: Vec::new(),
                    validate_only: false,
                },
                &[],
            )
            .await;
        assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed, "{e}");
    }
    broker.shutdown().await.unwrap();
}

/// A deployment record's value as rill-transforms writes it, as far as the
/// broker reads it (version byte, then the head's fields).
fn deployment_value(name: &str, inputs: &[&str], outputs: &[&str]) -> Vec<u8> {
    let head = DeploymentHead {
        name: name.into(),
        inputs: inputs.iter().map(|s| s.to_string()).collect(),
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        on_error: DeploymentErrorPolicy::Skip,
    };
    let mut value = vec![DEPLOYMENT_FORMAT_VERSION];
    value.extend(encode_meta(&head));
    value.extend_from_slice(b"the rest of the record");
    value
}

/// TransformWrite stores only what it checked: a record naming other topics
/// or another transform than the request, or another principal to run as,
/// is refused; `__transforms` itself is not produced to.
#[tokio::test]
async fn a_deployment_record_is_stored_only_as_checked() {
    let env = Env::new();
    let broker = env.start(AuthMode::Mtls, &["root"]).await;
    let root = env.as_user("root", broker.local_addr()).await;
    let alice = env.as_user("alice", broker.local_addr()).await;
    assert_eq!(root.create("__transforms").await, None);
    for t in ["in", "out", "secret"] {
        assert_eq!(root.create(t).await, None);
    }
    root.allow(
        "alice",
        AclOperation::Alter,
        AclResource::Transform("t".into()),
    )
    .await;
    root.allow("alice", AclOperation::Read, AclResource::Topic("in".into()))
        .await;
    root.allow(
        "alice",
        AclOperation::Write,
        AclResource::Topic("out".into()),
    )
    .await;
    let write = |value: Vec<u8>, outputs: &[&str], owner: Option<&str>| TransformWriteRequest {
        name: "t".into(),
        inputs: vec!["in".into()],
        outputs: outputs.iter().map(|s| s.to_string()).collect(),
        value: Some(value),
        owner: owner.map(str::to_string),
    };
    // Declares `out`, holds `secret`.
    let e = alice
        .refused(
            &write(deployment_value("t", &["in"], &["secret"]), &["out"], None),
            &[],
        )
        .await;
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e}");
    assert!(e.message.contains("secret"), "{e}");
    // Declares `secret` honestly: no right to write it.
    let e = alice
        .refused(
            &write(
                deployment_value("t", &["in"], &["secret"]),
                &["secret"],
                None,
            ),
            &[],
        )
        .await;
    assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed, "{e}");
    // Another transform's record under this name.
    let e = alice
        .refused(
            &write(deployment_value("other", &["in"], &["out"]), &["out"], None),
            &[],
        )
        .await;
    assert!(e.message.contains("\"other\""), "{e}");
    // Not a deployment record at all.
    let e = alice
        .refused(&write(b"\x07junk".to_vec(), &["out"], None), &[])
        .await;
    assert!(e.message.contains("format version 7"), "{e}");
    // Running as someone else.
    let e = alice
        .refused(
            &write(
                deployment_value("t", &["in"], &["out"]),
                &["out"],
                Some("User:root"),
            ),
            &[],
        )
        .await;
    assert_eq!(e.code, ErrorCode::ClusterAuthorizationFailed, "{e}");
    // What she may deploy is stored, stamped with her.
    let ok = alice
        .ok(&write(
            deployment_value("t", &["in"], &["out"]),
            &["out"],
            None,
        ))
        .await;
    assert_eq!(ok.principal, "User:alice");
    let fetch = FetchRequest {
        max_wait_ms: 0,
        min_bytes: 0,
        max_bytes: 1 << 20,
        replica_id: None,
        isolation: rill_proto::wire::Isolation::ReadUncommitted,
        partitions: vec![FetchPartition {
            topic: "__transforms".into(),
            partition: 0,
            offset: Offset(0),
            max_bytes: 1 << 20,
            current_leader_epoch: None,
        }],
    };
    let (_, payload) = root.call(&fetch, &[]).await;
    let mut stamped = Vec::new();
    for view in rill_proto::batch::batches(&payload) {
        for r in view.unwrap().records().unwrap() {
            let h = r.headers.iter().find(|h| h.key == DEPLOYER_HEADER).unwrap();
            stamped.push(h.value.clone());
        }
    }
    assert_eq!(stamped, vec![Bytes::from_static(b"User:alice")]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn mtls_needs_a_certificate_from_the_ca() {
    let env = Env::new();
    let broker = env.start(AuthMode::Mtls, &[]).await;
    let anonymous = env.anonymous(broker.local_addr()).await;
    let err = anonymous
        .try_call_raw(
            ApiKey::ApiVersions as u16,
            0,
            &encode_meta(&ApiVersionsRequest {
                client_software: "test".into(),
            }),
            &[],
        )
        .await
        .unwrap_err();
    match &err {
        NetError::ClientCertRefused { .. } => {}
        other => panic!("expected a refused certificate, got {other}"),
    }
    assert!(err.to_string().contains("--tls-cert"), "{err}");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn acls_allow_deny_by_prefix_and_survive_a_restart() {
    let env = Env::new();
    let broker = env.start(AuthMode::Mtls, &["root"]).await;
    let addr = broker.local_addr();
    let root = env.as_user("root", addr).await;
    let alice = env.as_user("alice", addr).await;
    let bob = env.as_user("bob", addr).await;
    for t in ["orders", "logs.web", "secret"] {
        assert_eq!(root.create(t).await, None);
    }

    // Denied by default, naming principal, operation, resource and api.
    let e = alice.produce("orders", b"x").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::TopicAuthorizationFailed);
    for part in ["\"alice\"", "write", "\"orders\"", "produce"] {
        assert!(e.message.contains(part), "{part}: {e}");
    }
    assert_eq!(
        alice.create("mine").await.unwrap().code,
        ErrorCode::TopicAuthorizationFailed
    );
    assert_eq!(
        alice
            .refused(&CreateAclsRequest { rules: vec![] }, &[])
            .await
            .code,
        ErrorCode::ClusterAuthorizationFailed
    );
    assert!(
        alice.topic_names().await.is_empty(),
        "alice may describe nothing"
    );

    // Allowed once a rule says so: write, read, prefix, create on the cluster.
    root.allow(
        "alice",
        AclOperation::Write,
        AclResource::Topic("orders".into()),
    )
    .await;
    alice.produce("orders", b"x").await.unwrap();
    assert_eq!(
        alice.fetch("orders", None).await.unwrap_err().code,
        ErrorCode::TopicAuthorizationFailed
    );
    root.allow(
        "alice",
        AclOperation::Read,
        AclResource::Topic("orders".into()),
    )
    .await;
    assert_eq!(
        alice.fetch("orders", None).await.unwrap().high_watermark,
        Offset(1)
    );
    root.allow(
        "bob",
        AclOperation::All,
        AclResource::TopicPrefix("logs.".into()),
    )
    .await;
    bob.produce("logs.web", b"y").await.unwrap();
    assert_eq!(
        bob.produce("secret", b"y").await.unwrap_err().code,
        ErrorCode::TopicAuthorizationFailed
    );
    assert_eq!(bob.topic_names().await, vec!["logs.web".to_string()]);
    root.allow("bob", AclOperation::Create, AclResource::Cluster)
        .await;
    assert_eq!(bob.create("bobs").await, None);
    // Super users may do everything.
    root.produce("secret", b"z").await.unwrap();

    // The rules are in the metadata quorum: a restart keeps them.
    let rules = root
        .ok(&DescribeAclsRequest { principal: None })
        .await
        .rules;
    assert_eq!(rules.len(), 4);
    broker.shutdown().await.unwrap();
    let broker = env.start(AuthMode::Mtls, &["root"]).await;
    let alice = env.as_user("alice", broker.local_addr()).await;
    let root = env.as_user("root", broker.local_addr()).await;
    assert_eq!(
        root.ok(&DescribeAclsRequest { principal: None })
            .await
            .rules,
        rules
    );
    alice.produce("orders", b"after restart").await.unwrap();
    assert_eq!(
        alice.produce("secret", b"no").await.unwrap_err().code,
        ErrorCode::TopicAuthorizationFailed
    );
    // Removing a rule takes the right away.
    let removed = root
        .ok(&DeleteAclsRequest {
            rules: vec![AclRule {
                principal: "alice".into(),
                operation: AclOperation::Write,
                resource: AclResource::Topic("orders".into()),
            }],
        })
        .await;
    assert_eq!(removed.deleted, 1);
    assert_eq!(
        alice.produce("orders", b"no").await.unwrap_err().code,
        ErrorCode::TopicAuthorizationFailed
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_produce_quota_slows_a_producer_to_its_rate() {
    let env = Env::new();
    let broker = env.start(AuthMode::Mtls, &["root", "fast"]).await;
    let addr = broker.local_addr();
    let root = env.as_user("root", addr).await;
    assert_eq!(root.create("metered").await, None);
    let rate = 256 * 1024u64;
    root.ok(&AlterQuotasRequest {
        principal: "fast".into(),
        quota: Quota {
            produce_bytes_per_s: Some(rate),
            fetch_bytes_per_s: None,
        },
    })
    .await;
    let fast = env.as_user("fast", addr).await;
    let value = vec![7u8; 32 * 1024];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(3) {
        let b = batch(&value);
        sent += b.len() as u64;
        let req = ProduceRequest {
            acks: Acks::Leader,
            timeout_ms: 10_000,
            partitions: vec![ProducePartition {
                topic: "metered".into(),
                partition: 0,
                bytes_len: b.len() as u32,
            }],
        };
        fast.call(&req, &[b]).await.0.unwrap();
    }
    let measured = sent as f64 / start.elapsed().as_secs_f64();
    assert!(
        (measured - rate as f64).abs() / rate as f64 <= 0.2,
        "measured {measured:.0} bytes/s under a quota of {rate}"
    );
    broker.shutdown().await.unwrap();
}
