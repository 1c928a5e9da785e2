//! A generation outlives its worker: real gateway, two paced synthetic
//! workers, one killed (SIGKILL) or drained (SIGTERM, short grace) while
//! streams run on it. Every client gets a whole reply with no error frame,
//! and the reply is the one the model gives without the fault (the
//! simulator's reply is fixed by the prompt and the seed, so the reference
//! is the same request run again on the survivor): one chunk id, usage that
//! adds up, a stored object equal to what its client got.

use harness::chat;
use harness::prometheus::sample;
use harness::{
    bounded, gateway_over, json, start_workers, Client, Gateway, SseFrame, Value, Worker,
    WorkerOpts,
};
use std::time::Duration;

/// Tokens per second of the paced workers: a 300-token reply takes 3 s.
const PACE: u64 = 100;

fn workers(opts: WorkerOpts) -> (Vec<Worker>, Gateway) {
    let workers = start_workers("base", &[opts.clone(), opts]);
    let gateway = gateway_over(
        &workers.iter().collect::<Vec<_>>(),
        "[models.base]\npolicy = \"least_loaded\"\n",
    );
    (workers, gateway)
}

fn story(i: usize) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": format!("Story {i}, please. synthetic:reply_tokens=300")}],
        "seed": i,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Opens one chat stream per body, each read to its end on a task.
fn spawn_streams(
    client: &Client,
    bodies: impl IntoIterator<Item = Value>,
) -> Vec<tokio::task::JoinHandle<Vec<SseFrame>>> {
    bodies
        .into_iter()
        .map(|body| {
            let client = client.clone();
            tokio::spawn(async move { chat::stream(&client, &body).await })
        })
        .collect()
}

async fn started(w: &Worker) -> u64 {
    w.counters().await.map(|c| c.started).unwrap_or(0)
}

/// Waits until the generations are running, then returns the index of the
/// worker running more of them.
async fn busiest(workers: &[Worker]) -> usize {
    usize::from(started(&workers[1]).await > started(&workers[0]).await)
}

/// A chat stream read to its end: its chunks (asserting `[DONE]` and no
/// error frame), its text, its one chunk id, its usage.
struct ChatStream {
    text: String,
    ids: Vec<String>,
    finish: Vec<String>,
    usage: Value,
}

fn read_chat(frames: &[SseFrame]) -> ChatStream {
    for f in frames {
        assert!(
            f.is_done() || f.json().get("error").is_none(),
            "no error frame: {f:?}"
        );
    }
    let chunks = chat::chunks(frames);
    let mut ids: Vec<String> = chunks
        .iter()
        .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    ids.dedup();
    ChatStream {
        text: chat::streamed_text(&chunks),
        ids,
        finish: chunks
            .iter()
            .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
            .map(str::to_owned)
            .collect(),
        usage: chunks
            .last()
            .map(|c| c["usage"].clone())
            .unwrap_or(Value::Null),
    }
}

/// Generations moved off a worker for `reason`, by the metrics page.
fn moved_for(page: &str, reason: &str) -> f64 {
    sample(
        page,
        "gateway_generation_moves_total",
        &[
            "model=\"base\"",
            &format!("reason=\"{reason}\""),
            "outcome=\"moved\"",
        ],
    )
}

/// Eight streams, the worker carrying most of them killed a second in:
/// every stream ends with `[DONE]` and the same text, finish reason and
/// usage as the reply the model gives without the fault.
#[tokio::test]
async fn streams_move_off_a_killed_worker_and_read_as_one_generation() {
    bounded(60, async {
        let (mut workers, gateway) = workers(WorkerOpts::paced(0, PACE));
        let client = gateway.client();
        let streams = spawn_streams(&client, (0..8).map(story));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let victim = busiest(&workers).await;
        assert!(started(&workers[victim]).await >= 4);
        workers[victim].kill();
        let mut got = Vec::new();
        for s in streams {
            got.push(read_chat(&s.await.expect("stream task")));
        }
        assert!(
            gateway.generation_moves("base", "moved").await >= 4.0,
            "the killed worker's streams moved"
        );
        // A killed worker is a lost worker, not an engine's own error.
        let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
        assert!(moved_for(&page, "worker_lost") >= 4.0, "{page}");
        assert_eq!(moved_for(&page, "engine_failure"), 0.0);
        for (i, stream) in got.iter().enumerate() {
            assert_eq!(stream.ids.len(), 1, "one chunk id through the move");
            assert_eq!(stream.finish, ["stop"], "one finish reason");
            let reference = read_chat(&chat::stream(&client, &story(i)).await);
            assert_eq!(stream.text, reference.text, "stream {i} reads as one reply");
            assert_eq!(
                stream.usage["completion_tokens"], reference.usage["completion_tokens"],
                "stream {i}: the completion is every token the client got"
            );
            assert_eq!(
                stream.usage["prompt_tokens"], reference.usage["prompt_tokens"],
                "stream {i}: the prompt counted once"
            );
        }
        assert_eq!(gateway.generation_moves("base", "failed").await, 0.0);
    })
    .await;
}

/// A worker stopped mid-reply (SIGSTOP: its sockets open, its process
/// silent) is caught by the HTTP/2 keepalive before the stall timeout,
/// and counted as a lost worker, not as an engine's own failure.
#[tokio::test]
async fn a_worker_stopped_mid_reply_counts_as_lost_not_as_an_engine_failure() {
    bounded(90, async {
        let (workers, gateway) = workers(WorkerOpts::paced(0, PACE));
        let client = gateway.client();
        let long = |i: usize| {
            let mut body = story(i);
            body["messages"][0]["content"] =
                json!(format!("Story {i}, please. synthetic:reply_tokens=1500"));
            body
        };
        let streams = spawn_streams(&client, (0..4).map(long));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let victim = busiest(&workers).await;
        workers[victim].signal(libc::SIGSTOP);
        for s in streams {
            let stream = read_chat(&s.await.expect("stream task"));
            assert_eq!(stream.finish, ["stop"], "one finish reason");
        }
        workers[victim].signal(libc::SIGCONT);
        let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
        assert!(moved_for(&page, "worker_lost") >= 1.0, "{page}");
        assert_eq!(moved_for(&page, "engine_failure"), 0.0);
        assert_eq!(
            moved_for(&page, "stalled"),
            0.0,
            "the keepalive caught it first"
        );
    })
    .await;
}

/// A reply in one body and a stored, streamed Response move too: the body
/// is the whole reply, and the stored Response equals what its client got.
#[tokio::test]
async fn a_body_and_a_stored_response_move_off_a_killed_worker() {
    bounded(60, async {
        let (mut workers, gateway) = workers(WorkerOpts::paced(0, PACE));
        let client = gateway.client();
        let mut body = story(1);
        body["stream"] = json!(false);
        body.as_object_mut().map(|b| b.remove("stream_options"));
        let response_body = json!({
            "model": "base",
            "input": "A response, please. synthetic:reply_tokens=300",
            "stream": true,
            "store": true,
            "temperature": 0.5,
        });
        let body_task = {
            let (client, body) = (client.clone(), body.clone());
            tokio::spawn(async move { chat::post(&client, &body).await })
        };
        let response_task = {
            let (client, body) = (client.clone(), response_body.clone());
            tokio::spawn(async move { collect(&client, &body).await })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let victim = busiest(&workers).await;
        workers[victim].kill();
        // Kill whichever worker ran anything: both requests may share one.
        let reply = body_task.await.expect("task");
        assert_eq!(reply.status, 200, "{reply}");
        let reply = reply.json();
        let reference = chat::post(&client, &body).await.json();
        assert_eq!(chat::content(&reply), chat::content(&reference));
        assert_eq!(
            reply["usage"]["completion_tokens"],
            reference["usage"]["completion_tokens"]
        );

        let frames = response_task.await.expect("task");
        let events: Vec<Value> = frames.iter().map(SseFrame::json).collect();
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(types.last(), Some(&"response.completed"), "{types:?}");
        assert!(!types.contains(&"response.failed"), "{types:?}");
        for (n, e) in events.iter().enumerate() {
            assert_eq!(e["sequence_number"], n, "sequence numbers run on: {e}");
        }
        let streamed = harness::responses::streamed_text(&frames);
        let id = events[0]["response"]["id"].as_str().expect("id").to_owned();
        let stored = client.get(&format!("/responses/{id}")).await.expect("get");
        assert_eq!(stored.status, 200);
        let stored = stored.json();
        assert_eq!(stored["status"], "completed");
        assert_eq!(harness::responses::output_text(&stored), streamed);
        assert!(gateway.generation_moves("base", "moved").await >= 1.0);
    })
    .await;
}

async fn collect(client: &Client, body: &Value) -> Vec<SseFrame> {
    client
        .stream("/responses", body)
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames")
}

/// Structured output survives the move: a `json_schema` reply continued on
/// another worker is one JSON document that validates.
#[tokio::test]
async fn a_json_schema_reply_moves_and_still_validates() {
    bounded(60, async {
        let (mut workers, gateway) = workers(WorkerOpts::paced(0, 40));
        let client = gateway.client();
        let schema = json!({
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "chapters": {"type": "array", "items": {"type": "string"}, "minItems": 20},
            },
            "required": ["title", "chapters"],
            "additionalProperties": false,
        });
        let body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": "A book outline."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "outline", "schema": schema, "strict": true}},
            "seed": 7,
        });
        let streams = spawn_streams(&client, vec![body.clone(); 4]);
        tokio::time::sleep(Duration::from_millis(800)).await;
        let victim = busiest(&workers).await;
        workers[victim].kill();
        let reference = read_chat(&chat::stream(&client, &body).await).text;
        let validator = jsonschema::validator_for(&schema).expect("schema");
        for s in streams {
            let got = read_chat(&s.await.expect("task"));
            let value: Value = serde_json::from_str(&got.text).expect("one JSON document");
            assert!(validator.is_valid(&value), "{value}");
            assert_eq!(got.text, reference);
        }
        assert!(gateway.generation_moves("base", "moved").await >= 1.0);
    })
    .await;
}

/// A draining worker whose grace ends before its streams do hands them to
/// the pool: no client sees the restart.
#[tokio::test]
async fn a_drain_shorter_than_the_streams_hands_them_over() {
    bounded(60, async {
        let opts = WorkerOpts {
            grace_period_seconds: Some(1),
            ..WorkerOpts::paced(0, PACE)
        };
        let (workers, gateway) = workers(opts);
        let client = gateway.client();
        let streams = spawn_streams(&client, (0..6).map(story));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let victim = busiest(&workers).await;
        workers[victim].signal(libc::SIGTERM);
        for (i, s) in streams.into_iter().enumerate() {
            let got = read_chat(&s.await.expect("task"));
            let reference = read_chat(&chat::stream(&client, &story(i)).await);
            assert_eq!(got.text, reference.text, "stream {i}");
        }
        assert!(gateway.generation_moves("base", "moved").await >= 1.0);
    })
    .await;
}

/// A worker whose engine goes silent mid-reply while its link stays up
/// (no keepalive failure to see) is taken as failed after the pool's
/// `stall_timeout_ms`, and its generations move.
#[tokio::test]
async fn a_worker_that_stalls_mid_reply_is_left_after_the_stall_timeout() {
    bounded(60, async {
        let stuck = WorkerOpts {
            extra_args: vec!["--stall-after-tokens".into(), "30".into()],
            ..WorkerOpts::paced(0, PACE)
        };
        let workers = start_workers("base", &[stuck, WorkerOpts::paced(0, PACE)]);
        let gateway = gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\nstall_timeout_ms = 2000\n",
        );
        let client = gateway.client();
        let streams = spawn_streams(&client, (0..4).map(story));
        let mut texts = Vec::new();
        for s in streams {
            texts.push(read_chat(&s.await.expect("task")).text);
        }
        assert!(
            started(&workers[0]).await >= 1,
            "the stuck worker took some"
        );
        let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
        let stalled = sample(
            &page,
            "gateway_generation_moves_total",
            &["model=\"base\"", "reason=\"stalled\"", "outcome=\"moved\""],
        );
        assert!(stalled >= 1.0, "moved for the stall");
        for (i, text) in texts.iter().enumerate() {
            let reference = read_chat(&chat::stream(&client, &story(i)).await);
            assert_eq!(text, &reference.text, "stream {i}");
        }
    })
    .await;
}

/// With no other worker to take it, a failed generation still ends in band
/// as before: the move is refused, not hung.
#[tokio::test]
async fn with_no_other_worker_the_failure_is_delivered_in_band() {
    bounded(40, async {
        let mut workers = start_workers("base", &[WorkerOpts::paced(0, PACE)]);
        let gateway = gateway_over(&workers.iter().collect::<Vec<_>>(), "");
        let client = gateway.client();
        let task = {
            let client = client.clone();
            tokio::spawn(async move { chat::stream(&client, &story(3)).await })
        };
        tokio::time::sleep(Duration::from_millis(800)).await;
        workers[0].kill();
        let frames = task.await.expect("task");
        let last = frames.last().expect("frames").json();
        assert_eq!(last["error"]["status"], 502, "{last}");
        assert_eq!(gateway.generation_moves("base", "moved").await, 0.0);
    })
    .await;
}

/// The real model (llama.cpp in process, SmolLM2), two workers: a
/// `json_schema` stream whose worker is killed mid-document goes on on the
/// other, whose constraint starts where the first left off, and the whole
/// is one JSON document that validates; a text stream moves the same way.
#[tokio::test]
async fn on_the_real_model_streams_move_and_a_json_schema_reply_still_validates() {
    bounded(120, async {
        let file = harness::model::model_file().expect("the SmolLM2 GGUF");
        let opts = WorkerOpts::llama(&file, 1024, 2);
        let (mut workers, gateway) = workers(opts);
        let client = gateway.client();
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "cities": {
                    "type": "array",
                    "items": {"type": "string", "maxLength": 40},
                    "minItems": 12,
                    "maxItems": 12,
                },
            },
            "required": ["name", "cities"],
            "additionalProperties": false,
        });
        let json_body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": "Name a country and twelve of its cities, as JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "country", "schema": schema, "strict": true}},
            "max_tokens": 400,
            "temperature": 0,
            "stream": true,
        });
        let text_body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
            "max_tokens": 300,
            "temperature": 0,
            "stream": true,
        });
        // Least loaded puts one JSON stream on each worker, so whichever
        // dies, a JSON document moves.
        let mut streams = Vec::new();
        for body in [&json_body, &json_body, &text_body] {
            streams.push(client.stream("/chat/completions", body).await.expect("stream"));
        }
        let mut frames: Vec<Vec<SseFrame>> = vec![Vec::new(); 3];
        for _ in 0..12 {
            for (stream, frames) in streams.iter_mut().zip(frames.iter_mut()) {
                frames.push(stream.next_frame().await.expect("frame").expect("a frame"));
            }
        }
        let victim = busiest(&workers).await;
        workers[victim].kill();
        for (stream, frames) in streams.into_iter().zip(frames.iter_mut()) {
            frames.extend(stream.collect().await.expect("frames"));
        }
        let validator = jsonschema::validator_for(&schema).expect("schema");
        for frames in &frames[..2] {
            let reply = read_chat(frames);
            let value: Value = serde_json::from_str(&reply.text)
                .unwrap_or_else(|e| panic!("one JSON document ({e}): {}", reply.text));
            assert!(validator.is_valid(&value), "{value}");
            assert_eq!(reply.ids.len(), 1);
        }
        let text_reply = read_chat(&frames[2]);
        assert!(text_reply.text.len() > 200, "{}", text_reply.text);
        assert_eq!(text_reply.finish.len(), 1);
        assert!(gateway.generation_moves("base", "moved").await >= 1.0);
    })
    .await;
}
