//! The end-to-end harness: starts the real `gateway` and `worker` binaries on
//! free loopback ports and talks to them the way clients do.
//!
//! Every end-to-end test file (`tests/tests/*.rs`) builds on this small API:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use harness::{Stack, json};
//! let stack = Stack::start()?; // one zero-delay synthetic worker per model + a gateway
//! let reply = stack
//!     .client()
//!     .post_json("/chat/completions", &json!({"model": "base", "messages": [{"role": "user", "content": "hi"}]}))
//!     .await?;
//! assert_eq!(reply.status, 200);
//! let info = stack.worker("base").info().await?; // the worker's own counters, over gRPC
//! assert_eq!(info.counters.unwrap_or_default().completed, 1);
//! # Ok(()) }
//! ```
//!
//! - [`Stack`] / [`StackBuilder`]: workers per model, gateway options, Redis;
//!   [`Stack::single`] (one `base` worker) and [`Stack::gateway_only`] for
//!   the common shapes.
//! - [`Worker`] / [`WorkerOpts`]: one `worker serve` process (latency flags, kill,
//!   SIGTERM, restart on the same port, gRPC `Info`).
//! - [`Gateway`] / [`GatewayOpts`]: one `gateway serve` process with a generated
//!   TOML config; [`GatewayOpts::extra_toml`] lets a feature add its own config
//!   without changing the harness.
//! - [`Client`]: reqwest with the key set; [`Reply`] for plain answers,
//!   [`SseStream`] for event streams, [`raw`] for byte-level HTTP/1.1.
//! - [`chat`], [`responses`]: the two generation APIs as a client uses them
//!   (a reply that must be a 200, a stream's chunks with its framing
//!   checked, waiting for a stored run's status, replaying it);
//!   [`openai`]: the `async-openai` crate's typed client on a stack;
//!   [`anthropic`]: the Messages API's headers, and a stream folded back
//!   into its message.
//! - [`planner`]: planner-mode requests in a session, scripted plans, and
//!   what a reply's `tool_thought` says of each agent.
//! - [`model::model_file`]: the real model (SmolLM2 GGUF) for `llama` workers.
//! - [`llama_server::LlamaServer`]: llama.cpp's own server on that model, the
//!   real engine behind `upstream` workers.
//! - [`certs::TestCa`]: a CA made at run time issuing server and client
//!   certificates (PEM files) for TLS tests.
//! - [`RedisScope`]: a random key prefix on the test Redis, cleaned on drop.
//! - [`RedisServer`] / [`RedisCluster`]: private `redis-server`s (TLS only, or
//!   a Redis Cluster of N primaries), killed on drop.
//! - [`fake_engine::FakeEngine`]: a misbehaving OpenAI-compatible engine
//!   (stalls, ignores `max_tokens`, endless lines) behind `upstream` workers.
//! - [`FaultProxy`]: a TCP proxy that adds latency, caps bandwidth, stalls,
//!   partitions, drops or refuses, put between the gateway and Redis or a
//!   worker.
//! - [`file_server::FileServer`]: a loopback HTTP file server with `Range`,
//!   request recording and mid-body cuts, standing in for object stores and
//!   the Hugging Face Hub in the weights fetcher's tests.
//! - [`procfs`]: CPU time and memory of a child from `/proc`; [`idle`]: idle
//!   streams and WebSockets held open, and what each costs the gateway.
//! - [`a2a_agents::TestAgent`]: hand-written A2A agents on loopback that
//!   answer, stall, refuse or break, for planner tests.
//!
//! The harness never runs cargo: the test command builds the binaries once
//! (`cargo build --release --workspace --bins`) and the harness finds them in
//! the target directory ([`bins`]). Children are killed when their handle is
//! dropped, and by the kernel if the test process dies (`PR_SET_PDEATHSIG`).
//! Their stdout and stderr go to a log file whose tail is printed when a test
//! fails while the process is alive.

pub mod a2a_agents;
pub mod anthropic;
pub mod bins;
pub mod certs;
pub mod chat;
pub mod client;
pub mod fake_engine;
pub mod fault_proxy;
pub mod file_server;
pub mod gateway;
pub mod idle;
pub mod kube_api;
pub mod llama_server;
pub mod model;
pub mod netlab;
pub mod openai;
pub mod planner;
pub mod process;
pub mod procfs;
pub mod prometheus;
pub mod raw;
pub mod redis_scope;
pub mod redis_server;
pub mod replicas;
pub mod responses;
pub mod smg;
pub mod stack;
pub mod steady_engine;
pub mod websocket;
pub mod worker;

pub use client::{
    assert_envelope, assert_error, chat_body, stream_body, Client, Reply, SseFrame, SseStream,
};
pub use fault_proxy::FaultProxy;
pub use gateway::{gateway_over, hash_key, key_on_plan, Gateway, GatewayOpts, TestKey};
pub use llama_server::{LlamaServer, LlamaServerOpts};
pub use redis_scope::RedisScope;
pub use redis_server::{PersistentRedis, RedisCluster, RedisServer};
pub use serde_json::{json, Value};
pub use stack::{Stack, StackBuilder, MODELS};
pub use worker::{start_workers, Worker, WorkerOpts};

/// Fails the test if `test` takes longer than `secs`: a hung fault test
/// fails with a message instead of stalling CI.
pub async fn bounded<T>(secs: u64, test: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(std::time::Duration::from_secs(secs), test).await {
        Ok(v) => v,
        Err(_) => panic!("test exceeded its {secs} s bound"),
    }
}

/// Polls `check` every 20 ms until it holds; fails the test naming `what`
/// if it does not within `within`.
pub async fn wait_until<F, Fut>(what: &str, within: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A random lowercase hex string of `n` characters, for key prefixes and keys.
pub fn random_hex(n: usize) -> String {
    let mut s = String::with_capacity(n + 16);
    while s.len() < n {
        s.push_str(&format!("{:016x}", rand::random::<u64>()));
    }
    s.truncate(n);
    s
}
