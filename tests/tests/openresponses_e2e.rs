//! The Open Responses contract to the letter: every Responses object the
//! gateway sends (create, retrieve, cancel, each event's `response`) and
//! every streamed event, on the simulator, validated with a JSON Schema
//! validator against the Open Responses OpenAPI document, read unchanged
//! from `tests/testdata/openresponses/openapi.json` (Apache-2.0; provenance
//! in the README beside it).
//!
//! Objects validate against `ResponseResource`; an event against the schema
//! its `type` selects among the `oneOf` of `POST /responses`'
//! `text/event-stream`, which is the whole of that `oneOf` (the types are
//! distinct constants); `POST /responses/compact`'s answer validates
//! against `CompactResource`. Where our spec deliberately differs (image parts
//! are a 400 here; `docs/request-contract.md`, "Open Responses") no
//! scenario is run.

use harness::responses;
use harness::{json, Client, SseFrame, Stack, Value};
use jsonschema::Validator;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// The document and a validator per schema name.
struct OpenResponses {
    /// `POST /responses`'s body: every scenario's request is checked, so
    /// what the gateway is shown to accept is what the document allows.
    create_body: Validator,
    objects: Validator,
    /// `POST /responses/compact`'s answer.
    compacted: Validator,
    /// The WebSocket transport's client event and error event.
    ws_create: Validator,
    ws_error: Validator,
    /// Event `type` → the validator of its schema.
    events: BTreeMap<String, (String, Validator)>,
}

impl OpenResponses {
    fn get() -> &'static OpenResponses {
        static DOC: OnceLock<OpenResponses> = OnceLock::new();
        DOC.get_or_init(OpenResponses::load)
    }

    fn load() -> OpenResponses {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/openresponses/openapi.json");
        let text = std::fs::read_to_string(&path).expect("the Open Responses document");
        let doc: Value = serde_json::from_str(&text).expect("the document is JSON");
        // Refs are `#/components/schemas/...`: a root holding the
        // document's components resolves them as the document would.
        let validator = |name: &str| {
            let root = json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$ref": format!("#/components/schemas/{name}"),
                "components": doc["components"],
            });
            jsonschema::validator_for(&root)
                .unwrap_or_else(|e| panic!("schema {name} compiles: {e}"))
        };
        let stream = &doc["paths"]["/responses"]["post"]["responses"]["200"]["content"]
            ["text/event-stream"]["schema"]["oneOf"];
        let mut events = BTreeMap::new();
        for reference in stream.as_array().expect("the event-stream oneOf") {
            let name = reference["$ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .expect("a component ref");
            let kind = &doc["components"]["schemas"][name]["properties"]["type"];
            let kind = kind["enum"][0]
                .as_str()
                .or_else(|| kind["const"].as_str())
                .unwrap_or_else(|| panic!("{name} names its type"))
                .to_owned();
            events.insert(kind, (name.to_owned(), validator(name)));
        }
        assert!(
            events.len() >= 20,
            "the document's events: {events:?}",
            events = events.keys()
        );
        let websocket = &doc["paths"]["/responses"]["x-openresponses-websocket"];
        let named = |key: &str| {
            websocket[key]["$ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .unwrap_or_else(|| panic!("the WebSocket transport names its {key}"))
                .to_owned()
        };
        let create_body = doc["paths"]["/responses"]["post"]["requestBody"]["content"]
            ["application/json"]["schema"]["$ref"]
            .as_str()
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .expect("the create body's schema");
        OpenResponses {
            create_body: validator(create_body),
            objects: validator("ResponseResource"),
            compacted: validator("CompactResource"),
            ws_create: validator(&named("clientMessage")),
            ws_error: validator(&named("errorMessage")),
            events,
        }
    }
}

thread_local! {
    /// What did not validate in this test so far: every scenario runs, and
    /// [`report`] fails the test with all of it (a test's tokio runtime
    /// runs on its own thread).
    static FAILURES: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records every error unless `instance` validates.
fn assert_valid(validator: &Validator, schema: &str, what: &str, instance: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("  at '{}': {e}", e.instance_path()))
        .collect();
    if !errors.is_empty() {
        let failure = format!(
            "{what} does not validate against {schema}:\n{}\n{instance}",
            errors.join("\n")
        );
        FAILURES.with(|f| f.borrow_mut().push(failure));
    }
}

/// Fails the test with every recorded failure.
fn report() {
    let failures = FAILURES.with(|f| std::mem::take(&mut *f.borrow_mut()));
    assert!(
        failures.is_empty(),
        "{} failures:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A Responses object as Open Responses defines it.
fn assert_object(what: &str, object: &Value) {
    assert_valid(
        &OpenResponses::get().objects,
        "ResponseResource",
        what,
        object,
    );
}

/// Every event of a stream, each against its own schema. Returns the
/// events' JSON.
fn assert_events(what: &str, frames: &[SseFrame]) -> Vec<Value> {
    assert!(!frames.is_empty(), "{what}: no events");
    let doc = OpenResponses::get();
    let mut out = Vec::new();
    for frame in frames {
        let event = frame.json();
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            frame.event.as_deref(),
            Some(kind.as_str()),
            "{what}: {frame:?}"
        );
        let Some((schema, validator)) = doc.events.get(&kind) else {
            panic!("{what}: the document has no event '{kind}': {event}");
        };
        assert_valid(validator, schema, &format!("{what}, event {kind}"), &event);
        if let Some(response) = event.get("response") {
            // Already checked as part of the event; named here for clarity
            // when it alone is wrong.
            assert_object(&format!("{what}, {kind}.response"), response);
        }
        out.push(event);
    }
    out
}

/// Every event of one response over WebSocket, each against its own
/// schema (the stream's), or the lone error event against
/// `WebSocketErrorEvent`.
fn assert_ws_events(what: &str, events: &[Value]) {
    assert!(!events.is_empty(), "{what}: no events");
    let doc = OpenResponses::get();
    for event in events {
        let kind = event["type"].as_str().unwrap_or_default();
        if kind == "error" {
            assert_valid(&doc.ws_error, "WebSocketErrorEvent", what, event);
            continue;
        }
        let Some((schema, validator)) = doc.events.get(kind) else {
            panic!("{what}: the document has no event '{kind}': {event}");
        };
        assert_valid(validator, schema, &format!("{what}, event {kind}"), event);
    }
}

/// Sends `body` as a `response.create` (validated as the client event it
/// is) and validates the reply.
async fn ws_create(ws: &mut harness::websocket::WsClient, what: &str, body: Value) -> Vec<Value> {
    let mut event = body.clone();
    event["type"] = json!("response.create");
    assert_valid(
        &OpenResponses::get().ws_create,
        "WebSocketResponseCreateEvent",
        &format!("{what} (client event)"),
        &event,
    );
    let events = ws.create(&body).await.expect("a reply");
    assert_ws_events(what, &events);
    events
}

/// Records every error unless `body` is a create body the document
/// allows.
fn assert_request(what: &str, body: &Value) {
    assert_valid(
        &OpenResponses::get().create_body,
        "CreateResponseBody",
        &format!("{what} (request body)"),
        body,
    );
}

/// Posts a non-streamed create, validates and returns the object.
async fn create(client: &Client, what: &str, body: Value) -> Value {
    assert_request(what, &body);
    let object = responses::create(client, &body).await;
    assert_object(what, &object);
    object
}

/// Streams a create, validates every event and returns them.
async fn stream(client: &Client, what: &str, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    assert_request(what, &body);
    let stream = client
        .stream("/responses", &body)
        .await
        .expect("stream opens");
    assert_eq!(stream.status, 200, "{what}");
    let frames = stream.collect().await.expect("frames");
    assert_events(what, &frames)
}

/// Retrieves `id` and validates it.
async fn retrieve(client: &Client, what: &str, id: &str) -> Value {
    let got = client
        .get(&format!("/responses/{id}"))
        .await
        .expect("retrieve");
    assert_eq!(got.status, 200, "{what}: {got}");
    let object = got.json();
    assert_object(what, &object);
    object
}

/// Creates `body` both ways, and retrieves the stored object.
async fn both_ways(client: &Client, what: &str, body: Value) -> (Value, Vec<Value>) {
    let object = create(client, what, body.clone()).await;
    retrieve(
        client,
        &format!("{what} (retrieved)"),
        &responses::id(&object),
    )
    .await;
    let events = stream(client, &format!("{what} (streamed)"), body).await;
    (object, events)
}

fn tools() -> Value {
    json!([{"type":"function","name":"get_weather","description":"Weather in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},
            "required":["city"],"additionalProperties":false},"strict":true}])
}

fn function_call(object: &Value) -> Value {
    object["output"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("a function_call item in {object}"))
        .clone()
}

fn terminal(events: &[Value]) -> &Value {
    &events.last().expect("events")["response"]
}

/// The foreground scenarios, each non-streamed (then retrieved) and
/// streamed: basic, instructions, system and developer items, forced and
/// required tool calls, a function-call round trip (inline and chained),
/// multi-turn, `previous_response_id`, reasoning, a token limit, and every
/// optional field set.
#[tokio::test]
async fn foreground_objects_and_events_validate() {
    let stack = Stack::builder()
        .models(&["base"])
        .redis()
        .start()
        .expect("stack");
    let client = stack.client();

    let (basic, events) = both_ways(
        &client,
        "basic",
        json!({"model":"base","input":"Hello synthetic:reply_tokens=5"}),
    )
    .await;
    assert_eq!(basic["status"], "completed");
    assert!(basic["completed_at"].as_u64() >= basic["created_at"].as_u64());
    for field in ["presence_penalty", "frequency_penalty", "top_logprobs"] {
        assert_eq!(basic[field].as_f64(), Some(0.0), "{field}");
    }
    for field in ["max_tool_calls", "safety_identifier", "prompt_cache_key"] {
        assert_eq!(basic[field], Value::Null, "{field}");
    }
    assert_eq!(
        events[0]["response"]["completed_at"],
        Value::Null,
        "not ended yet"
    );
    assert!(terminal(&events)["completed_at"].is_u64());

    both_ways(
        &client,
        "instructions",
        json!({"model":"base","input":"Hi synthetic:reply_tokens=3","instructions":"Be brief."}),
    )
    .await;

    both_ways(
        &client,
        "system and developer items",
        json!({"model":"base","input":[
            {"type":"message","role":"system","content":"You are terse."},
            {"type":"message","role":"developer","content":[{"type":"input_text","text":"Answer in English."}]},
            {"type":"message","role":"user","content":"Hi synthetic:reply_tokens=3"}]}),
    )
    .await;

    let (forced, events) = both_ways(
        &client,
        "forced tool call",
        json!({"model":"base","input":"Weather in Paris?","tools":tools(),
            "tool_choice":{"type":"function","name":"get_weather"}}),
    )
    .await;
    assert_eq!(function_call(&forced)["name"], "get_weather");
    assert!(events
        .iter()
        .any(|e| e["type"] == "response.function_call_arguments.delta"));

    let (required, _) = both_ways(
        &client,
        "required tool call",
        json!({"model":"base","input":"Weather in Rome?","tools":tools(),"tool_choice":"required"}),
    )
    .await;

    // The round trip with the whole conversation inline.
    let call = function_call(&required);
    both_ways(
        &client,
        "function-call round trip, inline",
        json!({"model":"base","tools":tools(),"input":[
            {"type":"message","role":"user","content":"Weather in Rome?"},
            {"type":"function_call","call_id":call["call_id"],"name":"get_weather","arguments":call["arguments"]},
            {"type":"function_call_output","call_id":call["call_id"],"output":"{\"temp\":21}"}]}),
    )
    .await;

    // ... and chained to the stored call.
    let (chained, _) = both_ways(
        &client,
        "function-call round trip, previous_response_id",
        json!({"model":"base","tools":tools(),"previous_response_id":required["id"],
            "input":[{"type":"function_call_output","call_id":call["call_id"],"output":"{\"temp\":21}"}]}),
    )
    .await;
    assert_eq!(chained["previous_response_id"], required["id"]);

    both_ways(
        &client,
        "multi-turn",
        json!({"model":"base","input":[
            {"type":"message","role":"user","content":"Hi"},
            {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hello.","annotations":[]}]},
            {"type":"message","role":"user","content":"And now? synthetic:reply_tokens=4"}]}),
    )
    .await;

    let (chained, _) = both_ways(
        &client,
        "previous_response_id",
        json!({"model":"base","previous_response_id":basic["id"],"input":"More. synthetic:reply_tokens=3"}),
    )
    .await;
    assert_eq!(chained["previous_response_id"], basic["id"]);

    let (_, events) = both_ways(
        &client,
        "reasoning",
        json!({"model":"base","input":"Think synthetic:reply_tokens=3","reasoning":{"effort":"low","summary":"auto"}}),
    )
    .await;
    assert!(events
        .iter()
        .any(|e| e["type"] == "response.reasoning_summary_text.delta"));

    let (cut, events) = both_ways(
        &client,
        "max_output_tokens",
        json!({"model":"base","input":"x synthetic:reply_tokens=50","max_output_tokens":16}),
    )
    .await;
    assert_eq!(cut["status"], "incomplete");
    assert!(cut["completed_at"].is_u64());
    assert_eq!(terminal(&events)["status"], "incomplete");

    // Every optional field the object echoes, set.
    let (echoed, _) = both_ways(
        &client,
        "every field set",
        json!({"model":"base","input":"x synthetic:reply_tokens=2","temperature":0.5,"top_p":0.9,
            "presence_penalty":0.5,"frequency_penalty":-0.5,"top_logprobs":0,"max_tool_calls":3,
            "safety_identifier":"user-1","prompt_cache_key":"conv-1","service_tier":"default",
            "metadata":{"k":"v"},"parallel_tool_calls":false,"tools":tools(),"tool_choice":"none",
            "text":{"format":{"type":"text"}},"truncation":"disabled","store":true}),
    )
    .await;
    assert_eq!(
        (
            &echoed["presence_penalty"],
            &echoed["frequency_penalty"],
            &echoed["max_tool_calls"],
            &echoed["safety_identifier"],
            &echoed["prompt_cache_key"],
        ),
        (
            &json!(0.5),
            &json!(-0.5),
            &json!(3),
            &json!("user-1"),
            &json!("conv-1")
        )
    );

    // A worker failing mid-run: `response.failed` streamed, and the stored
    // failed object.
    let events = stream(
        &client,
        "worker failure",
        json!({"model":"base","input":"x synthetic:reply_tokens=20 synthetic:fail_after=3"}),
    )
    .await;
    let failed = terminal(&events);
    assert_eq!(failed["status"], "failed");
    assert!(failed["completed_at"].is_u64());
    retrieve(
        &client,
        "worker failure (retrieved)",
        &responses::id(failed),
    )
    .await;

    // Not stored: the object still validates (and is not retrievable).
    let unstored = create(
        &client,
        "store false",
        json!({"model":"base","input":"x synthetic:reply_tokens=2","store":false}),
    )
    .await;
    assert_eq!(unstored["store"], false);
    stream(
        &client,
        "store false (streamed)",
        json!({"model":"base","input":"x synthetic:reply_tokens=2","store":false}),
    )
    .await;
    report();
}

/// Background runs: the create body (`queued`), retrieve while running and
/// when done, the replay (`GET ?stream=true`) of the whole log, a
/// background stream on create, and a cancel with its body, retrieve and
/// replay.
#[tokio::test]
async fn background_retrieve_replay_and_cancel_validate() {
    let stack = Stack::builder()
        .models(&["base"])
        .redis()
        .start()
        .expect("stack");
    let client = stack.client();

    let queued = create(
        &client,
        "background create",
        json!({"model":"base","input":"bg synthetic:reply_tokens=20 synthetic:slow_ms=20","background":true}),
    )
    .await;
    assert_eq!(queued["background"], true);
    assert_eq!(queued["completed_at"], Value::Null);
    let id = responses::id(&queued);
    let running = retrieve(&client, "background, retrieved running", &id).await;
    let done =
        responses::wait_for_status(&client, &id, &["completed"], Duration::from_secs(10)).await;
    assert_object("background, retrieved done", &done);
    assert_eq!(done["status"], "completed", "{running}");
    assert!(done["completed_at"].is_u64());
    let replayed = assert_events("background replay", &responses::replay(&client, &id).await);
    assert_eq!(terminal(&replayed)["status"], "completed");

    stream(
        &client,
        "background stream on create",
        json!({"model":"base","input":"bg synthetic:reply_tokens=5","background":true}),
    )
    .await;

    // Cancel a long run while it generates.
    let long = create(
        &client,
        "background to cancel",
        json!({"model":"base","input":"bg synthetic:reply_tokens=400 synthetic:slow_ms=50","background":true}),
    )
    .await;
    let id = responses::id(&long);
    responses::wait_for_status(&client, &id, &["in_progress"], Duration::from_secs(5)).await;
    let cancelled = client
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .expect("cancel");
    assert_eq!(cancelled.status, 200, "{cancelled}");
    let cancelled = cancelled.json();
    assert_object("cancel", &cancelled);
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["completed_at"].is_u64());
    let got = retrieve(&client, "cancelled, retrieved", &id).await;
    assert_eq!(got["status"], "cancelled");
    let replayed = assert_events("cancelled replay", &responses::replay(&client, &id).await);
    assert_eq!(terminal(&replayed)["status"], "cancelled");

    // A run deleted under its follower: the stream ends with `error`.
    let long = create(
        &client,
        "background to delete",
        json!({"model":"base","input":"bg synthetic:reply_tokens=400 synthetic:slow_ms=50","background":true}),
    )
    .await;
    let id = responses::id(&long);
    responses::wait_for_status(&client, &id, &["in_progress"], Duration::from_secs(5)).await;
    let mut live = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .expect("follow");
    let mut frames = vec![live.next_frame().await.expect("a frame").expect("a frame")];
    let deleted = client
        .delete(&format!("/responses/{id}"))
        .await
        .expect("delete");
    assert_eq!(deleted.status, 200, "{deleted}");
    frames.extend(live.collect().await.expect("frames"));
    let events = assert_events("deleted under its follower", &frames);
    assert_eq!(events.last().expect("events")["type"], "error");
    report();
}

/// Responses over WebSocket: the scenarios' events (text, instructions, a
/// forced tool call, a chained turn, a warm-up), each against the stream's
/// schema of its type; a refused request's error event against
/// `WebSocketErrorEvent`; what the test sends against
/// `WebSocketResponseCreateEvent`.
#[tokio::test]
async fn websocket_events_validate() {
    let stack = Stack::builder().models(&["base"]).start().expect("stack");
    let mut ws = harness::websocket::connect(&stack.gateway.base_url(), stack.gateway.api_key())
        .await
        .expect("connects");
    let basic = ws_create(
        &mut ws,
        "ws basic",
        json!({"model":"base","input":"Hello synthetic:reply_tokens=5","store":false}),
    )
    .await;
    assert_eq!(terminal(&basic)["status"], "completed");
    let call = ws_create(
        &mut ws,
        "ws forced tool call",
        json!({"model":"base","input":"Weather in Paris?","tools":tools(),"tool_choice":"required",
            "instructions":"use tools","store":false,"previous_response_id":terminal(&basic)["id"]}),
    )
    .await;
    let fc = function_call(terminal(&call));
    ws_create(
        &mut ws,
        "ws function call output, chained",
        json!({"model":"base","previous_response_id":terminal(&call)["id"],"tools":tools(),"store":false,
            "input":[{"type":"function_call_output","call_id":fc["call_id"],"output":"{\"temp\":21}"}]}),
    )
    .await;
    ws_create(
        &mut ws,
        "ws warm-up",
        json!({"model":"base","input":"later","store":false,"generate":false}),
    )
    .await;
    let refused = ws_create(
        &mut ws,
        "ws unknown previous response",
        json!({"model":"base","input":"x","store":false,"previous_response_id":"resp_none"}),
    )
    .await;
    assert_eq!(refused[0]["type"], "error");
    report();
}

/// The summary sealed in a compaction item (the gateway's own encoding:
/// `igw.c1.` then base64url without padding), read here to check what the
/// next turn's worker received.
fn sealed_summary(item: &Value) -> String {
    use base64::Engine as _;
    let content = item["encrypted_content"]
        .as_str()
        .expect("encrypted_content");
    let encoded = content.strip_prefix("igw.c1.").expect("the gateway's seal");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .expect("base64url");
    String::from_utf8(bytes).expect("UTF-8")
}

/// `POST /responses/compact` (Open Responses 2026-04-24): the answer
/// validates against `CompactResource`, keeps the conversation's user
/// messages (the chain of `previous_response_id`, then `input`) and ends in
/// one `compaction` item; sent back as input, that item reaches the worker
/// as the summary. Bad compaction input and bad bodies get the spec's
/// errors.
#[tokio::test]
async fn a_compacted_conversation_validates_and_carries_its_summary_into_the_next_turn() {
    let stack = Stack::builder().models(&["base"]).start().expect("stack");
    let client = stack.client();
    let first = create(
        &client,
        "first turn",
        json!({"model":"base","input":"My name is Ada. synthetic:reply_tokens=6"}),
    )
    .await;
    let reply = client
        .post_json(
            "/responses/compact",
            &json!({"model":"base","previous_response_id": responses::id(&first),
                    "input":[{"type":"message","role":"user","content":"I like tea."}]}),
        )
        .await
        .expect("compact");
    assert_eq!(reply.status, 200, "{reply}");
    let compacted = reply.json();
    assert_valid(
        &OpenResponses::get().compacted,
        "CompactResource",
        "compacted conversation",
        &compacted,
    );
    assert_eq!(compacted["object"], "response.compaction");
    let output = compacted["output"].as_array().expect("output").clone();
    let texts: Vec<&str> = output
        .iter()
        .filter(|i| i["type"] == "message")
        .map(|i| {
            assert_eq!(i["role"], "user", "only the user's messages are kept: {i}");
            i["content"][0]["text"].as_str().unwrap_or_default()
        })
        .collect();
    assert_eq!(
        texts,
        ["My name is Ada. synthetic:reply_tokens=6", "I like tea."]
    );
    let item = output.last().expect("a last item");
    assert_eq!(item["type"], "compaction", "{item}");
    assert!(item["id"].as_str().is_some_and(|id| id.starts_with("cmp_")));
    let summary = sealed_summary(item);
    assert!(!summary.is_empty());
    assert!(compacted["usage"]["input_tokens"].as_u64() > Some(0));
    assert!(compacted["usage"]["output_tokens"].as_u64() > Some(0));

    // The next turn, on the compacted items: the worker gets the user's
    // messages and the summary as a message.
    let mut input = output.clone();
    input.push(json!({"type":"message","role":"user","content":"What is my name? synthetic:echo_messages"}));
    let next = create(
        &client,
        "after compaction",
        json!({"model":"base","input": input}),
    )
    .await;
    let seen = responses::output_text(&next);
    assert!(seen.contains("user: My name is Ada."), "{seen}");
    assert!(
        seen.contains(&format!(
            "user: Summary of the earlier conversation:\n{summary}"
        )),
        "{seen}"
    );

    // What is refused, and how.
    let foreign = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":[{"type":"compaction","encrypted_content":"gAAAAABpM0Yj-="}]}),
        )
        .await
        .unwrap();
    let e = harness::assert_error(&foreign, 400, "invalid_value");
    assert_eq!(e["param"], "input.0.encrypted_content");
    let unknown = client
        .post_json(
            "/responses/compact",
            &json!({"model":"base","input":"x","stream":true}),
        )
        .await
        .unwrap();
    let e = harness::assert_error(&unknown, 400, "unknown_parameter");
    assert_eq!(e["param"], "stream");
    let missing = client
        .post_json(
            "/responses/compact",
            &json!({"model":"base","previous_response_id":"resp_nope"}),
        )
        .await
        .unwrap();
    let e = harness::assert_error(&missing, 404, "previous_response_not_found");
    assert_eq!(e["param"], "previous_response_id");
    let nothing = client
        .post_json("/responses/compact", &json!({"model":"base"}))
        .await
        .unwrap();
    let e = harness::assert_error(&nothing, 400, "missing_required_parameter");
    assert_eq!(e["param"], "input");
    report();
}

/// Where the gateway accepts more than the document, and why: an input
/// message without `"type": "message"` (the OpenAI SDKs' easy input
/// message; the document requires the type) and `max_output_tokens`
/// below 16 (our spec's minimum is 1). The document refuses both bodies
/// (so a change of either side is noticed here); the gateway answers
/// them with objects that validate.
#[tokio::test]
async fn the_bodies_the_gateway_accepts_beyond_the_document() {
    let stack = Stack::single(harness::WorkerOpts::default());
    let client = stack.client();
    let beyond = [
        (
            "an input message without a type",
            json!({"model":"base","input":[{"role":"user","content":"Hi synthetic:reply_tokens=3"}]}),
            "completed",
        ),
        (
            "max_output_tokens 4",
            json!({"model":"base","input":"x synthetic:reply_tokens=50","max_output_tokens":4}),
            "incomplete",
        ),
    ];
    for (what, body, status) in beyond {
        assert!(
            !OpenResponses::get().create_body.is_valid(&body),
            "{what}: the document now allows it; move it into the scenarios"
        );
        let object = responses::create(&client, &body).await;
        assert_object(what, &object);
        assert_eq!(object["status"], status, "{what}: {object}");
    }
    report();
}
