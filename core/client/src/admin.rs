//! [`Admin`]: topic and config administration, and a view of the cluster.
//!
//! Topic creation and deletion go to the controller when the metadata names one
//! (any broker otherwise) and are retried once after a metadata refresh when the
//! broker answers NOT_CONTROLLER. Every error names the topic and says what to do.

use std::time::Instant;

use rill_proto::wire::CoordinatorKind;
use rill_proto::wire::{
    AclOperation, AclResource, AclRule, AlterConfigsRequest, AlterQuotasRequest, BrokerInfo,
    ConfigEntry, CreateAclsRequest, CreateTopicsRequest, DeleteAclsRequest, DeleteTopicsRequest,
    DescribeAclsRequest, DescribeConfigsRequest, DescribeQuotasRequest, DescribeStorageRequest,
    DescribeStorageResponse, ErrorCode, NewTopic, PartitionMetadata, Quota, TopicResult,
};
use rill_proto::wire::{CheckAccessRequest, TransformWriteRequest, TransformWriteResponse};

use crate::client::Client;
use crate::error::ClientError;

/// A topic as `describe_topic` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub partitions: Vec<PartitionMetadata>,
    pub replication_factor: usize,
    pub configs: Vec<ConfigEntry>,
}

/// The cluster as `cluster` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    pub cluster_id: String,
    pub controller_id: Option<i32>,
    pub brokers: Vec<BrokerInfo>,
}

/// Topic and config administration. Get one with [`Client::admin`].
#[derive(Debug, Clone)]
pub struct Admin {
    pub(crate) client: Client,
}

impl Admin {
    pub(crate) fn new(client: Client) -> Admin {
        Admin { client }
    }

    fn controller(&self) -> Option<i32> {
        self.client.inner.metadata.read().controller_id
    }

    /// Creates one topic. Fails with TOPIC_ALREADY_EXISTS (and the like) as a
    /// [`ClientError::Broker`] whose context names the topic.
    pub async fn create_topic(&self, topic: NewTopic) -> Result<(), ClientError> {
        let name = topic.name.clone();
        let mut results = self.create_topics(vec![topic], false).await?;
        match results.pop() {
            Some((_, result)) => result,
            None => Err(ClientError::Config(format!(
                "the broker gave no result for topic {name}"
            ))),
        }
    }

    /// Creates several topics (or, with `validate_only`, only checks them).
    /// Returns each topic's own result.
    pub async fn create_topics(
        &self,
        topics: Vec<NewTopic>,
        validate_only: bool,
    ) -> Result<Vec<(String, Result<(), ClientError>)>, ClientError> {
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let req = CreateTopicsRequest {
            topics,
            validate_only,
        };
        let results = self.to_controller(&req, |r| &r.results).await?;
        let out = per_topic(results, "create topic");
        if !validate_only {
            // Best effort: make the new topics known to this client's producers.
            let _ = self.client.metadata(Some(names)).await;
        }
        Ok(out)
    }

    /// Deletes a topic and all its data.
    pub async fn delete_topic(&self, name: &str) -> Result<(), ClientError> {
        let req = DeleteTopicsRequest {
            names: vec![name.to_string()],
        };
        let results = self.to_controller(&req, |r| &r.results).await?;
        let _ = self.client.metadata(None).await;
        match per_topic(results, "delete topic").pop() {
            Some((_, r)) => r,
            None => Err(ClientError::Config(format!(
                "the broker gave no result for topic {name}"
            ))),
        }
    }

    /// Sends a request to the controller; on NOT_CONTROLLER (whole request or
    /// every topic) refreshes the metadata and tries once more.
    async fn to_controller<R, F>(
        &self,
        req: &R,
        results: F,
    ) -> Result<Vec<TopicResult>, ClientError>
    where
        R: rill_proto::wire::ApiRequest,
        F: Fn(&R::Response) -> &Vec<TopicResult>,
    {
        let mut retried = false;
        loop {
            let started = Instant::now();
            let outcome = self.client.call(self.controller(), req, &[]).await;
            let not_controller = match &outcome {
                Err(e) => e.code() == Some(ErrorCode::NotController),
                Ok((resp, _)) => {
                    let r = results(resp);
                    !r.is_empty()
                        && r.iter().all(|t| {
                            t.error.as_ref().map(|e| e.code) == Some(ErrorCode::NotController)
                        })
                }
            };
            if not_controller && !retried {
                retried = true;
                self.client.refresh_metadata(started).await?;
                continue;
            }
            return outcome.map(|(resp, _)| results(&resp).clone());
        }
    }

    /// Every topic's name, sorted.
    pub async fn list_topics(&self) -> Result<Vec<String>, ClientError> {
        let resp = self.client.metadata(None).await?;
        let mut names: Vec<String> = resp
            .topics
            .into_iter()
            .filter(|t| t.error.is_none())
            .map(|t| t.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// A topic's partitions (leaders, replicas, offsets) and configs.
    pub async fn describe_topic(&self, name: &str) -> Result<TopicDescription, ClientError> {
        let resp = self.client.metadata(Some(vec![name.to_string()])).await?;
        let topic = resp
            .topics
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ClientError::UnknownTopic(name.to_string()))?;
        if let Some(error) = topic.error {
            return Err(if error.code == ErrorCode::UnknownTopicOrPartition {
                ClientError::UnknownTopic(name.to_string())
            } else {
                ClientError::broker(format!("describe topic {name}"), error)
            });
        }
        let configs = self.describe_configs(name).await?;
        let mut partitions = topic.partitions;
        partitions.sort_by_key(|p| p.partition);
        Ok(TopicDescription {
            name: topic.name,
            replication_factor: partitions.first().map_or(0, |p| p.replicas.len()),
            partitions,
            configs,
        })
    }

    /// Every topic (internal ones included), sorted by name, each as
    /// [`Admin::describe_topic`] shows it: one metadata request and one
    /// DescribeConfigs request for all of them, however many topics there are.
    pub async fn describe_topics(&self) -> Result<Vec<TopicDescription>, ClientError> {
        let resp = self.client.metadata(None).await?;
        let mut topics: Vec<_> = resp
            .topics
            .into_iter()
            .filter(|t| t.error.is_none())
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        let req = DescribeConfigsRequest {
            topics: topics.iter().map(|t| t.name.clone()).collect(),
        };
        let (configs, _) = self.client.call(None, &req, &[]).await?;
        let mut configs: std::collections::HashMap<String, Vec<ConfigEntry>> = configs
            .topics
            .into_iter()
            .filter(|t| t.error.is_none())
            .map(|t| (t.name, t.configs))
            .collect();
        Ok(topics
            .into_iter()
            .map(|t| {
                let mut partitions = t.partitions;
                partitions.sort_by_key(|p| p.partition);
                TopicDescription {
                    configs: configs.remove(&t.name).unwrap_or_default(),
                    name: t.name,
                    replication_factor: partitions.first().map_or(0, |p| p.replicas.len()),
                    partitions,
                }
            })
            .collect())
    }

    /// A topic's configs, defaults included (marked `is_default`).
    pub async fn describe_configs(&self, name: &str) -> Result<Vec<ConfigEntry>, ClientError> {
        let req = DescribeConfigsRequest {
            topics: vec![name.to_string()],
        };
        let (resp, _) = self.client.call(None, &req, &[]).await?;
        let topic = resp
            .topics
            .into_iter()
            .find(|t| t.name == name)
            .ok_or_else(|| ClientError::UnknownTopic(name.to_string()))?;
        match topic.error {
            None => Ok(topic.configs),
            Some(e) if e.code == ErrorCode::UnknownTopicOrPartition => {
                Err(ClientError::UnknownTopic(name.to_string()))
            }
            Some(e) => Err(ClientError::broker(
                format!("describe configs of topic {name}"),
                e,
            )),
        }
    }

    /// Where a topic's partitions keep their data: log start offset, local log
    /// start offset, local and remote (tiered) sizes. `None` when the broker does
    /// not speak DescribeStorage (older than tiered storage).
    pub async fn describe_storage(
        &self,
        name: &str,
    ) -> Result<Option<DescribeStorageResponse>, ClientError> {
        let req = DescribeStorageRequest {
            topics: vec![name.to_string()],
        };
        match self.client.call(None, &req, &[]).await {
            Ok((resp, _)) => Ok(Some(resp)),
            Err(ClientError::Broker { error, .. })
                if error.code == ErrorCode::UnsupportedVersion =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Sets and removes topic configs (removed keys go back to the broker default).
    pub async fn alter_configs(
        &self,
        name: &str,
        set: Vec<(String, String)>,
        delete: Vec<String>,
    ) -> Result<(), ClientError> {
        let req = AlterConfigsRequest {
            topic: name.to_string(),
            set,
            delete,
            validate_only: false,
        };
        let (resp, _) = self.client.call(self.controller(), &req, &[]).await?;
        match resp.error {
            None => Ok(()),
            Some(e) if e.code == ErrorCode::UnknownTopicOrPartition => {
                Err(ClientError::UnknownTopic(name.to_string()))
            }
            Some(e) => Err(ClientError::broker(
                format!("alter configs of topic {name}"),
                e,
            )),
        }
    }

    /// Raises topic `name`'s partition count to `count` (it only grows; the
    /// new partitions get as many replicas as the first one has).
    pub async fn create_partitions(&self, name: &str, count: u32) -> Result<(), ClientError> {
        let req = rill_proto::wire::CreatePartitionsRequest {
            topic: name.to_string(),
            count,
            validate_only: false,
        };
        let (resp, _) = self.client.call(self.controller(), &req, &[]).await?;
        match resp.error {
            None => Ok(()),
            Some(e) if e.code == ErrorCode::UnknownTopicOrPartition => {
                Err(ClientError::UnknownTopic(name.to_string()))
            }
            Some(e) => Err(ClientError::broker(
                format!("add partitions to topic {name}"),
                e,
            )),
        }
    }

    /// Adds ACL allow rules (kept by the cluster's metadata quorum; needs alter
    /// on the cluster). Returns how many were new.
    pub async fn create_acls(&self, rules: Vec<AclRule>) -> Result<u32, ClientError> {
        let (resp, _) = self
            .client
            .call(self.controller(), &CreateAclsRequest { rules }, &[])
            .await?;
        Ok(resp.created)
    }

    /// Removes ACL allow rules; returns how many were there.
    pub async fn delete_acls(&self, rules: Vec<AclRule>) -> Result<u32, ClientError> {
        let (resp, _) = self
            .client
            .call(self.controller(), &DeleteAclsRequest { rules }, &[])
            .await?;
        Ok(resp.deleted)
    }

    /// The ACL rules (of one principal, or all; needs describe on the cluster).
    pub async fn describe_acls(
        &self,
        principal: Option<&str>,
    ) -> Result<Vec<AclRule>, ClientError> {
        let req = DescribeAclsRequest {
            principal: principal.map(str::to_string),
        };
        let (resp, _) = self.client.call(None, &req, &[]).await?;
        Ok(resp.rules)
    }

    /// Sets a principal's byte-rate quotas (both `None` removes them).
    pub async fn set_quota(&self, principal: &str, quota: Quota) -> Result<(), ClientError> {
        let req = AlterQuotasRequest {
            principal: principal.to_string(),
            quota,
        };
        self.client.call(self.controller(), &req, &[]).await?;
        Ok(())
    }

    /// The quotas set (of one principal, or all).
    pub async fn describe_quotas(
        &self,
        principal: Option<&str>,
    ) -> Result<Vec<(String, Quota)>, ClientError> {
        let req = DescribeQuotasRequest {
            principal: principal.map(str::to_string),
        };
        let (resp, _) = self.client.call(None, &req, &[]).await?;
        Ok(resp.quotas)
    }

    /// Sets a SCRAM user's credentials (derived on this side, see
    /// [`rill_proto::scram::ScramCredential::derive`]); an empty list
    /// removes the user. Whether the user existed.
    pub async fn set_user(
        &self,
        name: &str,
        credentials: Vec<rill_proto::scram::ScramCredential>,
    ) -> Result<bool, ClientError> {
        let req = rill_proto::wire::AlterUserRequest {
            name: name.to_string(),
            credentials,
        };
        let (resp, _) = self.client.call(self.controller(), &req, &[]).await?;
        Ok(resp.existed)
    }

    /// The SCRAM users and their mechanisms.
    pub async fn describe_users(
        &self,
    ) -> Result<Vec<rill_proto::wire::UserDescription>, ClientError> {
        let req = rill_proto::wire::DescribeUsersRequest {};
        let (resp, _) = self.client.call(None, &req, &[]).await?;
        Ok(resp.users)
    }

    /// Writes a transform deployment record (`value`), or deletes one
    /// (`None`), through the leader of `__transforms`-0, which checks that the
    /// caller may deploy it (alter on the transform, read on `inputs`, write on
    /// `outputs`; delete on the transform to delete) and stamps it with the
    /// principal it runs as (the caller's; a broker may name `owner`).
    /// Retried while leadership moves.
    pub async fn write_transform(
        &self,
        req: &TransformWriteRequest,
    ) -> Result<TransformWriteResponse, ClientError> {
        const TOPIC: &str = "__transforms";
        let mut attempts = 0;
        loop {
            let started = Instant::now();
            self.client.topic(TOPIC).await?;
            let leader = self.client.leader(TOPIC, 0);
            match self.client.call(leader, req, &[]).await {
                Ok((resp, _)) => return Ok(resp),
                Err(e) if attempts < 5 && e.code().is_some_and(ErrorCode::is_retriable) => {
                    attempts += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(200 * attempts)).await;
                    self.client.refresh_metadata(started).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Which of `checks` `principal` (`User:NAME`, `Anonymous`, `Broker:ID`)
    /// may not do: one reason per refused check (brokers only).
    pub async fn check_access(
        &self,
        principal: &str,
        checks: Vec<(AclOperation, AclResource)>,
    ) -> Result<Vec<String>, ClientError> {
        let denied = self.check_each(principal, checks).await?;
        Ok(denied.into_iter().flatten().collect())
    }

    /// As [`Self::check_access`], one answer per check in order: `None` when
    /// allowed, else why not (brokers only).
    pub async fn check_each(
        &self,
        principal: &str,
        checks: Vec<(AclOperation, AclResource)>,
    ) -> Result<Vec<Option<String>>, ClientError> {
        let mut out = vec![None; checks.len()];
        let req = CheckAccessRequest {
            principal: principal.to_string(),
            checks,
        };
        let (resp, _) = self.client.call(None, &req, &[]).await?;
        for (i, why) in resp.denied {
            // An index out of range is the broker's mistake: refuse everything
            // rather than allow the check it meant.
            let Some(slot) = out.get_mut(i as usize) else {
                let why = format!(
                    "the broker's CheckAccess answer names check {i} of {}",
                    out.len()
                );
                return Ok(vec![Some(why); out.len()]);
            };
            *slot = Some(why);
        }
        Ok(out)
    }

    /// The transactions every broker coordinates (each broker is asked),
    /// filtered by state names (empty: any), sorted by transactional id.
    pub async fn list_transactions(
        &self,
        states: &[String],
    ) -> Result<Vec<rill_proto::wire::TransactionListing>, ClientError> {
        let req = rill_proto::wire::ListTransactionsRequest {
            states: states.to_vec(),
            producer_ids: Vec::new(),
            min_duration_ms: -1,
        };
        let mut out = Vec::new();
        for b in self.cluster().await?.brokers {
            let (resp, _) = self.client.call(Some(b.id), &req, &[]).await?;
            if let Some(e) = resp.error {
                return Err(ClientError::broker(
                    format!("listing the transactions of broker {}", b.id),
                    e,
                ));
            }
            if let Some(s) = resp.unknown_states.first() {
                return Err(ClientError::Config(format!(
                    "{s:?} is not a transaction state (Empty, Ongoing, PrepareCommit, \
                     PrepareAbort, CompleteCommit, CompleteAbort)"
                )));
            }
            out.extend(resp.transactions);
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(out)
    }

    /// A transactional id's state, from its transaction coordinator.
    pub async fn describe_transaction(
        &self,
        transactional_id: &str,
    ) -> Result<rill_proto::wire::TransactionDescription, ClientError> {
        let coordinator = self
            .client
            .find_coordinator_of(transactional_id, CoordinatorKind::Transaction)
            .await?;
        let req = rill_proto::wire::DescribeTransactionsRequest {
            transactional_ids: vec![transactional_id.to_string()],
        };
        let (resp, _) = self.client.call(Some(coordinator), &req, &[]).await?;
        let d = resp.transactions.into_iter().next().ok_or_else(|| {
            ClientError::Config(format!(
                "broker {coordinator} did not answer for {transactional_id:?}"
            ))
        })?;
        match d.error {
            Some(e) => Err(ClientError::broker(
                format!("describing transactional id {transactional_id:?}"),
                e,
            )),
            None => Ok(d),
        }
    }

    /// The cluster id, the controller and the brokers (sorted by id).
    pub async fn cluster(&self) -> Result<ClusterInfo, ClientError> {
        let resp = self.client.metadata(Some(Vec::new())).await?;
        let mut brokers = resp.brokers;
        brokers.sort_by_key(|b| b.id);
        Ok(ClusterInfo {
            cluster_id: resp.cluster_id,
            controller_id: resp.controller_id,
            brokers,
        })
    }
}

fn per_topic(results: Vec<TopicResult>, action: &str) -> Vec<(String, Result<(), ClientError>)> {
    results
        .into_iter()
        .map(|t| {
            let r = match t.error {
                None => Ok(()),
                Some(e) => Err(ClientError::broker(format!("{action} {}", t.name), e)),
            };
            (t.name, r)
        })
        .collect()
}
