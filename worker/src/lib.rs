//! A model worker: one model behind the `inference.v1` gRPC protocol.
//!
//! Request path: [`service`] (draining check, tokenize with [`tokenizer`],
//! context-window check, [`admission`], [`prefix_cache`]) hands a prepared
//! job to an [`engine`], whose events stream back to the gateway. [`drain`]
//! owns graceful shutdown; [`counters`] the totals that `Info` reports and
//! [`metrics`] serves to Prometheus.
//!
//! Engines: `synthetic` (SIMULATED output for tests, benchmarks and load,
//! not a language model; a whole-reply engine) and `llama` (llama.cpp in
//! process on a GGUF model; a sequence-level engine whose tokens go through
//! the shared [`pipeline`]).

pub mod admission;
pub mod auth;
pub mod counters;
pub mod drain;
pub mod engine;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod prefix_cache;
pub mod service;
pub mod status;
pub mod tls;
pub mod tokenizer;
pub mod weights;
