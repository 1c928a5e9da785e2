//! The local first stage: per organisation and model, a `governor` rate
//! limiter at the plan's requests per minute (burst = the whole minute) and
//! a count of this replica's requests in flight.
//!
//! Both are sized at the plan's full allowance, because one replica may
//! legitimately receive all of an organisation's traffic: the stage only
//! refuses what the global stage would refuse too (a replica's own
//! in-flight requests are part of the global count; a token bucket that
//! refills continuously admits at least as much as a sliding window of the
//! same size). Its value is shedding a flood without a Redis round trip.
//! Tokens per minute are left to the global stage: a local bucket could not
//! be refunded when a request settles below its reservation.

use super::{LocalRefusal, Plan, Verdict};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Local state of one organisation and model.
pub struct LocalEntry {
    /// The plan's rpm this limiter was built for.
    rpm: u32,
    requests: Option<DefaultDirectRateLimiter>,
    /// Shared with the entry this one replaced (after a plan change), so
    /// releases of older reservations still count.
    in_flight: Arc<AtomicU32>,
}

impl LocalEntry {
    fn new(rpm: u32, in_flight: Arc<AtomicU32>) -> Self {
        Self {
            rpm,
            requests: NonZeroU32::new(rpm).map(|n| RateLimiter::direct(Quota::per_minute(n))),
            in_flight,
        }
    }

    /// Takes a local slot (released by [`LocalEntry::release`]) or refuses.
    pub(crate) fn check(&self, plan: &Plan, _tokens: u64) -> Result<(), LocalRefusal> {
        if plan.max_concurrent > 0 && self.in_flight.load(Ordering::Relaxed) >= plan.max_concurrent
        {
            return Err(LocalRefusal {
                verdict: Verdict::Concurrency,
                retry_after: Duration::from_secs(1),
            });
        }
        if let Some(limiter) = &self.requests {
            if let Err(not_until) = limiter.check() {
                let wait = not_until.wait_time_from(governor::clock::Clock::now(
                    &governor::clock::DefaultClock::default(),
                ));
                return Err(LocalRefusal {
                    verdict: Verdict::Requests,
                    retry_after: wait,
                });
            }
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(())
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
    pub fn entry(&self, org: &Arc<str>, model: &'static str, plan: &Plan) -> Arc<LocalEntry> {
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
    fn requests_per_minute_burst_is_the_whole_minute() {
        let stage = LocalStage::default();
        let plan = Plan {
            rpm: 5,
            ..Plan::default()
        };
        let e = stage.entry(&"org".into(), "base", &plan);
        for _ in 0..5 {
            assert!(e.check(&plan, 1).is_ok());
        }
        let refusal = e.check(&plan, 1).unwrap_err();
        assert_eq!(refusal.verdict, Verdict::Requests);
        assert!(
            refusal.retry_after > Duration::from_secs(5)
                && refusal.retry_after <= Duration::from_secs(12)
        );
        // Another model has its own allowance.
        assert!(stage
            .entry(&"org".into(), "base-mini", &plan)
            .check(&plan, 1)
            .is_ok());
    }

    #[test]
    fn in_flight_limit_and_release() {
        let stage = LocalStage::default();
        let plan = Plan {
            max_concurrent: 2,
            ..Plan::default()
        };
        let e = stage.entry(&"org".into(), "base", &plan);
        e.check(&plan, 1).unwrap();
        e.check(&plan, 1).unwrap();
        assert_eq!(e.check(&plan, 1).unwrap_err().verdict, Verdict::Concurrency);
        e.release();
        assert!(e.check(&plan, 1).is_ok());
        e.release();
        e.release();
        e.release();
        assert_eq!(e.in_flight(), 0);
        // A plan change keeps the count.
        e.check(&plan, 1).unwrap();
        let changed = Plan { rpm: 3, ..plan };
        assert_eq!(stage.entry(&"org".into(), "base", &changed).in_flight(), 1);
    }
}
