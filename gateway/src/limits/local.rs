//! The local first stage: per organisation and model, what this replica
//! already knows about the plan's limits, so that a flood is shed without a
//! Redis round trip:
//! - the request window's reset, learned from the global stage's last
//!   refusal: until then the window is full for every replica, and a local
//!   refusal carries the same reset and `retry-after` as the global one
//!   (a client honouring it is not refused again for the same window);
//! - a count of this replica's requests in flight, sized at the plan's
//!   whole allowance (a replica's own in-flight requests are part of the
//!   global count, so it only refuses what the global stage would).
//!
//! No local token bucket: a bucket here counts requests the global stage
//! then refuses, and answers with its own refill time, which contradicts
//! the global window (the audit saw `retry-after: 1` while the window was
//! full for 60 s). Tokens per minute are left to the global stage too: a
//! local count could not be refunded when a request settles below its
//! reservation.

use super::refusal::LocalRefusal;
use super::store::Verdict;
use crate::accounts::RatePlan;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Local state of one organisation and model.
pub struct LocalEntry {
    /// The plan's rpm this entry was built for.
    rpm: u32,
    /// Until when (the limiter's clock, ms) the request window is known to
    /// be full: the reset of the global stage's last `requests` refusal.
    requests_full_until_ms: AtomicU64,
    /// Shared with the entry this one replaced (after a plan change), so
    /// releases of older reservations still count.
    in_flight: Arc<AtomicU32>,
}

impl LocalEntry {
    fn new(rpm: u32, in_flight: Arc<AtomicU32>) -> Self {
        Self {
            rpm,
            requests_full_until_ms: AtomicU64::new(0),
            in_flight,
        }
    }

    /// Takes a local slot (released by [`LocalEntry::release`]) or refuses.
    /// `now_ms` is the limiter's clock.
    pub(crate) fn check(&self, plan: &RatePlan, now_ms: u64) -> Result<(), LocalRefusal> {
        if plan.max_concurrent > 0 && self.in_flight.load(Ordering::Relaxed) >= plan.max_concurrent
        {
            return Err(LocalRefusal {
                verdict: Verdict::Concurrency,
                retry_after: Duration::from_secs(1),
            });
        }
        let full_until = self.requests_full_until_ms.load(Ordering::Relaxed);
        if plan.rpm > 0 && full_until > now_ms {
            return Err(LocalRefusal {
                verdict: Verdict::Requests,
                retry_after: Duration::from_millis(full_until - now_ms),
            });
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Takes a local slot without checking: a request admitted on another
    /// replica and taken over here ([`super::Limiter::take_over`]).
    pub(crate) fn hold(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// The global stage refused for requests: the window is full for
    /// `retry_after_ms` from `now_ms`.
    pub(crate) fn requests_full_for(&self, now_ms: u64, retry_after_ms: u64) {
        self.requests_full_until_ms
            .fetch_max(now_ms + retry_after_ms, Ordering::Relaxed);
    }

    pub(crate) fn release(&self) {
        // Saturating: a double release must not wrap to u32::MAX.
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// (organisation, model).
type EntryKey = (Arc<str>, &'static str);

/// Local entries by organisation and model.
#[derive(Default)]
pub struct LocalStage {
    entries: RwLock<HashMap<EntryKey, Arc<LocalEntry>>>,
}

impl LocalStage {
    /// The entry for `org` and `model`, rebuilt if the plan's rpm changed.
    pub fn entry(&self, org: &Arc<str>, model: &'static str, plan: &RatePlan) -> Arc<LocalEntry> {
        let key = (org.clone(), model);
        if let Ok(entries) = self.entries.read() {
            if let Some(e) = entries.get(&key) {
                if e.rpm == plan.rpm {
                    return e.clone();
                }
            }
        }
        let Ok(mut entries) = self.entries.write() else {
            return Arc::new(LocalEntry::new(plan.rpm, Arc::default()));
        };
        let in_flight = match entries.get(&key) {
            Some(e) if e.rpm == plan.rpm => return e.clone(),
            Some(old) => old.in_flight.clone(),
            None => Arc::default(),
        };
        let fresh = Arc::new(LocalEntry::new(plan.rpm, in_flight));
        entries.insert(key, fresh.clone());
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_request_window_refuses_with_its_reset_until_then() {
        let stage = LocalStage::default();
        let plan = RatePlan {
            rpm: 5,
            ..RatePlan::default()
        };
        let e = stage.entry(&"org".into(), "base", &plan);
        // Nothing known: every request goes on to the global stage.
        for _ in 0..10 {
            assert!(e.check(&plan, 1_000).is_ok());
        }
        e.requests_full_for(1_000, 59_000);
        let refusal = e.check(&plan, 2_000).unwrap_err();
        assert_eq!(refusal.verdict, Verdict::Requests);
        assert_eq!(refusal.retry_after, Duration::from_millis(58_000));
        // An older, shorter answer does not shorten the known reset.
        e.requests_full_for(1_500, 1_000);
        assert_eq!(
            e.check(&plan, 59_000).unwrap_err().retry_after,
            Duration::from_millis(1_000)
        );
        assert!(e.check(&plan, 60_000).is_ok());
        // Another model has its own window.
        assert!(stage
            .entry(&"org".into(), "base-mini", &plan)
            .check(&plan, 2_000)
            .is_ok());
    }

    #[test]
    fn in_flight_limit_and_release() {
        let stage = LocalStage::default();
        let plan = RatePlan {
            max_concurrent: 2,
            ..RatePlan::default()
        };
        let e = stage.entry(&"org".into(), "base", &plan);
        e.check(&plan, 0).unwrap();
        e.check(&plan, 0).unwrap();
        assert_eq!(e.check(&plan, 0).unwrap_err().verdict, Verdict::Concurrency);
        e.release();
        assert!(e.check(&plan, 0).is_ok());
        e.release();
        e.release();
        e.release();
        assert_eq!(e.in_flight(), 0);
        // A plan change keeps the count.
        e.check(&plan, 0).unwrap();
        let changed = RatePlan { rpm: 3, ..plan };
        assert_eq!(stage.entry(&"org".into(), "base", &changed).in_flight(), 1);
    }
}
