//! Process lifecycle: one explicit shutdown signal and the count of work in
//! flight, passed (in `App`) to the listeners, background runs and the
//! shutdown sequence, as mini-redis passes its `Shutdown` and guard.
//!
//! On SIGTERM the gateway (1) fails `/readyz` so load balancers stop sending
//! traffic and answers the requests waiting in its pool queues (they had
//! not started; a peer serves the retry), (2) keeps serving while in-flight
//! work finishes, up to the grace period, (3) at its end *cuts* what is
//! still going: every reply ends in band (an error frame, a final Responses
//! event, an error body), is billed for what it delivered and stored as its
//! client got it, within a short tail, then (4) lets Pingora close
//! listeners and runtimes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// One phase of the shutdown: a flag set once, and the waiters it wakes.
#[derive(Debug, Default)]
struct Phase {
    begun: AtomicBool,
    started: Notify,
}

impl Phase {
    fn has_begun(&self) -> bool {
        self.begun.load(Ordering::Relaxed)
    }

    fn begin(&self) {
        self.begun.store(true, Ordering::Relaxed);
        self.started.notify_waiters();
    }

    /// Resolves once the phase has begun (at once if it already has).
    async fn begun(&self) {
        loop {
            // Registered before the flag is read, so a start in between
            // still wakes this waiter.
            let woken = self.started.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.has_begun() {
                return;
            }
            woken.await;
        }
    }
}

/// Whether shutdown began, and what is still running. One per process.
#[derive(Debug, Default)]
pub struct Shutdown {
    /// From SIGTERM. Long-lived connections (WebSockets) close rather than
    /// hold the drain for its whole grace period.
    draining: Phase,
    /// The grace period ran out with work still going: every reply still
    /// open ends now, in band, rather than at the socket.
    cutting: Phase,
    in_flight: AtomicUsize,
    /// Woken when the last unit of work in flight ends.
    idle: Notify,
}

impl Shutdown {
    /// True once shutdown began: readiness fails, new background runs are
    /// refused, connections are not kept alive.
    pub fn is_draining(&self) -> bool {
        self.draining.has_begun()
    }

    pub fn start_draining(&self) {
        self.draining.begin();
    }

    /// Resolves once draining has begun (at once if it already has).
    pub async fn draining(&self) {
        self.draining.begun().await
    }

    /// True once the grace period ran out: replies still going end now.
    pub fn is_cutting(&self) -> bool {
        self.cutting.has_begun()
    }

    /// The grace period is over: wakes every reply still open so it ends
    /// in band (see [`Self::cutting`]).
    pub fn start_cutting(&self) {
        self.cutting.begin();
    }

    /// Resolves once the grace period ran out (at once if it already has):
    /// a reply selects on this beside its client's departure.
    pub async fn cutting(&self) {
        self.cutting.begun().await
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Marks one unit of work (a request, a background run) as in flight
    /// until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Waits until no work is in flight, or `limit` passes. Returns whether idle.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the count is read, so an end in between
            // still wakes this waiter.
            let woken = self.idle.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.in_flight() == 0 {
                return true;
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(deadline) => return self.in_flight() == 0,
            }
        }
    }
}

/// One unit of work in flight; dropping it ends it.
#[derive(Debug)]
pub struct InFlight(Arc<Shutdown>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_the_last_unit_of_work() {
        let shutdown = Arc::new(Shutdown::default());
        assert!(shutdown.wait_idle(Duration::ZERO).await);
        let work = shutdown.begin();
        assert!(!shutdown.wait_idle(Duration::from_millis(10)).await);
        let waiter = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.wait_idle(Duration::from_secs(5)).await }
        });
        drop(work);
        assert!(waiter.await.unwrap());
        assert_eq!(shutdown.in_flight(), 0);
    }

    #[tokio::test]
    async fn draining_wakes_its_waiters() {
        let shutdown = Arc::new(Shutdown::default());
        let waiter = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.draining().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        shutdown.start_draining();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        // Once draining, at once.
        shutdown.draining().await;
    }

    #[tokio::test]
    async fn cutting_wakes_its_waiters() {
        let shutdown = Arc::new(Shutdown::default());
        let waiter = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.cutting().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        shutdown.start_cutting();
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(shutdown.is_cutting());
        shutdown.cutting().await;
    }
}
