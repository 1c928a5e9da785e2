//! What the engines, the pipeline and the service share, below all of them
//! so that dependencies flow one way (service → engine → pipeline → seam):
//!
//! - [`sequence`]: the sequence-level seam (tokens in, tokens out), what a
//!   real model engine implements; the [`crate::pipeline`] drives it;
//! - [`chat`]: the message-level seam, for engine servers with their own
//!   template and parsers;
//! - [`Started`], [`EventSink`], [`Outcome`]: a started generation of any
//!   engine, the stream it writes into, and how it ended;
//! - [`tokens`]: small helpers on token counts and ids.

pub mod chat;
pub mod sequence;
pub mod tokens;

use inference_proto::v1 as pb;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;

/// How a generation ended, for the worker's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed {
        tokens: u32,
    },
    /// The gateway dropped the stream first.
    Cancelled {
        tokens: u32,
    },
    Failed {
        tokens: u32,
    },
}

/// A started generation, whatever its engine: streams its events into the
/// sink until it ends, and says how it ended (for the worker's counters).
#[async_trait::async_trait]
pub trait Started: Send {
    async fn run(self: Box<Self>, out: EventSink) -> Outcome;
}

/// What an engine reused for one sequence's prompt, and where it keeps it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheHit {
    /// Prompt tokens reused from the engine's cache.
    pub cached_tokens: u32,
    /// The engine's sequence slot holding the prompt now, when the engine
    /// has fixed slots (their contents are then known exactly).
    pub slot: Option<u32>,
}

/// The gateway went away: stop generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The sending half of a Generate stream. Every await on it also watches for
/// the gateway dropping the stream, so generation stops at once.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Result<pb::GenerateEvent, Status>>,
    /// Tokens this generation produced here, sent or still held (a batched
    /// reply's output waits up to a second): what `Cancel` reports.
    generated: Arc<AtomicU32>,
}

impl EventSink {
    pub fn new(tx: mpsc::Sender<Result<pb::GenerateEvent, Status>>) -> Self {
        Self {
            tx,
            generated: Arc::default(),
        }
    }

    /// The engine produced `tokens` more output tokens.
    pub fn generated(&self, tokens: u32) {
        self.generated.fetch_add(tokens, Ordering::Relaxed);
    }

    /// The engine has produced `total` output tokens in all (an engine
    /// server that reports a running count).
    pub fn generated_at_least(&self, total: u32) {
        self.generated.fetch_max(total, Ordering::Relaxed);
    }

    /// The count of tokens produced, shared with whoever cancels the
    /// generation.
    pub fn generated_count(&self) -> Arc<AtomicU32> {
        Arc::clone(&self.generated)
    }

    pub async fn send(&self, event: pb::generate_event::Event) -> Result<(), Cancelled> {
        self.send_counted(event, 0).await
    }

    /// Sends an output event that accounts for `output_tokens` generated
    /// tokens (0: not counted here).
    pub async fn send_counted(
        &self,
        event: pb::generate_event::Event,
        output_tokens: u32,
    ) -> Result<(), Cancelled> {
        self.tx
            .send(Ok(pb::GenerateEvent {
                event: Some(event),
                output_tokens,
            }))
            .await
            .map_err(|_| Cancelled)
    }

    /// Ends the stream with an error status.
    pub async fn fail(&self, status: Status) -> Result<(), Cancelled> {
        self.tx.send(Err(status)).await.map_err(|_| Cancelled)
    }

    /// Ends a generation that produced `tokens` with its `Finished` event:
    /// completed, unless the gateway had already left.
    pub async fn finish(&self, finished: pb::Finished, tokens: u32) -> Outcome {
        match self
            .send(pb::generate_event::Event::Finished(finished))
            .await
        {
            Ok(()) => Outcome::Completed { tokens },
            Err(Cancelled) => Outcome::Cancelled { tokens },
        }
    }

    /// Ends a generation that produced `tokens` with an error status:
    /// failed, unless the gateway had already left.
    pub async fn finish_failed(&self, status: Status, tokens: u32) -> Outcome {
        tracing::warn!(error = %status.message(), "generation failed");
        match self.fail(status).await {
            Ok(()) => Outcome::Failed { tokens },
            Err(Cancelled) => Outcome::Cancelled { tokens },
        }
    }

    /// Sleeps, unless the stream is dropped first.
    pub async fn sleep(&self, d: Duration) -> Result<(), Cancelled> {
        if d.is_zero() {
            return if self.tx.is_closed() {
                Err(Cancelled)
            } else {
                Ok(())
            };
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = self.tx.closed() => Err(Cancelled),
        }
    }

    /// Sleeps until an instant, unless the stream is dropped first.
    pub async fn sleep_until(&self, at: tokio::time::Instant) -> Result<(), Cancelled> {
        tokio::select! {
            _ = tokio::time::sleep_until(at) => Ok(()),
            _ = self.tx.closed() => Err(Cancelled),
        }
    }

    /// Resolves when the gateway drops the stream.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}
