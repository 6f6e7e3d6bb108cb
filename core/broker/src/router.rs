//! The router: every api of the broker registered once, with its typed request
//! and response, and the one path a request takes from frame to reply.
//!
//! [`Router::route`] does, for every api, in this order: find the route (an
//! unknown api key is UNSUPPORTED_VERSION naming the keys this broker speaks),
//! count the request (`rill_requests_total{api}`), check the version, check
//! that only an api that carries record batches has a payload, decode the
//! request, [`authorize`] the caller for the resources the request names, call
//! the typed handler, encode its typed answer, count a whole-request error
//! (`rill_request_errors_total{api,code}`), and time the request
//! (`rill_request_duration_seconds{api}`, from when the transport began
//! reading it until its reply is written: see [`Served`]). Handlers see typed
//! requests and return typed responses or a whole-request error; they count
//! their own per-partition errors.
//!
//! The table ([`table`]) maps each [`ApiKey`] to one handler. The request type
//! fixes the api key, the version and the response type ([`ApiRequest`]), so a
//! handler cannot answer an api with another api's response.
//!
//! Invariants:
//! - Every `ApiKey::ALL` entry is routed exactly once (registering a key twice
//!   panics when the table is built; a unit test checks none is missing).
//! - Record batches are not touched here: Produce gets the frame's payload as
//!   it arrived (a [`Rope`] of the stream's buffers) and Fetch's batches go
//!   out as its handler read them; only the meta is decoded and encoded.
//! - A bad request (unknown key, unsupported version, stray payload,
//!   undecodable meta, refused by `authorize`, failed by its handler) becomes an
//!   error reply on its own stream, never a panic or a closed connection.

use crate::handlers;
use crate::metrics::ApiMetrics;
use crate::state::BrokerState;
use bytes::Bytes;
use rill_proto::Rope;
use rill_proto::wire::AclOperation;
use rill_proto::wire::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

pub use crate::auth::{Caller, Principal, Resource};

/// What a handler answers, typed.
#[derive(Debug)]
pub enum Answer<T> {
    /// The response.
    Response(T),
    /// The response, with raw bytes after the meta (Fetch: record batches as
    /// they lie on disk, in the order the response lists them).
    WithPayload(T, Vec<Bytes>),
    /// No response frame (Produce with acks=None): the stream is just finished.
    Nothing,
}

impl<T> From<T> for Answer<T> {
    fn from(response: T) -> Answer<T> {
        Answer::Response(response)
    }
}

impl<T: serde::Serialize> Answer<T> {
    fn encode(self) -> Reply {
        match self {
            Answer::Response(response) => Reply::Frame {
                meta: encode_meta(&ResponseMeta::<T>::Ok(response)),
                payload: Vec::new(),
            },
            Answer::WithPayload(response, payload) => Reply::Frame {
                meta: encode_meta(&ResponseMeta::<T>::Ok(response)),
                payload,
            },
            Answer::Nothing => Reply::Nothing,
        }
    }
}

/// What to send back on the stream, encoded.
#[derive(Debug)]
pub enum Reply {
    /// One response frame.
    Frame { meta: Vec<u8>, payload: Vec<Bytes> },
    /// No response frame (produce with acks=None): just finish the stream.
    Nothing,
}

impl Reply {
    /// A whole-request error (decodes as `ResponseMeta<T>` for any `T`).
    pub fn error(info: ErrorInfo) -> Reply {
        Reply::Frame {
            meta: encode_meta(&ResponseMeta::<()>::Err(info)),
            payload: Vec::new(),
        }
    }
}

/// A routed request's reply, and the timer of its api's duration histogram:
/// the transport drops `timer` once it has written the reply.
#[derive(Debug)]
pub struct Served {
    pub reply: Reply,
    pub timer: Option<RequestTimer>,
}

/// Records a request's duration when dropped.
#[derive(Debug)]
pub struct RequestTimer {
    metrics: ApiMetrics,
    local: Arc<crate::metrics::LocalStats>,
    api: ApiKey,
    started: Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        let took = self.started.elapsed();
        self.metrics.duration.record(took.as_secs_f64());
        self.local.record(self.api, took);
    }
}

/// Whether an api's requests carry raw bytes after the meta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Payload {
    /// None: a request with a payload is refused.
    None,
    /// Record batches (Produce), handed to the handler as they arrived.
    Batches,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Decodes, authorizes and calls one api's handler, and encodes its answer.
type Serve = dyn Fn(&Arc<Caller>, &Arc<BrokerState>, &[u8], Rope) -> BoxFuture<Result<Reply, ErrorInfo>>
    + Send
    + Sync;

/// Which resources a request names, for [`authorize`].
type Resources<R> = fn(&R) -> Vec<Resource<'_>>;

/// One api's entry in the table.
struct Route {
    key: ApiKey,
    /// The one version of the request's layout this broker speaks.
    version: u16,
    payload: Payload,
    serve: Box<Serve>,
}

/// The table under construction.
#[derive(Default)]
struct Table {
    routes: Vec<Route>,
}

impl Table {
    /// Registers the handler of request type `R` (which fixes the api key, the
    /// version and the response type). Panics if `R::KEY` has a route already.
    fn add<R, F, Fut, O>(&mut self, payload: Payload, resources: Resources<R>, handler: F)
    where
        R: ApiRequest + Send + 'static,
        R::Response: Send + 'static,
        F: Fn(Arc<BrokerState>, Arc<Caller>, R, Rope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ErrorInfo>> + Send + 'static,
        O: Into<Answer<R::Response>>,
    {
        assert!(
            self.routes.iter().all(|r| r.key != R::KEY),
            "{} is routed twice",
            R::KEY.name()
        );
        let serve = move |caller: &Arc<Caller>,
                          state: &Arc<BrokerState>,
                          meta: &[u8],
                          bytes: Rope|
              -> BoxFuture<Result<Reply, ErrorInfo>> {
            let request = match decode_meta::<R>(meta) {
                Ok(r) => r,
                Err(e) => {
                    let e = ErrorInfo::new(ErrorCode::InvalidRequest, e.to_string());
                    return Box::pin(std::future::ready(Err(e)));
                }
            };
            if let Err(e) = crate::limits::check_counts(R::KEY, &request) {
                return Box::pin(std::future::ready(Err(e)));
            }
            let image = state.cluster.image();
            if let Err(e) = state
                .auth
                .authorize(&image, caller, R::KEY, &resources(&request))
            {
                return Box::pin(std::future::ready(Err(e)));
            }
            drop(image);
            let answer = handler(state.clone(), caller.clone(), request, bytes);
            Box::pin(async move { Ok(answer.await?.into().encode()) })
        };
        self.routes.push(Route {
            key: R::KEY,
            version: R::VERSION,
            payload,
            serve: Box::new(serve),
        });
    }
}

/// No resources: allowed to every caller the broker accepted (ApiVersions),
/// answered for what the caller may see (Metadata,
/// ListGroups), or checked by the broker-only rule (the internal apis).
fn none<R>(_: &R) -> Vec<Resource<'_>> {
    Vec::new()
}

fn cluster_alter<R>(_: &R) -> Vec<Resource<'_>> {
    vec![Resource::Cluster(AclOperation::Alter)]
}

fn cluster_describe<R>(_: &R) -> Vec<Resource<'_>> {
    vec![Resource::Cluster(AclOperation::Describe)]
}

fn topics<'a>(op: AclOperation, names: impl IntoIterator<Item = &'a String>) -> Vec<Resource<'a>> {
    let mut out: Vec<Resource<'a>> = names.into_iter().map(|n| Resource::Topic(op, n)).collect();
    out.dedup();
    out
}

fn groups<'a>(op: AclOperation, ids: impl IntoIterator<Item = &'a String>) -> Vec<Resource<'a>> {
    ids.into_iter().map(|g| Resource::Group(op, g)).collect()
}

/// The table of every api: its request type, whether it carries a payload, the
/// resources it names, and its handler.
fn table() -> Table {
    use crate::cluster::api as cluster_api;
    use crate::group::service as group;
    use AclOperation::*;
    use Payload::None as Meta;
    let mut t = Table::default();

    t.add::<ApiVersionsRequest, _, _, _>(Meta, none, |s, _, _, _| async move {
        Ok(handlers::api_versions(&s))
    });
    t.add::<MetadataRequest, _, _, _>(Meta, none, |s, c, r, _| async move {
        Ok(handlers::metadata(&s, &c, r))
    });
    t.add::<CreateTopicsRequest, _, _, _>(
        Meta,
        |r| topics(Create, r.topics.iter().map(|t| &t.name)),
        |s, _, r, _| async move { handlers::create_topics(&s, r).await },
    );
    t.add::<DeleteTopicsRequest, _, _, _>(
        Meta,
        |r| topics(Delete, &r.names),
        |s, _, r, _| async move { handlers::delete_topics(&s, r).await },
    );
    t.add::<DescribeConfigsRequest, _, _, _>(
        Meta,
        |r| topics(Describe, &r.topics),
        |s, _, r, _| async move { Ok(handlers::describe_configs(&s, r)) },
    );
    t.add::<AlterConfigsRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Topic(Alter, &r.topic)],
        |s, _, r, _| async move { handlers::alter_configs(&s, r).await },
    );
    t.add::<DescribeProducersRequest, _, _, _>(
        Meta,
        |r| topics(Read, r.partitions.iter().map(|p| &p.topic)),
        // Off the worker: it takes each partition's log, which a compaction
        // pass may hold for long.
        |s, _, r, _| async move {
            handlers::blocking(move || handlers::describe_producers(&s, r)).await
        },
    );
    t.add::<CreatePartitionsRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Topic(Alter, &r.topic)],
        |s, _, r, _| async move { handlers::create_partitions(&s, r).await },
    );
    t.add::<ProduceRequest, _, _, _>(
        Payload::Batches,
        |r| topics(Write, r.partitions.iter().map(|p| &p.topic)),
        |s, _, r, batches| async move { handlers::produce(&s, r, batches).await },
    );
    t.add::<FetchRequest, _, _, _>(
        Meta,
        |r| match r.replica_id {
            Some(broker) => r
                .partitions
                .iter()
                .map(|p| Resource::Replica {
                    broker,
                    topic: &p.topic,
                    partition: p.partition,
                })
                .collect(),
            None => topics(Read, r.partitions.iter().map(|p| &p.topic)),
        },
        |s, _, r, _| async move { handlers::fetch(&s, r).await },
    );
    t.add::<ListOffsetsRequest, _, _, _>(
        Meta,
        |r| topics(Describe, r.partitions.iter().map(|p| &p.topic)),
        |s, _, r, _| async move { Ok(handlers::list_offsets(&s, r).await) },
    );
    t.add::<DescribeStorageRequest, _, _, _>(
        Meta,
        |r| topics(Describe, &r.topics),
        |s, _, r, _| async move { Ok(handlers::describe_storage(&s, r)) },
    );
    t.add::<InitProducerIdRequest, _, _, _>(
        Meta,
        |_| vec![Resource::IdempotentWrite],
        |s, _, r, _| async move {
            match &r.transactional_id {
                None => cluster_api::init_producer_id(&s).await,
                Some(id) => {
                    crate::txn::service::init_producer_id(&s, id, r.transaction_timeout_ms).await
                }
            }
        },
    );
    // Transactions: the coordinator's apis (the topics' write ACLs apply),
    // and the marker writes between brokers.
    t.add::<AddPartitionsToTxnRequest, _, _, _>(
        Meta,
        |r| topics(Write, r.topics.iter().map(|t| &t.topic)),
        |s, _, r, _| async move { Ok(crate::txn::service::add_partitions(&s, r).await) },
    );
    t.add::<EndTxnRequest, _, _, _>(
        Meta,
        |_| vec![Resource::IdempotentWrite],
        |s, _, r, _| async move { Ok(crate::txn::service::end_txn(&s, r).await) },
    );
    t.add::<WriteTxnMarkersRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        Ok(crate::txn::service::write_txn_markers(&s, r).await)
    });
    t.add::<TxnOffsetCommitRequest, _, _, _>(
        Meta,
        |r| {
            let mut out = vec![Resource::Group(Read, &r.group_id)];
            out.extend(topics(Read, r.partitions.iter().map(|p| &p.topic)));
            out
        },
        |s, _, r, _| async move { Ok(crate::txn::service::txn_offset_commit(&s, r).await) },
    );
    t.add::<CommitTxnOffsetsRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        Ok(crate::group::service::commit_txn_offsets(&s, r).await)
    });
    // Admin views of transactions: Kafka asks Describe on each transactional
    // id; Rill has no ACLs on transactional ids, so Describe on the cluster.
    t.add::<DescribeTransactionsRequest, _, _, _>(
        Meta,
        cluster_describe,
        |s, _, r, _| async move { Ok(crate::txn::service::describe_transactions(&s, r).await) },
    );
    t.add::<ListTransactionsRequest, _, _, _>(Meta, cluster_describe, |s, _, r, _| async move {
        Ok(crate::txn::service::list_transactions(&s, r).await)
    });

    // Consumer groups.
    t.add::<FindCoordinatorRequest, _, _, _>(
        Meta,
        |r| match r.kind {
            CoordinatorKind::Group => vec![Resource::Group(Describe, &r.group_id)],
            CoordinatorKind::Transaction => Vec::new(),
        },
        |s, _, r, _| async move { Ok(group::find_coordinator_api(&s, r).await) },
    );
    t.add::<ConsumerGroupHeartbeatRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Read, &r.group_id)],
        |s, _, r, _| async move { Ok(group::heartbeat(&s, r).await) },
    );
    t.add::<OffsetCommitRequest, _, _, _>(
        Meta,
        |r| {
            let mut out = vec![Resource::Group(Read, &r.group_id)];
            out.extend(topics(Read, r.partitions.iter().map(|p| &p.topic)));
            out
        },
        |s, _, r, _| async move { Ok(group::offset_commit(&s, r).await) },
    );
    t.add::<OffsetFetchRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Describe, &r.group_id)],
        |s, _, r, _| async move { Ok(group::offset_fetch(&s, r).await) },
    );
    t.add::<ListGroupsRequest, _, _, _>(Meta, none, |s, c, r, _| async move {
        Ok(handlers::visible_groups(
            &s,
            &c,
            group::list_groups(&s, r).await,
        ))
    });
    t.add::<DescribeGroupsRequest, _, _, _>(
        Meta,
        |r| groups(Describe, &r.group_ids),
        |s, _, r, _| async move { Ok(group::describe_groups(&s, r).await) },
    );
    t.add::<DeleteGroupsRequest, _, _, _>(
        Meta,
        |r| groups(Delete, &r.group_ids),
        |s, _, r, _| async move { Ok(group::delete_groups(&s, r).await) },
    );
    // Kafka's classic group protocol (the Kafka listener's JoinGroup & co.).
    t.add::<JoinGroupRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Read, &r.group_id)],
        |s, _, r, _| async move { Ok(group::join_group(&s, r).await) },
    );
    t.add::<SyncGroupRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Read, &r.group_id)],
        |s, _, r, _| async move { Ok(group::sync_group(&s, r).await) },
    );
    t.add::<GroupHeartbeatRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Read, &r.group_id)],
        |s, _, r, _| async move { Ok(group::group_heartbeat(&s, r).await) },
    );
    t.add::<LeaveGroupRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Group(Read, &r.group_id)],
        |s, _, r, _| async move { Ok(group::leave_group(&s, r).await) },
    );

    // Between brokers: the metadata quorum and replication (broker principals
    // only, whatever the auth mode: see `auth::broker_only`).
    t.add::<RaftRpcRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        s.cluster.handle_raft_rpc(r).await
    });
    t.add::<JoinClusterRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        s.cluster.handle_join(r).await
    });
    t.add::<BrokerHeartbeatRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        s.cluster.handle_heartbeat(r)
    });
    t.add::<MetadataWriteRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        s.cluster.handle_metadata_write(r).await
    });
    // Followers truncating (KIP-101), and consumers checking their position
    // after a leader change (KIP-320, Kafka clients): describe on the topic.
    t.add::<OffsetForLeaderEpochRequest, _, _, _>(
        Meta,
        |r| vec![Resource::Topic(Describe, &r.topic)],
        // Off the worker: it takes the partition's log (see DescribeProducers).
        |s, _, r, _| async move {
            handlers::blocking(move || cluster_api::offset_for_leader_epoch(&s, r))
                .await
                .and_then(|answer| answer)
        },
    );
    t.add::<AlterPartitionRequest, _, _, _>(Meta, none, |s, _, r, _| async move {
        cluster_api::alter_partition(&s, r).await
    });
    t.add::<ElectLeadersRequest, _, _, _>(Meta, cluster_alter, |s, _, r, _| async move {
        cluster_api::elect_leaders(&s, r).await
    });

    // Access control, kept in the metadata quorum.
    t.add::<CreateAclsRequest, _, _, _>(Meta, cluster_alter, |s, _, r, _| async move {
        cluster_api::create_acls(&s, r).await
    });
    t.add::<DescribeAclsRequest, _, _, _>(Meta, cluster_describe, |s, _, r, _| async move {
        Ok(cluster_api::describe_acls(&s, r))
    });
    t.add::<DeleteAclsRequest, _, _, _>(Meta, cluster_alter, |s, _, r, _| async move {
        cluster_api::delete_acls(&s, r).await
    });
    t.add::<AlterQuotasRequest, _, _, _>(Meta, cluster_alter, |s, _, r, _| async move {
        cluster_api::alter_quotas(&s, r).await
    });
    t.add::<DescribeQuotasRequest, _, _, _>(Meta, cluster_describe, |s, _, r, _| async move {
        Ok(cluster_api::describe_quotas(&s, r))
    });
    t.add::<AlterUserRequest, _, _, _>(Meta, cluster_alter, |s, _, r, _| async move {
        cluster_api::alter_user(&s, r).await
    });
    t.add::<DescribeUsersRequest, _, _, _>(Meta, cluster_describe, |s, _, _, _| async move {
        Ok(cluster_api::describe_users(&s))
    });

    // Transform deployments: the broker writes `__transforms` for a caller
    // allowed to deploy what the record names, stamped with its principal.
    t.add::<TransformWriteRequest, _, _, _>(
        Meta,
        |r| match r.value {
            None => vec![Resource::Transform(Delete, &r.name)],
            Some(_) => {
                let mut out = vec![Resource::Transform(Alter, &r.name)];
                out.extend(topics(Read, &r.inputs));
                out.extend(topics(Write, &r.outputs));
                out
            }
        },
        |s, c, r, _| async move { handlers::transform_write(&s, &c, r).await },
    );
    t.add::<CheckAccessRequest, _, _, _>(Meta, none, |s, c, r, _| async move {
        handlers::check_access(&s, &c, r)
    });
    t.add::<DescribeBrokerStatsRequest, _, _, _>(Meta, cluster_describe, |s, _, _, _| async move {
        Ok(s.metrics.local.snapshot(s.config.id))
    });
    t
}

/// The broker's router: the table, built once, and the state its handlers get.
pub struct Router {
    state: Arc<BrokerState>,
    routes: Vec<Route>,
    /// Index into `routes` by api key number.
    by_key: Vec<Option<usize>>,
    /// The metric handles of each route (same index).
    metrics: Vec<ApiMetrics>,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let apis: Vec<&str> = self.routes.iter().map(|r| r.key.name()).collect();
        f.debug_struct("Router")
            .field("apis", &apis)
            .finish_non_exhaustive()
    }
}

impl Router {
    pub fn new(state: Arc<BrokerState>) -> Router {
        let routes = table().routes;
        let mut by_key = Vec::new();
        for (i, r) in routes.iter().enumerate() {
            let k = r.key as usize;
            if by_key.len() <= k {
                by_key.resize(k + 1, None);
            }
            by_key[k] = Some(i);
        }
        let metrics = routes
            .iter()
            .map(|r| state.metrics.api(r.key).clone())
            .collect();
        Router {
            state,
            routes,
            by_key,
            metrics,
        }
    }

    /// Serves one request (api key `key`, `version`, its meta and payload) from
    /// `caller`; `started` is when the transport began reading it.
    pub async fn route(
        &self,
        caller: &Arc<Caller>,
        key: u16,
        version: u16,
        meta: Bytes,
        payload: Rope,
        started: Instant,
    ) -> Served {
        let state = &self.state;
        let Some(i) = self.by_key.get(key as usize).copied().flatten() else {
            let error = ErrorInfo::new(
                ErrorCode::UnsupportedVersion,
                format!(
                    "api key {key} (version {version}) is not supported by this broker; it speaks api keys {}",
                    ApiKey::ALL
                        .iter()
                        .map(|k| (*k as u16).to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            tracing::warn!(peer = %caller.peer, error = %error, "unsupported request");
            state.metrics.error("unknown", error.code);
            return Served {
                reply: Reply::error(error),
                timer: None,
            };
        };
        let route = &self.routes[i];
        let api = route.key;
        let metrics = &self.metrics[i];
        metrics.requests.increment(1);
        let timer = Some(RequestTimer {
            metrics: metrics.clone(),
            local: state.metrics.local.clone(),
            api,
            started,
        });
        let produced = payload.len() as u64;
        // A cluster-internal api from anyone but a broker is refused before its
        // body is even decoded.
        let result = match crate::auth::check_broker_only(&caller.principal, api)
            .and_then(|()| check(route, version, &payload))
        {
            Ok(()) => (route.serve)(caller, state, &meta, payload).await,
            Err(e) => Err(e),
        };
        let reply = match result {
            Ok(reply) => {
                throttle(state, caller, api, produced, &reply).await;
                reply
            }
            Err(error) => {
                tracing::warn!(peer = %caller.peer, api = api.name(), error = %error, "bad request");
                state.metrics.error(api.name(), error.code);
                Reply::error(error)
            }
        };
        Served { reply, timer }
    }
}

impl Router {
    /// Serves one typed request through [`Router::route`], the same path as a
    /// QUIC frame (version check, counts, authorization, handler, quota,
    /// metrics), for a front door that speaks another protocol (rill-kafka).
    /// The meta is encoded and the answer's meta decoded (small; batches in
    /// `payload` and in the answer pass through untouched). `Ok(None)`: the
    /// request asked for no answer (Produce with acks=None).
    pub async fn call<R: ApiRequest>(
        &self,
        caller: &Arc<Caller>,
        request: &R,
        payload: Rope,
    ) -> Result<Option<(R::Response, Vec<Bytes>)>, ErrorInfo> {
        let meta = Bytes::from(encode_meta(request));
        let served = self
            .route(
                caller,
                R::KEY as u16,
                R::VERSION,
                meta,
                payload,
                Instant::now(),
            )
            .await;
        match served.reply {
            Reply::Nothing => Ok(None),
            Reply::Frame { meta, payload } => {
                match decode_meta::<ResponseMeta<R::Response>>(&meta) {
                    Ok(Ok(response)) => Ok(Some((response, payload))),
                    Ok(Err(error)) => Err(error),
                    Err(e) => Err(ErrorInfo::new(
                        ErrorCode::InternalError,
                        format!("{} answer did not decode: {e}", R::KEY.name()),
                    )),
                }
            }
        }
    }
}

/// Delays a Produce or Fetch answer while its principal is over its byte-rate
/// quota (Kafka's throttling: the response waits, it does not fail).
async fn throttle(state: &BrokerState, caller: &Caller, api: ApiKey, produced: u64, reply: &Reply) {
    use crate::quota::Direction;
    let Principal::User(name) = &caller.principal else {
        return;
    };
    let (direction, bytes) = match (api, reply) {
        (ApiKey::Produce, _) => (Direction::Produce, produced),
        (ApiKey::Fetch, Reply::Frame { payload, .. }) => (
            Direction::Fetch,
            payload.iter().map(|b| b.len() as u64).sum(),
        ),
        _ => return,
    };
    let image = state.cluster.image();
    let delay = state.quotas.charge(
        name,
        image.quotas.get(name),
        direction,
        bytes,
        Instant::now(),
    );
    drop(image);
    if !delay.is_zero() {
        state.metrics.throttled(api.name(), delay);
        tokio::time::sleep(delay).await;
    }
}

/// The checks before decoding: the version, and a payload only where the api
/// carries one.
fn check(route: &Route, version: u16, payload: &Rope) -> Result<(), ErrorInfo> {
    let api = route.key;
    if version != route.version {
        return Err(ErrorInfo::new(
            ErrorCode::UnsupportedVersion,
            format!(
                "{} (api key {}) version {version} is not supported: this broker speaks version {} only",
                api.name(),
                api as u16,
                route.version
            ),
        ));
    }
    if route.payload == Payload::None && !payload.is_empty() {
        return Err(ErrorInfo::new(
            ErrorCode::InvalidRequest,
            format!(
                "{} requests carry no payload, but this one has {} bytes",
                api.name(),
                payload.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_is_routed_exactly_once() {
        let routes = table().routes;
        for key in ApiKey::ALL {
            let n = routes.iter().filter(|r| r.key == key).count();
            assert_eq!(n, 1, "{} is routed {n} times", key.name());
        }
        assert_eq!(
            routes.len(),
            ApiKey::ALL.len(),
            "a route outside ApiKey::ALL"
        );
    }

    #[test]
    fn only_produce_carries_a_payload() {
        for r in table().routes {
            assert_eq!(
                r.payload == Payload::Batches,
                r.key == ApiKey::Produce,
                "{}",
                r.key.name()
            );
        }
    }
}
