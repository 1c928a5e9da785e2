//! The upstream engine end to end, what only it does (its load report
//! follows the engine's own, its health is the engine's): the real gateway →
//! a worker with `--engine upstream` → llama.cpp's own `llama-server` on the
//! SmolLM2 GGUF (built once by `scripts/llama-server.sh`, cached under
//! target/). What every engine must do the same is in
//! `engine_conformance.rs`. SmolLM2 is weak: asserts are on structure, not on
//! what it knows.

use harness::chat;
use harness::model::model_file;
use harness::{wait_until, LlamaServer, Stack, WorkerOpts};
use std::time::Duration;

const N_CTX: u32 = 1024;

/// llama-server with `parallel` slots, and a gateway + upstream worker in
/// front of it. The server is returned first: drop order is the stack,
/// then the engine.
async fn upstream_stack(parallel: u32, max_concurrency: Option<u32>) -> (Stack, LlamaServer) {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    let server = LlamaServer::start(&file, N_CTX, parallel)
        .await
        .expect("llama-server starts (scripts/llama-server.sh)");
    let mut opts = WorkerOpts::upstream(server.url(), "llama-server");
    opts.max_concurrency = max_concurrency;
    (Stack::single(opts), server)
}

/// Eight streams on a two-slot engine: two run, six wait inside the
/// engine, and the worker reports exactly the engine's counts.
#[tokio::test]
async fn the_reported_load_follows_the_engine_under_eight_streams() {
    let (stack, server) = upstream_stack(2, Some(16)).await;
    let worker = stack.worker("base");
    // Opened at once: a request the engine defers has no first token (and
    // no response head) until a slot frees.
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..8 {
        let client = stack.client();
        streams.spawn(async move {
            let body = chat::long_story(
                &format!("Tell me a very long story about dragon number {i}."),
                i,
            );
            let mut stream = client.stream("/chat/completions", &body).await?;
            while stream.next_frame().await?.is_some() {}
            anyhow::Ok(())
        });
    }
    // Some stories may end early (the model may stop before 800 tokens),
    // so the check is not a fixed count: at a moment when the engine holds
    // both slots and defers at least one request, the worker reports
    // exactly the engine's own counts.
    wait_until(
        "the worker to report the engine's queue",
        Duration::from_secs(30),
        || async {
            let Ok((running, waiting)) = server.running_and_waiting().await else {
                return false;
            };
            if running != 2 || waiting == 0 {
                return false;
            }
            let load = worker.load().await.unwrap_or_default();
            (load.running, load.queued, load.capacity) == (2, waiting, 2)
        },
    )
    .await;
    streams.abort_all();
    wait_until("the engine to drain", Duration::from_secs(10), || async {
        server.running_and_waiting().await.ok() == Some((0, 0))
    })
    .await;
    wait_until(
        "the worker's load to follow",
        Duration::from_secs(5),
        || async {
            let load = worker.load().await.unwrap_or_default();
            (load.running, load.queued) == (0, 0)
        },
    )
    .await;
}

/// The engine's health is the worker's: an engine that goes away takes the
/// worker out of service (grpc.health.v1 NOT_SERVING, what the gateway and
/// the kubelet probe), and a request fails fast instead of hanging.
#[tokio::test]
async fn a_dead_engine_makes_the_worker_not_serving() {
    let (stack, server) = upstream_stack(1, None).await;
    let worker = stack.worker("base");
    let channel = tonic::transport::Endpoint::from_shared(worker.grpc_url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = |service: &str| {
        let mut health = health.clone();
        let service = service.to_owned();
        async move {
            health
                .check(tonic_health::pb::HealthCheckRequest { service })
                .await
                .map(|r| r.into_inner().status)
                .unwrap_or(-1)
        }
    };
    const SERVING: i32 = 1;
    const NOT_SERVING: i32 = 2;
    assert_eq!(status("inference.v1.Worker").await, SERVING);
    drop(server);
    wait_until(
        "the worker to follow the engine down",
        Duration::from_secs(5),
        || async { status("inference.v1.Worker").await == NOT_SERVING },
    )
    .await;
    assert_eq!(status("").await, NOT_SERVING);
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat::greedy("Hi", 4))
        .await
        .expect("reply");
    assert!(reply.status >= 500, "{reply}");
}
