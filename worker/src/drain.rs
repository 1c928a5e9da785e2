//! Graceful shutdown: on SIGTERM (or Ctrl-C) the worker drains.
//!
//! Health turns NOT_SERVING and `Info.draining` true so the gateway stops
//! picking this worker; new Generate calls fail with `DRAINING` (the gateway
//! retries them elsewhere); generations already running or queued get up to
//! the grace period to finish. Those still open when it ends are stopped
//! and end with `DRAINING` (the gateway tells their clients the worker shut
//! down, not that it failed). Then the server stops and the process exits 0.

use crate::admission::Admission;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// The shared drain state: "we are draining", then "the grace period is
/// over".
#[derive(Debug)]
pub struct DrainFlag {
    draining: AtomicBool,
    grace_over: watch::Sender<bool>,
}

impl Default for DrainFlag {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            grace_over: watch::Sender::new(false),
        }
    }
}

impl DrainFlag {
    pub fn start(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Stops every generation still open (see [`Self::grace_over`]).
    pub fn end_grace(&self) {
        self.grace_over.send_replace(true);
    }

    /// Resolves once the grace period is over.
    pub async fn grace_over(&self) {
        let mut over = self.grace_over.subscribe();
        // The sender lives as long as `self`: an error cannot happen here.
        let _ = over.wait_for(|over| *over).await;
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
