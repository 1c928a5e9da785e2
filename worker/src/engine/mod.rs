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
//! [`SequenceEngine`]: crate::seam::sequence::SequenceEngine
//! [`ChatEngine`]: crate::seam::chat::ChatEngine
//! [`Started`]: crate::seam::Started
//! [`EventSink`]: crate::seam::EventSink
//! [`Outcome`]: crate::seam::Outcome

#[cfg(feature = "llama")]
pub mod chat_template;
#[cfg(feature = "llama")]
pub mod llama;
pub mod synthetic;
pub mod upstream;
