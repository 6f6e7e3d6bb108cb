//! Consumer groups end to end: rill-client's `GroupConsumer` and group admin
//! against an embedded broker on loopback. Short sessions (1.5 s) and heartbeat
//! intervals (100 ms) keep rebalances quick; every step is bounded by `STEP`.
//! Members read each partition to its log end and what they got is counted:
//! every record exactly once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::time::Duration;

use rill_broker::{Broker, BrokerConfig, BrokerHandle};
use rill_client::{
    Client, ClientConfig, ErrorCode, GroupConfig, GroupConsumer, GroupEvent, NewTopic, Offset,
    OffsetReset, OffsetSpec, ProducerConfig, ProducerRecord, ResetSpec, TopicPartition,
};

const STEP: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

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

fn broker_config(
    listen: std::net::SocketAddr,
    data: &std::path::Path,
    home: &std::path::Path,
) -> BrokerConfig {
    BrokerConfig {
        listen,
        data_dir: data.to_path_buf(),
        rill_home: Some(home.to_path_buf()),
        shutdown_timeout_ms: 5000,
        offsets_topic_num_partitions: 4,
        ..BrokerConfig::default()
    }
}

impl Env {
    async fn start() -> Env {
        let data = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let config = broker_config("127.0.0.1:0".parse().unwrap(), data.path(), home.path());
        let broker = step("broker start", Broker::start(config)).await.unwrap();
        Env {
            data,
            home,
            broker: Some(broker),
        }
    }

    async fn client(&self) -> Client {
        let addr = self.broker.as_ref().unwrap().local_addr();
        let mut c = ClientConfig::new(addr.to_string());
        c.tls = rill_net::ClientTls::Dev {
            home: self.home.path().to_path_buf(),
        };
        step("connect", Client::connect(c)).await.unwrap()
    }

    async fn restart(&mut self) {
        let old = self.broker.take().unwrap();
        let addr = old.local_addr();
        step("shutdown", old.shutdown()).await.unwrap();
        let config = broker_config(addr, self.data.path(), self.home.path());
        self.broker = Some(step("restart", Broker::start(config)).await.unwrap());
    }
}

async fn topic_with_records(client: &Client, topic: &str, partitions: u32, count: usize) {
    client
        .admin()
        .create_topic(NewTopic {
            name: topic.into(),
            partitions: Some(partitions),
            replication_factor: None,
            configs: vec![],
        })
        .await
        .unwrap();
    produce(client, topic, 0, count).await;
}

async fn produce(client: &Client, topic: &str, from: usize, count: usize) {
    let producer = client.producer(ProducerConfig::default()).unwrap();
    let mut deliveries = Vec::new();
    for i in from..from + count {
        let record = ProducerRecord::new(topic, format!("v{i}")).key(format!("k{i}"));
        deliveries.push(producer.send(record).await.unwrap());
    }
    for d in deliveries {
        step("delivery", d).await.unwrap();
    }
    producer.close().await.unwrap();
}

fn group_config(group: &str, topic: &str) -> GroupConfig {
    let mut c = GroupConfig::new(group, vec![topic.to_string()]);
    c.session_timeout_ms = 1500;
    c.heartbeat_interval_ms = 100;
    c.auto_offset_reset = OffsetReset::Earliest;
    c
}

/// The values each member received so far.
type Got = Vec<Vec<String>>;

/// Polls every member once, adding what it returned to `got`.
async fn poll_all(members: &mut [GroupConsumer], got: &mut Got) {
    got.resize(members.len(), Vec::new());
    for (i, m) in members.iter_mut().enumerate() {
        for r in m.poll(POLL).await.unwrap() {
            got[i].push(String::from_utf8(r.value.unwrap().to_vec()).unwrap());
        }
    }
}

/// Polls every member in turn until the partitions of `topic` are read to the
/// log end offsets ListOffsets reports at the call, each by the member that
/// owns it; returns every value each member got (with those in `got` already),
/// duplicates included: a count of what arrived sees one too many, where
/// stopping at the expected number could not.
async fn poll_to_end(
    client: &Client,
    topic: &str,
    members: &mut [GroupConsumer],
    mut got: Got,
) -> Got {
    let n = client.partition_count(topic).await.unwrap();
    let tps: Vec<TopicPartition> = (0..n).map(|p| TopicPartition::new(topic, p)).collect();
    let ends = client.list_offsets(&tps, OffsetSpec::Latest).await.unwrap();
    step("poll to the end of every partition", async {
        loop {
            poll_all(members, &mut got).await;
            let at_end = |(tp, end): &(TopicPartition, Offset)| {
                members.iter().any(|m| {
                    m.assignment().contains(tp) && m.position(tp).is_some_and(|p| p >= *end)
                })
            };
            if ends.iter().all(at_end) {
                return;
            }
        }
    })
    .await;
    got
}

/// Asserts `got` (all members) holds `v{from}`..`v{from+count}`, each once.
fn assert_each_once(got: &Got, from: usize, count: usize, what: &str) {
    let mut times: BTreeMap<&String, usize> = BTreeMap::new();
    for v in got.iter().flatten() {
        *times.entry(v).or_default() += 1;
    }
    let twice: Vec<_> = times.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "{what}: delivered more than once: {twice:?}"
    );
    let want: Vec<String> = (from..from + count).map(|i| format!("v{i}")).collect();
    let mut all: Vec<&String> = times.into_keys().collect();
    all.sort_by_key(|v| v[1..].parse::<usize>().unwrap_or(usize::MAX));
    assert_eq!(all, want.iter().collect::<Vec<_>>(), "{what}: every record");
}

/// Polls every member until each has `per_member` partitions; returns the
/// records polled meanwhile.
async fn settle(members: &mut [GroupConsumer], per_member: usize) -> Got {
    let mut got = Got::new();
    step("group settles", async {
        loop {
            poll_all(members, &mut got).await;
            if members.iter().all(|m| m.assignment().len() == per_member) {
                return;
            }
        }
    })
    .await;
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_three_members_split_six_partitions_and_every_record_arrives_once() {
    let env = Env::start().await;
    let client = env.client().await;
    topic_with_records(&client, "q", 6, 120).await;
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(
            step("join", client.group_consumer(group_config("workers", "q")))
                .await
                .unwrap(),
        );
    }
    let early = settle(&mut members, 2).await;
    let mut all: BTreeSet<TopicPartition> = BTreeSet::new();
    for m in &members {
        assert_eq!(m.assignment().len(), 2, "{:?}", m.assignment());
        all.extend(m.assignment());
    }
    assert_eq!(all.len(), 6, "the three assignments are disjoint");

    let got = poll_to_end(&client, "q", &mut members, early).await;
    assert_each_once(&got, 0, 120, "workers");
    let mut seen = BTreeSet::new();
    for values in &got {
        for v in values {
            assert!(seen.insert(v.clone()), "{v} delivered twice");
        }
    }
    assert_eq!(seen.len(), 120);
    for m in &mut members {
        m.commit().await.unwrap();
    }
    // The group is described with lag 0 everywhere.
    let d = client.admin().describe_group("workers").await.unwrap();
    assert_eq!(d.members.len(), 3);
    assert_eq!(d.state, "Stable");
    assert_eq!(d.partitions.len(), 6);
    for p in &d.partitions {
        assert_eq!(p.lag, Some(0), "{p:?}");
        assert!(p.member_id.is_some());
    }
    // Resetting is refused while members are live, with a clear error.
    let e = client
        .admin()
        .reset_offsets("workers", "q", ResetSpec::Earliest)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::NonEmptyGroup), "{e}");
    assert!(e.to_string().contains("stop them"), "{e}");
    for m in members {
        step("close", m.close()).await.unwrap();
    }
    let groups = client.admin().list_groups().await.unwrap();
    let g = groups.iter().find(|g| g.group_id == "workers").unwrap();
    assert_eq!(g.members, 0, "closed members left at once");
    // Now the reset works, and a new member starts from it.
    let reset = client
        .admin()
        .reset_offsets("workers", "q", ResetSpec::Offset(Offset(5)))
        .await
        .unwrap();
    assert_eq!(reset.len(), 6);
    let committed: BTreeMap<TopicPartition, Offset> = client
        .admin()
        .committed_offsets("workers")
        .await
        .unwrap()
        .into_iter()
        .collect();
    for (tp, o) in &reset {
        assert_eq!(committed.get(tp), Some(o));
        assert!(o.0 <= 5);
    }
    client.admin().delete_group("workers").await.unwrap();
    assert!(
        client
            .admin()
            .committed_offsets("workers")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_subscribe_two_groups_each_get_every_record() {
    let env = Env::start().await;
    let client = env.client().await;
    topic_with_records(&client, "news", 3, 50).await;
    for group in ["g1", "g2"] {
        let mut members = vec![
            client
                .group_consumer(group_config(group, "news"))
                .await
                .unwrap(),
            client
                .group_consumer(group_config(group, "news"))
                .await
                .unwrap(),
        ];
        let got = poll_to_end(&client, "news", &mut members, Got::new()).await;
        assert_each_once(&got, 0, 50, group);
        let all: BTreeSet<&String> = got.iter().flatten().collect();
        assert_eq!(all.len(), 50, "group {group} got every record once");
        for m in members {
            m.close().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_partitions_can_be_committed_before_they_move() {
    let env = Env::start().await;
    let client = env.client().await;
    topic_with_records(&client, "r", 4, 40).await;
    let mut manual = group_config("hand", "r");
    manual.enable_auto_commit = false;
    let mut a = client.group_consumer(manual.clone()).await.unwrap();
    let early = settle(std::slice::from_mut(&mut a), 4).await;
    assert!(matches!(a.take_events().as_slice(), [GroupEvent::Assigned(tps)] if tps.len() == 4));
    let got = poll_to_end(&client, "r", std::slice::from_mut(&mut a), early).await;
    assert_eq!(got[0].len(), 40);
    assert_each_once(&got, 0, 40, "hand");

    let mut b = client.group_consumer(manual).await.unwrap();
    // a learns of the revocation on a poll, which returns early with the event.
    let revoked = step("revocation", async {
        loop {
            a.poll(POLL).await.unwrap();
            b.poll(POLL).await.unwrap();
            let events = a.take_events();
            if let Some(GroupEvent::Revoked(tps)) = events.into_iter().next() {
                return tps;
            }
        }
    })
    .await;
    assert_eq!(revoked.len(), 2);
    assert!(
        b.assignment().is_empty(),
        "not released until a acknowledges"
    );
    // a commits (revoked partitions included), which also acknowledges.
    a.commit().await.unwrap();
    let mut both = [a, b];
    settle(&mut both, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_a_broker_restart() {
    let mut env = Env::start().await;
    let client = env.client().await;
    topic_with_records(&client, "d", 2, 30).await;
    let mut m = client
        .group_consumer(group_config("durable", "d"))
        .await
        .unwrap();
    let got = poll_to_end(&client, "d", std::slice::from_mut(&mut m), Got::new()).await;
    assert_eq!(got[0].len(), 30);
    assert_each_once(&got, 0, 30, "durable");
    m.close().await.unwrap();
    drop(client);

    env.restart().await;
    let client = env.client().await;
    let committed: HashMap<TopicPartition, Offset> = client
        .admin()
        .committed_offsets("durable")
        .await
        .unwrap()
        .into_iter()
        .collect();
    let total: i64 = committed.values().map(|o| o.0).sum();
    assert_eq!(total, 30, "{committed:?}");
    produce(&client, "d", 30, 10).await;
    let mut m = client
        .group_consumer(group_config("durable", "d"))
        .await
        .unwrap();
    let got = poll_to_end(&client, "d", std::slice::from_mut(&mut m), Got::new()).await;
    assert_each_once(&got, 30, 10, "durable after the restart");
    let mut values = got[0].clone();
    values.sort();
    let mut want: Vec<String> = (30..40).map(|i| format!("v{i}")).collect();
    want.sort();
    assert_eq!(values, want, "resumed after the commit, nothing older");
    m.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_member_leaves_and_bad_configs_fail_clearly() {
    let env = Env::start().await;
    let client = env.client().await;
    topic_with_records(&client, "x", 2, 0).await;
    let m = client
        .group_consumer(group_config("drop", "x"))
        .await
        .unwrap();
    drop(m);
    step("dropped member leaves", async {
        loop {
            let d = client.admin().describe_group("drop").await.unwrap();
            if d.members.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut bad = group_config("bad", "x");
    bad.assignor = "sticky".into();
    let e = client.group_consumer(bad).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::InconsistentGroupProtocol), "{e}");
    let mut bad = group_config("bad", "x");
    bad.session_timeout_ms = 200;
    bad.heartbeat_interval_ms = 50;
    let e = client.group_consumer(bad).await.unwrap_err();
    assert!(e.to_string().contains("session timeout 200 ms"), "{e}");
}
