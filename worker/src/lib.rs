//! A model worker: one model behind the `inference.v1` gRPC protocol.
//!
//! Request path, the same for every engine: [`service`] refuses while
//! draining, has the engine count the prompt with its own tokenizer, fits
//! it in the engine's window ([`pipeline::fit_window`]), waits for
//! [`admission`], then starts the engine's generation on a task of its own
//! and streams its events back to the gateway. [`drain`] owns graceful
//! shutdown; [`counters`] the totals that `Info` reports and [`metrics`]
//! serves to Prometheus; [`cache_report`] what the engine holds in its
//! prefix cache, which `Info` reports for the gateway's cache-aware routing;
//! [`sampling_defaults`] the model's own sampling for requests that set none.
//!
//! Layers, one way: [`service`] → [`engine`] → [`pipeline`] → [`seam`]. The
//! seam holds what all of them share: the engine traits, the event sink a
//! generation writes into, and how a generation ended.
//!
//! Engines ([`engine`]), by seam: sequence level, whose tokens go through
//! the shared [`pipeline`] (render, tokenize, stop strings, the length cut,
//! reasoning split, tool-call parsing, coalescing, usage): `llama`
//! (llama.cpp in process on a GGUF model) and `synthetic` (SIMULATED output
//! for tests, benchmarks and load, not a language model: a scripted
//! sequence engine on o200k tokens that plans each reply from its prompt,
//! with a simulated prefix cache and test controls, all under
//! `engine/synthetic/`); message level: `upstream` (an OpenAI-compatible
//! engine server with its own template and parsers).

pub mod admission;
pub mod auth;
pub mod cache_report;
pub mod counters;
pub mod drain;
pub mod engine;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod running;
pub mod sampling_defaults;
pub mod seam;
pub mod service;
pub mod status;
pub mod tls;
pub mod weights;
