//! Chaos tests: real gateway, real synthetic workers (and a private
//! `redis-server`), faults injected with signals. Each test states the
//! outcome a client sees: which requests fail, with what status, code or
//! frame, and that every other request succeeds.
//!
//! Every test is bounded in time ([`bounded`]); the whole file runs in well
//! under 90 s on 2 cores.

use harness::chat;
use harness::{
    assert_error, bounded, chat_body, gateway_over, json, start_workers, stream_body, SseFrame,
    Stack, Value, Worker, WorkerOpts,
};
use std::time::{Duration, Instant};

/// How a chat stream ended.
#[derive(Debug)]
enum StreamEnd {
    /// `data: [DONE]` after only completion chunks.
    Done { chunks: usize },
    /// An in-band `data: {"error":...}` frame, and nothing after it.
    Error { error: Value, chunks: usize },
}

/// Reads a chat stream to its end, asserting its shape on the way: only
/// chunks, then either exactly `[DONE]` or one error frame without `[DONE]`.
fn stream_end(frames: &[SseFrame]) -> StreamEnd {
    let (last, chunks) = frames.split_last().expect("at least one frame");
    for f in chunks {
        assert!(!f.is_done(), "[DONE] only at the end: {frames:?}");
        let v = f.json();
        assert_eq!(v["object"], "chat.completion.chunk", "{v}");
    }
    if last.is_done() {
        return StreamEnd::Done {
            chunks: chunks.len(),
        };
    }
    let v = last.json();
    assert!(
        v.get("error").is_some(),
        "the stream ends with [DONE] or an error frame: {v}"
    );
    StreamEnd::Error {
        error: v["error"].clone(),
        chunks: chunks.len(),
    }
}

async fn started(w: &Worker) -> u64 {
    w.counters().await.expect("worker Info").started
}

// ---- SIGKILL mid-stream ----------------------------------------------------

/// A worker killed mid-stream: that stream moves to the surviving worker
/// of the pool and ends with `[DONE]` (no error frame); every later request
/// succeeds on the survivor. (`migration_e2e` checks the moved reply's
/// content; with no other worker the failure is still in band.)
#[tokio::test]
async fn sigkill_mid_stream_moves_the_stream_and_the_survivor_serves() {
    bounded(40, async {
        let mut workers = start_workers("base", &[WorkerOpts::default(), WorkerOpts::default()]);
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        let mut stream = client
            .stream(
                "/chat/completions",
                &stream_body(
                    "base",
                    "Go on. synthetic:reply_tokens=2000 synthetic:slow_ms=5",
                ),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        for _ in 0..3 {
            frames.push(stream.next_frame().await.unwrap().expect("a frame"));
        }
        // The worker that carries the stream is the one that started a generation.
        let victim = if started(&workers[0]).await == 1 {
            0
        } else {
            1
        };
        let survivor = 1 - victim;
        assert_eq!(started(&workers[victim]).await, 1);
        assert_eq!(started(&workers[survivor]).await, 0);
        workers[victim].kill();

        frames.extend(stream.collect().await.unwrap());
        match stream_end(&frames) {
            StreamEnd::Done { chunks } => {
                assert!(chunks > 1000, "the whole reply arrived: {chunks} chunks");
            }
            end => panic!("expected the stream to go on to [DONE], got {end:?}"),
        }
        assert_eq!(started(&workers[survivor]).await, 1, "the survivor took it");

        // Every new request succeeds, streaming or not, on the survivor.
        for i in 0..12 {
            let reply = chat::post(&client, &chat_body("base", &format!("next {i}"))).await;
            assert_eq!(reply.status, 200, "request {i} after the kill: {reply}");
        }
        for i in 0..4 {
            let frames = client
                .stream("/chat/completions", &stream_body("base", &format!("s {i}")))
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            assert!(
                matches!(stream_end(&frames), StreamEnd::Done { .. }),
                "{frames:?}"
            );
        }
        let c = workers[survivor].counters().await.unwrap();
        assert_eq!((c.started, c.completed), (17, 17), "{c:?}");
    })
    .await;
}

/// A worker killed while a closed loop of requests flows over a pool of two:
/// the requests running on it move to the other worker, so none fails;
/// every request sent after the kill succeeds.
#[tokio::test]
async fn sigkill_under_load_fails_no_request() {
    bounded(40, async {
        let mut workers = start_workers("base", &[WorkerOpts::default(), WorkerOpts::default()]);
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        const CONCURRENCY: usize = 4;
        let loops: Vec<_> = (0..CONCURRENCY)
            .map(|i| {
                let client = client.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        n += 1;
                        let body = chat_body(
                            "base",
                            &format!("loop {i} #{n} synthetic:reply_tokens=20 synthetic:slow_ms=5"),
                        );
                        let sent = Instant::now();
                        let r = chat::post(&client, &body).await;
                        if r.status != 200 {
                            assert_error(&r, 502, "upstream_error");
                        }
                        seen.push((sent, r.status));
                    }
                    seen
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let victim_started = started(&workers[0]).await;
        workers[0].kill();
        let killed_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(2000)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut seen = Vec::new();
        for l in loops {
            seen.extend(l.await.unwrap());
        }
        let failed: Vec<_> = seen.iter().filter(|(_, s)| *s != 200).collect();
        let after: Vec<_> = seen.iter().filter(|(t, _)| *t > killed_at).collect();
        eprintln!(
            "kill under load: {} requests, {} failed (502), {} sent after the kill",
            seen.len(),
            failed.len(),
            after.len()
        );
        assert!(
            victim_started > 0,
            "the victim carried traffic before the kill"
        );
        assert!(failed.is_empty(), "in-flight requests moved: {failed:?}");
        assert!(
            after.len() >= 10 && after.iter().all(|(_, s)| *s == 200),
            "{after:?}"
        );
    })
    .await;
}

/// The same on the Responses API: a worker killed mid-stream ends the stream
/// with `response.failed` (code `upstream_error`) and nothing after it, and
/// the stored response reads back as `failed`.
#[tokio::test]
async fn sigkill_mid_stream_on_responses_ends_with_response_failed() {
    bounded(30, async {
        let mut workers = start_workers("base", &[WorkerOpts::default()]);
        let gateway = gateway_over(&[&workers[0]], "");
        let client = gateway.client();
        let mut stream = client
            .stream(
                "/responses",
                &json!({
                    "model": "base",
                    "input": "Go on. synthetic:reply_tokens=2000 synthetic:slow_ms=5",
                    "stream": true
                }),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        while frames.len() < 6 {
            frames.push(stream.next_frame().await.unwrap().expect("an event"));
        }
        workers[0].kill();
        frames.extend(stream.collect().await.unwrap());
        let names: Vec<&str> = frames.iter().filter_map(|f| f.event.as_deref()).collect();
        assert_eq!(names.first(), Some(&"response.created"), "{names:?}");
        assert_eq!(names.last(), Some(&"response.failed"), "{names:?}");
        let terminal = [
            "response.completed",
            "response.failed",
            "response.incomplete",
        ];
        assert_eq!(
            names.iter().filter(|n| terminal.contains(n)).count(),
            1,
            "one terminal event, last: {names:?}"
        );
        let failed = frames.last().unwrap().json();
        assert_eq!(failed["type"], "response.failed", "{failed}");
        let response = &failed["response"];
        assert_eq!(response["status"], "failed", "{failed}");
        assert_eq!(response["error"]["code"], "upstream_error", "{failed}");
        let id = response["id"].as_str().expect("response id").to_string();
        let stored = client.get(&format!("/responses/{id}")).await.unwrap();
        assert_eq!(stored.status, 200, "{stored}");
        assert_eq!(stored.json()["status"], "failed", "{stored}");
    })
    .await;
}

// ---- hanging worker --------------------------------------------------------

/// A worker that hangs before its first token: the request ends at the
/// per-request deadline with a 504 `timeout` envelope (streaming or not),
/// and the worker sees its generation cancelled.
#[tokio::test]
async fn a_hanging_generation_ends_at_the_request_deadline_with_504() {
    bounded(30, async {
        let workers = start_workers("base", &[WorkerOpts::default()]);
        let gateway = gateway_over(&[&workers[0]], "request_timeout_seconds = 1\n");
        let client = gateway.client();
        for stream in [false, true] {
            let mut body = chat_body("base", "wait synthetic:hang");
            body["stream"] = json!(stream);
            let t = Instant::now();
            let reply = chat::post(&client, &body).await;
            let took = t.elapsed();
            assert_error(&reply, 504, "timeout");
            assert!(
                took >= Duration::from_millis(900) && took < Duration::from_secs(4),
                "bounded by the 1 s deadline: {took:?}"
            );
        }
        // A hang after some tokens: the stream ends with an in-band 504 frame.
        let frames = client
            .stream(
                "/chat/completions",
                &stream_body("base", "synthetic:reply_tokens=1000 synthetic:slow_ms=20"),
            )
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        match stream_end(&frames) {
            StreamEnd::Error { error, chunks } => {
                assert_eq!(error["status"], 504, "{error}");
                assert!(chunks > 5, "tokens flowed until the deadline");
            }
            end => panic!("expected a deadline error frame, got {end:?}"),
        }
        // The worker saw every timed-out generation dropped, and still serves.
        let c = workers[0]
            .wait_counters(Duration::from_secs(3), |c| c.cancelled >= 3)
            .await
            .unwrap();
        assert_eq!(c.cancelled, 3, "{c:?}");
        let reply = chat::post(&client, &chat_body("base", "hi")).await;
        assert_eq!(reply.status, 200, "{reply}");
    })
    .await;
}

/// A worker frozen with SIGSTOP (sockets open, nothing answers): requests
/// that reach it end at the deadline (504); active checks take it out of
/// selection within a few seconds, after which every request succeeds on the
/// other worker. SIGCONT brings it back.
#[tokio::test]
async fn a_frozen_worker_leaves_selection_and_the_other_serves() {
    bounded(40, async {
        let workers = start_workers("base", &[WorkerOpts::default(), WorkerOpts::default()]);
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "request_timeout_seconds = 2\n[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        // Warm both channels.
        for i in 0..6 {
            assert_eq!(
                chat::post(&client, &chat_body("base", &format!("w{i}")))
                    .await
                    .status,
                200
            );
        }
        workers[0].signal(libc::SIGSTOP);
        let frozen_at = Instant::now();

        // Right after the freeze: each request either succeeds or ends at
        // the deadline; none hangs and none gets another error.
        let mut early = Vec::new();
        for i in 0..4 {
            let client = client.clone();
            early.push(tokio::spawn(async move {
                let t = Instant::now();
                let r = chat::post(&client, &chat_body("base", &format!("early {i}"))).await;
                (r, t.elapsed())
            }));
        }
        for h in early {
            let (r, took) = h.await.unwrap();
            assert!(took < Duration::from_secs(4), "bounded: {took:?}");
            if r.status != 200 {
                assert_error(&r, 504, "timeout");
            }
        }
        // Within a few seconds of the freeze the worker is out of selection.
        let mut ok_since: Option<Instant> = None;
        while frozen_at.elapsed() < Duration::from_secs(8) {
            let t = Instant::now();
            let r = chat::post(&client, &chat_body("base", "probe")).await;
            if r.status == 200 && t.elapsed() < Duration::from_millis(500) {
                ok_since.get_or_insert(Instant::now());
            } else {
                ok_since = None;
            }
            if ok_since.is_some_and(|s| s.elapsed() > Duration::from_millis(500)) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let detected = frozen_at.elapsed();
        assert!(
            ok_since.is_some(),
            "the frozen worker was never taken out of selection"
        );
        eprintln!(
            "SIGSTOP: out of selection (0.5 s of fast successes) {detected:?} after the freeze"
        );
        assert!(
            detected < Duration::from_secs(6),
            "taken out within a few seconds: {detected:?}"
        );

        // Now every request succeeds at once.
        let before = started(&workers[1]).await;
        let all = futures::future::join_all((0..20).map(|i| {
            let client = client.clone();
            async move {
                let t = Instant::now();
                let r = chat::post(&client, &chat_body("base", &format!("after {i}"))).await;
                (r.status, t.elapsed())
            }
        }))
        .await;
        for (status, took) in &all {
            assert_eq!(*status, 200);
            // Well under the 2 s deadline: none of them went to the frozen worker.
            assert!(*took < Duration::from_millis(1800), "{took:?}");
        }
        assert_eq!(started(&workers[1]).await - before, 20);

        // Resumed, it rejoins selection.
        workers[0].signal(libc::SIGCONT);
        let before = started(&workers[0]).await;
        let deadline = Instant::now() + Duration::from_secs(8);
        while started(&workers[0]).await == before && Instant::now() < deadline {
            let r = chat::post(&client, &chat_body("base", "back?")).await;
            assert_eq!(r.status, 200, "{r}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started(&workers[0]).await > before,
            "the resumed worker is selected again"
        );
    })
    .await;
}

/// A worker frozen mid-stream (no FIN, no RST, nothing): gRPC keepalive
/// detects the dead connection and the stream ends with an in-band 502
/// error frame within seconds, long before the request deadline.
#[tokio::test]
async fn a_worker_frozen_mid_stream_is_detected_by_keepalive() {
    bounded(30, async {
        let workers = start_workers("base", &[WorkerOpts::default()]);
        let gateway = gateway_over(&[&workers[0]], "request_timeout_seconds = 120\n");
        let mut stream = gateway
            .client()
            .stream(
                "/chat/completions",
                &stream_body("base", "synthetic:reply_tokens=5000 synthetic:slow_ms=10"),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        for _ in 0..3 {
            frames.push(stream.next_frame().await.unwrap().expect("a frame"));
        }
        workers[0].signal(libc::SIGSTOP);
        let frozen_at = Instant::now();
        frames.extend(stream.collect().await.unwrap());
        let took = frozen_at.elapsed();
        workers[0].signal(libc::SIGCONT);
        eprintln!("keepalive: frozen worker's stream failed {took:?} after the freeze");
        match stream_end(&frames) {
            StreamEnd::Error { error, .. } => assert_eq!(error["status"], 502, "{error}"),
            end => panic!("expected an error frame, got {end:?}"),
        }
        assert!(
            took < Duration::from_secs(15),
            "keepalive detects it: {took:?}"
        );
    })
    .await;
}

// ---- slow worker -----------------------------------------------------------

/// One worker of two decodes 20x slower: least_loaded sends it clearly fewer
/// requests (in-flight counts rise where work is slow), and all succeed.
#[tokio::test]
async fn least_loaded_prefers_the_fast_worker_over_a_slow_one() {
    bounded(40, async {
        let workers = start_workers(
            "base",
            &[WorkerOpts::paced(0, 2000), WorkerOpts::paced(0, 100)],
        );
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        // Closed loop, 6 at a time, 20-token replies: ~10 ms on the fast
        // worker, ~200 ms on the slow one.
        let total = 120usize;
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let loops = (0..6).map(|_| {
            let client = client.clone();
            let next = next.clone();
            async move {
                let mut statuses = Vec::new();
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                    let r = chat::post(&client, &chat_body("base", "go synthetic:reply_tokens=20"))
                        .await;
                    statuses.push(r.status);
                }
                statuses
            }
        });
        let statuses: Vec<u16> = futures::future::join_all(loops)
            .await
            .into_iter()
            .flatten()
            .collect();
        assert_eq!(statuses.len(), total);
        assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
        let fast = started(&workers[0]).await;
        let slow = started(&workers[1]).await;
        eprintln!("least_loaded split: fast worker {fast}, slow worker {slow}");
        assert_eq!(fast + slow, total as u64);
        assert!(
            fast >= 3 * slow,
            "the fast worker takes most: fast {fast}, slow {slow}"
        );
    })
    .await;
}

// ---- restart ---------------------------------------------------------------

/// The only worker of a model is killed and started again on the same
/// address: while it is down requests get 503 `server_overloaded` with
/// `retry-after`; once it is back the pool recovers without a gateway
/// restart.
#[tokio::test]
async fn a_restarted_worker_rejoins_without_a_gateway_restart() {
    bounded(40, async {
        let mut workers = start_workers("base", &[WorkerOpts::default()]);
        let gateway = gateway_over(&[&workers[0]], "");
        let client = gateway.client();
        assert_eq!(
            chat::post(&client, &chat_body("base", "hi")).await.status,
            200
        );
        workers[0].kill();
        // Traffic during the outage (enough to open the circuit).
        for i in 0..8 {
            let r = chat::post(&client, &chat_body("base", &format!("down {i}"))).await;
            assert_error(&r, 503, "server_overloaded");
        }
        workers[0].restart().expect("worker restarts on its port");
        let back_at = Instant::now();
        let mut recovered = None;
        while back_at.elapsed() < Duration::from_secs(15) {
            let r = chat::post(&client, &chat_body("base", "up?")).await;
            if r.status == 200 {
                recovered = Some(back_at.elapsed());
                break;
            }
            assert_error(&r, 503, "server_overloaded");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let recovered = recovered.expect("the pool recovered after the restart");
        eprintln!("restart: first success {recovered:?} after the worker was back");
        assert!(
            recovered < Duration::from_secs(4),
            "recovered quickly: {recovered:?}"
        );
        for i in 0..10 {
            let r = chat::post(&client, &chat_body("base", &format!("again {i}"))).await;
            assert_eq!(r.status, 200, "{r}");
        }
    })
    .await;
}

// ---- all workers of a model gone -------------------------------------------

/// Every worker of `base` is gone: `base` requests get 503
/// `server_overloaded` with `retry-after` (streaming or not, fast); the other
/// model is unaffected.
#[tokio::test]
async fn a_model_without_workers_is_503_and_other_models_are_unaffected() {
    bounded(30, async {
        let mut stack = Stack::builder()
            .models(&["base", "base-mini"])
            .workers_per_model(2)
            .start()
            .unwrap();
        let client = stack.client();
        for w in stack.workers.iter_mut().filter(|w| w.model() == "base") {
            w.kill();
        }
        for i in 0..6 {
            let mut body = chat_body("base", &format!("x{i}"));
            body["stream"] = json!(i % 2 == 1);
            let t = Instant::now();
            let r = chat::post(&client, &body).await;
            assert_error(&r, 503, "server_overloaded");
            assert!(
                t.elapsed() < Duration::from_secs(3),
                "fails fast: {:?}",
                t.elapsed()
            );
            let mini = chat::post(&client, &chat_body("base-mini", &format!("y{i}"))).await;
            assert_eq!(mini.status, 200, "{mini}");
        }
        // Still so once health checks have marked them down.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let r = chat::post(&client, &chat_body("base", "later")).await;
        assert_error(&r, 503, "server_overloaded");
        let mini = chat::post(&client, &chat_body("base-mini", "later")).await;
        assert_eq!(mini.status, 200, "{mini}");
    })
    .await;
}

// ---- SIGTERM -----------------------------------------------------------------

/// SIGTERM on the gateway: `/readyz` fails at once, an open stream finishes
/// with `[DONE]`, the process exits 0 after the drain and then refuses
/// connections.
#[tokio::test]
async fn sigterm_on_the_gateway_drains_open_streams_then_refuses() {
    bounded(40, async {
        let workers = start_workers("base", &[WorkerOpts::default()]);
        let mut gateway = gateway_over(
            &[&workers[0]],
            "grace_period_seconds = 10\nreadiness_drain_millis = 300\n",
        );
        let client = gateway.client();
        let (status, _) = gateway.admin_get("/readyz").await.unwrap();
        assert_eq!(status, 200);
        let mut stream = client
            .stream(
                "/chat/completions",
                &stream_body("base", "synthetic:reply_tokens=150 synthetic:slow_ms=10"),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let first = stream.next_frame().await.unwrap().expect("role chunk");
        gateway.signal(libc::SIGTERM);
        let t = Instant::now();
        loop {
            let (status, _) = gateway.admin_get("/readyz").await.unwrap();
            if status == 503 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "readyz still {status}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut frames = vec![first];
        frames.extend(stream.collect().await.unwrap());
        match stream_end(&frames) {
            StreamEnd::Done { chunks } => assert!(chunks > 150, "the whole reply: {chunks}"),
            end => panic!("the open stream must finish: {end:?}"),
        }
        let status = gateway.wait_exit(Duration::from_secs(8));
        assert!(
            status.is_some_and(|s| s.success()),
            "the gateway exits 0 after the drain: {status:?}\n{}",
            gateway.log_tail()
        );
        let refused = tokio::net::TcpStream::connect(gateway.addr()).await;
        assert!(
            refused.is_err(),
            "new connections are refused after the drain"
        );
    })
    .await;
}

/// SIGTERM on one worker of two: its open stream completes, it reports
/// draining and the gateway stops selecting it (new requests all succeed on
/// the other), then it exits 0.
#[tokio::test]
async fn sigterm_on_a_worker_drains_it_out_of_selection() {
    bounded(40, async {
        let mut workers = start_workers(
            "base",
            &[
                WorkerOpts {
                    grace_period_seconds: Some(20),
                    ..WorkerOpts::default()
                },
                WorkerOpts::default(),
            ],
        );
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        // Open the long stream until it lands on worker 0 (the pick is random).
        let mut stream = None;
        for _ in 0..20 {
            let before = started(&workers[0]).await;
            let mut s = client
                .stream(
                    "/chat/completions",
                    &stream_body("base", "synthetic:reply_tokens=300 synthetic:slow_ms=10"),
                )
                .await
                .unwrap();
            assert_eq!(s.status, 200);
            s.next_frame().await.unwrap().expect("role chunk");
            if started(&workers[0]).await > before {
                stream = Some(s);
                break;
            }
        }
        let stream = stream.expect("a stream on worker 0");
        let started0 = started(&workers[0]).await;
        workers[0].signal(libc::SIGTERM);
        let t = Instant::now();
        while !workers[0].info().await.unwrap().draining {
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "Info.draining soon after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let before1 = started(&workers[1]).await;
        for i in 0..20 {
            let r = chat::post(&client, &chat_body("base", &format!("during drain {i}"))).await;
            assert_eq!(r.status, 200, "request {i} during the drain: {r}");
        }
        assert_eq!(
            started(&workers[1]).await - before1,
            20,
            "all on the other worker"
        );
        assert_eq!(
            started(&workers[0]).await,
            started0,
            "nothing new on the draining worker"
        );

        let frames = stream.collect().await.unwrap();
        assert!(
            matches!(stream_end(&frames), StreamEnd::Done { .. }),
            "{frames:?}"
        );
        let status = workers[0].wait_exit(Duration::from_secs(5));
        assert!(
            status.is_some_and(|s| s.success()),
            "worker exits 0: {status:?}"
        );
    })
    .await;
}

/// A stream that outlives its worker's drain grace period: the worker stops
/// it with `DRAINING` and exits, and the stream ends with an in-band 502
/// frame that says the worker was shut down for a restart (partial output
/// was sent, so never a retryable 503), without `[DONE]`.
#[tokio::test]
async fn a_stream_outliving_the_worker_grace_period_ends_with_502() {
    bounded(30, async {
        let mut workers = start_workers(
            "base",
            &[WorkerOpts {
                grace_period_seconds: Some(1),
                ..WorkerOpts::default()
            }],
        );
        let gateway = gateway_over(&[&workers[0]], "");
        let mut stream = gateway
            .client()
            .stream(
                "/chat/completions",
                &stream_body("base", "synthetic:reply_tokens=2000 synthetic:slow_ms=5"),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let mut frames = Vec::new();
        for _ in 0..3 {
            frames.push(stream.next_frame().await.unwrap().expect("a frame"));
        }
        workers[0].signal(libc::SIGTERM);
        frames.extend(stream.collect().await.unwrap());
        match stream_end(&frames) {
            StreamEnd::Error { error, .. } => {
                assert_eq!(error["status"], 502, "{error}");
                assert_eq!(error["code"], "upstream_error", "{error}");
                // Said as a drain, not as a failed worker.
                let message = error["message"].as_str().unwrap_or_default();
                assert!(message.contains("shut down for a restart"), "{error}");
            }
            end => panic!("expected an error frame, got {end:?}"),
        }
        let status = workers[0].wait_exit(Duration::from_secs(5));
        assert!(status.is_some(), "the worker exited after its grace period");
    })
    .await;
}
