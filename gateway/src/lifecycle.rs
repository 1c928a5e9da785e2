//! Process lifecycle: the draining flag and the count of work in flight,
//! shared by the listeners, background runs and the shutdown sequence.
//!
//! On SIGTERM the gateway (1) fails `/readyz` so load balancers stop sending
//! traffic, (2) keeps serving while in-flight work finishes, up to the grace
//! period, then (3) lets Pingora close listeners and runtimes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

static DRAINING: AtomicBool = AtomicBool::new(false);
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// True once shutdown began: readiness fails, new background runs are refused.
pub fn is_draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

pub fn start_draining() {
    DRAINING.store(true, Ordering::Relaxed);
}

pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Relaxed)
}

/// Marks one unit of work (a request, a background run) as in flight until dropped.
pub struct InFlight(());

impl InFlight {
    pub fn begin() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waits until no work is in flight, or `limit` passes. Returns whether idle.
pub async fn wait_idle(limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while in_flight() > 0 {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}
