//! Consumer-group administration on [`Admin`]: list, describe (with log end
//! offsets and lag), reset offsets, delete.
//!
//! Lag is computed here, not by the coordinator: the coordinator knows the
//! committed offsets, the partitions' leaders know their log end offsets
//! (ListOffsets), and in a cluster those are different brokers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rill_proto::Offset;
use rill_proto::types::TimestampMs;
use rill_proto::wire::{
    ApiRequest, DeleteGroupsRequest, DescribeGroupsRequest, ErrorCode, ErrorInfo, GroupListing,
    ListGroupsRequest, OffsetCommitPartition, OffsetCommitRequest, OffsetFetchRequest, OffsetSpec,
};

use super::{COORDINATOR_MOVE_WAIT, COORDINATOR_RETRY_BACKOFF, from_wire};
use crate::TopicPartition;
use crate::admin::Admin;
use crate::client::Client;
use crate::error::ClientError;

/// Where `reset_offsets` moves a group's committed offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetSpec {
    /// The first offset still kept.
    Earliest,
    /// The log end (skip everything there is).
    Latest,
    /// This offset (clamped into what the log holds).
    Offset(Offset),
    /// The first record at or after this time (the log end where there is none).
    Timestamp(TimestampMs),
}

/// One member, as `describe_group` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub member_epoch: i32,
    pub assignment: Vec<TopicPartition>,
    /// Asked to give these up; not yet released.
    pub revoking: Vec<TopicPartition>,
    /// A static member that left (keeps its place until its session ends).
    pub left: bool,
}

/// One partition of a group, as `describe_group` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPartition {
    pub tp: TopicPartition,
    /// The member that owns it now, if any.
    pub member_id: Option<String>,
    pub committed: Option<Offset>,
    pub log_end_offset: Option<Offset>,
    /// `log_end_offset - committed` (the whole log when nothing is committed).
    pub lag: Option<i64>,
}

/// A group: state, members, and per-partition offsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: String,
    pub group_epoch: i32,
    pub assignor: String,
    /// The broker that coordinates the group (leads its `__consumer_offsets` partition).
    pub coordinator: i32,
    pub members: Vec<GroupMember>,
    pub partitions: Vec<GroupPartition>,
}

impl Client {
    /// Sends a group request to the group's coordinator, finding it again (and
    /// retrying, a bounded number of times) when it moved. `error` picks the
    /// response's whole-request error.
    pub(crate) async fn group_call<R: ApiRequest>(
        &self,
        group_id: &str,
        req: &R,
        error: impl Fn(&R::Response) -> Option<&ErrorInfo>,
    ) -> Result<R::Response, ClientError> {
        Ok(self.group_call_at(group_id, req, error).await?.0)
    }

    /// [`Client::group_call`], also returning the coordinator that answered.
    pub(crate) async fn group_call_at<R: ApiRequest>(
        &self,
        group_id: &str,
        req: &R,
        error: impl Fn(&R::Response) -> Option<&ErrorInfo>,
    ) -> Result<(R::Response, i32), ClientError> {
        let deadline = tokio::time::Instant::now() + COORDINATOR_MOVE_WAIT;
        loop {
            let coordinator = self.find_coordinator(group_id).await?;
            let resp = self.call(Some(coordinator), req, &[]).await;
            let moved = match &resp {
                Ok((r, _)) => error(r).is_some_and(|e| {
                    matches!(
                        e.code,
                        ErrorCode::NotCoordinator | ErrorCode::CoordinatorNotAvailable
                    )
                }),
                Err(e) => e.is_retriable(),
            };
            if moved && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(COORDINATOR_RETRY_BACKOFF).await;
                continue;
            }
            let (r, _) = resp?;
            if let Some(e) = error(&r) {
                return Err(ClientError::broker(
                    format!("{} for group {group_id}", R::KEY.name()),
                    e.clone(),
                ));
            }
            return Ok((r, coordinator));
        }
    }
}

/// Longest wait for every broker's group list.
const LIST_GROUPS_TIMEOUT: Duration = Duration::from_secs(10);

impl Admin {
    /// Every group of the cluster: asks each live broker for the groups it
    /// coordinates. A broker that does not answer (it just died; its groups are
    /// moving to the others) is skipped with a warning; only when no broker
    /// answers is it an error.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>, ClientError> {
        let meta = self.client.metadata(Some(Vec::new())).await?;
        let mut brokers: Vec<i32> = meta
            .brokers
            .iter()
            .filter(|b| b.alive)
            .map(|b| b.id)
            .collect();
        brokers.sort_unstable();
        let mut out = Vec::new();
        let mut answered = 0;
        let mut first_error = None;
        for id in brokers {
            let call = self.client.call(Some(id), &ListGroupsRequest {}, &[]);
            let failed = match tokio::time::timeout(LIST_GROUPS_TIMEOUT, call).await {
                Ok(Ok((resp, _))) => {
                    answered += 1;
                    out.extend(resp.groups);
                    continue;
                }
                Ok(Err(e)) if e.is_retriable() => e,
                Ok(Err(e)) => return Err(e),
                Err(_) => ClientError::Timeout {
                    what: format!("list groups of broker {id} (after {LIST_GROUPS_TIMEOUT:?})"),
                },
            };
            tracing::warn!(broker = id, error = %failed, "a broker did not list its groups; skipping it");
            first_error.get_or_insert(failed);
        }
        if answered == 0
            && let Some(e) = first_error
        {
            return Err(e);
        }
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out.dedup_by(|a, b| a.group_id == b.group_id);
        Ok(out)
    }

    /// A group's members, their partitions, and per partition the committed
    /// offset, log end offset and lag.
    pub async fn describe_group(&self, group_id: &str) -> Result<GroupDescription, ClientError> {
        let req = DescribeGroupsRequest {
            group_ids: vec![group_id.to_string()],
        };
        let (mut resp, coordinator) = self
            .client
            .group_call_at(group_id, &req, |r| {
                r.groups.first().and_then(|g| g.error.as_ref())
            })
            .await?;
        let g = resp.groups.pop().ok_or_else(|| {
            ClientError::Config(format!(
                "the coordinator gave no answer for group {group_id}"
            ))
        })?;
        let mut owners: BTreeMap<TopicPartition, String> = BTreeMap::new();
        let members: Vec<GroupMember> = g
            .members
            .into_iter()
            .map(|m| {
                let assignment: Vec<TopicPartition> =
                    from_wire(&m.assignment).into_iter().collect();
                for tp in &assignment {
                    owners.insert(tp.clone(), m.member_id.clone());
                }
                GroupMember {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    member_epoch: m.member_epoch,
                    assignment,
                    revoking: from_wire(&m.revoking).into_iter().collect(),
                    left: m.left,
                }
            })
            .collect();
        let mut committed: BTreeMap<TopicPartition, Offset> = BTreeMap::new();
        for o in g.offsets {
            if let Some(offset) = o.offset {
                committed.insert(TopicPartition::new(o.topic, o.partition), offset);
            }
        }
        let tps: BTreeSet<TopicPartition> =
            committed.keys().chain(owners.keys()).cloned().collect();
        let tps: Vec<TopicPartition> = tps.into_iter().collect();
        let ends: BTreeMap<TopicPartition, Offset> = if tps.is_empty() {
            BTreeMap::new()
        } else {
            match self.client.list_offsets(&tps, OffsetSpec::Latest).await {
                Ok(v) => v.into_iter().collect(),
                // A deleted topic keeps its committed offsets; show them without lag.
                Err(e) => {
                    tracing::debug!(error = %e, "log end offsets unavailable");
                    BTreeMap::new()
                }
            }
        };
        let partitions = tps
            .into_iter()
            .map(|tp| {
                let committed = committed.get(&tp).copied();
                let log_end_offset = ends.get(&tp).copied();
                let lag = log_end_offset.map(|end| end.0 - committed.map_or(0, |c| c.0).min(end.0));
                GroupPartition {
                    member_id: owners.get(&tp).cloned(),
                    committed,
                    log_end_offset,
                    lag,
                    tp,
                }
            })
            .collect();
        Ok(GroupDescription {
            group_id: g.group_id,
            state: g.state,
            group_epoch: g.group_epoch,
            assignor: g.assignor,
            coordinator,
            members,
            partitions,
        })
    }

    /// The group's committed offsets (every partition it has committed).
    pub async fn committed_offsets(
        &self,
        group_id: &str,
    ) -> Result<Vec<(TopicPartition, Offset)>, ClientError> {
        let req = OffsetFetchRequest {
            group_id: group_id.to_string(),
            partitions: None,
            require_stable: false,
        };
        let resp = self
            .client
            .group_call(group_id, &req, |r| r.error.as_ref())
            .await?;
        Ok(resp
            .offsets
            .into_iter()
            .filter_map(|o| {
                o.offset
                    .map(|off| (TopicPartition::new(o.topic, o.partition), off))
            })
            .collect())
    }

    /// Sets the group's committed offsets of every partition of `topic`.
    /// Refused (NON_EMPTY_GROUP) while the group has members. Returns the new
    /// offsets.
    pub async fn reset_offsets(
        &self,
        group_id: &str,
        topic: &str,
        to: ResetSpec,
    ) -> Result<Vec<(TopicPartition, Offset)>, ClientError> {
        let count = self.client.partition_count(topic).await?;
        let tps: Vec<TopicPartition> = (0..count).map(|p| TopicPartition::new(topic, p)).collect();
        let offsets: Vec<(TopicPartition, Offset)> = match to {
            ResetSpec::Earliest => self.client.list_offsets(&tps, OffsetSpec::Earliest).await?,
            ResetSpec::Latest => self.client.list_offsets(&tps, OffsetSpec::Latest).await?,
            ResetSpec::Timestamp(ts) => {
                self.client
                    .list_offsets(&tps, OffsetSpec::Timestamp(ts))
                    .await?
            }
            ResetSpec::Offset(o) => {
                let starts = self.client.list_offsets(&tps, OffsetSpec::Earliest).await?;
                let ends: BTreeMap<TopicPartition, Offset> = self
                    .client
                    .list_offsets(&tps, OffsetSpec::Latest)
                    .await?
                    .into_iter()
                    .collect();
                starts
                    .into_iter()
                    .map(|(tp, start)| {
                        let end = ends.get(&tp).copied().unwrap_or(start);
                        let clamped = o.clamp(start, end.max(start));
                        (tp, clamped)
                    })
                    .collect()
            }
        };
        let req = OffsetCommitRequest {
            group_id: group_id.to_string(),
            member: None,
            partitions: offsets
                .iter()
                .map(|(tp, o)| OffsetCommitPartition {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    offset: *o,
                    metadata: String::new(),
                })
                .collect(),
        };
        let resp = self
            .client
            .group_call(group_id, &req, |r| r.error.as_ref())
            .await?;
        for p in resp.partitions {
            if let Some(e) = p.error {
                return Err(ClientError::broker(
                    format!(
                        "reset the offset of {}-{} for group {group_id}",
                        p.topic, p.partition
                    ),
                    e,
                ));
            }
        }
        let mut offsets = offsets;
        offsets.sort();
        Ok(offsets)
    }

    /// Deletes a group and its committed offsets. Refused (NON_EMPTY_GROUP)
    /// while it has members.
    pub async fn delete_group(&self, group_id: &str) -> Result<(), ClientError> {
        let req = DeleteGroupsRequest {
            group_ids: vec![group_id.to_string()],
        };
        self.client
            .group_call(group_id, &req, |r| {
                r.results.first().and_then(|g| g.error.as_ref())
            })
            .await?;
        Ok(())
    }
}
