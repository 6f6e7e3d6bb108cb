//! Loopback throughput of the client against an embedded broker: produce N
//! records, then consume them back, printing records/s and MB/s of each phase.
//!
//! Run: `cargo run --release -p rill-client --example throughput -- [records] [value_bytes] [partitions] [compression] [max_in_flight] [batch_size]`
//! (defaults: 1000000 records, 100-byte values, 4 partitions, none, 5, 65536). Not a test:
//! it asserts only that every record comes back.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_broker::{Broker, BrokerConfig};
use rill_client::{
    Client, ClientConfig, Compression, ConsumerConfig, NewTopic, ProducerConfig, ProducerRecord,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let records: usize = args.first().map_or(Ok(1_000_000), |a| a.parse())?;
    let value_bytes: usize = args.get(1).map_or(Ok(100), |a| a.parse())?;
    let partitions: u32 = args.get(2).map_or(Ok(4), |a| a.parse())?;
    let compression: Compression = args.get(3).map_or(Ok(Compression::None), |a| a.parse())?;
    let max_in_flight: usize = args.get(4).map_or(Ok(5), |a| a.parse())?;
    let batch_size: usize = args.get(5).map_or(Ok(64 * 1024), |a| a.parse())?;

    let data = tempfile::tempdir()?;
    let home = tempfile::tempdir()?;
    let broker = Broker::start(BrokerConfig {
        listen: "127.0.0.1:0".parse()?,
        data_dir: data.path().to_path_buf(),
        rill_home: Some(home.path().to_path_buf()),
        ..BrokerConfig::default()
    })
    .await?;
    let mut config = ClientConfig::new(broker.local_addr().to_string());
    config.tls = rill_net::ClientTls::Dev {
        home: home.path().to_path_buf(),
    };
    let client = Client::connect(config).await?;
    client
        .admin()
        .create_topic(NewTopic {
            name: "bench".into(),
            partitions: Some(partitions),
            replication_factor: None,
            configs: vec![],
        })
        .await?;

    let producer = client.producer(ProducerConfig {
        compression,
        max_in_flight_per_broker: max_in_flight,
        batch_size,
        ..ProducerConfig::default()
    })?;
    let value = Bytes::from(vec![b'v'; value_bytes]);
    let started = Instant::now();
    let mut last = None;
    for _ in 0..records {
        last = Some(
            producer
                .send(ProducerRecord::new("bench", value.clone()))
                .await?,
        );
    }
    producer.flush().await?;
    if let Some(last) = last {
        last.await?;
    }
    report("produce", records, value_bytes, started.elapsed());
    producer.close().await?;

    let mut consumer = client.consumer(ConsumerConfig::default())?;
    consumer.assign_topic("bench").await?;
    let started = Instant::now();
    let mut got = 0usize;
    while got < records {
        let batch = consumer.poll(Duration::from_secs(5)).await?;
        if batch.is_empty() {
            return Err(format!("consumer stalled after {got} of {records} records").into());
        }
        got += batch.len();
    }
    report("consume", records, value_bytes, started.elapsed());
    broker.shutdown().await?;
    Ok(())
}

fn report(phase: &str, records: usize, value_bytes: usize, took: Duration) {
    let secs = took.as_secs_f64();
    println!(
        "{phase}: {records} records of {value_bytes} bytes in {secs:.2}s = {:.0} records/s, {:.1} MB/s",
        records as f64 / secs,
        (records * value_bytes) as f64 / secs / 1e6
    );
}
