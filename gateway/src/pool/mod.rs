//! Worker pools, one per model: membership (discovery), health, selection,
//! and the call that retries on another worker until the first event.
//!
//! After the first event a generation is committed to its worker: a failure
//! then reaches the client as an error frame, never as a silent retry (the
//! client already saw tokens).

mod count;
mod discovery;
mod endpoint;
mod health;
mod kubernetes;
mod prefixes;
mod queue;
pub mod select;
mod timing;

pub use endpoint::WorkerEndpoint;
pub use queue::{QueueLimits, Shed, Stage, Ticket};

use crate::config::PoolPolicy;
use crate::metrics::METRICS;
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
use tonic::{Code, Status, Streaming};

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
}

impl Pools {
    /// Pools of `specs`; every call carries `auth`, over TLS with `tls`
    /// (`[worker_tls]`).
    pub fn new(
        specs: impl IntoIterator<Item = PoolSpec>,
        auth: WorkerAuth,
        tls: Option<ClientTlsConfig>,
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
            let pool = WorkerPool {
                model: spec.model.clone(),
                policy: spec.policy,
                auth: auth.clone(),
                tls: tls.clone(),
                queue: Arc::new(queue::PoolQueue::new(
                    &spec.model,
                    spec.queue,
                    Arc::clone(&members),
                )),
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
        Ok(Self { by_model, kube })
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

    /// Runs discovery and health checks until the process ends. Started once
    /// per gateway as a background service.
    pub async fn maintain(&self) {
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

/// A running generation: the first event (already received) and the rest.
pub struct WorkerCall {
    pub first: pb::GenerateEvent,
    pub rest: Streaming<pb::GenerateEvent>,
    /// Keep until the call ends: the worker's in-flight slot, and where to
    /// report a failure after the first event.
    pub guard: CallGuard,
}

/// The worker side of a started call.
pub struct CallGuard {
    /// The worker serving the call, so a failure after the first event
    /// still counts against its health.
    endpoint: Arc<WorkerEndpoint>,
    /// Holds the worker's in-flight slot until the guard is dropped.
    _slot: endpoint::InflightSlot,
    _prompt: RunningPrompt,
    timing: CallTiming,
    /// The request's turn in the pool's queue: dropped after the slot (the
    /// fields drop in this order), so the next waiter finds it free.
    turn: queue::Turn,
    /// The worker's token, for `Cancel`.
    auth: WorkerAuth,
}

/// How long a client that left waits for the worker to say what it
/// generated before the call is dropped and billed for what arrived.
const CANCEL_WAIT: Duration = Duration::from_millis(500);

/// When a call started and what it asked of the engine, to measure the
/// engine by ([`timing::EngineTimes`]).
struct CallTiming {
    dispatched: Instant,
    first_event: Instant,
    /// The worker had no free slot when the call went out: its times
    /// include a wait and say nothing of the engine's speed.
    waited: bool,
    /// The prompt's prefix blocks (0: not computed for this pool's policy).
    blocks: usize,
}

/// The call's prompt, running on its worker until dropped (cache-aware
/// routing on engines whose cached prefix serves one sequence at a time).
struct RunningPrompt {
    endpoint: Arc<WorkerEndpoint>,
    id: Option<u64>,
}

impl Drop for RunningPrompt {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.endpoint.prefixes().end_running(id);
        }
    }
}

impl CallGuard {
    /// The worker finished the reply: resets its failure count, and
    /// measures the engine by it.
    pub fn record_finished(&self, usage: Option<&pb::Usage>) {
        self.endpoint.record_success();
        let t = &self.timing;
        let Some(usage) = usage.filter(|u| u.prompt_tokens > 0) else {
            return;
        };
        if t.waited || t.blocks == 0 {
            return;
        }
        let uncached = usage
            .prompt_tokens
            .saturating_sub(usage.cached_prompt_tokens);
        self.endpoint.times().record(timing::CallSample {
            first_event: t.first_event.duration_since(t.dispatched),
            whole: t.dispatched.elapsed(),
            prefilled_blocks: t.blocks as f64 * f64::from(uncached)
                / f64::from(usage.prompt_tokens),
        });
    }

    /// The call ended having relayed `output_tokens`: the service its
    /// organisation received, for the order of the pool's queue.
    pub fn record_served(&self, output_tokens: u64) {
        self.turn.served(output_tokens);
    }

    /// Stops the call's generation on its worker and asks how many tokens
    /// it generated there; `None` when the worker did not say in time (or
    /// predates `Cancel`). Called while the call's stream is still open,
    /// so the worker still finds the generation.
    pub async fn cancel(&self, request_id: &str) -> Option<u32> {
        let mut request = tonic::Request::new(pb::CancelRequest {
            request_id: request_id.to_owned(),
        });
        if let Some(value) = &self.auth {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let mut client = self.endpoint.client();
        let reply = tokio::time::timeout(CANCEL_WAIT, client.cancel(request))
            .await
            .ok()?
            .ok()?
            .into_inner();
        reply.found.then_some(reply.generated_tokens)
    }

    /// The worker serving the call (its address).
    pub fn worker(&self) -> &str {
        self.endpoint.addr()
    }

    /// Records a failure of the stream after its first event: a worker
    /// fault (the worker died, reset the stream, ended it unfinished)
    /// counts toward opening its circuit like one before the first token,
    /// so a worker that always fails mid-reply leaves selection. Client
    /// errors never count.
    pub fn record_stream_failure(&self, status: Option<&Status>) {
        let fault = status.is_none_or(|s| classify(s).worker_fault);
        if fault {
            self.endpoint.record_failure();
        }
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
            let times = e.times();
            let measured = [times.prefill_ns_per_block(), times.hold_ns()];
            for (measure, ns) in timing::MEASURES.iter().zip(measured) {
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

/// Why the pool could not start a call, or why a worker call failed: the
/// pool's own error; `error/map.rs` gives each its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// The prompt is over the model's context window (the worker's message).
    ContextLengthExceeded { message: String },
    /// The worker refused the request as invalid (its message).
    InvalidRequest { message: String },
    /// The worker is at capacity.
    AtCapacity,
    /// The worker is draining for a restart.
    Draining,
    /// The worker could not be reached, or dropped the call.
    Unreachable,
    /// The worker did not answer within its deadline.
    WorkerTimeout,
    /// The worker failed for another reason.
    WorkerFailed,
    /// Every worker of the model was tried, busy, draining or unreachable.
    NoWorkerAvailable { model: String },
    /// Every worker was busy and the request could not wait (the pool's
    /// queue was full, or the wait ran out).
    Shed(Shed),
}

/// What a failed worker call means for the client and for the worker.
pub struct Failure {
    pub error: PoolError,
    /// Another worker may succeed (overload, draining, connection failure).
    pub try_elsewhere: bool,
    /// Counts against the worker's health. Client errors never do.
    pub worker_fault: bool,
    pub reason: &'static str,
}

impl Failure {
    /// The `class` label: the request's fault, the pool's capacity, or the
    /// worker's fault.
    pub fn class(&self) -> &'static str {
        if self.worker_fault {
            "fault"
        } else if self.try_elsewhere {
            "capacity"
        } else {
            "client"
        }
    }
}

/// Maps a worker's gRPC status to the public error and the retry decision.
pub fn classify(status: &Status) -> Failure {
    let reason = status
        .metadata()
        .get(pb::ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(pb::ErrorReason::from_str_name);
    match (reason, status.code()) {
        (Some(pb::ErrorReason::ContextLengthExceeded), _) => Failure {
            error: PoolError::ContextLengthExceeded {
                message: status.message().to_owned(),
            },
            try_elsewhere: false,
            worker_fault: false,
            reason: "context_length_exceeded",
        },
        (Some(pb::ErrorReason::InvalidRequest), _) | (None, Code::InvalidArgument) => Failure {
            error: PoolError::InvalidRequest {
                message: status.message().to_owned(),
            },
            try_elsewhere: false,
            worker_fault: false,
            reason: "invalid_request",
        },
        (Some(pb::ErrorReason::Overloaded), _) | (None, Code::ResourceExhausted) => Failure {
            error: PoolError::AtCapacity,
            try_elsewhere: true,
            worker_fault: false,
            reason: "overloaded",
        },
        (Some(pb::ErrorReason::Draining), _) => Failure {
            error: PoolError::Draining,
            try_elsewhere: true,
            worker_fault: false,
            reason: "draining",
        },
        // Made by this side's transport, not sent by the worker: the
        // connection was reset (the worker process died) or its keepalive
        // went unanswered (the worker stopped). An operator tells a crash
        // from an engine's own error by this reason.
        (None, _) if lost_worker(status) => Failure {
            error: PoolError::Unreachable,
            try_elsewhere: true,
            worker_fault: true,
            reason: "worker_lost",
        },
        (_, Code::Unavailable) | (_, Code::Cancelled) => Failure {
            error: PoolError::Unreachable,
            try_elsewhere: true,
            worker_fault: true,
            reason: "unavailable",
        },
        (_, Code::DeadlineExceeded) => Failure {
            error: PoolError::WorkerTimeout,
            try_elsewhere: true,
            worker_fault: true,
            reason: "deadline",
        },
        _ => Failure {
            error: PoolError::WorkerFailed,
            try_elsewhere: true,
            worker_fault: true,
            reason: "engine_failure",
        },
    }
}

/// Whether a status without the worker's reason was made by tonic from a
/// transport error (a reset connection, an HTTP/2 keepalive timeout, a
/// refused stream) rather than decoded from the worker's trailers: only
/// the former carries a source error. A connect error before any call is
/// left to `unavailable`: no worker was lost, none was reached.
fn lost_worker(status: &Status) -> bool {
    use std::error::Error as _;
    let Some(source) = status.source() else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = cause {
        if err.is::<tonic::ConnectError>() {
            return false;
        }
        cause = err.source();
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn with_reason(code: Code, reason: &'static str) -> Status {
        let mut s = Status::new(code, "x");
        s.metadata_mut().insert(
            pb::ERROR_REASON_METADATA,
            MetadataValue::from_static(reason),
        );
        s
    }

    #[test]
    fn context_length_is_a_client_error_not_retried() {
        let f = classify(&with_reason(
            Code::InvalidArgument,
            "CONTEXT_LENGTH_EXCEEDED",
        ));
        assert_eq!(
            f.error,
            PoolError::ContextLengthExceeded {
                message: "x".into()
            }
        );
        assert!(!f.try_elsewhere && !f.worker_fault);
        assert_eq!(f.class(), "client");
    }

    #[test]
    fn overload_and_unreachable_try_elsewhere() {
        let f = classify(&with_reason(Code::ResourceExhausted, "OVERLOADED"));
        assert!(f.try_elsewhere && !f.worker_fault);
        assert_eq!(f.error, PoolError::AtCapacity);
        assert_eq!(f.class(), "capacity");
        let f = classify(&Status::unavailable("connection refused"));
        assert!(f.try_elsewhere && f.worker_fault);
        assert_eq!(f.class(), "fault");
        let f = classify(&Status::internal("boom"));
        assert_eq!(f.error, PoolError::WorkerFailed);
    }

    /// A worker's own error (its trailers) stays `engine_failure`; a status
    /// tonic made from a broken connection or a keepalive timeout (it has
    /// a source) is a lost worker; a connect error is `unavailable`.
    #[test]
    fn a_lost_worker_is_told_apart_from_an_engine_failure() {
        let engine = classify(&with_reason(Code::Internal, "ENGINE_FAILURE"));
        assert_eq!(engine.reason, "engine_failure");
        assert_eq!(classify(&Status::unknown("boom")).reason, "engine_failure");
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost = Status::from_error(Box::new(reset));
        assert_eq!(lost.code(), Code::Unknown);
        let f = classify(&lost);
        assert_eq!(f.reason, "worker_lost");
        assert!(f.try_elsewhere && f.worker_fault);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let connect = Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(classify(&connect).reason, "unavailable");
    }

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
                },
                stall_timeout: Duration::from_secs(30),
            }],
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
