//! A model worker: one model behind the `inference.v1` gRPC protocol.
//!
//! Request path, the same for every engine: [`service`] refuses while
//! draining, has the engine count the prompt with its own tokenizer, fits
//! it in the engine's window ([`pipeline::fit_window`]), waits for
//! [`admission`], then starts the engine's generation on a task of its own
//! and streams its events back to the gateway. [`drain`] owns graceful
//! shutdown; [`counters`] the totals that `Info` reports and [`metrics`]
//! serves to Prometheus; [`cache_report`] what the engine holds in its
//! prefix cache, which `Info` reports for the gateway's cache-aware routing.
//!
//! Layers, one way: [`service`] → [`engine`] → [`pipeline`] → [`seam`]. The
//! seam holds what all of them share: the engine traits, the event sink a
//! generation writes into, and how a generation ended.
//!
//! Engines ([`engine`]): `llama` (llama.cpp in process on a GGUF model; a
//! sequence-level engine whose tokens go through the shared [`pipeline`]),
//! `upstream` (an OpenAI-compatible engine server; message level) and
//! `synthetic` (SIMULATED output for tests, benchmarks and load, not a
//! language model: whole replies planned on o200k tokens, with its own
//! simulated prefix cache, all under `engine/synthetic/`).

pub mod admission;
pub mod auth;
pub mod cache_report;
pub mod counters;
pub mod drain;
pub mod engine;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod seam;
pub mod service;
pub mod status;
pub mod tls;
pub mod weights;
