//! How fast one worker's engine prefills and how long it keeps a slot, as
//! this gateway measures it on its own requests. Cache-aware routing uses
//! them to weigh a wait for a busy engine that holds a prompt's prefix
//! against prefilling the prompt on a free one: on a GPU a prefill is
//! cheap beside a wait, on a CPU it can be the other way round, so the
//! trade is measured, not configured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Weight of a new sample in the moving averages (1/8: the last dozen or
/// so requests).
const SAMPLE_SHIFT: u32 = 3;

/// A sample covers at least this many prefilled blocks: below it the time
/// to first token is mostly the first decode step, not prefill.
const MIN_PREFILLED_BLOCKS: f64 = 1.0;

/// The `measure` labels of `gateway_worker_engine_seconds`, in the order
/// of [`EngineTimes::prefill_ns_per_block`] and [`EngineTimes::hold_ns`].
pub const MEASURES: [&str; 2] = ["prefill_per_block", "slot_hold"];

/// Moving averages in nanoseconds; 0 until the first sample.
#[derive(Debug, Default)]
pub struct EngineTimes {
    prefill_ns_per_block: AtomicU64,
    hold_ns: AtomicU64,
}

/// An engine's measured speed, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    pub prefill_ns_per_block: f64,
    pub hold_ns: f64,
}

impl Measured {
    /// The mean of several engines' figures (`None` for none): the prior
    /// for an engine of the same pool not measured yet (one model, in
    /// practice one class of hardware).
    pub fn mean(all: impl IntoIterator<Item = Measured>) -> Option<Measured> {
        let (mut n, mut prefill, mut hold) = (0.0, 0.0, 0.0);
        for m in all {
            n += 1.0;
            prefill += m.prefill_ns_per_block;
            hold += m.hold_ns;
        }
        (n > 0.0).then(|| Measured {
            prefill_ns_per_block: prefill / n,
            hold_ns: hold / n,
        })
    }

    /// The expected wait for a slot with `ahead` requests beyond the
    /// `capacity` running ones: slots free at `capacity` per hold time.
    pub fn expected_wait_ns(&self, ahead: u32, capacity: u32) -> f64 {
        f64::from(ahead) * self.hold_ns / f64::from(capacity.max(1))
    }

    /// What is left of a request that has run for `age`: the rest of a
    /// usual hold, but at least half its age, since one that has run
    /// longer than usual is likely a long one (a reply of many tokens).
    pub fn remaining_ns(&self, age: Duration) -> f64 {
        let age = age.as_nanos() as f64;
        (self.hold_ns - age).max(age / 2.0)
    }
}

/// What one finished request on the engine showed.
#[derive(Debug, Clone, Copy)]
pub struct CallSample {
    /// From dispatch to the first event.
    pub first_event: Duration,
    /// From dispatch to the end of the reply.
    pub whole: Duration,
    /// The prompt's blocks the engine had to prefill (not cached).
    pub prefilled_blocks: f64,
}

fn observe(cell: &AtomicU64, sample: u64) {
    let sample = sample.max(1);
    // Concurrent updates may lose one sample; the average stays an average.
    let _ = cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some(if old == 0 {
            sample
        } else {
            old - (old >> SAMPLE_SHIFT) + (sample >> SAMPLE_SHIFT)
        })
    });
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl EngineTimes {
    /// A request that found a free slot finished: the slot time, and the
    /// prefill rate when it prefilled enough to tell.
    pub fn record(&self, call: CallSample) {
        observe(&self.hold_ns, nanos(call.whole));
        if call.prefilled_blocks >= MIN_PREFILLED_BLOCKS {
            let per_block = nanos(call.first_event) as f64 / call.prefilled_blocks;
            observe(&self.prefill_ns_per_block, per_block as u64);
        }
    }

    /// Nanoseconds to first token per block prefilled, once measured.
    pub fn prefill_ns_per_block(&self) -> Option<f64> {
        match self.prefill_ns_per_block.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns as f64),
        }
    }

    /// Nanoseconds a request holds a slot, once measured.
    pub fn hold_ns(&self) -> Option<f64> {
        match self.hold_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns as f64),
        }
    }

    /// Both figures, once both are measured.
    pub fn measured(&self) -> Option<Measured> {
        Some(Measured {
            prefill_ns_per_block: self.prefill_ns_per_block()?,
            hold_ns: self.hold_ns()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(first_ms: u64, whole_ms: u64, blocks: f64) -> CallSample {
        CallSample {
            first_event: Duration::from_millis(first_ms),
            whole: Duration::from_millis(whole_ms),
            prefilled_blocks: blocks,
        }
    }

    #[test]
    fn nothing_is_known_before_a_request_finished() {
        let t = EngineTimes::default();
        assert_eq!(t.prefill_ns_per_block(), None);
        assert_eq!(t.hold_ns(), None);
        assert_eq!(t.measured(), None);
    }

    #[test]
    fn the_first_sample_sets_the_rates_and_later_ones_move_them() {
        let t = EngineTimes::default();
        t.record(call(400, 1000, 4.0));
        assert_eq!(t.prefill_ns_per_block(), Some(100e6));
        assert_eq!(t.hold_ns(), Some(1000e6));
        // One request waiting behind two busy slots: half a hold.
        assert_eq!(t.measured().unwrap().expected_wait_ns(1, 2), 500e6);
        t.record(call(1800, 2000, 4.0));
        let per_block = t.prefill_ns_per_block().unwrap();
        assert!(per_block > 100e6 && per_block < 450e6, "{per_block}");
    }

    #[test]
    fn a_mostly_cached_prompt_says_nothing_of_the_prefill_rate() {
        let t = EngineTimes::default();
        t.record(call(50, 300, 0.5));
        assert_eq!(t.prefill_ns_per_block(), None);
        assert_eq!(t.hold_ns(), Some(300e6));
        assert_eq!(t.measured(), None, "half measured is not measured");
    }

    #[test]
    fn a_request_past_the_usual_hold_is_taken_as_a_long_one() {
        let m = Measured {
            prefill_ns_per_block: 1e6,
            hold_ns: 300e6,
        };
        assert_eq!(m.remaining_ns(Duration::ZERO), 300e6);
        assert_eq!(m.remaining_ns(Duration::from_millis(100)), 200e6);
        assert_eq!(m.remaining_ns(Duration::from_millis(200)), 100e6);
        assert_eq!(m.remaining_ns(Duration::from_millis(600)), 300e6);
    }

    #[test]
    fn the_pool_prior_is_the_mean_of_the_measured_engines() {
        let m = |p: f64, h: f64| Measured {
            prefill_ns_per_block: p,
            hold_ns: h,
        };
        assert_eq!(Measured::mean([]), None);
        assert_eq!(
            Measured::mean([m(100.0, 400.0), m(300.0, 800.0)]),
            Some(m(200.0, 600.0))
        );
    }
}
