//! `Idempotency-Key` on the two generation creates, end to end: real
//! gateways (embedded store, the test Redis, two replicas on one Redis) in
//! front of real synthetic workers. That a retry ran nothing is read from
//! the worker's own counters (`Counters.started`, over gRPC `Info`); that
//! it was charged once, from the usage the operator CLI reads in Redis.

use harness::{
    assert_error, bounded, json, responses, Client, Gateway, GatewayOpts, RedisScope, Reply,
    SseFrame, Stack, TestKey, Value, Worker, WorkerOpts,
};
use reqwest::Method;
use std::time::Duration;

fn stack(redis: bool) -> Stack {
    let mut b = Stack::builder().models(&["base"]);
    if redis {
        b = b.redis();
    }
    b.start().expect("stack starts")
}

async fn post(client: &Client, path: &str, key: &str, body: &Value) -> Reply {
    client
        .send(
            client
                .request(Method::POST, path)
                .header("Idempotency-Key", key)
                .json(body),
        )
        .await
        .expect("post")
}

async fn stream(
    client: &Client,
    path: &str,
    key: &str,
    body: &Value,
) -> (Option<String>, Vec<SseFrame>) {
    let s = client
        .open_stream(
            client
                .request(Method::POST, path)
                .header("Idempotency-Key", key)
                .json(body),
        )
        .await
        .expect("open stream");
    assert_eq!(s.status, 200);
    let replayed = s.header("idempotent-replayed").map(str::to_owned);
    (replayed, s.collect().await.expect("frames"))
}

async fn started(worker: &Worker) -> u64 {
    worker.counters().await.expect("worker counters").started
}

/// A chat stream's chunks (every frame but `[DONE]`, which must end it).
fn chunks(frames: &[SseFrame]) -> Vec<Value> {
    assert!(
        frames.last().is_some_and(SseFrame::is_done),
        "[DONE] ends it"
    );
    frames[..frames.len() - 1]
        .iter()
        .map(SseFrame::json)
        .collect()
}

fn chat_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// The object a Responses stream's terminal event carries.
fn terminal(frames: &[SseFrame]) -> Value {
    let last = frames.last().expect("events").json();
    assert_eq!(last["type"], "response.completed", "{last}");
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.json()["sequence_number"], i as u64, "{:?}", f.raw);
    }
    last["response"].clone()
}

/// Every case of "the same key, org and body again": one generation, the
/// first's id and body, marked replayed.
async fn same_key_replays_the_first_outcome(stack: &Stack) {
    let client = stack.client();
    let worker = stack.worker("base");
    let key = |case: &str| format!("{case}-{}", harness::random_hex(8));
    let before = started(worker).await;

    // Chat, not streamed: the body byte for byte.
    let k = key("chat");
    let body = json!({"model": "base", "messages": [{"role": "user", "content": "synthetic:reply_tokens=12 hello"}]});
    let first = post(&client, "/chat/completions", &k, &body).await;
    assert_eq!(first.status, 200, "{first}");
    assert_eq!(first.header("idempotent-replayed"), None);
    let again = post(&client, "/chat/completions", &k, &body).await;
    assert_eq!(again.status, 200, "{again}");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    // The same body in another key order and spacing is the same request.
    let reordered = r#"{ "messages": [{"content": "synthetic:reply_tokens=12 hello", "role": "user"}], "model": "base" }"#;
    let again = client
        .send(
            client
                .request(Method::POST, "/chat/completions")
                .header("Idempotency-Key", &k)
                .header("content-type", "application/json")
                .body(reordered),
        )
        .await
        .unwrap();
    assert_eq!((again.status, &again.body), (200, &first.body), "{again}");

    // Chat streamed, with usage: folded into one content chunk.
    let k = key("chat-stream");
    let body = json!({"model": "base", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "synthetic:reply_tokens=12 stream"}]});
    let (replayed, frames) = stream(&client, "/chat/completions", &k, &body).await;
    assert_eq!(replayed, None);
    let first = chunks(&frames);
    let (replayed, frames) = stream(&client, "/chat/completions", &k, &body).await;
    assert_eq!(replayed.as_deref(), Some("true"));
    let again = chunks(&frames);
    assert_eq!(chat_text(&again), chat_text(&first));
    assert!(!chat_text(&first).is_empty());
    assert_eq!(again[0]["id"], first[0]["id"]);
    assert_eq!(
        again.last().unwrap()["usage"],
        first.last().unwrap()["usage"]
    );
    let finish = |c: &[Value]| {
        c.iter()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str().map(str::to_owned))
    };
    assert_eq!(finish(&again), finish(&first));
    assert!(again.len() <= 4, "folded: {again:?}");

    // Responses, stored, not streamed: what a retrieve gives.
    let k = key("resp");
    let body = json!({"model": "base", "input": "synthetic:reply_tokens=10 stored"});
    let first = post(&client, "/responses", &k, &body).await;
    assert_eq!(first.status, 200, "{first}");
    let again = post(&client, "/responses", &k, &body).await;
    assert_eq!(again.status, 200, "{again}");
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let id = responses::id(&first.json());
    let retrieved = client.get(&format!("/responses/{id}")).await.unwrap();
    assert_eq!(again.json(), retrieved.json());
    assert_eq!(again.json(), first.json());

    // Responses, not stored, streamed: the same object at the end of a
    // folded stream.
    for store in [false, true] {
        let k = key("resp-stream");
        let body = json!({"model": "base", "input": "synthetic:reply_tokens=10 streamed",
            "stream": true, "store": store});
        let (_, frames) = stream(&client, "/responses", &k, &body).await;
        let first = terminal(&frames);
        let (replayed, frames) = stream(&client, "/responses", &k, &body).await;
        assert_eq!(replayed.as_deref(), Some("true"));
        let again = terminal(&frames);
        assert_eq!(again["id"], first["id"], "store {store}");
        assert_eq!(again["output"], first["output"], "store {store}");
        assert_eq!(again["usage"], first["usage"], "store {store}");
        assert_eq!(
            responses::streamed_text(&frames),
            responses::output_text(&first),
            "store {store}"
        );
    }

    // A background create: the same run, by id.
    let k = key("bg");
    let body =
        json!({"model": "base", "input": "synthetic:reply_tokens=10 later", "background": true});
    let first = post(&client, "/responses", &k, &body).await;
    assert_eq!(first.status, 200, "{first}");
    let id = responses::id(&first.json());
    let again = post(&client, "/responses", &k, &body).await;
    assert_eq!(responses::id(&again.json()), id, "{again}");
    let done =
        responses::wait_for_status(&client, &id, &["completed"], Duration::from_secs(20)).await;
    assert_eq!(done["status"], "completed", "{done}");
    let again = post(&client, "/responses", &k, &body).await;
    assert_eq!(
        again.json(),
        done,
        "a later retry sees the run as a retrieve does"
    );

    // Six creates ran (chat, chat stream, stored, two streams,
    // background); their retries ran nothing.
    let ran = started(worker).await - before;
    assert_eq!(ran, 6, "one generation per key");
}

#[tokio::test]
async fn same_key_replays_the_first_outcome_with_the_embedded_store() {
    bounded(120, async {
        same_key_replays_the_first_outcome(&stack(false)).await;
    })
    .await;
}

#[tokio::test]
async fn same_key_replays_the_first_outcome_on_redis_and_charges_once() {
    bounded(120, async {
        let stack = stack(true);
        same_key_replays_the_first_outcome(&stack).await;
        // Billed once per key: the usage in Redis counts six requests.
        let mut requests = 0;
        for _ in 0..100 {
            let out = stack.cli(&["usage", "--org", "org-test", "--json"]);
            requests = out
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|r| r["requests"].as_u64())
                .sum::<u64>();
            if requests >= 6 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let out = stack.cli(&["usage", "--org", "org-test", "--json"]);
        let settled: u64 = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|r| r["requests"].as_u64())
            .sum();
        assert_eq!((requests, settled), (6, 6), "{out}");
    })
    .await;
}

/// A duplicate while the first runs is a 409 with `retry-after`; once the
/// first has finished the retry gets its outcome.
async fn a_duplicate_while_running_is_told_to_wait(
    first_on: &Client,
    again_on: &Client,
    worker: &Worker,
) {
    let before = started(worker).await;
    let k = format!("slow-{}", harness::random_hex(8));
    let body =
        json!({"model": "base", "input": "synthetic:reply_tokens=20 synthetic:slow_ms=100 slow"});
    let first = {
        let (client, k, body) = (first_on.clone(), k.clone(), body.clone());
        tokio::spawn(async move { post(&client, "/responses", &k, &body).await })
    };
    harness::wait_until(
        "the first to start",
        Duration::from_secs(10),
        || async move { started(worker).await > before },
    )
    .await;
    let busy = post(again_on, "/responses", &k, &body).await;
    let e = assert_error(&busy, 409, "idempotency_key_in_use");
    assert!(e["param"].is_null(), "{e}");
    let wait: u64 = busy
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("retry-after");
    assert!((1..=10).contains(&wait), "{busy:?}");
    // Another body under the same key, even while it runs: 422.
    let other = json!({"model": "base", "input": "something else"});
    assert_error(
        &post(again_on, "/responses", &k, &other).await,
        422,
        "idempotency_key_reused",
    );

    let first = first.await.unwrap();
    assert_eq!(first.status, 200, "{first}");
    let again = post(again_on, "/responses", &k, &body).await;
    assert_eq!(again.status, 200, "{again}");
    assert_eq!(responses::id(&again.json()), responses::id(&first.json()));
    assert_eq!(started(worker).await - before, 1);
}

#[tokio::test]
async fn a_duplicate_while_running_is_409_with_retry_after() {
    bounded(60, async {
        for redis in [false, true] {
            let stack = stack(redis);
            let client = stack.client();
            a_duplicate_while_running_is_told_to_wait(&client, &client, stack.worker("base")).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_reused_or_invalid_key_is_refused_and_another_org_has_its_own_keys() {
    bounded(60, async {
        let other = TestKey::random("org-other");
        let mut gw = GatewayOpts::default();
        gw.keys.push(other.clone());
        let stack = Stack::builder()
            .models(&["base"])
            .gateway_opts(gw)
            .start()
            .unwrap();
        let client = stack.client();
        let k = format!("k-{}", harness::random_hex(8));
        let body = json!({"model": "base", "messages": [{"role": "user", "content": "one"}]});
        assert_eq!(
            post(&client, "/chat/completions", &k, &body).await.status,
            200
        );

        // Another body, or the other endpoint, under the same key: 422.
        let changed = json!({"model": "base", "messages": [{"role": "user", "content": "two"}]});
        let e = assert_error(
            &post(&client, "/chat/completions", &k, &changed).await,
            422,
            "idempotency_key_reused",
        );
        assert!(e["param"].is_null(), "{e}");
        let responses_body = json!({"model": "base", "input": "one"});
        assert_error(
            &post(&client, "/responses", &k, &responses_body).await,
            422,
            "idempotency_key_reused",
        );

        // Another organisation's same key is its own.
        let theirs = client.with_key(Some(&other.key));
        let r = post(&theirs, "/chat/completions", &k, &changed).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("idempotent-replayed"), None);

        // Invalid keys: 400 naming the header.
        let long = "x".repeat(256);
        for bad in ["", long.as_str(), "has space", "tab\tkey"] {
            let r = client
                .send(
                    client
                        .request(Method::POST, "/chat/completions")
                        .header("Idempotency-Key", bad)
                        .json(&body),
                )
                .await
                .unwrap();
            let e = assert_error(&r, 400, "invalid_value");
            assert_eq!(e["param"], "Idempotency-Key", "{bad:?}: {e}");
        }
        let r = client
            .send(
                client
                    .request(Method::POST, "/chat/completions")
                    .header("Idempotency-Key", "a")
                    .header("Idempotency-Key", "b")
                    .json(&body),
            )
            .await
            .unwrap();
        assert_error(&r, 400, "duplicate_header");
        // 255 visible characters are a key.
        let r = post(&client, "/chat/completions", &"y".repeat(255), &body).await;
        assert_eq!(r.status, 200, "{r}");
    })
    .await;
}

#[tokio::test]
async fn a_first_request_that_failed_does_not_pin_the_key() {
    bounded(60, async {
        let stack = stack(false);
        let client = stack.client();
        let worker = stack.worker("base");
        let k = format!("fail-{}", harness::random_hex(8));

        // Refused by validation: nothing was claimed, the fixed body runs.
        let bad = json!({"model": "base", "temperature": 5, "input": "x"});
        let r = post(&client, "/responses", &k, &bad).await;
        assert_eq!(r.status, 400, "{r}");
        let fixed = json!({"model": "base", "temperature": 1, "input": "x"});
        let r = post(&client, "/responses", &k, &fixed).await;
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("idempotent-replayed"), None);
        let k = format!("fail-{}", harness::random_hex(8));

        // Failed on the worker (a 502 after some tokens): the retry runs again.
        let before = started(worker).await;
        let failing = json!({"model": "base", "input": "synthetic:fail_after=2 x"});
        for _ in 0..2 {
            let r = post(&client, "/responses", &k, &failing).await;
            assert!(r.status >= 500, "{r}");
        }
        assert_eq!(started(worker).await - before, 2, "each retry of a failure runs");

        // A client that left mid-generation: nothing was delivered, so the
        // retry runs (and is then pinned).
        let k = format!("left-{}", harness::random_hex(8));
        let body = json!({"model": "base", "input": "synthetic:reply_tokens=40 synthetic:slow_ms=50 left"});
        let before = started(worker).await;
        let cancelled_before = worker.counters().await.expect("counters").cancelled;
        let cut = client
            .request(Method::POST, "/responses")
            .header("Idempotency-Key", &k)
            .json(&body)
            .timeout(Duration::from_millis(500))
            .send()
            .await;
        assert!(cut.is_err(), "the client gave up first");
        harness::wait_until("the first to be cancelled", Duration::from_secs(10), || async move {
            worker.counters().await.unwrap().cancelled > cancelled_before
        })
        .await;
        // Until the gateway has ended the first run its key is held: a
        // retry meanwhile is told so (409), and runs once it is free.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let r = loop {
            let r = post(&client, "/responses", &k, &body).await;
            if r.status != 409 || std::time::Instant::now() > deadline {
                break r;
            }
            assert_eq!(r.json()["error"]["code"], "idempotency_key_in_use", "{r}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("idempotent-replayed"), None);
        let r = post(&client, "/responses", &k, &body).await;
        assert_eq!(r.header("idempotent-replayed"), Some("true"), "{r}");
        assert_eq!(started(worker).await - before, 2);
    })
    .await;
}

#[tokio::test]
async fn two_replicas_on_one_redis_share_the_key() {
    bounded(90, async {
        let redis = RedisScope::new().expect("the test Redis");
        let worker = Worker::start("base", WorkerOpts::default()).expect("worker");
        let opts = |keys: Option<Vec<TestKey>>| {
            let mut o = GatewayOpts {
                redis: Some((redis.url().to_owned(), redis.prefix().to_owned())),
                ..GatewayOpts::default()
            };
            if let Some(keys) = keys {
                o.keys = keys;
            }
            o.workers
                .insert("base".into(), vec![worker.addr().to_string()]);
            o
        };
        let a = Gateway::start(opts(None)).expect("replica a");
        let b = Gateway::start(opts(Some(a.keys().to_vec()))).expect("replica b");
        let (on_a, on_b) = (a.client(), b.client());

        let before = started(&worker).await;
        let k = format!("shared-{}", harness::random_hex(8));
        let body = json!({"model": "base", "messages": [{"role": "user", "content": "synthetic:reply_tokens=8 shared"}]});
        let first = post(&on_a, "/chat/completions", &k, &body).await;
        assert_eq!(first.status, 200, "{first}");
        let again = post(&on_b, "/chat/completions", &k, &body).await;
        assert_eq!(again.status, 200, "{again}");
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);
        assert_eq!(started(&worker).await - before, 1);

        // Racing replicas: one runs, the other is told to wait.
        a_duplicate_while_running_is_told_to_wait(&on_a, &on_b, &worker).await;
        drop((a, b));
    })
    .await;
}
