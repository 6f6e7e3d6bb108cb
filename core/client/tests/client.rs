//! End-to-end tests of rill-client against an embedded rill-broker on loopback
//! (127.0.0.1:0, temp data dir, temp Rill home). Every step is bounded by `STEP`.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use rill_broker::{Broker, BrokerConfig, BrokerHandle};
use rill_client::partitioner::partition_for_key;
use rill_client::{
    Acks, Client, ClientConfig, ClientError, Compression, ConsumerConfig, ConsumerRecord,
    ErrorCode, NewTopic, Offset, ProducerConfig, ProducerRecord, TopicPartition,
};

/// Bound on every test step, so a hang fails instead of blocking.
const STEP: Duration = Duration::from_secs(60);

async fn step<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {STEP:?}"))
}

struct Env {
    data: tempfile::TempDir,
    home: tempfile::TempDir,
    broker: Option<BrokerHandle>,
}

impl Env {
    async fn start() -> Env {
        let data = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let config = BrokerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            data_dir: data.path().to_path_buf(),
            rill_home: Some(home.path().to_path_buf()),
            shutdown_timeout_ms: 5000,
            ..BrokerConfig::default()
        };
        let broker = step("broker start", Broker::start(config)).await.unwrap();
        Env {
            data,
            home,
            broker: Some(broker),
        }
    }

    fn config(&self) -> ClientConfig {
        let addr = self.broker.as_ref().unwrap().local_addr();
        let mut c = ClientConfig::new(addr.to_string());
        c.tls = rill_net::ClientTls::Dev {
            home: self.home.path().to_path_buf(),
        };
        c
    }

    async fn client(&self) -> Client {
        step("client connect", Client::connect(self.config()))
            .await
            .unwrap()
    }

    /// Stops the broker and starts a new one on the same address and data.
    async fn restart(&mut self) {
        let old = self.broker.take().unwrap();
        let addr = old.local_addr();
        step("broker shutdown", old.shutdown()).await.unwrap();
        let config = BrokerConfig {
            listen: addr,
            data_dir: self.data.path().to_path_buf(),
            rill_home: Some(self.home.path().to_path_buf()),
            shutdown_timeout_ms: 5000,
            ..BrokerConfig::default()
        };
        // The old endpoint's socket is released when quinn's driver task ends,
        // just after `shutdown` returns; on a loaded machine a bind right away
        // can still find the port taken. Retry that one error, bounded.
        let deadline = tokio::time::Instant::now() + STEP;
        let broker = loop {
            match step("broker restart", Broker::start(config.clone())).await {
                Err(rill_broker::BrokerError::Bind { .. })
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other.unwrap(),
            }
        };
        self.broker = Some(broker);
    }

    async fn shutdown(mut self) {
        if let Some(b) = self.broker.take() {
            step("broker shutdown", b.shutdown()).await.unwrap();
        }
    }
}

fn topic(name: &str, partitions: u32) -> NewTopic {
    NewTopic {
        name: name.into(),
        partitions: Some(partitions),
        replication_factor: None,
        configs: vec![],
    }
}

/// Polls until `n` records arrived (or fails after STEP).
async fn consume_n(consumer: &mut rill_client::Consumer, n: usize) -> Vec<ConsumerRecord> {
    let mut out = Vec::with_capacity(n);
    step("consume", async {
        while out.len() < n {
            out.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
        }
    })
    .await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_round_trip_in_partition_order() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("keyed", 3)))
        .await
        .unwrap();
    let producer = client.producer(ProducerConfig::default()).unwrap();
    const N: usize = 3000;
    let mut deliveries = Vec::with_capacity(N);
    for i in 0..N {
        let rec = ProducerRecord::new("keyed", format!("value-{i}"))
            .key(format!("key-{}", i % 37))
            .header("seq", i.to_string());
        deliveries.push(step("send", producer.send(rec)).await.unwrap());
    }
    step("flush", producer.flush()).await.unwrap();
    let mut sent_partition = HashMap::new();
    for (i, d) in deliveries.into_iter().enumerate() {
        let meta = step("delivery", d).await.unwrap();
        let key = format!("key-{}", i % 37);
        // Stable: the same key always lands in the same partition, Kafka's way.
        assert_eq!(meta.partition, partition_for_key(key.as_bytes(), 3));
        assert_eq!(
            *sent_partition.entry(key).or_insert(meta.partition),
            meta.partition
        );
        assert!(meta.offset.0 >= 0);
    }
    producer.close().await.unwrap();

    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    let tps = step("assign", consumer.assign_topic("keyed"))
        .await
        .unwrap();
    assert_eq!(tps.len(), 3);
    let records = consume_n(&mut consumer, N).await;
    assert_eq!(records.len(), N);
    let mut last_seq: HashMap<u32, (i64, usize)> = HashMap::new();
    for r in &records {
        let seq: usize = std::str::from_utf8(&r.headers[0].value)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(r.headers[0].key, "seq");
        assert_eq!(r.value.as_deref(), Some(format!("value-{seq}").as_bytes()));
        assert_eq!(
            r.key.as_deref(),
            Some(format!("key-{}", seq % 37).as_bytes())
        );
        assert_eq!(&*r.topic, "keyed");
        if let Some((off, prev)) = last_seq.get(&r.partition) {
            assert_eq!(
                r.offset.0,
                off + 1,
                "offsets are consecutive in {}",
                r.partition
            );
            assert!(
                seq > *prev,
                "send order kept within partition {}",
                r.partition
            );
        } else {
            assert_eq!(r.offset, Offset(0));
        }
        last_seq.insert(r.partition, (r.offset.0, seq));
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acks_level_delivers() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("acks", 2)))
        .await
        .unwrap();
    for acks in [Acks::None, Acks::Leader, Acks::All] {
        let producer = client
            .producer(ProducerConfig {
                acks,
                ..ProducerConfig::default()
            })
            .unwrap();
        let mut ds = Vec::new();
        for i in 0..200 {
            ds.push(
                producer
                    .send(ProducerRecord::new("acks", format!("{acks:?}-{i}")))
                    .await
                    .unwrap(),
            );
        }
        for d in ds {
            let meta = step("delivery", d).await.unwrap();
            if acks == Acks::None {
                assert_eq!(meta.offset, Offset(-1));
            } else {
                assert!(meta.offset.0 >= 0);
            }
        }
        step("close", producer.close()).await.unwrap();
    }
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    consumer.assign_topic("acks").await.unwrap();
    let records = consume_n(&mut consumer, 600).await;
    for level in ["None", "Leader", "All"] {
        let n = records
            .iter()
            .filter(|r| r.value.as_ref().unwrap().starts_with(level.as_bytes()))
            .count();
        assert_eq!(n, 200, "records sent with acks {level}");
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_seeks_to_offset_timestamp_and_end() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("seek", 1)))
        .await
        .unwrap();
    let producer = client
        .producer(ProducerConfig {
            batch_size: 512, // many batches, so seeks land inside batches
            ..ProducerConfig::default()
        })
        .unwrap();
    for i in 0..100i64 {
        drop(
            producer
                .send(ProducerRecord::new("seek", format!("v{i}")).timestamp(1_000_000 + i * 10))
                .await
                .unwrap(),
        );
    }
    producer.flush().await.unwrap();
    let tp = TopicPartition::new("seek", 0);
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    consumer.assign(vec![tp.clone()]);

    consumer.seek(&tp, Offset(57)).unwrap();
    let got = step("poll", consumer.poll(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(
        got[0].offset,
        Offset(57),
        "records below the seek offset are skipped"
    );
    assert_eq!(got[0].value.as_deref(), Some(&b"v57"[..]));

    step(
        "seek ts",
        consumer.seek_to_timestamp(1_000_000 + 70 * 10 - 5),
    )
    .await
    .unwrap();
    assert_eq!(consumer.position(&tp).await.unwrap(), Offset(70));
    let got = step("poll", consumer.poll(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(got[0].offset, Offset(70));
    assert_eq!(got[0].timestamp_ms, 1_000_700);

    step("seek end", consumer.seek_to_end(std::slice::from_ref(&tp)))
        .await
        .unwrap();
    assert_eq!(consumer.position(&tp).await.unwrap(), Offset(100));
    producer
        .send_and_wait(ProducerRecord::new("seek", "after-end"))
        .await
        .unwrap();
    // Nothing after the end until then: told by the event, not by a quiet
    // window, as the first thing the consumer returns is the new record alone.
    let got = consume_n(&mut consumer, 1).await;
    let offsets: Vec<Offset> = got.iter().map(|r| r.offset).collect();
    assert_eq!(
        offsets,
        [Offset(100)],
        "nothing after the end but the new record"
    );
    assert_eq!(got[0].offset, Offset(100));
    assert_eq!(got[0].value.as_deref(), Some(&b"after-end"[..]));

    step(
        "seek beginning",
        consumer.seek_to_beginning(std::slice::from_ref(&tp)),
    )
    .await
    .unwrap();
    let all = consume_n(&mut consumer, 101).await;
    let offsets: Vec<i64> = all.iter().map(|r| r.offset.0).collect();
    assert_eq!(offsets, (0..101).collect::<Vec<_>>());
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_buffer_memory_still_delivers_everything() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("pressure", 2)))
        .await
        .unwrap();
    let producer = client
        .producer(ProducerConfig {
            buffer_memory: 4096,
            batch_size: 1024,
            ..ProducerConfig::default()
        })
        .unwrap();
    const N: usize = 2000;
    let value = Bytes::from(vec![b'x'; 100]);
    let mut ds = Vec::with_capacity(N);
    for _ in 0..N {
        // Each send waits for space: at most ~4 KiB is ever buffered.
        ds.push(
            step(
                "send",
                producer.send(ProducerRecord::new("pressure", value.clone())),
            )
            .await
            .unwrap(),
        );
    }
    for d in ds {
        step("delivery", d).await.unwrap();
    }
    producer.close().await.unwrap();
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    consumer.assign_topic("pressure").await.unwrap();
    let records = consume_n(&mut consumer, N).await;
    assert_eq!(records.len(), N);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_queues_every_record_where_send_would_or_none() {
    let env = Env::start().await;
    let client = env.client().await;
    for t in [topic("many-a", 3), topic("many-b", 1)] {
        step("create", client.admin().create_topic(t))
            .await
            .unwrap();
    }
    let producer = client.producer(ProducerConfig::default()).unwrap();
    assert!(
        step("empty", producer.send_all(Vec::new()))
            .await
            .unwrap()
            .is_empty()
    );

    // Keyed records to a and to b, keyless ones to a: the topic (and its
    // partition count) changes twice within one call.
    const N: usize = 1000;
    let records: Vec<_> = (0..N)
        .map(|i| match i {
            0..400 => ProducerRecord::new("many-a", format!("v-{i}")).key(format!("k-{}", i % 11)),
            400..500 => ProducerRecord::new("many-b", format!("v-{i}")).key(format!("k-{i}")),
            _ => ProducerRecord::new("many-a", format!("v-{i}")),
        })
        .collect();
    let futures = step("send_all", producer.send_all(records)).await.unwrap();
    assert_eq!(futures.len(), N);
    let mut last: HashMap<(String, u32), i64> = HashMap::new();
    for (i, f) in futures.into_iter().enumerate() {
        let meta = step("delivery", f).await.unwrap();
        match i {
            0..400 => assert_eq!(
                meta.partition,
                partition_for_key(format!("k-{}", i % 11).as_bytes(), 3)
            ),
            400..500 => assert_eq!((&*meta.topic, meta.partition), ("many-b", 0)),
            _ => assert_eq!(&*meta.topic, "many-a"),
        }
        // In send order within each partition.
        let prev = last.insert((meta.topic.to_string(), meta.partition), meta.offset.0);
        assert!(
            prev.is_none_or(|p| p < meta.offset.0),
            "record {i}: {meta:?}"
        );
    }
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    let mut tps = step("assign a", consumer.assign_topic("many-a"))
        .await
        .unwrap();
    tps.push(TopicPartition::new("many-b", 0));
    consumer.assign(tps);
    let mut values: Vec<_> = consume_n(&mut consumer, N)
        .await
        .iter()
        .map(|r| String::from_utf8(r.value.as_deref().unwrap().to_vec()).unwrap())
        .collect();
    values.sort();
    let mut expected: Vec<_> = (0..N).map(|i| format!("v-{i}")).collect();
    expected.sort();
    assert_eq!(values, expected);

    // A bad record anywhere in the call: nothing of the call is queued.
    let err = step(
        "bad partition",
        producer.send_all(vec![
            ProducerRecord::new("many-b", "queued?").partition(0),
            ProducerRecord::new("many-b", "x").partition(5),
        ]),
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string().contains("partition 5 of topic many-b"),
        "{err}"
    );
    let err = step(
        "unknown topic",
        producer.send_all(vec![
            ProducerRecord::new("many-b", "queued?").partition(0),
            ProducerRecord::new("no-such-topic", "x"),
        ]),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ClientError::UnknownTopic(_)), "{err:?}");
    let next = step(
        "after the refused calls",
        producer.send_and_wait(ProducerRecord::new("many-b", "next").partition(0)),
    )
    .await
    .unwrap();
    assert_eq!(next.offset, Offset(100), "the refused calls queued nothing");
    producer.close().await.unwrap();

    // More than buffer_memory at once is refused with what to do; less goes.
    let small = client
        .producer(ProducerConfig {
            buffer_memory: 4096,
            ..ProducerConfig::default()
        })
        .unwrap();
    let many = |n| {
        (0..n)
            .map(|_| ProducerRecord::new("many-b", vec![b'x'; 100]).partition(0))
            .collect::<Vec<_>>()
    };
    let err = step("too much", small.send_all(many(100)))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("buffer_memory (4096 bytes)") && msg.contains("send fewer"),
        "{msg}"
    );
    for f in step("fits", small.send_all(many(20))).await.unwrap() {
        step("delivery", f).await.unwrap();
    }
    small.close().await.unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_clear() {
    let env = Env::start().await;
    let client = env.client().await;
    let producer = client.producer(ProducerConfig::default()).unwrap();

    // Unknown topic: refused at send, naming the topic and what to do.
    let err = producer
        .send(ProducerRecord::new("no-such-topic", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::UnknownTopic(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("no-such-topic") && msg.contains("rill topic create"),
        "{msg}"
    );

    // Creating twice: TOPIC_ALREADY_EXISTS with the topic in the context.
    let admin = client.admin();
    step("create", admin.create_topic(topic("dup", 1)))
        .await
        .unwrap();
    let err = admin.create_topic(topic("dup", 1)).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::TopicAlreadyExists));
    assert!(
        err.to_string()
            .starts_with("create topic dup: TOPIC_ALREADY_EXISTS"),
        "{err}"
    );

    // A partition that does not exist.
    let err = producer
        .send(ProducerRecord::new("dup", "x").partition(5))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("partition 5 of topic dup"),
        "{err}"
    );

    // A record over the topic's max.message.bytes fails only its own batch.
    step(
        "create small",
        admin.create_topic(NewTopic {
            configs: vec![("max.message.bytes".into(), "1000".into())],
            ..topic("small", 1)
        }),
    )
    .await
    .unwrap();
    let big = producer
        .send(ProducerRecord::new("small", vec![b'b'; 5000]))
        .await
        .unwrap();
    let err = step("big delivery", big).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::RecordTooLarge), "{err}");
    assert!(
        err.to_string().starts_with("produce to small-0 failed"),
        "{err}"
    );
    let ok = producer
        .send_and_wait(ProducerRecord::new("small", "fits"))
        .await
        .unwrap();
    assert_eq!(ok.offset, Offset(0));
    producer.close().await.unwrap();
    // Closed producers refuse.
    let err = producer
        .send(ProducerRecord::new("small", "late"))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Closed), "{err:?}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_from_the_far_future_fails_with_invalid_timestamp() {
    let env = Env::start().await;
    let client = env.client().await;
    let admin = client.admin();
    step("create", admin.create_topic(topic("future", 1)))
        .await
        .unwrap();
    let producer = client.producer(ProducerConfig::default()).unwrap();
    let far = producer
        .send(ProducerRecord::new("future", "late").timestamp(i64::MAX))
        .await
        .unwrap();
    let err = step("far delivery", far).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidTimestamp), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("produce to future-0")
            && msg.contains("INVALID_TIMESTAMP")
            && msg.contains("message.timestamp.after.max.ms"),
        "{msg}"
    );
    // Nothing was written: the next record is the partition's first.
    let ok = producer
        .send_and_wait(ProducerRecord::new("future", "now"))
        .await
        .unwrap();
    assert_eq!(ok.offset, Offset(0));
    producer.close().await.unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_says_what_to_do() {
    let home = tempfile::tempdir().unwrap();
    // A broker creates the dev CA; start and stop one so the CA exists.
    let env = Env::start().await;
    let mut config = env.config();
    config.tls = rill_net::ClientTls::Dev {
        home: env.home.path().to_path_buf(),
    };
    // A UDP port nobody listens on.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    drop(sock);
    config.bootstrap = vec![addr.to_string()];
    config.connect_timeout = Duration::from_millis(500);
    let err = step("connect", Client::connect(config)).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&addr.to_string()) && msg.contains("rill broker"),
        "{msg}"
    );
    drop(home);
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_batches_round_trip() {
    let env = Env::start().await;
    let client = env.client().await;
    for (name, codec) in [
        ("gzip", Compression::Gzip),
        ("snappy", Compression::Snappy),
        ("lz4", Compression::Lz4),
        ("zstd", Compression::Zstd),
    ] {
        step("create", client.admin().create_topic(topic(name, 1)))
            .await
            .unwrap();
        let producer = client
            .producer(ProducerConfig {
                compression: codec,
                ..ProducerConfig::default()
            })
            .unwrap();
        for i in 0..500 {
            let delivery = producer
                .send(
                    ProducerRecord::new(
                        name,
                        format!("compressible value {i} {}", "z".repeat(100)),
                    )
                    .key(format!("k{i}")),
                )
                .await
                .unwrap();
            drop(delivery);
        }
        producer.close().await.unwrap();
        let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
        consumer.assign_topic(name).await.unwrap();
        let records = consume_n(&mut consumer, 500).await;
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.offset, Offset(i as i64));
            assert_eq!(r.key.as_deref(), Some(format!("k{i}").as_bytes()));
            assert!(
                r.value
                    .as_ref()
                    .unwrap()
                    .starts_with(format!("compressible value {i} ").as_bytes())
            );
        }
    }
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_describes_and_alters() {
    let env = Env::start().await;
    let client = env.client().await;
    let admin = client.admin();
    step("create", admin.create_topic(topic("adm", 4)))
        .await
        .unwrap();
    assert!(
        admin
            .list_topics()
            .await
            .unwrap()
            .contains(&"adm".to_string())
    );
    let d = admin.describe_topic("adm").await.unwrap();
    assert_eq!(d.partitions.len(), 4);
    assert_eq!(d.replication_factor, 1);
    admin
        .alter_configs("adm", vec![("retention.ms".into(), "12345".into())], vec![])
        .await
        .unwrap();
    let configs = admin.describe_configs("adm").await.unwrap();
    let retention = configs.iter().find(|c| c.name == "retention.ms").unwrap();
    assert_eq!(retention.value, "12345");
    assert!(!retention.is_default);
    // The low-level call: any broker, typed response, empty payload.
    let (versions, payload) = client
        .call(
            None,
            &rill_proto::wire::ApiVersionsRequest {
                client_software: "test".into(),
            },
            &[],
        )
        .await
        .unwrap();
    assert_eq!(versions.broker_id, client.bootstrap_broker_id());
    assert!(payload.is_empty());
    let err = client
        .call(
            Some(42),
            &rill_proto::wire::MetadataRequest { topics: None },
            &[],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("broker 42"), "{err}");
    let cluster = admin.cluster().await.unwrap();
    assert_eq!(cluster.brokers.len(), 1);
    assert!(!cluster.cluster_id.is_empty());
    admin.delete_topic("adm").await.unwrap();
    assert!(
        !admin
            .list_topics()
            .await
            .unwrap()
            .contains(&"adm".to_string())
    );
    let err = admin.describe_topic("adm").await.unwrap_err();
    assert!(matches!(err, ClientError::UnknownTopic(_)), "{err:?}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_consumer_survive_a_broker_restart() {
    let mut env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("restart", 2)))
        .await
        .unwrap();
    let producer = client.producer(ProducerConfig::default()).unwrap();
    for i in 0..300 {
        drop(
            producer
                .send(ProducerRecord::new("restart", format!("a{i}")))
                .await
                .unwrap(),
        );
    }
    step("flush", producer.flush()).await.unwrap();
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    consumer.assign_topic("restart").await.unwrap();
    let before = consume_n(&mut consumer, 300).await;
    assert_eq!(before.len(), 300);

    env.restart().await;

    // The old connection is gone: requests fail, are retried, and reconnect.
    let mut ds = Vec::new();
    for i in 0..300 {
        ds.push(
            producer
                .send(ProducerRecord::new("restart", format!("b{i}")))
                .await
                .unwrap(),
        );
    }
    for d in ds {
        step("delivery after restart", d).await.unwrap();
    }
    let after = consume_n(&mut consumer, 300).await;
    assert!(
        after
            .iter()
            .all(|r| r.value.as_ref().unwrap().starts_with(b"b"))
    );
    producer.close().await.unwrap();
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_offsets_follow_the_reset_policy() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("range", 1)))
        .await
        .unwrap();
    let producer = client.producer(ProducerConfig::default()).unwrap();
    for i in 0..10 {
        drop(
            producer
                .send(ProducerRecord::new("range", format!("r{i}")))
                .await
                .unwrap(),
        );
    }
    producer.close().await.unwrap();
    let tp = TopicPartition::new("range", 0);

    // earliest: a seek past the end falls back to the first offset.
    let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
    consumer.assign(vec![tp.clone()]);
    consumer.seek(&tp, Offset(1000)).unwrap();
    let got = consume_n(&mut consumer, 10).await;
    assert_eq!(got[0].offset, Offset(0));

    // none: the error names the partition and the offset.
    let mut consumer = client
        .consumer(ConsumerConfig {
            auto_offset_reset: rill_client::OffsetReset::None,
            ..ConsumerConfig::default()
        })
        .unwrap();
    consumer.assign(vec![tp.clone()]);
    consumer.seek(&tp, Offset(1000)).unwrap();
    let err = step("poll out of range", async {
        loop {
            match consumer.poll(Duration::from_millis(200)).await {
                Ok(records) => assert!(records.is_empty()),
                Err(e) => break e,
            }
        }
    })
    .await;
    assert_eq!(err.code(), Some(ErrorCode::OffsetOutOfRange), "{err}");
    assert!(err.to_string().contains("range-0 at offset 1000"), "{err}");
    env.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_producer_still_delivers_what_was_sent() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("dropped", 1)))
        .await
        .unwrap();
    let producer = client
        .producer(ProducerConfig {
            linger: Duration::from_secs(3600), // only the drop can send these
            ..ProducerConfig::default()
        })
        .unwrap();
    let mut ds = Vec::new();
    for i in 0..50 {
        ds.push(
            producer
                .send(ProducerRecord::new("dropped", format!("d{i}")))
                .await
                .unwrap(),
        );
    }
    drop(producer);
    for (i, d) in ds.into_iter().enumerate() {
        let meta = step("delivery after drop", d).await.unwrap();
        assert_eq!(meta.offset, Offset(i as i64));
    }
    env.shutdown().await;
}

/// acks=0: once `close` returns, every record has reached the broker, even if
/// the client is dropped (its connections closed) right after. Several rounds,
/// each with a fresh client, because losing the tail is a race with the close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_none_close_then_drop_loses_nothing() {
    const ROUNDS: usize = 5;
    const N: usize = 20_000;
    const PAD: &str = concat!(
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
    );
    let pad = PAD.repeat(7);
    let env = Env::start().await;
    for round in 0..ROUNDS {
        let name = format!("acks0-{round}");
        {
            let client = env.client().await;
            step("create", client.admin().create_topic(topic(&name, 2)))
                .await
                .unwrap();
            let producer = client
                .producer(ProducerConfig {
                    acks: Acks::None,
                    ..ProducerConfig::default()
                })
                .unwrap();
            for i in 0..N {
                // ~1 KiB values: a fresh connection's congestion window cannot
                // keep up with the writes, so much is still queued in quinn at close.
                let record = ProducerRecord::new(name.as_str(), format!("{round}-{i:06}-{pad}"))
                    .partition((i % 2) as u32);
                drop(step("send", producer.send(record)).await.unwrap());
            }
            step("close", producer.close()).await.unwrap();
            drop(producer);
            drop(client);
        }
        let reader = env.client().await;
        let mut consumer = reader.consumer(ConsumerConfig::default()).unwrap();
        step("assign", consumer.assign_topic(&name)).await.unwrap();
        let records = consume_n(&mut consumer, N).await;
        assert_eq!(records.len(), N, "round {round}: every record arrives once");
        // Exactly once each, in its partition. (Order across requests is not
        // checked: with acks=0 the broker may handle two request streams of one
        // partition in either order.)
        let mut seen = vec![false; N];
        for r in &records {
            let value = std::str::from_utf8(r.value.as_deref().unwrap()).unwrap();
            let mut parts = value.split('-');
            let r_round = parts.next().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(r_round, round.to_string(), "{value}");
            assert_eq!(r.partition, (i % 2) as u32, "{value}");
            assert!(!seen[i], "round {round}: record {i} arrived twice");
            seen[i] = true;
        }
    }
    env.shutdown().await;
}

/// Reads every record of `topic` (partitions 0..n) up to its end as a
/// consumer with `isolation` sees it: the values, in offset order per partition.
async fn read_to_end(
    client: &Client,
    topic: &str,
    partitions: u32,
    isolation: rill_client::Isolation,
) -> Vec<String> {
    let mut consumer = client
        .consumer(ConsumerConfig {
            isolation,
            ..ConsumerConfig::default()
        })
        .unwrap();
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    consumer.assign(tps.clone());
    step("seek", consumer.seek_to_beginning(&tps))
        .await
        .unwrap();
    let mut out = Vec::new();
    // Two empty polls in a row after data: the end as this reader sees it.
    let mut empty = 0;
    step("read to end", async {
        while empty < 3 {
            let got = consumer.poll(Duration::from_millis(300)).await.unwrap();
            if got.is_empty() {
                empty += 1;
            } else {
                empty = 0;
            }
            out.extend(
                got.into_iter()
                    .map(|r| String::from_utf8(r.value.unwrap().to_vec()).unwrap()),
            );
        }
    })
    .await;
    out
}

fn txn_producer(client: &Client, id: &str) -> rill_client::Producer {
    client
        .producer(ProducerConfig {
            transactional_id: Some(id.into()),
            linger: Duration::from_millis(1),
            ..ProducerConfig::default()
        })
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_transactions_are_invisible_to_read_committed_readers() {
    use rill_client::Isolation::{ReadCommitted, ReadUncommitted};
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("txn", 2)))
        .await
        .unwrap();
    let producer = txn_producer(&client, "txn-abort");
    step("init", producer.init_transactions()).await.unwrap();

    step("begin", producer.begin_transaction()).await.unwrap();
    for i in 0..10 {
        producer
            .send(ProducerRecord::new("txn", format!("aborted-{i}")).partition(i % 2))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    step("abort", producer.abort_transaction()).await.unwrap();

    step("begin", producer.begin_transaction()).await.unwrap();
    for i in 0..6 {
        producer
            .send(ProducerRecord::new("txn", format!("committed-{i}")).partition(i % 2))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    step("commit", producer.commit_transaction()).await.unwrap();

    // An open transaction: read_committed readers stop before it.
    step("begin", producer.begin_transaction()).await.unwrap();
    producer
        .send(ProducerRecord::new("txn", "open").partition(0))
        .await
        .unwrap()
        .await
        .unwrap();
    step("flush", producer.flush()).await.unwrap();

    let mut committed = read_to_end(&client, "txn", 2, ReadCommitted).await;
    committed.sort();
    let mut want: Vec<String> = (0..6).map(|i| format!("committed-{i}")).collect();
    want.sort();
    assert_eq!(
        committed, want,
        "read_committed: only the committed transaction"
    );
    let all = read_to_end(&client, "txn", 2, ReadUncommitted).await;
    assert_eq!(all.len(), 17, "read_uncommitted sees every record: {all:?}");

    step("commit", producer.commit_transaction()).await.unwrap();
    let committed = read_to_end(&client, "txn", 2, ReadCommitted).await;
    assert_eq!(committed.len(), 7, "{committed:?}");
    assert!(committed.contains(&"open".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_producer_with_the_same_transactional_id_fences_the_first() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("zombie", 1)))
        .await
        .unwrap();
    let first = txn_producer(&client, "txn-zombie");
    step("init first", first.init_transactions()).await.unwrap();
    step("begin", first.begin_transaction()).await.unwrap();
    for i in 0..3 {
        first
            .send(ProducerRecord::new("zombie", format!("first-{i}")))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    step("flush", first.flush()).await.unwrap();

    // The first instance "pauses"; a second one with the same id starts: its
    // init aborts the first's open transaction and bumps the epoch.
    let second = txn_producer(&client, "txn-zombie");
    step("init second", second.init_transactions())
        .await
        .unwrap();
    step("begin", second.begin_transaction()).await.unwrap();
    for i in 0..2 {
        second
            .send(ProducerRecord::new("zombie", format!("second-{i}")))
            .await
            .unwrap()
            .await
            .unwrap();
    }
    step("commit second", second.commit_transaction())
        .await
        .unwrap();

    // The first resumes: its writes and its commit are refused as fenced.
    let late = first
        .send(ProducerRecord::new("zombie", "first-late"))
        .await
        .unwrap();
    let write = step("late write", late).await;
    assert!(write.is_err(), "a fenced producer's write was accepted");
    let err = step("commit first", first.commit_transaction())
        .await
        .unwrap_err();
    assert_eq!(
        err.txn_action(),
        rill_client::TxnAction::Fenced,
        "its write was refused as fenced, so it cannot commit: {err}"
    );
    // Its EndTxn at the old epoch is fenced at the coordinator too.
    let err = step("abort first", first.abort_transaction())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::ProducerFenced), "{err}");
    assert_eq!(err.txn_action(), rill_client::TxnAction::Fenced, "{err}");

    let seen = read_to_end(&client, "zombie", 1, rill_client::Isolation::ReadCommitted).await;
    assert_eq!(seen, vec!["second-0", "second-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_offsets_commit_with_the_transaction_and_not_with_an_abort() {
    let env = Env::start().await;
    let client = env.client().await;
    step("create", client.admin().create_topic(topic("txn-out", 1)))
        .await
        .unwrap();
    step("create", client.admin().create_topic(topic("txn-in", 1)))
        .await
        .unwrap();
    let producer = txn_producer(&client, "txn-offsets");
    step("init", producer.init_transactions()).await.unwrap();
    let input = TopicPartition::new("txn-in", 0);
    let committed = |client: Client| async move {
        client
            .admin()
            .committed_offsets("eos-group")
            .await
            .unwrap()
            .into_iter()
            .find(|(tp, _)| tp.topic == "txn-in" && tp.partition == 0)
            .map(|(_, o)| o)
    };

    // Aborted: neither the output nor the offset.
    step("begin", producer.begin_transaction()).await.unwrap();
    producer
        .send(ProducerRecord::new("txn-out", "out-a"))
        .await
        .unwrap()
        .await
        .unwrap();
    step(
        "offsets",
        producer.send_offsets_to_transaction("eos-group", &[(input.clone(), Offset(5))]),
    )
    .await
    .unwrap();
    step("abort", producer.abort_transaction()).await.unwrap();
    assert_eq!(committed(client.clone()).await, None);

    // Committed: both.
    step("begin", producer.begin_transaction()).await.unwrap();
    producer
        .send(ProducerRecord::new("txn-out", "out-b"))
        .await
        .unwrap()
        .await
        .unwrap();
    step(
        "offsets",
        producer.send_offsets_to_transaction("eos-group", &[(input.clone(), Offset(9))]),
    )
    .await
    .unwrap();
    // A read-committed member that takes the input partition over while
    // the transaction is open does not start from the group's committed
    // offset (none yet: it would start at the earliest, and read again what
    // the transaction consumed); it waits for the transaction (KIP-447).
    let plain = client.producer(ProducerConfig::default()).unwrap();
    for i in 0..12 {
        let sent = plain.send(ProducerRecord::new("txn-in", format!("in-{i}")));
        sent.await.unwrap().await.unwrap();
    }
    let mut config = rill_client::GroupConfig::new("eos-group", vec!["txn-in".into()]);
    config.auto_offset_reset = rill_client::OffsetReset::Earliest;
    config.enable_auto_commit = false;
    config.consumer.isolation = rill_client::Isolation::ReadCommitted;
    let mut member = step("join", client.group_consumer(config)).await.unwrap();
    let early = step("poll", member.poll(Duration::from_millis(1500)))
        .await
        .unwrap();
    assert!(
        early.is_empty(),
        "read from offset {:?} while the transaction held the group's offset",
        early.first().map(|r| r.offset)
    );
    // (It has the partition: it is waiting, not unassigned.)
    assert_eq!(member.assignment(), vec![input.clone()]);
    step("commit", producer.commit_transaction()).await.unwrap();
    assert_eq!(committed(client.clone()).await, Some(Offset(9)));
    let mut first = None;
    for _ in 0..20 {
        let got = step("poll", member.poll(Duration::from_millis(500)))
            .await
            .unwrap();
        if let Some(r) = got.first() {
            first = Some(r.offset);
            break;
        }
    }
    assert_eq!(
        first,
        Some(Offset(9)),
        "the member starts at the transaction's offset"
    );
    step("close", member.close()).await.unwrap();
    let seen = read_to_end(&client, "txn-out", 1, rill_client::Isolation::ReadCommitted).await;
    assert_eq!(seen, vec!["out-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_produce_requests_arrive_whole_in_small_and_large_packets() {
    // The broker keeps a request's large STREAM chunks as they arrived and
    // copies small ones together: with 1,200-byte packets every chunk is
    // copied, with loopback's 64 KiB packets most are kept, and batches and
    // records straddle chunks either way. Every byte must be stored as sent.
    let env = Env::start().await;
    for (i, packet) in [rill_net::UDP_PAYLOAD_MIN, rill_net::MTU_UPPER_BOUND_DEFAULT]
        .into_iter()
        .enumerate()
    {
        let mut config = env.config();
        config.max_udp_payload_bytes = packet;
        let client = step("client connect", Client::connect(config))
            .await
            .unwrap();
        let name = format!("pieces{i}");
        step("create", client.admin().create_topic(topic(&name, 2)))
            .await
            .unwrap();
        let producer = client
            .producer(ProducerConfig {
                batch_size: 256 * 1024,
                linger: Duration::from_millis(20),
                ..ProducerConfig::default()
            })
            .unwrap();
        // Values of uneven sizes whose bytes say where they belong.
        let value = |n: usize| -> Vec<u8> {
            let len = 100 + (n * 7919) % 3000;
            let mut v = (n as u32).to_be_bytes().to_vec();
            v.extend((0..len).map(|j| (n * 31 + j) as u8));
            v
        };
        let mut deliveries = Vec::new();
        for n in 0..3000 {
            deliveries.push(
                producer
                    .send(ProducerRecord::new(name.as_str(), value(n)).key(format!("k{}", n % 2)))
                    .await
                    .unwrap(),
            );
        }
        for d in deliveries {
            step("delivery", d).await.unwrap();
        }
        step("close", producer.close()).await.unwrap();
        let mut consumer = client.consumer(ConsumerConfig::default()).unwrap();
        consumer.assign_topic(&name).await.unwrap();
        let records = consume_n(&mut consumer, 3000).await;
        let mut seen = vec![false; 3000];
        let mut last: HashMap<u32, i64> = HashMap::new();
        for r in &records {
            let got = r.value.as_ref().unwrap();
            let n = u32::from_be_bytes(got[..4].try_into().unwrap()) as usize;
            assert!(
                n < 3000 && !seen[n] && value(n)[..] == got[..],
                "packets of {packet}: a value that was not sent ({} bytes at {}-{})",
                got.len(),
                r.partition,
                r.offset.0
            );
            seen[n] = true;
            let prev = last.insert(r.partition, r.offset.0);
            assert!(prev.is_none_or(|p| p < r.offset.0), "offsets increase");
        }
        assert!(
            seen.iter().all(|s| *s),
            "packets of {packet}: every record came back"
        );
    }
    env.shutdown().await;
}
