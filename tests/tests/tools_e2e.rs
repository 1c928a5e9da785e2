//! Function tools and structured output end to end, on both APIs, streaming
//! and not: every `tool_choice` mode, single and parallel calls, the full
//! round trip (call → tool result → text answer), and `json_object` /
//! strict `json_schema` replies that parse and validate.
//!
//! The synthetic worker's rules (docs/process-contract.md): `none` never
//! calls; a named choice calls that function; `required` calls the tools the
//! last user message names, else the first tool; `auto` calls the tools the
//! last user message names (whole word) unless the conversation ends with a
//! tool result; several calls only with `parallel_tool_calls`. What is
//! asserted here is what a client sees.

use harness::chat;
use harness::{json, Client, SseFrame, Stack, Value, WorkerOpts};
use std::collections::BTreeMap;

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}
        },
        "required": ["city", "unit", "days"],
        "additionalProperties": false
    })
}

fn time_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "timezone": {"type": "string"},
            "hour24": {"type": "boolean"},
            "offsets": {"type": "array", "items": {"type": "number"}, "maxItems": 3}
        },
        "required": ["timezone", "hour24"],
        "additionalProperties": false
    })
}

fn schema_of(name: &str) -> Value {
    match name {
        "get_weather" => weather_schema(),
        "get_time" => time_schema(),
        other => panic!("no tool named {other}"),
    }
}

/// The two tools in the chat (nested) shape.
fn chat_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast for a city.", "parameters": weather_schema(), "strict": true}},
        {"type": "function", "function": {"name": "get_time", "description": "Current time in a timezone.", "parameters": time_schema()}}
    ])
}

/// The two tools in the responses (flat) shape.
fn response_tools() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "description": "Weather forecast for a city.", "parameters": weather_schema(), "strict": true},
        {"type": "function", "name": "get_time", "description": "Current time in a timezone.", "parameters": time_schema(), "strict": false}
    ])
}

/// Asserts `instance` validates against `schema`, naming the first error.
#[track_caller]
fn assert_valid(schema: &Value, instance: &Value) {
    let validator = jsonschema::validator_for(schema).expect("the test schema compiles");
    if let Err(e) = validator.validate(instance) {
        panic!(
            "{instance} does not validate at '{}': {e}",
            e.instance_path()
        );
    }
}

/// Parses a tool call's `arguments` (a JSON string) and validates it
/// against the tool's schema; returns the parsed value.
#[track_caller]
fn check_arguments(name: &str, arguments: &str) -> Value {
    let v: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("arguments of {name} are not JSON ({e}): {arguments:?}"));
    assert_valid(&schema_of(name), &v);
    v
}

/// One function call as a client sees it.
#[derive(Debug, Clone, PartialEq)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// One chat turn as a client sees it, streaming or not.
#[derive(Debug)]
struct ChatTurn {
    content: Option<String>,
    calls: Vec<Call>,
    finish: String,
    usage: Value,
}

/// Sends a chat request without streaming and reads the turn, asserting
/// the tool-call shape of wire-conventions.
async fn chat_once(client: &Client, body: &Value) -> ChatTurn {
    let reply = client.post_json("/chat/completions", body).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let c = reply.json();
    // The reference reply's extra fields, empty when unused (spec 5).
    assert!(c.get("conversation_id").is_some_and(Value::is_null), "{c}");
    for field in ["thought", "tool_thought", "executable_data"] {
        assert!(c[field].is_array(), "{field} is an array: {c}");
    }
    let choice = &c["choices"][0];
    let m = &choice["message"];
    assert_eq!(m["role"], "assistant");
    assert!(m.get("refusal").is_some_and(Value::is_null), "{m}");
    let mut calls = Vec::new();
    if let Some(list) = m.get("tool_calls").filter(|v| !v.is_null()) {
        for (i, tc) in list
            .as_array()
            .expect("tool_calls is an array")
            .iter()
            .enumerate()
        {
            let obj = tc.as_object().unwrap();
            let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(keys, ["function", "id", "type"], "tool call {i}: {tc}");
            assert_eq!(tc["type"], "function");
            let id = tc["id"].as_str().expect("id is a string");
            assert!(id.starts_with("call_") && id.len() > 5, "{tc}");
            assert!(
                tc["function"]["arguments"].is_string(),
                "arguments is a JSON string: {tc}"
            );
            calls.push(Call {
                id: id.to_owned(),
                name: tc["function"]["name"].as_str().unwrap().to_owned(),
                arguments: tc["function"]["arguments"].as_str().unwrap().to_owned(),
            });
        }
    }
    ChatTurn {
        content: m["content"].as_str().map(str::to_owned),
        calls,
        finish: choice["finish_reason"].as_str().unwrap().to_owned(),
        usage: c["usage"].clone(),
    }
}

/// Sends a chat request with `stream: true` (and usage) and accumulates the
/// turn, asserting the stream rules: role chunk first; a tool call's first
/// delta for an index carries `id`, `type`, `name` and `arguments:""`, every
/// later one only `index` and an `arguments` fragment; then `delta:{}` with
/// the finish reason, the usage chunk and `[DONE]`.
async fn chat_streamed(client: &Client, body: &Value) -> ChatTurn {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let stream = client.stream("/chat/completions", &body).await.unwrap();
    assert_eq!(stream.status, 200);
    let frames: Vec<SseFrame> = stream.collect().await.unwrap();
    let last = frames.last().expect("frames");
    assert!(last.is_done(), "ends with [DONE]: {last:?}");
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(SseFrame::json)
        .collect();
    assert!(
        chunks.iter().all(|c| c.get("error").is_none()),
        "no error frame: {chunks:?}"
    );
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(
        usage_chunk["choices"],
        json!([]),
        "usage chunk last: {usage_chunk}"
    );
    let finish_chunk = &chunks[chunks.len() - 2];
    assert_eq!(
        finish_chunk["choices"][0]["delta"],
        json!({}),
        "{finish_chunk}"
    );
    let finish = finish_chunk["choices"][0]["finish_reason"]
        .as_str()
        .expect("finish_reason")
        .to_owned();

    let mut content: Option<String> = None;
    let mut calls: BTreeMap<u64, Call> = BTreeMap::new();
    for c in &chunks[1..chunks.len() - 2] {
        let choice = &c["choices"][0];
        assert!(choice["finish_reason"].is_null(), "{c}");
        let delta = choice["delta"].as_object().unwrap();
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            content.get_or_insert_with(String::new).push_str(text);
        }
        let Some(list) = delta.get("tool_calls") else {
            continue;
        };
        let list = list.as_array().expect("delta.tool_calls is an array");
        assert_eq!(list.len(), 1, "one call per delta: {c}");
        let d = &list[0];
        let index = d["index"].as_u64().expect("index");
        let fragment = d["function"]["arguments"]
            .as_str()
            .expect("arguments fragment");
        match calls.get_mut(&index) {
            None => {
                assert_eq!(index as usize, calls.len(), "indices in order: {c}");
                assert_eq!(d["type"], "function", "{c}");
                assert_eq!(fragment, "", "the header delta has empty arguments: {c}");
                calls.insert(
                    index,
                    Call {
                        id: d["id"].as_str().expect("id on the first delta").to_owned(),
                        name: d["function"]["name"].as_str().expect("name").to_owned(),
                        arguments: String::new(),
                    },
                );
            }
            Some(call) => {
                let mut keys: Vec<&str> =
                    d.as_object().unwrap().keys().map(String::as_str).collect();
                keys.sort_unstable();
                assert_eq!(
                    keys,
                    ["function", "index"],
                    "later deltas: index and fragment only: {c}"
                );
                let f: Vec<&String> = d["function"].as_object().unwrap().keys().collect();
                assert_eq!(f, ["arguments"], "no repeated name: {c}");
                call.arguments.push_str(fragment);
            }
        }
    }
    ChatTurn {
        content,
        calls: calls.into_values().collect(),
        finish,
        usage: usage_chunk["usage"].clone(),
    }
}

async fn chat_turn(client: &Client, body: &Value, stream: bool) -> ChatTurn {
    if stream {
        chat_streamed(client, body).await
    } else {
        chat_once(client, body).await
    }
}

fn chat_request(text: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": text}],
        "tools": chat_tools(),
        "seed": 11
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// Asserts a turn called exactly `names`, in order, with valid arguments and
/// distinct ids, with `finish_reason: tool_calls` and no content.
#[track_caller]
fn assert_calls(turn: &ChatTurn, names: &[&str]) {
    let got: Vec<&str> = turn.calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(got, names, "{turn:?}");
    assert_eq!(turn.finish, "tool_calls", "{turn:?}");
    assert_eq!(
        turn.content, None,
        "content is null on a tool-call turn: {turn:?}"
    );
    for c in &turn.calls {
        check_arguments(&c.name, &c.arguments);
    }
    let mut ids: Vec<&str> = turn.calls.iter().map(|c| c.id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), turn.calls.len(), "distinct ids: {turn:?}");
}

#[track_caller]
fn assert_text(turn: &ChatTurn) {
    assert!(turn.calls.is_empty(), "no calls: {turn:?}");
    assert_eq!(turn.finish, "stop", "{turn:?}");
    assert!(
        turn.content.as_deref().is_some_and(|t| !t.is_empty()),
        "a text answer: {turn:?}"
    );
}

#[tokio::test]
async fn chat_tool_choice_modes_stream_and_not() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let mentions_weather = "Please use get_weather for Paris.";
    let plain = "Tell me something nice.";
    for stream in [false, true] {
        // auto (the default) with a mention calls the mentioned tool.
        let t = chat_turn(&client, &chat_request(mentions_weather, json!({})), stream).await;
        assert_calls(&t, &["get_weather"]);
        let t = chat_turn(
            &client,
            &chat_request(
                "What time is it? Call get_time.",
                json!({"tool_choice": "auto"}),
            ),
            stream,
        )
        .await;
        assert_calls(&t, &["get_time"]);
        // auto without a mention answers in text.
        let t = chat_turn(
            &client,
            &chat_request(plain, json!({"tool_choice": "auto"})),
            stream,
        )
        .await;
        assert_text(&t);
        // A tool name inside another word is not a mention.
        let t = chat_turn(
            &client,
            &chat_request("no get_weathers here", json!({})),
            stream,
        )
        .await;
        assert_text(&t);
        // none never calls, even when asked by name.
        let t = chat_turn(
            &client,
            &chat_request(mentions_weather, json!({"tool_choice": "none"})),
            stream,
        )
        .await;
        assert_text(&t);
        // required calls even without a mention (the first tool) ...
        let t = chat_turn(
            &client,
            &chat_request(plain, json!({"tool_choice": "required"})),
            stream,
        )
        .await;
        assert_calls(&t, &["get_weather"]);
        // ... and the mentioned tool when there is one.
        let t = chat_turn(
            &client,
            &chat_request("use get_time", json!({"tool_choice": "required"})),
            stream,
        )
        .await;
        assert_calls(&t, &["get_time"]);
        // A named choice calls that function whatever the message says.
        let t = chat_turn(
            &client,
            &chat_request(
                mentions_weather,
                json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
            ),
            stream,
        )
        .await;
        assert_calls(&t, &["get_time"]);
        // Usage counts the call like any output.
        let u = &t.usage;
        assert!(u["completion_tokens"].as_u64().unwrap() > 0, "{u}");
        assert_eq!(u["reasoning_tokens"], 0, "{u}");
    }
}

#[tokio::test]
async fn chat_parallel_calls_only_when_allowed() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let both = "First get_time in Tokyo, then get_weather in Oslo.";
    for stream in [false, true] {
        // parallel_tool_calls defaults to true: both, in order of mention.
        let t = chat_turn(&client, &chat_request(both, json!({})), stream).await;
        assert_calls(&t, &["get_time", "get_weather"]);
        let t = chat_turn(
            &client,
            &chat_request(
                both,
                json!({"parallel_tool_calls": true, "tool_choice": "required"}),
            ),
            stream,
        )
        .await;
        assert_calls(&t, &["get_time", "get_weather"]);
        // false: only the first mentioned.
        let t = chat_turn(
            &client,
            &chat_request(both, json!({"parallel_tool_calls": false})),
            stream,
        )
        .await;
        assert_calls(&t, &["get_time"]);
    }
    // The same request and seed give the same arguments either way.
    let body = chat_request(both, json!({}));
    let a = chat_once(&client, &body).await;
    let b = chat_streamed(&client, &body).await;
    let args = |t: &ChatTurn| {
        t.calls
            .iter()
            .map(|c| c.arguments.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(args(&a), args(&b));
    assert_eq!(a.usage["completion_tokens"], b.usage["completion_tokens"]);
}

#[tokio::test]
async fn chat_tool_round_trip_ends_in_a_text_answer() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    for stream in [false, true] {
        let ask = "Use get_time for Lisbon and get_weather for Rome.";
        let mut body = chat_request(ask, json!({}));
        let first = chat_turn(&client, &body, stream).await;
        assert_calls(&first, &["get_time", "get_weather"]);
        // The caller runs the tools and sends the results back.
        let assistant = json!({
            "role": "assistant",
            "content": null,
            "tool_calls": first.calls.iter().map(|c| json!({
                "id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}
            })).collect::<Vec<_>>()
        });
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(assistant);
        messages.push(
            json!({"role": "tool", "tool_call_id": first.calls[0].id, "content": "14:05 WET"}),
        );
        messages.push(
            json!({"role": "tool", "tool_call_id": first.calls[1].id, "content": "{\"temp\":21}"}),
        );
        let second = chat_turn(&client, &body, stream).await;
        assert_text(&second);
        let text = second.content.unwrap();
        assert!(
            text.contains("14:05 WET"),
            "the answer uses the tool results: {text}"
        );
        assert!(text.contains("{\"temp\":21}"), "{text}");
        // The history (tool definitions, calls, results) is in the prompt.
        assert!(
            second.usage["prompt_tokens"].as_u64() > first.usage["prompt_tokens"].as_u64(),
            "{:?} vs {:?}",
            second.usage,
            first.usage
        );
    }
}

#[tokio::test]
async fn chat_structured_output_parses_and_validates() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let schema = json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "rating": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "minItems": 1},
            "author": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "alive": {"type": "boolean"}},
                "required": ["name", "alive"],
                "additionalProperties": false
            },
            "note": {"type": ["string", "null"]}
        },
        "required": ["title", "year", "rating", "tags", "author", "note"],
        "additionalProperties": false
    });
    for stream in [false, true] {
        for seed in [1, 2, 3] {
            let body = json!({
                "model": "base",
                "seed": seed,
                "messages": [{"role": "user", "content": "Describe a book as JSON."}],
                "response_format": {"type": "json_object"}
            });
            let t = chat_turn(&client, &body, stream).await;
            assert_eq!(t.finish, "stop");
            let v: Value = serde_json::from_str(t.content.as_deref().unwrap()).expect("JSON");
            assert!(v.is_object(), "json_object gives an object: {v}");

            let body = json!({
                "model": "base",
                "seed": seed,
                "messages": [{"role": "user", "content": "Describe a book."}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "book", "schema": schema, "strict": true}}
            });
            let t = chat_turn(&client, &body, stream).await;
            assert_eq!(t.finish, "stop");
            let v: Value = serde_json::from_str(t.content.as_deref().unwrap()).expect("JSON");
            assert_valid(&schema, &v);
        }
    }
}

// ---- responses ------------------------------------------------------------------

/// One response turn as a client sees it.
#[derive(Debug)]
struct ResponseTurn {
    id: String,
    status: String,
    /// `(type, item)` per output item.
    output: Vec<Value>,
    usage: Value,
}

impl ResponseTurn {
    fn calls(&self) -> Vec<Call> {
        self.output
            .iter()
            .filter(|i| i["type"] == "function_call")
            .map(|i| Call {
                id: i["call_id"].as_str().unwrap().to_owned(),
                name: i["name"].as_str().unwrap().to_owned(),
                arguments: i["arguments"].as_str().unwrap().to_owned(),
            })
            .collect()
    }

    fn text(&self) -> Option<String> {
        let msg = self.output.iter().find(|i| i["type"] == "message")?;
        Some(
            msg["content"]
                .as_array()?
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect(),
        )
    }
}

/// Asserts the wire shape of every output item.
#[track_caller]
fn check_items(output: &[Value]) {
    for item in output {
        match item["type"].as_str() {
            Some("function_call") => {
                assert!(item["id"].as_str().unwrap().starts_with("fc_"), "{item}");
                assert!(
                    item["call_id"].as_str().unwrap().starts_with("call_"),
                    "{item}"
                );
                assert!(item["arguments"].is_string(), "{item}");
                assert_eq!(item["status"], "completed", "{item}");
            }
            Some("message") => {
                assert!(item["id"].as_str().unwrap().starts_with("msg_"), "{item}");
                assert_eq!(item["role"], "assistant");
                assert_eq!(item["status"], "completed");
                for p in item["content"].as_array().unwrap() {
                    assert_eq!(p["type"], "output_text", "{p}");
                    assert_eq!(p["annotations"], json!([]), "{p}");
                }
            }
            Some("reasoning") => {
                assert!(item["id"].as_str().unwrap().starts_with("rs_"), "{item}");
            }
            _ => panic!("unexpected output item {item}"),
        }
    }
}

async fn response_once(client: &Client, body: &Value) -> ResponseTurn {
    let reply = client.post_json("/responses", body).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let r = reply.json();
    assert_eq!(r["object"], "response");
    let output = r["output"].as_array().unwrap().clone();
    check_items(&output);
    ResponseTurn {
        id: r["id"].as_str().unwrap().to_owned(),
        status: r["status"].as_str().unwrap().to_owned(),
        output,
        usage: r["usage"].clone(),
    }
}

/// Streams a response and rebuilds it from the events, asserting the
/// function-call event rules: `output_item.added` with empty arguments,
/// `function_call_arguments.delta` fragments naming the item, `.done` with
/// the name and whole arguments, `output_item.done`; strictly increasing
/// sequence numbers from 0; the terminal event's response equals the
/// rebuilt items.
async fn response_streamed(client: &Client, body: &Value) -> ResponseTurn {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let stream = client.stream("/responses", &body).await.unwrap();
    assert_eq!(stream.status, 200);
    let frames = stream.collect().await.unwrap();
    let events: Vec<Value> = frames.iter().map(SseFrame::json).collect();
    for (i, (f, e)) in frames.iter().zip(&events).enumerate() {
        assert_eq!(
            f.event.as_deref(),
            e["type"].as_str(),
            "event name = type: {e}"
        );
        assert_eq!(e["sequence_number"], i as u64, "sequence: {e}");
    }
    assert_eq!(events[0]["type"], "response.created");
    let terminal = events.last().unwrap();
    assert_eq!(terminal["type"], "response.completed", "{terminal}");

    let mut items: Vec<Value> = Vec::new();
    let mut args: BTreeMap<usize, String> = BTreeMap::new();
    for e in &events {
        let t = e["type"].as_str().unwrap();
        let idx = e["output_index"].as_u64().map(|i| i as usize);
        match t {
            "response.output_item.added" => {
                let idx = idx.unwrap();
                assert_eq!(idx, items.len(), "items open in order: {e}");
                let item = &e["item"];
                if item["type"] == "function_call" {
                    assert_eq!(item["arguments"], "", "added with empty arguments: {e}");
                    assert!(item["call_id"]
                        .as_str()
                        .is_some_and(|c| c.starts_with("call_")));
                    assert!(item["name"].is_string());
                }
                items.push(item.clone());
            }
            "response.function_call_arguments.delta" => {
                let idx = idx.unwrap();
                assert_eq!(e["item_id"], items[idx]["id"], "delta names its item: {e}");
                assert_eq!(items[idx]["type"], "function_call");
                args.entry(idx)
                    .or_default()
                    .push_str(e["delta"].as_str().unwrap());
            }
            "response.function_call_arguments.done" => {
                let idx = idx.unwrap();
                assert_eq!(e["item_id"], items[idx]["id"], "{e}");
                assert_eq!(e["name"], items[idx]["name"], "{e}");
                assert_eq!(
                    e["arguments"].as_str(),
                    Some(args.get(&idx).map(String::as_str).unwrap_or("")),
                    "done carries the joined deltas: {e}"
                );
            }
            "response.output_item.done" => {
                let idx = idx.unwrap();
                assert_eq!(e["item"]["id"], items[idx]["id"], "{e}");
                items[idx] = e["item"].clone();
            }
            "response.output_text.delta" => {
                let idx = idx.unwrap();
                assert_eq!(e["item_id"], items[idx]["id"], "{e}");
            }
            _ => {}
        }
    }
    let r = &terminal["response"];
    let output = r["output"].as_array().unwrap().clone();
    assert_eq!(
        output, items,
        "the completed response holds the streamed items"
    );
    check_items(&output);
    ResponseTurn {
        id: r["id"].as_str().unwrap().to_owned(),
        status: r["status"].as_str().unwrap().to_owned(),
        output,
        usage: r["usage"].clone(),
    }
}

async fn response_turn(client: &Client, body: &Value, stream: bool) -> ResponseTurn {
    if stream {
        response_streamed(client, body).await
    } else {
        response_once(client, body).await
    }
}

fn response_request(text: &str, extra: Value) -> Value {
    let mut body = json!({"model": "base", "input": text, "tools": response_tools()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[track_caller]
fn assert_response_calls(t: &ResponseTurn, names: &[&str]) {
    assert_eq!(t.status, "completed");
    let calls = t.calls();
    let got: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(got, names, "{t:?}");
    assert!(t.text().is_none(), "no message beside the calls: {t:?}");
    for c in &calls {
        check_arguments(&c.name, &c.arguments);
    }
}

#[track_caller]
fn assert_response_text(t: &ResponseTurn) {
    assert_eq!(t.status, "completed");
    assert!(t.calls().is_empty(), "{t:?}");
    assert!(t.text().is_some_and(|s| !s.is_empty()), "{t:?}");
}

#[tokio::test]
async fn responses_tool_choice_modes_and_parallel_calls() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let weather = "Please use get_weather for Paris.";
    let both = "First get_time in Tokyo, then get_weather in Oslo.";
    for stream in [false, true] {
        let t = response_turn(&client, &response_request(weather, json!({})), stream).await;
        assert_response_calls(&t, &["get_weather"]);
        let t = response_turn(
            &client,
            &response_request("Hello there.", json!({"tool_choice": "auto"})),
            stream,
        )
        .await;
        assert_response_text(&t);
        let t = response_turn(
            &client,
            &response_request(weather, json!({"tool_choice": "none"})),
            stream,
        )
        .await;
        assert_response_text(&t);
        let t = response_turn(
            &client,
            &response_request("Hello.", json!({"tool_choice": "required"})),
            stream,
        )
        .await;
        assert_response_calls(&t, &["get_weather"]);
        let t = response_turn(
            &client,
            &response_request(
                weather,
                json!({"tool_choice": {"type": "function", "name": "get_time"}}),
            ),
            stream,
        )
        .await;
        assert_response_calls(&t, &["get_time"]);
        let t = response_turn(&client, &response_request(both, json!({})), stream).await;
        assert_response_calls(&t, &["get_time", "get_weather"]);
        let t = response_turn(
            &client,
            &response_request(both, json!({"parallel_tool_calls": false})),
            stream,
        )
        .await;
        assert_response_calls(&t, &["get_time"]);
        assert_eq!(t.usage["output_tokens_details"]["reasoning_tokens"], 0);
    }
}

#[tokio::test]
async fn responses_tool_round_trip_inline_and_through_previous_response_id() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let ask = "Use get_time for Lisbon and get_weather for Rome.";
    for stream in [false, true] {
        let first = response_turn(&client, &response_request(ask, json!({})), stream).await;
        assert_response_calls(&first, &["get_time", "get_weather"]);
        let calls = first.calls();

        // Inline: the whole history as input items.
        let mut input = vec![json!({"role": "user", "content": ask})];
        for c in &calls {
            input.push(json!({"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}));
        }
        input.push(
            json!({"type": "function_call_output", "call_id": calls[0].id, "output": "14:05 WET"}),
        );
        input.push(json!({"type": "function_call_output", "call_id": calls[1].id, "output": "{\"temp\":21}"}));
        let body = json!({"model": "base", "input": input, "tools": response_tools()});
        let second = response_turn(&client, &body, stream).await;
        assert_response_text(&second);
        let text = second.text().unwrap();
        assert!(
            text.contains("14:05 WET") && text.contains("{\"temp\":21}"),
            "{text}"
        );

        // Chained: only the outputs, the rest comes from the stored response.
        let body = json!({
            "model": "base",
            "previous_response_id": first.id,
            "tools": response_tools(),
            "input": [
                {"type": "function_call_output", "call_id": calls[0].id, "output": "14:05 WET"},
                {"type": "function_call_output", "call_id": calls[1].id, "output": "{\"temp\":21}"}
            ]
        });
        let chained = response_turn(&client, &body, stream).await;
        assert_response_text(&chained);
        let text = chained.text().unwrap();
        assert!(
            text.contains("14:05 WET") && text.contains("{\"temp\":21}"),
            "{text}"
        );
        // The chained prompt holds the same history as the inline one.
        assert_eq!(
            chained.usage["input_tokens"], second.usage["input_tokens"],
            "{:?} vs {:?}",
            chained.usage, second.usage
        );
    }
}

#[tokio::test]
async fn responses_structured_output_parses_and_validates() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "count": {"type": "integer", "minimum": 0},
            "items": {"type": "array", "items": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"], "additionalProperties": false}}
        },
        "required": ["name", "count", "items"],
        "additionalProperties": false
    });
    for stream in [false, true] {
        let body = json!({"model": "base", "input": "Give JSON.", "text": {"format": {"type": "json_object"}}});
        let t = response_turn(&client, &body, stream).await;
        assert_eq!(t.status, "completed");
        let v: Value = serde_json::from_str(&t.text().unwrap()).expect("JSON");
        assert!(v.is_object(), "{v}");

        let body = json!({
            "model": "base",
            "input": "Give an inventory.",
            "text": {"format": {"type": "json_schema", "name": "inventory", "schema": schema, "strict": true}}
        });
        let t = response_turn(&client, &body, stream).await;
        assert_eq!(t.status, "completed");
        let v: Value = serde_json::from_str(&t.text().unwrap()).expect("JSON");
        assert_valid(&schema, &v);
    }
}

/// Long replies arrive whole: the relay folds buffered worker events into
/// batches of at most 64, and an event read past that limit was once dropped
/// (a 5000-token JSON reply lost a `,"` or its closing `}` and failed its
/// output check). `synthetic:echo` repeats the message verbatim, so any lost
/// piece shows as a difference.
#[tokio::test]
async fn long_replies_arrive_whole_on_both_apis() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let words: Vec<String> = (0..700).map(|i| format!("w{i}")).collect();
    let text = format!("{} synthetic:echo", words.join(" "));
    let chat = json!({"model": "base", "messages": [{"role": "user", "content": text}]});
    for stream in [false, true] {
        let t = chat_turn(&client, &chat, stream).await;
        assert_eq!(t.finish, "stop");
        assert_eq!(t.content.as_deref(), Some(text.as_str()), "stream={stream}");
        assert!(t.usage["completion_tokens"].as_u64().unwrap() > 700);
    }
    let resp = json!({"model": "base", "input": text});
    for stream in [false, true] {
        let t = response_turn(&client, &resp, stream).await;
        assert_eq!(t.text().as_deref(), Some(text.as_str()), "stream={stream}");
    }
}

// ---- the gateway's output check ---------------------------------------------------

/// A worker whose reply ignores the requested format (the synthetic
/// engine's `ignore_format` control plays one whose constrained decoding
/// failed) never reaches a client as a success: chat answers 500
/// `output_validation_failed` (in-band error frame when streaming), the
/// Responses API answers 500 or ends its stream with `response.failed`, and
/// the failure is counted on `/metrics`.
#[tokio::test]
async fn a_reply_that_breaks_the_requested_format_is_a_server_error() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let schema = schema_of("get_weather");
    let prompt = "Describe the weather. synthetic:ignore_format";

    let chat = json!({
        "model": "base",
        "messages": [{"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "weather", "schema": schema, "strict": true}}
    });
    let reply = client.post_json("/chat/completions", &chat).await.unwrap();
    assert_eq!(reply.status, 500, "{reply}");
    let e = &reply.json()["error"];
    assert_eq!(e["code"], "output_validation_failed", "{e}");
    assert_eq!(e["type"], "server_error");
    assert_eq!(e["status"], 500);

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let frames = chat::stream(&client, &streamed).await;
    let error = frames
        .iter()
        .filter(|f| !f.is_done())
        .map(|f| f.json())
        .find(|v| v.get("error").is_some())
        .unwrap_or_else(|| panic!("an in-band error frame: {frames:?}"));
    assert_eq!(error["error"]["code"], "output_validation_failed");
    assert_eq!(error["error"]["status"], 500);
    assert!(
        frames
            .iter()
            .filter(|f| !f.is_done() && f.data.contains("\"choices\""))
            .all(|f| f.json()["choices"][0]["finish_reason"].is_null()),
        "a failed reply never reports a finish_reason: {frames:?}"
    );

    let response = json!({
        "model": "base",
        "input": prompt,
        "text": {"format": {"type": "json_schema", "name": "weather", "schema": schema, "strict": true}}
    });
    let reply = client.post_json("/responses", &response).await.unwrap();
    assert_eq!(reply.status, 500, "{reply}");
    assert_eq!(reply.json()["error"]["code"], "output_validation_failed");

    let mut streamed = response.clone();
    streamed["stream"] = json!(true);
    let frames = client
        .stream("/responses", &streamed)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let last = frames.last().expect("events");
    assert_eq!(last.event.as_deref(), Some("response.failed"), "{frames:?}");
    assert_eq!(
        last.json()["response"]["error"]["code"],
        "output_validation_failed"
    );

    let (status, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("output_validation") && !l.starts_with('#')),
        "the failure is counted"
    );
}
