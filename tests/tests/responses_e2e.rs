//! The Responses API end to end: real gateways (one, or two sharing Redis),
//! real synthetic workers. What is asserted is what a client sees (shapes,
//! event order, statuses, error envelopes) plus the worker's own counters
//! where only it can tell (a cancelled run stops generating).

use harness::responses;
use harness::{assert_error, json, Gateway, SseFrame, Stack, TestKey, Value, WorkerOpts};
use std::time::{Duration, Instant};

/// Lease settings short enough for a test to see a lost run end.
const FAST_LEASES: &str =
    "[store]\nlease_millis = 1500\nheartbeat_millis = 300\nsweep_interval_millis = 200\n";

/// A `base` stack on the test Redis, with a second key of another org.
fn redis_stack(opts: WorkerOpts, extra: &str) -> (Stack, TestKey) {
    let other = TestKey::random("org-other");
    let mut gw = harness::GatewayOpts::default();
    gw.keys.push(other.clone());
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(opts)
        .gateway_opts(gw)
        .extra_toml(extra)
        .redis()
        .start()
        .expect("stack starts");
    (stack, other)
}

fn body(input: &str) -> Value {
    json!({"model": "base", "input": input})
}

/// Events of a Responses stream as (name, data), checking the framing:
/// every frame has an `event:` line equal to the data's `type`, sequence
/// numbers increase by one from `first_seq`, and nothing follows the
/// terminal event.
fn events(frames: &[SseFrame], first_seq: u64) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        assert!(!f.is_done(), "no [DONE] on responses streams: {f:?}");
        let name = f
            .event
            .clone()
            .unwrap_or_else(|| panic!("no event line: {f:?}"));
        let data = f.json();
        assert_eq!(data["type"], name.as_str(), "{f:?}");
        assert_eq!(data["sequence_number"], first_seq + i as u64, "{f:?}");
        out.push((name, data));
    }
    let terminal = out
        .iter()
        .position(|(n, _)| {
            matches!(
                n.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        })
        .expect("a terminal event");
    assert_eq!(terminal, out.len() - 1, "nothing after the terminal event");
    out
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

#[tokio::test]
async fn create_retrieve_list_and_delete() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"Hello synthetic:reply_tokens=5","instructions":"be brief","metadata":{"k":"v"}}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let obj = r.json();
    let id = obj["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"));
    assert_eq!(obj["object"], "response");
    assert_eq!(obj["status"], "completed");
    assert!(obj["created_at"].is_u64());
    assert_eq!(obj["instructions"], "be brief");
    assert_eq!(obj["metadata"], json!({"k":"v"}));
    let msg = &obj["output"][0];
    assert_eq!(msg["type"], "message");
    assert!(msg["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(msg["content"][0]["type"], "output_text");
    assert_eq!(msg["content"][0]["annotations"], json!([]));
    let u = &obj["usage"];
    assert_eq!(u["output_tokens"], 5);
    assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 0);
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + 5)
    );

    let got = client.get(&format!("/responses/{id}")).await.unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), obj);

    let items = client
        .get(&format!("/responses/{id}/input_items"))
        .await
        .unwrap();
    assert_eq!(items.status, 200, "{items}");
    let items = items.json();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["type"], "message");
    assert_eq!(items["data"][0]["role"], "user");
    assert_eq!(items["data"][0]["content"][0]["type"], "input_text");
    assert_eq!(items["first_id"], items["data"][0]["id"]);
    assert_eq!(items["has_more"], false);

    let del = client.delete(&format!("/responses/{id}")).await.unwrap();
    assert_eq!(del.status, 200);
    assert_eq!(
        del.json(),
        json!({"id": id, "object": "response", "deleted": true})
    );
    let again = client.delete(&format!("/responses/{id}")).await.unwrap();
    assert_error(&again, 404, "response_not_found");
    let gone = client.get(&format!("/responses/{id}")).await.unwrap();
    assert_error(&gone, 404, "response_not_found");
}

#[tokio::test]
async fn streaming_events_in_order() {
    let stack = Stack::single(WorkerOpts::default());
    let stream = stack
        .client()
        .stream(
            "/responses",
            &json!({"model":"base","input":"Hi synthetic:reply_tokens=4","stream":true}),
        )
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    assert!(stream
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let ev = events(&stream.collect().await.unwrap(), 0);
    assert_eq!(
        names(&ev),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let item_id = ev[2].1["item"]["id"].clone();
    for (_, d) in &ev[3..10] {
        assert_eq!(d["item_id"], item_id);
        assert_eq!(d["output_index"], 0);
    }
    assert_eq!(ev[10].1["item"]["id"], item_id);
    assert_eq!(ev[10].1["item"]["status"], "completed");
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ev[8].1["text"], text.as_str());
    let done = &ev[11].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], text.as_str());
    // Stored: retrievable, but not replayable (not a background response).
    let id = done["id"].as_str().unwrap();
    let r = stack
        .client()
        .get(&format!("/responses/{id}?stream=true"))
        .await
        .unwrap();
    let e = assert_error(&r, 400, "invalid_value");
    assert_eq!(e["param"], "stream");
}

#[tokio::test]
async fn long_stream_arrives_complete() {
    let stack = Stack::single(WorkerOpts::default());
    let stream = stack
        .client()
        .stream(
            "/responses",
            &json!({"model":"base","input":"Go synthetic:reply_tokens=300","stream":true}),
        )
        .await
        .unwrap();
    let ev = events(&stream.collect().await.unwrap(), 0);
    let deltas = ev
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 300);
    assert_eq!(
        ev.last().unwrap().1["response"]["usage"]["output_tokens"],
        300
    );
}

#[tokio::test]
async fn reasoning_item_comes_before_the_message() {
    let stack = Stack::single(WorkerOpts::default());
    let stream = stack
        .client()
        .stream(
            "/responses",
            &json!({"model":"base","input":"Think synthetic:reply_tokens=3","stream":true,"reasoning":{"effort":"low"}}),
        )
        .await
        .unwrap();
    let ev = events(&stream.collect().await.unwrap(), 0);
    let n = names(&ev);
    assert_eq!(n[2], "response.output_item.added");
    assert_eq!(ev[2].1["item"]["type"], "reasoning");
    assert_eq!(n[3], "response.reasoning_summary_part.added");
    assert!(n.contains(&"response.reasoning_summary_text.delta"));
    let msg_added = ev
        .iter()
        .position(|(n, d)| n == "response.output_item.added" && d["item"]["type"] == "message")
        .expect("a message item");
    assert_eq!(ev[msg_added].1["output_index"], 1);
    let done = &ev.last().unwrap().1["response"];
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[tokio::test]
async fn store_false_and_max_output_tokens() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"x synthetic:reply_tokens=2","store":false}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let obj = r.json();
    assert_eq!(obj["store"], false);
    let id = obj["id"].as_str().unwrap();
    assert_error(
        &client.get(&format!("/responses/{id}")).await.unwrap(),
        404,
        "response_not_found",
    );

    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"x synthetic:reply_tokens=50","max_output_tokens":4}),
        )
        .await
        .unwrap();
    let obj = r.json();
    assert_eq!(obj["status"], "incomplete", "{r}");
    assert_eq!(obj["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(obj["usage"]["output_tokens"], 4);
    assert_eq!(obj["max_output_tokens"], 4);
}

#[tokio::test]
async fn request_errors_name_their_param() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let cases = [
        (
            json!({"model":"base","input":"x","max_output_token":3}),
            400,
            "unknown_parameter",
            "max_output_token",
        ),
        (
            json!({"model":"nope","input":"x"}),
            404,
            "model_not_found",
            "model",
        ),
        (
            json!({"model":"base","input":"x","background":true,"store":false}),
            400,
            "invalid_value",
            "background",
        ),
        (
            json!({"model":"base","input":"x","reasoning":{"effort":"max"}}),
            400,
            "invalid_value",
            "reasoning.effort",
        ),
        (
            json!({"model":"base","input":"x","tools":[{"type":"web_search"}]}),
            400,
            "invalid_value",
            "tools.0.type",
        ),
        (
            json!({"model":"base","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"https://x/y.png"}]}]}),
            400,
            "invalid_value",
            "input.0.content.1",
        ),
        (
            json!({"model":"base","input":"x","text":{"format":{"type":"xml"}}}),
            400,
            "invalid_value",
            "text.format.type",
        ),
        (
            json!({"model":"base","input":"x","text":{"format":{"type":"json_schema","schema":{}}}}),
            400,
            "missing_required_parameter",
            "text.format.name",
        ),
        (
            json!({"model":"base","input":"x","temperature":3}),
            400,
            "invalid_value",
            "temperature",
        ),
        (
            json!({"model":"base","input":"x","thinking_budget":99999}),
            400,
            "invalid_value",
            "thinking_budget",
        ),
        (
            json!({"model":"base","input":"x","previous_response_id":"resp_missing"}),
            404,
            "previous_response_not_found",
            "previous_response_id",
        ),
    ];
    for (body, status, code, param) in cases {
        let r = client.post_json("/responses", &body).await.unwrap();
        let e = assert_error(&r, status, code);
        assert_eq!(e["param"], param, "{body}");
    }
    let r = client
        .get("/responses/resp_nothing/input_items?limit=0")
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{r}");
    let r = client
        .post_json("/responses/resp_nothing/cancel", &json!({}))
        .await
        .unwrap();
    assert_error(&r, 404, "response_not_found");
}

#[tokio::test]
async fn function_call_round_trip_through_previous_response_id() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let tools = json!([{"type":"function","name":"get_weather","description":"Weather in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false},"strict":true}]);
    let first = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"What is the weather in Paris?","tools":tools,"tool_choice":"required"}),
        )
        .await
        .unwrap();
    assert_eq!(first.status, 200, "{first}");
    let first = first.json();
    let call = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("a function_call item in {first}"))
        .clone();
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].is_string());

    let second = client
        .post_json(
            "/responses",
            &json!({"model":"base","previous_response_id":first["id"],"tools":tools,
                "input":[{"type":"function_call_output","call_id":call["call_id"],"output":"{\"temp\":21}"}]}),
        )
        .await
        .unwrap();
    assert_eq!(second.status, 200, "{second}");
    let second = second.json();
    assert_eq!(second["status"], "completed");
    assert_eq!(second["previous_response_id"], first["id"]);
    assert!(
        second["usage"]["input_tokens"].as_u64() > first["usage"]["input_tokens"].as_u64(),
        "the chain is part of the prompt"
    );
    let items = client
        .get(&format!(
            "/responses/{}/input_items",
            second["id"].as_str().unwrap()
        ))
        .await
        .unwrap()
        .json();
    assert_eq!(items["data"][0]["type"], "function_call_output");

    // Streaming function calls: arguments deltas, then done with the name.
    let stream = client
        .stream(
            "/responses",
            &json!({"model":"base","input":"weather?","tools":tools,"tool_choice":{"type":"function","name":"get_weather"},"stream":true}),
        )
        .await
        .unwrap();
    let ev = events(&stream.collect().await.unwrap(), 0);
    let added = ev
        .iter()
        .find(|(n, d)| n == "response.output_item.added" && d["item"]["type"] == "function_call")
        .expect("function_call added");
    assert_eq!(added.1["item"]["arguments"], "");
    let done = ev
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .expect("arguments done");
    assert_eq!(done.1["name"], "get_weather");
    let streamed: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(done.1["arguments"], streamed.as_str());
}

#[tokio::test]
async fn input_items_pagination() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let input: Vec<Value> = (0..5)
        .map(|i| json!({"role":"user","content":format!("m{i}")}))
        .collect();
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":input,"store":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    let page = |q: &str| {
        let client = client.clone();
        let url = format!("/responses/{id}/input_items{q}");
        async move { client.get(&url).await.unwrap().json() }
    };
    let text = |v: &Value| v["content"][0]["text"].as_str().unwrap().to_string();
    let desc = page("").await;
    assert_eq!(desc["data"].as_array().unwrap().len(), 5);
    assert_eq!(text(&desc["data"][0]), "m4");
    let asc = page("?order=asc&limit=2").await;
    assert_eq!(text(&asc["data"][0]), "m0");
    assert_eq!(asc["has_more"], true);
    let next = page(&format!(
        "?order=asc&limit=2&after={}",
        asc["last_id"].as_str().unwrap()
    ))
    .await;
    assert_eq!(text(&next["data"][0]), "m2");
    assert_eq!(next["first_id"], next["data"][0]["id"]);
    let last = page(&format!(
        "?order=asc&limit=2&after={}",
        next["last_id"].as_str().unwrap()
    ))
    .await;
    assert_eq!(last["data"].as_array().unwrap().len(), 1);
    assert_eq!(last["has_more"], false);
}

#[tokio::test]
async fn background_run_replays_and_follows_live_on_another_replica() {
    let (stack, other) = redis_stack(WorkerOpts::paced(0, 50), FAST_LEASES);
    let second = Gateway::start(stack.gateway.opts().clone()).expect("second replica");
    let (a, b) = (stack.client(), second.client());
    let r = a
        .post_json(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=40","background":true}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let created = r.json();
    assert_eq!(created["status"], "queued");
    assert_eq!(created["background"], true);
    let id = created["id"].as_str().unwrap().to_string();

    // Chaining onto a running response: 409 until it finishes.
    let r = b
        .post_json(
            "/responses",
            &json!({"model":"base","input":"next","previous_response_id":id}),
        )
        .await
        .unwrap();
    let e = assert_error(&r, 409, "previous_response_not_finished");
    assert_eq!(e["param"], "previous_response_id");

    // Another organisation sees nothing.
    let outsider = b.with_key(Some(&other.key));
    for path in [
        format!("/responses/{id}"),
        format!("/responses/{id}/input_items"),
    ] {
        assert_error(
            &outsider.get(&path).await.unwrap(),
            404,
            "response_not_found",
        );
    }
    assert_error(
        &outsider
            .post_json(&format!("/responses/{id}/cancel"), &json!({}))
            .await
            .unwrap(),
        404,
        "response_not_found",
    );
    assert_error(
        &outsider.delete(&format!("/responses/{id}")).await.unwrap(),
        404,
        "response_not_found",
    );

    // Live follow through the other replica, from the start.
    let started = Instant::now();
    let live = b
        .open_stream(b.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .unwrap();
    assert_eq!(live.status, 200);
    let ev = events(&live.collect().await.unwrap(), 0);
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "it followed a live run"
    );
    assert_eq!(ev[0].0, "response.created");
    assert_eq!(ev[0].1["response"]["status"], "queued");
    assert_eq!(ev.last().unwrap().0, "response.completed");
    let total = ev.len() as u64;

    // Replay after N on the owner replica.
    let replay = a
        .open_stream(a.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true&starting_after=9"),
        ))
        .await
        .unwrap();
    let rest = events(&replay.collect().await.unwrap(), 10);
    assert_eq!(rest.len() as u64, total - 10);

    let done = b.get(&format!("/responses/{id}")).await.unwrap().json();
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"]["output_tokens"], 40);
    drop(second);
}

/// A run deleted under a live follower: the stream ends with an `error`
/// event that carries the status (as every streamed failure does) and the
/// last sequence number the stream showed (a resume after it misses
/// nothing: the next number is the run's next real event's).
#[tokio::test]
async fn a_run_deleted_under_its_follower_ends_the_stream_with_an_error_event() {
    let (stack, _) = redis_stack(WorkerOpts::paced(0, 40), FAST_LEASES);
    let client = stack.client();
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=400","background":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    responses::wait_for_status(&client, &id, &["in_progress"], Duration::from_secs(5)).await;
    let mut live = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .unwrap();
    assert_eq!(live.status, 200);
    let mut last_seq = None;
    while last_seq.is_none_or(|s| s < 3) {
        let f = live.next_frame().await.unwrap().expect("a frame");
        last_seq = f.json()["sequence_number"].as_u64();
    }
    let r = client.delete(&format!("/responses/{id}")).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let rest = live.collect().await.unwrap();
    let last = rest.last().expect("an error event");
    assert_eq!(last.event.as_deref(), Some("error"), "{rest:?}");
    let e = last.json();
    assert_eq!(e["type"], "error");
    assert_eq!(e["code"], "response_not_found");
    assert_eq!(e["status"], 404, "{e}");
    let before = rest
        .iter()
        .rev()
        .nth(1)
        .map_or(last_seq, |f| f.json()["sequence_number"].as_u64());
    assert_eq!(
        e["sequence_number"].as_u64(),
        before,
        "the last number shown: {rest:?}"
    );
}

#[tokio::test]
async fn background_stream_on_create_and_cancel_through_another_replica() {
    let (stack, _) = redis_stack(WorkerOpts::paced(0, 40), FAST_LEASES);
    let second = Gateway::start(stack.gateway.opts().clone()).expect("second replica");
    let (a, b) = (stack.client(), second.client());

    // background + stream: the creating request streams the run.
    let stream = a
        .stream(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=5","background":true,"stream":true}),
        )
        .await
        .unwrap();
    let ev = events(&stream.collect().await.unwrap(), 0);
    assert_eq!(ev[0].1["response"]["status"], "queued");
    assert_eq!(ev.last().unwrap().0, "response.completed");

    let before = stack.worker("base").counters().await.unwrap();
    let r = a
        .post_json(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=400","background":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    responses::wait_for_status(&b, &id, &["in_progress"], Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled = b
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_eq!(cancelled.status, 200, "{cancelled}");
    assert_eq!(cancelled.json()["status"], "cancelled");
    // Exactly once: a second cancel is refused, the status stays.
    let again = b
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_error(&again, 400, "response_not_cancellable");
    // The owner stops the worker's generation.
    let c = stack
        .worker("base")
        .wait_counters(Duration::from_secs(3), |c| c.cancelled > before.cancelled)
        .await
        .unwrap();
    assert!(
        c.cancelled > before.cancelled,
        "worker generation cancelled: {c:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let obj = a.get(&format!("/responses/{id}")).await.unwrap().json();
    assert_eq!(obj["status"], "cancelled");
    // The replayed log ends with one terminal event.
    let replay = a
        .open_stream(a.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .unwrap();
    let ev = events(&replay.collect().await.unwrap(), 0);
    assert_eq!(ev.last().unwrap().1["response"]["status"], "cancelled");

    // A finished response cannot be cancelled.
    let r = a
        .post_json(
            "/responses",
            &json!({"model":"base","input":"x synthetic:reply_tokens=1"}),
        )
        .await
        .unwrap();
    let done_id = r.json()["id"].as_str().unwrap().to_string();
    assert_error(
        &a.post_json(&format!("/responses/{done_id}/cancel"), &json!({}))
            .await
            .unwrap(),
        400,
        "response_not_cancellable",
    );
    drop(second);
}

#[tokio::test]
async fn killed_owner_run_fails_within_the_lease() {
    let (mut stack, _) = redis_stack(WorkerOpts::paced(0, 20), FAST_LEASES);
    let second = Gateway::start(stack.gateway.opts().clone()).expect("second replica");
    let b = second.client();
    let r = stack
        .client()
        .post_json(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=1000","background":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    responses::wait_for_status(&b, &id, &["in_progress"], Duration::from_secs(5)).await;
    stack.gateway.kill();
    let killed = Instant::now();
    let obj = responses::wait_for_status(&b, &id, &["failed"], Duration::from_secs(10)).await;
    assert_eq!(obj["status"], "failed", "{obj}");
    assert_eq!(obj["error"]["code"], "run_lost");
    assert!(
        killed.elapsed() < Duration::from_millis(1500 + 1500),
        "ended within lease + sweep: {:?}",
        killed.elapsed()
    );
    let replay = b
        .open_stream(b.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .unwrap();
    let ev = events(&replay.collect().await.unwrap(), 0);
    assert_eq!(ev.last().unwrap().0, "response.failed");
}

#[tokio::test]
async fn stored_responses_expire_after_the_window() {
    let (stack, _) = redis_stack(
        WorkerOpts::default(),
        "[store]\nstorage_window_seconds = 1\n",
    );
    let client = stack.client();
    let r = client
        .post_json("/responses", &body("x synthetic:reply_tokens=1"))
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        client
            .get(&format!("/responses/{id}"))
            .await
            .unwrap()
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_error(
        &client.get(&format!("/responses/{id}")).await.unwrap(),
        404,
        "response_not_found",
    );
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":"y","previous_response_id":id}),
        )
        .await
        .unwrap();
    assert_error(&r, 404, "previous_response_not_found");
    // Nothing of it is left in Redis.
    let keys = stack.redis.as_ref().unwrap().keys().unwrap();
    assert!(
        keys.iter().all(|k| !k.contains(&id)),
        "expired keys remain: {keys:?}"
    );
}

#[tokio::test]
async fn worker_failure_mid_run_ends_failed() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let input = "x synthetic:reply_tokens=20 synthetic:fail_after=3";

    // Streaming: the failure arrives in-band as `response.failed`.
    let stream = client
        .stream(
            "/responses",
            &json!({"model":"base","input":input,"stream":true}),
        )
        .await
        .unwrap();
    assert_eq!(stream.status, 200);
    let ev = events(&stream.collect().await.unwrap(), 0);
    let (name, last) = ev.last().unwrap();
    assert_eq!(name, "response.failed");
    let err = &last["response"]["error"];
    assert!(
        err["code"].is_string() && err["message"].is_string(),
        "{last}"
    );
    assert_eq!(last["response"]["status"], "failed");
    let id = last["response"]["id"].as_str().unwrap();
    let stored = client
        .get(&format!("/responses/{id}"))
        .await
        .unwrap()
        .json();
    assert_eq!(stored["status"], "failed");
    assert_eq!(stored["error"], *err);

    // Not streaming: an upstream error envelope, and the stored response failed.
    let r = client
        .post_json("/responses", &json!({"model":"base","input":input}))
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{r}");

    // Background: the run ends failed.
    let r = client
        .post_json(
            "/responses",
            &json!({"model":"base","input":input,"background":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = responses::wait_for_status(&client, &id, &["failed"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "failed", "{v}");
    assert!(v["error"]["message"].is_string());
}

#[tokio::test]
async fn draining_replica_refuses_new_background_runs_and_finishes_its_own() {
    let (mut stack, _) = redis_stack(WorkerOpts::default(), FAST_LEASES);
    let second = Gateway::start(stack.gateway.opts().clone()).expect("second replica");
    let a = stack.client();
    let r = a
        .post_json(
            "/responses",
            &json!({"model":"base","input":"bg synthetic:reply_tokens=30 synthetic:slow_ms=40","background":true}),
        )
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(200)).await;
    stack.gateway.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = a
        .post_json(
            "/responses",
            &json!({"model":"base","input":"late","background":true}),
        )
        .await;
    if let Ok(r) = refused {
        // Still listening while it drains: new background work is refused.
        assert_error(&r, 503, "server_overloaded");
    }
    let v = responses::wait_for_status(
        &second.client(),
        &id,
        &["completed", "failed"],
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        v["status"], "completed",
        "the draining owner finished its run: {v}"
    );
    assert!(stack.gateway.wait_exit(Duration::from_secs(15)).is_some());
}

/// A run longer than the drain grace period: when the grace period ends the
/// draining replica hands it, with the output it stored, to its peer, whose
/// worker continues it: the run completes as one reply (one message, every
/// token asked for), its log one story replayable on the peer. The lease
/// here is long (30 s) and a lease sweep fails a run rather than continuing
/// it, so only the hand-over can explain a completed run.
#[tokio::test]
async fn a_run_outlasting_the_grace_period_is_continued_by_a_peer_from_its_output() {
    let (mut stack, _) = redis_stack(
        WorkerOpts::default(),
        "grace_period_seconds = 1\nreadiness_drain_millis = 100\n[store]\nlease_millis = 30000\n",
    );
    let second = Gateway::start(stack.gateway.opts().clone()).expect("second replica");
    let id = responses::id(&responses::create(&stack.client(), &json!({"model":"base","input":"bg synthetic:reply_tokens=200 synthetic:slow_ms=50","background":true})).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.gateway.signal(libc::SIGTERM);
    let v = responses::wait_for_status(
        &second.client(),
        &id,
        &["completed", "failed", "cancelled", "incomplete"],
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["usage"]["output_tokens"], 200, "{v}");
    let output = v["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "one message, continued: {v}");
    let kept = responses::output_text(&v);
    // The event log ends with the terminal event, replayable on the peer,
    // and tells the same text.
    let frames = responses::replay(&second.client(), &id).await;
    assert_eq!(
        frames.last().and_then(|f| f.event.as_deref()),
        Some("response.completed"),
        "{frames:?}"
    );
    assert_eq!(
        responses::streamed_text(&frames),
        kept,
        "the replay shows what the object keeps"
    );
    assert!(stack.gateway.wait_exit(Duration::from_secs(10)).is_some());
}

/// Sum of `gateway_store_round_trips_total` over all operations, and the
/// per-operation counts, from the admin endpoint.
async fn round_trips(gw: &Gateway) -> (u64, Vec<(String, u64)>) {
    let (status, text) = gw.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    let mut total = 0;
    let mut by_op = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("gateway_store_round_trips_total{op=\"") {
            let (op, value) = rest.split_once("\"} ").unwrap();
            let n: u64 = value.trim().parse().unwrap();
            total += n;
            by_op.push((op.to_string(), n));
        }
    }
    (total, by_op)
}

/// Benchmark (run with `--ignored --nocapture`): background runs per second
/// against unpaced synthetic workers on Redis, and store round trips per
/// run and per streamed event. Unpaced, a run's events arrive together and
/// are written in a few batches.
#[tokio::test]
#[ignore]
async fn bench_background_runs() {
    bench_background(WorkerOpts::default(), 200, 16, "unpaced").await;
}

/// The same with a realistic worker (TTFT 50 ms, 200 tokens/s): events
/// arrive one at a time, so batching helps least; this is the worst case
/// for round trips per event.
#[tokio::test]
#[ignore]
async fn bench_background_runs_paced() {
    bench_background(
        WorkerOpts::paced(50, 200),
        200,
        64,
        "TTFT 50 ms, 200 tokens/s",
    )
    .await;
}

async fn bench_background(opts: WorkerOpts, runs: usize, concurrency: usize, label: &str) {
    const TOKENS: u64 = 50;
    let (stack, _) = redis_stack(opts, "");
    let client = stack.client();
    let (before, _) = round_trips(&stack.gateway).await;
    let started = Instant::now();
    let ids = std::sync::Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Create every run (16 requests at a time), then wait for all to end.
    for w in 0..concurrency {
        let client = client.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            for _ in (w..runs).step_by(concurrency) {
                let r = client
                    .post_json(
                        "/responses",
                        &json!({"model":"base","input":format!("bg synthetic:reply_tokens={TOKENS}"),"background":true}),
                    )
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{r}");
                ids.lock().await.push(r.json()["id"].as_str().unwrap().to_string());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let pending: Vec<String> = ids.lock().await.clone();
    for id in &pending {
        let v =
            responses::wait_for_status(&client, id, &["completed"], Duration::from_secs(60)).await;
        assert_eq!(v["status"], "completed");
    }
    let elapsed = started.elapsed();
    // Polling reads are the benchmark's own; count the runs' share only.
    let (after, by_op) = round_trips(&stack.gateway).await;
    let polls = by_op
        .iter()
        .filter(|(op, _)| op == "read")
        .map(|(_, n)| *n)
        .sum::<u64>();
    let one = &pending[0];
    let replay = client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{one}?stream=true"),
        ))
        .await
        .unwrap();
    let events_per_run = replay.collect().await.unwrap().len() as u64;
    let run_trips = (after - before).saturating_sub(polls);
    println!(
        "background runs ({label}): {runs} x {TOKENS} tokens, {concurrency} concurrent: {:.1} runs/s ({elapsed:?})",
        runs as f64 / elapsed.as_secs_f64()
    );
    println!(
        "store round trips per run (without status polls): {:.2}; events per run: {events_per_run}; round trips per streamed event: {:.3}",
        run_trips as f64 / runs as f64,
        run_trips as f64 / (runs as u64 * events_per_run) as f64
    );
    println!("by operation: {by_op:?}");
    assert!(run_trips as f64 / ((runs as u64 * events_per_run) as f64) <= 2.0);
}

/// A finished call is read to its trailers by every driver of a generation:
/// a background run must not drop its worker stream after `Finished` (an h2
/// stream reset where the trailers belong), exactly like the foreground relay.
#[tokio::test]
async fn a_finished_run_reads_its_worker_stream_to_the_end() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    // The worker ends each stream 400 ms after its `Finished` event.
    let input = "x synthetic:reply_tokens=5 synthetic:trailers_ms=400";
    let request = |background: bool| json!({"model":"base","input":input,"background":background});

    let r = client
        .post_json("/responses", &request(false))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = client
        .post_json("/responses", &request(true))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = responses::wait_for_status(&client, &id, &["completed"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "completed", "{v}");

    let worker = stack.worker("base");
    let c = worker
        .wait_counters(Duration::from_secs(5), |c| c.completed >= 2)
        .await
        .unwrap();
    assert_eq!(c.completed, 2, "{c:?}");
    // Past the trailers' pause, nothing was reset after finishing.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let c = worker.counters().await.unwrap();
    assert_eq!(c.reset_after_finish, 0, "{c:?}");
}

/// After the first token a worker's 503 (overloaded, unreachable) is a 502
/// `upstream_error` for every driver: the foreground reply and a background
/// run's stored `response.failed` say the same thing.
#[tokio::test]
async fn a_worker_503_mid_run_fails_like_the_foreground_relay() {
    let stack = Stack::single(WorkerOpts::default());
    let client = stack.client();
    let input = "x synthetic:reply_tokens=20 synthetic:fail_after=3 synthetic:fail_unavailable";
    let request = |background: bool| json!({"model":"base","input":input,"background":background});

    let r = client
        .post_json("/responses", &request(false))
        .await
        .unwrap();
    assert_error(&r, 502, "upstream_error");

    let r = client
        .post_json("/responses", &request(true))
        .await
        .unwrap();
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = responses::wait_for_status(&client, &id, &["failed"], Duration::from_secs(10)).await;
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
}

/// A client that reads `response.completed` and at once chains its next
/// turn to it (or retrieves it) finds it finished: a stored stream's
/// terminal event goes out only once the store holds the final object.
/// Read frame by frame, so the next request leaves while the stream's end
/// is still on its way; on the Redis store, whose write is a round trip.
#[tokio::test]
async fn a_stored_stream_s_terminal_event_is_never_ahead_of_the_store() {
    let (stack, _) = redis_stack(WorkerOpts::default(), "");
    let client = stack.client();
    for round in 0..30 {
        let mut stream = client
            .stream(
                "/responses",
                &json!({"model":"base","input":format!("Turn {round} synthetic:reply_tokens=3"),"stream":true}),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        let id = loop {
            let frame = stream
                .next_frame()
                .await
                .unwrap()
                .expect("a terminal event");
            let data = frame.json();
            if data["type"] == "response.completed" {
                break data["response"]["id"].as_str().unwrap().to_owned();
            }
        };
        let chained = client
            .post_json(
                "/responses",
                &json!({"model":"base","input":"And then? synthetic:reply_tokens=2","previous_response_id":id}),
            )
            .await
            .unwrap();
        assert_eq!(chained.status, 200, "round {round}: {chained}");
        let got = client.get(&format!("/responses/{id}")).await.unwrap();
        assert_eq!(got.json()["status"], "completed", "round {round}: {got}");
        drop(stream);
    }
}
