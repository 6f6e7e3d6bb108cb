//! The Prometheus endpoint, in its own test binary (the recorder is process-wide).

use rill_broker::{Broker, BrokerConfig};
use rill_net::{ClientTls, TransportLimits};
use rill_proto::wire::*;
use std::io::{Read, Write};
use std::time::Duration;

const STEP: Duration = Duration::from_secs(30);

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(STEP)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_counts_requests() {
    let data = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // A free TCP port for the endpoint.
    let metrics_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = BrokerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.path().to_path_buf(),
        rill_home: Some(home.path().to_path_buf()),
        metrics: Some(metrics_addr),
        tail_cache_bytes: 64 << 20,
        ..BrokerConfig::default()
    };
    let broker = tokio::time::timeout(STEP, Broker::start(config.clone()))
        .await
        .unwrap()
        .unwrap();
    // A second broker in the same process: the recorder is shared, not an error.
    let data2 = tempfile::tempdir().unwrap();
    let second = Broker::start(BrokerConfig {
        data_dir: data2.path().to_path_buf(),
        ..config
    })
    .await
    .unwrap();

    let tls = ClientTls::Dev {
        home: home.path().to_path_buf(),
    };
    let endpoint = rill_net::client_endpoint(&tls, &TransportLimits::default()).unwrap();
    let conn = rill_net::connect(&endpoint, broker.local_addr())
        .await
        .unwrap();
    let req = CreateTopicsRequest {
        topics: vec![NewTopic {
            name: "m".into(),
            partitions: Some(1),
            replication_factor: None,
            configs: vec![],
        }],
        validate_only: false,
    };
    rill_net::call(
        &conn,
        ApiKey::CreateTopics as u16,
        0,
        &encode_meta(&req),
        &[],
        1 << 20,
    )
    .await
    .unwrap();
    let bad = ProduceRequest {
        acks: Acks::All,
        timeout_ms: 1000,
        partitions: vec![ProducePartition {
            topic: "missing".into(),
            partition: 0,
            bytes_len: 0,
        }],
    };
    rill_net::call(
        &conn,
        ApiKey::Produce as u16,
        0,
        &encode_meta(&bad),
        &[],
        1 << 20,
    )
    .await
    .unwrap();

    let body = tokio::task::spawn_blocking(move || scrape(metrics_addr))
        .await
        .unwrap();
    assert!(
        body.contains("rill_requests_total{api=\"create_topics\"} 1"),
        "{body}"
    );
    assert!(
        body.contains(
            "rill_request_errors_total{api=\"produce\",code=\"UNKNOWN_TOPIC_OR_PARTITION\"} 1"
        ),
        "{body}"
    );
    assert!(
        body.contains("rill_request_duration_seconds_bucket{api=\"create_topics\""),
        "{body}"
    );
    assert!(
        body.contains("rill_partition_log_end_offset{topic=\"m\",partition=\"0\"} 0"),
        "{body}"
    );
    assert!(body.contains("rill_connections"), "{body}");

    // A produced batch is held by the leader's tail cache, and the gauge says
    // so after the next maintenance tick.
    let mut batch = rill_proto::BatchBuilder::new(rill_proto::Compression::None);
    batch.push(&rill_proto::Record::from_value("kept", 1_700_000_000_000));
    let batch = batch.build();
    let good = ProduceRequest {
        acks: Acks::All,
        timeout_ms: 1000,
        partitions: vec![ProducePartition {
            topic: "m".into(),
            partition: 0,
            bytes_len: batch.len() as u32,
        }],
    };
    rill_net::call(
        &conn,
        ApiKey::Produce as u16,
        0,
        &encode_meta(&good),
        &[batch],
        1 << 20,
    )
    .await
    .unwrap();
    let held = |body: &str| -> Option<f64> {
        body.lines()
            .find_map(|l| l.strip_prefix("rill_tail_cache_bytes "))
            .and_then(|v| v.trim().parse().ok())
    };
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let body = tokio::task::spawn_blocking(move || scrape(metrics_addr))
            .await
            .unwrap();
        if held(&body).is_some_and(|n| n > 0.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rill_tail_cache_bytes stayed at 0 or missing: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    second.shutdown().await.unwrap();
    broker.shutdown().await.unwrap();
}
