//! The engine seams. Three kinds:
//!
//! - [`sequence::SequenceEngine`] (real models, e.g. [`llama`]): tokens in,
//!   tokens out; the shared [`crate::pipeline`] does the rest. A new engine
//!   is one file implementing it.
//! - [`chat::ChatEngine`] (an engine server in front of its own model, e.g.
//!   [`upstream`]): messages in, events out; the engine templates,
//!   tokenizes and parses.
//! - [`Engine`] below, the whole-reply seam kept by the SIMULATED
//!   [`synthetic`] engine (its plans and test controls are whole replies).
//!
//! The whole-reply seam: a prepared request in, a stream of `GenerateEvent`s out.
//!
//! The service does everything engine-independent (tokenizing, the context
//! check, admission, the prefix cache, counters); an engine only decides what
//! to say and when. `prepare` runs before the stream opens, so a request the
//! engine cannot serve fails with a plain status; `run` then streams.

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

use crate::model::ModelProfile;
use crate::tokenizer::Prompt;
use inference_proto::v1 as pb;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Status;

/// Everything an engine needs for one generation.
#[derive(Debug)]
pub struct Job {
    pub request: pb::GenerateRequest,
    pub prompt: Prompt,
    pub cached_prompt_tokens: u32,
    /// Completion tokens allowed (reasoning included): `max_tokens`, or the
    /// rest of the context window when it is 0.
    pub completion_limit: u32,
    pub model: ModelProfile,
}

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

/// A model engine.
pub trait Engine: Send + Sync + 'static {
    /// Plans a generation, or refuses the request before the stream opens.
    fn prepare(&self, job: Job) -> Result<Box<dyn Generation>, Status>;
}

/// One planned generation, ready to stream.
#[async_trait::async_trait]
pub trait Generation: Send {
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
