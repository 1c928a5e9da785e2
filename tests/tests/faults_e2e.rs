//! Network faults beyond process kills: a [`FaultProxy`] between the gateway
//! and Redis, or between the gateway and a worker, stalls, partitions or
//! slows the link while requests run. Each test states the outcome a client
//! must see, and checks what is stored: no run left non-terminal, nothing in
//! an event log after its terminal event, no lease left behind.

use harness::{bounded, json, FaultProxy, RedisScope, Stack, Value, WorkerOpts};
use std::time::{Duration, Instant};

/// Short leases so that a lost run is swept within seconds.
const FAST_LEASES: &str =
    "[store]\nlease_millis = 1500\nheartbeat_millis = 300\nsweep_interval_millis = 200\n";

/// A `base` stack whose gateway reaches the test Redis through a proxy.
fn stack_behind_proxy(opts: WorkerOpts) -> (Stack, FaultProxy) {
    let scope = RedisScope::new().expect("the test Redis");
    let proxy = FaultProxy::start(scope.addr().expect("test Redis address")).expect("proxy");
    drop(scope);
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(opts)
        .extra_toml(FAST_LEASES)
        .redis_via(&proxy.redis_url())
        .start()
        .expect("stack starts");
    (stack, proxy)
}

async fn create_background(stack: &Stack, n: usize, input: &str) -> Vec<String> {
    let client = stack.client();
    let mut ids = Vec::new();
    for _ in 0..n {
        let r = client
            .post_json(
                "/responses",
                &json!({"model": "base", "input": input, "background": true}),
            )
            .await
            .expect("create");
        assert_eq!(r.status, 200, "{r}");
        ids.push(r.json()["id"].as_str().expect("id").to_string());
    }
    ids
}

/// Polls until every run is terminal; returns the final objects.
async fn wait_terminal(stack: &Stack, ids: &[String], within: Duration) -> Vec<Value> {
    let client = stack.client();
    let deadline = Instant::now() + within;
    loop {
        let mut objects = Vec::new();
        for id in ids {
            let r = client.get(&format!("/responses/{id}")).await.expect("get");
            if r.status == 200 {
                objects.push(r.json());
            }
        }
        let terminal = objects
            .iter()
            .filter(|o| {
                matches!(
                    o["status"].as_str(),
                    Some("completed" | "failed" | "cancelled" | "incomplete")
                )
            })
            .count();
        if terminal == ids.len() {
            return objects;
        }
        assert!(
            Instant::now() < deadline,
            "runs still not terminal after {within:?}: {:?}\n{}",
            objects
                .iter()
                .map(|o| o["status"].clone())
                .collect::<Vec<_>>(),
            stack.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The run's event log, read straight from Redis: sequence numbers from 0
/// without a gap, exactly one terminal event, and it is the last.
fn assert_log_ends_once(stack: &Stack, id: &str) -> Vec<String> {
    let scope = stack.redis.as_ref().expect("redis stack");
    let mut conn = scope.connection().expect("redis");
    let key = format!("{}resp:{{{id}}}:events", scope.prefix());
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .expect("XRANGE");
    let names: Vec<String> = entries
        .iter()
        .map(|(_, f)| f.get(1).cloned().unwrap_or_default())
        .collect();
    for (i, (entry_id, _)) in entries.iter().enumerate() {
        assert_eq!(entry_id, &format!("0-{}", i + 1), "gap in the log of {id}");
    }
    let terminal: Vec<usize> = names
        .iter()
        .enumerate()
        .filter(|(_, n)| {
            matches!(
                n.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        terminal,
        [names.len() - 1],
        "one terminal event, last, in {names:?}"
    );
    names
}

fn leases_left(stack: &Stack) -> usize {
    let scope = stack.redis.as_ref().expect("redis stack");
    let mut conn = scope.connection().expect("redis");
    redis::cmd("ZCARD")
        .arg(format!("{}runs:{{leases}}", scope.prefix()))
        .query(&mut conn)
        .expect("ZCARD")
}

/// The audit's reproduction: a Redis stall longer than the client's 500 ms
/// reply timeout. The writes it held land late; the owner's retries find
/// them there and carry on, so every run completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_runs_complete_through_a_redis_stall_longer_than_the_reply_timeout() {
    bounded(60, async {
        let (stack, proxy) = stack_behind_proxy(WorkerOpts::paced(0, 200));
        let ids = create_background(&stack, 6, "synthetic:reply_tokens=400 go").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.stall(Duration::from_millis(800));
        let objects = wait_terminal(&stack, &ids, Duration::from_secs(20)).await;
        for (id, o) in ids.iter().zip(&objects) {
            assert_eq!(o["status"], "completed", "{o}");
            assert_eq!(o["usage"]["output_tokens"], 400, "{o}");
            let names = assert_log_ends_once(&stack, id);
            assert_eq!(names.last().map(String::as_str), Some("response.completed"));
        }
        assert_eq!(leases_left(&stack), 0, "no lease left behind");
    })
    .await;
}

/// A run's deadline holds however slowly its store writes go: with Redis
/// 300 ms away and a worker always ahead, every relay step has an event
/// ready, yet the run ends `failed` with `timeout` by its deadline plus a
/// lease instead of completing long after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_run_behind_slow_store_writes_ends_by_its_deadline() {
    bounded(60, async {
        let scope = RedisScope::new().expect("the test Redis");
        let proxy = FaultProxy::start(scope.addr().expect("test Redis address")).expect("proxy");
        drop(scope);
        let stack = Stack::builder()
            .models(&["base"])
            .worker_opts(WorkerOpts::paced(0, 100))
            .extra_toml(&format!("request_timeout_seconds = 2\n{FAST_LEASES}"))
            .redis_via(&proxy.redis_url())
            .start()
            .expect("stack starts");
        let created = Instant::now();
        let ids = create_background(&stack, 1, "synthetic:reply_tokens=1000 go").await;
        proxy.set_latency(Duration::from_millis(150));
        // 1,000 tokens at 100/s would complete after about 10 s.
        let objects = wait_terminal(&stack, &ids, Duration::from_secs(30)).await;
        let ended_within = created.elapsed();
        let o = &objects[0];
        assert_eq!(o["status"], "failed", "{o}");
        assert_eq!(o["error"]["code"], "timeout", "{o}");
        assert!(
            ended_within < Duration::from_secs(7),
            "ended {ended_within:?} after creation: deadline 2 s + lease 1.5 s (+ polling through a slow link)"
        );
        proxy.set_latency(Duration::ZERO);
        let names = assert_log_ends_once(&stack, &ids[0]);
        assert_eq!(names.last().map(String::as_str), Some("response.failed"));
        // The owner lets go of its lease after the terminal write, through
        // the slow link (or a sweep does, one lease later).
        let gone_by = Instant::now() + Duration::from_secs(5);
        while leases_left(&stack) > 0 && Instant::now() < gone_by {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(leases_left(&stack), 0, "no lease left behind");
    })
    .await;
}

/// Redis away for longer than a lease: the owners give up, and once Redis
/// is back every run ends `failed` (by the sweeper) within the contract's
/// bound — none stays running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_runs_end_failed_after_a_redis_partition_longer_than_the_lease() {
    bounded(60, async {
        let (stack, proxy) = stack_behind_proxy(WorkerOpts::paced(0, 100));
        let ids = create_background(&stack, 3, "synthetic:reply_tokens=400 go").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.partition();
        tokio::time::sleep(Duration::from_secs(4)).await;
        proxy.heal();
        let healed = Instant::now();
        let objects = wait_terminal(&stack, &ids, Duration::from_secs(20)).await;
        // The process contract's bound: every run terminal within lease +
        // heartbeat + sweep interval of Redis coming back (1.5 + 0.3 + 0.2
        // s here), with 1.5 s for reconnecting and polling.
        let ended_after = healed.elapsed();
        assert!(
            ended_after < Duration::from_millis(1500 + 300 + 200 + 1500),
            "every run terminal {ended_after:?} after Redis came back"
        );
        for (id, o) in ids.iter().zip(&objects) {
            // Either the owner finished after the heal or the sweeper failed
            // it; never both, never neither.
            let status = o["status"].as_str().unwrap_or_default();
            assert!(matches!(status, "completed" | "failed"), "{o}");
            if status == "failed" {
                assert_eq!(o["error"]["code"], "run_lost", "{o}");
            }
            assert_log_ends_once(&stack, id);
        }
        assert_eq!(leases_left(&stack), 0, "no lease left behind");
        // The service is whole again: a new run completes.
        let again = create_background(&stack, 1, "synthetic:reply_tokens=5 go").await;
        let done = wait_terminal(&stack, &again, Duration::from_secs(10)).await;
        assert_eq!(done[0]["status"], "completed", "{}", done[0]);
    })
    .await;
}

/// What one request of the mixed traffic ended as.
#[derive(Debug)]
enum Ended {
    /// 200 and a complete reply (a chat stream through `[DONE]`).
    Complete,
    /// A retryable refusal before anything started: 503 with `retry-after`.
    Refused503,
}

/// A chat stream: complete, or a 503 with `retry-after` before it started.
async fn chat_stream_outcome(client: &harness::Client) -> Ended {
    let body = harness::stream_body("base", "synthetic:reply_tokens=30 go");
    let stream = client
        .stream("/chat/completions", &body)
        .await
        .expect("send");
    if stream.status == 503 {
        return Ended::Refused503;
    }
    if stream.status != 200 {
        let reply = stream.into_reply().await.expect("reply");
        panic!("chat stream refused: {reply} {:?}", reply.headers);
    }
    let frames = stream.collect().await.expect("read");
    assert!(
        frames.last().is_some_and(|f| f.is_done()),
        "a complete stream: {frames:?}"
    );
    assert!(
        !frames.iter().any(|f| f.data.contains("\"error\"")),
        "no in-band error: {frames:?}"
    );
    Ended::Complete
}

/// A foreground stored response: 200 completed, or 503 `store_unavailable`
/// with `retry-after`.
async fn stored_response_outcome(client: &harness::Client) -> Ended {
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "synthetic:reply_tokens=10 go"}),
        )
        .await
        .expect("send");
    match r.status {
        200 => {
            assert_eq!(r.json()["status"], "completed", "{r}");
            Ended::Complete
        }
        503 => {
            harness::assert_envelope(&r, 503);
            Ended::Refused503
        }
        _ => panic!("unexpected answer during a Redis stall: {r}"),
    }
}

/// Redis stalls of 200 ms, 1 s and 5 s while chat streams, stored
/// responses, background runs, limit checks and Redis key lookups run.
/// Defined outcomes: chat streams complete (limits fail open to this
/// replica's own count, keys come from the cache); a stored response
/// completes or is refused with a retryable 503 before it starts; every
/// background run ends terminal (completed, or failed by the sweeper when
/// the stall outlived the lease) with one terminal event; no lease and no
/// concurrency slot is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalls_during_mixed_traffic_end_in_defined_outcomes() {
    bounded(150, async {
        let (stack, proxy) = stack_behind_proxy(WorkerOpts::paced(0, 200));
        stack.cli(&[
            "plans",
            "set",
            "four",
            "--max-concurrent",
            "12",
            "--rpm",
            "1000",
        ]);
        let key = stack.cli(&["keys", "create", "--org", "org-faults", "--plan", "four"]);
        let client = stack.client().with_key(Some(key.trim()));
        // Warm the key cache and the connections.
        assert!(matches!(
            chat_stream_outcome(&client).await,
            Ended::Complete
        ));

        for stall_ms in [200u64, 1_000, 5_000] {
            let runs = create_background(&stack, 2, "synthetic:reply_tokens=300 go").await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            proxy.stall(Duration::from_millis(stall_ms));
            let mut chats = Vec::new();
            let mut stored = Vec::new();
            for _ in 0..3 {
                let c = client.clone();
                chats.push(tokio::spawn(async move { chat_stream_outcome(&c).await }));
                let c = client.clone();
                stored.push(tokio::spawn(
                    async move { stored_response_outcome(&c).await },
                ));
            }
            for c in chats {
                let ended = c.await.expect("chat task");
                assert!(
                    matches!(ended, Ended::Complete),
                    "chat streams do not depend on Redis ({stall_ms} ms stall): {ended:?}"
                );
            }
            for s in stored {
                s.await.expect("stored task");
            }
            let objects = wait_terminal(&stack, &runs, Duration::from_secs(25)).await;
            for (id, o) in runs.iter().zip(&objects) {
                let status = o["status"].as_str().unwrap_or_default();
                if stall_ms < 1_500 {
                    assert_eq!(status, "completed", "{stall_ms} ms stall: {o}");
                } else {
                    assert!(matches!(status, "completed" | "failed"), "{o}");
                }
                assert_log_ends_once(&stack, id);
            }
        }
        // Nothing leaked: no lease, and the plan's 12 slots are all free.
        let deadline = Instant::now() + Duration::from_secs(10);
        while leases_left(&stack) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(leases_left(&stack), 0, "no lease left behind");
        // Settlements that failed in the stalls are retried until they
        // land: no concurrency slot stays held.
        let in_flight = || -> usize {
            let scope = stack.redis.as_ref().expect("redis stack");
            let mut conn = scope.connection().expect("redis");
            redis::cmd("ZCARD")
                .arg(format!("{}rl:{{org-faults}}:base:inflight", scope.prefix()))
                .query(&mut conn)
                .expect("ZCARD")
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while in_flight() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(in_flight(), 0, "no concurrency slot left held");
        let mut all = Vec::new();
        for _ in 0..12 {
            let c = client.clone();
            all.push(tokio::spawn(async move { chat_stream_outcome(&c).await }));
        }
        for t in all {
            assert!(matches!(t.await.expect("task"), Ended::Complete));
        }
    })
    .await;
}

/// A gateway replica paused (SIGSTOP) for longer than the lease: another
/// replica's sweeper fails its runs; when it resumes it writes nothing
/// after the terminal event and leaves no lease behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_past_its_lease_writes_nothing_after_its_runs_were_swept() {
    bounded(60, async {
        let stack = Stack::builder()
            .models(&["base"])
            .worker_opts(WorkerOpts::paced(0, 100))
            .extra_toml(FAST_LEASES)
            .redis()
            .start()
            .expect("stack starts");
        let second = harness::Gateway::start(stack.gateway.opts().clone()).expect("replica");
        let ids = create_background(&stack, 3, "synthetic:reply_tokens=400 go").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        stack.gateway.signal(libc::SIGSTOP);
        tokio::time::sleep(Duration::from_secs(4)).await;
        // The other replica sees them failed meanwhile.
        let observer = second.client();
        for id in &ids {
            let o = observer
                .get(&format!("/responses/{id}"))
                .await
                .unwrap()
                .json();
            assert_eq!(o["status"], "failed", "{o}");
            assert_eq!(o["error"]["code"], "run_lost", "{o}");
        }
        let logs_at_sweep: Vec<Vec<String>> = ids
            .iter()
            .map(|id| assert_log_ends_once(&stack, id))
            .collect();
        stack.gateway.signal(libc::SIGCONT);
        // Give the resumed owner time to try to write.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for (id, before) in ids.iter().zip(&logs_at_sweep) {
            let after = assert_log_ends_once(&stack, id);
            assert_eq!(&after, before, "nothing written after the terminal event");
            let o = observer
                .get(&format!("/responses/{id}"))
                .await
                .unwrap()
                .json();
            assert_eq!(o["status"], "failed", "{o}");
        }
        assert_eq!(leases_left(&stack), 0, "no lease left behind");
    })
    .await;
}

/// A `base` worker, a proxy in front of it, and a gateway reaching the
/// worker only through the proxy.
fn gateway_over_proxied_worker(
    extra_toml: &str,
) -> (harness::Worker, FaultProxy, harness::Gateway) {
    let worker = harness::Worker::start("base", WorkerOpts::default()).expect("worker");
    let proxy = FaultProxy::start(worker.addr().parse().expect("addr")).expect("proxy");
    let mut opts = harness::GatewayOpts {
        extra_toml: extra_toml.into(),
        ..harness::GatewayOpts::default()
    };
    opts.workers
        .insert("base".into(), vec![proxy.addr().to_string()]);
    let gateway = harness::Gateway::start(opts).expect("gateway");
    (worker, proxy, gateway)
}

/// 50 ms added each way on the gateway–worker link: streams are slower,
/// nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_link_latency_slows_streams_and_fails_nothing() {
    bounded(60, async {
        let (_worker, proxy, gateway) = gateway_over_proxied_worker("");
        let client = gateway.client();
        assert!(matches!(
            chat_stream_outcome(&client).await,
            Ended::Complete
        ));
        proxy.set_latency(Duration::from_millis(50));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let c = client.clone();
            tasks.push(tokio::spawn(async move { chat_stream_outcome(&c).await }));
        }
        for t in tasks {
            assert!(matches!(t.await.expect("task"), Ended::Complete));
        }
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "a round trip over the slow link: {:?}",
            started.elapsed()
        );
    })
    .await;
}

/// The gateway–worker link partitioned mid-stream (the worker still runs,
/// its packets go nowhere): HTTP/2 keepalive detects it, the client gets
/// the in-band 502, and once the link heals the worker serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_worker_link_mid_stream_ends_with_an_in_band_502_and_recovers() {
    bounded(60, async {
        let (_worker, proxy, gateway) =
            gateway_over_proxied_worker("request_timeout_seconds = 120\n");
        let client = gateway.client();
        let mut stream = client
            .stream(
                "/chat/completions",
                &harness::stream_body("base", "synthetic:reply_tokens=5000 synthetic:slow_ms=10"),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        for _ in 0..3 {
            stream.next_frame().await.unwrap().expect("a frame");
        }
        proxy.partition();
        let cut = Instant::now();
        let rest = stream.collect().await.unwrap();
        let took = cut.elapsed();
        let error = rest
            .iter()
            .find(|f| f.data.contains("\"error\""))
            .map(|f| f.json())
            .unwrap_or_else(|| panic!("an in-band error frame: {rest:?}"));
        assert_eq!(error["error"]["status"], 502, "{error}");
        assert!(
            took < Duration::from_secs(15),
            "keepalive detects it: {took:?}"
        );
        proxy.heal();
        // Back in service once the link heals (health checks reconnect).
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = client
                .post_json("/chat/completions", &harness::chat_body("base", "hi"))
                .await
                .unwrap();
            if r.status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "the worker never came back: {r}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
}
