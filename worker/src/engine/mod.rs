//! The engines and the seams they implement:
//!
//! - [`SequenceEngine`] (real models, e.g. [`llama`], and the SIMULATED
//!   [`synthetic`] engine, a scripted one): tokens in, tokens out; the
//!   shared [`crate::pipeline`] does the rest. A new engine is one file
//!   implementing it.
//! - [`ChatEngine`] (an engine server in front of its own model, e.g.
//!   [`upstream`]): messages in, events out; the engine templates,
//!   tokenizes and parses.
//!
//! Whatever the seam, a started generation is a [`Started`]: it streams
//! `GenerateEvent`s into an [`EventSink`] and ends with an [`Outcome`]. The
//! service (`crate::service`) does everything engine-independent
//! (draining, admission, counters) on one path for every engine.
//!
//! The seams themselves live in [`crate::seam`], below both the engines
//! and the [`crate::pipeline`]; engines may use the pipeline's parts (the
//! upstream engine parses tool calls with it), never the other way round.
//!
//! Each engine loads itself from its own flags (`synthetic/args.rs`,
//! `upstream/args.rs`, `llama_args.rs`: a `clap::Args` group and its
//! `load`) into a [`Loaded`]: the engine and the facts the worker's one
//! start path needs of it (its model profile, capacity, whether a cached
//! prefix serves concurrent sequences, ...).
//!
//! [`SequenceEngine`]: crate::seam::sequence::SequenceEngine
//! [`ChatEngine`]: crate::seam::chat::ChatEngine
//! [`Started`]: crate::seam::Started
//! [`EventSink`]: crate::seam::EventSink
//! [`Outcome`]: crate::seam::Outcome

#[cfg(feature = "llama")]
pub mod chat_template;
#[cfg(feature = "llama")]
pub mod llama;
pub mod llama_args;
pub mod llama_gpu;
pub mod synthetic;
pub mod upstream;

use crate::model::ModelProfile;
use crate::sampling_defaults::SamplingDefaults;

/// What every engine is told beside its own flags.
#[derive(Debug, Clone, Copy)]
pub struct Serving<'a> {
    /// The public model id served (`--model`).
    pub model: &'a str,
    /// The operator's window (`--context-window`), if any.
    pub context_window: Option<u32>,
    /// Generations running at once (`--max-concurrency`), for the engines
    /// that do not decide it themselves.
    pub max_concurrency: u32,
}

/// A loaded engine, its name and description, its model profile and
/// capacity: what the worker's start path needs of it.
pub struct Loaded<E> {
    pub engine: E,
    pub name: &'static str,
    pub description: String,
    pub model: ModelProfile,
    pub capacity: u32,
    /// Prompts the engine's cache holds at most (its slots), for the cache
    /// report.
    pub cache_slots: u32,
    /// A held prefix serves concurrent sequences too (see `PrefixCache`).
    pub concurrent_reuse: bool,
    /// Readiness reported by the engine itself (upstream), when it has one.
    pub ready: Option<tokio::sync::watch::Receiver<bool>>,
    /// What the weights file says to sample with (llama's GGUF metadata).
    pub model_sampling: SamplingDefaults,
}

impl<E> Loaded<E> {
    /// The same engine, held as `wrap` makes it (the service's `Engines`).
    pub fn map_engine<F>(self, wrap: impl FnOnce(E) -> F) -> Loaded<F> {
        Loaded {
            engine: wrap(self.engine),
            name: self.name,
            description: self.description,
            model: self.model,
            capacity: self.capacity,
            cache_slots: self.cache_slots,
            concurrent_reuse: self.concurrent_reuse,
            ready: self.ready,
            model_sampling: self.model_sampling,
        }
    }
}
