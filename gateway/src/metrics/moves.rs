//! The move series: how a generation went on when its worker failed
//! after the first event, or a higher tier preempted it.

use super::METRICS;

/// The move series of a model's generation whose worker failed for `reason`.
pub fn generation_moves(model: &str, reason: &'static str) -> GenerationMoves {
    GenerationMoves {
        model: model.to_owned(),
        reason,
    }
}

/// Counts how a failed worker's generation went on.
pub struct GenerationMoves {
    model: String,
    reason: &'static str,
}

impl GenerationMoves {
    fn count(&self, outcome: &str) {
        METRICS
            .generation_moves
            .with_label_values(&[self.model.as_str(), self.reason, outcome])
            .inc();
    }

    /// Another worker took it over, `gap` after the last output (a failed
    /// worker's gap; a preemption's pause is its own series).
    pub fn moved(&self, gap: std::time::Duration) {
        self.count_moved();
        METRICS
            .generation_move_gap
            .with_label_values(&[self.model.as_str()])
            .observe(gap.as_secs_f64());
    }

    /// Another worker took it over.
    pub fn count_moved(&self) {
        self.count("moved");
    }

    /// It could not move (the failure would repeat anywhere, or its moves
    /// are spent).
    pub fn refused(&self) {
        self.count("refused");
    }

    /// No worker took it in time.
    pub fn failed(&self) {
        self.count("failed");
    }
}
