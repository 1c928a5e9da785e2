//! One worker address: its gRPC channel, in-flight count and passive health.

use inference_proto::v1::worker_client::WorkerClient;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// Consecutive failures that eject a worker from selection for a while.
const EJECT_AFTER_FAILURES: u32 = 3;
const EJECT_FOR: Duration = Duration::from_secs(5);

pub struct WorkerEndpoint {
    addr: String,
    endpoint: Endpoint,
    /// Created on first use: tonic spawns the connection task on the current
    /// runtime, and Pingora's runtimes exist only once the server runs.
    channel: OnceLock<Channel>,
    inflight: Arc<AtomicU32>,
    consecutive_failures: AtomicU32,
    /// Milliseconds since `epoch` until which the worker is ejected.
    ejected_until_ms: AtomicU64,
    epoch: Instant,
}

impl WorkerEndpoint {
    pub fn new(addr: &str) -> anyhow::Result<Self> {
        let uri = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let endpoint = Endpoint::from_shared(uri)?
            .connect_timeout(super::CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            .http2_adaptive_window(true);
        Ok(Self {
            addr: addr.to_owned(),
            endpoint,
            channel: OnceLock::new(),
            inflight: Arc::new(AtomicU32::new(0)),
            consecutive_failures: AtomicU32::new(0),
            ejected_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn client(&self) -> WorkerClient<Channel> {
        let channel = self
            .channel
            .get_or_init(|| self.endpoint.clone().connect_lazy());
        WorkerClient::new(channel.clone())
    }

    pub fn inflight(&self) -> u32 {
        self.inflight.load(Ordering::Relaxed)
    }

    /// Takes an in-flight slot, released when the returned guard drops.
    pub fn acquire(&self) -> InflightSlot {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        InflightSlot(self.inflight.clone())
    }

    pub fn is_available(&self) -> bool {
        self.now_ms() >= self.ejected_until_ms.load(Ordering::Relaxed)
    }

    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
    }

    /// Passive outlier detection: a run of failures ejects the worker.
    pub fn record_failure(&self) {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= EJECT_AFTER_FAILURES {
            let until = self.now_ms() + EJECT_FOR.as_millis() as u64;
            self.ejected_until_ms.store(until, Ordering::Relaxed);
            tracing::warn!(worker = %self.addr, failures = n, "worker ejected");
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
