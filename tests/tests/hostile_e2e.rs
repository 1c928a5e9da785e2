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
    // One ordinary request first, so the baseline has its allocations.
    let r = client
        .post_json(
            "/chat/completions",
            &json!({"model":"base","messages":[{"role":"user","content":"hi"}],
                    "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let before = rss_mib(pid);

    // 1a. One 16 MiB body whose tool `parameters` holds 8.3M zeros.
    let zeros = chat(&format!(
        r#""tools":[{{"type":"function","function":{{"name":"f","parameters":{{"type":"object","x":[{}0]}}}}}}]"#,
        "0,".repeat(8_300_000)
    ));
    assert!(zeros.len() > 15 << 20 && zeros.len() < 16 << 20);
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

/// Issue 52, item 4: replies to messages sent while a response is quiet
/// (error events, pongs) wait for its next delivery; before the bound,
/// 7.6 MiB of tiny messages grew the gateway by 237 MiB. Now past 16 KiB
/// of waiting replies the gateway stops reading: the client's messages
/// wait in its own socket, and the gateway stays small.
#[tokio::test]
async fn websocket_replies_while_a_response_waits_stay_bounded() {
    use harness::websocket;
    use tokio::io::AsyncWriteExt;
    use tokio_tungstenite::MaybeTlsStream;

    let stack = Stack::single(WorkerOpts::default());
    let pid = stack.gateway.pid().expect("the gateway's pid");
    let (base, key) = (stack.gateway.base_url(), stack.gateway.api_key().to_owned());
    let mut ws = websocket::connect(&base, &key).await.unwrap();
    let warm = json!({"model": "base", "input": "hi synthetic:reply_tokens=2", "store": false,
                      "max_output_tokens": 16});
    let events = ws.create(&warm).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
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
    let mut ws = websocket::connect(&base, &key).await.unwrap();
    let events = ws.create(&warm).await.unwrap();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
}
