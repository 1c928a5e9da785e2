//! Concurrency slots tied to their replica's liveness.
//!
//! A slot in an in-flight set is a lease: admission writes it to lapse one
//! lease from now (`store.lease_millis`), and the replica that admitted the
//! request renews it on a heartbeat ([`super::Limiter::maintain`], every
//! `store.heartbeat_millis`) while the request runs. A replica that dies
//! stops renewing, so its slots lapse within one lease instead of holding
//! its organisations' allowance for a fixed TTL of many minutes. A
//! reservation is renewed only until its request's deadline plus a lease,
//! and never past `limits.concurrency_ttl_seconds`, so a guard leaked by a
//! live replica cannot hold a slot for ever either.
//!
//! `retry-after` of a concurrency refusal (both stores compute it the same
//! way): the store looks at the slot that lapses first. If it was written
//! (admitted or renewed) more than two renewal periods ago, its owner has
//! missed renewals and is presumed dead: the slot frees when it lapses, so
//! the time until then is the answer (an upper bound). Otherwise every
//! owner is alive and any slot may free at any moment: the answer is a
//! short hint, [`LIVE_RETRY_MS`].

use super::store::Holder;
use crate::config::Config;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `retry-after` of a concurrency refusal while every slot's owner renews.
pub const LIVE_RETRY_MS: u64 = 1000;

/// How slots are leased and renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLease {
    /// A slot not renewed within this lapses.
    pub lease: Duration,
    /// How often its owner renews it.
    pub renew_every: Duration,
    /// How long one reservation's slot is renewed at most.
    pub max_hold: Duration,
}

impl SlotLease {
    /// `renew_every` is kept under half the lease, so one late heartbeat
    /// does not lose a live slot.
    pub fn new(lease: Duration, renew_every: Duration, max_hold: Duration) -> Self {
        let lease = lease.max(Duration::from_millis(2));
        Self {
            lease,
            renew_every: renew_every.min(lease / 2).max(Duration::from_millis(1)),
            max_hold,
        }
    }

    /// The store's lease and heartbeat; renewed until the longest deadline
    /// a request can have (a generation's, or a planner run's) plus a
    /// lease, capped by `limits.concurrency_ttl_seconds`.
    pub fn from_config(config: &Config) -> Self {
        let lease = Duration::from_millis(config.store.lease_millis);
        let planner = &config.planner;
        let deadline = Duration::from_secs(config.request_timeout_seconds).max(
            Duration::from_millis(planner.run_timeout_ms + planner.synthesis_timeout_ms),
        );
        let cap = Duration::from_secs(config.limits.concurrency_ttl_seconds.max(1));
        Self::new(
            lease,
            Duration::from_millis(config.store.heartbeat_millis),
            (deadline + lease).min(cap),
        )
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    pub fn renew_every_ms(&self) -> u64 {
        self.renew_every.as_millis() as u64
    }
}

/// When a concurrency refusal can be retried, from the slot that lapses
/// first: `lapse_ms` until it lapses, written with `lease_ms`; owners renew
/// every `renew_every_ms` (see the module doc; `admit.lua` mirrors this).
pub fn concurrency_retry_ms(lapse_ms: u64, lease_ms: u64, renew_every_ms: u64) -> u64 {
    let since_written = lease_ms.saturating_sub(lapse_ms);
    if since_written > 2 * renew_every_ms {
        lapse_ms
    } else {
        lapse_ms.min(LIVE_RETRY_MS)
    }
}

/// One live reservation's slot.
struct LiveSlot {
    org: Arc<str>,
    model: &'static str,
    request_id: String,
    holder: Holder,
    renew_until: Instant,
}

/// The slots of one in-flight set to renew.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SlotGroup {
    pub(super) holder: Holder,
    pub(super) org: Arc<str>,
    pub(super) model: &'static str,
    pub(super) request_ids: Vec<String>,
}

/// The slots this replica holds for its live reservations, by a token each
/// reservation keeps.
#[derive(Default)]
pub(super) struct LiveSlots {
    next: AtomicU64,
    slots: Mutex<HashMap<u64, LiveSlot>>,
}

impl LiveSlots {
    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<u64, LiveSlot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts renewing a slot until `renew_until`; returns its token.
    pub(super) fn hold(
        &self,
        org: &Arc<str>,
        model: &'static str,
        request_id: &str,
        holder: Holder,
        renew_until: Instant,
    ) -> u64 {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        self.slots().insert(
            token,
            LiveSlot {
                org: org.clone(),
                model,
                request_id: request_id.to_owned(),
                holder,
                renew_until,
            },
        );
        token
    }

    /// Stops renewing a slot (its reservation settles).
    pub(super) fn release(&self, token: u64) {
        self.slots().remove(&token);
    }

    /// The slots to renew at `now`, grouped by store and in-flight set.
    /// Slots past their renewal deadline are left to lapse.
    pub(super) fn due(&self, now: Instant) -> Vec<SlotGroup> {
        let mut groups: HashMap<(Holder, Arc<str>, &'static str), Vec<String>> = HashMap::new();
        for slot in self.slots().values().filter(|s| s.renew_until > now) {
            groups
                .entry((slot.holder, slot.org.clone(), slot.model))
                .or_default()
                .push(slot.request_id.clone());
        }
        groups
            .into_iter()
            .map(|((holder, org, model), request_ids)| SlotGroup {
                holder,
                org,
                model,
                request_ids,
            })
            .collect()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.slots().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_renewed_by_set_until_their_deadline() {
        let live = LiveSlots::default();
        let now = Instant::now();
        let (a, b): (Arc<str>, Arc<str>) = ("org-a".into(), "org-b".into());
        let later = now + Duration::from_secs(60);
        let t1 = live.hold(&a, "base", "r1", Holder::Global, later);
        live.hold(&a, "base", "r2", Holder::Global, later);
        live.hold(&a, "base-mini", "r3", Holder::Global, later);
        live.hold(&b, "base", "r4", Holder::Memory, later);
        // Past its deadline: no longer renewed, though still held.
        live.hold(&b, "base", "r5", Holder::Memory, now);
        let mut groups = live.due(now);
        groups.sort_by(|x, y| (&x.org, x.model).cmp(&(&y.org, y.model)));
        for g in &mut groups {
            g.request_ids.sort();
        }
        let group = |holder, org: &Arc<str>, model, ids: &[&str]| SlotGroup {
            holder,
            org: org.clone(),
            model,
            request_ids: ids.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            groups,
            vec![
                group(Holder::Global, &a, "base", &["r1", "r2"]),
                group(Holder::Global, &a, "base-mini", &["r3"]),
                group(Holder::Memory, &b, "base", &["r4"]),
            ]
        );
        live.release(t1);
        assert_eq!(live.len(), 4);
        assert!(live
            .due(now)
            .iter()
            .all(|g| !g.request_ids.contains(&"r1".to_string())));
    }

    #[test]
    fn retry_after_is_the_lapse_of_a_dead_owner_and_a_short_hint_for_a_live_one() {
        // Lease 10 s, renewed every 2 s.
        // Written 1 s ago: alive; a slot may free any moment.
        assert_eq!(concurrency_retry_ms(9_000, 10_000, 2_000), 1_000);
        // Written 4 s ago: within two renewals, still presumed alive.
        assert_eq!(concurrency_retry_ms(6_000, 10_000, 2_000), 1_000);
        // Two renewals missed: frees when it lapses.
        assert_eq!(concurrency_retry_ms(5_000, 10_000, 2_000), 5_000);
        assert_eq!(concurrency_retry_ms(300, 10_000, 2_000), 300);
        // A live slot about to lapse (a late renewal): no longer than that.
        assert_eq!(concurrency_retry_ms(400, 1_000, 400), 400);
    }

    #[test]
    fn renewal_stays_under_half_a_lease_and_the_hold_under_the_cap() {
        let s = SlotLease::new(
            Duration::from_millis(1000),
            Duration::from_millis(900),
            Duration::from_secs(5),
        );
        assert_eq!(s.renew_every, Duration::from_millis(500));
        let mut config = Config::defaults();
        let s = SlotLease::from_config(&config);
        assert_eq!(s.lease, Duration::from_secs(10));
        assert_eq!(s.renew_every, Duration::from_secs(2));
        // The request deadline (600 s) plus a lease, under the 900 s cap.
        assert_eq!(s.max_hold, Duration::from_secs(610));
        config.limits.concurrency_ttl_seconds = 120;
        assert_eq!(
            SlotLease::from_config(&config).max_hold,
            Duration::from_secs(120)
        );
    }
}
