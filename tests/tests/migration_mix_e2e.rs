//! Fifty generations of every kind under worker faults at random points:
//! streamed and one-body chat completions, streamed stored Responses,
//! background runs, `json_schema` replies and strict tool calls, on three
//! paced synthetic workers, while workers are SIGKILLed, cut off from the
//! gateway (the link delivers nothing) or drained with a grace period
//! shorter than the replies. Every client gets a whole reply with no error
//! frame, equal to the reply the model gives without the fault; every
//! `json_schema` reply and tool call validates; every stored object equals
//! what its client got; usage adds up. The same on the real model with
//! one request of each kind.
//!
//! The fault points come from a seeded generator; the seed is printed, and
//! `IGW_FAULT_SEED` replays a run.

use harness::chat;
use harness::prometheus::sample;
use harness::responses;
use harness::{bounded, json, start_workers, Client, FaultProxy, Gateway, GatewayOpts, Value};
use harness::{SseFrame, Worker, WorkerOpts};
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Tokens per second of the paced workers: a 300-token reply takes 3 s.
const PACE: u64 = 100;
const REQUESTS: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ChatStream,
    ChatBody,
    ResponseStream,
    Background,
    JsonSchema,
    StrictTool,
}

const KINDS: [Kind; 6] = [
    Kind::ChatStream,
    Kind::ChatBody,
    Kind::ResponseStream,
    Kind::Background,
    Kind::JsonSchema,
    Kind::StrictTool,
];

/// An object of a short string `one` and a list `many` of exactly `items`
/// short strings.
fn list_schema(one: &str, many: &str, items: u32) -> Value {
    json!({
        "type": "object",
        "properties": {
            one: {"type": "string", "maxLength": 40},
            many: {"type": "array", "items": {"type": "string", "maxLength": 40},
                "minItems": items, "maxItems": items},
        },
        "required": [one, many],
        "additionalProperties": false,
    })
}

fn outline_schema(items: u32) -> Value {
    list_schema("title", "chapters", items)
}

fn trip_schema(items: u32) -> Value {
    list_schema("city", "stops", items)
}

/// What one request asks, sized for its engine: `items` for the JSON
/// kinds, `tokens` for text (a synthetic control; the real model gets
/// `max_tokens`).
#[derive(Debug, Clone, Copy)]
struct Ask {
    kind: Kind,
    i: usize,
    items: u32,
    tokens: u32,
    real_model: bool,
}

impl Ask {
    fn text_prompt(&self) -> String {
        if self.real_model {
            format!(
                "Tell me a long story about lighthouse keeper number {}.",
                self.i
            )
        } else {
            format!(
                "Story {}, please. synthetic:reply_tokens={}",
                self.i, self.tokens
            )
        }
    }

    fn chat(&self, content: String) -> Value {
        let mut body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": content}],
            "seed": self.i,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if self.real_model {
            body["max_tokens"] = json!(self.tokens);
            body["temperature"] = json!(0);
        }
        body
    }

    fn body(&self) -> Value {
        match self.kind {
            Kind::ChatStream => self.chat(self.text_prompt()),
            Kind::ChatBody => {
                let mut body = self.chat(self.text_prompt());
                body["stream"] = json!(false);
                body.as_object_mut().map(|b| b.remove("stream_options"));
                body
            }
            Kind::ResponseStream | Kind::Background => {
                let mut body = json!({
                    "model": "base",
                    "input": self.text_prompt(),
                    "store": true,
                    "temperature": 0,
                });
                if self.kind == Kind::Background {
                    body["background"] = json!(true);
                } else {
                    body["stream"] = json!(true);
                }
                if self.real_model {
                    body["max_output_tokens"] = json!(self.tokens);
                }
                body
            }
            Kind::JsonSchema => {
                let mut body = self.chat(format!(
                    "Outline book {} with a title and its chapters, as JSON.",
                    self.i
                ));
                body["response_format"] = json!({"type": "json_schema", "json_schema":
                    {"name": "outline", "schema": outline_schema(self.items), "strict": true}});
                body["max_tokens"] = json!(600);
                body
            }
            Kind::StrictTool => {
                let mut body = self.chat(format!(
                    "Call plan_trip for trip {}: a city and its stops.",
                    self.i
                ));
                body["tools"] = json!([{"type": "function", "function": {
                    "name": "plan_trip",
                    "description": "Plans a trip through a city's stops.",
                    "strict": true,
                    "parameters": trip_schema(self.items),
                }}]);
                body["tool_choice"] = json!("required");
                // One call: with parallel calls a model may add a second.
                body["parallel_tool_calls"] = json!(false);
                body["max_tokens"] = json!(600);
                body
            }
        }
    }
}

/// What a client got, checked for wholeness on the way: the reply's text
/// (or the tool call's arguments) and its completion tokens.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    text: String,
    completion_tokens: u64,
}

async fn run(client: &Client, ask: &Ask) -> Got {
    let body = ask.body();
    let what = format!("request {} ({:?})", ask.i, ask.kind);
    match ask.kind {
        Kind::ChatStream | Kind::JsonSchema | Kind::StrictTool => {
            let frames = chat::stream(client, &body).await;
            for f in &frames {
                assert!(
                    f.is_done() || f.json().get("error").is_none(),
                    "{what}: no error frame: {f:?}"
                );
            }
            let chunks = chat::chunks(&frames);
            let ids: std::collections::BTreeSet<&str> =
                chunks.iter().filter_map(|c| c["id"].as_str()).collect();
            assert_eq!(ids.len(), 1, "{what}: one chunk id through a move");
            let finish: Vec<&str> = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
                .collect();
            let usage = &chunks.last().expect("a usage chunk")["usage"];
            assert_usage_adds_up(usage, "prompt_tokens", "completion_tokens", &what);
            let text = if ask.kind == Kind::StrictTool {
                assert_eq!(finish, ["tool_calls"], "{what}");
                let (names, arguments) = streamed_call(&chunks, &what);
                assert_eq!(names, ["plan_trip"], "{what}: the call's name once");
                arguments
            } else {
                let expected = if ask.real_model {
                    finish.first().copied().unwrap_or("none")
                } else {
                    "stop"
                };
                assert_eq!(finish, [expected], "{what}: one finish reason");
                chat::streamed_text(&chunks)
            };
            Got {
                text,
                completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
            }
        }
        Kind::ChatBody => {
            let reply = chat::post(client, &body).await;
            assert_eq!(reply.status, 200, "{what}: {reply}");
            let reply = reply.json();
            assert_usage_adds_up(&reply["usage"], "prompt_tokens", "completion_tokens", &what);
            Got {
                text: chat::content(&reply),
                completion_tokens: reply["usage"]["completion_tokens"].as_u64().unwrap_or(0),
            }
        }
        Kind::ResponseStream => {
            let frames = client
                .stream("/responses", &body)
                .await
                .expect("stream")
                .collect()
                .await
                .expect("frames");
            let events: Vec<Value> = frames.iter().map(SseFrame::json).collect();
            let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
            assert!(!types.contains(&"response.failed"), "{what}: {types:?}");
            for (n, e) in events.iter().enumerate() {
                assert_eq!(e["sequence_number"], n, "{what}: sequence numbers run on");
            }
            let last = &events.last().expect("events")["response"];
            assert_ended_whole(last, ask, &what);
            let id = events[0]["response"]["id"].as_str().expect("id").to_owned();
            let stored =
                stored_as_told(client, &id, last, &responses::streamed_text(&frames), &what).await;
            Got {
                text: responses::output_text(&stored),
                completion_tokens: stored["usage"]["output_tokens"].as_u64().unwrap_or(0),
            }
        }
        Kind::Background => {
            let created = responses::create(client, &body).await;
            let id = responses::id(&created);
            let done = responses::wait_for_status(
                client,
                &id,
                &["completed", "failed", "incomplete", "cancelled"],
                Duration::from_secs(60),
            )
            .await;
            assert_ended_whole(&done, ask, &what);
            let replayed = responses::replay(client, &id).await;
            let terminal = replayed
                .iter()
                .filter(|f| {
                    matches!(
                        f.event.as_deref(),
                        Some("response.completed" | "response.failed" | "response.incomplete")
                    )
                })
                .count();
            assert_eq!(terminal, 1, "{what}: one terminal event in the log");
            let stored = stored_as_told(
                client,
                &id,
                &done,
                &responses::streamed_text(&replayed),
                &what,
            )
            .await;
            Got {
                text: responses::output_text(&stored),
                completion_tokens: stored["usage"]["output_tokens"].as_u64().unwrap_or(0),
            }
        }
    }
}

/// A Response ended whole: `completed`, or on the real model stopped at
/// its `max_output_tokens` (a story may be longer).
#[track_caller]
fn assert_ended_whole(response: &Value, ask: &Ask, what: &str) {
    let whole = response["status"] == "completed"
        || ask.real_model
            && response["status"] == "incomplete"
            && response["incomplete_details"]["reason"] == "max_output_tokens";
    assert!(whole, "{what}: {response}");
}

/// The stored Response `id`, asserting it has the status its client was
/// `told`, says `text` and its usage adds up.
async fn stored_as_told(client: &Client, id: &str, told: &Value, text: &str, what: &str) -> Value {
    let stored = client.get(&format!("/responses/{id}")).await.expect("get");
    assert_eq!(stored.status, 200, "{what}: {stored}");
    let stored = stored.json();
    assert_eq!(stored["status"], told["status"], "{what}");
    assert_eq!(
        responses::output_text(&stored),
        text,
        "{what}: the stored object is what its client got"
    );
    assert_usage_adds_up(&stored["usage"], "input_tokens", "output_tokens", what);
    stored
}

#[track_caller]
fn assert_usage_adds_up(usage: &Value, prompt: &str, completion: &str, what: &str) {
    let (p, c, t) = (
        usage[prompt].as_u64().unwrap_or(0),
        usage[completion].as_u64().unwrap_or(0),
        usage["total_tokens"].as_u64().unwrap_or(0),
    );
    assert!(
        p > 0 && c > 0 && p + c == t,
        "{what}: usage adds up: {usage}"
    );
}

/// The names of a stream's tool calls (each header once) and the first
/// call's arguments, joined from their deltas.
fn streamed_call(chunks: &[Value], what: &str) -> (Vec<String>, String) {
    let mut names = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    let mut arguments = String::new();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    for call in &deltas {
        assert_eq!(call["index"], 0, "{what}: one call: {deltas:?}");
        if let Some(name) = call["function"]["name"].as_str() {
            names.push(name.to_owned());
        }
        if let Some(id) = call["id"].as_str() {
            assert!(ids.insert(id.to_owned()), "{what}: the call's id once");
        }
        arguments.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
    }
    (names, arguments)
}

fn asks(n: usize, real_model: bool) -> Vec<Ask> {
    (0..n)
        .map(|i| Ask {
            kind: KINDS[i % KINDS.len()],
            i,
            items: if real_model { 8 } else { 30 },
            tokens: if real_model { 200 } else { 300 },
            real_model,
        })
        .collect()
}

fn spawn_all(client: &Client, asks: Vec<Ask>) -> Vec<(Ask, tokio::task::JoinHandle<Got>)> {
    asks.into_iter()
        .map(|ask| {
            let client = client.clone();
            (ask, tokio::spawn(async move { run(&client, &ask).await }))
        })
        .collect()
}

/// Asserts every JSON reply is one document that validates, and returns
/// what each client got, by request.
async fn whole_replies(runs: Vec<(Ask, tokio::task::JoinHandle<Got>)>) -> Vec<(Kind, Got)> {
    let mut out = Vec::new();
    for (ask, task) in runs {
        let got = task
            .await
            .unwrap_or_else(|e| panic!("request {}: {e}", ask.i));
        let schema = match ask.kind {
            Kind::JsonSchema => Some(outline_schema(ask.items)),
            Kind::StrictTool => Some(trip_schema(ask.items)),
            _ => None,
        };
        if let Some(schema) = schema {
            let value: Value = serde_json::from_str(&got.text).unwrap_or_else(|e| {
                panic!(
                    "request {} ({:?}): one JSON document ({e}): {}",
                    ask.i, ask.kind, got.text
                )
            });
            let validator = jsonschema::validator_for(&schema).expect("schema");
            assert!(validator.is_valid(&value), "request {}: {value}", ask.i);
        } else {
            assert!(!got.text.is_empty(), "request {}: a reply", ask.i);
        }
        out.push((ask.kind, got));
    }
    out
}

async fn running(w: &Worker) -> u32 {
    w.load().await.map(|l| l.running).unwrap_or(0)
}

/// The index of the live worker running the most generations now.
async fn busiest(workers: &[Worker], skip: &[usize]) -> usize {
    let mut best = (0, None);
    for (i, w) in workers.iter().enumerate() {
        if skip.contains(&i) {
            continue;
        }
        let n = running(w).await;
        if best.1.is_none() || n > best.0 {
            best = (n, Some(i));
        }
    }
    best.1.expect("a live worker")
}

fn seeded() -> rand::rngs::StdRng {
    let seed = std::env::var("IGW_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("fault points from IGW_FAULT_SEED={seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// Three paced synthetic workers, each behind a fault proxy, and a gateway
/// over the proxies that takes a silent worker as failed after 5 s (a
/// margin over the 1 s at which a non-streamed reply sends its output, on
/// a loaded machine).
struct Pool {
    workers: Vec<Worker>,
    links: Vec<FaultProxy>,
    gateway: Gateway,
}

fn pool(opts: WorkerOpts) -> Pool {
    let workers = start_workers("base", &[opts.clone(), opts.clone(), opts]);
    let links: Vec<FaultProxy> = workers
        .iter()
        .map(|w| FaultProxy::start(w.addr().parse().expect("addr")).expect("proxy"))
        .collect();
    let mut gateway_opts = GatewayOpts {
        extra_toml: "[models.base]\npolicy = \"least_loaded\"\nstall_timeout_ms = 5000\n".into(),
        ..GatewayOpts::default()
    };
    gateway_opts.workers.insert(
        "base".into(),
        links.iter().map(|l| l.addr().to_string()).collect(),
    );
    let gateway = Gateway::start(gateway_opts).expect("gateway starts");
    Pool {
        workers,
        links,
        gateway,
    }
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Kill,
    Partition,
    Drain,
}

/// Fifty requests of every kind; two workers hit by `fault` at random
/// points while they run (the second after the first's generations moved,
/// so one generation may move twice); then every reply is checked whole
/// and equal to the same request's reply on the healed pool.
async fn fifty_under(fault: Fault) {
    let opts = WorkerOpts {
        grace_period_seconds: Some(1),
        ..WorkerOpts::paced(0, PACE)
    };
    let mut pool = pool(opts);
    let client = pool.gateway.client();
    let mut rng = seeded();
    let runs = spawn_all(&client, asks(REQUESTS, false));
    let mut hit = Vec::new();
    let mut at = rng.random_range(300..1200);
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(at)).await;
        let victim = busiest(&pool.workers, &hit).await;
        println!(
            "{fault:?} worker {victim} with {} running",
            running(&pool.workers[victim]).await
        );
        match fault {
            Fault::Kill => pool.workers[victim].kill(),
            Fault::Partition => pool.links[victim].partition(),
            Fault::Drain => pool.workers[victim].signal(libc::SIGTERM),
        }
        hit.push(victim);
        at = rng.random_range(400..1200);
    }
    let got = whole_replies(runs).await;
    let moved = pool.gateway.generation_moves("base", "moved").await;
    assert!(moved >= 2.0, "generations moved ({moved})");
    assert_eq!(pool.gateway.generation_moves("base", "failed").await, 0.0);

    // The reference: the same requests on a healed pool, no fault.
    for i in hit {
        pool.links[i].heal();
        if !pool.workers[i].is_running() {
            pool.workers[i].restart().expect("restart");
        }
    }
    let reference = whole_replies(spawn_all(&client, asks(REQUESTS, false))).await;
    for (i, ((kind, got), (_, want))) in got.iter().zip(&reference).enumerate() {
        assert_eq!(
            got, want,
            "request {i} ({kind:?}) reads as the reply without the fault"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_generations_of_every_kind_survive_two_sigkills() {
    bounded(90, fifty_under(Fault::Kill)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_generations_of_every_kind_survive_two_partitioned_worker_links() {
    bounded(90, fifty_under(Fault::Partition)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_generations_of_every_kind_survive_two_drains_shorter_than_the_replies() {
    bounded(90, fifty_under(Fault::Drain)).await;
}

/// The real model (llama.cpp in process, SmolLM2), two workers, one request
/// of each kind; the worker running more of them is SIGKILLed once every
/// stream has sent its first tokens: every reply is whole, the JSON ones
/// validate, the stored ones equal what their clients got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_real_model_every_kind_survives_a_sigkill() {
    bounded(180, async {
        let file = harness::model::model_file().expect("the SmolLM2 GGUF");
        let opts = WorkerOpts::llama(&file, 1024, 3);
        let mut workers = start_workers("base", &[opts.clone(), opts]);
        let gateway = harness::gateway_over(
            &workers.iter().collect::<Vec<_>>(),
            "[models.base]\npolicy = \"least_loaded\"\n",
        );
        let client = gateway.client();
        let runs = spawn_all(&client, asks(KINDS.len(), true));
        // Every streamed reply past its first token (the gateway timed it),
        // then a few more tokens.
        harness::wait_until(
            "the streams' first tokens",
            Duration::from_secs(60),
            || async {
                let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
                let first_tokens = sample(
                    &page,
                    "gen_ai_server_time_to_first_token_seconds_count",
                    &["gen_ai_request_model=\"base\""],
                );
                first_tokens >= 4.0
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let victim = busiest(&workers, &[]).await;
        workers[victim].kill();
        whole_replies(runs).await;
        assert!(gateway.generation_moves("base", "moved").await >= 1.0);
        assert_eq!(gateway.generation_moves("base", "failed").await, 0.0);
    })
    .await;
}
