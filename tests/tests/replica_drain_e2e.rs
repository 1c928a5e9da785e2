//! A draining gateway replica cuts nothing it could have kept (issue 43):
//! two replicas on one Redis in front of one slow synthetic worker, long
//! streams and background runs on replica A, then SIGTERM on A with a short
//! grace period.
//!
//! What must hold, read from the clients, from replica B and from the
//! store directly: every chat stream ends with an error frame (never a cut
//! connection), every Responses stream with its final event, each stored
//! response is what its client received, billing counts what was
//! delivered, the background runs A had not started are completed by B
//! instead of failed, and the one A was generating is continued by B from
//! the output A stored: one reply, one log, billed once.

use harness::replicas::{
    create_background, events, eventually, output_text, streamed_text, Replicas,
};
use harness::websocket::{self, CloseCode};
use harness::{bounded, json, stream_body, SseFrame, Value, WorkerOpts};
use std::time::{Duration, Instant};

/// A 3 s grace period after a 200 ms readiness delay; leases of 1.5 s
/// swept every 200 ms, so a handed-over run is adopted within a sweep.
const DRAIN: &str = "grace_period_seconds = 3\nreadiness_drain_millis = 200\n\
    [store]\nlease_millis = 1500\nheartbeat_millis = 300\nsweep_interval_millis = 200\n";
const GRACE: Duration = Duration::from_secs(3);

/// 400 tokens at 50 ms each: 20 s, far longer than the grace period.
const LONG: &str = "synthetic:reply_tokens=400 synthetic:slow_ms=50";
const LONG_TOKENS: u64 = 400;
/// A background run short enough to finish soon on the peer.
const SHORT_TOKENS: u64 = 20;
const SHORT: &str = "synthetic:reply_tokens=20 synthetic:slow_ms=20";

const STREAMS: usize = 3;
const QUEUED_RUNS: usize = 3;

/// The run's stored log is one story: sequence numbers 0, 1, 2, ... with no
/// gap or repeat (two owners wrote it), exactly one terminal event, last,
/// carrying the stored object, and the log's text is the object's.
fn assert_one_log(r: &Replicas, id: &str, object: &Value) -> Vec<(String, Value)> {
    let log = r.stored_events(id).expect("log");
    for (i, (name, data)) in log.iter().enumerate() {
        assert_eq!(
            data["sequence_number"], i as u64,
            "event {i} ({name}) of {id}: {log:?}"
        );
    }
    let terminals = log
        .iter()
        .filter(|(n, _)| {
            matches!(
                n.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        })
        .count();
    assert_eq!(terminals, 1, "one terminal event in {id}: {log:?}");
    let (_, last) = log.last().expect("a log");
    assert_eq!(
        &last["response"], object,
        "the terminal event is the object"
    );
    assert_eq!(
        streamed_text(log.iter().map(|(n, d)| (n.as_str(), d))),
        output_text(object),
        "the log's text is the object's ({id})"
    );
    log
}

/// Tokens in a synthetic reply's text: each word is one token and so is
/// each period (the engine's vocabulary, checked by its own tests). Counted
/// from the text, not from events, because the worker merges the tokens a
/// slow reader has not yet taken into one event.
fn synthetic_tokens(text: &str) -> u64 {
    (text.split_whitespace().count() + text.matches('.').count()) as u64
}

/// Output tokens a chat stream delivered.
fn chat_tokens(frames: &[SseFrame]) -> u64 {
    let text: String = frames
        .iter()
        .filter(|f| !f.is_done())
        .map(SseFrame::json)
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    synthetic_tokens(&text)
}

/// Output tokens a Responses event stream (or stored log) delivered.
fn delta_tokens(events: &[(String, Value)]) -> u64 {
    synthetic_tokens(&streamed_text(events.iter().map(|(n, d)| (n.as_str(), d))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_replica_ends_every_reply_in_band_stores_and_bills_it_and_hands_its_runs_over() {
    bounded(150, async {
        // Seven sequences at once on the worker: the long background run and
        // six streams take them all, so the later background runs queue.
        let worker = WorkerOpts {
            max_concurrency: Some(1 + 2 * STREAMS as u32),
            max_queue: Some(64),
            ..WorkerOpts::default()
        };
        let mut r = Replicas::start(worker, DRAIN).expect("replicas");
        let org = r.a.keys()[0].org.clone();
        let (a, b) = (r.a.client(), r.b.client());
        // The replicas learn the worker's capacity from its first report.
        tokio::time::sleep(Duration::from_millis(1500)).await;

        // A background run generating on A when the drain begins.
        let generating = create_background(&a, &format!("generating {LONG}")).await;
        eventually(
            Duration::from_secs(10),
            "the background run generating",
            || r.logs(),
            || {
                r.stored_events(&generating)
                    .ok()
                    .filter(|log| log.iter().any(|(n, _)| n == "response.output_text.delta"))
            },
        )
        .await;

        // Long streams on A: chat, and stored Responses.
        let mut chats = Vec::new();
        let mut streamed = Vec::new();
        for i in 0..STREAMS {
            let client = a.clone();
            chats.push(tokio::spawn(async move {
                let s = client
                    .stream(
                        "/chat/completions",
                        &stream_body("base", &format!("chat {i} {LONG}")),
                    )
                    .await?;
                anyhow::ensure!(s.status == 200, "chat stream status {}", s.status);
                s.collect().await
            }));
            let client = a.clone();
            streamed.push(tokio::spawn(async move {
                let body = json!({
                    "model": "base", "input": format!("responses {i} {LONG}"),
                    "stream": true, "store": true,
                });
                let s = client.stream("/responses", &body).await?;
                anyhow::ensure!(s.status == 200, "responses stream status {}", s.status);
                s.collect().await
            }));
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;

        // Background runs that wait for a free sequence when the drain begins.
        let mut queued = Vec::new();
        for i in 0..QUEUED_RUNS {
            queued.push(create_background(&a, &format!("queued {i} {SHORT}")).await);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;

        r.a.signal(libc::SIGTERM);
        let sent = Instant::now();

        // Every chat stream ends with an error frame the client can act on,
        // and the connection closes cleanly (collect fails on a cut).
        let mut delivered = 0;
        for chat in chats {
            let frames = chat
                .await
                .expect("task")
                .unwrap_or_else(|e| panic!("a chat stream was cut: {e:#}\n{}", r.logs()));
            assert!(
                sent.elapsed() < GRACE + Duration::from_secs(5),
                "ended at the grace period's end: {:?}",
                sent.elapsed()
            );
            assert!(!frames.iter().any(SseFrame::is_done), "not a whole reply");
            let last = frames.last().expect("frames").json();
            let error = &last["error"];
            assert_eq!(error["code"], "replica_shutdown", "{last}");
            assert_eq!(error["status"], 503, "{last}");
            assert_eq!(error["type"], "server_error", "{last}");
            assert!(
                error["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("retry"),
                "{last}"
            );
            let tokens = chat_tokens(&frames);
            assert!(tokens > 0, "the stream had delivered output");
            delivered += tokens;
        }

        // Every Responses stream ends with `response.incomplete` carrying
        // what it delivered, and the store keeps exactly that.
        for stream in streamed {
            let frames = stream
                .await
                .expect("task")
                .unwrap_or_else(|e| panic!("a Responses stream was cut: {e:#}\n{}", r.logs()));
            let events = events(&frames);
            let (name, last) = events.last().expect("events");
            assert_eq!(name, "response.incomplete", "{last}");
            let told = &last["response"];
            assert_eq!(told["status"], "incomplete", "{told}");
            assert_eq!(told["incomplete_details"]["reason"], "replica_shutdown");
            let text = streamed_text(events.iter().map(|(n, d)| (n.as_str(), d)));
            assert!(!text.is_empty(), "the stream had delivered output");
            assert_eq!(output_text(told), text, "the final event holds the output");
            let id = told["id"].as_str().expect("id");
            let stored = r.stored_object(id).expect("store").expect("stored");
            assert_eq!(&stored, told, "stored as its client got it");
            let via_b = b.get(&format!("/responses/{id}")).await.expect("get");
            assert_eq!(via_b.status, 200, "{via_b}");
            assert_eq!(&via_b.json(), told, "read on the other replica");
            delivered += delta_tokens(&events);
        }

        let exited = tokio::task::block_in_place(|| r.a.wait_exit(Duration::from_secs(15)));
        assert!(
            exited.is_some_and(|s| s.success()),
            "replica A exits 0 after its drain: {exited:?}\n{}",
            r.logs()
        );

        // The run that was generating is continued by B from what A stored:
        // one message item, every token of the reply, one log.
        let object = r.terminal(&generating, Duration::from_secs(40)).await;
        assert_eq!(object["status"], "completed", "{object}\n{}", r.logs());
        assert_eq!(object["usage"]["output_tokens"], LONG_TOKENS, "{object}");
        let log = assert_one_log(&r, &generating, &object);
        let items = log
            .iter()
            .filter(|(n, _)| n == "response.output_item.added")
            .count();
        assert_eq!(items, 1, "the message A opened is the one B finished");
        assert_eq!(
            delta_tokens(&log),
            LONG_TOKENS,
            "no token repeated or lost at the seam"
        );
        delivered += LONG_TOKENS;

        // The runs that had not started are completed by replica B, their
        // logs one story from A's opening events to B's last.
        for id in &queued {
            let object = r.terminal(id, Duration::from_secs(30)).await;
            assert_eq!(object["status"], "completed", "{object}\n{}", r.logs());
            assert!(object["error"].is_null(), "{object}");
            assert_eq!(object["usage"]["output_tokens"], SHORT_TOKENS, "{object}");
            let log = assert_one_log(&r, id, &object);
            assert_eq!(log[0].0, "response.created", "A opened the log");
            let via_b = b.get(&format!("/responses/{id}")).await.expect("get");
            assert_eq!(via_b.json(), object, "read on the other replica");
            delivered += SHORT_TOKENS;
        }
        assert!(
            r.b.admin_get("/metrics")
                .await
                .expect("metrics")
                .1
                .lines()
                .any(|l| l == format!("gateway_response_runs_adopted_total {}", QUEUED_RUNS + 1)),
            "replica B adopted the handed-over runs"
        );

        // Billed: every request that reached a worker, for exactly the output
        // its client (or the store) got; A's unstarted handed-over runs not
        // at all; the continued run as one request, by A for its part and
        // by B for the rest.
        let expected_requests = (2 * STREAMS + 1 + QUEUED_RUNS) as u64;
        let rows = eventually(
            Duration::from_secs(5),
            "every request settled",
            || r.logs(),
            || {
                let rows = r.usage(&org).ok()?;
                let requests: u64 = rows.iter().filter_map(|r| r["requests"].as_u64()).sum();
                (requests == expected_requests).then_some(rows)
            },
        )
        .await;
        let billed: u64 = rows
            .iter()
            .filter_map(|r| r["output_tokens"].as_u64())
            .sum();
        assert_eq!(
            billed, delivered,
            "billed output = delivered output: {rows:?}"
        );

        eventually(
            Duration::from_secs(10),
            "no run lease left",
            || r.logs(),
            || (r.leases_left().ok()? == 0).then_some(()),
        )
        .await;
    })
    .await;
}

/// A WebSocket response still generating when the grace period runs out
/// ends in band as every HTTP stream does: `response.incomplete` last,
/// holding the output its client got, stored exactly so (and read so on
/// the other replica); then the connection closes with 1001.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_response_outliving_the_grace_period_ends_in_band_stored_as_its_client_saw_it()
{
    bounded(90, async {
        let mut r = Replicas::start(WorkerOpts::default(), DRAIN).expect("replicas");
        let mut ws = websocket::connect(&r.a.base_url(), r.a.api_key())
            .await
            .expect("connects");
        ws.send_json(&json!({
            "type": "response.create", "model": "base",
            "input": format!("websocket {LONG}"), "store": true,
        }))
        .await
        .expect("sent");
        // Output is flowing when the drain begins.
        let mut events: Vec<Value> = Vec::new();
        while !events
            .iter()
            .any(|e| e["type"] == "response.output_text.delta")
        {
            events.push(ws.next_json().await.expect("an event"));
        }
        r.a.signal(libc::SIGTERM);
        let sent = Instant::now();

        let (rest, close) = ws.closed().await.expect("the connection ends");
        events.extend(rest);
        assert!(
            sent.elapsed() < GRACE + Duration::from_secs(5),
            "ended at the grace period's end: {:?}",
            sent.elapsed()
        );
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], i as u64, "{e}");
        }
        let last = events.last().expect("events");
        assert_eq!(last["type"], "response.incomplete", "{last}\n{}", r.logs());
        let told = &last["response"];
        assert_eq!(told["status"], "incomplete", "{told}");
        assert_eq!(told["incomplete_details"]["reason"], "replica_shutdown");
        let text = streamed_text(
            events
                .iter()
                .map(|e| (e["type"].as_str().unwrap_or_default(), e)),
        );
        assert!(!text.is_empty(), "the response had delivered output");
        let deltas = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .count() as u64;
        assert!(deltas < LONG_TOKENS, "cut, not finished: {deltas}");
        assert_eq!(output_text(told), text, "the final event holds the output");
        let (code, reason) = close.expect("a close frame");
        assert_eq!(code, CloseCode::Away);
        assert_eq!(reason, "server shutting down");

        let id = told["id"].as_str().expect("id");
        let stored = r.stored_object(id).expect("store").expect("stored");
        assert_eq!(&stored, told, "stored as its client saw it");
        let via_b =
            r.b.client()
                .get(&format!("/responses/{id}"))
                .await
                .expect("get");
        assert_eq!(via_b.status, 200, "{via_b}");
        assert_eq!(&via_b.json(), told, "read on the other replica");

        let exited = tokio::task::block_in_place(|| r.a.wait_exit(Duration::from_secs(15)));
        assert!(
            exited.is_some_and(|s| s.success()),
            "replica A exits 0 after its drain: {exited:?}\n{}",
            r.logs()
        );
    })
    .await;
}

/// Requests waiting in a draining replica's pool queue had not started:
/// they are answered at SIGTERM (503 `replica_shutdown`, `retry-after`),
/// not when the grace period ends, and their retry is served by the peer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_replica_answers_its_queued_requests_at_once() {
    bounded(90, async {
        // Two sequences, both held by A's long streams: what comes next waits
        // in A's queue. A grace period long enough to tell "at once" apart.
        let worker = WorkerOpts {
            max_concurrency: Some(2),
            ..WorkerOpts::default()
        };
        let drain = "grace_period_seconds = 8\nreadiness_drain_millis = 200\n";
        let r = Replicas::start(worker, drain).expect("replicas");
        let (a, b) = (r.a.client(), r.b.client());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut holding = Vec::new();
        for i in 0..2 {
            let s = a
                .stream(
                    "/chat/completions",
                    &stream_body("base", &format!("hold {i} {LONG}")),
                )
                .await
                .expect("stream");
            assert_eq!(s.status, 200);
            holding.push(s);
        }
        let queued_body = harness::chat_body("base", "queued synthetic:reply_tokens=5");
        let queued = tokio::spawn({
            let (a, body) = (a.clone(), queued_body.clone());
            async move { a.post_json("/chat/completions", &body).await }
        });
        let queued_stream = tokio::spawn({
            let a = a.clone();
            async move {
                a.stream(
                    "/chat/completions",
                    &stream_body("base", "queued stream synthetic:reply_tokens=5"),
                )
                .await
                .map(|s| s.status)
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!queued.is_finished(), "the request waits in A's queue");

        r.a.signal(libc::SIGTERM);
        let sent = Instant::now();
        let reply = queued.await.expect("task").expect("reply");
        let answered = sent.elapsed();
        let e = harness::assert_error(&reply, 503, "replica_shutdown");
        assert!(reply.header("retry-after").is_some(), "{reply}");
        assert!(
            e["message"].as_str().unwrap_or_default().contains("retry"),
            "{e}"
        );
        assert!(
            answered < Duration::from_millis(1500),
            "answered at SIGTERM, not at the grace period's end: {answered:?}\n{}",
            r.logs()
        );
        let status = queued_stream.await.expect("task").expect("stream");
        assert_eq!(status, 503, "a queued stream is answered before its head");
        assert!(sent.elapsed() < Duration::from_millis(1500));

        // The client retries on the peer, which serves it (the streams that
        // held the worker leave).
        drop(holding);
        let retried = b
            .post_json("/chat/completions", &queued_body)
            .await
            .expect("retry");
        assert_eq!(retried.status, 200, "{retried}\n{}", r.logs());
    })
    .await;
}

/// A non-streamed reply still generating when the grace period runs out
/// got nothing to its client but a 503 to retry: nothing of it is billed
/// (the tokens folded so far never left the replica). A stream cut at the
/// same moment is billed what its client got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_the_drain_cut_is_billed_nothing_and_a_cut_stream_what_it_delivered() {
    bounded(90, async {
        let r = Replicas::start(WorkerOpts::default(), DRAIN).expect("replicas");
        let org = r.a.keys()[0].org.clone();
        let a = r.a.client();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let body = tokio::spawn({
            let a = a.clone();
            async move {
                a.post_json(
                    "/chat/completions",
                    &harness::chat_body("base", &format!("body {LONG}")),
                )
                .await
            }
        });
        let stream = tokio::spawn({
            let a = a.clone();
            async move {
                let s = a
                    .stream(
                        "/chat/completions",
                        &stream_body("base", &format!("stream {LONG}")),
                    )
                    .await?;
                s.collect().await
            }
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        r.a.signal(libc::SIGTERM);

        let reply = body.await.expect("task").expect("reply");
        harness::assert_error(&reply, 503, "replica_shutdown");
        let frames = stream.await.expect("task").expect("a stream ended in band");
        let streamed = chat_tokens(&frames);
        assert!(streamed > 0, "the stream had delivered output");

        let rows = eventually(
            Duration::from_secs(10),
            "the cut stream settled",
            || r.logs(),
            || {
                let rows = r.usage(&org).ok()?;
                let requests: u64 = rows.iter().filter_map(|r| r["requests"].as_u64()).sum();
                (requests >= 1).then_some(rows)
            },
        )
        .await;
        // Settled together at the cut: give the body's settlement its moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rows = r.usage(&org).unwrap_or(rows);
        let sum = |field: &str| -> u64 { rows.iter().filter_map(|r| r[field].as_u64()).sum() };
        assert_eq!(sum("requests"), 1, "only the stream is billed: {rows:?}");
        assert_eq!(
            sum("output_tokens"),
            streamed,
            "the stream's delivered output, none of the body's: {rows:?}"
        );
    })
    .await;
}

/// A background run handed over mid-generation continues the request that
/// was admitted: the peer runs it although the org is at its requests-per-
/// minute limit, and the usage shows one request with one input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_run_is_one_request_that_its_plan_limits_never_refuse() {
    bounded(90, async {
        let limits = format!("{DRAIN}[plans.default]\nrpm = 1\n");
        let worker = WorkerOpts {
            max_queue: Some(64),
            ..WorkerOpts::default()
        };
        let r = Replicas::start(worker, &limits).expect("replicas");
        let org = r.a.keys()[0].org.clone();
        let a = r.a.client();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let input = format!("generating {LONG}");
        let id = create_background(&a, &input).await;
        // The org is at its limit now: its next create is refused.
        let refused = a
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "one more", "background": true}),
            )
            .await
            .expect("reply");
        harness::assert_error(&refused, 429, "rate_limit_exceeded");
        eventually(
            Duration::from_secs(10),
            "the background run generating",
            || r.logs(),
            || {
                r.stored_events(&id)
                    .ok()
                    .filter(|log| log.iter().any(|(n, _)| n == "response.output_text.delta"))
            },
        )
        .await;

        // The grace period runs out mid-generation: A hands the run over
        // with its output, and B continues it.
        r.a.signal(libc::SIGTERM);
        let object = r.terminal(&id, Duration::from_secs(40)).await;
        assert_eq!(object["status"], "completed", "{object}\n{}", r.logs());
        assert_eq!(object["usage"]["output_tokens"], LONG_TOKENS, "{object}");
        assert_one_log(&r, &id, &object);

        // One request, its input billed once (A's admission estimate), every
        // output token billed once.
        let body = json!({"model": "base", "input": input, "background": true});
        let estimate = (serde_json::to_vec(&body).expect("json").len() as u64).div_ceil(4);
        let rows = eventually(
            Duration::from_secs(5),
            "the run settled on both replicas",
            || r.logs(),
            || {
                let rows = r.usage(&org).ok()?;
                let output: u64 = rows
                    .iter()
                    .filter_map(|r| r["output_tokens"].as_u64())
                    .sum();
                (output == LONG_TOKENS).then_some(rows)
            },
        )
        .await;
        let sum = |field: &str| -> u64 { rows.iter().filter_map(|r| r[field].as_u64()).sum() };
        assert_eq!(sum("requests"), 1, "{rows:?}");
        assert_eq!(sum("input_tokens"), estimate, "{rows:?}");
    })
    .await;
}
