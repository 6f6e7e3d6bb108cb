//! Delivery reports: how a sent record learns its fate.
//!
//! One [`BatchCompletion`] per batch is shared by the [`DeliveryFuture`]s of the
//! batch's records (an `Arc` and an index each — no allocation per record). The
//! batch completes exactly once, with the base offset the broker assigned or with
//! an error; each future then resolves to its own offset (`base + index`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use rill_proto::types::TimestampMs;
use rill_proto::{Offset, wire::Acks};

use crate::error::ClientError;

/// Where and when a record was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    pub topic: Arc<str>,
    pub partition: u32,
    /// The record's offset; `-1` when sent with acks=0 (the broker does not say).
    pub offset: Offset,
    /// The record's timestamp (the log-append time if the topic uses it).
    pub timestamp_ms: TimestampMs,
}

/// What the broker said about a whole batch.
#[derive(Debug, Clone)]
pub(crate) struct BatchAck {
    pub base_offset: Offset,
    pub log_append_time_ms: Option<TimestampMs>,
}

#[derive(Debug)]
enum State {
    Pending(Vec<Waker>),
    Done(Result<BatchAck, Arc<ClientError>>),
}

/// The shared completion of one batch.
#[derive(Debug)]
pub(crate) struct BatchCompletion {
    pub topic: Arc<str>,
    pub partition: u32,
    state: Mutex<State>,
}

impl BatchCompletion {
    pub fn new(topic: Arc<str>, partition: u32) -> Arc<BatchCompletion> {
        Arc::new(BatchCompletion {
            topic,
            partition,
            state: Mutex::new(State::Pending(Vec::new())),
        })
    }

    /// Completes the batch; a second completion is ignored (the first one wins).
    pub fn complete(&self, result: Result<BatchAck, Arc<ClientError>>) {
        let wakers = {
            let mut state = self.state.lock();
            match &mut *state {
                State::Done(_) => return,
                State::Pending(wakers) => {
                    let wakers = std::mem::take(wakers);
                    *state = State::Done(result);
                    wakers
                }
            }
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// Resolves once the record is acknowledged (per the producer's `acks`) or has
/// failed. Dropping it does not cancel the send.
#[derive(Debug)]
#[must_use = "a DeliveryFuture reports whether the record was written; await it or drop it explicitly"]
pub struct DeliveryFuture {
    batch: Arc<BatchCompletion>,
    index: u32,
    timestamp_ms: TimestampMs,
    /// Position of our waker in the batch's list, once registered.
    waker_slot: Option<usize>,
    acks: Acks,
}

impl DeliveryFuture {
    pub(crate) fn new(
        batch: Arc<BatchCompletion>,
        index: u32,
        timestamp_ms: TimestampMs,
        acks: Acks,
    ) -> DeliveryFuture {
        DeliveryFuture {
            batch,
            index,
            timestamp_ms,
            waker_slot: None,
            acks,
        }
    }

    /// Whether `other` is a record of the same batch: the two resolve together,
    /// with the same outcome, so a caller that waits for both may keep one.
    pub fn same_batch(&self, other: &DeliveryFuture) -> bool {
        Arc::ptr_eq(&self.batch, &other.batch)
    }
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata, ClientError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let mut state = this.batch.state.lock();
        match &mut *state {
            State::Pending(wakers) => {
                match this.waker_slot {
                    Some(i) if i < wakers.len() => {
                        if !wakers[i].will_wake(cx.waker()) {
                            wakers[i] = cx.waker().clone();
                        }
                    }
                    _ => {
                        this.waker_slot = Some(wakers.len());
                        wakers.push(cx.waker().clone());
                    }
                }
                Poll::Pending
            }
            State::Done(Ok(ack)) => {
                let offset = if this.acks == Acks::None {
                    Offset(-1)
                } else {
                    ack.base_offset.plus(this.index as i64)
                };
                Poll::Ready(Ok(RecordMetadata {
                    topic: this.batch.topic.clone(),
                    partition: this.batch.partition,
                    offset,
                    timestamp_ms: ack.log_append_time_ms.unwrap_or(this.timestamp_ms),
                }))
            }
            State::Done(Err(e)) => Poll::Ready(Err(ClientError::Shared(e.clone()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_of_one_batch_resolve_together_and_say_so() {
        let batch = BatchCompletion::new("t".into(), 0);
        let other = BatchCompletion::new("t".into(), 0);
        let a = DeliveryFuture::new(batch.clone(), 0, 5, Acks::Leader);
        let b = DeliveryFuture::new(batch.clone(), 1, 5, Acks::Leader);
        let c = DeliveryFuture::new(other, 0, 5, Acks::Leader);
        assert!(a.same_batch(&b));
        assert!(!a.same_batch(&c));
        batch.complete(Ok(BatchAck {
            base_offset: Offset(10),
            log_append_time_ms: None,
        }));
        assert_eq!(a.await.unwrap().offset, Offset(10));
        assert_eq!(b.await.unwrap().offset, Offset(11));
    }
}
