//! The upstream engine end to end: the real gateway → a worker with
//! `--engine upstream` → llama.cpp's own `llama-server` on the SmolLM2 GGUF
//! (built once by `scripts/llama-server.sh`, cached under target/). SmolLM2
//! is weak: asserts are on structure, not on what it knows.

use harness::model::model_file;
use harness::replies::{chat, content, output_text, post_chat as post};
use harness::{assert_error, json, LlamaServer, Stack, Value, WorkerOpts};
use std::time::{Duration, Instant};

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
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(opts)
        .start()
        .expect("stack starts");
    (stack, server)
}

async fn wait_until<F, Fut>(what: &str, secs: u64, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn chat_streaming_and_not_with_usage_from_the_engine() {
    let (stack, _server) = upstream_stack(2, None).await;
    let info = stack.worker("base").info().await.expect("info");
    assert_eq!(info.engine, "upstream");
    assert_eq!(info.context_window, N_CTX, "the engine's per-slot window");

    let r = post(&stack, &chat("What is 2 + 2?", 24)).await;
    assert!(!content(&r).trim().is_empty(), "{r}");
    let usage = &r["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    assert!(prompt > 5, "{r}");
    let completion = usage["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=24).contains(&completion), "{r}");
    let reason = r["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(reason == "stop" || reason == "length", "{r}");

    // The same prompt again: the engine reports its cache hit.
    // (Not compared as text: reused KV cells change float order.)
    let again = post(&stack, &chat("What is 2 + 2?", 24)).await;
    let cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached > 0 && cached <= prompt, "cached {cached}: {again}");

    // The worker counted the prompt with the engine's tokenizer: the same
    // number the engine reports.
    let counted = stack
        .worker("base")
        .counters()
        .await
        .expect("counters")
        .prompt_tokens;
    assert_eq!(counted, 2 * prompt, "worker count vs engine usage");

    let mut body = chat("Name three colors.", 16);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let frames = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames");
    assert!(frames.last().is_some_and(|f| f.is_done()));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| f.json())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.trim().is_empty(), "{chunks:?}");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"].is_string()));
    let usage = chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or_default();
    assert!(
        usage["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{usage}"
    );
}

#[tokio::test]
async fn max_tokens_gives_length() {
    let (stack, _server) = upstream_stack(1, None).await;
    let r = post(&stack, &chat("Count from 1 to 20, separated by commas.", 5)).await;
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 5, "{r}");
}

#[tokio::test]
async fn json_schema_replies_parse_and_validate() {
    let (stack, _server) = upstream_stack(2, None).await;
    let schema = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "sunny": {"type": "boolean"}
        },
        "required": ["city", "sunny"],
        "additionalProperties": false
    });
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Describe the weather in a city, as JSON."}],
        "max_tokens": 80,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": true}},
    });
    let r = post(&stack, &body).await;
    let text = content(&r);
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    assert!(validator.is_valid(&value), "{value}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
}

/// SmolLM2's own tool parsing on llama-server produces no call; the worker
/// enforces `required` and named choices with a schema of the call.
#[tokio::test]
async fn required_and_named_tool_choices_give_schema_valid_calls() {
    let (stack, _server) = upstream_stack(2, None).await;
    let params = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    });
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": params, "strict": true}},
        {"type": "function", "function": {"name": "get_time", "description": "Local time of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}
    ]);
    let validator = jsonschema::validator_for(&params).expect("schema");
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "get_weather"}}),
    ] {
        let body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": tools,
            "tool_choice": choice,
            // One call: llama-server's grammar lets the model pad JSON with
            // whitespace, and an open array of calls runs to max_tokens.
            "parallel_tool_calls": false,
            "max_tokens": 120,
            "temperature": 0,
        });
        let r = post(&stack, &body).await;
        let c = &r["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{r}");
        let call = &c["message"]["tool_calls"][0];
        assert!(
            call["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("call_")),
            "{r}"
        );
        let name = call["function"]["name"].as_str().unwrap_or_default();
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
                .expect("arguments are JSON");
        if name == "get_weather" {
            assert!(validator.is_valid(&args), "{args}");
        } else {
            assert_eq!(name, "get_time", "{r}");
            assert!(
                choice == "required",
                "a named choice must call get_weather: {r}"
            );
        }
    }

    // Streamed: the call's id and name come once, then argument fragments.
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": false,
        "max_tokens": 120,
        "temperature": 0,
        "stream": true,
    });
    let frames = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames");
    let deltas: Vec<Value> = frames
        .iter()
        .filter(|f| !f.is_done())
        .flat_map(|f| {
            f.json()["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let named = deltas
        .iter()
        .filter(|d| d["function"]["name"].is_string())
        .count();
    assert_eq!(named, 1, "{deltas:?}");
    let args: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    let args: Value = serde_json::from_str(&args).expect("streamed arguments are JSON");
    assert!(validator.is_valid(&args), "{args}");
}

/// The same `context_length_exceeded` as the in-process engine, worded the
/// same, from the engine's own token count, before anything generates.
#[tokio::test]
async fn a_prompt_over_the_engine_window_is_the_same_400_as_in_process() {
    let (stack, server) = upstream_stack(1, None).await;
    let long = chat(&"apple banana cherry ".repeat(400), 16);
    let reply = stack
        .client()
        .post_json("/chat/completions", &long)
        .await
        .expect("reply");
    let upstream_err = assert_error(&reply, 400, "context_length_exceeded");
    let message = upstream_err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("maximum context length is {N_CTX} tokens")),
        "{upstream_err}"
    );
    // Refused before generating: the engine never saw a completion.
    let (running, waiting) = server.running_and_waiting().await.expect("metrics");
    assert_eq!((running, waiting), (0, 0));
    let counters = stack.worker("base").counters().await.expect("counters");
    assert_eq!((counters.started, counters.rejected), (0, 1));

    // Fits alone, not with max_tokens.
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat(&"apple ".repeat(300), 900))
        .await
        .expect("reply");
    let upstream_fits_alone = assert_error(&reply, 400, "context_length_exceeded");

    // The in-process engine on the same model and window.
    let file = model_file().expect("model");
    let local = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::llama(&file, N_CTX, 1))
        .start()
        .expect("llama stack");
    let reply = local
        .client()
        .post_json("/chat/completions", &long)
        .await
        .expect("reply");
    let local_err = assert_error(&reply, 400, "context_length_exceeded");
    for field in ["type", "code", "param", "status"] {
        assert_eq!(upstream_err[field], local_err[field], "{field}");
    }
    let reply = local
        .client()
        .post_json("/chat/completions", &chat(&"apple ".repeat(300), 900))
        .await
        .expect("reply");
    let local_fits_alone = assert_error(&reply, 400, "context_length_exceeded");
    // Worded the same; the counts may differ by the template's default
    // system prompt (llama-server renders the GGUF's Jinja template, the
    // in-process engine llama.cpp's built-in ChatML).
    let opening = |e: &Value| -> String {
        let m = e["message"].as_str().unwrap_or_default();
        m.split("However").next().unwrap_or_default().to_owned()
    };
    assert_eq!(opening(&upstream_fits_alone), opening(&local_fits_alone));
    for e in [&upstream_fits_alone, &local_fits_alone] {
        assert!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("900 in the completion")),
            "{e}"
        );
    }
    eprintln!(
        "upstream: {}\nin-process: {}",
        upstream_fits_alone["message"], local_fits_alone["message"]
    );
}

async fn open_long_stream(stack: &Stack, seed: u32) -> harness::SseStream {
    let mut body = chat(
        &format!("Tell me a very long story about dragon number {seed}."),
        800,
    );
    body["stream"] = json!(true);
    body["temperature"] = json!(0.9);
    body["seed"] = json!(seed);
    stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .expect("stream")
}

/// A client that goes away closes the engine request: llama-server frees
/// the slot (its own processing count drops to 0).
#[tokio::test]
async fn a_dropped_stream_stops_the_engine() {
    let (stack, server) = upstream_stack(2, None).await;
    let mut stream = open_long_stream(&stack, 1).await;
    for _ in 0..3 {
        stream.next_frame().await.expect("frame");
    }
    let (running, _) = server.running_and_waiting().await.expect("metrics");
    assert_eq!(running, 1);
    assert_eq!(server.busy_slots().await.expect("slots"), 1);
    let dropped = Instant::now();
    drop(stream);
    wait_until("the engine's slot to free", 5, || async {
        server.running_and_waiting().await.map(|l| l.0).unwrap_or(1) == 0
    })
    .await;
    let freed = dropped.elapsed();
    assert_eq!(server.busy_slots().await.expect("slots"), 0);
    let worker = stack.worker("base");
    let c = worker
        .wait_counters(Duration::from_secs(5), |c| c.cancelled == 1)
        .await
        .expect("counters");
    assert_eq!(c.cancelled, 1, "{c:?}");
    eprintln!("engine slot freed {freed:?} after the client dropped the stream");
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
            let mut body = chat(
                &format!("Tell me a very long story about dragon number {i}."),
                800,
            );
            body["stream"] = json!(true);
            body["temperature"] = json!(0.9);
            body["seed"] = json!(i);
            let mut stream = client.stream("/chat/completions", &body).await?;
            while stream.next_frame().await?.is_some() {}
            anyhow::Ok(())
        });
    }
    // Some stories may end early (the model may stop before 800 tokens),
    // so the check is not a fixed count: at a moment when the engine holds
    // both slots and defers at least one request, the worker reports
    // exactly the engine's own counts.
    wait_until("the worker to report the engine's queue", 30, || async {
        let Ok((running, waiting)) = server.running_and_waiting().await else {
            return false;
        };
        if running != 2 || waiting == 0 {
            return false;
        }
        let load = worker
            .info()
            .await
            .ok()
            .and_then(|i| i.load)
            .unwrap_or_default();
        (load.running, load.queued, load.capacity) == (2, waiting, 2)
    })
    .await;
    streams.abort_all();
    wait_until("the engine to drain", 10, || async {
        server.running_and_waiting().await.ok() == Some((0, 0))
    })
    .await;
    wait_until("the worker's load to follow", 5, || async {
        let load = worker
            .info()
            .await
            .ok()
            .and_then(|i| i.load)
            .unwrap_or_default();
        (load.running, load.queued) == (0, 0)
    })
    .await;
}

#[tokio::test]
async fn responses_background_replay_and_cancel() {
    let (stack, server) = upstream_stack(2, None).await;
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "Name a color.", "max_output_tokens": 12,
                    "temperature": 0, "background": true}),
        )
        .await
        .expect("create");
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap_or_default().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let v = client
            .get(&format!("/responses/{id}"))
            .await
            .expect("get")
            .json();
        if matches!(v["status"].as_str(), Some("completed" | "incomplete")) {
            break v;
        }
        assert!(Instant::now() < deadline, "still {}", v["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(!output_text(&done).trim().is_empty(), "{done}");
    let frames = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames");
    let events: Vec<String> = frames.iter().filter_map(|f| f.event.clone()).collect();
    assert_eq!(events.first().map(String::as_str), Some("response.created"));
    assert!(events
        .last()
        .is_some_and(|e| e == "response.completed" || e == "response.incomplete"));
    let streamed: String = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("response.output_text.delta"))
        .filter_map(|f| f.json()["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, output_text(&done));

    // Cancelling a background run stops the engine.
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "Tell me a very long story about dragons.",
                    "max_output_tokens": 800, "temperature": 0.9, "background": true}),
        )
        .await
        .expect("create");
    let id = r.json()["id"].as_str().unwrap_or_default().to_owned();
    wait_until("the engine to run it", 10, || async {
        server.running_and_waiting().await.map(|l| l.0).unwrap_or(0) == 1
    })
    .await;
    let r = client
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["status"], "cancelled", "{r}");
    wait_until("the engine to stop", 5, || async {
        server.running_and_waiting().await.map(|l| l.0).unwrap_or(1) == 0
    })
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
    wait_until("the worker to follow the engine down", 5, || async {
        status("inference.v1.Worker").await == NOT_SERVING
    })
    .await;
    assert_eq!(status("").await, NOT_SERVING);
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat("Hi", 4))
        .await
        .expect("reply");
    assert!(reply.status >= 500, "{reply}");
}
