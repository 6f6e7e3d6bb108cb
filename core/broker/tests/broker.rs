//! End-to-end tests of rill-broker over loopback QUIC: a broker on 127.0.0.1:0
//! with temp data and Rill-home directories, spoken to with rill-net frames.

use bytes::Bytes;
use rill_broker::{Broker, BrokerConfig, BrokerHandle};
use rill_net::{ClientTls, TransportLimits};
use rill_proto::batch::batches;
use rill_proto::wire::*;
use rill_proto::{BatchBuilder, Compression, Offset, Record, StoredRecord};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Bound on every test step, so a hang fails instead of blocking CI.
const STEP: Duration = Duration::from_secs(30);

fn config(data: &Path, home: &Path) -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_path_buf(),
        rill_home: Some(home.to_path_buf()),
        retention_check_interval_ms: 100,
        flush_check_interval_ms: 100,
        shutdown_timeout_ms: 5000,
        ..BrokerConfig::default()
    }
}

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
    fn config(&self) -> BrokerConfig {
        config(self.data.path(), self.home.path())
    }
    async fn start(&self) -> BrokerHandle {
        self.start_with(self.config()).await
    }
    async fn start_with(&self, config: BrokerConfig) -> BrokerHandle {
        tokio::time::timeout(STEP, Broker::start(config))
            .await
            .unwrap()
            .unwrap()
    }
    async fn client(&self, addr: SocketAddr) -> Client {
        self.client_with(
            ClientTls::Dev {
                home: self.home.path().to_path_buf(),
            },
            addr,
        )
        .await
    }
    /// A client that presents broker `id`'s certificate (from the same CA):
    /// what the cluster-internal apis accept.
    async fn as_broker(&self, addr: SocketAddr, id: i32) -> Client {
        let ca = rill_net::ensure_dev_ca(self.home.path()).unwrap();
        let (chain, key) = ca.issue_broker_cert(id, &[]).unwrap();
        let dir = self.home.path().join("peer-certs");
        let (cert, key) =
            rill_net::write_cert_files(&dir, &format!("broker-{id}"), &chain, &key).unwrap();
        let tls = ClientTls::Mutual {
            ca: ca.cert_path().to_path_buf(),
            cert,
            key,
        };
        self.client_with(tls, addr).await
    }
    async fn client_with(&self, tls: ClientTls, addr: SocketAddr) -> Client {
        let endpoint = rill_net::client_endpoint(&tls, &TransportLimits::default()).unwrap();
        let conn = rill_net::connect(&endpoint, addr).await.unwrap();
        Client {
            _endpoint: endpoint,
            conn,
        }
    }
}

struct Client {
    _endpoint: quinn::Endpoint,
    conn: quinn::Connection,
}

impl Client {
    async fn call<R: ApiRequest>(
        &self,
        req: &R,
        payload: &[Bytes],
    ) -> (ResponseMeta<R::Response>, Bytes) {
        self.call_raw(R::KEY as u16, R::VERSION, &encode_meta(req), payload)
            .await
    }

    async fn call_raw<T: serde::de::DeserializeOwned>(
        &self,
        key: u16,
        version: u16,
        meta: &[u8],
        payload: &[Bytes],
    ) -> (ResponseMeta<T>, Bytes) {
        let frame = tokio::time::timeout(
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
        .unwrap();
        assert_eq!((frame.api_key, frame.api_version), (key, version));
        (decode_meta(&frame.meta).unwrap(), frame.payload)
    }

    async fn ok<R: ApiRequest>(&self, req: &R, payload: &[Bytes]) -> (R::Response, Bytes) {
        let (resp, payload) = self.call(req, payload).await;
        (
            resp.unwrap_or_else(|e| panic!("request failed: {e}")),
            payload,
        )
    }

    async fn create(
        &self,
        name: &str,
        partitions: u32,
        configs: &[(&str, &str)],
    ) -> Option<ErrorInfo> {
        let req = CreateTopicsRequest {
            topics: vec![NewTopic {
                name: name.into(),
                partitions: Some(partitions),
                replication_factor: None,
                configs: configs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }],
            validate_only: false,
        };
        let (resp, _) = self.ok(&req, &[]).await;
        assert_eq!(resp.results.len(), 1);
        resp.results.into_iter().next().unwrap().error
    }

    async fn produce(&self, topic: &str, partition: u32, batch: Bytes) -> ProducePartitionResponse {
        let req = ProduceRequest {
            acks: Acks::All,
            timeout_ms: 10_000,
            partitions: vec![ProducePartition {
                topic: topic.into(),
                partition,
                bytes_len: batch.len() as u32,
            }],
        };
        let (resp, _) = self.ok(&req, &[batch]).await;
        resp.partitions.into_iter().next().unwrap()
    }

    async fn fetch(
        &self,
        topic: &str,
        partition: u32,
        offset: i64,
        max_wait_ms: u32,
    ) -> (FetchPartitionResponse, Vec<StoredRecord>) {
        let req = FetchRequest {
            max_wait_ms,
            min_bytes: 1,
            max_bytes: 1 << 20,
            replica_id: None,
            isolation: rill_proto::wire::Isolation::ReadUncommitted,
            partitions: vec![FetchPartition {
                topic: topic.into(),
                partition,
                offset: Offset(offset),
                max_bytes: 1 << 20,
                current_leader_epoch: None,
            }],
        };
        let (resp, payload) = self.ok(&req, &[]).await;
        let p = resp.partitions.into_iter().next().unwrap();
        assert_eq!(p.bytes_len as usize, payload.len());
        (p, decode_records(&payload))
    }

    async fn list_offset(&self, topic: &str, spec: OffsetSpec) -> ListOffsetsPartitionResponse {
        let req = ListOffsetsRequest {
            partitions: vec![ListOffsetsPartition {
                topic: topic.into(),
                partition: 0,
                spec,
            }],
        };
        self.ok(&req, &[])
            .await
            .0
            .partitions
            .into_iter()
            .next()
            .unwrap()
    }
}

fn batch(values: &[&str], timestamp_ms: i64) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None);
    for v in values {
        b.push(&Record::from_value(
            Bytes::copy_from_slice(v.as_bytes()),
            timestamp_ms,
        ));
    }
    b.build()
}

fn decode_records(payload: &[u8]) -> Vec<StoredRecord> {
    batches(payload)
        .flat_map(|b| b.unwrap().records().unwrap())
        .collect()
}

fn values(records: &[StoredRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap())
        .collect()
}

#[tokio::test]
async fn create_produce_fetch_round_trip() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;

    let (versions, _) = client
        .ok(
            &ApiVersionsRequest {
                client_software: "test".into(),
            },
            &[],
        )
        .await;
    assert_eq!(versions.broker_id, 0);
    assert_eq!(versions.apis.len(), ApiKey::ALL.len());

    assert_eq!(client.create("orders", 2, &[]).await, None);
    let p = client
        .produce("orders", 1, batch(&["a", "b", "c"], 1000))
        .await;
    assert_eq!(p.error, None);
    assert_eq!(p.base_offset, Offset(0));
    let p = client.produce("orders", 1, batch(&["d"], 1001)).await;
    assert_eq!(p.base_offset, Offset(3));

    let (f, records) = client.fetch("orders", 1, 0, 0).await;
    assert_eq!(f.error, None);
    assert_eq!(f.high_watermark, Offset(4));
    assert_eq!(values(&records), ["a", "b", "c", "d"]);
    assert_eq!(
        records.iter().map(|r| r.offset.0).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    let (_, records) = client.fetch("orders", 1, 3, 0).await;
    assert_eq!(values(&records), ["d"]);

    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    assert_eq!(md.controller_id, Some(0));
    assert_eq!(md.brokers.len(), 1);
    assert_eq!(md.brokers[0].addr, broker.local_addr().to_string());
    let t = &md.topics[0];
    assert_eq!((t.name.as_str(), t.partitions.len()), ("orders", 2));
    let p1 = &t.partitions[1];
    assert_eq!(
        (p1.leader, p1.replicas.clone(), p1.isr.clone()),
        (Some(0), vec![0], vec![0])
    );
    assert_eq!(
        (p1.log_start_offset, p1.high_watermark, p1.log_end_offset),
        (Offset(0), Offset(4), Offset(4))
    );
    assert_eq!(t.partitions[0].log_end_offset, Offset(0));

    // Out of range names the log's range.
    let (f, records) = client.fetch("orders", 1, 99, 0).await;
    let e = f.error.unwrap();
    assert_eq!(e.code, ErrorCode::OffsetOutOfRange);
    assert!(e.message.contains("[0, 4)"), "{e}");
    assert!(records.is_empty());

    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn unknown_topics_and_partitions_are_errors() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let p = client.produce("nope", 0, batch(&["x"], 1)).await;
    assert_eq!(p.error.unwrap().code, ErrorCode::UnknownTopicOrPartition);
    let (f, _) = client.fetch("nope", 0, 0, 0).await;
    assert_eq!(f.error.unwrap().code, ErrorCode::UnknownTopicOrPartition);
    client.create("one", 1, &[]).await;
    let p = client.produce("one", 5, batch(&["x"], 1)).await;
    let e = p.error.unwrap();
    assert_eq!(e.code, ErrorCode::UnknownTopicOrPartition);
    assert!(e.message.contains("partition 5"), "{e}");
    let (md, _) = client
        .ok(
            &MetadataRequest {
                topics: Some(vec!["nope".into()]),
            },
            &[],
        )
        .await;
    assert_eq!(
        md.topics[0].error.as_ref().unwrap().code,
        ErrorCode::UnknownTopicOrPartition
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn auto_create_on_produce() {
    let env = Env::new();
    let broker = env
        .start_with(BrokerConfig {
            auto_create_topics: true,
            num_partitions: 3,
            ..env.config()
        })
        .await;
    let client = env.client(broker.local_addr()).await;
    let p = client.produce("fresh", 2, batch(&["x"], 1)).await;
    assert_eq!(p.error, None);
    let (md, _) = client
        .ok(
            &MetadataRequest {
                topics: Some(vec!["fresh".into()]),
            },
            &[],
        )
        .await;
    assert_eq!(md.topics[0].partitions.len(), 3);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn create_topics_validates() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;

    let e = client
        .create("t", 1, &[("retention.ms", "soon")])
        .await
        .unwrap();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("retention.ms"), "{e}");
    let e = client
        .create("t", 1, &[("no.such.key", "1")])
        .await
        .unwrap();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("no.such.key"), "{e}");
    let e = client.create("bad name", 1, &[]).await.unwrap();
    assert_eq!(e.code, ErrorCode::InvalidTopic);
    let e = client.create("__x", 1, &[]).await.unwrap();
    assert_eq!(e.code, ErrorCode::InvalidTopic);
    let e = client.create("t", 0, &[]).await.unwrap();
    assert_eq!(e.code, ErrorCode::InvalidPartitions);

    let req = CreateTopicsRequest {
        topics: vec![NewTopic {
            name: "t".into(),
            partitions: Some(1),
            replication_factor: Some(3),
            configs: vec![],
        }],
        validate_only: false,
    };
    let e = client.ok(&req, &[]).await.0.results[0]
        .error
        .clone()
        .unwrap();
    assert_eq!(e.code, ErrorCode::InvalidReplicationFactor);
    assert!(
        e.message
            .contains("replication factor 3 is larger than the 1 live broker(s)"),
        "{e}"
    );

    // validate_only creates nothing.
    let req = CreateTopicsRequest {
        topics: vec![NewTopic {
            name: "t".into(),
            partitions: Some(1),
            replication_factor: None,
            configs: vec![],
        }],
        validate_only: true,
    };
    assert_eq!(client.ok(&req, &[]).await.0.results[0].error, None);
    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    assert!(md.topics.is_empty(), "{md:?}");

    assert_eq!(client.create("t", 1, &[]).await, None);
    let e = client.create("t", 1, &[]).await.unwrap();
    assert_eq!(e.code, ErrorCode::TopicAlreadyExists);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_errors_on_their_stream_only() {
    let env = Env::new();
    let broker = env
        .start_with(BrokerConfig {
            max_request_bytes: 4096,
            ..env.config()
        })
        .await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;

    // Oversized frame: REQUEST_TOO_LARGE naming both sizes, on that stream.
    let big = Bytes::from(vec![0u8; 10_000]);
    let req = ProduceRequest {
        acks: Acks::All,
        timeout_ms: 1000,
        partitions: vec![ProducePartition {
            topic: "t".into(),
            partition: 0,
            bytes_len: big.len() as u32,
        }],
    };
    let (resp, _) = client.call(&req, &[big]).await;
    let e = resp.unwrap_err();
    assert_eq!(e.code, ErrorCode::RequestTooLarge);
    assert!(e.message.contains("max_request_bytes=4096"), "{e}");

    // Garbage meta: INVALID_REQUEST naming the message.
    let (resp, _) = client
        .call_raw::<ProduceResponse>(ApiKey::Produce as u16, 0, &[0xff, 0xff, 0xff, 0xff], &[])
        .await;
    let e = resp.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(e.message.contains("ProduceRequest"), "{e}");

    // Unsupported version and unknown api key.
    let (resp, _) = client
        .call_raw::<MetadataResponse>(
            ApiKey::Metadata as u16,
            7,
            &encode_meta(&MetadataRequest { topics: None }),
            &[],
        )
        .await;
    let e = resp.unwrap_err();
    assert_eq!(e.code, ErrorCode::UnsupportedVersion);
    assert!(
        e.message.contains("metadata") && e.message.contains("version 7"),
        "{e}"
    );
    let (resp, _) = client.call_raw::<MetadataResponse>(999, 0, &[], &[]).await;
    assert_eq!(resp.unwrap_err().code, ErrorCode::UnsupportedVersion);

    // A batch with a broken CRC: CORRUPT_RECORD for that partition.
    let mut bad = batch(&["x"], 1).to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let p = client.produce("t", 0, Bytes::from(bad)).await;
    assert_eq!(p.error.unwrap().code, ErrorCode::CorruptRecord);

    // The same connection still works.
    let p = client.produce("t", 0, batch(&["ok"], 1)).await;
    assert_eq!(p.error, None);
    let (_, records) = client.fetch("t", 0, 0, 0).await;
    assert_eq!(values(&records), ["ok"]);
    broker.shutdown().await.unwrap();
}

/// The value of `name{api="<api>"}` in a Prometheus text rendering (0 if absent).
/// A batch stamped i64::MAX would stop time retention of its partition: the
/// leader refuses it (INVALID_TIMESTAMP, naming topic, partition, record and
/// config) and appends nothing; the request's other partition is written.
#[tokio::test]
async fn a_batch_from_the_far_future_is_refused_and_nothing_is_appended() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    assert_eq!(client.create("t", 2, &[]).await, None);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let good = batch(&["now"], now);
    let mut future = good.to_vec();
    future.extend_from_slice(&batch(&["x", "y"], i64::MAX));
    let req = ProduceRequest {
        acks: Acks::All,
        timeout_ms: 10_000,
        partitions: vec![
            ProducePartition {
                topic: "t".into(),
                partition: 0,
                bytes_len: future.len() as u32,
            },
            ProducePartition {
                topic: "t".into(),
                partition: 1,
                bytes_len: good.len() as u32,
            },
        ],
    };
    let (resp, _) = client.ok(&req, &[Bytes::from(future), good]).await;
    let e = resp.partitions[0].error.clone().expect("refused");
    assert_eq!(e.code, ErrorCode::InvalidTimestamp, "{e}");
    for part in [
        "batch at position 1 of topic 't' partition 0",
        "9223372036854775807",
        "message.timestamp.after.max.ms=3600000",
    ] {
        assert!(e.message.contains(part), "{part:?} not in {e}");
    }
    assert_eq!(resp.partitions[1].error, None);
    // Nothing of partition 0 was written, not even its good first batch.
    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    let ends: Vec<Offset> = md.topics[0]
        .partitions
        .iter()
        .map(|p| p.log_end_offset)
        .collect();
    assert_eq!(ends, [Offset(0), Offset(1)]);
    // A batch whose header count disagrees with its records: INVALID_RECORD.
    let mut miscounted = batch(&["a", "b"], now).to_vec();
    miscounted[57..61].copy_from_slice(&3i32.to_be_bytes());
    miscounted[23..27].copy_from_slice(&2i32.to_be_bytes());
    let crc = rill_proto::crc::crc32c(&miscounted[21..]);
    miscounted[17..21].copy_from_slice(&crc.to_be_bytes());
    let p = client.produce("t", 0, Bytes::from(miscounted)).await;
    let e = p.error.expect("refused");
    assert_eq!(e.code, ErrorCode::InvalidRecord, "{e}");
    assert!(e.message.contains("partition 0"), "{e}");
    let p = client.produce("t", 0, batch(&["ok"], now)).await;
    assert_eq!((p.error, p.base_offset), (None, Offset(0)));
    broker.shutdown().await.unwrap();
}

/// A forged `MetadataWrite` whose topic has a partition without replicas
/// (which used to panic the state machine on the next election, on every
/// broker and on every replay) is refused before it is proposed; the quorum
/// keeps working and an election afterwards does not panic.
#[tokio::test]
async fn a_malformed_metadata_command_is_refused_and_the_quorum_keeps_working() {
    use rill_broker::cluster::image::{Command, Outcome};
    let env = Env::new();
    let broker = env.start().await;
    // The internal apis answer brokers only: this client is a peer broker.
    let client = env.as_broker(broker.local_addr(), 7).await;
    let write = |command: &Command| MetadataWriteRequest {
        command: serde_json::to_vec(command).unwrap(),
    };
    let empty = Command::CreateTopic {
        name: "hollow".into(),
        id: "0123456789abcdef".into(),
        internal: false,
        configs: Default::default(),
        assignment: vec![vec![0], vec![]],
    };
    let (resp, _) = client.ok(&write(&empty), &[]).await;
    let outcome: Outcome = serde_json::from_slice(&resp.outcome).unwrap();
    let Outcome::Refused { code, message } = outcome else {
        panic!("not refused: {outcome:?}")
    };
    assert_eq!(code, ErrorCode::InvalidReplicationFactor);
    assert!(
        message.contains("topic hollow partition 1") && message.contains("empty"),
        "{message}"
    );
    let (resp, _) = client
        .ok(&write(&Command::ElectPreferred { topics: None }), &[])
        .await;
    let outcome: Outcome = serde_json::from_slice(&resp.outcome).unwrap();
    assert!(matches!(outcome, Outcome::Moved(_)), "{outcome:?}");
    assert_eq!(client.create("solid", 1, &[]).await, None);
    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    let names: Vec<&str> = md.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["solid"]);
    broker.shutdown().await.unwrap();
}

/// A join of a broker nobody can reach ends within the controller's
/// deadline with an error naming the broker and its address; the membership
/// lock is free again (a topic can be created right after).
#[tokio::test]
async fn a_join_of_an_unreachable_broker_ends_at_its_deadline_naming_it() {
    let env = Env::new();
    let broker = env.start().await;
    // The internal apis answer brokers only: this client is a peer broker.
    let client = env.as_broker(broker.local_addr(), 7).await;
    // A topic first: the broker has registered and is the controller.
    assert_eq!(client.create("before", 1, &[]).await, None);
    let started = std::time::Instant::now();
    let (resp, _) = client
        .call(
            &JoinClusterRequest {
                broker_id: 7,
                addr: "127.0.0.1:9".into(),
            },
            &[],
        )
        .await;
    let e = resp.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code, ErrorCode::RequestTimedOut, "{e}");
    assert!(e.message.contains("broker 7 at 127.0.0.1:9"), "{e}");
    assert!(took < STEP, "took {took:?}");
    let (resp, _) = client
        .call(
            &JoinClusterRequest {
                broker_id: 8,
                addr: "no port".into(),
            },
            &[],
        )
        .await;
    let e = resp.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e}");
    assert!(e.message.contains("broker 8"), "{e}");
    assert_eq!(client.create("after", 1, &[]).await, None);
    broker.shutdown().await.unwrap();
}

fn api_metric(text: &str, name: &str, api: &str) -> u64 {
    let prefix = format!("{name}{{api=\"{api}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// A fetch at the end of the log is held until data arrives, and answered then.
/// Told by events, not time: the broker's own request metrics (a recorder local
/// to this test) show the fetch taken and not yet answered before the record is
/// produced, and it must come back with the record, as the only fetch, before
/// its wait runs out (120 s asked, 60 s at most granted, the test bound is 30 s).
/// A broker answering an empty fetch at once, or only at the end of its wait,
/// fails.
#[tokio::test]
async fn fetch_long_poll_returns_when_data_arrives() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let metrics = recorder.handle();
    // The broker registers its request metrics in `Broker::start`, on this thread
    // (`#[tokio::test]` runs on one): they report here, apart from other tests'.
    let _local = metrics::set_default_local_recorder(&recorder);
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;

    let fetcher = env.client(broker.local_addr()).await;
    let fetch = tokio::spawn(async move { fetcher.fetch("t", 0, 0, 120_000).await });
    // The broker counts a request when it takes it, its duration once answered.
    tokio::time::timeout(STEP, async {
        while api_metric(&metrics.render(), "rill_requests_total", "fetch") == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the broker never took the fetch");
    let text = metrics.render();
    assert!(
        !fetch.is_finished()
            && api_metric(&text, "rill_request_duration_seconds_count", "fetch") == 0,
        "the broker answered the fetch at once instead of holding it:\n{text}"
    );
    let p = client.produce("t", 0, batch(&["late"], 5)).await;
    assert_eq!(p.error, None);
    // Within STEP (30 s): before the fetch's wait could have run out.
    let (f, records) = fetch.await.expect("the fetch was answered with the data");
    assert_eq!(f.error, None);
    assert_eq!(values(&records), ["late"]);
    assert_eq!(
        api_metric(&metrics.render(), "rill_requests_total", "fetch"),
        1,
        "one fetch, held, carried the record"
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn acks_none_sends_no_response_but_appends() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;
    let b = batch(&["fire", "forget"], 1);
    let req = ProduceRequest {
        acks: Acks::None,
        timeout_ms: 1000,
        partitions: vec![ProducePartition {
            topic: "t".into(),
            partition: 0,
            bytes_len: b.len() as u32,
        }],
    };
    let result = tokio::time::timeout(
        STEP,
        rill_net::call(
            &client.conn,
            ApiKey::Produce as u16,
            0,
            &encode_meta(&req),
            &[b],
            1 << 20,
        ),
    )
    .await
    .unwrap();
    assert!(
        matches!(result, Err(rill_net::NetError::NoFrame)),
        "{result:?}"
    );
    let (_, records) = client.fetch("t", 0, 0, 10_000).await;
    assert_eq!(values(&records), ["fire", "forget"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn restart_keeps_topics_data_and_configs() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client
        .create("keep", 2, &[("retention.ms", "86400000")])
        .await;
    client.produce("keep", 0, batch(&["one", "two"], 10)).await;
    let req = AlterConfigsRequest {
        topic: "keep".into(),
        set: vec![("cleanup.policy".into(), "compact".into())],
        delete: vec!["retention.ms".into()],
        validate_only: false,
    };
    assert_eq!(client.ok(&req, &[]).await.0.error, None);
    let bad = AlterConfigsRequest {
        topic: "keep".into(),
        set: vec![("segment.bytes".into(), "-1".into())],
        delete: vec![],
        validate_only: false,
    };
    let e = client.ok(&bad, &[]).await.0.error.unwrap();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(e.message.contains("segment.bytes"), "{e}");
    drop(client);
    broker.shutdown().await.unwrap();

    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    assert_eq!(md.topics.len(), 1);
    assert_eq!(md.topics[0].partitions.len(), 2);
    let (_, records) = client.fetch("keep", 0, 0, 0).await;
    assert_eq!(values(&records), ["one", "two"]);
    let p = client.produce("keep", 0, batch(&["three"], 11)).await;
    assert_eq!(p.base_offset, Offset(2));

    let (resp, _) = client
        .ok(
            &DescribeConfigsRequest {
                topics: vec!["keep".into()],
            },
            &[],
        )
        .await;
    let configs = &resp.topics[0].configs;
    let get = |k: &str| configs.iter().find(|c| c.name == k).unwrap().clone();
    assert_eq!(get("cleanup.policy").value, "compact");
    assert!(!get("cleanup.policy").is_default);
    assert!(get("retention.ms").is_default);
    assert_eq!(get("retention.ms").value, "604800000");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn delete_topic_then_recreate_is_empty() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("gone", 1, &[]).await;
    client.produce("gone", 0, batch(&["x"], 1)).await;
    let (resp, _) = client
        .ok(
            &DeleteTopicsRequest {
                names: vec!["gone".into(), "never".into()],
            },
            &[],
        )
        .await;
    assert_eq!(resp.results[0].error, None);
    assert_eq!(
        resp.results[1].error.as_ref().unwrap().code,
        ErrorCode::UnknownTopicOrPartition
    );
    assert!(!env.data.path().join("gone-0").exists());
    let (f, _) = client.fetch("gone", 0, 0, 0).await;
    assert_eq!(f.error.unwrap().code, ErrorCode::UnknownTopicOrPartition);
    client.create("gone", 1, &[]).await;
    let (f, records) = client.fetch("gone", 0, 0, 0).await;
    assert_eq!((f.error, records.len()), (None, 0));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn list_offsets_by_spec() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;
    client.produce("t", 0, batch(&["a", "b"], 1_000)).await;
    client.produce("t", 0, batch(&["c"], 2_000)).await;
    client.produce("t", 0, batch(&["d"], 3_000)).await;
    assert_eq!(
        client.list_offset("t", OffsetSpec::Earliest).await.offset,
        Offset(0)
    );
    assert_eq!(
        client.list_offset("t", OffsetSpec::Latest).await.offset,
        Offset(4)
    );
    let r = client.list_offset("t", OffsetSpec::Timestamp(1_500)).await;
    assert_eq!((r.offset, r.timestamp_ms), (Offset(2), Some(2_000)));
    let r = client.list_offset("t", OffsetSpec::Timestamp(9_000)).await;
    assert_eq!(r.offset, Offset(4));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn too_many_connections_are_closed_with_a_reason() {
    let env = Env::new();
    let broker = env
        .start_with(BrokerConfig {
            max_connections: 1,
            ..env.config()
        })
        .await;
    let first = env.client(broker.local_addr()).await;
    first.ok(&MetadataRequest { topics: None }, &[]).await;
    let second = env.client(broker.local_addr()).await;
    let reason = tokio::time::timeout(STEP, second.conn.closed())
        .await
        .unwrap();
    assert!(
        reason.to_string().contains("too many connections"),
        "{reason}"
    );
    first.ok(&MetadataRequest { topics: None }, &[]).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn bind_failure_and_bad_config_are_clear() {
    let env = Env::new();
    let broker = env.start().await;
    let taken = BrokerConfig {
        listen: broker.local_addr(),
        data_dir: env.data.path().join("other"),
        ..env.config()
    };
    let e = Broker::start(taken).await.unwrap_err().to_string();
    assert!(e.contains(&broker.local_addr().to_string()), "{e}");
    let bad = BrokerConfig {
        topic_defaults: [("retention.ms".to_string(), "x".to_string())].into(),
        ..env.config()
    };
    let e = Broker::start(bad).await.unwrap_err().to_string();
    assert!(e.contains("retention.ms"), "{e}");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn fetch_respects_byte_bounds_but_always_returns_one_batch() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 2, &[]).await;
    // 100 KiB value: larger than the fetch bounds below, and read off-thread.
    let big = "x".repeat(100 * 1024);
    client.produce("t", 0, batch(&[&big], 1)).await;
    client.produce("t", 1, batch(&["small"], 1)).await;
    let req = FetchRequest {
        max_wait_ms: 0,
        min_bytes: 1,
        max_bytes: 1000,
        replica_id: None,
        isolation: rill_proto::wire::Isolation::ReadUncommitted,
        partitions: (0..2)
            .map(|p| FetchPartition {
                topic: "t".into(),
                partition: p,
                offset: Offset(0),
                max_bytes: 1000,
                current_leader_epoch: None,
            })
            .collect(),
    };
    let (resp, payload) = client.ok(&req, &[]).await;
    let lens: Vec<u32> = resp.partitions.iter().map(|p| p.bytes_len).collect();
    assert!(lens[0] as usize > big.len(), "{lens:?}");
    assert_eq!(lens[1], 0, "the response is full after the first partition");
    let parts = split_payload(&payload, lens).unwrap();
    assert_eq!(values(&decode_records(&parts[0])), [big]);
    // Fetching partition 1 on its own returns its batch.
    let (_, records) = client.fetch("t", 1, 0, 0).await;
    assert_eq!(values(&records), ["small"]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_ends_a_waiting_fetch() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;
    let req = FetchRequest {
        max_wait_ms: 120_000,
        min_bytes: 1,
        max_bytes: 1 << 20,
        replica_id: None,
        isolation: rill_proto::wire::Isolation::ReadUncommitted,
        partitions: vec![FetchPartition {
            topic: "t".into(),
            partition: 0,
            offset: Offset(0),
            max_bytes: 1 << 20,
            current_leader_epoch: None,
        }],
    };
    let conn = client.conn.clone();
    let waiting = tokio::spawn(async move {
        rill_net::call(
            &conn,
            ApiKey::Fetch as u16,
            FetchRequest::VERSION,
            &encode_meta(&req),
            &[],
            1 << 20,
        )
        .await
    });
    // Let the fetch reach the broker and start waiting.
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::time::timeout(STEP, broker.shutdown())
        .await
        .unwrap()
        .unwrap();
    // The fetch ends (answered empty, or its connection closed) instead of
    // waiting out its two minutes.
    let ended = tokio::time::timeout(STEP, waiting).await.unwrap().unwrap();
    if let Ok(frame) = ended {
        let resp: ResponseMeta<FetchResponse> = decode_meta(&frame.meta).unwrap();
        assert_eq!(resp.unwrap().partitions[0].bytes_len, 0);
    }
}

#[tokio::test]
async fn retention_deletes_old_segments() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    // Tiny segments (one batch each) and a retention every record is past.
    client
        .create(
            "old",
            1,
            &[("segment.bytes", "100"), ("retention.ms", "60000")],
        )
        .await;
    for i in 0..5 {
        let p = client
            .produce("old", 0, batch(&["old-record"], 1_000 + i))
            .await;
        assert_eq!(p.error, None);
    }
    // The retention timer runs every 100 ms; wait (bounded) for it.
    let mut start = Offset(0);
    for _ in 0..200 {
        start = client.list_offset("old", OffsetSpec::Earliest).await.offset;
        if start > Offset(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(start > Offset(0), "retention never ran");
    let (f, records) = client.fetch("old", 0, start.0, 0).await;
    assert_eq!(f.error, None);
    assert_eq!(f.log_start_offset, start);
    assert!(records.iter().all(|r| r.offset >= start));
    let (f, _) = client.fetch("old", 0, 0, 0).await;
    assert_eq!(f.error.unwrap().code, ErrorCode::OffsetOutOfRange);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn unreadable_partition_is_named_at_startup_and_leftovers_are_removed() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;
    drop(client);
    broker.shutdown().await.unwrap();

    // Leftovers of an interrupted delete are removed at startup.
    std::fs::create_dir(env.data.path().join("gone-0.deleted")).unwrap();
    std::fs::create_dir(env.data.path().join("gone-0")).unwrap();
    let broker = env.start().await;
    assert!(!env.data.path().join("gone-0.deleted").exists());
    assert!(!env.data.path().join("gone-0").exists());
    assert!(env.data.path().join("t-0").exists());
    broker.shutdown().await.unwrap();

    // A partition directory that is not a directory: the error names it.
    let dir = env.data.path().join("t-0");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let e = Broker::start(env.config()).await.unwrap_err().to_string();
    assert!(
        e.contains("partition t-0") && e.contains("move the directory aside"),
        "{e}"
    );
}

#[tokio::test]
async fn fsyncing_and_large_appends_run_off_the_async_workers() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("synced", 1, &[("flush.messages", "1")]).await;
    client
        .create("big", 1, &[("max.message.bytes", "4000000")])
        .await;
    assert_eq!(
        client.produce("synced", 0, batch(&["s"], 1)).await.error,
        None
    );
    let (_, records) = client.fetch("synced", 0, 0, 0).await;
    assert_eq!(values(&records), ["s"]);

    let big = "y".repeat(1536 * 1024);
    assert_eq!(
        client.produce("big", 0, batch(&[&big], 1)).await.error,
        None
    );
    let (_, records) = client.fetch("big", 0, 0, 0).await;
    assert_eq!(values(&records), [big]);
    // Over max.message.bytes: RECORD_TOO_LARGE naming the limit.
    client
        .create("small", 1, &[("max.message.bytes", "1000")])
        .await;
    let e = client
        .produce("small", 0, batch(&[&"z".repeat(5000)], 1))
        .await
        .error
        .unwrap();
    assert_eq!(e.code, ErrorCode::RecordTooLarge);
    assert!(e.message.contains("max.message.bytes=1000"), "{e}");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn altered_retention_applies_to_the_live_log() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    // Unlimited retention keeps these 1970 records until it is altered.
    client
        .create(
            "live",
            1,
            &[("segment.bytes", "100"), ("retention.ms", "-1")],
        )
        .await;
    for i in 0..4 {
        client.produce("live", 0, batch(&["r"], 1_000 + i)).await;
    }
    // Two retention checks pass without deleting anything.
    two_retention_passes(&client, "marker").await;
    let start = client
        .list_offset("live", OffsetSpec::Earliest)
        .await
        .offset;
    assert_eq!(start, Offset(0));
    let req = AlterConfigsRequest {
        topic: "live".into(),
        set: vec![("retention.ms".into(), "1000".into())],
        delete: vec![],
        validate_only: false,
    };
    assert_eq!(client.ok(&req, &[]).await.0.error, None);
    let mut start = Offset(0);
    for _ in 0..200 {
        start = client
            .list_offset("live", OffsetSpec::Earliest)
            .await
            .offset;
        if start > Offset(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(start > Offset(0), "the altered retention.ms never applied");
    broker.shutdown().await.unwrap();
}

/// Returns once the broker ran two whole retention passes after the call: a
/// `marker` topic of one-batch segments (60 s retention) gets two 1970 batches
/// in each of three rounds, and each round waits until its closed segment is
/// deleted. Passes run one after another, each over every partition, so the
/// passes that served the first two rounds both finished before the third.
async fn two_retention_passes(client: &Client, marker: &str) {
    client
        .create(
            marker,
            1,
            &[("segment.bytes", "100"), ("retention.ms", "60000")],
        )
        .await;
    for round in 0..3 {
        let mut last = Offset(0);
        for i in 0..2 {
            let p = client
                .produce(marker, 0, batch(&["marker"], 1_000 + round * 10 + i))
                .await;
            assert_eq!(p.error, None);
            last = p.base_offset;
        }
        tokio::time::timeout(STEP, async {
            while client
                .list_offset(marker, OffsetSpec::Earliest)
                .await
                .offset
                < last
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("retention never deleted {marker}'s segments (round {round})"));
    }
}

/// A batch as an idempotent producer sends it: stamped with its id and sequence.
fn producer_batch(values: &[&str], producer: i64, sequence: i32) -> Bytes {
    let mut bytes = batch(values, 1000).to_vec();
    rill_proto::batch::set_producer(&mut bytes, rill_proto::ProducerId(producer), 0, sequence);
    Bytes::from(bytes)
}

#[tokio::test]
async fn idempotent_producer_batches_are_written_once_across_a_restart() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let (a, _) = client.ok(&InitProducerIdRequest::default(), &[]).await;
    let (b, _) = client.ok(&InitProducerIdRequest::default(), &[]).await;
    assert_ne!(
        a.producer_id, b.producer_id,
        "every producer gets its own id"
    );
    let pid = a.producer_id;
    client.create("once", 1, &[]).await;
    let first = client
        .produce("once", 0, producer_batch(&["a", "b"], pid, 0))
        .await;
    assert_eq!((first.error, first.base_offset), (None, Offset(0)));
    // Another producer's record in between.
    client.produce("once", 0, batch(&["x"], 1000)).await;
    let second = client
        .produce("once", 0, producer_batch(&["c"], pid, 2))
        .await;
    assert_eq!(second.base_offset, Offset(3));
    // The retry of a batch already written: the same offset, nothing appended.
    let retry = client
        .produce("once", 0, producer_batch(&["a", "b"], pid, 0))
        .await;
    assert_eq!((retry.error, retry.base_offset), (None, Offset(0)));
    // A gap (sequence 3 was never sent): refused, naming what was expected.
    let gap = client
        .produce("once", 0, producer_batch(&["e"], pid, 4))
        .await;
    let e = gap.error.unwrap();
    assert_eq!(e.code, ErrorCode::OutOfOrderSequence);
    assert!(
        e.message.contains("once-0") && e.message.contains("expects 3"),
        "{e}"
    );
    drop(client);
    broker.shutdown().await.unwrap();

    // After a restart the broker still knows the producer (rebuilt from the log),
    // and producer ids keep increasing (they are in the metadata quorum).
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let retry = client
        .produce("once", 0, producer_batch(&["c"], pid, 2))
        .await;
    assert_eq!((retry.error, retry.base_offset), (None, Offset(3)));
    let next = client
        .produce("once", 0, producer_batch(&["d"], pid, 3))
        .await;
    assert_eq!((next.error, next.base_offset), (None, Offset(4)));
    // (One fetch reads one segment; the restart began a new one at 4.)
    let (f, mut records) = client.fetch("once", 0, 0, 0).await;
    assert_eq!(f.high_watermark, Offset(5));
    records.extend(client.fetch("once", 0, 4, 0).await.1);
    assert_eq!(values(&records), ["a", "b", "x", "c", "d"]);
    let (c, _) = client.ok(&InitProducerIdRequest::default(), &[]).await;
    assert!(
        c.producer_id > b.producer_id,
        "{} after {}",
        c.producer_id,
        b.producer_id
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_old_topics_toml_moves_into_the_quorum_once_with_its_logs() {
    // A data directory of an older broker: topics.toml and a partition log, no
    // metadata quorum yet.
    let env = Env::new();
    let old_log = env.data.path().join("legacy-0");
    {
        let mut log = rill_log::Log::open(&old_log, rill_log::LogConfig::default(), 1).unwrap();
        let mut bytes = batch(&["kept", "too"], 5).to_vec();
        log.append(&mut bytes, rill_proto::LeaderEpoch(0), 1)
            .unwrap();
        log.close().unwrap();
    }
    // A directory of a topic the file does not list (a delete that crashed half-way).
    std::fs::create_dir_all(env.data.path().join("orphan-0")).unwrap();
    let store = rill_broker::metadata::MetadataStore::open(env.data.path()).unwrap();
    store
        .save(&[rill_broker::metadata::TopicRecord {
            name: "legacy".into(),
            id: "00000000000000000000000000000abc".into(),
            partitions: 1,
            internal: false,
            leader_epoch: 0,
            configs: [("retention.ms".to_string(), "3600000".to_string())].into(),
        }])
        .unwrap();
    let topics_file = env.data.path().join("__meta/topics.toml");

    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let (_, records) = client.fetch("legacy", 0, 0, 0).await;
    assert_eq!(values(&records), ["kept", "too"]);
    let (resp, _) = client
        .ok(
            &DescribeConfigsRequest {
                topics: vec!["legacy".into()],
            },
            &[],
        )
        .await;
    let retention = resp.topics[0]
        .configs
        .iter()
        .find(|c| c.name == "retention.ms")
        .unwrap();
    assert_eq!(
        (retention.value.as_str(), retention.is_default),
        ("3600000", false)
    );
    // Migrated once: the file is retired and no change writes it again.
    assert!(!topics_file.exists(), "topics.toml is still there");
    assert!(env.data.path().join("__meta/topics.toml.migrated").exists());
    assert!(
        !env.data.path().join("orphan-0").exists(),
        "the orphan stays"
    );
    client.create("fresh", 1, &[]).await;
    assert!(!topics_file.exists(), "a create wrote topics.toml");
    // The partition directory names its topic id, as Kafka's partition.metadata.
    let meta = std::fs::read_to_string(old_log.join("partition.metadata")).unwrap();
    assert!(
        meta.contains("topic_id: 00000000000000000000000000000abc"),
        "{meta}"
    );
    drop(client);
    broker.shutdown().await.unwrap();

    // After a restart everything comes from the quorum: nothing migrates twice.
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let (md, _) = client.ok(&MetadataRequest { topics: None }, &[]).await;
    let mut names: Vec<&str> = md.topics.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["fresh", "legacy"]);
    let (_, records) = client.fetch("legacy", 0, 0, 0).await;
    assert_eq!(values(&records), ["kept", "too"]);
    drop(client);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_partition_directory_of_an_older_incarnation_is_replaced_not_adopted() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    client.create("t", 1, &[]).await;
    client.produce("t", 0, batch(&["new"], 5)).await;
    drop(client);
    broker.shutdown().await.unwrap();
    // Make the directory claim another topic id, as one left by a topic of the
    // same name that was deleted (and made again) while this broker was down.
    let dir = env.data.path().join("t-0");
    std::fs::write(
        dir.join("partition.metadata"),
        "version: 0\ntopic_id: ffffffffffffffffffffffffffffffff\n",
    )
    .unwrap();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let (f, records) = client.fetch("t", 0, 0, 0).await;
    assert_eq!(
        (f.error, records.len()),
        (None, 0),
        "the stale log was adopted"
    );
    drop(client);
    broker.shutdown().await.unwrap();
}

/// Compaction runs on the broker's timer while producers write: the cleaner
/// holds the log only to plan a run and to swap its segments in, so appends
/// go on beside it, and every key's latest acknowledged value is read back at
/// its offset once the log was cleaned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_runs_beside_produce_and_keeps_the_latest_of_every_key() {
    let env = Env::new();
    let broker = env.start().await;
    let client = env.client(broker.local_addr()).await;
    let created = client
        .create(
            "kv",
            1,
            &[
                ("cleanup.policy", "compact"),
                ("segment.bytes", "2048"),
                ("min.cleanable.dirty.ratio", "0.01"),
            ],
        )
        .await;
    assert_eq!(created, None);
    const KEYS: usize = 20;
    let mut latest: std::collections::BTreeMap<String, (i64, String)> = Default::default();
    let mut produced = 0usize;
    let mut i = 0usize;
    let deadline = std::time::Instant::now() + STEP;
    // Write until the log was compacted under the writes (records gone), and
    // a while after.
    let mut cleaned_at = None;
    while cleaned_at.is_none_or(|at| i < at + 200) {
        assert!(
            std::time::Instant::now() < deadline,
            "the log was never compacted ({produced} records written)"
        );
        let mut b = BatchBuilder::new(Compression::None);
        let mut keys = Vec::new();
        // Cold keys, written twice at the start only: their latest values
        // sit in segments the cleaner rewrites.
        for j in 0..5 {
            let key = if i < 2 {
                format!("cold{j}")
            } else {
                format!("k{}", (i * 5 + j) % KEYS)
            };
            let value = format!("{key}-{i}");
            b.push(&Record {
                key: Some(Bytes::from(key.clone())),
                value: Some(Bytes::from(value.clone())),
                headers: Vec::new(),
                timestamp_ms: rill_proto::types::now_ms(),
            });
            keys.push((key, value));
        }
        let p = client.produce("kv", 0, b.build()).await;
        assert_eq!(p.error, None, "{p:?}");
        for (n, (key, value)) in keys.into_iter().enumerate() {
            latest.insert(key, (p.base_offset.0 + n as i64, value));
        }
        produced += 5;
        i += 1;
        if cleaned_at.is_none() && i % 20 == 0 {
            let end = client.list_offset("kv", OffsetSpec::Latest).await.offset.0;
            let mut held = 0usize;
            let mut at = 0i64;
            while at < end {
                let (f, records) = client.fetch("kv", 0, at, 0).await;
                assert_eq!(f.error, None);
                held += records.len();
                at = records.last().map_or(end, |r| r.offset.0 + 1);
            }
            if held < produced {
                cleaned_at = Some(i);
            }
        }
    }
    // Everything is read back: offsets rise, and each key's latest
    // acknowledged value is there at its offset.
    let end = client.list_offset("kv", OffsetSpec::Latest).await.offset.0;
    let mut read: Vec<StoredRecord> = Vec::new();
    let mut at = 0i64;
    while at < end {
        let (f, records) = client.fetch("kv", 0, at, 0).await;
        assert_eq!(f.error, None);
        at = records.last().map_or(end, |r| r.offset.0 + 1);
        read.extend(records);
    }
    assert!(read.windows(2).all(|w| w[0].offset < w[1].offset));
    assert!(read.len() < produced, "{} of {produced}", read.len());
    for (key, (offset, value)) in &latest {
        let r = read
            .iter()
            .find(|r| r.offset.0 == *offset)
            .unwrap_or_else(|| panic!("the latest value of {key} (offset {offset}) is gone"));
        assert_eq!(r.key.as_deref(), Some(key.as_bytes()));
        assert_eq!(r.value.as_deref(), Some(value.as_bytes()));
    }
    broker.shutdown().await.unwrap();
}
