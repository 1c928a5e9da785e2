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

/// Eight streams on a two-slot engine: five through the gateway (whose
/// queue hands the engine at most its two slots) and three straight at the
/// engine, as another tenant of a shared engine sends them. The engine runs
/// two and defers the rest, and the worker reports exactly the engine's
/// counts, not its own.
#[tokio::test]
async fn the_reported_load_follows_the_engine_under_eight_streams() {
    let (stack, server) = upstream_stack(2, Some(16)).await;
    let worker = stack.worker("base");
    // Opened at once: a request the engine defers has no first token (and
    // no response head) until a slot frees.
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..5 {
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
    let direct = reqwest::Client::new();
    for i in 5..8 {
        let (direct, url) = (
            direct.clone(),
            format!("{}/v1/chat/completions", server.url()),
        );
        streams.spawn(async move {
            let body = chat::long_story(
                &format!("Tell me a very long story about dragon number {i}."),
                i,
            );
            let mut reply = direct.post(url).json(&body).send().await?;
            while reply.chunk().await?.is_some() {}
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

/// The worker names llama-server's slot for each request (`id_slot`): a
/// prompt goes back to the slot holding its prefix, a stranger takes the
/// slot used longest ago (not the one of the prefix in use), and the
/// worker's cache report says exactly what the two slots hold. (An evicted
/// prompt may still come back from llama-server's host-memory prompt
/// cache, so eviction is not asserted through `cached_tokens`.)
#[tokio::test]
async fn the_worker_places_prompts_in_llama_server_slots() {
    let (stack, _server) = upstream_stack(2, None).await;
    let ask = |app: &str, question: &str| {
        let system = format!("You are the assistant of the {app}. ").repeat(25);
        serde_json::json!({"model": "base", "max_tokens": 4, "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ]})
    };
    let cached_share = |reply: &serde_json::Value| {
        let usage = &reply["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(prompt > 200, "a long system prompt: {reply}");
        cached as f64 / prompt as f64
    };
    chat::create(&stack, &ask("bakery", "When do you open?")).await;
    chat::create(&stack, &ask("harbour", "Where is pier 4?")).await;
    let bakery = chat::create(&stack, &ask("bakery", "Do you sell rye bread?")).await;
    assert!(cached_share(&bakery) > 0.8, "back to its slot: {bakery}");
    // A stranger takes the harbour's slot (used longest ago), not the
    // bakery's.
    chat::create(&stack, &ask("museum", "Is it open on Monday?")).await;
    let bakery = chat::create(&stack, &ask("bakery", "Any croissants left?")).await;
    assert!(cached_share(&bakery) > 0.8, "still held: {bakery}");
    let report = stack
        .worker("base")
        .prefix_report()
        .await
        .expect("a prefix report");
    assert_eq!(report.source, "exact", "{report:?}");
    assert_eq!((report.capacity, report.used), (2, 2), "{report:?}");
}
