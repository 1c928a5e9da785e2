//! The engines and the seams they implement:
//!
//! - [`sequence::SequenceEngine`] (real models, e.g. [`llama`]): tokens in,
//!   tokens out; the shared [`crate::pipeline`] does the rest. A new engine
//!   is one file implementing it.
//! - [`chat::ChatEngine`] (an engine server in front of its own model, e.g.
//!   [`upstream`]): messages in, events out; the engine templates,
//!   tokenizes and parses.
//! - the SIMULATED [`synthetic`] engine, which plans whole replies (its
//!   test controls are whole replies) on o200k tokens.
//!
//! Whatever the seam, a started generation is a [`Started`]: it streams
//! `GenerateEvent`s into an [`EventSink`] and ends with an [`Outcome`]. The
//! service (`crate::service`) does everything engine-independent
//! (draining, admission, counters) on one path for every engine.

pub mod chat;
#[cfg(feature = "llama")]
pub mod chat_template;
pub mod controls;
#[cfg(feature = "llama")]
pub mod llama;
pub mod rng;
pub mod schema_gen;
pub mod sequence;
pub mod synthetic;
pub mod upstream;

use inference_proto::v1 as pb;
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

/// The gateway went away: stop generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

/// The sending half of a Generate stream. Every await on it also watches for
/// the gateway dropping the stream, so generation stops at once.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Result<pb::GenerateEvent, Status>>,
}

impl EventSink {
    pub fn new(tx: mpsc::Sender<Result<pb::GenerateEvent, Status>>) -> Self {
        Self { tx }
    }

    pub async fn send(&self, event: pb::generate_event::Event) -> Result<(), Cancelled> {
        self.tx
            .send(Ok(pb::GenerateEvent { event: Some(event) }))
            .await
            .map_err(|_| Cancelled)
    }

    /// Ends the stream with an error status.
    pub async fn fail(&self, status: Status) -> Result<(), Cancelled> {
        self.tx.send(Err(status)).await.map_err(|_| Cancelled)
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
