//! One worker address: its gRPC channel, in-flight count, the load it
//! reports, and its health (active checks plus a circuit breaker fed by
//! passive failures).

use super::prefixes::CachedPrefixes;
use super::timing::{EngineTimes, Measured};
use inference_proto::v1 as pb;
use inference_proto::v1::worker_client::WorkerClient;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Consecutive failures that open the circuit.
const OPEN_AFTER_FAILURES: u32 = 3;
/// First open period; doubles on each re-open up to `MAX_OPEN`.
const BASE_OPEN: Duration = Duration::from_secs(2);
const MAX_OPEN: Duration = Duration::from_secs(30);

/// What of a moved generation a worker's engine continues.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Resumes {
    Nothing = 0,
    /// A text answer (an engine server continuing a final assistant
    /// message): not constrained output, a tool call or a think section.
    TextAnswers = 1,
    Anything = 2,
}

/// Milliseconds on the process's monotonic clock (for deadlines kept in
/// atomics).
fn clock_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

pub struct WorkerEndpoint {
    addr: String,
    endpoint: Endpoint,
    /// The generation channel, created on first use: tonic spawns its
    /// connection and buffer tasks on the current runtime, and Pingora's
    /// runtimes exist only once the server runs. The first user is the
    /// request path, so those tasks live on the public listener's runtime
    /// with the requests they serve: a token frame is read and relayed
    /// without waking a thread of another runtime.
    channel: OnceLock<Channel>,
    /// A separate connection for health checks and load polling, created
    /// on the background runtime that runs them. Sharing the generation
    /// channel would tie every generation's I/O to that runtime; a separate
    /// connection also means a check fails when a new connection cannot be
    /// made, not only when an old one is stuck.
    probe_channel: OnceLock<Channel>,
    inflight: Arc<AtomicU32>,
    /// Calls the peer replicas have on it, as last read (`peers.rs`), and
    /// until when that reading holds ([`clock_ms`]).
    peer_inflight: AtomicU32,
    peer_inflight_until: AtomicU64,
    /// What its engine holds in its prefix cache.
    prefixes: CachedPrefixes,
    /// How fast its engine prefills and how long it keeps a slot.
    times: EngineTimes,
    // ---- reported by the worker (Info), refreshed by the health loop ------
    running: AtomicU32,
    queued: AtomicU32,
    capacity: AtomicU32,
    draining: AtomicBool,
    /// What of a moved generation its engine continues
    /// (`Capabilities.resume`, `resume_any`), as a [`Resumes`].
    resumes: AtomicU8,
    /// Its engine's context window (`Info.context_window`); 0 until known.
    context_window: AtomicU32,
    /// The sampling its worker applies to fields a request leaves unset.
    sampling_defaults: RwLock<Option<pb::SamplingDefaults>>,
    /// Last active health check passed. Starts true so that a fresh gateway
    /// serves before its first check completes.
    healthy: AtomicBool,
    // ---- circuit breaker ---------------------------------------------------
    consecutive_failures: AtomicU32,
    times_opened: AtomicU32,
    /// Milliseconds since `epoch` until which the circuit is open.
    open_until_ms: AtomicU64,
    /// Half-open (the open period is over, the failures not yet cleared):
    /// a probe request is in flight, so others stay away until it ends.
    probe_in_flight: AtomicBool,
    epoch: Instant,
}

/// Reset streams remembered per worker connection (about 100 bytes each).
const MAX_REMEMBERED_RESETS: usize = 16 * 1024;

/// The URI of a worker address: `https` with `[worker_tls]`, else `http`.
/// An explicit scheme must agree with the setting.
fn worker_uri(addr: &str, tls: bool) -> anyhow::Result<String> {
    match (addr.split_once("://"), tls) {
        (None, false) => Ok(format!("http://{addr}")),
        (None, true) => Ok(format!("https://{addr}")),
        (Some(("http", _)), true) => anyhow::bail!(
            "worker {addr}: with [worker_tls] workers are reached over TLS; \
             write host:port or https://host:port"
        ),
        (Some(("https", _)), false) => {
            anyhow::bail!("worker {addr}: an https:// worker needs [worker_tls] (its CA)")
        }
        (Some(_), _) => Ok(addr.to_owned()),
    }
}

impl WorkerEndpoint {
    /// A worker at `addr`, over TLS with `tls` (`[worker_tls]`), else h2c.
    pub fn new(addr: &str, tls: Option<&ClientTlsConfig>) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(worker_uri(addr, tls.is_some())?)?;
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls.clone())?;
        }
        let endpoint = endpoint
            .connect_timeout(super::CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            // Keepalive pings detect a silently dead worker (no FIN, no RST).
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true)
            // Large flow-control windows: h2 counts small unread DATA frames
            // against a budget of half the connection window, and a gateway
            // that falls behind for a moment with hundreds of token streams
            // on one channel would otherwise GOAWAY its own worker
            // connection ("too_many_data_frames"), failing every stream.
            .initial_connection_window_size(Some(64 * 1024 * 1024))
            .initial_stream_window_size(Some(4 * 1024 * 1024))
            // Every cancelled generation (a client gone, a deadline) resets
            // its stream, and the worker's frames already in flight arrive
            // after the reset. h2 ignores them only while it remembers the
            // stream (10 by default); each one for a forgotten stream counts
            // as a "local error reset", and after 1,024 of those h2 GOAWAYs
            // the connection (ENHANCE_YOUR_CALM), failing every stream on
            // it. Cancellations are normal traffic from a trusted worker:
            // remember many and never count them against the connection.
            .http2_max_concurrent_reset_streams(MAX_REMEMBERED_RESETS)
            .http2_max_local_error_reset_streams(None);
        Ok(Self {
            addr: addr.to_owned(),
            endpoint,
            channel: OnceLock::new(),
            probe_channel: OnceLock::new(),
            inflight: Arc::new(AtomicU32::new(0)),
            peer_inflight: AtomicU32::new(0),
            peer_inflight_until: AtomicU64::new(0),
            prefixes: CachedPrefixes::default(),
            times: EngineTimes::default(),
            running: AtomicU32::new(0),
            queued: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            draining: AtomicBool::new(false),
            // Until its first Info says: a worker that cannot resume
            // refuses the move (INVALID_REQUEST), which then ends in band.
            resumes: AtomicU8::new(Resumes::Anything as u8),
            context_window: AtomicU32::new(0),
            sampling_defaults: RwLock::new(None),
            healthy: AtomicBool::new(true),
            consecutive_failures: AtomicU32::new(0),
            times_opened: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            probe_in_flight: AtomicBool::new(false),
            epoch: Instant::now(),
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The generation channel (request path only, see the field's note).
    pub fn channel(&self) -> Channel {
        self.channel
            .get_or_init(|| self.endpoint.clone().connect_lazy())
            .clone()
    }

    /// A client on the generation channel (request path only).
    pub fn client(&self) -> WorkerClient<Channel> {
        WorkerClient::new(self.channel())
    }

    /// The health-check channel (background maintenance only).
    pub fn probe_channel(&self) -> Channel {
        self.probe_channel
            .get_or_init(|| self.endpoint.clone().connect_lazy())
            .clone()
    }

    /// What the worker's engine holds in its prefix cache.
    pub fn prefixes(&self) -> &CachedPrefixes {
        &self.prefixes
    }

    /// How fast its engine prefills and holds a slot, as measured here.
    pub fn times(&self) -> &EngineTimes {
        &self.times
    }

    /// The expected wait for a slot of one more request on an engine of
    /// `speed`: none with a free slot; else until the `ahead`-th of this
    /// gateway's running requests ends ([`Measured::remaining_ns`]; those
    /// of prompts under one block are not tracked), and past those at
    /// `capacity` per hold time.
    pub fn expected_wait_ns(&self, speed: &Measured) -> f64 {
        let capacity = self.capacity.load(Ordering::Relaxed);
        let load = self.load_score();
        if capacity == 0 || load < capacity {
            return 0.0;
        }
        let ahead = (load - capacity + 1) as usize;
        let mut remaining: Vec<f64> = self
            .prefixes
            .running_ages()
            .into_iter()
            .map(|age| speed.remaining_ns(age))
            .collect();
        remaining.sort_unstable_by(f64::total_cmp);
        match remaining.get(ahead - 1) {
            Some(&r) => r,
            None => {
                let known = remaining.last().copied().unwrap_or(0.0);
                let beyond = u32::try_from(ahead - remaining.len()).unwrap_or(u32::MAX);
                known + speed.expected_wait_ns(beyond, capacity)
            }
        }
    }

    /// Whether the worker has a sequence slot free for one more request
    /// (or has not said how many it has).
    pub fn has_free_slot(&self) -> bool {
        let capacity = self.capacity.load(Ordering::Relaxed);
        capacity == 0 || self.load_score() < capacity
    }

    /// Free sequence slots for more requests; `None` when the worker has
    /// not said how many it has.
    pub fn free_slots(&self) -> Option<u32> {
        let capacity = self.capacity.load(Ordering::Relaxed);
        (capacity > 0).then(|| capacity.saturating_sub(self.load_score()))
    }

    /// Requests this gateway has in flight on the worker.
    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Selection score: our own in-flight requests (fresh), the peer
    /// replicas' (as last read, with Redis) and the queue the worker last
    /// reported (includes other gateways' load).
    pub fn load_score(&self) -> u32 {
        self.inflight() + self.peer_inflight() + self.queued.load(Ordering::Relaxed)
    }

    /// The peer replicas' calls on this worker, read now; the reading
    /// counts for `valid_for` (then they count as none, as without peers).
    pub fn record_peer_inflight(&self, calls: u32, valid_for: Duration) {
        let until = clock_ms().saturating_add(u64::try_from(valid_for.as_millis()).unwrap_or(0));
        self.peer_inflight.store(calls, Ordering::Relaxed);
        self.peer_inflight_until.store(until, Ordering::Relaxed);
    }

    fn peer_inflight(&self) -> u32 {
        // Read on every routing decision: without peers (or none of their
        // calls here) no clock is read.
        let calls = self.peer_inflight.load(Ordering::Relaxed);
        if calls > 0 && clock_ms() < self.peer_inflight_until.load(Ordering::Relaxed) {
            calls
        } else {
            0
        }
    }

    /// (running, queued, capacity) as last reported.
    pub fn reported_load(&self) -> (u32, u32, u32) {
        (
            self.running.load(Ordering::Relaxed),
            self.queued.load(Ordering::Relaxed),
            self.capacity.load(Ordering::Relaxed),
        )
    }

    /// Takes an in-flight slot, released when the returned guard drops. On
    /// a half-open worker the request is the probe.
    pub fn acquire(&self) -> InflightSlot {
        if self.half_open() {
            self.probe_in_flight.store(true, Ordering::Relaxed);
        }
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightSlot(self.inflight.clone())
    }

    /// Selectable: passing health checks, not draining, circuit not open,
    /// and, half-open, no probe already in flight.
    pub fn is_available(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
            && !self.draining.load(Ordering::Relaxed)
            && !self.circuit_open()
            && (!self.half_open() || !self.probe_in_flight.load(Ordering::Relaxed))
    }

    /// The open period is over but the failures that opened the circuit
    /// have not been cleared by a success yet.
    fn half_open(&self) -> bool {
        !self.circuit_open()
            && self.consecutive_failures.load(Ordering::Relaxed) >= OPEN_AFTER_FAILURES
    }

    /// Passing health checks and not draining, whatever the circuit says
    /// (the pool's panic mode, when every circuit is open).
    pub fn is_selectable_ignoring_circuit(&self) -> bool {
        self.healthy.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }

    pub fn circuit_open(&self) -> bool {
        self.now_ms() < self.open_until_ms.load(Ordering::Relaxed)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.times_opened.store(0, Ordering::Relaxed);
        self.probe_in_flight.store(false, Ordering::Relaxed);
    }

    /// A worker fault (never a client error). A run of them opens the
    /// circuit; after the open period one request probes it (half-open),
    /// and a failed probe re-opens it for twice as long.
    pub fn record_failure(&self) {
        self.probe_in_flight.store(false, Ordering::Relaxed);
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= OPEN_AFTER_FAILURES {
            let times = self.times_opened.fetch_add(1, Ordering::Relaxed).min(4);
            let open_for = (BASE_OPEN * 2u32.pow(times)).min(MAX_OPEN);
            let until = self.now_ms() + open_for.as_millis() as u64;
            self.open_until_ms.store(until, Ordering::Relaxed);
            tracing::warn!(worker = %self.addr, failures = n, open_for_ms = open_for.as_millis() as u64, "circuit opened");
        }
    }

    /// Whether its engine continues a generation moved from another worker.
    pub fn resumes(&self) -> bool {
        self.resumes.load(Ordering::Relaxed) != Resumes::Nothing as u8
    }

    /// Whether its engine continues a moved generation of any kind:
    /// constrained output (a JSON schema, tool calls) and think sections,
    /// not only a text answer.
    pub fn resumes_any(&self) -> bool {
        self.resumes.load(Ordering::Relaxed) == Resumes::Anything as u8
    }

    pub fn record_resumes(&self, resumes: Resumes) {
        self.resumes.store(resumes as u8, Ordering::Relaxed);
    }

    /// Its engine's context window, once its worker reported one.
    pub fn context_window(&self) -> Option<u32> {
        Some(self.context_window.load(Ordering::Relaxed)).filter(|w| *w > 0)
    }

    pub fn record_context_window(&self, window: u32) {
        self.context_window.store(window, Ordering::Relaxed);
    }

    /// What its worker last reported it samples with by default.
    pub fn sampling_defaults(&self) -> Option<pb::SamplingDefaults> {
        match self.sampling_defaults.read() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    pub fn record_sampling_defaults(&self, defaults: Option<pb::SamplingDefaults>) {
        match self.sampling_defaults.write() {
            Ok(mut g) => *g = defaults,
            Err(poisoned) => *poisoned.into_inner() = defaults,
        }
    }

    /// Result of an active check (gRPC health plus Info).
    pub fn record_check(&self, healthy: bool, load: Option<(u32, u32, u32, bool)>) {
        // A probe that ended without an outcome (its client went away)
        // must not keep a half-open worker out of selection for longer
        // than one check interval.
        if self.inflight() == 0 {
            self.probe_in_flight.store(false, Ordering::Relaxed);
        }
        let was = self.healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy {
            tracing::info!(worker = %self.addr, healthy, "worker health changed");
        }
        if let Some((running, queued, capacity, draining)) = load {
            self.running.store(running, Ordering::Relaxed);
            self.queued.store(queued, Ordering::Relaxed);
            self.capacity.store(capacity, Ordering::Relaxed);
            self.draining.store(draining, Ordering::Relaxed);
        }
        if healthy && self.circuit_open() && self.consecutive_failures.load(Ordering::Relaxed) == 0
        {
            self.open_until_ms.store(0, Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// An in-flight request on a worker; decrements the count on drop.
pub struct InflightSlot(Arc<AtomicU32>);

impl Drop for InflightSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuit_opens_after_consecutive_failures_and_success_resets() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        assert!(e.is_available());
        e.record_failure();
        e.record_failure();
        assert!(e.is_available());
        e.record_failure();
        assert!(!e.is_available() && e.circuit_open());
        e.record_success();
        // Success resets the count; the open period still has to pass.
        assert_eq!(e.consecutive_failures.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn half_open_admits_one_probe_whose_outcome_decides() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        for _ in 0..OPEN_AFTER_FAILURES {
            e.record_failure();
        }
        assert!(e.circuit_open());
        // The open period passes.
        e.open_until_ms.store(0, Ordering::Relaxed);
        assert!(e.is_available(), "half-open: a probe may go");
        let probe = e.acquire();
        assert!(!e.is_available(), "one probe at a time");
        e.record_failure();
        drop(probe);
        assert!(e.circuit_open(), "a failed probe re-opens the circuit");
        assert_eq!(e.times_opened.load(Ordering::Relaxed), 2);

        e.open_until_ms.store(0, Ordering::Relaxed);
        let probe = e.acquire();
        e.record_success();
        drop(probe);
        assert!(e.is_available() && !e.circuit_open());
        let _a = e.acquire();
        let _b = e.acquire();
        assert!(e.is_available(), "closed again: no probe limit");
    }

    #[test]
    fn a_probe_without_an_outcome_is_forgotten_at_the_next_check() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        for _ in 0..OPEN_AFTER_FAILURES {
            e.record_failure();
        }
        e.open_until_ms.store(0, Ordering::Relaxed);
        drop(e.acquire()); // the client went away before an outcome
        assert!(!e.is_available());
        e.record_check(true, None);
        assert!(e.is_available());
    }

    #[test]
    fn draining_or_unhealthy_workers_are_not_selectable() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        e.record_check(true, Some((1, 0, 8, true)));
        assert!(!e.is_available());
        e.record_check(false, Some((1, 0, 8, false)));
        assert!(!e.is_available());
        e.record_check(true, Some((1, 2, 8, false)));
        assert!(e.is_available());
        assert_eq!(e.load_score(), 2);
    }

    #[test]
    fn an_open_circuit_leaves_a_healthy_worker_selectable_only_in_panic_mode() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        for _ in 0..OPEN_AFTER_FAILURES {
            e.record_failure();
        }
        assert!(!e.is_available() && e.is_selectable_ignoring_circuit());
        e.record_check(false, None);
        assert!(!e.is_selectable_ignoring_circuit());
        e.record_check(true, Some((0, 0, 8, true)));
        assert!(
            !e.is_selectable_ignoring_circuit(),
            "draining is never selectable"
        );
    }

    #[test]
    fn worker_addresses_take_the_scheme_of_the_tls_setting() {
        assert_eq!(
            worker_uri("10.0.0.1:50051", false).unwrap(),
            "http://10.0.0.1:50051"
        );
        assert_eq!(
            worker_uri("10.0.0.1:50051", true).unwrap(),
            "https://10.0.0.1:50051"
        );
        assert_eq!(worker_uri("https://w:1", true).unwrap(), "https://w:1");
        assert_eq!(worker_uri("http://w:1", false).unwrap(), "http://w:1");
        let e = worker_uri("http://w:1", true).unwrap_err().to_string();
        assert!(e.contains("[worker_tls]"), "{e}");
        let e = worker_uri("https://w:1", false).unwrap_err().to_string();
        assert!(e.contains("needs [worker_tls]"), "{e}");
    }

    #[test]
    fn peers_calls_count_as_load_while_their_reading_holds() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        e.record_check(true, Some((0, 0, 4, false)));
        let _slot = e.acquire();
        e.record_peer_inflight(2, Duration::from_secs(5));
        assert_eq!((e.load_score(), e.free_slots()), (3, Some(1)));
        e.record_peer_inflight(2, Duration::ZERO);
        assert_eq!(
            (e.load_score(), e.free_slots()),
            (1, Some(3)),
            "a lapsed reading counts as none"
        );
    }

    #[test]
    fn inflight_slot_is_released_on_drop() {
        let e = WorkerEndpoint::new("127.0.0.1:1", None).unwrap();
        let slot = e.acquire();
        assert_eq!(e.inflight(), 1);
        drop(slot);
        assert_eq!(e.inflight(), 0);
    }
}
