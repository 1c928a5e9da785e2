//! Starts the real `worker` binary on a free port and talks gRPC to it.

use inference_proto::v1 as pb;
use pb::worker_client::WorkerClient;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A running worker process, killed when dropped.
struct Worker {
    child: Child,
    addr: String,
}

impl Worker {
    fn start(extra: &[&str]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_worker"))
            .args(["serve", "--model", "base", "--engine", "synthetic"])
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start worker");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("ready line");
        let rest = line
            .strip_prefix("worker listening on ")
            .unwrap_or_else(|| panic!("unexpected ready line {line:?}"));
        assert!(
            line.trim_end().ends_with("model=base engine=synthetic"),
            "{line:?}"
        );
        let addr = rest.split(' ').next().expect("addr").to_owned();
        Worker { child, addr }
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    async fn client(&self) -> WorkerClient<Channel> {
        WorkerClient::new(self.channel().await)
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn request(text: &str) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: "it".into(),
        model: "base".into(),
        messages: vec![pb::Message {
            role: "user".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }],
        sampling: Some(pb::Sampling::default()),
        ..Default::default()
    }
}

fn reason(status: &tonic::Status) -> Option<&str> {
    status
        .metadata()
        .get(pb::ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok())
}

async fn info(client: &mut WorkerClient<Channel>) -> pb::InfoResponse {
    client
        .info(pb::InfoRequest {})
        .await
        .expect("info")
        .into_inner()
}

/// Polls `Info` until `pred` holds (or fails after 5 s).
async fn wait_for(
    client: &mut WorkerClient<Channel>,
    what: &str,
    pred: impl Fn(&pb::InfoResponse) -> bool,
) -> pb::InfoResponse {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let i = info(client).await;
        if pred(&i) {
            return i;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {i:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn generate_streams_text_then_exactly_one_finished() {
    let w = Worker::start(&[]);
    let mut c = w.client().await;
    let i = info(&mut c).await;
    assert_eq!(i.engine, "synthetic");
    assert!(i.description.contains("SIMULATED"));
    assert_eq!(i.context_window, 196_608);
    assert!(i.capabilities.expect("caps").image_input);

    let mut stream = c
        .generate(request("Hello! synthetic:reply_tokens=12"))
        .await
        .expect("generate")
        .into_inner();
    let mut texts = 0;
    let mut finished = Vec::new();
    while let Some(ev) = stream.message().await.expect("event") {
        match ev.event {
            Some(pb::generate_event::Event::Text(t)) => {
                assert!(finished.is_empty(), "text after finished");
                assert!(!t.text.is_empty());
                texts += 1;
            }
            Some(pb::generate_event::Event::Finished(f)) => finished.push(f),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(texts, 12);
    assert_eq!(finished.len(), 1);
    let f = &finished[0];
    assert_eq!(f.reason(), pb::finished::Reason::Stop);
    let u = f.usage.expect("usage");
    assert_eq!(u.completion_tokens, 12);
    assert_eq!(u.reasoning_tokens, 0);
    let counted = c
        .count_tokens(request("Hello! synthetic:reply_tokens=12"))
        .await
        .expect("count")
        .into_inner();
    assert_eq!(counted.prompt_tokens, u.prompt_tokens);
    let counters = wait_for(&mut c, "completed", |i| {
        i.counters.is_some_and(|c| c.completed == 1)
    })
    .await
    .counters
    .expect("counters");
    assert_eq!(counters.started, 1);
    assert_eq!(counters.tokens_generated, 12);
}

#[tokio::test]
async fn a_dropped_stream_stops_the_generation_and_counts_as_cancelled() {
    let w = Worker::start(&[]);
    let mut c = w.client().await;
    let mut stream = c
        .generate(request("synthetic:slow_ms=20 synthetic:reply_tokens=10000"))
        .await
        .expect("generate")
        .into_inner();
    for _ in 0..2 {
        stream.message().await.expect("event").expect("some event");
    }
    let running = info(&mut c).await.load.expect("load").running;
    assert_eq!(running, 1);
    drop(stream);
    let i = wait_for(&mut c, "cancelled", |i| {
        i.counters.is_some_and(|c| c.cancelled == 1)
    })
    .await;
    assert_eq!(i.load.expect("load").running, 0);
    let counters = i.counters.expect("counters");
    assert_eq!(counters.completed, 0);
    assert!(counters.tokens_generated < 100, "{counters:?}");
}

#[tokio::test]
async fn beyond_the_queue_requests_fail_with_overloaded() {
    let w = Worker::start(&["--max-concurrency", "1", "--max-queue", "1"]);
    let mut c = w.client().await;
    let running = c
        .generate(request("synthetic:hang"))
        .await
        .expect("first runs")
        .into_inner();
    // The second waits in the queue (its call returns once admitted).
    let mut queued_client = c.clone();
    let queued =
        tokio::spawn(async move { queued_client.generate(request("synthetic:hang")).await });
    let i = wait_for(&mut c, "one queued", |i| {
        i.load.is_some_and(|l| l.queued == 1)
    })
    .await;
    let load = i.load.unwrap_or_default();
    assert_eq!((load.running, load.queued, load.capacity), (1, 1, 1));
    // The simulator reports its prefix cache: two short prompts in a
    // cache of 65,536 blocks.
    assert!(
        load.kv_cache_usage
            .is_some_and(|u| (0.0..0.01).contains(&u)),
        "{load:?}"
    );
    let err = c
        .generate(request("hello"))
        .await
        .expect_err("queue is full");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&err), Some("OVERLOADED"));

    // Freeing the slot admits the queued one.
    drop(running);
    let admitted = tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("admitted in time")
        .expect("task");
    assert!(admitted.is_ok());
    let i = wait_for(&mut c, "queue empty", |i| {
        i.load.is_some_and(|l| l.queued == 0 && l.running == 1)
    })
    .await;
    assert_eq!(i.counters.expect("counters").rejected, 1);
}

#[tokio::test]
async fn context_length_exceeded_carries_its_reason() {
    let w = Worker::start(&["--context-window", "50"]);
    let mut c = w.client().await;
    let err = c
        .generate(request(&"many words ".repeat(50)))
        .await
        .expect_err("too long");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert_eq!(reason(&err), Some("CONTEXT_LENGTH_EXCEEDED"));
    assert!(err
        .message()
        .contains("maximum context length is 50 tokens"));
}

#[tokio::test]
async fn fail_after_ends_the_stream_with_engine_failure() {
    let w = Worker::start(&[]);
    let mut c = w.client().await;
    let mut stream = c
        .generate(request("synthetic:fail_after=3 synthetic:reply_tokens=10"))
        .await
        .expect("generate")
        .into_inner();
    let mut n = 0;
    let err = loop {
        match stream.message().await {
            Ok(Some(_)) => n += 1,
            Ok(None) => panic!("stream ended without an error"),
            Err(e) => break e,
        }
    };
    assert_eq!(n, 3);
    assert_eq!(err.code(), tonic::Code::Internal);
    assert_eq!(reason(&err), Some("ENGINE_FAILURE"));
}

#[tokio::test]
async fn health_serves_then_sigterm_drains_and_exits_zero() {
    let mut w = Worker::start(&["--grace-period-seconds", "10"]);
    let channel = w.channel().await;
    let mut health = HealthClient::new(channel.clone());
    let mut c = WorkerClient::new(channel);
    for service in ["", "inference.v1.Worker"] {
        let s = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health")
            .into_inner();
        assert_eq!(s.status(), ServingStatus::Serving, "{service:?}");
    }

    // An in-flight generation of about 0.5 s must finish during the drain.
    let mut inflight = c
        .generate(request("synthetic:slow_ms=25 synthetic:reply_tokens=20"))
        .await
        .expect("generate")
        .into_inner();
    let pid = w.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_for(&mut c, "draining", |i| i.draining).await;
    let s = health
        .check(HealthCheckRequest {
            service: "inference.v1.Worker".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(s.status(), ServingStatus::NotServing);
    let err = c.generate(request("hello")).await.expect_err("draining");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(reason(&err), Some("DRAINING"));

    let mut last = None;
    while let Some(ev) = inflight.message().await.expect("in-flight keeps streaming") {
        last = ev.event;
    }
    assert!(matches!(last, Some(pb::generate_event::Event::Finished(_))));

    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = w.child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "worker did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
}

/// Every event of a generation, in order.
async fn events_of(
    client: &mut WorkerClient<Channel>,
    req: pb::GenerateRequest,
) -> Vec<pb::generate_event::Event> {
    let mut stream = client.generate(req).await.expect("generate").into_inner();
    let mut events = Vec::new();
    while let Some(ev) = stream.message().await.expect("event") {
        events.push(ev.event.expect("an event"));
    }
    events
}

/// `batch_events` (a non-streaming caller): the same reply, usage and
/// finish, in few text events instead of one per token (the first output at
/// once, so the gateway knows the generation started, then the rest once a
/// second); with a paced engine it still takes as long as generating every
/// token.
#[tokio::test]
async fn batch_events_merges_the_reply_without_changing_it() {
    use pb::generate_event::Event;
    let w = Worker::start(&["--tokens-per-second", "100"]);
    let mut c = w.client().await;
    let text_of = |events: &[Event]| -> String {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    };
    let usage_of = |events: &[Event]| match events.last() {
        Some(Event::Finished(f)) => (f.reason, f.usage),
        other => panic!("ends with finished: {other:?}"),
    };
    let prompt = "Hello! synthetic:reply_tokens=20";
    let one_by_one = events_of(&mut c, request(prompt)).await;
    let mut batched_request = request(prompt);
    batched_request.batch_events = true;
    let started = std::time::Instant::now();
    let batched = events_of(&mut c, batched_request).await;
    let took = started.elapsed();
    assert_eq!(one_by_one.len(), 21, "20 text events and finished");
    assert_eq!(
        batched.len(),
        3,
        "the first output, the rest of a 0.2 s reply in one event, finished: {batched:?}"
    );
    assert_eq!(text_of(&batched), text_of(&one_by_one));
    let ((reason, usage), (reason_once, usage_once)) = (usage_of(&batched), usage_of(&one_by_one));
    let (usage, usage_once) = (usage.expect("usage"), usage_once.expect("usage"));
    assert_eq!(reason, reason_once);
    assert_eq!(
        (usage.prompt_tokens, usage.completion_tokens),
        (usage_once.prompt_tokens, usage_once.completion_tokens)
    );
    // The same prompt the second time: all but its last token cached.
    assert_eq!(usage.cached_prompt_tokens, usage.prompt_tokens - 1);
    assert!(
        took >= std::time::Duration::from_millis(190),
        "20 tokens at 100 tokens/s still take their time: {took:?}"
    );
}
