//! The Kafka listener in process, spoken to over loopback TCP with frames
//! encoded by the `kafka-protocol` crate (as a client would), and with random,
//! truncated and oversized frames: the broker must keep serving good clients.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use rand::{Rng, SeedableRng};
use rill_broker::{Broker, BrokerConfig, BrokerHandle};
use rill_proto::{BatchBuilder, Compression, Record};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on every test step, so a hang fails instead of blocking CI.
const STEP: Duration = Duration::from_secs(30);

fn config(data: &Path, home: &Path) -> BrokerConfig {
    BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        kafka_listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: data.to_path_buf(),
        rill_home: Some(home.to_path_buf()),
        shutdown_timeout_ms: 5000,
        ..BrokerConfig::default()
    }
}

struct Env {
    _data: tempfile::TempDir,
    _home: tempfile::TempDir,
    broker: Option<BrokerHandle>,
    kafka: SocketAddr,
}

impl Env {
    async fn start() -> Env {
        let data = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let broker = tokio::time::timeout(STEP, Broker::start(config(data.path(), home.path())))
            .await
            .unwrap()
            .unwrap();
        let kafka = rill_kafka::start(broker.front_door())
            .await
            .unwrap()
            .expect("kafka_listen is set");
        Env {
            _data: data,
            _home: home,
            broker: Some(broker),
            kafka: kafka.local_addr(),
        }
    }

    async fn stop(mut self) {
        let broker = self.broker.take().unwrap();
        tokio::time::timeout(STEP, broker.shutdown())
            .await
            .unwrap()
            .unwrap();
    }

    async fn connect(&self) -> Client {
        Client {
            stream: TcpStream::connect(self.kafka).await.unwrap(),
            correlation_id: 0,
        }
    }
}

struct Client {
    stream: TcpStream,
    correlation_id: i32,
}

impl Client {
    /// Sends `request` at `version` and reads its response.
    async fn call<R: Request>(&mut self, version: i16, request: &R) -> R::Response {
        self.correlation_id += 1;
        let key = ApiKey::try_from(R::KEY).unwrap();
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("frames-test")));
        let mut frame = BytesMut::new();
        frame.put_i32(0);
        header
            .encode(&mut frame, key.request_header_version(version))
            .unwrap();
        request.encode(&mut frame, version).unwrap();
        let size = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        tokio::time::timeout(STEP, self.stream.write_all(&frame))
            .await
            .unwrap()
            .unwrap();
        let mut body = self.read_frame().await.expect("a response");
        let header =
            ResponseHeader::decode(&mut body, key.response_header_version(version)).unwrap();
        assert_eq!(header.correlation_id, self.correlation_id);
        R::Response::decode(&mut body, version).unwrap()
    }

    /// One response frame's body, or `None` when the broker closed the connection.
    async fn read_frame(&mut self) -> Option<Bytes> {
        let mut size = [0u8; 4];
        match tokio::time::timeout(STEP, self.stream.read_exact(&mut size))
            .await
            .expect("the broker answers or closes within STEP")
        {
            Ok(_) => {}
            Err(_) => return None,
        }
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut body).await.ok()?;
        Some(Bytes::from(body))
    }
}

fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// A good client's whole round: versions, create, produce, fetch.
async fn good_client_round(env: &Env, name: &str) {
    let mut c = env.connect().await;
    let versions = c.call(3, &ApiVersionsRequest::default()).await;
    assert_eq!(versions.error_code, 0);
    assert!(
        versions
            .api_keys
            .iter()
            .any(|k| k.api_key == ApiKey::Produce as i16 && k.max_version >= 9)
    );
    let created = c
        .call(
            5,
            &CreateTopicsRequest::default().with_topics(vec![
                create_topics_request::CreatableTopic::default()
                    .with_name(topic(name))
                    .with_num_partitions(1)
                    .with_replication_factor(1),
            ]),
        )
        .await;
    assert_eq!(created.topics[0].error_code, 0, "{:?}", created.topics[0]);
    let metadata = c
        .call(
            9,
            &MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(topic(name))),
            ])),
        )
        .await;
    assert_eq!(metadata.brokers[0].port, env.kafka.port() as i32);
    assert_eq!(metadata.topics[0].error_code, 0);
    assert_eq!(metadata.topics[0].partitions[0].leader_id.0, 0);

    let mut batch = BatchBuilder::new(Compression::None);
    for i in 0..3 {
        batch.push(&Record::from_value(
            Bytes::from(format!("value-{i}")),
            1_700_000_000_000,
        ));
    }
    let produced = c
        .call(
            9,
            &ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![
                    produce_request::TopicProduceData::default()
                        .with_name(topic(name))
                        .with_partition_data(vec![
                            produce_request::PartitionProduceData::default()
                                .with_index(0)
                                .with_records(Some(batch.build())),
                        ]),
                ]),
        )
        .await;
    let p = &produced.responses[0].partition_responses[0];
    assert_eq!(p.error_code, 0, "{p:?}");
    assert_eq!(p.base_offset, 0);

    let fetched = c
        .call(
            12,
            &FetchRequest::default()
                .with_max_wait_ms(100)
                .with_max_bytes(1 << 20)
                .with_topics(vec![
                    fetch_request::FetchTopic::default()
                        .with_topic(topic(name))
                        .with_partitions(vec![
                            fetch_request::FetchPartition::default()
                                .with_partition(0)
                                .with_fetch_offset(0)
                                .with_partition_max_bytes(1 << 20),
                        ]),
                ]),
        )
        .await;
    let p = &fetched.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "{p:?}");
    assert_eq!(p.high_watermark, 3);
    let records = p.records.clone().unwrap();
    let view = rill_proto::batch::BatchView::new(&records).unwrap();
    assert_eq!(view.records().unwrap().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_client_creates_produces_and_fetches() {
    let env = Env::start().await;
    good_client_round(&env, "frames-good").await;
    env.stop().await;
}

/// KIP-320: a consumer asks where its leader epoch ends (after a leader
/// change); an api the listener does not serve gets UNSUPPORTED_VERSION; a
/// client asking for SASL is told no mechanism is enabled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_epochs_are_answered_unsupported_apis_refused_and_sasl_declined() {
    let env = Env::start().await;
    good_client_round(&env, "epochs").await;
    let mut c = env.connect().await;
    let ask = |current: i32, epoch: i32| {
        OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(topic("epochs"))
                    .with_partitions(vec![
                        offset_for_leader_epoch_request::OffsetForLeaderPartition::default()
                            .with_partition(0)
                            .with_current_leader_epoch(current)
                            .with_leader_epoch(epoch),
                    ]),
            ])
    };
    // No current epoch known (-1): not fenced; the epoch ends at the log end.
    let r = c.call(4, &ask(-1, 0)).await;
    let p = &r.topics[0].partitions[0];
    assert_eq!(
        (p.error_code, p.leader_epoch, p.end_offset),
        (0, 0, 3),
        "{p:?}"
    );
    // A current epoch from the future: UNKNOWN_LEADER_EPOCH (75).
    let r = c.call(4, &ask(99, 0)).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 75);
    // A replica id: not from a Kafka client (CLUSTER_AUTHORIZATION_FAILED).
    let r = c.call(4, &ask(-1, 0).with_replica_id(BrokerId(1))).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 31);
    // An api this listener does not serve: UNSUPPORTED_VERSION in its own
    // response, per partition, and the connection keeps serving.
    let r = c
        .call(
            2,
            &DeleteRecordsRequest::default().with_topics(vec![
                delete_records_request::DeleteRecordsTopic::default()
                    .with_name(topic("epochs"))
                    .with_partitions(vec![
                        delete_records_request::DeleteRecordsPartition::default()
                            .with_partition_index(0)
                            .with_offset(1),
                    ]),
            ]),
        )
        .await;
    assert_eq!(r.topics[0].partitions[0].error_code, 35, "{r:?}");
    // CreatePartitions: the count grows; it cannot shrink, and assignments
    // chosen by the client are refused, each naming why.
    let grow = |count: i32| {
        CreatePartitionsRequest::default().with_topics(vec![
            create_partitions_request::CreatePartitionsTopic::default()
                .with_name(topic("epochs"))
                .with_count(count),
        ])
    };
    let r = c.call(3, &grow(4)).await;
    assert_eq!(r.results[0].error_code, 0, "{r:?}");
    let r = c.call(3, &grow(2)).await;
    assert_eq!(r.results[0].error_code, 37, "INVALID_PARTITIONS: {r:?}");
    assert!(
        r.results[0]
            .error_message
            .as_ref()
            .is_some_and(|m| m.contains("has 4 partitions")),
        "{r:?}"
    );
    let mut with_assignment = grow(5);
    with_assignment.topics[0].assignments = Some(vec![
        create_partitions_request::CreatePartitionsAssignment::default()
            .with_broker_ids(vec![BrokerId(0)]),
    ]);
    let r = c.call(3, &with_assignment).await;
    assert_eq!(r.results[0].error_code, 42, "INVALID_REQUEST: {r:?}");
    let md = c
        .call(
            9,
            &MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(topic("epochs"))),
            ])),
        )
        .await;
    assert_eq!(md.topics[0].partitions.len(), 4, "{md:?}");
    // DescribeProducers: an idempotent producer's last sequence, per partition.
    let init = c
        .call(
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(-1)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )
        .await;
    assert_eq!(init.error_code, 0, "{init:?}");
    let pid = init.producer_id.0;
    let mut batch = BatchBuilder::new(Compression::None).producer(
        rill_proto::ProducerId(pid),
        init.producer_epoch,
        0,
    );
    for i in 0..2 {
        batch.push(&Record::from_value(
            Bytes::from(format!("p{i}")),
            1_700_000_000_000,
        ));
    }
    let produced = c
        .call(
            9,
            &ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(5000)
                .with_topic_data(vec![
                    produce_request::TopicProduceData::default()
                        .with_name(topic("epochs"))
                        .with_partition_data(vec![
                            produce_request::PartitionProduceData::default()
                                .with_index(3)
                                .with_records(Some(batch.build())),
                        ]),
                ]),
        )
        .await;
    assert_eq!(produced.responses[0].partition_responses[0].error_code, 0);
    let r = c
        .call(
            0,
            &DescribeProducersRequest::default().with_topics(vec![
                describe_producers_request::TopicRequest::default()
                    .with_name(topic("epochs"))
                    .with_partition_indexes(vec![3, 0, 99]),
            ]),
        )
        .await;
    let parts = &r.topics[0].partitions;
    assert_eq!(parts[0].error_code, 0, "{r:?}");
    let p = &parts[0].active_producers;
    assert_eq!(p.len(), 1, "{r:?}");
    assert_eq!(
        (p[0].producer_id.0, p[0].last_sequence, p[0].last_timestamp),
        (pid, 1, 1_700_000_000_000)
    );
    assert!(parts[1].active_producers.is_empty(), "{r:?}");
    assert_eq!(parts[2].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION: {r:?}");
    let r = c
        .call(
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await;
    assert_eq!(r.error_code, 33, "UNSUPPORTED_SASL_MECHANISM");
    assert!(r.mechanisms.is_empty());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_api_versions_version_is_answered_at_version_0() {
    let env = Env::start().await;
    let mut c = env.connect().await;
    // ApiVersions v99: the header says so; the body is whatever.
    let mut frame = BytesMut::new();
    frame.put_i32(0);
    frame.put_i16(ApiKey::ApiVersions as i16);
    frame.put_i16(99);
    frame.put_i32(7);
    frame.put_i16(-1);
    frame.put_u8(0);
    let size = (frame.len() - 4) as i32;
    frame[..4].copy_from_slice(&size.to_be_bytes());
    c.stream.write_all(&frame).await.unwrap();
    let mut body = c
        .read_frame()
        .await
        .expect("an answer, not a closed connection");
    let header = ResponseHeader::decode(&mut body, 0).unwrap();
    assert_eq!(header.correlation_id, 7);
    let response = ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(response.error_code, 35, "UNSUPPORTED_VERSION");
    assert!(!response.api_keys.is_empty());
    env.stop().await;
}

/// Array counts far beyond the frame (i32::MAX, a huge varint) right after a
/// valid header of every api and version we serve, behind a few bytes of
/// other fields: decoding must refuse them, not try to allocate them (the
/// kafka-protocol 0.18.0 release would ask for gigabytes and abort).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_counts_beyond_the_frame_are_refused_without_allocating() {
    let env = Env::start().await;
    let bomb = [0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07];
    for (key, min, max) in rill_kafka::SUPPORTED {
        for version in *min..=*max {
            for filler in [0x00u8, 0xff] {
                for prefix in 0..9 {
                    let header = RequestHeader::default()
                        .with_request_api_key(*key as i16)
                        .with_request_api_version(version)
                        .with_correlation_id(1);
                    let mut frame = BytesMut::new();
                    frame.put_i32(0);
                    header
                        .encode(&mut frame, key.request_header_version(version))
                        .unwrap();
                    frame.put_bytes(filler, prefix);
                    frame.extend_from_slice(&bomb);
                    let size = (frame.len() - 4) as i32;
                    frame[..4].copy_from_slice(&size.to_be_bytes());
                    let mut stream = TcpStream::connect(env.kafka).await.unwrap();
                    let _ = stream.write_all(&frame).await;
                    // A frame that happens to decode is answered; then the
                    // broker sees the end of the stream and closes.
                    let _ = stream.shutdown().await;
                    let mut sink = Vec::new();
                    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut sink))
                        .await
                        .expect("the broker answers or closes within STEP");
                }
            }
        }
    }
    good_client_round(&env, "frames-after-bombs").await;
    env.stop().await;
}

/// A frame that is random after a plausible header, or cut short, or claims
/// an absurd size: each closes its own connection (or is answered), the broker
/// never falls over, and a good client is served afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_truncated_frames_leave_the_broker_serving() {
    let env = Env::start().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let keys: Vec<i16> = (0..=75).collect();
    for round in 0..400 {
        let mut stream = TcpStream::connect(env.kafka).await.unwrap();
        let mut frame = BytesMut::new();
        match round % 4 {
            // A plausible header for a real api and version, then random bytes.
            0 | 1 => {
                let key = keys[rng.random_range(0..keys.len())];
                let body_len = rng.random_range(0..200);
                frame.put_i32(8 + body_len);
                frame.put_i16(key);
                frame.put_i16(rng.random_range(-1..16));
                frame.put_i32(round);
                for _ in 0..body_len {
                    frame.put_u8(rng.random());
                }
                // Array lengths the size of the frame and beyond.
                if round % 8 == 1 {
                    frame.put_i32(i32::MAX);
                }
            }
            // Entirely random, size included.
            2 => {
                for _ in 0..rng.random_range(1..64) {
                    frame.put_u8(rng.random());
                }
            }
            // A size that promises more than is sent, then the client leaves.
            _ => {
                frame.put_i32(1000);
                frame.put_i16(ApiKey::Metadata as i16);
                frame.put_i16(9);
            }
        }
        let _ = stream.write_all(&frame).await;
        let _ = stream.shutdown().await;
        // Read until the broker answers or closes (bounded).
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut sink))
            .await
            .expect("the broker closes a bad connection within STEP");
    }
    // Frames larger than max_request_bytes are refused before being read.
    let mut stream = TcpStream::connect(env.kafka).await.unwrap();
    stream.write_all(&i32::MAX.to_be_bytes()).await.unwrap();
    let mut sink = Vec::new();
    let n = tokio::time::timeout(STEP, stream.read_to_end(&mut sink))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "an oversized frame closes the connection");

    good_client_round(&env, "frames-after-fuzz").await;
    env.stop().await;
}

/// Metadata v12 (with topic ids) of one topic.
async fn metadata_v12(c: &mut Client, name: &str) -> MetadataResponse {
    c.call(
        12,
        &MetadataRequest::default().with_topics(Some(vec![
            metadata_request::MetadataRequestTopic::default().with_name(Some(topic(name))),
        ])),
    )
    .await
}

/// Answers older versions cannot carry a field of are encoded without it, not
/// dropped with the connection (DescribeGroups' error message is a field of
/// v6 on; Kafka 3.x clients speak v5), and DeleteTopics v6 deletes a topic
/// named by the id Metadata answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_versions_get_their_errors_and_topics_are_deleted_by_id() {
    let env = Env::start().await;
    good_client_round(&env, "by-id").await;
    let mut c = env.connect().await;
    for version in [5, 6] {
        let described = c
            .call(
                version,
                &DescribeGroupsRequest::default()
                    .with_groups(vec![GroupId(StrBytes::from_static_str(""))]),
            )
            .await;
        let g = &described.groups[0];
        assert_ne!(g.error_code, 0, "v{version}: {g:?}");
        assert_eq!(g.error_message.is_some(), version >= 6, "v{version}: {g:?}");
    }
    // A KIP-848 member committing with an epoch the coordinator does not hold
    // is told STALE_MEMBER_EPOCH (113), which Kafka's consumers retry after
    // their next heartbeat (FENCED_MEMBER_EPOCH fails the Java consumer's commit).
    let joined = c
        .call(
            0,
            &ConsumerGroupHeartbeatRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g848")))
                .with_member_epoch(0)
                .with_rebalance_timeout_ms(5000)
                .with_subscribed_topic_names(Some(vec![topic("by-id")]))
                .with_topic_partitions(Some(Vec::new())),
        )
        .await;
    assert_eq!(joined.error_code, 0, "{joined:?}");
    let member = joined.member_id.clone().expect("a member id");
    let committed = c
        .call(
            8,
            &OffsetCommitRequest::default()
                .with_group_id(GroupId(StrBytes::from_static_str("g848")))
                .with_member_id(member)
                .with_generation_id_or_member_epoch(joined.member_epoch + 7)
                .with_topics(vec![
                    offset_commit_request::OffsetCommitRequestTopic::default()
                        .with_name(topic("by-id"))
                        .with_partitions(vec![
                            offset_commit_request::OffsetCommitRequestPartition::default()
                                .with_partition_index(0)
                                .with_committed_offset(1),
                        ]),
                ]),
        )
        .await;
    assert_eq!(
        committed.topics[0].partitions[0].error_code, 113,
        "{committed:?}"
    );
    // The connection still serves.
    let metadata = metadata_v12(&mut c, "by-id").await;
    let id = metadata.topics[0].topic_id;
    assert!(!id.is_nil(), "{:?}", metadata.topics[0]);
    let unknown = uuid::Uuid::from_u128(0x1234);
    let deleted = c
        .call(
            6,
            &DeleteTopicsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![
                    delete_topics_request::DeleteTopicState::default().with_topic_id(id),
                    delete_topics_request::DeleteTopicState::default().with_topic_id(unknown),
                ]),
        )
        .await;
    let by_id = |want| {
        deleted
            .responses
            .iter()
            .find(|r| r.topic_id == want)
            .unwrap_or_else(|| panic!("no answer for {want}: {deleted:?}"))
    };
    let ok = by_id(id);
    assert_eq!(ok.error_code, 0, "{ok:?}");
    assert_eq!(
        ok.name.as_ref().map(|n| n.0.to_string()).as_deref(),
        Some("by-id")
    );
    assert_eq!(by_id(unknown).error_code, 100, "UNKNOWN_TOPIC_ID");
    let metadata = metadata_v12(&mut c, "by-id").await;
    assert_eq!(
        metadata.topics[0].error_code, 3,
        "deleted: {:?}",
        metadata.topics[0]
    );
    env.stop().await;
}

/// DescribeTransactions and ListTransactions (what `kafka-transactions.sh`
/// uses) show a transaction open, then committed; unknown ids and states
/// are named as Kafka names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_apis_describe_and_list_transactions() {
    let env = Env::start().await;
    good_client_round(&env, "txn-admin").await;
    let mut c = env.connect().await;
    let id = || TransactionalId(StrBytes::from_static_str("tx-admin"));
    let init = c
        .call(
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(Some(id()))
                .with_transaction_timeout_ms(60_000),
        )
        .await;
    assert_eq!(init.error_code, 0, "{init:?}");
    let added = c
        .call(
            3,
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(id())
                .with_v3_and_below_producer_id(init.producer_id)
                .with_v3_and_below_producer_epoch(init.producer_epoch)
                .with_v3_and_below_topics(vec![
                    add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                        .with_name(topic("txn-admin"))
                        .with_partitions(vec![0]),
                ]),
        )
        .await;
    let code = added.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code;
    assert_eq!(code, 0, "{added:?}");
    let describe = |ids: Vec<TransactionalId>| {
        DescribeTransactionsRequest::default().with_transactional_ids(ids)
    };
    let unknown = TransactionalId(StrBytes::from_static_str("tx-nobody"));
    let described = c.call(0, &describe(vec![id(), unknown.clone()])).await;
    let open = &described.transaction_states[0];
    assert_eq!(open.error_code, 0, "{open:?}");
    assert_eq!(open.transaction_state.as_str(), "Ongoing");
    assert_eq!(open.producer_id, init.producer_id);
    assert_eq!(open.transaction_timeout_ms, 60_000);
    assert!(open.transaction_start_time_ms > 0, "{open:?}");
    assert_eq!(open.topics.len(), 1, "{open:?}");
    assert_eq!(open.topics[0].topic.0.as_str(), "txn-admin");
    assert_eq!(open.topics[0].partitions, vec![0]);
    assert_eq!(
        described.transaction_states[1].error_code, 105,
        "TRANSACTIONAL_ID_NOT_FOUND: {:?}",
        described.transaction_states[1]
    );
    let list = |states: &[&'static str], duration: i64| {
        ListTransactionsRequest::default()
            .with_state_filters(
                states
                    .iter()
                    .map(|s| StrBytes::from_static_str(s))
                    .collect(),
            )
            .with_duration_filter(duration)
    };
    let ids_of = |r: &ListTransactionsResponse| -> Vec<(String, String)> {
        r.transaction_states
            .iter()
            .map(|t| {
                (
                    t.transactional_id.0.to_string(),
                    t.transaction_state.to_string(),
                )
            })
            .collect()
    };
    let listed = c.call(1, &list(&[], -1)).await;
    assert_eq!(listed.error_code, 0, "{listed:?}");
    assert_eq!(ids_of(&listed), [("tx-admin".into(), "Ongoing".into())]);
    let listed = c.call(1, &list(&["CompleteCommit", "Bogus"], -1)).await;
    assert!(ids_of(&listed).is_empty(), "{listed:?}");
    assert_eq!(listed.unknown_state_filters.len(), 1, "{listed:?}");
    assert_eq!(listed.unknown_state_filters[0].as_str(), "Bogus");
    // Open for less than an hour: not listed by a one-hour duration filter.
    assert!(ids_of(&c.call(1, &list(&[], 3_600_000)).await).is_empty());
    let ended = c
        .call(
            3,
            &EndTxnRequest::default()
                .with_transactional_id(id())
                .with_producer_id(init.producer_id)
                .with_producer_epoch(init.producer_epoch)
                .with_committed(true),
        )
        .await;
    assert_eq!(ended.error_code, 0, "{ended:?}");
    let done = c.call(0, &describe(vec![id()])).await;
    let done = &done.transaction_states[0];
    assert_eq!(
        done.transaction_state.as_str(),
        "CompleteCommit",
        "{done:?}"
    );
    assert_eq!(done.transaction_start_time_ms, -1);
    assert!(done.topics.is_empty(), "{done:?}");
    let listed = c.call(0, &list(&["CompleteCommit"], -1)).await;
    assert_eq!(
        ids_of(&listed),
        [("tx-admin".into(), "CompleteCommit".into())]
    );
    env.stop().await;
}
