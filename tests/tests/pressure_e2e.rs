//! Under pressure, on the simulator: a client that leaves takes its work
//! with it, whatever it asked for (a non-streamed body, the SDKs' default;
//! a stored response; a stream still queued), and is billed for what ran.
//! Asserted from the worker's own counters and load, the gateway's usage
//! metrics and the stored state read from Redis.

use harness::{
    chat_body, json, key_on_plan, prometheus, wait_until, GatewayOpts, Stack, Value, WorkerOpts,
};
use reqwest::Method;
use std::time::{Duration, Instant};

/// 100 tokens a second: a 3,000-token reply runs for 30 s.
fn slow_worker() -> WorkerOpts {
    WorkerOpts::paced(0, 100)
}

/// Sends `body` to `path` and gives up after `patience`, as an SDK with a
/// short timeout does. Returns when the client dropped the connection.
async fn leave_after(stack: &Stack, path: &str, body: &Value, patience: Duration) {
    let sent = stack
        .client()
        .request(Method::POST, path)
        .json(body)
        .timeout(patience)
        .send()
        .await;
    assert!(
        sent.is_err(),
        "the reply outlasts the client: {:?}",
        sent.map(|r| r.status())
    );
}

async fn output_tokens_billed(stack: &Stack) -> f64 {
    let (status, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    assert_eq!(status, 200);
    prometheus::sample(
        &page,
        "gateway_usage_tokens_total",
        &["gen_ai_token_type=\"output\""],
    )
}

#[tokio::test]
async fn a_non_streamed_chat_whose_client_leaves_stops_within_a_second_and_bills_what_ran() {
    let stack = Stack::single(slow_worker());
    let worker = stack.worker("base");
    let body = chat_body("base", "Go on. synthetic:reply_tokens=3000");
    leave_after(
        &stack,
        "/chat/completions",
        &body,
        Duration::from_millis(2500),
    )
    .await;
    let left = Instant::now();
    let c = worker
        .wait_counters(Duration::from_secs(5), |c| c.cancelled == 1)
        .await
        .expect("the worker cancels the generation");
    let stopped = left.elapsed();
    assert!(
        stopped < Duration::from_millis(1500),
        "cancelled {stopped:?} after the client left"
    );
    assert_eq!((c.started, c.completed), (1, 0), "{c:?}");
    assert!(c.tokens_generated < 600, "stopped early: {c:?}");
    assert_eq!(worker.load().await.expect("load").running, 0);
    // Nothing goes on generating after the cancel.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = worker.counters().await.expect("counters");
    assert_eq!(later.tokens_generated, c.tokens_generated, "{later:?}");
    // Billed for every token the worker generated before it stopped (the
    // batch it still held included), not only for the batches relayed (its
    // first token, then one a second), and not for 3,000 tokens.
    assert!(c.tokens_generated > 100, "{c:?}");
    billed_reconciles(&stack, c.tokens_generated).await;
}

/// A stream whose client leaves is billed what its worker generated too:
/// the events in flight (the worker's buffer, the connection's window)
/// count, and the worker's counter says the same number.
#[tokio::test]
async fn a_stream_whose_client_leaves_is_billed_what_its_worker_generated() {
    let stack = Stack::single(slow_worker());
    let worker = stack.worker("base");
    let mut body = chat_body("base", "Go on. synthetic:reply_tokens=3000");
    body["stream"] = json!(true);
    let response = stack
        .client()
        .request(Method::POST, "/chat/completions")
        .json(&body)
        .send()
        .await
        .expect("stream opens");
    assert_eq!(response.status(), 200);
    let mut response = response;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        if response.chunk().await.expect("chunk").is_none() {
            panic!("the stream ended before the client left");
        }
    }
    drop(response);
    let c = worker
        .wait_counters(Duration::from_secs(5), |c| c.cancelled == 1)
        .await
        .expect("the worker cancels the generation");
    assert!(c.tokens_generated > 50, "{c:?}");
    billed_reconciles(&stack, c.tokens_generated).await;
}

/// Waits for the reservation to settle, then asserts the output billed is
/// what the worker says it generated.
async fn billed_reconciles(stack: &Stack, generated: u64) {
    wait_until(
        "the reservation settles",
        Duration::from_secs(5),
        || async { output_tokens_billed(stack).await > 0.0 },
    )
    .await;
    let billed = output_tokens_billed(stack).await;
    assert_eq!(
        billed, generated as f64,
        "billed output reconciles with the worker's generated tokens"
    );
}

#[tokio::test]
async fn a_stored_response_whose_client_leaves_is_kept_cancelled_with_its_partial_output() {
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(slow_worker())
        .redis()
        .start()
        .expect("stack");
    let worker = stack.worker("base");
    let body = json!({"model": "base", "input": "Go on. synthetic:reply_tokens=3000"});
    leave_after(&stack, "/responses", &body, Duration::from_millis(2500)).await;
    worker
        .wait_counters(Duration::from_secs(3), |c| c.cancelled == 1)
        .await
        .expect("the worker cancels the generation");
    // The client never learned the id: read the store directly.
    let redis = stack.redis.as_ref().expect("redis");
    let mut conn = redis.connection().expect("redis");
    let mut stored = None;
    wait_until("the response's final state", Duration::from_secs(5), || {
        let keys = redis.keys().expect("keys");
        let found = keys
            .iter()
            .find(|k| k.contains("resp:{") && k.ends_with('}'))
            .and_then(|k| {
                redis::cmd("HGET")
                    .arg(k)
                    .arg("obj")
                    .query::<Option<String>>(&mut conn)
                    .ok()
                    .flatten()
            })
            .and_then(|o| serde_json::from_str::<Value>(&o).ok())
            .filter(|o| o["status"] != "in_progress");
        let done = found.is_some();
        stored = found;
        async move { done }
    })
    .await;
    let stored = stored.expect("stored");
    assert_eq!(stored["status"], "cancelled", "{stored}");
    let text = harness::responses::output_text(&stored);
    assert!(!text.is_empty(), "what was generated is kept: {stored}");
    let c = worker.counters().await.expect("counters");
    assert_eq!(c.completed, 0, "{c:?}");
}

#[tokio::test]
async fn a_stream_whose_client_leaves_while_queued_never_runs() {
    let stack = Stack::single(WorkerOpts {
        max_concurrency: Some(1),
        ..slow_worker()
    });
    let worker = stack.worker("base");
    let client = stack.client();
    let mut body = chat_body("base", "Go on. synthetic:reply_tokens=3000");
    body["stream"] = json!(true);
    let mut first = client
        .stream("/chat/completions", &body)
        .await
        .expect("stream");
    first.next_frame().await.expect("a frame");
    // The second waits behind the first in the worker's queue; its client
    // gives up before it gets a slot.
    let queued = tokio::time::timeout(
        Duration::from_millis(1500),
        client.stream("/chat/completions", &body),
    )
    .await;
    assert!(queued.is_err(), "nothing answers a queued stream");
    wait_until(
        "the worker's queue to empty",
        Duration::from_secs(1),
        || async { worker.load().await.map(|l| l.queued).unwrap_or(1) == 0 },
    )
    .await;
    drop(first);
    worker
        .wait_counters(Duration::from_secs(3), |c| c.cancelled == 1)
        .await
        .expect("the first is cancelled");
    // Its slot free, the worker would now start the queued one had it kept it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let c = worker.counters().await.expect("counters");
    assert_eq!(c.started, 1, "the queued request never ran: {c:?}");
    assert_eq!(worker.load().await.expect("load").running, 0);
}

#[tokio::test]
async fn a_draining_gateway_does_not_wait_for_work_whose_client_left() {
    let mut stack = Stack::builder()
        .models(&["base"])
        .worker_opts(slow_worker())
        .gateway_opts(GatewayOpts {
            grace_period_seconds: Some(20),
            ..GatewayOpts::default()
        })
        .start()
        .expect("stack");
    let body = chat_body("base", "Go on. synthetic:reply_tokens=3000");
    leave_after(
        &stack,
        "/chat/completions",
        &body,
        Duration::from_millis(1500),
    )
    .await;
    // Let the client's connection task close its socket (wait_exit below
    // blocks this runtime), as a client process that gave up would.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let signalled = Instant::now();
    stack.gateway.signal(libc::SIGTERM);
    let exit = stack.gateway.wait_exit(Duration::from_secs(8));
    assert!(
        exit.is_some(),
        "the gateway still drains abandoned work: {}",
        stack.gateway.log_tail()
    );
    assert!(signalled.elapsed() < Duration::from_secs(8));
    let c = stack.worker("base").counters().await.expect("counters");
    assert_eq!((c.cancelled, c.completed), (1, 0), "{c:?}");
}

#[tokio::test]
async fn unset_sampling_takes_the_models_defaults_and_the_response_reports_the_values_used() {
    let flags = ["--default-temperature", "0.2", "--default-top-p", "0.9"];
    let stack = Stack::single(WorkerOpts {
        extra_args: flags.iter().map(|f| f.to_string()).collect(),
        ..WorkerOpts::default()
    });
    let info = stack.worker("base").info().await.expect("info");
    let defaults = info.sampling_defaults.expect("reported");
    assert_eq!(
        (defaults.temperature, defaults.top_p),
        (Some(0.2), Some(0.9))
    );
    let client = stack.client();
    let create = |body: Value| {
        let client = client.clone();
        async move {
            let r = client.post_json("/responses", &body).await.expect("reply");
            assert_eq!(r.status, 200, "{r}");
            r.json()
        }
    };
    // The gateway learns the defaults from the worker's next report.
    wait_until(
        "the gateway to report the worker's defaults",
        Duration::from_secs(5),
        || async move {
            let o = create(json!({"model": "base", "input": "hi"})).await;
            o["temperature"] == 0.2 && o["top_p"] == 0.9
        },
    )
    .await;
    let o = create(json!({"model": "base", "input": "hi", "temperature": 0.7})).await;
    assert_eq!(
        (o["temperature"].clone(), o["top_p"].clone()),
        (json!(0.7), json!(0.9))
    );

    // Without defaults: the API's own values, as numbers, never null.
    let plain = Stack::single(WorkerOpts::default());
    let r = plain
        .client()
        .post_json("/responses", &json!({"model": "base", "input": "hi"}))
        .await
        .expect("reply");
    let o = r.json();
    assert_eq!(
        (o["temperature"].clone(), o["top_p"].clone()),
        (json!(1.0), json!(1.0)),
        "{o}"
    );
}

// ---- a fair share when a pool saturates ---------------------------------------

/// One `base` worker with one slot, decoding 100 tokens a second, behind a
/// gateway whose config adds `toml` (plans, keys, queue settings).
fn saturated_stack(toml: &str) -> Stack {
    Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts {
            max_concurrency: Some(1),
            ..slow_worker()
        })
        .gateway_opts(GatewayOpts {
            extra_toml: toml.to_owned(),
            ..GatewayOpts::default()
        })
        .start()
        .expect("stack")
}

/// Waits until the gateway has the worker's capacity (its first report).
async fn wait_for_capacity(stack: &Stack) {
    wait_until(
        "the gateway to know the pool's capacity",
        Duration::from_secs(5),
        // The admin listener may not answer yet: asked again.
        || async {
            stack
                .gateway
                .admin_get("/metrics")
                .await
                .is_ok_and(|(_, page)| page.contains("gateway_worker_load_ratio{model=\"base\"}"))
        },
    )
    .await;
}

#[tokio::test]
async fn a_saturated_pool_holds_requests_in_the_gateway_and_sheds_them_after_its_timeout() {
    let stack = saturated_stack("[models.base]\nqueue_timeout_ms = 800\n");
    wait_for_capacity(&stack).await;
    let worker = stack.worker("base");
    let client = stack.client();
    let mut body = chat_body("base", "Go on. synthetic:reply_tokens=3000");
    body["stream"] = json!(true);
    let mut busy = client
        .stream("/chat/completions", &body)
        .await
        .expect("stream");
    busy.next_frame().await.expect("a frame");

    let waited = Instant::now();
    let mut short = chat_body("base", "hi");
    short["max_tokens"] = json!(4);
    let shed = tokio::spawn({
        let client = client.clone();
        async move { client.post_json("/chat/completions", &short).await }
    });
    // It waits in the gateway, not in the worker's queue.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let load = worker.load().await.expect("load");
    assert_eq!((load.running, load.queued), (1, 0), "{load:?}");
    let (_, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    assert_eq!(
        prometheus::sample(
            &page,
            "gateway_queue_depth",
            &["model=\"base\"", "tier=\"default\""]
        ),
        1.0
    );
    let reply = shed.await.expect("task").expect("reply");
    let elapsed = waited.elapsed();
    let e = harness::assert_error(&reply, 503, "server_overloaded");
    assert!(reply.header("retry-after").is_some(), "{reply}");
    assert!(
        elapsed >= Duration::from_millis(750) && elapsed < Duration::from_secs(3),
        "shed after {elapsed:?}: {e}"
    );
    let (_, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    assert_eq!(
        prometheus::sample(
            &page,
            "gateway_queue_shed_total",
            &["reason=\"queue_timeout\""]
        ),
        1.0
    );
    assert_eq!(
        worker.counters().await.expect("counters").started,
        1,
        "never reached the worker"
    );
    drop(busy);
}

#[tokio::test]
async fn a_higher_tier_then_the_least_served_organisation_goes_first() {
    let (flood_key_toml, flood) = key_on_plan("org-batch", "batch");
    let (b_key_toml, interactive) = key_on_plan("org-b", "standard");
    let (p_key_toml, premium) = key_on_plan("org-p", "premium");
    let toml = format!(
        "{flood_key_toml}{b_key_toml}{p_key_toml}\
         [plans.batch]\nmax_service_tier = \"flex\"\n\
         [plans.standard]\n\
         [plans.premium]\nmax_service_tier = \"priority\"\n\
         [models.base]\nmax_preemptions = 0\n"
    );
    // The order of the queue alone: without preemption (preemption_e2e).
    let stack = saturated_stack(&toml);
    wait_for_capacity(&stack).await;
    let client = |key: &str| stack.client().with_key(Some(key));
    // 30 tokens at 100 a second: each request holds the one slot 0.3 s.
    let request = |tier: &str| {
        let mut b = chat_body("base", "Go on. synthetic:reply_tokens=30");
        b["service_tier"] = json!(tier);
        b
    };
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
    let send = |who: &str, key: &str, tier: &str| {
        let (c, body, who, tx) = (client(key), request(tier), who.to_owned(), done_tx.clone());
        tokio::spawn(async move {
            let r = c
                .post_json("/chat/completions", &body)
                .await
                .expect("reply");
            assert_eq!(r.status, 200, "{r}");
            let _ = tx.send((
                who,
                r.json()["service_tier"].as_str().unwrap_or("").to_owned(),
            ));
        })
    };
    // The batch org floods first (asking for priority: its plan says flex).
    let mut tasks = Vec::new();
    for i in 0..5 {
        tasks.push(send(&format!("batch{i}"), &flood, "priority"));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Then an interactive org at default, and a premium one at priority.
    tasks.push(send("interactive", &interactive, "auto"));
    tokio::time::sleep(Duration::from_millis(30)).await;
    tasks.push(send("premium", &premium, "priority"));
    for t in tasks {
        t.await.expect("task");
    }
    drop(done_tx);
    let mut order = Vec::new();
    while let Some((who, tier)) = done.recv().await {
        order.push(who.clone());
        let expected = match who.as_str() {
            "premium" => "priority",
            "interactive" => "default",
            _ => "flex",
        };
        assert_eq!(tier, expected, "{who} is served at its plan's tier");
    }
    // batch0 had the slot; then priority, then default, then the rest of
    // the flood in its own order.
    assert_eq!(
        order,
        [
            "batch0",
            "premium",
            "interactive",
            "batch1",
            "batch2",
            "batch3",
            "batch4"
        ],
        "order of completion"
    );
}

#[tokio::test]
async fn equal_organisations_backlogged_on_one_slot_take_turns() {
    let (a_toml, a) = key_on_plan("org-a", "standard");
    let (b_toml, b) = key_on_plan("org-b", "standard");
    let stack = saturated_stack(&format!("{a_toml}{b_toml}[plans.standard]\n"));
    wait_for_capacity(&stack).await;
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut tasks = Vec::new();
    // a sends all of its backlog first, then b: first come first served
    // would finish all of a's before any of b's.
    for (org, key) in [("a", &a), ("b", &b)] {
        for _ in 0..4 {
            let c = stack.client().with_key(Some(key));
            let tx = done_tx.clone();
            let org = org.to_owned();
            tasks.push(tokio::spawn(async move {
                // Half a second each: all eight wait before the first ends,
                // however slowly a loaded machine spawns them.
                let body = chat_body("base", "Go on. synthetic:reply_tokens=50");
                let r = c
                    .post_json("/chat/completions", &body)
                    .await
                    .expect("reply");
                assert_eq!(r.status, 200, "{r}");
                let _ = tx.send(org);
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    drop(done_tx);
    let mut order = String::new();
    while let Some(org) = done.recv().await {
        order.push_str(&org);
    }
    // a's first had the slot; from then on they alternate.
    assert_eq!(order, "abababab");
}

#[tokio::test]
async fn an_organisation_that_fills_the_queue_gives_up_its_newest_place_to_another() {
    let (a_toml, a) = key_on_plan("org-flood", "standard");
    let (b_toml, b) = key_on_plan("org-quiet", "standard");
    let stack = saturated_stack(&format!(
        "{a_toml}{b_toml}[plans.standard]\n[models.base]\nqueue_max_depth = 3\n"
    ));
    wait_for_capacity(&stack).await;
    let send = |key: &str, prompt: &str| {
        let c = stack.client().with_key(Some(key));
        let body = chat_body("base", prompt);
        tokio::spawn(async move {
            let sent = Instant::now();
            let r = c
                .post_json("/chat/completions", &body)
                .await
                .expect("reply");
            (r, sent.elapsed())
        })
    };
    // The flood holds the one slot for a second, then fills the queue.
    let running = send(&a, "Go on. synthetic:reply_tokens=100");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut flood = Vec::new();
    for i in 0..3 {
        flood.push(send(&a, &format!("flood {i} synthetic:reply_tokens=5")));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    assert_eq!(
        prometheus::sample(
            &page,
            "gateway_queue_depth",
            &["model=\"base\"", "tier=\"default\""]
        ),
        3.0,
        "the flood fills the queue"
    );
    // Another organisation's request is queued and served, not shed.
    let quiet = send(&b, "quiet synthetic:reply_tokens=5");
    // The flood's newest waiting request gives up its place, at once, with
    // the answer a shed newcomer gets.
    let newest = flood.pop().expect("flood");
    let (shed, waited) = newest.await.expect("task");
    harness::assert_error(&shed, 503, "server_overloaded");
    assert!(shed.header("retry-after").is_some(), "{shed}");
    assert!(
        waited < Duration::from_millis(900),
        "shed when the other organisation arrived, not after a wait: {waited:?}"
    );
    let (r, _) = quiet.await.expect("task");
    assert_eq!(r.status, 200, "{r}");
    for waiter in flood {
        let (r, _) = waiter.await.expect("task");
        assert_eq!(r.status, 200, "the flood's older requests are served: {r}");
    }
    let (r, _) = running.await.expect("task");
    assert_eq!(r.status, 200, "{r}");
    let (_, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    let shed_of = |org: &str| {
        let org = format!("org=\"{org}\"");
        prometheus::sample(
            &page,
            "gateway_queue_shed_total",
            &["reason=\"queue_full\"", org.as_str()],
        )
    };
    assert_eq!(shed_of("org-flood"), 1.0, "{page}");
    assert_eq!(shed_of("org-quiet"), 0.0);
}
