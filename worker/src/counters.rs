//! Totals since start, reported in `Info.counters`. Tests assert on them
//! from the worker's side (for example that a dropped stream was cancelled).

use crate::seam::Outcome;
use inference_proto::v1 as pb;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct Counters {
    started: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    tokens_generated: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_prompt_tokens: AtomicU64,
    rejected: AtomicU64,
    reset_after_finish: AtomicU64,
    /// Trace id of the last generation that carried a valid `traceparent`.
    last_trace_id: Mutex<Option<u128>>,
}

impl Counters {
    /// A generation was admitted and starts streaming.
    pub fn started(&self, prompt_tokens: u32, cached_prompt_tokens: u32) {
        self.started.fetch_add(1, Relaxed);
        self.prompt_tokens
            .fetch_add(u64::from(prompt_tokens), Relaxed);
        self.cached_prompt_tokens
            .fetch_add(u64::from(cached_prompt_tokens), Relaxed);
    }

    /// Refused before generating (context length, overload, draining, invalid).
    /// Prompt tokens reused from the cache, when an engine learns the count
    /// only after prefill.
    pub fn cached(&self, cached_prompt_tokens: u32) {
        self.cached_prompt_tokens
            .fetch_add(u64::from(cached_prompt_tokens), Relaxed);
    }

    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Relaxed);
    }

    /// A generation ended.
    pub fn finished(&self, outcome: Outcome) {
        let (counter, tokens) = match outcome {
            Outcome::Completed { tokens } => (&self.completed, tokens),
            Outcome::Cancelled { tokens } => (&self.cancelled, tokens),
            Outcome::Failed { tokens } => (&self.failed, tokens),
        };
        counter.fetch_add(1, Relaxed);
        self.tokens_generated.fetch_add(u64::from(tokens), Relaxed);
    }

    /// The gateway dropped a stream whose generation had sent its last
    /// event, before reading the stream's end (its trailers).
    pub fn reset_after_finish(&self) {
        self.reset_after_finish.fetch_add(1, Relaxed);
    }

    /// A generation arrived with this trace id (`traceparent` metadata).
    pub fn traced(&self, trace_id: u128) {
        let mut last = match self.last_trace_id.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *last = Some(trace_id);
    }

    /// The last trace id seen, as 32 hex digits; empty before any.
    pub fn last_trace_id(&self) -> String {
        let last = match self.last_trace_id.lock() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        };
        last.map(|id| format!("{id:032x}")).unwrap_or_default()
    }

    pub fn snapshot(&self) -> pb::Counters {
        pb::Counters {
            started: self.started.load(Relaxed),
            completed: self.completed.load(Relaxed),
            cancelled: self.cancelled.load(Relaxed),
            failed: self.failed.load(Relaxed),
            tokens_generated: self.tokens_generated.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            cached_prompt_tokens: self.cached_prompt_tokens.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            reset_after_finish: self.reset_after_finish.load(Relaxed),
        }
    }
}
