//! The queue's side of the order shared across replicas
//! ([`crate::pool::peers`]): what it publishes, what it reads back.

use super::{PoolQueue, Stage, State, Ticket};
use crate::pool::peers::{self, Entry, Incoming, Link, Outgoing, PeerView, Rank, SharedOrder};
use std::sync::Arc;
use std::time::Instant;

impl SharedOrder for PoolQueue {
    fn model(&self) -> &str {
        &self.model
    }

    fn dispatch(&self) {
        PoolQueue::dispatch(self)
    }

    /// What the sync task publishes now: this replica's entry, the counter
    /// changes to add, and the organisations whose counters it orders by.
    fn outgoing(&self, link: &Link) -> Outgoing {
        let mut st = self.lock();
        let now = Instant::now();
        let ranks = st
            .waiting
            .iter()
            .flatten()
            .map(|w| st.rank(&w.ticket))
            .collect();
        let calls = self.members.calls();
        let in_flight: u32 = calls.iter().map(|(_, n)| n).sum();
        let entry = Entry {
            in_use: in_flight.saturating_add(st.granted),
            calls,
            levers: st.preemptible.holding(),
            floor: st.active_floor(),
            ranks: peers::best_ranks(ranks),
        };
        let mut counters: Vec<(Arc<str>, f64, f64)> = std::mem::take(&mut st.pending)
            .into_iter()
            .map(|(org, (incr, floor))| (org, incr, floor))
            .collect();
        let mut waiting_orgs: Vec<Arc<str>> = Vec::new();
        for w in st.waiting.iter().flatten() {
            if waiting_orgs.len() + counters.len() >= peers::MAX_READ_ORGS {
                break;
            }
            let org = &w.ticket.org;
            if !counters.iter().any(|(o, _, _)| o == org) && !waiting_orgs.contains(org) {
                waiting_orgs.push(Arc::clone(org));
            }
        }
        counters.extend(waiting_orgs.into_iter().map(|o| (o, 0.0, 0.0)));
        let deferred = link
            .deferred
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        let changed = st.published.as_ref() != Some(&entry);
        Outgoing {
            nudge: deferred || (changed && st.peers.acts_on(&entry, now)),
            changed,
            active: st.orgs.values().any(|o| o.active > 0),
            entry,
            counters,
        }
    }

    /// What a sync read: the peers' view, and the shared counters (plus
    /// what was charged here since).
    fn incoming(&self, out: Outgoing, incoming: Incoming, now: Instant) -> bool {
        let mut st = self.lock();
        st.peers = PeerView::from_entries(&incoming.me, incoming.peers, now);
        // The nudge was decided on the view before this one: a peer that
        // only now shows waiters or levers hears of the change too.
        let nudge_now = !out.nudge && out.changed && st.peers.acts_on(&out.entry, now);
        // Each worker's load counts the peers' calls on it, for as long as
        // the view is trusted: routing and free slots see them.
        for e in self.members.snapshot().iter() {
            e.record_peer_inflight(st.peers.calls_on(e.addr()), peers::VIEW_FRESH_FOR);
        }
        for (org, shared) in incoming.counters {
            let (incr, floor) = st.pending.get(&org).copied().unwrap_or_default();
            if let Some(o) = st.orgs.get_mut(&org) {
                o.counter = shared.max(floor) + incr;
            }
        }
        st.published = Some(out.entry);
        nudge_now
    }

    /// A sync failed: its counter changes go with the next one.
    fn unsent(&self, out: Outgoing) {
        let mut st = self.lock();
        for (org, incr, floor) in out.counters {
            let p = st.pending.entry(org).or_default();
            p.0 += incr;
            p.1 = p.1.max(floor);
        }
    }
}

impl State {
    /// The lowest counter of the organisations active here.
    pub(super) fn active_floor(&self) -> Option<f64> {
        self.orgs
            .values()
            .filter(|o| o.active > 0)
            .map(|o| o.counter)
            .min_by(f64::total_cmp)
    }

    /// A request's place in the pool's order, for the peers.
    pub(super) fn rank(&self, t: &Ticket) -> Rank {
        Rank {
            tier: t.tier,
            started: t.stage == Stage::Started,
            counter: self.orgs.get(&t.org).map_or(0.0, |o| o.counter),
        }
    }
}
