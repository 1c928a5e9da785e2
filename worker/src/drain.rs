//! Graceful shutdown: on SIGTERM (or Ctrl-C) the worker drains.
//!
//! Health turns NOT_SERVING and `Info.draining` true so the gateway stops
//! picking this worker; new Generate calls fail with `DRAINING` (the gateway
//! retries them elsewhere); generations already running or queued get up to
//! the grace period to finish. Then the server stops and the process exits 0.

use crate::admission::Admission;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The shared "we are draining" flag.
#[derive(Debug, Default)]
pub struct DrainFlag(AtomicBool);

impl DrainFlag {
    pub fn start(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); draining on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Waits until nothing runs or waits, or until `grace` has passed.
/// Returns whether the worker went idle in time.
pub async fn wait_idle(admission: &Admission, grace: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + grace;
    loop {
        if admission.is_idle() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
