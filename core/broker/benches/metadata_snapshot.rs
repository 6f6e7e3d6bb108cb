//! The metadata snapshot of a cluster with 100,000 partitions (1,000 topics x 100
//! partitions, replication factor 3, three configs per topic, 6 brokers): its size
//! and its encode/load times as the JSON `snapshot.json` older versions wrote, and
//! as the rkyv `snapshot.rkyv` (format version 1) written now.
//!
//! rkyv "decode" is what the broker does at start: crc32c, bytecheck validation,
//! deserialization into the owned `MetadataImage`; "access" stops after the
//! validation (the zero-copy view); "crc32c only" is the checksum part of it.
//! "load from file" adds reading the file (from the page cache).
//!
//! Run: `cargo bench -p rill-broker --bench metadata_snapshot`.
//! Files go to `$RILL_BENCH_DIR` (default: the system temp dir) and are deleted.

use criterion::Criterion;
use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership};
use rill_broker::cluster::image::{
    BrokerRecord, MetadataImage, PartitionState, TopicState, assign_replicas,
};
use rill_broker::cluster::raft_format::{self, Snapshot, StoredSnapshot};
use rill_proto::LeaderEpoch;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

const TOPICS: usize = 1_000;
const PARTITIONS_PER_TOPIC: u32 = 100;
const REPLICATION_FACTOR: u16 = 3;
const BROKERS: i32 = 6;

fn image() -> MetadataImage {
    let brokers: Vec<i32> = (1..=BROKERS).collect();
    let mut image = MetadataImage {
        cluster_id: "bench-cluster-0123456789".into(),
        next_producer_id: 12_345,
        ..MetadataImage::default()
    };
    for &id in &brokers {
        image.brokers.insert(
            id,
            BrokerRecord {
                id,
                addr: format!("10.0.0.{id}:9092"),
                fenced: false,
                listeners: Default::default(),
            },
        );
    }
    for t in 0..TOPICS {
        let name = format!("orders.region-{t:04}");
        let assignment =
            assign_replicas(&brokers, PARTITIONS_PER_TOPIC, REPLICATION_FACTOR, t).unwrap();
        let partitions = assignment
            .into_iter()
            .enumerate()
            .map(|(p, replicas)| PartitionState {
                leader: Some(replicas[0]),
                leader_epoch: LeaderEpoch((p % 7) as i32),
                isr: replicas.clone(),
                replicas,
            })
            .collect();
        let configs: BTreeMap<String, String> = [
            ("retention.ms", "604800000"),
            ("cleanup.policy", "delete"),
            ("min.insync.replicas", "2"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        image.topics.insert(
            name.clone(),
            TopicState {
                name,
                id: format!("{:032x}", 0x9e37_79b9_7f4a_7c15u128 * (t as u128 + 1)),
                internal: false,
                configs,
                partitions,
            },
        );
    }
    image
}

fn meta() -> SnapshotMeta<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3u64)
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:9093"))))
        .collect();
    let voters = vec![nodes.keys().copied().collect()];
    SnapshotMeta {
        last_log_id: Some(LogId::new(CommittedLeaderId::new(4, 1), 250_000)),
        last_membership: StoredMembership::new(
            Some(LogId::new(CommittedLeaderId::new(1, 1), 3)),
            Membership::new(voters, nodes),
        ),
        snapshot_id: "250000-1".into(),
    }
}

fn snapshot_benches(c: &mut Criterion) {
    let image = image();
    let partitions: usize = image.topics.values().map(|t| t.partitions.len()).sum();
    assert_eq!(partitions, 100_000);
    let stored = StoredSnapshot {
        meta: meta(),
        image: image.clone(),
    };
    let json = serde_json::to_vec(&stored).unwrap();
    let v1 = Snapshot::new(&stored.meta, image.clone());
    let rkyv_file = raft_format::encode_snapshot(&v1).unwrap();
    // Both decode back to the image they were made from.
    let from_json: StoredSnapshot = serde_json::from_slice(&json).unwrap();
    assert_eq!(from_json.image, image);
    let path = Path::new("snapshot.rkyv");
    let mut aligned = rkyv::util::AlignedVec::<16>::new();
    aligned.extend_from_slice(&rkyv_file);
    assert_eq!(
        raft_format::decode_snapshot(path, &aligned).unwrap(),
        v1,
        "rkyv round trip"
    );
    println!(
        "snapshot of {partitions} partitions: JSON {} bytes, rkyv {} bytes ({:.1}%)",
        json.len(),
        rkyv_file.len(),
        100.0 * rkyv_file.len() as f64 / json.len() as f64
    );

    let dir = match std::env::var_os("RILL_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let json_path = dir.path().join("snapshot.json");
    let rkyv_path = dir.path().join("snapshot.rkyv");
    std::fs::write(&json_path, &json).unwrap();
    std::fs::write(&rkyv_path, &rkyv_file).unwrap();

    let mut group = c.benchmark_group("snapshot_100k_partitions");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    group.bench_function("json/encode", |b| {
        b.iter(|| serde_json::to_vec(black_box(&stored)).unwrap())
    });
    group.bench_function("rkyv/encode", |b| {
        b.iter(|| raft_format::encode_snapshot(black_box(&v1)).unwrap())
    });
    group.bench_function("json/decode", |b| {
        b.iter(|| serde_json::from_slice::<StoredSnapshot>(black_box(&json)).unwrap())
    });
    group.bench_function("rkyv/decode (crc + validate + deserialize)", |b| {
        b.iter(|| raft_format::decode_snapshot(path, black_box(&aligned)).unwrap())
    });
    group.bench_function("rkyv/access (crc + validate)", |b| {
        b.iter(|| {
            raft_format::access_snapshot(path, black_box(&aligned))
                .unwrap()
                .image
                .topics
                .len()
        })
    });
    group.bench_function("rkyv/crc32c only", |b| {
        b.iter(|| rill_proto::crc::crc32c(black_box(&aligned[raft_format::SNAPSHOT_HEADER_LEN..])))
    });
    group.bench_function("json/load from file", |b| {
        b.iter(|| {
            let bytes = std::fs::read(&json_path).unwrap();
            serde_json::from_slice::<StoredSnapshot>(&bytes).unwrap()
        })
    });
    group.bench_function("rkyv/load from file", |b| {
        b.iter(|| {
            let bytes = raft_format::read_aligned(&rkyv_path).unwrap().unwrap();
            raft_format::decode_snapshot(&rkyv_path, &bytes).unwrap()
        })
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    snapshot_benches(&mut c);
    c.final_summary();
}
