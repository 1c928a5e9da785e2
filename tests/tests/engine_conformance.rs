//! Engine conformance: what a client sees must not depend on the engine
//! behind the worker. Each case below is written once and run against
//! every engine, as `CASE::simulator`, `CASE::llama` and `CASE::upstream`
//! (`cargo test --release -p tests --test engine_conformance ::llama` runs
//! one engine's):
//!
//! - `simulator`: the synthetic engine, paced so that a stream can be
//!   dropped mid-way, with the same window as the real engines.
//! - `llama`: llama.cpp in process on the SmolLM2-135M GGUF
//!   (`IGW_MODEL_FILE`, else `scripts/fetch-model.sh`).
//! - `upstream`: an `upstream` worker in front of llama.cpp's own
//!   `llama-server` on the same GGUF (`LLAMA_SERVER`, else
//!   `scripts/llama-server.sh`, which builds it once into `target/`).
//!
//! A real engine that cannot be found fails its tests, as in `llama_e2e`
//! and `upstream_e2e`: the test command provides both. What only one engine
//! does (its own template, its load report, its health) stays in that
//! engine's file. SmolLM2 is a weak model: the asserts are on structure
//! (lengths, stops, schema validity, counts, event order), not on what it
//! knows.

use harness::{
    assert_error, chat, json, responses, wait_until, LlamaServer, SseStream, Stack, Value, Worker,
    WorkerOpts,
};
use std::time::{Duration, Instant};

/// Tokens per sequence on every engine.
const N_CTX: u32 = 1024;

/// The simulator's decode speed: slow enough that an 800-token story is
/// still running when a test drops it, fast enough for short replies.
const SIMULATOR_TOKENS_PER_SECOND: u64 = 200;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Engine {
    Simulator,
    Llama,
    Upstream,
}

/// One engine behind a gateway. Fields drop in order: the stack (gateway
/// and worker) before the engine process it fronts.
struct Instance {
    engine: Engine,
    stack: Stack,
    server: Option<LlamaServer>,
}

impl Engine {
    /// A `base` stack on this engine with `parallel` sequences.
    async fn start(self, parallel: u32) -> Instance {
        let (stack, server) = match self {
            Engine::Simulator => {
                let opts = WorkerOpts {
                    context_window: Some(u64::from(N_CTX)),
                    ..WorkerOpts::paced(0, SIMULATOR_TOKENS_PER_SECOND)
                };
                (Stack::single(opts), None)
            }
            Engine::Llama => (
                Stack::single(WorkerOpts::llama(&model_file(), N_CTX, parallel)),
                None,
            ),
            Engine::Upstream => {
                let server = LlamaServer::start(&model_file(), N_CTX, parallel)
                    .await
                    .expect("llama-server starts (scripts/llama-server.sh)");
                let opts = WorkerOpts::upstream(server.url(), "llama-server");
                (Stack::single(opts), Some(server))
            }
        };
        Instance {
            engine: self,
            stack,
            server,
        }
    }

    /// The engine's name in the worker's `Info`.
    fn name(self) -> &'static str {
        match self {
            Engine::Simulator => "synthetic",
            Engine::Llama => "llama",
            Engine::Upstream => "upstream",
        }
    }

    /// A prompt for a story longer than any test waits for. The simulator
    /// is told its length (its reply length is otherwise its own).
    fn long_story(self, about: &str) -> String {
        let ask = format!("Tell me a very long story about {about}.");
        match self {
            Engine::Simulator => format!("{ask} synthetic:reply_tokens=800"),
            Engine::Llama | Engine::Upstream => ask,
        }
    }
}

fn model_file() -> std::path::PathBuf {
    harness::model::model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)")
}

impl Instance {
    fn worker(&self) -> &Worker {
        self.stack.worker("base")
    }

    /// Sequences the engine itself runs: llama-server's own count behind
    /// an upstream worker, the worker's load elsewhere.
    async fn engine_running(&self) -> u32 {
        match &self.server {
            Some(server) => server.running_and_waiting().await.expect("metrics").0,
            None => self.worker_running().await,
        }
    }

    async fn worker_running(&self) -> u32 {
        self.worker().load().await.expect("load").running
    }

    /// llama-server's busy slots, which must agree with its running count.
    async fn assert_busy_slots(&self, busy: usize) {
        if let Some(server) = &self.server {
            assert_eq!(server.busy_slots().await.expect("slots"), busy);
        }
    }

    /// After a cancelled sequence, what the engine keeps: the in-process
    /// engine keeps its cells cached for prefix reuse; llama-server has no
    /// busy slot left.
    async fn assert_sequence_released(&self) {
        match self.engine {
            Engine::Llama => {
                let load = self.worker().load().await.expect("load");
                let usage = load.kv_cache_usage.unwrap_or(0.0);
                assert!(usage > 0.0 && usage <= 1.0, "{load:?}");
            }
            Engine::Upstream => self.assert_busy_slots(0).await,
            Engine::Simulator => {}
        }
    }

    /// Opens a streamed story that outlasts the test.
    async fn open_long_stream(&self, seed: u32) -> SseStream {
        let prompt = self.engine.long_story(&format!("dragon number {seed}"));
        self.stack
            .client()
            .stream("/chat/completions", &chat::long_story(&prompt, seed))
            .await
            .expect("stream")
    }
}

fn prompt_tokens(reply: &Value) -> u64 {
    reply["usage"]["prompt_tokens"].as_u64().unwrap_or(0)
}

fn cached_tokens(reply: &Value) -> Option<u64> {
    reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64()
}

// ---- the cases -------------------------------------------------------------

async fn chat_non_streaming_and_streaming(engine: Engine) {
    let it = engine.start(2).await;
    let info = it.worker().info().await.expect("info");
    assert_eq!(info.engine, engine.name());
    assert_eq!(
        info.context_window, N_CTX,
        "the engine's per-sequence window"
    );

    let r = chat::create(&it.stack, &chat::greedy("What is 2 + 2?", 24)).await;
    assert!(!chat::content(&r).trim().is_empty(), "{r}");
    let prompt = prompt_tokens(&r);
    assert!(prompt > 5, "{r}");
    let completion = r["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=24).contains(&completion), "{r}");
    let reason = r["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(reason == "stop" || reason == "length", "{r}");

    let mut body = chat::greedy("Name three colors.", 16);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = chat::chunks(&chat::stream(&it.stack.client(), &body).await);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text = chat::streamed_text(&chunks);
    assert!(!text.trim().is_empty(), "{chunks:?}");
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"].is_string()));
    let usage = chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or_default();
    assert!(
        usage["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{usage}"
    );
}

/// A long shared prefix is reported as cached on the second request, an
/// identical prompt too, and the worker counts every prompt with the
/// engine's own tokenizer: the same numbers the replies report.
async fn a_repeated_prefix_reports_cached_tokens(engine: Engine) {
    let it = engine.start(2).await;
    let mut prompts_reported = 0;
    let system = "You are a careful assistant for a shipping company. ".repeat(20);
    let ask = |q: &str| {
        json!({
            "model": "base",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 4,
            "temperature": 0,
        })
    };
    let first = chat::create(&it.stack, &ask("Where is my parcel?")).await;
    assert_eq!(cached_tokens(&first), Some(0), "{first}");
    let second = chat::create(&it.stack, &ask("How much is shipping?")).await;
    let prompt = prompt_tokens(&second);
    let hit = cached_tokens(&second).unwrap_or(0);
    assert!(
        hit > 100 && hit < prompt,
        "cached {hit} of {prompt}: {second}"
    );
    prompts_reported += prompt_tokens(&first) + prompt;

    // The same prompt again. (Not compared as text: reused KV cells
    // change float order.)
    let once = chat::create(&it.stack, &chat::greedy("What is 2 + 2?", 24)).await;
    let again = chat::create(&it.stack, &chat::greedy("What is 2 + 2?", 24)).await;
    let prompt = prompt_tokens(&again);
    let cached = cached_tokens(&again).unwrap_or(0);
    assert!(cached > 0 && cached <= prompt, "cached {cached}: {again}");
    prompts_reported += prompt_tokens(&once) + prompt;

    let counted = it
        .worker()
        .counters()
        .await
        .expect("counters")
        .prompt_tokens;
    assert_eq!(counted, prompts_reported, "worker count vs engine usage");
}

async fn max_tokens_gives_length(engine: Engine) {
    let it = engine.start(1).await;
    let prompt = chat::greedy("Count from 1 to 20, separated by commas.", 5);
    let r = chat::create(&it.stack, &prompt).await;
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 5, "{r}");
}

async fn a_stop_string_ends_the_text_before_it(engine: Engine) {
    let it = engine.start(2).await;
    let prompt = "Count from 1 to 20, separated by commas.";
    // A stop string taken from the greedy reply itself, a few characters in.
    let full = chat::content(&chat::create(&it.stack, &chat::greedy(prompt, 12)).await);
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    let (at, stop) = (2..chars.len().saturating_sub(2))
        .map(|i| {
            let start = chars[i].0;
            let end = chars.get(i + 2).map_or(full.len(), |c| c.0);
            (start, full[start..end].to_owned())
        })
        .find(|(start, s)| full.find(s.as_str()) == Some(*start) && !s.trim().is_empty())
        .expect("a stop string in the reply");
    let mut body = chat::greedy(prompt, 12);
    body["stop"] = json!([stop]);
    let r = chat::create(&it.stack, &body).await;
    assert_eq!(chat::content(&r), full[..at], "stop {stop:?} in {full:?}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
}

async fn json_schema_replies_parse_and_validate(engine: Engine) {
    let it = engine.start(2).await;
    let person = "Describe a person who likes colors, as JSON.";
    // (prompt, schema, strict, max_tokens); `strict` needs the strict
    // subset (`additionalProperties: false`, every property required).
    let cases = [
        (
            person,
            json!({
                "type": "object",
                "properties": {"person": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "maxLength": 24},
                        "age": {"type": "integer", "minimum": 0, "maximum": 120}
                    },
                    "required": ["name", "age"]
                }},
                "required": ["person"]
            }),
            false,
            120,
        ),
        (
            person,
            json!({
                "type": "object",
                "properties": {"colors": {
                    "type": "array",
                    "items": {"enum": ["red", "green", "blue"]},
                    "minItems": 1,
                    "maxItems": 3
                }},
                "required": ["colors"]
            }),
            false,
            120,
        ),
        (person, city_weather_schema(), true, 120),
        (
            "Describe the weather in a city, as JSON.",
            city_weather_schema(),
            true,
            80,
        ),
    ];
    for (prompt, schema, strict, max_tokens) in cases {
        let body = json!({
            "model": "base",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": strict}},
        });
        let r = chat::create(&it.stack, &body).await;
        let text = chat::content(&r);
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let validator = jsonschema::validator_for(&schema).expect("schema compiles");
        assert!(validator.is_valid(&value), "{value} against {schema}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    }
    // json_object: any JSON object.
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Give me a JSON object about a cat."}],
        "max_tokens": 80,
        "temperature": 0,
        "response_format": {"type": "json_object"},
    });
    let r = chat::create(&it.stack, &body).await;
    if r["choices"][0]["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(&chat::content(&r)).expect("a JSON object");
        assert!(v.is_object());
    }
}

fn city_weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "sunny": {"type": "boolean"}
        },
        "required": ["city", "sunny"],
        "additionalProperties": false
    })
}

fn weather_params() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    })
}

/// The call's id has the `call_` shape and its arguments are JSON.
#[track_caller]
fn call_arguments(reply: &Value) -> (String, Value) {
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let call = &choice["message"]["tool_calls"][0];
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{reply}"
    );
    let name = call["function"]["name"].as_str().unwrap_or_default();
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .expect("arguments are JSON");
    (name.to_owned(), args)
}

/// One strict tool and `tool_choice: "required"`, with the default
/// (parallel) calls.
async fn a_strict_required_tool_call_has_schema_valid_arguments(engine: Engine) {
    let it = engine.start(2).await;
    let params = weather_params();
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather of a city",
            "parameters": params, "strict": true
        }}],
        "tool_choice": "required",
        "max_tokens": 80,
        "temperature": 0,
    });
    let r = chat::create(&it.stack, &body).await;
    let (name, args) = call_arguments(&r);
    assert_eq!(name, "get_weather");
    let validator = jsonschema::validator_for(&params).expect("schema");
    assert!(validator.is_valid(&args), "{args}");
}

/// Two tools, one call: `required` calls either with valid arguments, a
/// named choice calls that tool; streamed, the call's id and name come
/// once, then argument fragments that join into valid JSON. (SmolLM2's own
/// tool parsing on llama-server produces no call: the worker enforces
/// `required` and named choices with a schema of the call.)
async fn required_and_named_tool_choices_give_schema_valid_calls(engine: Engine) {
    let it = engine.start(2).await;
    let params = weather_params();
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": params, "strict": true}},
        {"type": "function", "function": {"name": "get_time", "description": "Local time of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}}, "required": ["city"]}}}
    ]);
    let validator = jsonschema::validator_for(&params).expect("schema");
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let body = |choice: &Value| {
        json!({
            "model": "base",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": tools,
            "tool_choice": choice,
            // One call: llama-server's grammar lets the model pad JSON with
            // whitespace, and an open array of calls runs to max_tokens.
            "parallel_tool_calls": false,
            "max_tokens": 120,
            "temperature": 0,
        })
    };
    for choice in [json!("required"), named.clone()] {
        let r = chat::create(&it.stack, &body(&choice)).await;
        let (name, args) = call_arguments(&r);
        if name == "get_weather" {
            assert!(validator.is_valid(&args), "{args}");
        } else {
            assert_eq!(name, "get_time", "{r}");
            assert!(
                choice == "required",
                "a named choice must call get_weather: {r}"
            );
        }
    }

    let frames = chat::stream(&it.stack.client(), &body(&named)).await;
    let deltas: Vec<Value> = chat::chunks(&frames)
        .iter()
        .flat_map(|c| {
            c["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let names = deltas
        .iter()
        .filter(|d| d["function"]["name"].is_string())
        .count();
    assert_eq!(names, 1, "{deltas:?}");
    let args: String = deltas
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    let args: Value = serde_json::from_str(&args).expect("streamed arguments are JSON");
    assert!(validator.is_valid(&args), "{args}");
}

/// The same `context_length_exceeded` on every engine, worded the same,
/// from the engine's own token count, before anything generates.
async fn a_prompt_over_the_window_is_a_400_before_generating(engine: Engine) {
    let it = engine.start(1).await;
    let client = it.stack.client();
    let long = chat::greedy(&"apple banana cherry ".repeat(400), 16);
    let reply = client
        .post_json("/chat/completions", &long)
        .await
        .expect("reply");
    let err = assert_error(&reply, 400, "context_length_exceeded");
    assert_eq!(err["param"], "messages", "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("maximum context length is {N_CTX} tokens")),
        "{err}"
    );
    // Refused before generating: the engine never saw a completion.
    assert_eq!(it.engine_running().await, 0);
    if let Some(server) = &it.server {
        let (running, waiting) = server.running_and_waiting().await.expect("metrics");
        assert_eq!((running, waiting), (0, 0));
    }
    let counters = it.worker().counters().await.expect("counters");
    assert_eq!((counters.started, counters.rejected), (0, 1));

    // Fits alone, not with max_tokens.
    let fits_alone = chat::greedy(&"apple ".repeat(300), 900);
    let reply = client
        .post_json("/chat/completions", &fits_alone)
        .await
        .expect("reply");
    let err = assert_error(&reply, 400, "context_length_exceeded");
    assert_eq!(err["param"], "messages", "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    // The counts may differ between engines by the template's default
    // system prompt; the wording may not.
    let opening = format!("This model's maximum context length is {N_CTX} tokens. However, ");
    assert!(message.starts_with(&opening), "{err}");
    assert!(message.contains("900 in the completion"), "{err}");
}

/// A client that goes away ends the engine's sequence: the engine frees
/// it, and the worker counts it cancelled.
async fn a_dropped_stream_frees_its_sequence(engine: Engine) {
    let it = engine.start(2).await;
    let mut stream = it.open_long_stream(1).await;
    for _ in 0..3 {
        stream.next_frame().await.expect("frame");
    }
    assert_eq!(it.engine_running().await, 1);
    it.assert_busy_slots(1).await;
    let dropped = Instant::now();
    drop(stream);
    wait_until(
        "the engine to free the sequence",
        Duration::from_secs(5),
        || async { it.engine_running().await == 0 },
    )
    .await;
    let freed = dropped.elapsed();
    let c = it
        .worker()
        .wait_counters(Duration::from_secs(5), |c| c.cancelled == 1)
        .await
        .expect("counters");
    assert_eq!(c.cancelled, 1, "{c:?}");
    wait_until(
        "the worker's load to follow",
        Duration::from_secs(5),
        || async { it.worker_running().await == 0 },
    )
    .await;
    it.assert_sequence_released().await;
    eprintln!("{engine:?}: sequence freed {freed:?} after the client dropped the stream");
}

/// A client that leaves a non-streamed request (the SDKs' default: one
/// body at the end) ends the engine's sequence as one that drops a stream
/// does, within about a second.
async fn a_non_streamed_request_whose_client_leaves_frees_its_sequence(engine: Engine) {
    let it = engine.start(1).await;
    let mut body = chat::long_story(&engine.long_story("a lighthouse"), 7);
    body["stream"] = json!(false);
    let sent = it
        .stack
        .client()
        .request(reqwest::Method::POST, "/chat/completions")
        .json(&body)
        .timeout(Duration::from_millis(1500))
        .send()
        .await;
    assert!(sent.is_err(), "the story outlasts the client");
    let left = Instant::now();
    let c = it
        .worker()
        .wait_counters(Duration::from_secs(5), |c| c.cancelled == 1)
        .await
        .expect("the worker cancels it, not completes it");
    assert_eq!(c.completed, 0, "{c:?}");
    wait_until(
        "the engine to free the sequence",
        Duration::from_secs(5),
        || async { it.engine_running().await == 0 },
    )
    .await;
    let freed = left.elapsed();
    assert!(freed < Duration::from_secs(2), "freed {freed:?} after");
    it.assert_sequence_released().await;
    eprintln!("{engine:?}: sequence freed {freed:?} after the client of a body left");
}

async fn responses_create_background_replay_and_cancel(engine: Engine) {
    let it = engine.start(2).await;
    let client = it.stack.client();
    let obj = responses::create(
        &client,
        &json!({"model": "base", "input": "What is 2 + 2?", "max_output_tokens": 16, "temperature": 0}),
    )
    .await;
    assert!(!responses::output_text(&obj).trim().is_empty(), "{obj}");

    // Background, then the stored run replayed as a stream.
    let obj = responses::create(
        &client,
        &json!({"model": "base", "input": "Name a color.", "max_output_tokens": 12,
                "temperature": 0, "background": true}),
    )
    .await;
    let id = responses::id(&obj);
    let done = responses::wait_for_status(
        &client,
        &id,
        &["completed", "incomplete"],
        Duration::from_secs(30),
    )
    .await;
    assert!(
        matches!(done["status"].as_str(), Some("completed" | "incomplete")),
        "still {}",
        done["status"]
    );
    assert!(!responses::output_text(&done).trim().is_empty(), "{done}");
    let frames = responses::replay(&client, &id).await;
    let events: Vec<String> = frames.iter().filter_map(|f| f.event.clone()).collect();
    assert_eq!(events.first().map(String::as_str), Some("response.created"));
    assert!(
        events
            .last()
            .is_some_and(|e| e == "response.completed" || e == "response.incomplete"),
        "{events:?}"
    );
    assert_eq!(
        responses::streamed_text(&frames),
        responses::output_text(&done)
    );

    // Cancelling a background run stops the engine's sequence.
    let obj = responses::create(
        &client,
        &json!({"model": "base", "input": engine.long_story("dragons"),
                "max_output_tokens": 800, "temperature": 0.9, "background": true}),
    )
    .await;
    let id = responses::id(&obj);
    wait_until("the engine to run it", Duration::from_secs(10), || async {
        it.engine_running().await == 1
    })
    .await;
    let r = client
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["status"], "cancelled", "{r}");
    wait_until("the engine to stop", Duration::from_secs(5), || async {
        it.engine_running().await == 0
    })
    .await;
    let c = it
        .worker()
        .wait_counters(Duration::from_secs(5), |c| c.cancelled >= 1)
        .await
        .expect("counters");
    assert!(c.cancelled >= 1, "{c:?}");
}

// ---- the instances ---------------------------------------------------------

/// Per case, a module with one `#[tokio::test]` per engine it lists (test
/// names `CASE::llama`, `CASE::upstream`, `CASE::simulator`; filter on
/// `::llama` for one engine). `engine = "reason"` is an ignored test that
/// says why that engine does not run the case (run it anyway with
/// `-- --include-ignored`).
macro_rules! conformance {
    ($($case:ident: $($engine:ident $(= $why:literal)?),+;)+) => {
        $(
            mod $case {
                $(
                    #[tokio::test]
                    $(#[ignore = $why])?
                    async fn $engine() {
                        super::$case(super::Engine::named(stringify!($engine))).await
                    }
                )+
            }
        )+
    };
}

impl Engine {
    fn named(name: &str) -> Engine {
        match name {
            "simulator" => Engine::Simulator,
            "llama" => Engine::Llama,
            "upstream" => Engine::Upstream,
            other => panic!("no engine named {other}"),
        }
    }
}

conformance! {
    chat_non_streaming_and_streaming: llama, upstream, simulator;
    a_repeated_prefix_reports_cached_tokens: llama, upstream, simulator;
    max_tokens_gives_length: llama, upstream, simulator;
    a_stop_string_ends_the_text_before_it: llama, upstream, simulator;
    json_schema_replies_parse_and_validate: llama, upstream, simulator;
    a_strict_required_tool_call_has_schema_valid_arguments: llama, simulator, upstream = "llama-server's grammar lets an open array of calls run to max_tokens: \
            upstream is asked for one call (required_and_named_tool_choices_give_schema_valid_calls)";
    required_and_named_tool_choices_give_schema_valid_calls: llama, upstream, simulator;
    a_prompt_over_the_window_is_a_400_before_generating: llama, upstream, simulator;
    a_dropped_stream_frees_its_sequence: llama, upstream, simulator;
    a_non_streamed_request_whose_client_leaves_frees_its_sequence: llama, upstream, simulator;
    responses_create_background_replay_and_cancel: llama, upstream, simulator;
}
