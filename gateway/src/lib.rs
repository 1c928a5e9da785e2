//! The inference gateway: a Pingora edge in front of per-model gRPC worker
//! pools. See ARCHITECTURE.md for the request path and the code map.

pub mod accounts;
pub mod api;
pub mod app;
pub mod auth;
pub mod catalog;
pub mod config;
pub mod error;
pub mod generation;
pub mod http;
pub mod idempotency;
pub mod ids;
pub mod lifecycle;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod operator;
pub mod output_check;
pub mod parse;
pub mod planner_mode;
pub mod pool;
pub mod redis;
pub mod responses;
pub mod routes;
pub mod runs;
pub mod schema_cache;
pub mod server;
pub mod sse;
pub mod store;
pub mod tls;
pub mod translate;
pub mod usage;
pub mod validate;

/// The unit tests (and the benchmarks among them) run on the allocator the
/// `gateway` binary ships with, so their figures are the product's.
#[cfg(test)]
#[global_allocator]
static TEST_ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
