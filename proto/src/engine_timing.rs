//! One model of an engine's speed, measured on its own requests, for both
//! sides that route by it: the gateway weighs a wait for a busy worker
//! that holds a prompt's prefix against prefilling it on a free one, and
//! the upstream worker does the same between llama-server's slots. Both
//! keep the same moving averages and read them the same way, so a change
//! here changes both.

use crate::prefix::BLOCK_BYTES;
use std::time::Duration;

/// Weight of a new sample in the moving averages (1/8: the last dozen or
/// so requests).
pub const SAMPLE_WEIGHT: f64 = 1.0 / 8.0;

/// A sample of the prefill rate needs at least this many prefilled blocks
/// (512 bytes, about 128 tokens): below it the time to first token is
/// mostly the first decode step, not prefill.
pub const MIN_PREFILLED_BLOCKS: f64 = (512 / BLOCK_BYTES) as f64;

/// The moving average after `sample` (the first sample sets it; 0 means
/// none yet).
pub fn moving_average(average: f64, sample: f64) -> f64 {
    if average == 0.0 {
        sample
    } else {
        average + SAMPLE_WEIGHT * (sample - average)
    }
}

/// An engine's measured speed, in nanoseconds (0: not measured yet).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Time to first token per prefilled block.
    pub prefill_ns_per_block: f64,
    /// How long a request keeps its slot.
    pub hold_ns: f64,
}

impl Measured {
    /// Both figures have a sample.
    pub fn is_measured(&self) -> bool {
        self.prefill_ns_per_block > 0.0 && self.hold_ns > 0.0
    }

    /// A request that found its slot free ended after `hold`, its first
    /// event `first_event` after it started, having prefilled
    /// `prefilled_blocks` (not cached): the slot time, and the prefill rate
    /// when it prefilled enough to tell.
    pub fn record(&mut self, hold: Duration, first_event: Duration, prefilled_blocks: f64) {
        self.hold_ns = moving_average(self.hold_ns, nanos(hold).max(1.0));
        if prefilled_blocks >= MIN_PREFILLED_BLOCKS {
            let per_block = (nanos(first_event) / prefilled_blocks).max(1.0);
            self.prefill_ns_per_block = moving_average(self.prefill_ns_per_block, per_block);
        }
    }

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
        let age = nanos(age);
        (self.hold_ns - age).max(age / 2.0)
    }

    /// The prefill of `blocks` blocks.
    pub fn prefill_ns(&self, blocks: usize) -> f64 {
        blocks as f64 * self.prefill_ns_per_block
    }
}

fn nanos(d: Duration) -> f64 {
    d.as_nanos() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_sample_sets_the_rates_and_later_ones_move_them() {
        let mut m = Measured::default();
        assert!(!m.is_measured());
        m.record(ms(1000), ms(400), 4.0);
        assert_eq!(m.prefill_ns_per_block, 100e6);
        assert_eq!(m.hold_ns, 1000e6);
        assert!(m.is_measured());
        // One request waiting behind two busy slots: half a hold.
        assert_eq!(m.expected_wait_ns(1, 2), 500e6);
        m.record(ms(2000), ms(1800), 4.0);
        assert_eq!(m.prefill_ns_per_block, 100e6 + (450e6 - 100e6) / 8.0);
        assert_eq!(m.hold_ns, 1000e6 + 1000e6 / 8.0);
    }

    #[test]
    fn a_mostly_cached_prompt_says_nothing_of_the_prefill_rate() {
        let mut m = Measured::default();
        m.record(ms(300), ms(50), MIN_PREFILLED_BLOCKS - 0.5);
        assert_eq!(m.prefill_ns_per_block, 0.0);
        assert_eq!(m.hold_ns, 300e6);
        assert!(!m.is_measured(), "half measured is not measured");
    }

    #[test]
    fn a_request_past_the_usual_hold_is_taken_as_a_long_one() {
        let m = Measured {
            prefill_ns_per_block: 1e6,
            hold_ns: 300e6,
        };
        assert_eq!(m.remaining_ns(Duration::ZERO), 300e6);
        assert_eq!(m.remaining_ns(ms(100)), 200e6);
        assert_eq!(m.remaining_ns(ms(200)), 100e6);
        assert_eq!(m.remaining_ns(ms(600)), 300e6);
        assert_eq!(m.prefill_ns(3), 3e6);
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
