//! The real model end to end: the real gateway in front of a real `llama`
//! worker (llama.cpp in process) on the SmolLM2-135M GGUF. Short replies and
//! a 1024-token window keep it fast. SmolLM2 is a weak model: the asserts
//! are on structure (lengths, stops, schema validity, cache counts), not on
//! what it knows.

use harness::model::model_file;
use harness::replies::{chat, content, output_text, post_chat as post};
use harness::{assert_error, json, Stack, Value, WorkerOpts};
use std::time::{Duration, Instant};

const N_CTX: u32 = 1024;

fn llama_stack(parallel: u32) -> Stack {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::llama(&file, N_CTX, parallel))
        .start()
        .expect("stack starts")
}

#[tokio::test]
async fn chat_non_streaming_and_streaming() {
    let stack = llama_stack(2);
    let r = post(&stack, &chat("What is 2 + 2?", 24)).await;
    assert!(!content(&r).trim().is_empty(), "{r}");
    let usage = &r["usage"];
    assert!(usage["prompt_tokens"].as_u64().unwrap_or(0) > 5, "{r}");
    let completion = usage["completion_tokens"].as_u64().unwrap_or(0);
    assert!((1..=24).contains(&completion), "{r}");
    let reason = r["choices"][0]["finish_reason"].as_str().unwrap_or("");
    assert!(reason == "stop" || reason == "length", "{r}");

    let mut body = chat("Name three colors.", 16);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let frames = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames");
    assert!(frames.last().is_some_and(|f| f.is_done()));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| f.json())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
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

/// The prompt is the model's own template's: SmolLM2's Jinja template adds
/// its default system message when the caller sends none, so a bare user
/// message costs exactly as many prompt tokens as one with that system
/// message spelled out (and more than one with a shorter system message).
#[tokio::test]
async fn the_prompt_is_rendered_by_the_model_s_own_template() {
    let stack = llama_stack(1);
    let prompt_tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let bare = post(&stack, &chat("Hi", 1)).await;
    let mut body = chat("Hi", 1);
    body["messages"] = json!([
        {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"role": "user", "content": "Hi"},
    ]);
    let spelled_out = post(&stack, &body).await;
    body["messages"][0]["content"] = json!("Be brief.");
    let short = post(&stack, &body).await;
    assert_eq!(
        prompt_tokens(&bare),
        prompt_tokens(&spelled_out),
        "{bare}\n{spelled_out}"
    );
    assert!(
        prompt_tokens(&short) < prompt_tokens(&bare),
        "{short}\n{bare}"
    );
}

#[tokio::test]
async fn max_tokens_gives_length_and_a_stop_string_ends_the_text_before_it() {
    let stack = llama_stack(2);
    let prompt = "Count from 1 to 20, separated by commas.";
    let r = post(&stack, &chat(prompt, 5)).await;
    assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], 5, "{r}");

    // A stop string taken from the greedy reply itself, a few characters in.
    let full = content(&post(&stack, &chat(prompt, 12)).await);
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    let (at, stop) = (2..chars.len().saturating_sub(2))
        .map(|i| {
            let start = chars[i].0;
            let end = chars.get(i + 2).map_or(full.len(), |c| c.0);
            (start, full[start..end].to_owned())
        })
        .find(|(start, s)| full.find(s.as_str()) == Some(*start) && !s.trim().is_empty())
        .expect("a stop string in the reply");
    let mut body = chat(prompt, 12);
    body["stop"] = json!([stop]);
    let r = post(&stack, &body).await;
    assert_eq!(content(&r), full[..at], "stop {stop:?} in {full:?}");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn same_seed_and_a_cold_cache_give_the_same_text() {
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": 16,
        "temperature": 0.8,
        "seed": 1234,
    });
    let mut texts = Vec::new();
    for _ in 0..2 {
        // A fresh worker each time: a cold cache.
        let stack = llama_stack(1);
        texts.push(content(&post(&stack, &body).await));
    }
    assert!(!texts[0].is_empty());
    assert_eq!(texts[0], texts[1]);
    // Greedy twice on one worker (the second reuses the cached prompt).
    let stack = llama_stack(1);
    let a = content(&post(&stack, &chat("What is the capital of France?", 8)).await);
    let b = content(&post(&stack, &chat("What is the capital of France?", 8)).await);
    assert_eq!(a, b);
}

/// A chat body asking for JSON under `schema`; `strict` needs the strict
/// subset (`additionalProperties: false`, every property required).
fn schema_reply(schema: &Value, strict: bool) -> (Value, Value) {
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Describe a person who likes colors, as JSON."}],
        "max_tokens": 120,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": strict}},
    });
    (body, schema.clone())
}

#[tokio::test]
async fn json_schema_replies_parse_and_validate() {
    let stack = llama_stack(2);
    let schemas = [
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
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "sunny": {"type": "boolean"}
            },
            "required": ["city", "sunny"],
            "additionalProperties": false
        }),
    ];
    for (i, schema) in schemas.iter().enumerate() {
        let (body, schema) = schema_reply(schema, i == 2);
        let r = post(&stack, &body).await;
        let text = content(&r);
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
    let r = post(&stack, &body).await;
    if r["choices"][0]["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(&content(&r)).expect("a JSON object");
        assert!(v.is_object());
    }
}

#[tokio::test]
async fn a_strict_required_tool_call_has_schema_valid_arguments() {
    let stack = llama_stack(2);
    let params = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 30},
            "unit": {"enum": ["celsius", "fahrenheit"]}
        },
        "required": ["city", "unit"],
        "additionalProperties": false
    });
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
    let r = post(&stack, &body).await;
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    let call = &choice["message"]["tool_calls"][0];
    assert!(
        call["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("call_")),
        "{r}"
    );
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
        .expect("arguments are JSON");
    let validator = jsonschema::validator_for(&params).expect("schema");
    assert!(validator.is_valid(&args), "{args}");
}

#[tokio::test]
async fn a_repeated_long_prefix_reports_cached_tokens() {
    let stack = llama_stack(2);
    let system = "You are a careful assistant for a shipping company. ".repeat(20);
    let ask = |q: &str| {
        json!({
            "model": "base",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 4,
            "temperature": 0,
        })
    };
    let first = post(&stack, &ask("Where is my parcel?")).await;
    let cached = |r: &Value| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(cached(&first), Some(0), "{first}");
    let second = post(&stack, &ask("How much is shipping?")).await;
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let hit = cached(&second).unwrap_or(0);
    assert!(
        hit > 100 && hit < prompt,
        "cached {hit} of {prompt}: {second}"
    );
}

#[tokio::test]
async fn a_prompt_over_the_real_window_is_a_400() {
    let stack = llama_stack(1);
    let long = "apple banana cherry ".repeat(400);
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat(&long, 16))
        .await
        .expect("reply");
    let err = assert_error(&reply, 400, "context_length_exceeded");
    assert!(
        err["message"]
            .as_str()
            .is_some_and(|m| m.contains(&N_CTX.to_string())),
        "{err}"
    );
    // Fits alone, not with max_tokens.
    let reply = stack
        .client()
        .post_json("/chat/completions", &chat(&"apple ".repeat(300), 900))
        .await
        .expect("reply");
    assert_error(&reply, 400, "context_length_exceeded");
}

#[tokio::test]
async fn an_image_part_is_refused_by_name() {
    let stack = llama_stack(1);
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
        ]}],
        "max_tokens": 4,
    });
    let reply = stack
        .client()
        .post_json("/chat/completions", &body)
        .await
        .expect("reply");
    assert_eq!(reply.status, 400, "{reply}");
    assert!(reply.text().contains("content[1]"), "{reply}");
}

#[tokio::test]
async fn a_dropped_stream_frees_its_slot() {
    let stack = llama_stack(2);
    let mut body = chat("Tell me a very long story about dragons.", 800);
    body["stream"] = json!(true);
    body["temperature"] = json!(0.9);
    let mut stream = stack
        .client()
        .stream("/chat/completions", &body)
        .await
        .expect("stream");
    for _ in 0..3 {
        stream.next_frame().await.expect("frame");
    }
    let worker = stack.worker("base");
    let load = worker.info().await.expect("info").load.unwrap_or_default();
    assert_eq!(load.running, 1, "{load:?}");
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = worker.info().await.expect("info");
        let load = info.load.unwrap_or_default();
        let cancelled = info.counters.unwrap_or_default().cancelled;
        if load.running == 0 && cancelled == 1 {
            // The slot is free; its cells stay cached for prefix reuse.
            let usage = load.kv_cache_usage.unwrap_or(0.0);
            assert!(usage > 0.0 && usage <= 1.0, "{load:?}");
            break;
        }
        assert!(Instant::now() < deadline, "slot not freed: {load:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Four sequences share the engine's decode batch: each has streamed
/// content while all four hold a slot, and dropping them frees every slot.
/// (Throughput is measured by `realbench`, not asserted here.)
#[tokio::test]
async fn four_concurrent_streams_decode_together() {
    let stack = llama_stack(4);
    let mut streams = Vec::new();
    for i in 0..4 {
        let mut body = chat(
            &format!("Tell me a very long story about dragon number {i}."),
            800,
        );
        body["stream"] = json!(true);
        body["temperature"] = json!(0.9);
        body["seed"] = json!(i);
        let stream = stack
            .client()
            .stream("/chat/completions", &body)
            .await
            .expect("stream");
        streams.push(stream);
    }
    for stream in &mut streams {
        loop {
            let frame = stream.next_frame().await.expect("frame").expect("open");
            assert!(!frame.is_done(), "a long story ended at once");
            let delta = &frame.json()["choices"][0]["delta"]["content"];
            if delta.as_str().is_some_and(|t| !t.is_empty()) {
                break;
            }
        }
    }
    let worker = stack.worker("base");
    let load = worker.info().await.expect("info").load.unwrap_or_default();
    assert_eq!((load.running, load.queued), (4, 0), "{load:?}");
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = worker.info().await.expect("info");
        let load = info.load.unwrap_or_default();
        if load.running == 0 && info.counters.unwrap_or_default().cancelled == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "slots not freed: {load:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_response(stack: &Stack, id: &str, done: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = stack
            .client()
            .get(&format!("/responses/{id}"))
            .await
            .expect("retrieve");
        assert_eq!(r.status, 200, "{r}");
        let v = r.json();
        if done.contains(&v["status"].as_str().unwrap_or_default()) {
            return v;
        }
        assert!(Instant::now() < deadline, "still {}", v["status"]);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn responses_create_background_retrieve_stream_and_cancel() {
    let stack = llama_stack(2);
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "What is 2 + 2?", "max_output_tokens": 16, "temperature": 0}),
        )
        .await
        .expect("create");
    assert_eq!(r.status, 200, "{r}");
    let obj = r.json();
    assert!(!output_text(&obj).trim().is_empty(), "{obj}");

    // Background, then the stored run replayed as a stream.
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "Name a color.", "max_output_tokens": 12,
                    "temperature": 0, "background": true}),
        )
        .await
        .expect("create");
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap_or_default().to_owned();
    let done = wait_response(&stack, &id, &["completed", "incomplete"]).await;
    let frames = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames");
    let events: Vec<String> = frames.iter().filter_map(|f| f.event.clone()).collect();
    assert_eq!(events.first().map(String::as_str), Some("response.created"));
    assert!(events.last().is_some_and(|e| e.starts_with("response.")));
    let streamed: String = frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("response.output_text.delta"))
        .filter_map(|f| f.json()["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, output_text(&done));

    // Cancelling a background run frees the sequence.
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "Tell me a very long story about dragons.",
                    "max_output_tokens": 800, "temperature": 0.9, "background": true}),
        )
        .await
        .expect("create");
    let id = r.json()["id"].as_str().unwrap_or_default().to_owned();
    let worker = stack.worker("base");
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker
        .info()
        .await
        .expect("info")
        .load
        .unwrap_or_default()
        .running
        == 0
    {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = client
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(r.status, 200, "{r}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = worker.info().await.expect("info");
        let running = info.load.unwrap_or_default().running;
        if running == 0 && info.counters.unwrap_or_default().cancelled >= 1 {
            break;
        }
        assert!(Instant::now() < deadline, "sequence not freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
