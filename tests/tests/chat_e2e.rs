//! Chat completions end to end: real gateway, real synthetic workers, over
//! real HTTP and gRPC. What is asserted is what a client sees (see
//! `shared/wire-conventions.md`), plus the worker's own counters where the
//! client cannot see the effect (cancellation).

use harness::raw::{self, RawConn};
use harness::{assert_envelope, assert_error, chat, chat_body, json, Stack, Value, WorkerOpts};
use std::time::Duration;

#[tokio::test]
async fn non_streaming_reply_has_the_chat_completion_shape() {
    let stack = Stack::single(WorkerOpts::default());
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat_body("base", "Say hello."))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));
    assert!(reply.header("x-request-id").is_some_and(|v| !v.is_empty()));
    let c = reply.json();
    assert!(
        c["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")),
        "{c}"
    );
    assert_eq!(c["object"], "chat.completion");
    assert!(c["created"].is_u64(), "created is an integer: {c}");
    assert_eq!(c["model"], "base");
    let choices = c["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 1);
    let choice = &choices[0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "stop");
    assert!(
        choice.get("logprobs").is_some_and(Value::is_null),
        "logprobs: null"
    );
    let m = &choice["message"];
    assert_eq!(m["role"], "assistant");
    assert!(m["content"].as_str().is_some_and(|t| !t.is_empty()), "{m}");
    assert!(
        m.get("refusal").is_some_and(Value::is_null),
        "refusal: null"
    );
    assert!(
        m["reasoning_content"].is_null(),
        "no reasoning requested: {m}"
    );
    assert!(
        m["tool_calls"].is_null() || m["tool_calls"] == json!([]),
        "no tool calls: {m}"
    );
    let u = &c["usage"];
    let (p, k, t) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
        u["total_tokens"].as_u64().unwrap(),
    );
    assert!(p > 0 && k > 0, "{u}");
    assert_eq!(t, p + k);
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"], 0,
        "fresh worker: {u}"
    );
    assert_eq!(u["reasoning_tokens"], 0, "{u}");
    assert_eq!(u["completion_tokens_details"]["reasoning_tokens"], 0, "{u}");
    let counters = stack.worker("base").counters().await.unwrap();
    assert_eq!((counters.started, counters.completed), (1, 1));
}

#[tokio::test]
async fn reply_length_follows_the_test_control_and_max_tokens() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let reply = client
        .post_json(
            "/chat/completions",
            &chat_body("base", "Count. synthetic:reply_tokens=7"),
        )
        .await
        .unwrap();
    let c = reply.json();
    assert_eq!(c["usage"]["completion_tokens"], 7, "{reply}");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");

    let mut body = chat_body("base", "Count. synthetic:reply_tokens=50");
    body["max_tokens"] = json!(4);
    let c = client
        .post_json("/chat/completions", &body)
        .await
        .unwrap()
        .json();
    assert_eq!(c["usage"]["completion_tokens"], 4, "{c}");
    assert_eq!(c["choices"][0]["finish_reason"], "length", "{c}");
}

#[tokio::test]
async fn stream_chunks_come_in_the_documented_order() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let mut body = chat_body("base", "Tell a story. synthetic:reply_tokens=20");
    body["seed"] = json!(7);
    let expected = client
        .post_json("/chat/completions", &body)
        .await
        .unwrap()
        .json();

    body["stream"] = json!(true);
    let stream = client.stream("/chat/completions", &body).await.unwrap();
    assert_eq!(stream.status, 200);
    assert!(stream
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    assert!(stream.header("x-request-id").is_some_and(|v| !v.is_empty()));
    let frames = stream.collect().await.unwrap();
    let chunks = chat::chunks(&frames);
    assert!(chunks.len() >= 3, "role, content, finish: {chunks:?}");

    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for c in &chunks {
        assert_eq!(c["id"], id, "one id for the whole stream");
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c["created"].is_u64());
        assert_eq!(c["model"], "base");
        assert!(c["usage"].is_null(), "no usage without include_usage: {c}");
        assert_eq!(c["choices"].as_array().unwrap().len(), 1, "{c}");
        assert_eq!(c["choices"][0]["index"], 0);
        assert!(c["choices"][0].get("message").is_none(), "deltas only: {c}");
    }
    // 1. role first, with empty content.
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert!(chunks[0]["choices"][0]["finish_reason"].is_null());
    // 2. content deltas carry only content and no finish_reason.
    let last = chunks.len() - 1;
    for c in &chunks[1..last] {
        let delta = c["choices"][0]["delta"].as_object().unwrap();
        assert!(
            delta.keys().all(|k| k == "content"),
            "content delta carries only content: {c}"
        );
        assert!(c["choices"][0]["finish_reason"].is_null(), "{c}");
    }
    // 4. an empty delta with the finish reason.
    assert_eq!(chunks[last]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[last]["choices"][0]["finish_reason"], "stop");
    // The same request and seed give the same text either way.
    assert_eq!(
        chat::streamed_text(&chunks),
        expected["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
    );
}

#[tokio::test]
async fn stream_with_include_usage_ends_with_a_usage_chunk() {
    let stack = Stack::single(WorkerOpts::default());
    let mut body = chat_body("base", "Hi. synthetic:reply_tokens=5");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let frames = chat::stream(&stack.client(), &body).await;
    let chunks = chat::chunks(&frames);
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
    let u = &usage_chunk["usage"];
    assert_eq!(u["completion_tokens"], 5, "{u}");
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + 5
    );
    assert!(u["prompt_tokens_details"]["cached_tokens"].is_u64(), "{u}");
    assert_eq!(u["reasoning_tokens"], 0);
    for c in rest {
        assert!(
            c.get("usage").is_some_and(Value::is_null),
            "other chunks carry usage: null: {c}"
        );
    }
    let finish = rest.last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    assert!(!chat::streamed_text(rest).is_empty());
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let long: String = (0..300)
        .map(|i| format!("fact number {i} is true. "))
        .collect();
    let body = chat_body(
        "base",
        &format!("{long} Summarise. synthetic:reply_tokens=3"),
    );
    let first = client
        .post_json("/chat/completions", &body)
        .await
        .unwrap()
        .json();
    let second = client
        .post_json("/chat/completions", &body)
        .await
        .unwrap()
        .json();
    let (u1, u2) = (&first["usage"], &second["usage"]);
    assert_eq!(u1["prompt_tokens_details"]["cached_tokens"], 0, "{u1}");
    assert_eq!(u1["prompt_tokens"], u2["prompt_tokens"]);
    let cached = u2["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = u2["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 1000, "a long prompt: {u2}");
    assert!(
        cached > prompt / 2 && cached <= prompt,
        "most of a repeated prompt is cached: {u2}"
    );
}

#[tokio::test]
async fn a_missing_or_wrong_key_is_401_invalid_api_key() {
    let stack = Stack::single(WorkerOpts::default());
    let body = chat_body("base", "hi");
    for key in [None, Some("sk-wrong"), Some("")] {
        let reply = stack
            .client()
            .with_key(key)
            .post_json("/chat/completions", &body)
            .await
            .unwrap();
        let e = assert_error(&reply, 401, "invalid_api_key");
        assert_eq!(e["type"], "authentication_error");
    }
    // Not the bearer scheme.
    let reply = stack
        .client()
        .with_key(None)
        .send(
            stack
                .client()
                .with_key(None)
                .request(reqwest::Method::POST, "/chat/completions")
                .header(
                    "authorization",
                    format!("Basic {}", stack.gateway.api_key()),
                )
                .json(&body),
        )
        .await
        .unwrap();
    assert_error(&reply, 401, "invalid_api_key");
    // Nothing reached the worker.
    assert_eq!(stack.worker("base").counters().await.unwrap().started, 0);
}

#[tokio::test]
async fn an_unknown_model_is_404_model_not_found() {
    let stack = Stack::single(WorkerOpts::default());
    for stream in [false, true] {
        let mut body = chat_body("gpt-nonexistent", "hi");
        body["stream"] = json!(stream);
        let reply = stack
            .client()
            .post_json("/chat/completions", &body)
            .await
            .unwrap();
        let e = assert_error(&reply, 404, "model_not_found");
        assert_eq!(e["param"], "model");
    }
}

#[tokio::test]
async fn an_unknown_parameter_is_400_with_its_name() {
    let stack = Stack::single(WorkerOpts::default());
    let mut body = chat_body("base", "hi");
    body["max_token"] = json!(5);
    let reply = stack
        .client()
        .post_json("/chat/completions", &body)
        .await
        .unwrap();
    let e = assert_error(&reply, 400, "unknown_parameter");
    assert_eq!(e["param"], "max_token");
    assert_eq!(reply.header("x-should-retry"), Some("false"));
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_cancels_the_generation() {
    // 100 tokens/s: a 2000-token reply would run for 20 s.
    let stack = Stack::single(WorkerOpts::paced(0, 100));
    let worker = stack.worker("base");
    let mut body = chat_body("base", "Go on. synthetic:reply_tokens=2000");
    body["stream"] = json!(true);
    let mut stream = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    for _ in 0..3 {
        let frame = stream.next_frame().await.unwrap().expect("a frame");
        assert!(!frame.is_done());
    }
    let before = worker.counters().await.unwrap();
    assert_eq!((before.started, before.cancelled), (1, 0), "{before:?}");
    drop(stream);
    let after = worker
        .wait_counters(Duration::from_secs(3), |c| c.cancelled >= 1)
        .await
        .unwrap();
    assert_eq!(after.cancelled, 1, "the worker saw the cancel: {after:?}");
    assert_eq!(after.completed, 0, "{after:?}");
    assert!(
        after.tokens_generated < 1000,
        "generation stopped early: {after:?}"
    );
    let load = worker.info().await.unwrap().load.unwrap_or_default();
    assert_eq!(load.running, 0, "nothing left running: {load:?}");
}

#[tokio::test]
async fn a_dead_worker_gives_a_clean_5xx_envelope() {
    let mut stack = Stack::single(WorkerOpts::default());
    stack.worker_mut("base").kill();
    for stream in [false, true] {
        let mut body = chat_body("base", "hi");
        body["stream"] = json!(stream);
        let reply = stack
            .client()
            .post_json("/chat/completions", &body)
            .await
            .unwrap();
        assert!(
            reply.status == 502 || reply.status == 503,
            "a dead worker is 502 or 503: {reply}"
        );
        let e = assert_envelope(&reply, reply.status);
        if reply.status == 503 {
            assert_eq!(e["code"], "server_overloaded", "{reply}");
        }
    }
    // The gateway itself is fine: models still answer.
    assert_eq!(stack.client().get("/models").await.unwrap().status, 200);
}

#[tokio::test]
async fn a_worker_killed_mid_stream_ends_the_stream_with_an_error_frame() {
    let mut stack = Stack::single(WorkerOpts::paced(0, 100));
    let mut body = chat_body("base", "Go on. synthetic:reply_tokens=2000");
    body["stream"] = json!(true);
    let mut stream = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    for _ in 0..2 {
        stream.next_frame().await.unwrap().expect("a frame");
    }
    stack.worker_mut("base").kill();
    let mut error = None;
    while let Some(frame) = stream.next_frame().await.unwrap() {
        if frame.is_done() {
            continue;
        }
        let v = frame.json();
        if v.get("error").is_some() {
            error = Some(v);
            break;
        }
        assert_eq!(v["object"], "chat.completion.chunk", "{v}");
    }
    let e = error.expect("an in-band error frame after the worker died");
    assert_eq!(e["error"]["status"], 502, "{e}");
    assert_eq!(e["error"]["type"], "server_error", "{e}");
    assert!(e["error"]["code"].is_string(), "{e}");
    assert!(e["error"]["message"].is_string(), "{e}");
}

#[tokio::test]
async fn every_response_carries_a_distinct_request_id() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let mut ids = Vec::new();
    let replies = [
        client
            .post_json("/chat/completions", &chat_body("base", "hi"))
            .await
            .unwrap(),
        client
            .post_json("/chat/completions", &json!({"model": "base"}))
            .await
            .unwrap(),
        client.with_key(None).get("/models").await.unwrap(),
        client.get("/models").await.unwrap(),
        client.get("/models/nope").await.unwrap(),
        client.get("/no/such/route").await.unwrap(),
    ];
    for r in &replies {
        let id = r
            .header("x-request-id")
            .unwrap_or_else(|| panic!("x-request-id on {r}"));
        assert!(!id.is_empty());
        ids.push(id.to_string());
    }
    let mut body = chat_body("base", "hi");
    body["stream"] = json!(true);
    let stream = client.stream("/chat/completions", &body).await.unwrap();
    ids.push(
        stream
            .header("x-request-id")
            .expect("x-request-id on a stream")
            .to_string(),
    );
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "request ids are distinct: {ids:?}");
    // The unknown route is a 404 in the standard envelope.
    assert_envelope(&replies[5], 404);
}

#[tokio::test]
async fn one_connection_serves_many_requests() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_string();
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let chat = chat_body("base", "hi synthetic:reply_tokens=3").to_string();
    let mut streaming: Value = serde_json::from_str(&chat).unwrap();
    streaming["stream"] = json!(true);
    let streaming = streaming.to_string();
    let unknown_model = chat_body("nope", "hi").to_string();
    let sequence: Vec<(Vec<u8>, u16)> = vec![
        (raw::request("GET", "/v1/models", Some(&key), None), 200),
        (
            raw::request("POST", "/v1/chat/completions", Some(&key), Some(&chat)),
            200,
        ),
        (
            raw::request("POST", "/v1/chat/completions", Some(&key), Some(&streaming)),
            200,
        ),
        (
            raw::request(
                "POST",
                "/v1/chat/completions",
                Some(&key),
                Some(&unknown_model),
            ),
            404,
        ),
        (raw::request("GET", "/v1/models", None, None), 401),
        (
            raw::request("POST", "/v1/chat/completions", Some(&key), Some(&chat)),
            200,
        ),
    ];
    for (i, (request, status)) in sequence.iter().enumerate() {
        conn.send(request).await.unwrap();
        let resp = conn.read_response().await.unwrap();
        assert_eq!(resp.status, *status, "request {i}: {}", resp.text());
        assert!(
            !resp
                .header("connection")
                .is_some_and(|c| c.eq_ignore_ascii_case("close")),
            "request {i} keeps the connection"
        );
        if i == 2 {
            assert!(resp.text().ends_with("data: [DONE]\n\n"), "{}", resp.text());
        }
    }
    assert!(!conn.closed_within(Duration::from_millis(100)).await);
}

/// RFC 9112 section 6.1: after a request with both `Content-Length` and
/// `Transfer-Encoding` the server answers (reading the body as chunked) and
/// closes, so a request pipelined behind it, whose framing a proxy may have
/// read differently, is never answered on that connection.
#[tokio::test]
async fn content_length_with_transfer_encoding_is_answered_then_closed() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_string();
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let body = chat_body("base", "hi synthetic:reply_tokens=3").to_string();
    let mut bytes = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
         Authorization: Bearer {key}\r\nContent-Type: application/json\r\n\
         Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend(raw::request("GET", "/v1/models", Some(&key), None));
    conn.send(&bytes).await.unwrap();
    let first = conn.read_response().await.unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(
        first
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close")),
        "the answer says the connection closes: {:?}",
        first.headers
    );
    assert!(
        conn.closed_within(Duration::from_secs(2)).await,
        "the connection is closed"
    );
    // The pipelined request got no answer.
    assert!(conn.read_response().await.is_err());

    // A client's own `Connection: close` is honoured too.
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let mut bytes = raw::request("GET", "/v1/models", Some(&key), None);
    let at = bytes.len() - 2;
    bytes.splice(at..at, b"Connection: close\r\n".iter().copied());
    conn.send(&bytes).await.unwrap();
    let r = conn.read_response().await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"), "{:?}", r.headers);
    assert!(conn.closed_within(Duration::from_secs(2)).await);
}

#[tokio::test]
async fn an_engine_failure_after_the_first_token_is_an_in_band_error_frame() {
    let stack = Stack::single(WorkerOpts::default());
    let mut body = chat_body(
        "base",
        "Go. synthetic:reply_tokens=40 synthetic:fail_after=5",
    );
    body["stream"] = json!(true);
    let stream = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .unwrap();
    assert_eq!(stream.status, 200, "the stream had started");
    let frames = stream.collect().await.unwrap();
    let errors: Vec<Value> = frames
        .iter()
        .filter(|f| !f.is_done())
        .map(|f| f.json())
        .filter(|v| v.get("error").is_some())
        .collect();
    assert_eq!(errors.len(), 1, "one error frame: {frames:?}");
    let e = &errors[0]["error"];
    assert_eq!(e["status"], 502, "{e}");
    assert_eq!(e["type"], "server_error");
    assert!(e["code"].is_string() && e["message"].is_string(), "{e}");
    let error_at = frames
        .iter()
        .position(|f| f.data.contains("\"error\""))
        .unwrap();
    assert!(error_at >= 1, "content came before the failure");
    assert!(
        frames[error_at + 1..].iter().all(|f| f.is_done()),
        "nothing but [DONE] may follow the error frame: {frames:?}"
    );
    assert!(
        frames.iter().all(|f| f.is_done()
            || f.data.contains("\"error\"")
            || f.json()["choices"][0]["finish_reason"].is_null()),
        "a failed stream never reports a finish_reason"
    );
}

#[tokio::test]
async fn an_engine_failure_before_the_first_token_is_a_502_envelope() {
    let stack = Stack::single(WorkerOpts::default());
    for stream in [false, true] {
        let mut body = chat_body("base", "Go. synthetic:fail_after=0");
        body["stream"] = json!(stream);
        let reply = stack
            .client()
            .post_json("/chat/completions", &body)
            .await
            .unwrap();
        assert_envelope(&reply, 502);
    }
}

/// A long reply from a zero-delay worker arrives whole: every token, in
/// order, then the finish (events come faster than the gateway writes, so
/// this exercises the relay's batching).
#[tokio::test]
async fn long_replies_arrive_complete_streaming_and_not() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let text: String = (0..600)
        .map(|i| format!("word{i} "))
        .collect::<String>()
        .trim_end()
        .to_string();
    let prompt = format!("synthetic:echo {text}");
    for round in 0..10 {
        let reply = client
            .post_json("/chat/completions", &chat_body("base", &prompt))
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "round {round}: {reply}");
        let c = reply.json();
        assert_eq!(c["choices"][0]["finish_reason"], "stop", "round {round}");
        assert_eq!(
            c["choices"][0]["message"]["content"], prompt,
            "round {round}: the echoed reply is complete"
        );

        let mut body = chat_body("base", &prompt);
        body["stream"] = json!(true);
        let frames = chat::stream(&client, &body).await;
        let chunks = chat::chunks(&frames);
        assert!(
            chunks.iter().all(|c| c.get("error").is_none()),
            "round {round}: no error frame"
        );
        assert_eq!(
            chat::streamed_text(&chunks),
            prompt,
            "round {round}: every token streamed"
        );
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "stop",
            "round {round}"
        );
    }
}
