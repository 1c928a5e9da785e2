//! The HTTP edge's defects found by the independent audit (issue 31), each
//! through the real gateway: duplicate `Authorization` headers, too many
//! header fields, `include: ["reasoning.encrypted_content"]`, a replay
//! cursor past the end of a run's log, floods of messages, HTTP/1.1
//! pipelining, and a client that stops reading its stream.

use harness::raw::{self, RawConn, RawResponse};
use harness::responses;
use harness::{assert_error, json, Stack, WorkerOpts};
use serde_json::Value;
use std::time::{Duration, Instant};

/// A raw request's head with `extra` header lines inserted before the blank line.
fn with_headers(mut request: Vec<u8>, extra: &str) -> Vec<u8> {
    let at = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a request head")
        + 2;
    request.splice(at..at, extra.bytes());
    request
}

fn error_of(resp: &RawResponse) -> Value {
    let v: Value = serde_json::from_slice(&resp.body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", resp.text()));
    v["error"].clone()
}

fn closes(resp: &RawResponse) -> bool {
    resp.header("connection")
        .is_some_and(|c| c.eq_ignore_ascii_case("close"))
}

#[tokio::test]
async fn duplicate_authorization_headers_are_refused_before_authentication() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_string();
    for (path, extra) in [
        // Both valid, the same key twice.
        ("/v1/models", format!("Authorization: Bearer {key}\r\n")),
        // The first valid, the second not: the first used to win.
        (
            "/v1/models",
            "Authorization: Bearer sk-wrong\r\n".to_string(),
        ),
        (
            "/v1/responses/resp_x",
            "authorization: Basic abc\r\n".to_string(),
        ),
    ] {
        let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
        let request = with_headers(raw::request("GET", path, Some(&key), None), &extra);
        conn.send(&request).await.unwrap();
        let resp = conn.read_response().await.unwrap();
        assert_eq!(resp.status, 400, "{path} {extra:?}: {}", resp.text());
        let e = error_of(&resp);
        assert_eq!(e["code"], "duplicate_header", "{e}");
        assert_eq!(e["type"], "invalid_request_error", "{e}");
        assert!(e["param"].is_null(), "{e}");
    }
    // The invalid key first and the valid one second is refused the same way.
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let request = with_headers(
        raw::request("GET", "/v1/models", Some("sk-wrong"), None),
        &format!("Authorization: Bearer {key}\r\n"),
    );
    conn.send(&request).await.unwrap();
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());
    // One header still works.
    conn.send(&raw::request("GET", "/v1/models", Some(&key), None))
        .await
        .unwrap();
    assert_eq!(conn.read_response().await.unwrap().status, 200);
}

#[tokio::test]
async fn too_many_header_fields_is_431() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_string();
    let small: String = (0..300).map(|i| format!("X-Pad-{i}: v\r\n")).collect();
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let request = with_headers(raw::request("GET", "/v1/models", Some(&key), None), &small);
    conn.send(&request).await.unwrap();
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 431, "{}", resp.text());
    assert_eq!(
        error_of(&resp)["code"],
        "request_header_fields_too_large",
        "{}",
        resp.text()
    );
    // 200 fields are within the parser's limit (256).
    let fine: String = (0..200).map(|i| format!("X-Pad-{i}: v\r\n")).collect();
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let request = with_headers(raw::request("GET", "/v1/models", Some(&key), None), &fine);
    conn.send(&request).await.unwrap();
    assert_eq!(conn.read_response().await.unwrap().status, 200);
}

/// The Codex CLI asks for encrypted reasoning (`store: false` with
/// reasoning). It is accepted, and the reply says plainly that there is
/// none: reasoning comes in clear summary items without `encrypted_content`
/// (omitted, not `null`: Open Responses types it as a string when present).
#[tokio::test]
async fn encrypted_reasoning_is_answered_with_none_and_clear_summaries() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"Think, then answer.","store":false,
                    "reasoning":{"effort":"low","summary":"auto"},
                    "include":["reasoning.encrypted_content"]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let v = r.json();
    let reasoning: Vec<&Value> = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "reasoning")
        .collect();
    assert!(!reasoning.is_empty(), "a reasoning item: {v}");
    for item in reasoning {
        assert!(
            item.get("encrypted_content").is_none(),
            "no encrypted_content: {item}"
        );
        assert!(
            item["summary"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty()),
            "the reasoning is in clear: {item}"
        );
    }
}

#[tokio::test]
async fn a_replay_cursor_past_the_end_of_an_ended_run_is_400() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let id = responses::id(
        &responses::create(
            &client,
            &json!({"model":"base","input":"bg synthetic:reply_tokens=5","background":true}),
        )
        .await,
    );
    let done =
        responses::wait_for_status(&client, &id, &["completed"], Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "the run completes: {done}");
    let replay = |after: u64| {
        let client = client.clone();
        let id = id.clone();
        async move {
            client
                .send(client.request(
                    reqwest::Method::GET,
                    &format!("/responses/{id}?stream=true&starting_after={after}"),
                ))
                .await
                .unwrap()
        }
    };
    // The whole log, to learn the last sequence number.
    let all = client
        .send(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .unwrap();
    assert_eq!(all.status, 200);
    let last = all
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["sequence_number"].as_u64())
        .max()
        .expect("events with sequence numbers");
    // Just before the end: the terminal event alone.
    let r = replay(last - 1).await;
    assert_eq!(r.status, 200, "{r}");
    assert!(r.text().contains("response.completed"), "{r}");
    // Past the end: named, not an empty stream that never ends the run.
    for after in [last + 1, last + 1000] {
        let r = replay(after).await;
        let e = assert_error(&r, 400, "invalid_value");
        assert_eq!(e["param"], "starting_after", "{r}");
    }
}

/// The audit's body: 16 MiB of 570,000 empty messages cost about 1.5 CPU
/// seconds before its 400. Parsing now stops at the 4,097th message.
#[tokio::test]
async fn floods_of_messages_items_and_parts_are_refused_while_parsing() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let message = r#"{"role":"user","content":""}"#;
    let flood = format!(
        r#"{{"model":"base","messages":[{}]}}"#,
        vec![message; 570_000].join(",")
    );
    assert!(flood.len() > 15 << 20 && flood.len() < 16 << 20);
    let before = stack.gateway.cpu_micros().unwrap();
    let r = client
        .send(
            client
                .request(reqwest::Method::POST, "/chat/completions")
                .header("content-type", "application/json")
                .body(flood),
        )
        .await
        .unwrap();
    let cpu_ms = (stack.gateway.cpu_micros().unwrap() - before) / 1000;
    println!("gateway CPU to refuse 570,000 empty messages (16 MiB): {cpu_ms} ms");
    let e = assert_error(&r, 400, "invalid_value");
    assert_eq!(e["param"], "messages", "{r}");
    assert!(cpu_ms < 750, "{cpu_ms} ms of CPU");

    // 4,097 input items; 1,025 parts in one message or item.
    let items = vec![r#"{"role":"user","content":"x"}"#; 4097].join(",");
    let r = client
        .post_json(
            "/responses",
            &serde_json::from_str(&format!(r#"{{"model":"base","input":[{items}]}}"#)).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(assert_error(&r, 400, "invalid_value")["param"], "input");
    let parts = vec![json!({"type":"text","text":"x"}); 1025];
    let r = client
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":parts}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        assert_error(&r, 400, "invalid_value")["param"],
        "messages.0.content"
    );
    let parts = vec![json!({"type":"input_text","text":"x"}); 1025];
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":[{"role":"user","content":parts}]}),
        )
        .await
        .unwrap();
    assert_eq!(
        assert_error(&r, 400, "invalid_value")["param"],
        "input.0.content"
    );
}

/// Requests sent in one write, before any answer was read, are all
/// answered, in order, on the same connection, which stays open.
#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let stack = Stack::single(WorkerOpts::default());
    let key = stack.gateway.api_key().to_string();
    let chat = json!({"model":"base","messages":[{"role":"user","content":"hi synthetic:echo"}]})
        .to_string();

    // Two GETs, then three requests, in one write each.
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let mut bytes = raw::request("GET", "/v1/models", Some(&key), None);
    bytes.extend(raw::request("GET", "/v1/models/base", Some(&key), None));
    conn.send(&bytes).await.unwrap();
    let first = conn.read_response().await.unwrap();
    let second = conn.read_response().await.unwrap();
    assert_eq!((first.status, second.status), (200, 200));
    assert!(first.header("x-request-id").is_some());
    assert!(first.text().contains("\"list\""), "{}", first.text());
    assert!(
        second.text().contains("\"id\":\"base\""),
        "{}",
        second.text()
    );
    assert!(!closes(&first) && !closes(&second));

    let mut bytes = raw::request("GET", "/v1/models", Some(&key), None);
    bytes.extend(raw::request("GET", "/v1/nope", Some(&key), None));
    bytes.extend(raw::request("GET", "/v1/models/base", Some(&key), None));
    conn.send(&bytes).await.unwrap();
    let statuses: Vec<u16> = [
        conn.read_response().await.unwrap(),
        conn.read_response().await.unwrap(),
        conn.read_response().await.unwrap(),
    ]
    .iter()
    .map(|r| r.status)
    .collect();
    assert_eq!(statuses, [200, 404, 200]);

    // A POST with its body and a GET behind it, in one write.
    let mut bytes = raw::request("POST", "/v1/chat/completions", Some(&key), Some(&chat));
    bytes.extend(raw::request("GET", "/v1/models", Some(&key), None));
    conn.send(&bytes).await.unwrap();
    let post = conn.read_response().await.unwrap();
    assert_eq!(post.status, 200, "{}", post.text());
    assert!(post.text().contains("synthetic:echo"), "{}", post.text());
    let get = conn.read_response().await.unwrap();
    assert_eq!(get.status, 200, "{}", get.text());
    assert!(!closes(&post) && !closes(&get));
    assert!(!conn.closed_within(Duration::from_millis(100)).await);

    // Every request was counted.
    let (_, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("gateway_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(counted >= 7.0, "{counted} requests counted:\n{metrics}");
}

fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A client that stops reading its stream loses it after
/// `write_timeout_seconds`: the stream closes, the worker's call is
/// cancelled, and the organisation's one concurrency slot is free again.
#[tokio::test]
async fn a_client_that_stops_reading_loses_its_stream_after_the_write_timeout() {
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml("write_timeout_seconds = 2\n[plans.default]\nmax_concurrent = 1\n")
        .start()
        .expect("stack starts");
    let key = stack.gateway.api_key().to_string();
    let body = json!({"model":"base","stream":true,"max_tokens":100000,
        "messages":[{"role":"user","content":"Go on. synthetic:reply_tokens=100000"}]})
    .to_string();
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    conn.send(&raw::request(
        "POST",
        "/v1/chat/completions",
        Some(&key),
        Some(&body),
    ))
    .await
    .unwrap();
    // Never read. The stream opens, fills the socket, then stalls.
    let started = Instant::now();
    let mut opened = false;
    let mut closed_after = None;
    while started.elapsed() < Duration::from_secs(30) {
        let (_, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
        let open = gauge(&metrics, "gateway_open_streams").unwrap_or(0.0);
        if open >= 1.0 {
            opened = true;
        } else if opened {
            closed_after = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(opened, "the stream opened");
    let closed_after = closed_after.expect("the stalled stream was closed");
    println!("stalled stream closed after {closed_after:?}");
    // The worker's call ended (cancelled): nothing runs there any more.
    let worker = stack.worker("base");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = worker.info().await.unwrap();
        let running = info.load.map_or(0, |l| l.running + l.queued);
        if running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{running} still running on the worker"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let counters = worker.counters().await.unwrap();
    assert_eq!(counters.started, 1, "{counters:?}");
    // The one concurrency slot is free: another request is served.
    let r = stack
        .client()
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":"hi synthetic:reply_tokens=2"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
}
