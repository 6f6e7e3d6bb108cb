//! Runs one deployment in this process until it is stopped or halts: reads
//! the input partitions, drives the [`Runner`], commits offsets, publishes
//! status.
//!
//! Offsets: committed to `__transform_offsets` (key `<name>/<topic>/<partition>`,
//! value the next offset, 8 bytes big-endian), read back on start; a partition
//! without one starts per the deployment's `--from`.

use std::sync::Arc;
use std::time::Duration;

use rill_client::{
    Client, ClientError, ConsumerConfig, Offset, OffsetReset, Producer, ProducerRecord,
    TopicPartition,
};
use tokio::sync::watch;

use crate::deployment::{Deployment, StartFrom};
use crate::error::TransformError;
use crate::module::TransformModule;
use crate::registry::{
    OFFSETS_TOPIC, control_producer, load_offsets, offset_key, store_deployment,
};
use crate::runner::{OffsetSink, RunEnd, Runner};

/// How long one poll of the inputs waits for records.
pub const INPUT_POLL: Duration = Duration::from_millis(200);

/// Commits offsets as records of `__transform_offsets`.
#[derive(Debug)]
pub struct TopicOffsets {
    name: String,
    producer: Producer,
}

impl TopicOffsets {
    pub fn new(client: &Client, name: &str) -> Result<TopicOffsets, ClientError> {
        Ok(TopicOffsets {
            name: name.to_string(),
            producer: control_producer(client)?,
        })
    }
}

impl OffsetSink for TopicOffsets {
    async fn commit(&mut self, offsets: Vec<(TopicPartition, Offset)>) -> Result<(), ClientError> {
        let mut pending = Vec::with_capacity(offsets.len());
        for (tp, o) in offsets {
            let record = ProducerRecord::new(OFFSETS_TOPIC, o.0.to_be_bytes().to_vec())
                .key(offset_key(&self.name, &tp));
            pending.push(self.producer.send(record).await?);
        }
        for p in pending {
            p.await?;
        }
        Ok(())
    }
}

/// Every partition of the deployment's inputs.
async fn input_partitions(
    client: &Client,
    d: &Deployment,
) -> Result<Vec<TopicPartition>, ClientError> {
    let mut tps = Vec::new();
    for topic in &d.inputs {
        let n = client.partition_count(topic).await?;
        tps.extend((0..n).map(|p| TopicPartition::new(topic.clone(), p)));
    }
    Ok(tps)
}

/// Runs `d` over every partition of its inputs until `stop` turns true.
pub async fn run_deployment(
    client: Client,
    d: Deployment,
    module: Arc<TransformModule>,
    instance_id: String,
    mut stop: watch::Receiver<bool>,
) -> Result<RunEnd, TransformError> {
    let mut sink = TopicOffsets::new(&client, &d.name)?;
    let mut consumer = client.consumer(ConsumerConfig {
        auto_offset_reset: match d.from {
            StartFrom::Earliest => OffsetReset::Earliest,
            StartFrom::Latest => OffsetReset::Latest,
        },
        fetch_max_wait: INPUT_POLL,
        ..ConsumerConfig::default()
    })?;
    let tps = input_partitions(&client, &d).await?;
    let committed = load_offsets(&client, &d.name).await?;
    consumer.assign(tps.clone());
    for tp in &tps {
        if let Some(o) = committed.get(tp) {
            consumer.seek(tp, *o)?;
        }
    }
    let mut runner = Runner::new(client.clone(), d.clone(), module, instance_id).await?;
    runner.assign(&tps).await?;
    let end = loop {
        let records = tokio::select! {
            _ = stop.changed() => break RunEnd::Stopped,
            r = consumer.poll(INPUT_POLL) => r?,
        };
        if let Some(reason) = runner.process(records, &mut sink).await? {
            break RunEnd::Halted(reason);
        }
        let mut lag = 0u64;
        for tp in &tps {
            if let (Some(hw), Ok(pos)) = (consumer.high_watermark(tp), consumer.position(tp).await)
            {
                lag += (hw.0 - pos.0).max(0) as u64;
            }
        }
        runner.publish_status("running", lag, false).await?;
    };
    let halted = match &end {
        RunEnd::Halted(reason) => Some(runner.halted_deployment(reason)),
        RunEnd::Stopped => None,
    };
    runner.finish(&mut sink, &end).await?;
    if let Some(h) = halted {
        store_deployment(&client, &h).await?;
    }
    Ok(end)
}
