//! What one request may cost (issue 41): the audit's hostile bodies,
//! through the real gateway, each refused with its status, `code` and
//! `param` before it is built whole, and the gateway's resident memory
//! (`/proc/<pid>/status`) bounded across all of them. Before the bounds
//! one 16 MiB body of tool parameters took a fresh gateway from 29 to
//! 1,271 MiB, and forty 1 MB `json_schema` formats left it at 1,112 MiB.
//! Issue 52 adds what one WebSocket connection may cost.

use harness::procfs;
use harness::{assert_error, json, Client, Reply, Stack, Value, WorkerOpts};
use inference_proto::v1 as pb;

const MIB: u64 = 1024;

async fn post(client: &Client, path: &str, body: String) -> Reply {
    client
        .send(
            client
                .request(reqwest::Method::POST, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
        .unwrap()
}

/// Sends `body` and checks the 400's `code` and `param`.
async fn refused(client: &Client, path: &str, body: String, code: &str, param: &str) {
    let r = post(client, path, body).await;
    let e = assert_error(&r, 400, code);
    assert_eq!(e["param"], param, "{r}");
    assert_eq!(e["type"], "invalid_request_error", "{r}");
}

/// A chat body with one user message and `extra` top-level fields.
fn chat(extra: &str) -> String {
    format!(r#"{{"model":"base","messages":[{{"role":"user","content":"hi"}}],{extra}}}"#)
}

fn rss_mib(pid: u32) -> u64 {
    procfs::rss_kib(pid).unwrap() / MIB
}

/// The gateway's resident memory once one ordinary `body` to `path` was
/// served: the baseline then has a request's first allocations.
async fn baseline_mib(client: &Client, pid: u32, path: &str, body: Value) -> u64 {
    let r = client.post_json(path, &body).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    rss_mib(pid)
}

/// A chat body of just under 16 MiB whose tool `parameters` holds 8.3M zeros.
fn zeros_body() -> String {
    let zeros = chat(&format!(
        r#""tools":[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object","x":[{}0]}}}}}}]"#,
        "0,".repeat(8_300_000)
    ));
    assert!(zeros.len() > 15 << 20 && zeros.len() < 16 << 20);
    zeros
}

/// A WebSocket on which one short response completed (a connection's and
/// a response's first allocations), and that response's create body.
async fn warm_websocket(base: &str, key: &str) -> (harness::websocket::WsClient, Value) {
    let mut ws = harness::websocket::connect(base, key).await.unwrap();
    let warm = json!({"model": "base", "input": "hi synthetic:reply_tokens=2", "store": false,
                      "max_output_tokens": 16});
    let events = ws.create(&warm).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    (ws, warm)
}

/// `{"type":"string","x-id":i,"x-junk":[{},{},…]}` of about `bytes`.
fn junk_schema(i: usize, bytes: usize) -> String {
    format!(
        r#"{{"type":"string","x-id":{i},"x-junk":[{}{{}}]}}"#,
        "{},".repeat(bytes / 3)
    )
}

#[tokio::test]
async fn hostile_bodies_are_refused_and_the_gateway_stays_small() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let ordinary = json!({"model":"base","messages":[{"role":"user","content":"hi"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]});
    let before = baseline_mib(&client, pid, "/chat/completions", ordinary).await;

    // 1a. One 16 MiB body whose tool `parameters` holds 8.3M zeros.
    let zeros = zeros_body();
    let (c, p) = ("schema_too_large", "tools.0.function.parameters");
    refused(&client, "/chat/completions", zeros, c, p).await;
    let after_zeros = rss_mib(pid);

    // 1b. Forty distinct 1 MB `json_schema` formats (chat), and the same
    // on the Responses API's `text.format` and a flat tool.
    for i in 0..40 {
        let body = chat(&format!(
            r#""response_format":{{"type":"json_schema","json_schema":{{"name":"a","schema":{}}}}}"#,
            junk_schema(i, 1 << 20)
        ));
        let p = "response_format.json_schema.schema";
        refused(&client, "/chat/completions", body, c, p).await;
    }
    for i in 0..10 {
        let body = format!(
            r#"{{"model":"base","input":"hi","text":{{"format":{{"type":"json_schema","name":"a","schema":{}}}}}}}"#,
            junk_schema(100 + i, 1 << 20)
        );
        refused(&client, "/responses", body, c, "text.format.schema").await;
        let body = format!(
            r#"{{"model":"base","input":"hi","tools":[{{"type":"function","name":"f","parameters":{}}}]}}"#,
            junk_schema(200 + i, 1 << 20)
        );
        refused(&client, "/responses", body, c, "tools.0.parameters").await;
    }
    let after_schemas = rss_mib(pid);

    // 2. Four stop strings of 4,000,000 characters; one of 257.
    let stops: Vec<String> = ["q", "x", "y", "z"]
        .iter()
        .map(|c| c.repeat(4_000_000))
        .collect();
    let body = chat(&format!(r#""stop":{}"#, json!(stops)));
    refused(
        &client,
        "/chat/completions",
        body,
        "invalid_value",
        "stop.0",
    )
    .await;
    let body = chat(&format!(r#""stop":["a","b","{}"]"#, "é".repeat(257)));
    refused(
        &client,
        "/chat/completions",
        body,
        "invalid_value",
        "stop.2",
    )
    .await;

    // 3. 614k empty content parts in 16 MB (600 messages of 1,024, each
    // within its own bound): three values a part, the request's 65,536
    // run out in the 22nd message.
    let part = r#"{"type":"text","text":""}"#;
    let message = format!(
        r#"{{"role":"user","content":[{}]}}"#,
        vec![part; 1024].join(",")
    );
    let parts = format!(
        r#"{{"model":"base","messages":[{}]}}"#,
        vec![message.as_str(); 600].join(",")
    );
    assert!(parts.len() > 15 << 20 && parts.len() < 16 << 20);
    let cpu = stack.gateway.cpu_micros().unwrap();
    let p = "messages.21.content";
    refused(&client, "/chat/completions", parts, "invalid_value", p).await;
    let cpu_ms = (stack.gateway.cpu_micros().unwrap() - cpu) / 1000;
    println!("gateway CPU to refuse 614,400 empty content parts: {cpu_ms} ms");
    assert!(cpu_ms < 750, "{cpu_ms} ms of CPU");

    // `metadata` values of 5.3M `{}`: refused at their first byte.
    let metadata = format!(
        r#"{{"model":"base","input":"hi","metadata":{{"a":[{}{{}}]}}}}"#,
        "{},".repeat(5_300_000)
    );
    refused(
        &client,
        "/responses",
        metadata,
        "invalid_type",
        "metadata.a",
    )
    .await;

    let after = rss_mib(pid);
    let peak = procfs::peak_rss_kib(pid).unwrap() / MIB;
    println!(
        "gateway resident memory: {before} MiB before, {after_zeros} after the zeros, \
         {after_schemas} after 60 schemas, {after} at the end (peak {peak} MiB)"
    );
    assert!(
        after < before + 100,
        "resident memory grew from {before} to {after} MiB"
    );

    // Still serving.
    let r = client
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":"hi"}],"stop":["END"]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
}

/// A worker defends itself whatever gateway sends to it: the audit's four
/// 4,000,000-character stop strings sent straight to its gRPC port are
/// refused (INVALID_REQUEST), and it keeps serving.
#[tokio::test]
async fn a_worker_refuses_over_long_stop_strings_from_any_gateway() {
    let stack = Stack::single(WorkerOpts::default());
    let worker = stack.worker("base");
    let mut grpc = worker.grpc().await.unwrap();
    let request = |stop: Vec<String>| pb::GenerateRequest {
        request_id: "hostile".into(),
        model: "base".into(),
        messages: vec![pb::Message {
            role: "user".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text("hi".into())),
            }],
            ..Default::default()
        }],
        sampling: Some(pb::Sampling {
            max_tokens: 8,
            stop,
            ..Default::default()
        }),
        ..Default::default()
    };
    let stops: Vec<String> = ["q", "x", "y", "z"]
        .iter()
        .map(|c| c.repeat(4_000_000))
        .collect();
    let err = grpc.generate(request(stops)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let reason = err
        .metadata()
        .get(pb::ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok());
    assert_eq!(reason, Some("INVALID_REQUEST"), "{err:?}");
    // A stop string at the bound is served.
    let mut events = grpc
        .generate(request(vec!["é".repeat(512)]))
        .await
        .unwrap()
        .into_inner();
    let mut finished = false;
    while let Some(ev) = events.message().await.unwrap() {
        finished |= matches!(ev.event, Some(pb::generate_event::Event::Finished(_)));
    }
    assert!(finished);
    let r = stack
        .client()
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":"hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let _: Value = r.json();
}

/// A gateway whose org `capped` is on a plan storing at most `cap` bytes
/// of responses, beside `free` on the default plan; on Redis or in process.
fn quota_stack(cap: u64, redis: bool) -> (Stack, Client, Client) {
    let capped = harness::TestKey::random(&format!("org-capped-{}", harness::random_hex(6)));
    let free = harness::TestKey::random(&format!("org-free-{}", harness::random_hex(6)));
    let mut gw = harness::GatewayOpts::default();
    gw.keys.push(free.clone());
    let extra = format!(
        "[plans.small]\nmax_stored_bytes = {cap}\n\n[[keys]]\nsha256 = \"{}\"\norg = \"{}\"\nname = \"capped\"\nplan = \"small\"\n",
        harness::hash_key(&capped.key),
        capped.org
    );
    let mut builder = Stack::builder()
        .models(&["base"])
        .gateway_opts(gw)
        .extra_toml(&extra);
    if redis {
        builder = builder.redis();
    }
    let stack = builder.start().expect("stack starts");
    let base = stack.client();
    let (capped, free) = (
        base.with_key(Some(&capped.key)),
        base.with_key(Some(&free.key)),
    );
    (stack, capped, free)
}

/// Issue 41, item 4: one organisation fills its plan's cap on stored
/// responses and gets a 403 `storage_quota_exceeded` (param `store`);
/// another organisation is not affected; `store: false` still works, and
/// a delete makes room again.
async fn stored_responses_are_capped(redis: bool) {
    // Each stored response counts its input twice (its items and its
    // conversation): about 9 KB here, so two fit in 20,000 bytes.
    let input = "x".repeat(4000);
    let (_stack, capped, free) = quota_stack(20_000, redis);
    let create = |client: &Client, store: bool| {
        let client = client.clone();
        let body = json!({"model": "base", "input": input, "store": store, "max_output_tokens": 8});
        async move { client.post_json("/responses", &body).await.unwrap() }
    };
    let mut stored = Vec::new();
    let refusal = loop {
        let r = create(&capped, true).await;
        if r.status != 200 {
            break r;
        }
        stored.push(r.json()["id"].as_str().unwrap().to_owned());
        assert!(stored.len() < 10, "the cap never refused a response");
    };
    assert_eq!(stored.len(), 2, "two responses fit: {refusal}");
    let e = assert_error(&refusal, 403, "storage_quota_exceeded");
    assert_eq!(e["param"], "store", "{refusal}");
    assert_eq!(e["type"], "permission_error", "{refusal}");
    assert!(
        refusal.headers.get("retry-after").is_none(),
        "waiting does not help"
    );

    // Another organisation stores as much as it likes.
    for _ in 0..4 {
        let r = create(&free, true).await;
        assert_eq!(r.status, 200, "{r}");
    }
    // Unstored responses are not capped.
    let r = create(&capped, false).await;
    assert_eq!(r.status, 200, "{r}");
    // A delete gives its bytes back.
    let r = capped
        .delete(&format!("/responses/{}", stored[0]))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = create(&capped, true).await;
    assert_eq!(r.status, 200, "{r}");
    let r = create(&capped, true).await;
    assert_error(&r, 403, "storage_quota_exceeded");
}

#[tokio::test]
async fn stored_responses_are_capped_per_organisation_in_process() {
    stored_responses_are_capped(false).await;
}

#[tokio::test]
async fn stored_responses_are_capped_per_organisation_on_redis() {
    stored_responses_are_capped(true).await;
}

async fn post_keyed(client: &Client, path: &str, key: &str, body: String) -> Reply {
    client
        .send(
            client
                .request(reqwest::Method::POST, path)
                .header("content-type", "application/json")
                .header("Idempotency-Key", key)
                .body(body),
        )
        .await
        .unwrap()
}

/// Issue 52, item 3: with an `Idempotency-Key`, a body the bounded parse
/// refuses costs what it costs without the header. Before, the body was
/// fingerprinted as a whole `serde_json::Value` ahead of the parse: the
/// audit's 16 MiB of zeros took 1.16 s of CPU and a 1,225 MiB peak.
#[tokio::test]
async fn an_idempotency_key_adds_nothing_to_a_refused_body() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let ordinary = json!({"model":"base","messages":[{"role":"user","content":"hi"}]});
    let before = baseline_mib(&client, pid, "/chat/completions", ordinary).await;
    let zeros = zeros_body();
    let cpu = stack.gateway.cpu_micros().unwrap();
    let r = post_keyed(&client, "/chat/completions", "k-zeros", zeros).await;
    let e = assert_error(&r, 400, "schema_too_large");
    assert_eq!(e["param"], "tools.0.function.parameters", "{r}");
    let cpu_ms = (stack.gateway.cpu_micros().unwrap() - cpu) / 1000;
    // The Responses create too: `metadata` of 5.3M `{}`.
    let metadata = format!(
        r#"{{"model":"base","input":"hi","metadata":{{"a":[{}{{}}]}}}}"#,
        "{},".repeat(5_300_000)
    );
    let r = post_keyed(&client, "/responses", "k-metadata", metadata).await;
    assert_error(&r, 400, "invalid_type");
    let peak = procfs::peak_rss_kib(pid).unwrap() / MIB;
    println!(
        "with an Idempotency-Key, a refused 16 MiB body: {cpu_ms} ms of gateway CPU, \
         resident memory {before} MiB before, peak {peak} MiB"
    );
    assert!(cpu_ms < 500, "{cpu_ms} ms of CPU");
    assert!(
        peak < before + 150,
        "peak resident memory {peak} MiB from {before} MiB"
    );
    // The key was never claimed: the same key with a good body runs.
    let body = chat(r#""max_tokens":4"#);
    let r = post_keyed(&client, "/chat/completions", "k-zeros", body).await;
    assert_eq!(r.status, 200, "{r}");
}

/// A chat body whose synthetic reply echoes about `bytes` of text (up to
/// about 200 KB: the echo and its input share the context window).
fn echo_chat(i: usize, bytes: usize) -> String {
    let text = format!("{i} synthetic:echo {}", "abcd ".repeat(bytes / 5));
    json!({"model": "base", "max_tokens": bytes / 2,
           "messages": [{"role": "user", "content": text}]})
    .to_string()
}

/// Issue 52, item 6: the in-process records are bounded by bytes
/// (`store.idempotency_max_memory_bytes`), the least recently used
/// finished ones going first, and an evicted key's retry runs again.
/// Before, 100 keys of about 1 MiB grew the gateway by 89 MiB; here 200
/// of about 0.2 MiB (as large as the synthetic model's context allows)
/// within a bound of 4 MiB.
#[tokio::test]
async fn in_process_idempotency_records_are_bounded_by_bytes() {
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml("[store]\nidempotency_max_memory_bytes = 4194304\n")
        .start()
        .expect("stack starts");
    let client = stack.client();
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let key = |i: usize| format!("bounded-{i}");
    // Two rounds first, so the baseline has the request path's allocations.
    for i in 0..2 {
        let r = post_keyed(
            &client,
            "/chat/completions",
            &key(1000 + i),
            echo_chat(i, 200_000),
        )
        .await;
        assert_eq!(r.status, 200, "{r}");
    }
    let before = rss_mib(pid);
    for i in 0..200 {
        let r = post_keyed(&client, "/chat/completions", &key(i), echo_chat(i, 200_000)).await;
        assert_eq!(r.status, 200, "{r}");
        assert!(r.body.len() > 190_000, "{} bytes", r.body.len());
    }
    let after = rss_mib(pid);
    println!(
        "200 idempotency records of about 0.2 MiB in process: resident memory {before} -> {after} MiB"
    );
    // Kept unbounded, the 200 records hold 40 MiB; the bound keeps 4 MiB,
    // and the allocator's retained pages under load have measured 6 to 20
    // MiB on top (2026-11-29).
    assert!(
        after < before + 26,
        "resident memory grew from {before} to {after} MiB"
    );
    // The newest is replayed; the oldest was evicted, and runs again.
    let r = post_keyed(
        &client,
        "/chat/completions",
        &key(199),
        echo_chat(199, 200_000),
    )
    .await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"), "{r}");
    let r = post_keyed(&client, "/chat/completions", &key(0), echo_chat(0, 200_000)).await;
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(
        r.header("idempotent-replayed"),
        None,
        "evicted: it ran again"
    );
}

/// Issue 52, item 6: an `Idempotency-Key`'s record counts against its
/// organisation's storage cap, as a stored response does. At the cap a
/// keyed create is refused (403 `storage_quota_exceeded`) and so is a
/// stored create; a replay still answers (it stores nothing), and another
/// organisation is not affected. Before, an org at its cap added 9.2 MB.
async fn idempotency_records_count_against_the_storage_cap(redis: bool) {
    let (_stack, capped, free) = quota_stack(1_000_000, redis);
    let mut kept = 0;
    let mut record = 0;
    let refusal = loop {
        let r = post_keyed(
            &capped,
            "/chat/completions",
            &format!("capped-{kept}"),
            echo_chat(kept, 200_000),
        )
        .await;
        if r.status != 200 {
            break r;
        }
        record = r.body.len();
        kept += 1;
        assert!(kept < 20, "the cap never refused a keyed create");
    };
    // The create that passes the cap is kept whole (it was admitted under
    // it); the next is refused.
    let expected = 1_000_000usize.div_ceil(record);
    assert_eq!(kept, expected, "{record} bytes a record: {refusal}");
    let e = assert_error(&refusal, 403, "storage_quota_exceeded");
    assert_eq!(e["param"], "store", "{refusal}");
    // The refused one did not pin its key; a replay of a kept one answers.
    let r = post_keyed(
        &capped,
        "/chat/completions",
        "capped-0",
        echo_chat(0, 200_000),
    )
    .await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"), "{r}");
    // A stored create sees the records' bytes.
    let r = capped
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "hi", "max_output_tokens": 4}),
        )
        .await
        .unwrap();
    assert_error(&r, 403, "storage_quota_exceeded");
    // Without a key and unstored: nothing is kept, nothing refused.
    let r = capped
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":"hi"}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = post_keyed(&free, "/chat/completions", "free-0", echo_chat(0, 200_000)).await;
    assert_eq!(r.status, 200, "{r}");
}

#[tokio::test]
async fn idempotency_records_count_against_the_storage_cap_in_process() {
    idempotency_records_count_against_the_storage_cap(false).await;
}

#[tokio::test]
async fn idempotency_records_count_against_the_storage_cap_on_redis() {
    idempotency_records_count_against_the_storage_cap(true).await;
}

/// `{"model":"base","input":[one message of `text` with id `msg_big`,
/// then `refs` references to it]}` plus `extra` top-level fields.
fn fan_out(text: &str, refs: usize, extra: &str) -> String {
    let reference = r#"{"type":"item_reference","id":"msg_big"}"#;
    format!(
        r#"{{"model":"base","input":[{{"type":"message","id":"msg_big","role":"user","content":"{text}"}},{}]{extra}}}"#,
        vec![reference; refs].join(",")
    )
}

/// Issue 52, item 2: one 1 MiB message referenced 150 times asks for
/// 150 MiB once resolved. Before the bound the gateway built it (589 to
/// 1,229 MiB, kept) and answered 502; now the resolution stops at the
/// reference that passes the model's window: a 400
/// `context_length_exceeded` naming `input`, on `POST /v1/responses`, on
/// compaction and on a WebSocket turn, with the gateway's memory flat. A
/// fan-out within the window is served.
#[tokio::test]
async fn item_references_are_bounded_once_resolved() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let ordinary = json!({"model": "base", "input": "hi"});
    let before = baseline_mib(&client, pid, "/responses", ordinary).await;

    let big = "x".repeat(1 << 20);
    let body = fan_out(&big, 150, "");
    assert!(body.len() < 1_100_000, "a 1 MB body");
    let started = std::time::Instant::now();
    let (c, p) = ("context_length_exceeded", "input");
    let r = post(&client, "/responses", body.clone()).await;
    let after_one = rss_mib(pid);
    println!(
        "150 references to a 1 MiB message: {} in {:?}; gateway {before} MiB before, {after_one} after",
        r.status,
        started.elapsed()
    );
    let e = assert_error(&r, 400, c);
    assert_eq!(
        (&e["param"], &e["type"]),
        (&json!(p), &json!("invalid_request_error"))
    );
    refused(&client, "/responses/compact", body.clone(), c, p).await;
    let mut ws = harness::websocket::connect(&stack.gateway.base_url(), stack.gateway.api_key())
        .await
        .expect("connects");
    let mut turn: Value = serde_json::from_str(&body).unwrap();
    turn["type"] = "response.create".into();
    ws.send_text(&turn.to_string()).await.unwrap();
    let events = ws.reply().await.unwrap();
    assert_eq!(events[0]["type"], "error", "{events:?}");
    assert_eq!(events[0]["status"], 400, "{events:?}");
    assert_eq!(events[0]["error"]["code"], c, "{events:?}");
    assert_eq!(events[0]["error"]["param"], p, "{events:?}");
    // The stored chain's text counts too: a response that continues a
    // 1 MiB conversation with 1 MiB more is over the window.
    let first = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": big, "max_output_tokens": 4}),
        )
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{first}");
    let prev = first.json()["id"].as_str().unwrap().to_owned();
    let chained = json!({"model": "base", "input": big, "previous_response_id": prev});
    refused(&client, "/responses", chained.to_string(), c, p).await;
    let elapsed = started.elapsed();

    let after = rss_mib(pid);
    let peak = procfs::peak_rss_kib(pid).unwrap() / MIB;
    println!(
        "150 references to a 1 MiB message: 400 three times in {elapsed:?}; gateway resident \
         memory {before} MiB before, {after} after (peak {peak} MiB)"
    );
    assert!(
        after < before + 64,
        "resident memory grew from {before} to {after} MiB"
    );

    // Within the window a fan-out is served, not refused.
    let body = fan_out(&"y".repeat(20 << 10), 10, r#","max_output_tokens":4"#);
    let r = post(&client, "/responses", body).await;
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let items = client
        .get(&format!("/responses/{id}/input_items?limit=100"))
        .await
        .unwrap();
    assert_eq!(
        items.json()["data"].as_array().unwrap().len(),
        11,
        "{items}"
    );
}

/// Issue 52, item 7: the cap counts what a response holds once its run
/// ends, not only its input. Before, an org capped at 200 KB held 25.8 MB
/// (long outputs, background runs' event logs) before an input was
/// refused. An admitted run may end past the cap; the next stored create
/// is then refused (403 `storage_quota_exceeded`), an unstored one is
/// still served, and a delete gives back all the response held.
async fn ended_runs_count_against_the_cap(redis: bool) {
    let (_stack, capped, _free) = quota_stack(60_000, redis);
    let small = json!({"model": "base", "input": "hi", "max_output_tokens": 4});
    let stored_create = |client: &Client, body: Value| {
        let client = client.clone();
        async move { client.post_json("/responses", &body).await.unwrap() }
    };
    // A background run whose event log (1,500 deltas) outgrows the cap.
    let body = json!({"model": "base", "input": "go synthetic:reply_tokens=1500",
                      "background": true, "max_output_tokens": 2000});
    let r = stored_create(&capped, body).await;
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let within = std::time::Duration::from_secs(60);
    let done = harness::responses::wait_for_status(&capped, &id, &["completed"], within).await;
    assert_eq!(done["status"], "completed", "{done}");
    let refused = stored_create(&capped, small.clone()).await;
    assert_error(&refused, 403, "storage_quota_exceeded");
    let mut unstored = small.clone();
    unstored["store"] = false.into();
    let r = stored_create(&capped, unstored).await;
    assert_eq!(r.status, 200, "{r}");
    // The delete gives back the log with the rest.
    let r = capped.delete(&format!("/responses/{id}")).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = stored_create(&capped, small.clone()).await;
    assert_eq!(r.status, 200, "{r}");
    let first = r.json()["id"].as_str().unwrap().to_owned();

    // A foreground reply's output counts the same.
    let body = json!({"model": "base", "input": "go synthetic:reply_tokens=15000",
                      "max_output_tokens": 16000});
    let r = stored_create(&capped, body).await;
    assert_eq!(r.status, 200, "{r}");
    let output = r.json()["output"].to_string().len();
    assert!(output > 60_000, "an output of {output} bytes");
    let refused = stored_create(&capped, small.clone()).await;
    assert_error(&refused, 403, "storage_quota_exceeded");
    let r = capped.delete(&format!("/responses/{first}")).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let refused = stored_create(&capped, small).await;
    assert_error(&refused, 403, "storage_quota_exceeded");
}

#[tokio::test]
async fn ended_runs_count_against_the_cap_in_process() {
    ended_runs_count_against_the_cap(false).await;
}

#[tokio::test]
async fn ended_runs_count_against_the_cap_on_redis() {
    ended_runs_count_against_the_cap(true).await;
}

/// Issue 52, item 4: replies to messages sent while a response is quiet
/// (error events, pongs) wait for its next delivery; before the bound,
/// 7.6 MiB of tiny messages grew the gateway by 237 MiB. Now past 16 KiB
/// of waiting replies the gateway stops reading: the client's messages
/// wait in its own socket, and the gateway stays small.
#[tokio::test]
async fn websocket_replies_while_a_response_waits_stay_bounded() {
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::MaybeTlsStream;

    let stack = Stack::single(WorkerOpts::default());
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let (base, key) = (stack.gateway.base_url(), stack.gateway.api_key().to_owned());
    let (mut ws, _) = warm_websocket(&base, &key).await;
    let before = rss_mib(pid);

    // A response that stays quiet (the worker sends nothing).
    let quiet = json!({"type": "response.create", "model": "base",
                       "input": "wait synthetic:hang", "store": false});
    ws.send_json(&quiet).await.unwrap();
    // Then 16 MiB of 8-byte messages (`{}`, each worth a ~170-byte error
    // event), masked with a zero key, straight onto the socket.
    let frame: [u8; 8] = [0x81, 0x82, 0, 0, 0, 0, b'{', b'}'];
    let chunk: Vec<u8> = frame.repeat(8192);
    let MaybeTlsStream::Plain(socket) = ws.ws.get_mut() else {
        panic!("a plain socket");
    };
    let mut sent = 0usize;
    let flood = async {
        while sent < 16 << 20 {
            socket.write_all(&chunk).await.unwrap();
            sent += chunk.len();
        }
    };
    // Past the bound the writes block: the flood ends at the deadline.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(8), flood).await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let after = rss_mib(pid);
    println!(
        "gateway resident memory: {before} MiB before, {after} MiB after {} KiB of messages \
         sent while a response waited",
        sent / 1024
    );
    assert!(
        sent >= 64 * 1024,
        "the flood reached the gateway: {sent} bytes"
    );
    assert!(
        after < before + 40,
        "resident memory grew from {before} to {after} MiB on {sent} bytes of messages"
    );
    drop(ws);

    // Still serving, on a new connection.
    warm_websocket(&base, &key).await;
}

/// Issue 52, item 11: what an idle connection holds in the gateway,
/// measured as `loadgen --idle-streams` / `--idle-websockets` do
/// (`harness::idle`): the growth of its resident memory while N connections
/// open, per connection. Before: 49–55 KiB per idle stream (31 KiB on
/// 2026-11-23) and 102–117 KiB per idle WebSocket.
const IDLE_CONNECTIONS: usize = 1000;
/// The bounds `docs/process-contract.md` states.
const IDLE_STREAM_KIB: f64 = 32.0;
const IDLE_WEBSOCKET_KIB: f64 = 48.0;

/// Checks that every one of `IDLE_CONNECTIONS` opened and that each holds
/// at most `bound` KiB.
fn assert_idle_cost<T>(
    what: &str,
    cost: &harness::idle::Cost,
    held: &harness::idle::Held<T>,
    bound: f64,
) {
    let each = cost.kib_per_connection();
    println!(
        "{} {what}: {} -> {} KiB, {each:.1} KiB each",
        cost.held, cost.rss_before_kib, cost.rss_with_kib
    );
    assert_eq!(
        cost.held, IDLE_CONNECTIONS,
        "every one opened: {:?}",
        held.failures
    );
    assert!(
        each <= bound,
        "one of {} {what} holds {each:.1} KiB of the gateway's memory (bound {bound})",
        cost.held
    );
}

/// Streams waiting on their worker after one token, each on its own
/// connection.
#[tokio::test]
#[ignore = "issue 52.11: an idle stream still holds about 47 KiB (bound 32); docs/benchmarks/costs.md says where it goes"]
async fn an_idle_stream_holds_at_most_32_kib() {
    use harness::idle;
    let stack = Stack::single(WorkerOpts {
        max_concurrency: Some(IDLE_CONNECTIONS as u32 + 64),
        ..WorkerOpts::default()
    });
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let (base, key) = (stack.gateway.base_url(), stack.gateway.api_key().to_owned());
    let url = format!("{base}/chat/completions");
    // The baseline has the gateway's first-request allocations (a stream
    // that ends: runtimes, the worker connection, metric series).
    let client = stack.client();
    for _ in 0..20 {
        let r = post(&client, "/chat/completions", chat(r#""stream":true"#)).await;
        assert_eq!(r.status, 200, "{r}");
    }
    let opening = async {
        idle::streams(&url, &key, "base", IDLE_CONNECTIONS, 32)
            .await
            .unwrap()
    };
    let (cost, held) = idle::measure(pid, opening).await.unwrap();
    assert_idle_cost("idle streams", &cost, &held, IDLE_STREAM_KIB);
    drop(held);
    // Still serving once they are gone.
    let r = post(&client, "/chat/completions", chat(r#""stream":false"#)).await;
    assert_eq!(r.status, 200, "{r}");
}

/// Upgraded `GET /v1/responses` connections on which nothing was sent;
/// then one of them serves a response and idles again.
#[tokio::test]
async fn an_idle_websocket_holds_at_most_48_kib() {
    use harness::idle;
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml("[websocket]\nmax_connections_per_key = 0\n")
        .start()
        .expect("stack starts");
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let (base, key) = (stack.gateway.base_url(), stack.gateway.api_key().to_owned());
    let keys = std::slice::from_ref(&key);
    // The baseline has a connection's first allocations, a response's too.
    let (ws, warm) = warm_websocket(&base, &key).await;
    drop(ws);
    drop(idle::websockets(&base, keys, 4, 4).await);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let opening = idle::websockets(&base, keys, IDLE_CONNECTIONS, 32);
    let (cost, mut held) = idle::measure(pid, opening).await.unwrap();
    assert_idle_cost("idle WebSockets", &cost, &held, IDLE_WEBSOCKET_KIB);
    // Each still answers, twice.
    for _ in 0..2 {
        let events = held.open[IDLE_CONNECTIONS / 2].create(&warm).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
    }
}
