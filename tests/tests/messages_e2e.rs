//! The Anthropic Messages API end to end (`POST /v1/messages`,
//! `/v1/messages/count_tokens`, the Anthropic model list): real gateway,
//! real synthetic workers, over real HTTP and gRPC. Asserted is what an
//! Anthropic client sees: statuses, `error.type`, headers, the events of a
//! stream in order, and usage that matches the count.

use harness::fake_engine::{Behavior, FakeEngine};
use harness::{
    gateway_over, hash_key, json, start_workers, Client, SseFrame, SseStream, Stack, Value,
    WorkerOpts,
};
use reqwest::Method;
use std::time::Duration;

/// A request as an Anthropic SDK sends it: `x-api-key`, `anthropic-version`.
fn anthropic(client: &Client, key: &str, path: &str) -> reqwest::RequestBuilder {
    harness::anthropic::request(client, key, path)
}

fn body(text: &str) -> Value {
    json!({"model": "base", "max_tokens": 256, "messages": [{"role": "user", "content": text}]})
}

async fn create(stack: &Stack, body: &Value) -> harness::client::Reply {
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    client
        .send(anthropic(&client, &key, "/messages?beta=true").json(body))
        .await
        .unwrap()
}

async fn open(stack: &Stack, body: &Value) -> SseStream {
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    let mut body = body.clone();
    body["stream"] = json!(true);
    client
        .open_stream(anthropic(&client, &key, "/messages?beta=true").json(&body))
        .await
        .unwrap()
}

async fn stream(stack: &Stack, body: &Value) -> Vec<SseFrame> {
    let s = open(stack, body).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("text/event-stream"));
    s.collect().await.unwrap()
}

fn names(frames: &[SseFrame]) -> Vec<String> {
    frames.iter().filter_map(|f| f.event.clone()).collect()
}

/// Asserts Anthropic's envelope; returns the message.
fn assert_anthropic_error(reply: &harness::client::Reply, status: u16, ty: &str) -> String {
    assert_eq!(reply.status, status, "{reply}");
    let v = reply.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], ty, "{v}");
    assert!(reply
        .header("request-id")
        .is_some_and(|r| r.starts_with("req_")));
    assert_eq!(v["request_id"].as_str(), reply.header("request-id"));
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The streamed message rebuilt from its events, as the SDKs accumulate it.
fn accumulate(frames: &[SseFrame]) -> Value {
    harness::anthropic::accumulate(frames).unwrap()
}

#[tokio::test]
async fn a_message_has_anthropics_shape_and_usage() {
    let stack = Stack::single(WorkerOpts::default());
    let r = create(&stack, &body("Say hello. synthetic:reply_tokens=9")).await;
    assert_eq!(r.status, 200, "{r}");
    assert!(r
        .header("request-id")
        .is_some_and(|v| v.starts_with("req_")));
    let m = r.json();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"), "{m}");
    assert_eq!(
        (m["type"].as_str(), m["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(m["model"], "base");
    assert_eq!(m["content"].as_array().unwrap().len(), 1, "{m}");
    assert_eq!(m["content"][0]["type"], "text");
    assert!(!m["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(m["stop_reason"], "end_turn");
    assert!(m["stop_sequence"].is_null());
    let u = &m["usage"];
    assert_eq!(u["output_tokens"], 9, "{u}");
    assert!(u["input_tokens"].as_u64().unwrap() > 0, "{u}");
    assert_eq!(
        (
            u["cache_read_input_tokens"].as_u64(),
            u["cache_creation_input_tokens"].as_u64()
        ),
        (Some(0), Some(0))
    );

    // `max_tokens` cuts the reply; one far past the window is clamped.
    let mut b = body("Go on. synthetic:reply_tokens=50");
    b["max_tokens"] = json!(5);
    let m = create(&stack, &b).await.json();
    assert_eq!(
        (
            m["stop_reason"].as_str(),
            m["usage"]["output_tokens"].as_u64()
        ),
        (Some("max_tokens"), Some(5))
    );
    b["max_tokens"] = json!(32000);
    b["system"] =
        json!([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]);
    let r = create(&stack, &b).await;
    assert_eq!(r.status, 200, "Claude Code's 32000 is served: {r}");
    assert_eq!(r.json()["usage"]["output_tokens"], 50);
}

#[tokio::test]
async fn a_stream_has_every_event_in_order() {
    let stack = Stack::single(WorkerOpts::default());
    let frames = stream(&stack, &body("Hi. synthetic:reply_tokens=6")).await;
    let n = names(&frames);
    assert_eq!(
        n[..3],
        ["message_start", "ping", "content_block_start"],
        "{n:?}"
    );
    assert_eq!(
        n[n.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"],
        "{n:?}"
    );
    assert!(
        n[3..n.len() - 3].iter().all(|e| e == "content_block_delta"),
        "{n:?}"
    );
    for f in &frames {
        assert_eq!(
            f.json()["type"].as_str(),
            f.event.as_deref(),
            "data.type is the event name"
        );
    }
    let start = frames[0].json();
    assert!(start["message"]["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(start["message"]["content"], json!([]));
    let m = accumulate(&frames);
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["usage"]["output_tokens"], 6);
    assert!(m["usage"]["input_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn thinking_blocks_come_first_with_a_signature_and_go_back_in_history() {
    let stack = Stack::single(WorkerOpts::default());
    let mut b = body("Think first. synthetic:reply_tokens=5");
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    let m = create(&stack, &b).await.json();
    assert_eq!(m["content"][0]["type"], "thinking", "{m}");
    assert!(!m["content"][0]["thinking"].as_str().unwrap().is_empty());
    let signature = m["content"][0]["signature"].as_str().unwrap().to_owned();
    assert!(signature.starts_with("igw1."));
    assert_eq!(m["content"][1]["type"], "text");

    let frames = stream(&stack, &b).await;
    let deltas: Vec<String> = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("content_block_delta"))
        .map(|f| f.json()["delta"]["type"].as_str().unwrap().to_owned())
        .collect();
    let first_text = deltas.iter().position(|d| d == "text_delta").unwrap();
    assert_eq!(deltas[first_text - 1], "signature_delta", "{deltas:?}");
    assert!(deltas[..first_text - 1]
        .iter()
        .all(|d| d == "thinking_delta"));
    let streamed = accumulate(&frames);
    assert_eq!(
        streamed["content"][0]["signature"],
        json!(signature),
        "same reply, same signature"
    );

    // The block goes back as the earlier turn's reasoning (the signature is
    // not checked: an altered one is still served).
    let mut next = b.clone();
    let mut turn = m["content"].clone();
    turn[0]["signature"] = json!("anything");
    next["messages"] = json!([
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": turn},
        {"role": "user", "content": "And again. synthetic:reply_tokens=3"},
    ]);
    assert_eq!(create(&stack, &next).await.status, 200);
    // Claude Code's adaptive thinking with its text omitted.
    b["thinking"] = json!({"type": "adaptive", "display": "omitted"});
    let m = create(&stack, &b).await.json();
    assert_eq!(m["content"][0]["thinking"], "", "{m}");
    assert!(m["content"][0]["signature"]
        .as_str()
        .unwrap()
        .starts_with("igw1."));
}

fn weather_tools(mut b: Value) -> Value {
    b["tools"] = json!([{
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }]);
    b
}

#[tokio::test]
async fn a_tool_round_trip_streamed_and_not() {
    let stack = Stack::single(WorkerOpts::default());
    let b = weather_tools(body("What is the weather in Paris? Use get_weather."));
    let m = create(&stack, &b).await.json();
    assert_eq!(m["stop_reason"], "tool_use", "{m}");
    let call = m["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap()
        .clone();
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"), "{call}");
    assert_eq!(call["name"], "get_weather");
    assert!(
        call["input"]["city"].is_string(),
        "input satisfies the schema: {call}"
    );

    let streamed = accumulate(&stream(&stack, &b).await);
    assert_eq!(streamed["stop_reason"], "tool_use");
    let s_call = streamed["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "tool_use")
        .unwrap();
    assert!(s_call["input"]["city"].is_string(), "{streamed}");

    // The result goes back; the model answers in text.
    let mut next = b.clone();
    next["messages"] = json!([
        {"role": "user", "content": "What is the weather in Paris? Use get_weather."},
        {"role": "assistant", "content": m["content"]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny, 21 C"}]},
    ]);
    let m = create(&stack, &next).await.json();
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    assert_eq!(m["content"][0]["type"], "text");
    let streamed = accumulate(&stream(&stack, &next).await);
    assert_eq!(streamed["stop_reason"], "end_turn");

    // `tool_choice: any` forces a call even unmentioned.
    let mut forced = weather_tools(body("Hello there."));
    forced["tool_choice"] = json!({"type": "any"});
    assert_eq!(
        create(&stack, &forced).await.json()["stop_reason"],
        "tool_use"
    );
}

#[tokio::test]
async fn count_tokens_is_the_prompt_a_message_is_billed_for() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    let mut b = weather_tools(body("Count me, then answer. synthetic:reply_tokens=3"));
    b["system"] = json!("You are terse.");
    b["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let mut counted_body = b.clone();
    counted_body.as_object_mut().unwrap().remove("max_tokens");
    let counted = client
        .send(anthropic(&client, &key, "/messages/count_tokens?beta=true").json(&counted_body))
        .await
        .unwrap();
    assert_eq!(counted.status, 200, "{counted}");
    let counted = counted.json()["input_tokens"].as_u64().unwrap();
    for _ in 0..2 {
        // The second run reads the prompt from the engine's cache: billed
        // the same, split differently.
        let m = create(&stack, &b).await.json();
        let u = &m["usage"];
        let billed = u["input_tokens"].as_u64().unwrap()
            + u["cache_read_input_tokens"].as_u64().unwrap()
            + u["cache_creation_input_tokens"].as_u64().unwrap();
        assert_eq!(billed, counted, "{u}");
    }
}

#[tokio::test]
async fn errors_have_anthropics_statuses_and_types() {
    let reader = harness::TestKey::random("org-test");
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml(&format!(
            "[[keys]]\nsha256 = \"{}\"\norg = \"org-test\"\nname = \"reader\"\nscopes = [\"models.read\"]\n",
            hash_key(&reader.key)
        ))
        .start()
        .unwrap();
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    let send = |key: String, path: &'static str, b: Value| {
        let client = client.clone();
        async move {
            client
                .send(anthropic(&client, &key, path).json(&b))
                .await
                .unwrap()
        }
    };
    let mut no_max = body("hi");
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let msg = assert_anthropic_error(
        &send(key.clone(), "/messages", no_max).await,
        400,
        "invalid_request_error",
    );
    assert!(msg.starts_with("max_tokens:"), "{msg}");
    let mut unknown = body("hi");
    unknown["bogus"] = json!(1);
    let msg = assert_anthropic_error(
        &send(key.clone(), "/messages", unknown).await,
        400,
        "invalid_request_error",
    );
    assert!(msg.contains("bogus"), "{msg}");
    let mut server_tool = body("hi");
    server_tool["tools"] =
        json!([{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}]);
    let msg = assert_anthropic_error(
        &send(key.clone(), "/messages", server_tool).await,
        400,
        "invalid_request_error",
    );
    assert!(msg.starts_with("tools.0.type:"), "{msg}");
    assert_anthropic_error(
        &send("sk-wrong".into(), "/messages", body("hi")).await,
        401,
        "authentication_error",
    );
    assert_anthropic_error(
        &send(reader.key.clone(), "/messages", body("hi")).await,
        403,
        "permission_error",
    );
    assert_anthropic_error(
        &send(reader.key.clone(), "/messages/count_tokens", body("hi")).await,
        403,
        "permission_error",
    );
    let mut unknown_model = body("hi");
    unknown_model["model"] = json!("claude-opus-9");
    assert_anthropic_error(
        &send(key.clone(), "/messages", unknown_model).await,
        404,
        "not_found_error",
    );
    // A model with no workers here: the chat route's 503 server_overloaded.
    let mut idle = body("hi");
    idle["model"] = json!("base-mini");
    let r = send(key.clone(), "/messages", idle).await;
    assert_anthropic_error(&r, 529, "overloaded_error");
    assert!(r.header("retry-after").is_some());
    // Bearer works as well as x-api-key.
    let r = stack
        .client()
        .post_json("/messages", &body("hi synthetic:reply_tokens=2"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    // A key on the other routes keeps the other envelope.
    let r = stack
        .client()
        .post_json("/chat/completions", &json!({"model": "base"}))
        .await
        .unwrap();
    assert_eq!(r.json()["error"]["code"], "missing_required_parameter");
    // An error after the stream started is an `error` event.
    let mut failing = body("Go. synthetic:reply_tokens=20 synthetic:fail_after=3");
    failing["stream"] = json!(true);
    let frames = stream(&stack, &failing).await;
    let last = frames.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("error"), "{:?}", names(&frames));
    assert_eq!(last.json()["error"]["type"], "api_error");
    assert!(!names(&frames).contains(&"message_stop".to_owned()));
}

#[tokio::test]
async fn a_rate_limited_key_gets_429_rate_limit_error_with_retry_after() {
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml("[plans.default]\nrpm = 1\n")
        .start()
        .unwrap();
    assert_eq!(
        create(&stack, &body("one synthetic:reply_tokens=1"))
            .await
            .status,
        200
    );
    let r = create(&stack, &body("two synthetic:reply_tokens=1")).await;
    assert_anthropic_error(&r, 429, "rate_limit_error");
    assert!(
        r.header("retry-after")
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| s >= 1),
        "{r}"
    );
}

#[tokio::test]
async fn the_model_list_answers_an_anthropic_client_in_its_shape() {
    let stack = Stack::gateway_only();
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    let rb = client
        .with_key(None)
        .request(Method::GET, "/models?limit=1000")
        .header("x-api-key", &key)
        .header("anthropic-version", "2023-06-01");
    let r = client.send(rb).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    assert!(!data.is_empty());
    for m in data {
        assert_eq!(m["type"], "model");
        assert!(
            m["display_name"].is_string() && m["created_at"].is_string(),
            "{m}"
        );
        assert!(m["max_input_tokens"].as_u64().unwrap() >= 8192, "{m}");
    }
    assert_eq!(v["has_more"], false);
    assert_eq!(v["first_id"], data[0]["id"]);
    assert_eq!(v["last_id"], data[data.len() - 1]["id"]);
    // Without the header: the OpenAI list, as before.
    assert_eq!(
        client.get("/models").await.unwrap().json()["object"],
        "list"
    );
}

#[tokio::test]
async fn a_client_that_leaves_cancels_the_generation() {
    let stack = Stack::single(WorkerOpts::paced(0, 100));
    let mut s = open(&stack, &body("Go on. synthetic:reply_tokens=2000")).await;
    assert_eq!(s.status, 200);
    for _ in 0..4 {
        s.next_frame().await.unwrap().expect("a frame");
    }
    drop(s);
    let worker = stack.worker("base");
    let after = worker
        .wait_counters(Duration::from_secs(3), |c| c.cancelled >= 1)
        .await
        .unwrap();
    assert_eq!((after.cancelled, after.completed), (1, 0), "{after:?}");
    assert!(after.tokens_generated < 1000, "{after:?}");
}

/// The relay's keep-alive: a `ping` in each 5 s silence of the worker,
/// between whole events (the synthetic worker's 11 s between tokens, on
/// its step grid, is a silence of 11 to 22 s), and none while the worker
/// keeps talking.
#[tokio::test]
async fn a_quiet_worker_gets_pings() {
    let stack = Stack::single(WorkerOpts::default());
    let mut s = open(
        &stack,
        &body("Slowly. synthetic:reply_tokens=2 synthetic:slow_ms=11000"),
    )
    .await;
    assert_eq!(s.status, 200);
    let mut timed = Vec::new();
    while let Some(f) = s.next_frame().await.unwrap() {
        timed.push((std::time::Instant::now(), f));
    }
    let n: Vec<&str> = timed
        .iter()
        .filter_map(|(_, f)| f.event.as_deref())
        .collect();
    let deltas: Vec<usize> = (0..timed.len())
        .filter(|&i| timed[i].1.event.as_deref() == Some("content_block_delta"))
        .collect();
    let (first, next) = (deltas[0], deltas[1]);
    let pings = &timed[first + 1..next];
    assert!(pings.len() >= 2, "a ping in each 5 s of the silence: {n:?}");
    // Each 5 s after the frame before it; the next token within 5 s of the
    // last ping.
    for i in first + 1..=next {
        let gap = timed[i].0 - timed[i - 1].0;
        if i < next {
            assert_eq!(timed[i].1.json(), json!({"type": "ping"}));
            assert!(
                gap > Duration::from_millis(4500) && gap < Duration::from_millis(5800),
                "ping {i} after {gap:?}: {n:?}"
            );
        } else {
            assert!(gap < Duration::from_millis(5500), "{gap:?}: {n:?}");
        }
    }
    let frames: Vec<SseFrame> = timed.into_iter().map(|(_, f)| f).collect();
    assert_eq!(accumulate(&frames)["usage"]["output_tokens"], 2);

    // A worker that never pauses for 5 s: only the opening ping.
    let frames = stream(&stack, &body("Fast. synthetic:reply_tokens=20")).await;
    let pings = names(&frames).iter().filter(|e| *e == "ping").count();
    assert_eq!(pings, 1, "{:?}", names(&frames));
}

/// A reply that a stop sequence ended says so, and which one, whole and
/// streamed; one that ended by itself names none.
#[tokio::test]
async fn a_stop_sequence_is_named_in_the_reply() {
    let stack = Stack::single(WorkerOpts::default());
    let mut b = body("alpha beta HALT gamma delta synthetic:echo");
    b["stop_sequences"] = json!(["NEVER", "HALT"]);
    let m = create(&stack, &b).await.json();
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("HALT")),
        "{m}"
    );
    assert_eq!(m["content"][0]["text"], "alpha beta ", "{m}");

    let frames = stream(&stack, &b).await;
    let delta = frames
        .iter()
        .find(|f| f.event.as_deref() == Some("message_delta"))
        .expect("message_delta")
        .json();
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(delta["delta"]["stop_sequence"], "HALT", "{delta}");
    assert_eq!(accumulate(&frames)["content"][0]["text"], "alpha beta ");

    // Not reached: the reply ends on its own, `stop_sequence` null.
    b["stop_sequences"] = json!(["NEVER"]);
    let m = create(&stack, &b).await.json();
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    assert!(m["stop_sequence"].is_null(), "{m}");
    let m = accumulate(&stream(&stack, &b).await);
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    assert!(m["stop_sequence"].is_null(), "{m}");
}

/// `top_k` reaches the engine (an upstream vLLM here: the worker sends it
/// on), and the stop string the engine says ended the reply comes back as
/// `stop_sequence`.
#[tokio::test]
async fn top_k_and_the_stop_sequence_travel_through_an_upstream_engine() {
    let engine = FakeEngine::start(Behavior::Normal).expect("fake engine");
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::upstream(&engine.url(), "vllm"))
        .start()
        .expect("stack starts");
    let mut b = body("Hi.");
    b["top_k"] = json!(7);
    b["stop_sequences"] = json!(["tok2"]);
    let r = create(&stack, &b).await;
    assert_eq!(r.status, 200, "{r}");
    let sent = engine
        .last_streamed_request()
        .expect("the engine got a request");
    assert_eq!(sent["top_k"], 7, "{sent}");
    assert_eq!(sent["stop"], json!(["tok2"]), "{sent}");
    let m = r.json();
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some("tok2")),
        "{m}"
    );
    assert_eq!(m["content"][0]["text"], "tok0 tok1 ", "{m}");

    // Without it (or with 0, no cut) the engine gets none.
    b["top_k"] = json!(0);
    assert_eq!(create(&stack, &b).await.status, 200);
    let sent = engine.last_streamed_request().expect("a request");
    assert!(sent.get("top_k").is_none(), "{sent}");
}

#[tokio::test]
async fn a_stream_goes_on_when_its_worker_is_killed() {
    let mut workers = start_workers(
        "base",
        &[WorkerOpts::paced(0, 100), WorkerOpts::paced(0, 100)],
    );
    let gateway = gateway_over(
        &workers.iter().collect::<Vec<_>>(),
        "[models.base]\npolicy = \"least_loaded\"\n",
    );
    let key = gateway.api_key().to_owned();
    let client = gateway.client();
    let mut b = body("A long story. synthetic:reply_tokens=300");
    b["max_tokens"] = json!(1000);
    b["stream"] = json!(true);
    let s = client
        .open_stream(anthropic(&client, &key, "/messages").json(&b))
        .await
        .unwrap();
    assert_eq!(s.status, 200);
    let reading = tokio::spawn(s.collect());
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut victim = 0;
    for (i, w) in workers.iter().enumerate() {
        if w.counters().await.map(|c| c.started).unwrap_or(0) > 0 {
            victim = i;
        }
    }
    workers[victim].kill();
    let frames = reading.await.unwrap().unwrap();
    let n = names(&frames);
    assert!(!n.contains(&"error".to_owned()), "{n:?}");
    assert_eq!(n.last().map(String::as_str), Some("message_stop"));
    let m = accumulate(&frames);
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["usage"]["output_tokens"], 300, "one generation: {m}");
    assert_eq!(
        m["content"].as_array().unwrap().len(),
        1,
        "one text block: {m}"
    );
}

#[tokio::test]
async fn an_idempotency_key_replays_the_first_reply() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_owned();
    let client = stack.client();
    let b = body("Once. synthetic:reply_tokens=4");
    let send = |b: Value| {
        let client = client.clone();
        let key = key.clone();
        async move {
            client
                .send(
                    anthropic(&client, &key, "/messages")
                        .header("Idempotency-Key", "k-1")
                        .json(&b),
                )
                .await
                .unwrap()
        }
    };
    let first = send(b.clone()).await;
    let again = send(b.clone()).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(first.json(), again.json());
    let mut other = b.clone();
    other["max_tokens"] = json!(9);
    assert_anthropic_error(&send(other).await, 422, "invalid_request_error");
    assert_eq!(stack.worker("base").counters().await.unwrap().started, 1);
}

/// Claude Code's `max_tokens: 32000` on a model whose workers have a
/// smaller window than the catalogue's: clamped to what the workers'
/// window leaves, not refused as over the window.
#[tokio::test]
async fn max_tokens_is_clamped_to_the_workers_window() {
    let stack = Stack::single(WorkerOpts {
        context_window: Some(4096),
        ..WorkerOpts::default()
    });
    // The window is known from the worker's Info, read by the health loop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut b = body("Hi. synthetic:reply_tokens=5");
    b["max_tokens"] = json!(32000);
    let r = create(&stack, &b).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["usage"]["output_tokens"], 5);
    // Below the window the bound holds as asked.
    b["max_tokens"] = json!(3);
    assert_eq!(create(&stack, &b).await.json()["stop_reason"], "max_tokens");
}
