//! The supervisor: watches `__transforms` and runs every deployment whose run
//! state is `running`, restarting one that failed (after
//! [`RESTART_BACKOFF`]) and stopping one that was paused, halted, redeployed
//! (a new version restarts it) or deleted.
//!
//! Every record read from `__transforms` is checked before it can run
//! ([`check_record`]: it decodes, its key is its name, its settings are valid
//! and its memory cap and call timeout are within this host's
//! [`HostMaxima`]). A record that fails is logged with the reason, is not run
//! (an older version of the same name stops), and is reported in
//! `__transform_status` as `refused` with the reason (so `rill transform
//! deploy` and `describe` can show it); the other deployments carry on.
//!
//! Who runs it: every `rill broker` process (against its own address, with the
//! client library, with the broker's `[transforms]` maxima) and every
//! `rill transform run` worker (with the default maxima). Each deployment runs
//! as the consumer group `__transform-<name>` (see `worker.rs`), so the input
//! partitions spread over every supervisor in the cluster and move when one
//! stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rill_client::{Client, ConsumerConfig, TopicPartition};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::deployment::{Deployment, RunState, TRANSFORMS_TOPIC};
use crate::error::TransformError;
use crate::limits::HostMaxima;
use crate::module::TransformModule;
use crate::registry::{deployer, ensure_internal_topics, publish_refusal, store_deployment};
use crate::runner::RunEnd;
use crate::worker::run_deployment;

/// Pause before a failed deployment is started again.
pub const RESTART_BACKOFF: Duration = Duration::from_secs(2);
/// How long one poll of `__transforms` waits for changes.
pub const WATCH_POLL: Duration = Duration::from_millis(500);

struct Running {
    version: u64,
    /// The principal it runs as (a record naming another restarts it).
    owner: Option<String>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<RunEnd, TransformError>>,
}

/// A record of `__transforms` that must not run, and why.
#[derive(Debug)]
pub struct RefusedRecord {
    /// The deployment, when the record decodes and its key is its name.
    pub deployment: Option<Deployment>,
    pub reason: String,
}

/// A deployment record as read from `__transforms` (key, value), checked
/// before it may run: the deployment, or why it must not run.
pub fn check_record(
    key: &str,
    value: &[u8],
    maxima: &HostMaxima,
) -> Result<Deployment, Box<RefusedRecord>> {
    let refused = |deployment, reason| Box::new(RefusedRecord { deployment, reason });
    let d = Deployment::decode(value).map_err(|e| refused(None, e.to_string()))?;
    if d.name != key {
        let reason = format!(
            "the record's key {key:?} is not the name of the deployment it holds ({:?})",
            d.name
        );
        return Err(refused(None, reason));
    }
    match d.validate_for(maxima) {
        Ok(()) => Ok(d),
        Err(e) => Err(refused(Some(d), e.to_string())),
    }
}

/// Runs the deployments of the cluster `client` is connected to until
/// `shutdown` turns true. `instance_id` names this process in status records;
/// deployments asking for more than `maxima` are refused.
pub async fn supervise(
    client: Client,
    instance_id: String,
    maxima: HostMaxima,
    as_deployer: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), TransformError> {
    ensure_internal_topics(&client).await?;
    let mut consumer = client.consumer(ConsumerConfig {
        fetch_max_wait: WATCH_POLL,
        ..ConsumerConfig::default()
    })?;
    let tp = TopicPartition::new(TRANSFORMS_TOPIC, 0);
    consumer.assign(vec![tp.clone()]);
    consumer.seek_to_beginning(&[tp]).await?;

    let mut deployments: HashMap<String, Deployment> = HashMap::new();
    let mut modules: HashMap<String, (u64, Arc<TransformModule>)> = HashMap::new();
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    loop {
        let records = tokio::select! {
            _ = shutdown.changed() => break,
            r = consumer.poll(WATCH_POLL) => r,
        };
        match records {
            Ok(records) => {
                for r in records {
                    let Some(key) = r.key.as_deref().and_then(|k| std::str::from_utf8(k).ok())
                    else {
                        continue;
                    };
                    match r.value.as_deref() {
                        None => {
                            deployments.remove(key);
                        }
                        Some(v) => match check_record(key, v, &maxima) {
                            Ok(mut d) => {
                                d.owner = deployer(&r);
                                deployments.insert(d.name.clone(), d);
                            }
                            Err(refused) => {
                                let RefusedRecord { deployment, reason } = *refused;
                                tracing::warn!(
                                    transform = key,
                                    version = deployment.as_ref().map(|d| d.version),
                                    %reason,
                                    "not running this deployment record"
                                );
                                deployments.remove(key);
                                if let Some(d) = deployment
                                    && d.state == RunState::Running
                                {
                                    publish_refusal(&client, &instance_id, &d, &reason).await;
                                }
                            }
                        },
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading {TRANSFORMS_TOPIC} failed; retrying");
                tokio::time::sleep(RESTART_BACKOFF).await;
            }
        }

        // Reap finished runners.
        let finished: Vec<String> = running
            .iter()
            .filter(|(_, r)| r.task.is_finished())
            .map(|(n, _)| n.clone())
            .collect();
        for name in finished {
            let r = running.remove(&name).expect("listed above");
            match r.task.await {
                Ok(Ok(RunEnd::Stopped)) => {}
                Ok(Ok(RunEnd::Halted(reason))) => {
                    tracing::warn!(transform = %name, %reason, "transform halted");
                }
                Ok(Err(e)) => {
                    tracing::warn!(transform = %name, error = %e, "transform failed; restarting after {RESTART_BACKOFF:?}");
                    retry_at.insert(name.clone(), Instant::now() + RESTART_BACKOFF);
                }
                Err(e) => {
                    tracing::error!(transform = %name, error = %e, "transform task panicked; restarting");
                    retry_at.insert(name.clone(), Instant::now() + RESTART_BACKOFF);
                }
            }
        }

        // Stop what should not run (or runs an old version).
        let stale: Vec<String> = running
            .iter()
            .filter(|(name, r)| {
                deployments.get(*name).is_none_or(|d| {
                    d.state != RunState::Running || d.version != r.version || d.owner != r.owner
                })
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            let r = running.remove(&name).expect("listed above");
            let _ = r.stop.send(true);
            match r.task.await {
                Ok(Err(e)) => {
                    tracing::warn!(transform = %name, error = %e, "transform stopped with an error")
                }
                Err(e) => tracing::error!(transform = %name, error = %e, "transform task panicked"),
                Ok(Ok(_)) => {}
            }
        }

        // Start what should run.
        for (name, d) in &deployments {
            if d.state != RunState::Running || running.contains_key(name) {
                continue;
            }
            if retry_at.get(name).is_some_and(|t| *t > Instant::now()) {
                continue;
            }
            retry_at.remove(name);
            let module = match modules.get(name) {
                Some((v, m)) if *v == d.version => m.clone(),
                _ => match TransformModule::compile(&d.module) {
                    Ok(m) => {
                        modules.insert(name.clone(), (d.version, m.clone()));
                        m
                    }
                    Err(e) => {
                        // Validated at deploy time; a host of another version may refuse it.
                        let mut halted = d.clone();
                        halted.state = RunState::Halted {
                            reason: format!("this host cannot run the module: {e}"),
                        };
                        let owner = as_deployer
                            .then(|| halted.owner.clone().unwrap_or_else(|| "Anonymous".into()));
                        if let Err(e) = store_deployment(&client, &halted, owner).await {
                            tracing::warn!(transform = %name, error = %e, "cannot record the halt");
                        }
                        retry_at.insert(name.clone(), Instant::now() + RESTART_BACKOFF);
                        continue;
                    }
                },
            };
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(run_deployment(
                client.clone(),
                d.clone(),
                module,
                instance_id.clone(),
                as_deployer,
                stop_rx,
            ));
            tracing::info!(transform = %name, version = d.version, "transform started");
            running.insert(
                name.clone(),
                Running {
                    version: d.version,
                    owner: d.owner.clone(),
                    stop,
                    task,
                },
            );
        }
        modules.retain(|name, _| deployments.contains_key(name));
    }
    for (name, r) in running {
        let _ = r.stop.send(true);
        if let Ok(Err(e)) = r.task.await {
            tracing::warn!(transform = %name, error = %e, "transform stopped with an error");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deployment::{ErrorPolicy, StartFrom};

    fn deployment(name: &str, memory_mb: u64) -> Deployment {
        Deployment {
            name: name.into(),
            inputs: vec!["in".into()],
            outputs: vec!["out".into()],
            on_error: ErrorPolicy::Skip,
            from: StartFrom::Earliest,
            config: vec![],
            state: RunState::Running,
            version: 2,
            deployed_at_ms: 0,
            memory_bytes_max: memory_mb << 20,
            call_timeout_ms: 1000,
            delivery: Default::default(),
            module: vec![],
            owner: None,
        }
    }

    #[test]
    fn records_are_checked_before_they_run() {
        let maxima = HostMaxima::from_config(64, 2000);
        let ok = deployment("a", 64);
        assert_eq!(check_record("a", &ok.encode(), &maxima).unwrap(), ok);
        let big = deployment("a", 65);
        let refused = check_record("a", &big.encode(), &maxima).unwrap_err();
        assert_eq!(refused.deployment.as_ref(), Some(&big));
        assert!(
            refused.reason.contains("transforms.memory_mb_max"),
            "{}",
            refused.reason
        );
        let refused = check_record("b", &ok.encode(), &maxima).unwrap_err();
        assert!(refused.deployment.is_none());
        assert!(refused.reason.contains("key \"b\""), "{}", refused.reason);
        let refused = check_record("a", b"\x07junk", &maxima).unwrap_err();
        assert!(
            refused.reason.contains("format version 7"),
            "{}",
            refused.reason
        );
        let bad_name = deployment("a/b", 1);
        let refused = check_record("a/b", &bad_name.encode(), &maxima).unwrap_err();
        assert!(
            refused.reason.contains("invalid transform name"),
            "{}",
            refused.reason
        );
    }
}
