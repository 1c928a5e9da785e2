//! Worker pools, one per model: membership (discovery), health, selection,
//! and the call that retries on another worker until the first event.
//!
//! After the first event a generation is committed to its worker: a failure
//! then reaches the client as an error frame, never as a silent retry (the
//! client already saw tokens).

mod call;
mod count;
mod discovery;
mod endpoint;
mod failure;
mod health;
mod kubernetes;
mod peers;
mod preempt;
mod prefixes;
mod queue;
pub mod select;
mod timing;

pub use call::{CallGuard, WorkerCall};
use call::{CallTiming, RunningPrompt};
pub use endpoint::WorkerEndpoint;
pub use failure::{classify, Failure, PoolError};
pub use preempt::{Lever, PreemptPolicy};
pub use queue::{QueueLimits, Shed, Stage, Ticket};

use crate::config::PoolPolicy;
use crate::metrics::METRICS;
use crate::redis::RedisHandle;
use discovery::Target;
use inference_proto::v1 as pb;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use telemetry::TraceParent;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::ClientTlsConfig;
use tonic::{Status, Streaming};

/// How many distinct workers one request may try before the first token.
const MAX_ATTEMPTS: usize = 3;
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// Active health checks and load polling.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// Re-resolution of `dns://` and `k8s://` targets.
const RESOLVE_INTERVAL: Duration = Duration::from_secs(5);

/// One model's configured workers, selection policy and queue.
pub struct PoolSpec {
    pub model: String,
    pub workers: Vec<String>,
    pub policy: PoolPolicy,
    pub queue: QueueLimits,
    /// Silence after a call's first event that counts as a failed worker.
    pub stall_timeout: Duration,
}

/// The `authorization` metadata every call to a worker carries when the
/// workers require a shared token (`GATEWAY_WORKER_TOKEN`).
pub type WorkerAuth = Option<MetadataValue<tonic::metadata::Ascii>>;

/// `Bearer <token>` as gRPC metadata; `None` without a token.
pub fn worker_auth(token: Option<&str>) -> anyhow::Result<WorkerAuth> {
    token
        .map(|t| {
            MetadataValue::try_from(format!("Bearer {t}"))
                .map_err(|_| anyhow::anyhow!("the worker token must be printable ASCII"))
        })
        .transpose()
}

/// All pools, by model id.
pub struct Pools {
    by_model: HashMap<String, Arc<WorkerPool>>,
    /// The Kubernetes API, when any pool has a `k8s://` target.
    kube: Option<Arc<kubernetes::KubeApi>>,
    /// With Redis: the store the queues share their order through, and
    /// this replica's id there.
    shared: Option<(Arc<RedisHandle>, String)>,
}

impl Pools {
    /// Pools of `specs`; every call carries `auth`, over TLS with `tls`
    /// (`[worker_tls]`). With `redis`, each queue's order holds across the
    /// replicas sharing it ([`peers`]).
    pub fn new(
        specs: impl IntoIterator<Item = PoolSpec>,
        auth: WorkerAuth,
        tls: Option<ClientTlsConfig>,
        redis: Option<Arc<RedisHandle>>,
    ) -> anyhow::Result<Self> {
        let specs: Vec<PoolSpec> = specs.into_iter().collect();
        let mut parsed = Vec::with_capacity(specs.len());
        for spec in &specs {
            let targets = spec
                .workers
                .iter()
                .map(|w| Target::parse(w))
                .collect::<anyhow::Result<Vec<Target>>>()?;
            parsed.push(targets);
        }
        let kube = if parsed
            .iter()
            .flatten()
            .any(|t| matches!(t, Target::Kubernetes(_)))
        {
            Some(kubernetes::KubeApi::from_env()?)
        } else {
            None
        };
        let mut by_model = HashMap::new();
        for (spec, targets) in specs.into_iter().zip(parsed) {
            let members = Arc::new(Members::default());
            let link = redis.is_some().then(|| Arc::new(peers::Link::default()));
            let pool = WorkerPool {
                model: spec.model.clone(),
                policy: spec.policy,
                auth: auth.clone(),
                tls: tls.clone(),
                queue: Arc::new(queue::PoolQueue::new(
                    &spec.model,
                    spec.queue,
                    Arc::clone(&members),
                    link.clone(),
                )),
                link,
                endpoints: members,
                targets,
                stall_timeout: spec.stall_timeout,
            };
            pool.set_members(discovery::resolve_blocking(
                &pool.model,
                &pool.targets,
                kube.as_ref(),
            ))?;
            by_model.insert(spec.model, Arc::new(pool));
        }
        // A random id: a restarted replica is a new peer, its old entry
        // lapses.
        let shared = redis.map(|r| (r, format!("{:016x}", rand::random::<u64>())));
        Ok(Self {
            by_model,
            kube,
            shared,
        })
    }

    pub fn get(&self, model: &str) -> Option<&Arc<WorkerPool>> {
        self.by_model.get(model)
    }

    /// The replica is draining: every pool's queue answers the requests
    /// that have not started (see [`queue::PoolQueue::drain`]).
    pub fn drain(&self) {
        for pool in self.by_model.values() {
            pool.queue.drain();
        }
    }

    /// Runs discovery and health checks, and shares the queues' order with
    /// the other replicas (with Redis), until the process ends. Started
    /// once per gateway as a background service.
    pub async fn maintain(&self) {
        tokio::join!(self.watch(), self.share_order());
    }

    /// With Redis: each pool's sync task, and the listener of the peers'
    /// nudges.
    async fn share_order(&self) {
        let Some((redis, replica)) = &self.shared else {
            return;
        };
        let mut links = HashMap::new();
        let mut syncs = Vec::new();
        for pool in self.by_model.values() {
            let Some(link) = &pool.link else { continue };
            links.insert(peers::nudge_channel(redis, &pool.model), Arc::clone(link));
            let shared = peers::Shared::new(Arc::clone(redis), &pool.model, replica);
            syncs.push(peers::sync(
                Arc::clone(&pool.queue),
                shared,
                Arc::clone(link),
            ));
        }
        let listen = peers::listen(Arc::clone(redis), replica.clone(), links);
        tokio::join!(futures::future::join_all(syncs), listen);
    }

    async fn watch(&self) {
        let mut check = tokio::time::interval(CHECK_INTERVAL);
        let mut resolve = tokio::time::interval(RESOLVE_INTERVAL);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resolve.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = check.tick() => {
                    let all = self.by_model.values().map(|p| p.check_all());
                    futures::future::join_all(all).await;
                }
                _ = resolve.tick() => {
                    for pool in self.by_model.values() {
                        if pool.targets.iter().any(Target::is_dynamic) {
                            let Some(members) = discovery::resolve(&pool.model, &pool.targets, self.kube.as_deref()).await else {
                                continue;
                            };
                            if let Err(e) = pool.set_members(members) {
                                tracing::warn!(model = %pool.model, "bad worker address: {e}");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The workers of one model.
pub struct WorkerPool {
    model: String,
    policy: PoolPolicy,
    /// Sent on every call to this pool's workers, health checks included.
    auth: WorkerAuth,
    /// TLS of the channels to this pool's workers (`[worker_tls]`).
    tls: Option<ClientTlsConfig>,
    targets: Vec<Target>,
    endpoints: Arc<Members>,
    /// Requests waiting for a free worker when every one is busy.
    queue: Arc<queue::PoolQueue>,
    /// With Redis: how the queue's sync task hears of changes.
    link: Option<Arc<peers::Link>>,
    stall_timeout: Duration,
}

/// A pool's workers, replaced as a whole when membership changes; readers
/// take a snapshot.
#[derive(Default)]
pub struct Members(RwLock<Arc<Vec<Arc<WorkerEndpoint>>>>);

impl Members {
    fn snapshot(&self) -> Arc<Vec<Arc<WorkerEndpoint>>> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn replace(&self, next: Vec<Arc<WorkerEndpoint>>) {
        let mut guard = match self.0.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(next);
    }

    /// Calls this replica has in flight, per worker (those with any).
    fn calls(&self) -> Vec<(String, u32)> {
        self.snapshot()
            .iter()
            .filter(|e| e.inflight() > 0)
            .map(|e| (e.addr().to_owned(), e.inflight()))
            .collect()
    }

    /// Requests the workers can start now: the free slots of the workers a
    /// call would try (those in selection; with every circuit open, the
    /// panic mode's: every healthy one). Unbounded (nothing to queue for)
    /// when one of them has not said its capacity, or when there is none:
    /// the call then fails at once rather than after a wait.
    fn free_slots(&self) -> u32 {
        let endpoints = self.snapshot();
        let mut candidates: Vec<&Arc<WorkerEndpoint>> =
            endpoints.iter().filter(|e| e.is_available()).collect();
        if candidates.is_empty() {
            candidates = endpoints
                .iter()
                .filter(|e| e.is_selectable_ignoring_circuit())
                .collect();
        }
        if candidates.is_empty() {
            return u32::MAX;
        }
        let mut free = 0u32;
        for e in candidates {
            match e.free_slots() {
                Some(n) => free = free.saturating_add(n),
                None => return u32::MAX,
            }
        }
        free
    }
}

impl WorkerPool {
    fn snapshot(&self) -> Arc<Vec<Arc<WorkerEndpoint>>> {
        self.endpoints.snapshot()
    }

    /// Silence after a call's first event that counts as a failed worker
    /// (`stall_timeout_ms`).
    pub fn stall_timeout(&self) -> Duration {
        self.stall_timeout
    }

    /// The sampling the pool's workers apply to fields a request leaves
    /// unset (one model's workers share it; the first that reported one).
    pub fn sampling_defaults(&self) -> pb::SamplingDefaults {
        self.snapshot()
            .iter()
            .find_map(|e| e.sampling_defaults())
            .unwrap_or_default()
    }

    /// Replaces the membership, keeping the state (channel, health, load)
    /// of workers that stay.
    fn set_members(&self, addrs: Vec<String>) -> anyhow::Result<()> {
        let current = self.snapshot();
        if current.len() == addrs.len() && current.iter().zip(&addrs).all(|(e, a)| e.addr() == a) {
            return Ok(());
        }
        let mut next = Vec::with_capacity(addrs.len());
        for addr in &addrs {
            match current.iter().find(|e| e.addr() == addr) {
                Some(e) => next.push(e.clone()),
                None => next.push(Arc::new(WorkerEndpoint::new(addr, self.tls.as_ref())?)),
            }
        }
        for gone in current
            .iter()
            .filter(|e| !addrs.iter().any(|a| a == e.addr()))
        {
            let _ = METRICS
                .worker_up
                .remove_label_values(&[&self.model, gone.addr()]);
            let _ = METRICS
                .worker_circuit_open
                .remove_label_values(&[&self.model, gone.addr()]);
            let _ = METRICS
                .worker_cached_prefix_blocks
                .remove_label_values(&[&self.model, gone.addr()]);
            for measure in timing::MEASURES {
                let _ = METRICS.worker_engine_seconds.remove_label_values(&[
                    &self.model,
                    gone.addr(),
                    measure,
                ]);
            }
        }
        tracing::info!(model = %self.model, workers = ?addrs, "worker pool membership");
        self.endpoints.replace(next);
        self.queue.dispatch();
        Ok(())
    }

    async fn check_all(&self) {
        let endpoints = self.snapshot();
        futures::future::join_all(endpoints.iter().map(|e| health::check(e, &self.auth))).await;
        // The workers' reports may show room the queue can use.
        self.queue.dispatch();
        let (mut load, mut capacity) = (0u64, 0u64);
        for e in endpoints.iter() {
            let (running, queued, cap) = e.reported_load();
            load += u64::from(running + queued);
            capacity += u64::from(cap);
            METRICS
                .worker_up
                .with_label_values(&[&self.model, e.addr()])
                .set(i64::from(e.is_available()));
            METRICS
                .worker_circuit_open
                .with_label_values(&[&self.model, e.addr()])
                .set(i64::from(e.circuit_open()));
            METRICS
                .worker_cached_prefix_blocks
                .with_label_values(&[&self.model, e.addr()])
                .set(e.prefixes().reported_blocks() as i64);
            for (measure, ns) in timing::MEASURES.iter().zip(e.times().figures()) {
                if let Some(ns) = ns {
                    METRICS
                        .worker_engine_seconds
                        .with_label_values(&[&self.model, e.addr(), measure])
                        .set(ns / 1e9);
                }
            }
        }
        let ratio = if capacity == 0 {
            0.0
        } else {
            load as f64 / capacity as f64
        };
        METRICS
            .worker_load_ratio
            .with_label_values(&[&self.model])
            .set(ratio);
    }

    /// Starts a generation on the best available worker, retrying elsewhere
    /// on worker faults until the first event has arrived. `trace` goes to
    /// the worker as `traceparent` metadata (with the request id as
    /// `x-request-id`).
    ///
    /// The future is boxed: the gRPC call's state (about 4.6 KiB) is only
    /// needed until the first event, and unboxed it would be part of every
    /// caller's state for the whole life of a stream.
    pub fn generate<'a>(
        &'a self,
        request: &'a pb::GenerateRequest,
        trace: &'a TraceParent,
        ticket: Ticket,
    ) -> Pin<Box<dyn Future<Output = Result<WorkerCall, PoolError>> + Send + 'a>> {
        Box::pin(self.start_call(request, trace, ticket, |_| true))
    }

    /// Starts a moved generation (`request.resume` set) as
    /// [`WorkerPool::generate`] does, on a worker whose engine continues
    /// one and that is not among `failed` (the workers it failed on).
    pub fn continue_elsewhere<'a>(
        &'a self,
        request: &'a pb::GenerateRequest,
        trace: &'a TraceParent,
        ticket: Ticket,
        failed: &'a [String],
    ) -> Pin<Box<dyn Future<Output = Result<WorkerCall, PoolError>> + Send + 'a>> {
        // It continues output already delivered: not a queued request.
        let ticket = Ticket {
            stage: Stage::Started,
            ..ticket
        };
        Box::pin(
            self.start_call(request, trace, ticket, move |e: &WorkerEndpoint| {
                e.resumes() && !failed.iter().any(|f| f == e.addr())
            }),
        )
    }

    async fn start_call(
        &self,
        request: &pb::GenerateRequest,
        trace: &TraceParent,
        ticket: Ticket,
        eligible: impl Fn(&WorkerEndpoint) -> bool,
    ) -> Result<WorkerCall, PoolError> {
        // Every worker busy: wait here for a turn, in the queue's order.
        let mut turn = self.queue.enter(ticket).await.map_err(PoolError::Shed)?;
        let metadata = call_metadata(request, trace, &self.auth);
        let endpoints = self.snapshot();
        let routing = select::Routing::of(self.policy, request);
        let mut tried: Vec<usize> = Vec::with_capacity(MAX_ATTEMPTS);
        let mut last_error: Option<PoolError> = None;
        // The reason the previous attempt failed, counted once another starts.
        let mut retrying: Option<&'static str> = None;
        while tried.len() < MAX_ATTEMPTS {
            let mut candidates: Vec<usize> = (0..endpoints.len())
                .filter(|i| {
                    !tried.contains(i) && endpoints[*i].is_available() && eligible(&endpoints[*i])
                })
                .collect();
            if candidates.is_empty() {
                // Panic mode: every circuit is open, yet active checks pass.
                // Failures on all workers at once are more likely the
                // requests' doing (one that fails the engine everywhere) than
                // every worker's; refusing everyone would turn a few bad
                // requests into an outage of the model.
                candidates = (0..endpoints.len())
                    .filter(|i| {
                        !tried.contains(i)
                            && endpoints[*i].is_selectable_ignoring_circuit()
                            && eligible(&endpoints[*i])
                    })
                    .collect();
            }
            let Some(index) = select::pick(self.policy, &endpoints, &candidates, &routing) else {
                break;
            };
            if let Some(reason) = retrying.take() {
                METRICS
                    .worker_retries
                    .with_label_values(&[&self.model, reason])
                    .inc();
            }
            tried.push(index);
            let endpoint = &endpoints[index];
            let waited = !endpoint.has_free_slot();
            let dispatched = Instant::now();
            let slot = endpoint.acquire();
            turn.started();
            // Counted as held at once: the requests that arrive before the
            // worker's next report then follow this one.
            endpoint.prefixes().record_sent(routing.prompt_blocks());
            let prompt = RunningPrompt {
                endpoint: Arc::clone(endpoint),
                id: endpoint.prefixes().start_running(routing.prompt_blocks()),
            };
            match Self::start(endpoint, request.clone(), &metadata).await {
                Ok((first, rest)) => {
                    // Success is recorded when the stream finishes
                    // (`CallGuard::record_finished`), not at the first
                    // event: a worker that fails every reply midway must
                    // not reset its failure count with each first token.
                    return Ok(WorkerCall {
                        first,
                        rest,
                        guard: CallGuard {
                            endpoint: endpoint.clone(),
                            _slot: slot,
                            _prompt: prompt,
                            timing: CallTiming {
                                dispatched,
                                first_event: Instant::now(),
                                waited,
                                blocks: routing.block_count(),
                            },
                            turn,
                            auth: self.auth.clone(),
                        },
                    });
                }
                Err(status) => {
                    let failure = classify(&status);
                    METRICS
                        .worker_errors
                        .with_label_values(&[&self.model, failure.reason, failure.class()])
                        .inc();
                    if failure.worker_fault {
                        endpoint.record_failure();
                    }
                    if !failure.try_elsewhere {
                        return Err(failure.error);
                    }
                    tracing::warn!(model = %self.model, worker = %endpoint.addr(), reason = failure.reason, "worker call failed before the first token; trying another");
                    retrying = Some(failure.reason);
                    last_error = Some(failure.error);
                }
            }
        }
        Err(match last_error {
            Some(e @ (PoolError::WorkerTimeout | PoolError::WorkerFailed)) => e,
            _ => PoolError::NoWorkerAvailable {
                model: self.model.clone(),
            },
        })
    }

    async fn start(
        endpoint: &WorkerEndpoint,
        request: pb::GenerateRequest,
        metadata: &MetadataMap,
    ) -> Result<(pb::GenerateEvent, Streaming<pb::GenerateEvent>), Status> {
        let mut client = endpoint.client();
        let mut request = tonic::Request::new(request);
        *request.metadata_mut() = metadata.clone();
        let mut rest = client.generate(request).await?.into_inner();
        match rest.message().await? {
            Some(first) => Ok((first, rest)),
            None => Err(Status::internal("worker ended the stream without an event")),
        }
    }
}

/// gRPC metadata of a `Generate` call: the W3C trace context and the
/// request id. A request id that is not a valid metadata value (it never
/// is: the gateway makes them) is left out rather than failing the call.
fn call_metadata(
    request: &pb::GenerateRequest,
    trace: &TraceParent,
    auth: &WorkerAuth,
) -> MetadataMap {
    let mut metadata = MetadataMap::with_capacity(3);
    if let Some(value) = auth {
        metadata.insert("authorization", value.clone());
    }
    if let Ok(value) = MetadataValue::try_from(trace.to_header()) {
        metadata.insert(telemetry::TRACEPARENT, value);
    }
    if let Ok(value) = MetadataValue::try_from(request.request_id.as_str()) {
        metadata.insert(telemetry::REQUEST_ID, value);
    }
    metadata
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_carry_traceparent_request_id_and_the_worker_token() {
        let trace = TraceParent::new_root();
        let request = pb::GenerateRequest {
            request_id: "req_abc".into(),
            ..Default::default()
        };
        assert!(call_metadata(&request, &trace, &None)
            .get("authorization")
            .is_none());
        let auth = worker_auth(Some("s3cret")).unwrap();
        let metadata = call_metadata(&request, &trace, &auth);
        assert_eq!(
            metadata.get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer s3cret")
        );
        assert!(worker_auth(Some("bad\ntoken")).is_err());
        let sent = metadata
            .get(telemetry::TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        assert_eq!(sent, Some(trace));
        assert_eq!(
            metadata
                .get(telemetry::REQUEST_ID)
                .and_then(|v| v.to_str().ok()),
            Some("req_abc")
        );
    }

    #[test]
    fn membership_changes_keep_surviving_workers() {
        let pools = Pools::new(
            [PoolSpec {
                model: "base".into(),
                workers: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
                policy: PoolPolicy::LeastLoaded,
                queue: QueueLimits {
                    max_wait: Duration::from_secs(1),
                    max_depth: 8,
                    preempt: PreemptPolicy::OFF,
                },
                stall_timeout: Duration::from_secs(30),
            }],
            None,
            None,
            None,
        )
        .unwrap();
        let pool = pools.get("base").unwrap();
        let kept = pool.snapshot()[0].clone();
        let _slot = kept.acquire();
        pool.set_members(vec!["127.0.0.1:1".into(), "127.0.0.1:3".into()])
            .unwrap();
        let now = pool.snapshot();
        assert_eq!(now.len(), 2);
        assert!(Arc::ptr_eq(&now[0], &kept));
        assert_eq!(now[0].inflight(), 1);
        assert_eq!(now[1].addr(), "127.0.0.1:3");
    }
}
