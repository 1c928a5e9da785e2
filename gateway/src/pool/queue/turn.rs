//! A request's place in the pool's queue ([`Waiting`]) and, once granted,
//! its turn on the pool's workers ([`Turn`]): what each gives back when
//! it ends.

use super::{PoolQueue, Shed, Stage, Ticket, OUTPUT_WEIGHT};
use crate::accounts::ServiceTier;
use crate::pool::preempt::Lever;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A queued request's wait for its turn; leaving (drop) takes it out.
pub(super) struct Waiting {
    pub(super) queue: Arc<PoolQueue>,
    pub(super) id: u64,
    pub(super) org: Arc<str>,
    pub(super) rx: oneshot::Receiver<Result<(), Shed>>,
    pub(super) done: bool,
}

impl Waiting {
    pub(super) async fn wait(mut self, ticket: Ticket, max_wait: Duration) -> Result<Turn, Shed> {
        // A generation that started waits within its own deadline only.
        let granted = if ticket.stage == Stage::Started {
            Ok((&mut self.rx).await)
        } else {
            tokio::time::timeout(max_wait, &mut self.rx).await
        };
        match granted {
            Ok(Ok(Ok(()))) => {
                self.done = true;
                Ok(Turn::new(&self.queue, ticket))
            }
            Ok(Ok(Err(why))) => {
                self.queue.count_shed(why, &self.org);
                Err(why)
            }
            // Timed out (or the queue dropped the sender, which it does not
            // do while the waiter is in it).
            _ => {
                self.queue.count_shed(Shed::Timeout, &self.org);
                Err(Shed::Timeout)
            }
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = self.queue.lock();
        let id = self.id;
        let still_waiting = st.waiting.iter_mut().any(|q| {
            q.iter()
                .position(|w| w.id == id)
                .and_then(|i| q.remove(i))
                .is_some()
        });
        let mut handed_back = false;
        if !still_waiting {
            // Granted, but nobody took the turn: hand back what it was
            // promised, to the next in line.
            self.rx.close();
            if matches!(self.rx.try_recv(), Ok(Ok(()))) {
                st.granted = st.granted.saturating_sub(1);
                handed_back = true;
            }
        }
        st.deactivate(&self.org);
        self.queue.publish_depth(&st);
        drop(st);
        if handed_back {
            self.queue.dispatch();
        }
        self.queue.touch();
    }
}

/// A request's turn to use the pool: held until its call ends. It first
/// counts as granted capacity, then ([`Turn::started`]) as a worker slot.
pub struct Turn {
    queue: Arc<PoolQueue>,
    id: u64,
    org: Arc<str>,
    weight: u32,
    tier: ServiceTier,
    preemptions: u32,
    granted: bool,
    /// Registered as preemptible ([`Turn::preemptible`]).
    registered: bool,
}

/// Turn ids, for the pool's register of preemptible generations.
static TURN_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Turn {
    pub(super) fn new(queue: &Arc<PoolQueue>, ticket: Ticket) -> Self {
        Self {
            queue: Arc::clone(queue),
            id: TURN_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            org: ticket.org,
            weight: ticket.weight,
            tier: ticket.tier,
            preemptions: ticket.preemptions,
            granted: true,
            registered: false,
        }
    }

    /// The call runs: when the pool's policy lets a higher tier preempt
    /// it, it is registered with the lever the queue will pull; `None`
    /// when it may not be preempted (its tier, or its preemptions spent).
    pub fn preemptible(&mut self) -> Option<Arc<Lever>> {
        if self.registered
            || !self
                .queue
                .limits
                .preempt
                .allows(self.tier, self.preemptions)
        {
            return None;
        }
        let lever = Arc::new(Lever::default());
        let mut st = self.queue.lock();
        st.preemptible
            .register(self.id, self.tier, self.preemptions, Arc::clone(&lever));
        drop(st);
        self.registered = true;
        // The peers count this replica's levers before preempting for
        // their own waiters: publish it now, not at the next heartbeat.
        self.queue.touch();
        Some(lever)
    }

    /// The registered generation has noted what it delivered (its first
    /// event): a higher tier already waiting may preempt it now rather than
    /// at the queue's next change.
    pub fn offer(&self) {
        if self.registered {
            self.queue.dispatch();
        }
    }

    /// The request holds a worker slot now: the capacity it was promised
    /// is counted there.
    pub fn started(&mut self) {
        if std::mem::take(&mut self.granted) {
            let mut st = self.queue.lock();
            st.granted = st.granted.saturating_sub(1);
        }
    }

    /// The request ended having generated `output_tokens`: its service,
    /// charged to its organisation.
    pub fn served(&self, output_tokens: u64) {
        let mut st = self.queue.lock();
        let model = &self.queue.model;
        st.charge(
            model,
            &self.org,
            output_tokens as f64 * OUTPUT_WEIGHT,
            self.weight,
        );
        drop(st);
        self.queue.touch();
    }
}

impl Drop for Turn {
    /// Dropped after the call's worker slot (see `CallGuard`), so the
    /// next waiter finds it free.
    fn drop(&mut self) {
        let mut st = self.queue.lock();
        if self.granted {
            st.granted = st.granted.saturating_sub(1);
        }
        if self.registered {
            st.preemptible.remove(self.id);
        }
        st.deactivate(&self.org);
        drop(st);
        // Its slot goes to the next waiter first, then the peers hear of
        // the change: published between the two, the dip would tell an
        // idle peer a slot is free that is already promised here.
        self.queue.dispatch();
        self.queue.touch();
    }
}
