//! Transactions (issue 20): the transaction coordinator of Kafka's model.
//!
//! [`coordinator`] is the pure state machine (`step(now, input)`, as the group
//! coordinator): transactional ids, producer epochs and fencing, the
//! transaction states and timeouts, and which markers end a transaction. The
//! log side (open transactions, the last stable offset, the aborted index,
//! markers) is rill-log's [`rill_log::txn`]; fetches honour `read_committed`
//! through [`crate::partition::Partition::last_stable_offset`].
//!
//! [`service`] is the async shell: the transactional apis, the coordinator's
//! state in the compacted `__transaction_state` topic, the markers written
//! through the partition leaders, and the timer (timeouts, failover).

pub mod coordinator;
pub mod service;

#[cfg(test)]
mod tests {
    use crate::handlers;
    use crate::router::Answer;
    use crate::test_broker::TestBroker;
    use rill_proto::control::{Marker, MarkerKind};
    use rill_proto::wire::*;
    use rill_proto::{BatchBuilder, Compression, Offset, ProducerId, Record};
    use std::time::Duration;

    fn txn_batch(pid: i64, seq: i32, n: usize) -> Vec<u8> {
        let mut b = BatchBuilder::new(Compression::None)
            .producer(ProducerId(pid), 0, seq)
            .transactional();
        for i in 0..n {
            b.push(&Record::from_value(format!("p{pid}-{i}"), 1));
        }
        b.build().to_vec()
    }

    fn fetch(isolation: Isolation) -> FetchRequest {
        FetchRequest {
            max_wait_ms: 0,
            min_bytes: 0,
            max_bytes: 1 << 20,
            replica_id: None,
            isolation,
            partitions: vec![FetchPartition {
                topic: "t".into(),
                partition: 0,
                offset: Offset(0),
                max_bytes: 1 << 20,
                current_leader_epoch: None,
            }],
        }
    }

    /// The offsets of the data batches a fetch returned (markers included).
    fn batch_offsets(payload: &[bytes::Bytes]) -> Vec<i64> {
        // A partition's bytes may come in several pieces (the tail cache's).
        let all = rill_proto::Rope::new(payload.iter().cloned());
        rill_proto::batch::rope_batches(&all)
            .map(|v| v.unwrap().1.base_offset.0)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_committed_fetches_stop_at_the_last_stable_offset_and_name_the_aborts() {
        let broker = TestBroker::start(|_| {}).await;
        let state = broker.state();
        broker.create_topic("t", 1).await;
        let mut p = None;
        for _ in 0..100 {
            if let Ok(found) = state.registry.partition("t", 0)
                && found.is_leader()
            {
                p = Some(found);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let p = p.expect("partition t-0 is led here");
        let abort = Marker {
            kind: MarkerKind::Abort,
            coordinator_epoch: 0,
        };
        let commit = Marker {
            kind: MarkerKind::Commit,
            ..abort
        };
        p.append(
            &rill_proto::Rope::from(bytes::Bytes::from(txn_batch(1, 0, 2))),
            1,
        )
        .unwrap(); // 0..=1
        p.append(
            &rill_proto::Rope::from(bytes::Bytes::from(txn_batch(2, 0, 2))),
            1,
        )
        .unwrap(); // 2..=3
        assert_eq!(
            p.append_marker(ProducerId(1), 0, abort, 1).unwrap(),
            Offset(4)
        );
        // Producer 2's transaction is open: committed readers stop at 2.
        assert_eq!(p.last_stable_offset(), Offset(2));
        let answer = |a: Answer<FetchResponse>| match a {
            Answer::WithPayload(r, payload) => (r, payload),
            other => panic!("{other:?}"),
        };
        let (r, payload) = answer(
            handlers::fetch(&state, fetch(Isolation::ReadCommitted))
                .await
                .unwrap(),
        );
        let part = &r.partitions[0];
        assert_eq!(part.last_stable_offset, Offset(2));
        assert_eq!(part.high_watermark, Offset(5));
        assert_eq!(batch_offsets(&payload), vec![0], "below the LSO only");
        assert_eq!(
            part.aborted,
            vec![AbortedRange {
                producer_id: 1,
                first_offset: Offset(0),
                last_offset: Offset(4)
            }]
        );
        // read_uncommitted sees everything up to the high watermark, no aborts.
        let (r, payload) = answer(
            handlers::fetch(&state, fetch(Isolation::ReadUncommitted))
                .await
                .unwrap(),
        );
        assert_eq!(batch_offsets(&payload), vec![0, 2, 4]);
        assert!(r.partitions[0].aborted.is_empty());

        // Producer 2 commits: the stable offset reaches the end.
        assert_eq!(
            p.append_marker(ProducerId(2), 0, commit, 1).unwrap(),
            Offset(5)
        );
        assert_eq!(p.last_stable_offset(), Offset(6));
        let lso = handlers::list_offsets(
            &state,
            ListOffsetsRequest {
                partitions: vec![ListOffsetsPartition {
                    topic: "t".into(),
                    partition: 0,
                    spec: OffsetSpec::LastStable,
                }],
            },
        )
        .await;
        assert_eq!(lso.partitions[0].offset, Offset(6));
        let (_, payload) = answer(
            handlers::fetch(&state, fetch(Isolation::ReadCommitted))
                .await
                .unwrap(),
        );
        assert_eq!(batch_offsets(&payload), vec![0, 2, 4, 5]);
        broker.shutdown().await;
    }
}
