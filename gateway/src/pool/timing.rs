//! How fast one worker's engine prefills and how long it keeps a slot, as
//! this gateway measures it on its own requests. Cache-aware routing uses
//! them to weigh a wait for a busy engine that holds a prompt's prefix
//! against prefilling the prompt on a free one: on a GPU a prefill is
//! cheap beside a wait, on a CPU it can be the other way round, so the
//! trade is measured, not configured. The model itself is
//! [`inference_proto::engine_timing`], shared with the upstream worker's
//! slot choice.

pub use inference_proto::engine_timing::Measured;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The `measure` labels of `gateway_worker_engine_seconds`, in the order
/// of [`EngineTimes::figures`].
pub const MEASURES: [&str; 2] = ["prefill_per_block", "slot_hold"];

/// One engine's moving averages; all 0 until the first sample.
#[derive(Debug, Default)]
pub struct EngineTimes(Mutex<Measured>);

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

impl EngineTimes {
    fn now(&self) -> Measured {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A request that found a free slot finished.
    pub fn record(&self, call: CallSample) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(call.whole, call.first_event, call.prefilled_blocks);
    }

    /// The figures in [`MEASURES`]' order, each once measured.
    pub fn figures(&self) -> [Option<f64>; 2] {
        let m = self.now();
        let known = |ns: f64| (ns > 0.0).then_some(ns);
        [known(m.prefill_ns_per_block), known(m.hold_ns)]
    }

    /// Both figures, once both are measured.
    pub fn measured(&self) -> Option<Measured> {
        Some(self.now()).filter(Measured::is_measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_known_before_a_request_finished() {
        let t = EngineTimes::default();
        assert_eq!(t.figures(), [None, None]);
        assert_eq!(t.measured(), None);
    }

    #[test]
    fn a_finished_call_is_measured_and_reported() {
        let t = EngineTimes::default();
        t.record(CallSample {
            first_event: Duration::from_millis(400),
            whole: Duration::from_millis(1000),
            prefilled_blocks: 4.0,
        });
        assert_eq!(t.figures(), [Some(100e6), Some(1000e6)]);
        assert_eq!(t.measured().map(|m| m.hold_ns), Some(1000e6));
    }
}
