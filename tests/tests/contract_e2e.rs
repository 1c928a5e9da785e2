//! The request contract end to end: every row of the contract table
//! (`gateway/src/validate/contract_cases.rs`, the same rows the gateway's
//! unit test runs) sent through the real gateway, plus the transport-level
//! rules that only a live server can show (content type, sizes, timeouts,
//! malformed heads).

#[path = "../../gateway/src/validate/contract_cases.rs"]
#[allow(dead_code)]
mod contract_cases;

use contract_cases::{all_cases, Api, Case};
use harness::raw::{self, RawConn};
use harness::{assert_error, json, GatewayOpts, Reply, Stack};
use std::time::Duration;

fn path(api: Api) -> &'static str {
    match api {
        Api::Chat => "/chat/completions",
        Api::Responses => "/responses",
    }
}

async fn send(stack: &Stack, case: &Case) -> Reply {
    let client = stack.client();
    let mut rb = client
        .request(reqwest::Method::POST, path(case.api))
        .header("content-type", "application/json")
        .body(case.body.clone());
    if let Some(s) = case.session_id {
        rb = rb.header("x-session-id", s);
    }
    client.send(rb).await.expect("request sent")
}

#[tokio::test]
async fn every_rule_of_the_contract_table_holds_through_the_gateway() {
    let stack = Stack::start().expect("stack starts");
    let cases = all_cases();
    assert!(cases.len() >= 60);
    let mut failures = Vec::new();
    for case in &cases {
        let reply = send(&stack, case).await;
        if case.status == 200 {
            // Accepted by the contract: whatever the worker makes of it, it
            // is not a client error.
            if (400..500).contains(&reply.status) {
                failures.push(format!(
                    "{:?} {}: accepted by the contract, got {reply}",
                    case.api, case.name
                ));
            }
            continue;
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let e = assert_error(&reply, case.status, case.code.unwrap_or_default());
            assert_eq!(e["param"].as_str(), case.param, "param of {reply}");
            if case.status != 409 && case.status != 429 {
                assert_eq!(
                    reply.header("x-should-retry"),
                    Some("false"),
                    "x-should-retry on {reply}"
                );
            }
        }));
        if let Err(panic) = outcome {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{:?} {}: {msg}", case.api, case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n"),
        stack.logs()
    );
}

#[tokio::test]
async fn a_json_body_needs_a_json_content_type_on_both_endpoints() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let client = stack.client();
    for (p, body) in [
        (
            "/chat/completions",
            r#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#,
        ),
        ("/responses", r#"{"model":"base","input":"hi"}"#),
    ] {
        for content_type in [
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let mut rb = client.request(reqwest::Method::POST, p).body(body);
            if let Some(ct) = content_type {
                rb = rb.header("content-type", ct);
            }
            let reply = client.send(rb).await.unwrap();
            assert_error(&reply, 415, "unsupported_media_type");
            assert_eq!(reply.header("x-should-retry"), Some("false"));
        }
        let rb = client
            .request(reqwest::Method::POST, p)
            .header("content-type", "application/json; charset=utf-8")
            .body(body);
        let reply = client.send(rb).await.unwrap();
        assert_eq!(reply.status, 200, "{reply}");
    }
}

#[tokio::test]
async fn bodies_that_are_not_json_objects_are_400_with_the_position() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let client = stack.client();
    let post = |body: Vec<u8>| {
        client
            .request(reqwest::Method::POST, "/chat/completions")
            .header("content-type", "application/json")
            .body(body)
    };
    let reply = client
        .send(post(b"{\"model\":\"base\",\n\"messages\": [}".to_vec()))
        .await
        .unwrap();
    let e = assert_error(&reply, 400, "invalid_json");
    assert!(
        e["message"].as_str().unwrap_or_default().contains("line 2"),
        "{reply}"
    );
    let reply = client.send(post(Vec::new())).await.unwrap();
    assert_error(&reply, 400, "invalid_json");
    let reply = client
        .send(post(b"{\"model\":\"ba\xc3\x28se\"}".to_vec()))
        .await
        .unwrap();
    assert_error(&reply, 400, "invalid_json");
    let deep = format!(
        r#"{{"model":"base","messages":[{{"role":"user","content":"hi"}}],"metadata":{}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let reply = client.send(post(deep.into_bytes())).await.unwrap();
    assert_eq!(reply.status, 400, "{reply}");
    // The gateway is still serving.
    let reply = client
        .send(post(
            br#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
        ))
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
}

/// A gateway with small limits, so that sizes and timeouts are quick to hit.
fn small_limits_stack() -> Stack {
    Stack::builder()
        .models(&["base"])
        .gateway_opts(GatewayOpts {
            extra_toml:
                "max_body_bytes = 4096\nmax_header_bytes = 8192\nread_timeout_seconds = 1\n".into(),
            ..GatewayOpts::default()
        })
        .start()
        .unwrap()
}

#[tokio::test]
async fn sizes_over_the_limits_are_413_and_431() {
    let stack = small_limits_stack();
    let client = stack.client();
    let big = json!({"model": "base", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let reply = client.post_json("/chat/completions", &big).await.unwrap();
    assert_error(&reply, 413, "request_too_large");

    let key = stack.gateway.api_key().to_string();
    let body = r#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#;
    let mut req = raw::request("POST", "/v1/chat/completions", Some(&key), Some(body));
    let big_header = format!("X-Padding: {}\r\n", "a".repeat(10_000));
    let at = req.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    req.splice(at..at, big_header.into_bytes());
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    conn.send(&req).await.unwrap();
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 431, "{}", resp.text());
    assert!(resp.text().contains("request_header_fields_too_large"));

    // Over Pingora's own 1 MiB cap: still an answer, not a silent close.
    let mut req = raw::request("POST", "/v1/chat/completions", Some(&key), Some(body));
    let huge_header = format!("X-Padding: {}\r\n", "a".repeat(1_200_000));
    req.splice(at..at, huge_header.into_bytes());
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    let _ = conn.send(&req).await;
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 431, "{}", resp.text());
}

#[tokio::test]
async fn malformed_heads_and_slow_clients() {
    let stack = small_limits_stack();
    let key = stack.gateway.api_key().to_string();

    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost x\r\n\r\n")
        .await
        .unwrap();
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 400, "{}", resp.text());
    assert!(resp.text().contains("\"status\":400"));

    // A body that stops halfway: 408 once the read timeout passes, then close.
    let body = r#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#;
    let req = raw::request("POST", "/v1/chat/completions", Some(&key), Some(body));
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    conn.send(&req[..req.len() - 10]).await.unwrap();
    let resp = conn.read_response().await.unwrap();
    assert_eq!(resp.status, 408, "{}", resp.text());
    assert!(resp.text().contains("request_timeout"));
    assert!(conn.closed_within(Duration::from_secs(2)).await);

    // A head that never ends: the connection is closed after the timeout.
    let mut conn = RawConn::connect(stack.gateway.addr()).await.unwrap();
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    assert!(conn.closed_within(Duration::from_secs(5)).await);

    // And the gateway still answers.
    let reply = stack
        .client()
        .post_json(
            "/chat/completions",
            &json!({"model": "base", "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{reply}");
}
