//! Runs one deployment in this process as a member of the consumer group
//! `__transform-<name>` until it is stopped or halts: the coordinator assigns
//! this member a share of the input partitions (and moves them when a member
//! joins, leaves or fails); the [`Runner`] processes them and offsets are
//! committed to the group only after the outputs are acknowledged.
//!
//! Rebalances: on `Assigned` the partitions' instances start (state restored
//! from the changelog); on `Revoked` every pending commit point is resolved and
//! committed *before* the revocation is acknowledged (the group consumer
//! acknowledges it on the next commit), so the next owner starts exactly after
//! what was written. A partition without a committed offset starts per the
//! deployment's `--from`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_client::{
    AclOperation, AclResource, Client, ClientError, GroupConfig, GroupConsumer, GroupEvent, Offset,
    OffsetReset, OffsetSpec, TopicPartition,
};
use tokio::sync::watch;

use crate::deployment::{Deployment, StartFrom};
use crate::error::TransformError;
use crate::module::TransformModule;
use crate::registry::store_deployment;
use crate::runner::{OffsetSink, RunEnd, Runner, STATUS_INTERVAL};

/// How long one poll of the inputs waits for records.
pub const INPUT_POLL: Duration = Duration::from_millis(200);
/// A transform instance that stops heartbeating for this long loses its
/// partitions to the other members.
pub const GROUP_SESSION_TIMEOUT_MS: u32 = 10_000;
pub const GROUP_HEARTBEAT_INTERVAL_MS: u32 = 1_000;

/// Commits to the group.
struct GroupOffsets<'a>(&'a mut GroupConsumer);

impl OffsetSink for GroupOffsets<'_> {
    async fn commit(&mut self, offsets: Vec<(TopicPartition, Offset)>) -> Result<(), ClientError> {
        self.0.commit_offsets(&offsets).await
    }
}

/// The group config a deployment runs with.
pub fn group_config(d: &Deployment) -> GroupConfig {
    let mut config = GroupConfig::new(d.group_id(), d.inputs.clone());
    config.auto_offset_reset = match d.from {
        StartFrom::Earliest => OffsetReset::Earliest,
        StartFrom::Latest => OffsetReset::Latest,
    };
    config.enable_auto_commit = false;
    config.session_timeout_ms = GROUP_SESSION_TIMEOUT_MS;
    config.heartbeat_interval_ms = GROUP_HEARTBEAT_INTERVAL_MS;
    config.consumer.fetch_max_wait = INPUT_POLL;
    config
}

/// How long a runner that acts for the deployer trusts its last answer that
/// the deployer may read the inputs and write the outputs: an ACL removed
/// stops the transform within about this long.
pub const ACCESS_RECHECK: Duration = Duration::from_secs(1);

/// The principal of a deployment record that names none.
const NO_DEPLOYER: &str = "Anonymous";

/// The rights a deployment's principal needs, checked by a runner whose
/// client is a broker (which may do everything itself): before it starts, and
/// again before it writes, at most [`ACCESS_RECHECK`] after the last check.
struct DeployerAccess {
    principal: String,
    /// The record named its principal (an older one did not).
    recorded: bool,
    checks: Vec<(AclOperation, AclResource)>,
    checked_at: Option<Instant>,
}

impl DeployerAccess {
    fn new(d: &Deployment) -> DeployerAccess {
        DeployerAccess {
            principal: d.owner.clone().unwrap_or_else(|| NO_DEPLOYER.into()),
            recorded: d.owner.is_some(),
            checks: d.access_checks(),
            checked_at: None,
        }
    }

    /// `Some(reason)` when the principal may not do all it needs.
    async fn refused(
        &mut self,
        client: &Client,
        name: &str,
    ) -> Result<Option<String>, TransformError> {
        if self
            .checked_at
            .is_some_and(|t| t.elapsed() < ACCESS_RECHECK)
        {
            return Ok(None);
        }
        if self.principal.starts_with("Broker:") {
            // Only a client's rights are lent to a transform, never a broker's
            // (which may write internal topics).
            return Ok(Some(format!(
                "transform {name} is recorded to run as {}, a broker: deploy it again as a client principal",
                self.principal
            )));
        }
        let denied = client
            .admin()
            .check_access(&self.principal, self.checks.clone())
            .await?;
        if denied.is_empty() {
            self.checked_at = Some(Instant::now());
            return Ok(None);
        }
        if !self.recorded {
            return Ok(Some(format!(
                "transform {name} has no deployer recorded (deployed by an older Rill), so it runs \
                 as {NO_DEPLOYER}, which may not do all it needs: {}. Deploy it again",
                denied.join("; ")
            )));
        }
        Ok(Some(format!(
            "transform {name} runs as the principal that deployed it ({p}), which may not do \
             all it needs: {}. Grant {p} those rights (`rill acl add`) and resume it as {p} \
             (`rill transform resume {name}` stores it again as whoever runs it), or deploy it \
             again as a principal that may",
            denied.join("; "),
            p = self.principal,
        )))
    }
}

/// Runs `d` as a group member until `stop` turns true. `as_deployer`: the
/// client is a broker's, so every read and write is checked against the
/// rights of the principal that deployed `d` first (a standalone worker's
/// client is checked by the brokers as itself).
pub async fn run_deployment(
    client: Client,
    d: Deployment,
    module: Arc<TransformModule>,
    instance_id: String,
    as_deployer: bool,
    mut stop: watch::Receiver<bool>,
) -> Result<RunEnd, TransformError> {
    let mut access = as_deployer.then(|| DeployerAccess::new(&d));
    // A broker recording a halt keeps the deployment's principal (and never
    // lends its own to a record that named none).
    let owner =
        |h: &Deployment| as_deployer.then(|| h.owner.clone().unwrap_or_else(|| NO_DEPLOYER.into()));
    if let Some(a) = &mut access
        && let Some(reason) = a.refused(&client, &d.name).await?
    {
        tracing::warn!(transform = %d.name, %reason, "transform halted before it started");
        let mut halted = d.clone();
        halted.state = crate::deployment::RunState::Halted {
            reason: reason.clone(),
        };
        store_deployment(&client, &halted, owner(&halted)).await?;
        return Ok(RunEnd::Halted(reason));
    }
    let mut group = client.group_consumer(group_config(&d)).await?;
    let mut runner = Runner::new(client.clone(), d.clone(), module, instance_id).await?;
    let mut lag = 0u64;
    let mut lag_at = Instant::now() - STATUS_INTERVAL;
    let end = loop {
        let records = tokio::select! {
            _ = stop.changed() => break RunEnd::Stopped,
            r = group.poll(INPUT_POLL) => r?,
        };
        for event in group.take_events() {
            match event {
                GroupEvent::Assigned(tps) => runner.assign(&tps).await?,
                GroupEvent::Revoked(tps) => {
                    runner.revoke(&tps, &mut GroupOffsets(&mut group)).await?
                }
            }
        }
        if !records.is_empty()
            && let Some(a) = &mut access
            && let Some(reason) = a.refused(&client, &d.name).await?
        {
            break RunEnd::Halted(reason);
        }
        if let Some(reason) = runner
            .process(records, &mut GroupOffsets(&mut group))
            .await?
        {
            break RunEnd::Halted(reason);
        }
        if lag_at.elapsed() >= STATUS_INTERVAL {
            lag_at = Instant::now();
            let tps: Vec<TopicPartition> = runner.assignment().into_iter().collect();
            lag = 0;
            if !tps.is_empty()
                && let Ok(ends) = client.list_offsets(&tps, OffsetSpec::Latest).await
            {
                for (tp, end) in ends {
                    if let Some(pos) = group.position(&tp) {
                        lag += (end.0 - pos.0).max(0) as u64;
                    }
                }
            }
        }
        runner.publish_status("running", lag, false).await?;
    };
    let halted = match &end {
        RunEnd::Halted(reason) => Some(runner.halted_deployment(reason)),
        RunEnd::Stopped => None,
    };
    runner.finish(&mut GroupOffsets(&mut group), &end).await?;
    if let Err(e) = group.close().await {
        tracing::debug!(error = %e, "leaving the group failed (the session will expire)");
    }
    if let Some(h) = halted {
        store_deployment(&client, &h, owner(&h)).await?;
    }
    Ok(end)
}
