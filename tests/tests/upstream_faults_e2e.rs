//! An `upstream` worker in front of an engine that misbehaves (issue 26,
//! defect 6): the real gateway → a worker with `--engine upstream
//! --upstream-kind openai` → a loopback fake engine (`harness::fake_engine`)
//! that stalls before its first byte, goes silent mid-stream, ignores
//! `max_tokens`, or sends a line that never ends. Its `/health` always
//! answers 200, as a wedged engine's often does. No real engine is needed.

use harness::fake_engine::{Behavior, FakeEngine};
use harness::WorkerOpts;
use harness::{assert_error, bounded, json, procfs, Client, SseFrame, Stack, Value, Worker};
use std::time::{Duration, Instant};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const FIRST_BYTE_MS: u64 = 1500;
const IDLE_MS: u64 = 1000;

/// A gateway and one upstream worker with short timeouts in front of
/// `engine`.
fn stack(engine: &FakeEngine) -> Stack {
    let mut opts = WorkerOpts::upstream(&engine.url(), "openai");
    opts.extra_args.extend([
        "--upstream-first-byte-timeout-ms".to_owned(),
        FIRST_BYTE_MS.to_string(),
        "--upstream-idle-timeout-ms".to_owned(),
        IDLE_MS.to_string(),
    ]);
    Stack::builder()
        .models(&["base"])
        .worker_opts(opts)
        .start()
        .expect("stack starts")
}

fn chat(max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

async fn post(client: &Client, body: &Value) -> harness::Reply {
    client
        .post_json("/chat/completions", body)
        .await
        .expect("a reply")
}

/// The worker's `grpc.health.v1` status for its service, as the gateway
/// checks it.
async fn serving(worker: &Worker) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(worker.grpc_url()) else {
        return false;
    };
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: "inference.v1.Worker".into(),
        })
        .await
        .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
}

async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of a chat stream's content deltas.
fn streamed_text(frames: &[SseFrame]) -> String {
    frames
        .iter()
        .filter(|f| !f.is_done())
        .filter_map(|f| {
            f.json()["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn an_engine_stalled_before_its_first_byte_fails_fast_and_takes_the_worker_out() {
    bounded(120, async {
        let engine = FakeEngine::start(Behavior::Normal).expect("fake engine");
        let stack = stack(&engine);
        let client = stack.client();
        let worker = stack.worker("base");
        assert_eq!(post(&client, &chat(8, false)).await.status, 200);
        assert!(serving(worker).await);

        // Before the head (hyper waits for it), and after a head with no
        // event (engines that send their head before prefill).
        for behavior in [Behavior::StallBeforeHead, Behavior::HeadThenNothing] {
            engine.set(behavior);
            let started = Instant::now();
            let r = post(&client, &chat(8, false)).await;
            let took = started.elapsed();
            assert_error(&r, 504, "timeout");
            assert!(
                took >= Duration::from_millis(FIRST_BYTE_MS - 100) && took < Duration::from_secs(8),
                "{behavior:?}: answered after {took:?}, the first-byte timeout is {FIRST_BYTE_MS} ms"
            );
            wait_until("the worker to report NOT_SERVING", Duration::from_secs(5), || {
                async { !serving(worker).await }
            })
            .await;
            // /health still answers 200; the worker's probes do not, so it
            // stays out while the engine is wedged.
            tokio::time::sleep(Duration::from_millis(FIRST_BYTE_MS + 500)).await;
            assert!(!serving(worker).await, "{behavior:?}: back in while stalled");
            assert!(engine.probes() >= 1, "the worker probes a stalled engine");

            // The engine recovers: a probe answers, the worker serves again
            // and the gateway takes it back.
            engine.set(Behavior::Normal);
            wait_until("the worker to serve again", Duration::from_secs(10), || async {
                serving(worker).await
            })
            .await;
            wait_until("the gateway to route to it again", Duration::from_secs(15), || {
                let client = client.clone();
                async move { post(&client, &chat(8, false)).await.status == 200 }
            })
            .await;
        }
    })
    .await;
}

#[tokio::test]
async fn an_engine_silent_mid_stream_ends_the_stream_with_an_error_frame() {
    bounded(60, async {
        let engine = FakeEngine::start(Behavior::StallAfter(3)).expect("fake engine");
        let stack = stack(&engine);
        let started = Instant::now();
        let stream = stack
            .client()
            .stream("/chat/completions", &chat(64, true))
            .await
            .expect("stream");
        assert_eq!(stream.status, 200);
        let frames = stream.collect().await.expect("frames");
        let took = started.elapsed();
        assert!(took < Duration::from_secs(8), "ended after {took:?}");
        assert_eq!(streamed_text(&frames), "tok0 tok1 tok2 ", "{frames:?}");
        let last = frames.last().expect("frames").json();
        assert_eq!(last["error"]["status"], 504, "{last}");
        assert_eq!(last["error"]["code"], "timeout", "{last}");
        assert!(
            !frames.iter().any(SseFrame::is_done),
            "no [DONE] after an error"
        );
        let worker = stack.worker("base");
        wait_until(
            "the worker to report NOT_SERVING",
            Duration::from_secs(5),
            || async { !serving(worker).await },
        )
        .await;
    })
    .await;
}

#[tokio::test]
async fn an_engine_ignoring_max_tokens_is_cut_at_max_tokens() {
    bounded(60, async {
        let engine = FakeEngine::start(Behavior::IgnoreMaxTokens(2000)).expect("fake engine");
        let stack = stack(&engine);
        let client = stack.client();

        let r = post(&client, &chat(64, false)).await;
        assert_eq!(r.status, 200, "{r}");
        let v = r.json();
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], "x".repeat(64), "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 64, "{v}");

        let stream = client
            .stream("/chat/completions", &chat(64, true))
            .await
            .expect("stream");
        let frames = stream.collect().await.expect("frames");
        assert_eq!(streamed_text(&frames), "x".repeat(64));
        assert!(frames.last().is_some_and(SseFrame::is_done), "{frames:?}");
        let chunks: Vec<Value> = frames
            .iter()
            .filter(|f| !f.is_done())
            .map(SseFrame::json)
            .collect();
        assert!(
            chunks
                .iter()
                .any(|c| c["choices"][0]["finish_reason"] == "length"),
            "{chunks:?}"
        );
        let usage = chunks
            .iter()
            .rev()
            .find(|c| c["usage"].is_object())
            .expect("usage chunk");
        assert_eq!(usage["usage"]["completion_tokens"], 64, "{usage}");

        // The worker hung up on the engine instead of reading its 2000.
        wait_until(
            "the engine to see both replies dropped",
            Duration::from_secs(5),
            || async { engine.hung_up() >= 2 },
        )
        .await;
        assert!(serving(stack.worker("base")).await, "a cut is not a stall");
    })
    .await;
}

#[tokio::test]
async fn an_endless_line_fails_the_generation_and_the_worker_memory_stays_bounded() {
    bounded(60, async {
        let engine = FakeEngine::start(Behavior::EndlessLine).expect("fake engine");
        let stack = stack(&engine);
        let worker = stack.worker("base");
        let pid = worker.pid().expect("worker pid");
        let before = procfs::status_kib(pid, "VmHWM").expect("VmHWM");

        let started = Instant::now();
        let r = post(&stack.client(), &chat(64, false)).await;
        assert_error(&r, 502, "upstream_error");
        assert!(started.elapsed() < Duration::from_secs(10));
        wait_until("the worker to hang up on the engine", Duration::from_secs(5), || {
            async { engine.hung_up() >= 1 }
        })
        .await;

        let after = procfs::status_kib(pid, "VmHWM").expect("VmHWM");
        let rss = procfs::status_kib(pid, "VmRSS").expect("VmRSS");
        let sent = engine.endless_bytes();
        eprintln!(
            "endless line: the engine wrote {} KiB; worker peak RSS {before} -> {after} KiB, now {rss} KiB",
            sent / 1024
        );
        assert!(sent >= 1024 * 1024, "the engine got past the 1 MiB bound ({sent} bytes)");
        assert!(
            after.saturating_sub(before) < 32 * 1024,
            "the worker's peak RSS grew from {before} to {after} KiB"
        );
        assert!(serving(worker).await, "a broken reply is not a stall");
    })
    .await;
}
