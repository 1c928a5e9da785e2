//! Responses over WebSocket end to end: a real gateway and real synthetic
//! workers, a WebSocket client on a real socket (tokio-tungstenite, as the
//! Codex CLI uses). What is asserted is what the client sees (events,
//! their order and sequence numbers, error events, close frames and
//! codes) plus the worker's own counters where only it can tell (a
//! cancelled generation, which worker ran a turn).

use futures::{SinkExt, StreamExt};
use harness::websocket::{self, CloseCode, Message, Received, WsClient, WsError};
use harness::{json, responses, Stack, Value, WorkerOpts};
use std::future::Future;
use std::time::{Duration, Instant};

/// Fails a test that hangs rather than letting it run forever.
async fn bounded<F: Future<Output = ()>>(secs: u64, test: F) {
    tokio::time::timeout(Duration::from_secs(secs), test)
        .await
        .expect("the test finished in time");
}

/// A one-worker `base` stack and a connection to it.
async fn open() -> (Stack, WsClient) {
    open_with("").await
}

/// [`open`], the gateway's config extended with `toml`.
async fn open_with(toml: &str) -> (Stack, WsClient) {
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml(toml)
        .start()
        .expect("stack starts");
    let ws = connect(&stack).await;
    (stack, ws)
}

/// Runs one response to its end; returns its final object, its events
/// checked ([`check_events`]).
async fn turn(ws: &mut WsClient, body: Value) -> Value {
    check_events(&ws.create(&body).await.expect("a reply"))
}

async fn connect(stack: &Stack) -> WsClient {
    websocket::connect(&stack.gateway.base_url(), stack.gateway.api_key())
        .await
        .expect("connects")
}

/// The events of one response, checked: `response.created` first with
/// `in_progress` status, then `response.in_progress`, sequence numbers 0,
/// 1, 2, ... and one terminal event, last. Returns the terminal event's
/// response.
fn check_events(events: &[Value]) -> Value {
    assert!(events.len() >= 3, "{events:?}");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "{e}");
    }
    assert_eq!(events[0]["type"], "response.created", "{events:?}");
    assert_eq!(events[1]["type"], "response.in_progress", "{events:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{events:?}");
    let terminal = events
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("response.completed" | "response.failed" | "response.incomplete")
            )
        })
        .count();
    assert_eq!(terminal, 1, "{events:?}");
    let id = &events[0]["response"]["id"];
    assert!(events
        .iter()
        .all(|e| e.get("response").is_none_or(|r| &r["id"] == id)));
    last["response"].clone()
}

/// The lone error event of a refused request: its status and code.
fn assert_error_event(events: &[Value], status: u16, code: &str) -> Value {
    assert_eq!(events.len(), 1, "one error event: {events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["status"], status, "{e}");
    assert_eq!(e["error"]["code"], code, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{e}"
    );
    e.clone()
}

fn text_of(response: &Value) -> String {
    responses::output_text(response)
}

#[tokio::test]
async fn sequential_turns_on_one_connection_stream_their_events_in_order() {
    bounded(60, async {
        let (stack, mut ws) = open().await;
        let mut ids = Vec::new();
        for turn in 0..3 {
            let events = ws
                .create(&json!({
                    "model": "base",
                    "input": format!("turn {turn} synthetic:reply_tokens=6"),
                    "store": false,
                }))
                .await
                .unwrap();
            let response = check_events(&events);
            assert_eq!(response["status"], "completed");
            assert_eq!(response["store"], false);
            assert!(
                events
                    .iter()
                    .any(|e| e["type"] == "response.output_text.delta"),
                "{events:?}"
            );
            assert_eq!(response["usage"]["output_tokens"], 6, "{response}");
            ids.push(response["id"].as_str().unwrap().to_owned());
        }
        ids.dedup();
        assert_eq!(ids.len(), 3, "a new response each turn: {ids:?}");

        // Each response counts as a request of its own, as POST's do (once
        // its last event is out: polled).
        let counted = |metrics: &str| {
            metrics
                .lines()
                .find(|l| {
                    l.starts_with("gateway_requests_total")
                        && l.contains("route=\"responses.create\"")
                        && l.contains("status=\"200\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        };
        let deadline = Instant::now() + Duration::from_secs(3);
        let metrics = loop {
            // A scrape that fails under load is tried again.
            let metrics = match stack.gateway.admin_get("/metrics").await {
                Ok((_, metrics)) => metrics,
                Err(e) => format!("{e}"),
            };
            if counted(&metrics) == Some(3) || Instant::now() > deadline {
                break metrics;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            counted(&metrics),
            Some(3),
            "per-response metrics:\n{metrics}"
        );
        assert!(
            metrics.contains("gateway_websocket_connections 1"),
            "{metrics}"
        );
    })
    .await;
}

#[tokio::test]
async fn store_false_chains_from_the_connection_and_never_reaches_the_store() {
    bounded(60, async {
        let stack = Stack::single(WorkerOpts::default());
        let client = stack.client();
        let mut ws = connect(&stack).await;
        let first = turn(
            &mut ws,
            json!({
                "model": "base",
                "instructions": "be brief",
                "input": "remember the apples synthetic:reply_tokens=4",
                "store": false,
            }),
        )
        .await;
        let first_id = first["id"].as_str().unwrap().to_owned();
        let first_text = text_of(&first);
        assert!(!first_text.is_empty());

        // Only the new input, chained to the first response.
        let second = turn(
            &mut ws,
            json!({
                "model": "base",
                "instructions": "be brief",
                "previous_response_id": first_id,
                "input": [{"role": "user", "content": "what did I say? synthetic:echo_messages"}],
                "store": false,
            }),
        )
        .await;
        assert_eq!(second["previous_response_id"], first_id.as_str());
        // The worker received the whole conversation: the first input, the
        // first output, then the new input.
        let seen = text_of(&second);
        let first_input = seen
            .find("remember the apples")
            .unwrap_or_else(|| panic!("the first input reached the worker: {seen}"));
        let first_output = seen
            .find(first_text.trim())
            .unwrap_or_else(|| panic!("the first output reached the worker: {seen}"));
        let new_input = seen.find("what did I say").expect("the new input");
        assert!(
            first_input < first_output && first_output < new_input,
            "{seen}"
        );

        // And a third turn chains to the second (the latest is kept).
        let third = turn(
            &mut ws,
            json!({
                "model": "base",
                "previous_response_id": second["id"],
                "input": "and now? synthetic:echo_messages",
                "store": false,
            }),
        )
        .await;
        assert!(text_of(&third).contains("remember the apples"), "{third}");

        // Never stored: the store does not know the ids, on any path.
        let got = client.get(&format!("/responses/{first_id}")).await.unwrap();
        assert_eq!(got.status, 404, "{got}");
        let chained = client
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "x", "previous_response_id": first_id}),
            )
            .await
            .unwrap();
        harness::assert_error(&chained, 404, "previous_response_not_found");
    })
    .await;
}

#[tokio::test]
async fn a_stored_response_chains_across_transports() {
    bounded(60, async {
        let stack = Stack::single(WorkerOpts::default());
        let client = stack.client();
        // Stored over HTTP, continued over WebSocket from the store.
        let posted = responses::create(
            &client,
            &json!({"model": "base", "input": "the pears synthetic:reply_tokens=3"}),
        )
        .await;
        let mut ws = connect(&stack).await;
        let over_ws = turn(
            &mut ws,
            json!({
                "model": "base",
                "previous_response_id": posted["id"],
                "input": "echo synthetic:echo_messages",
            }),
        )
        .await;
        assert!(text_of(&over_ws).contains("the pears"), "{over_ws}");
        // `store` defaults to true: this one is stored too, and retrievable.
        let id = over_ws["id"].as_str().unwrap();
        let got = client.get(&format!("/responses/{id}")).await.unwrap();
        assert_eq!(got.status, 200, "{got}");
        assert_eq!(got.json()["status"], "completed");
        assert_eq!(got.json()["output"], over_ws["output"]);
    })
    .await;
}

#[tokio::test]
async fn a_warm_up_without_generation_can_be_chained_from() {
    bounded(60, async {
        let stack = Stack::single(WorkerOpts::default());
        let before = stack.worker("base").counters().await.unwrap();
        let mut ws = connect(&stack).await;
        let warm = ws
            .create(&json!({
                "model": "base",
                "instructions": "you are terse",
                "input": "the plums",
                "store": false,
                "generate": false,
            }))
            .await
            .unwrap();
        let names: Vec<&str> = warm.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.completed"
            ]
        );
        let warm = check_events(&warm);
        assert_eq!(warm["output"], json!([]));
        let after = stack.worker("base").counters().await.unwrap();
        assert_eq!(after.started, before.started, "no worker call");
        let next = turn(
            &mut ws,
            json!({
                "model": "base",
                "instructions": "you are terse",
                "previous_response_id": warm["id"],
                "input": "go synthetic:echo_messages",
                "store": false,
            }),
        )
        .await;
        assert!(text_of(&next).contains("the plums"), "{next}");
    })
    .await;
}

#[tokio::test]
async fn an_unknown_previous_response_is_an_error_event_and_the_connection_goes_on() {
    bounded(60, async {
        let (_stack, mut ws) = open().await;
        let events = ws
            .create(&json!({
                "model": "base",
                "input": "x",
                "store": false,
                "previous_response_id": "resp_nothing_here",
            }))
            .await
            .unwrap();
        let e = assert_error_event(&events, 404, "previous_response_not_found");
        assert_eq!(e["error"]["param"], "previous_response_id");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        let ok = ws
            .create(&json!({"model": "base", "input": "still here synthetic:reply_tokens=2", "store": false}))
            .await
            .unwrap();
        check_events(&ok);
    })
    .await;
}

#[tokio::test]
async fn bad_messages_get_error_events_and_the_connection_stays_open() {
    bounded(60, async {
        let (_stack, mut ws) = open().await;

        ws.send_text("{not json").await.unwrap();
        assert_error_event(&ws.reply().await.unwrap(), 400, "invalid_json");

        ws.send_json(&json!({"type": "response.cancel"}))
            .await
            .unwrap();
        let e = assert_error_event(&ws.reply().await.unwrap(), 400, "invalid_value");
        assert_eq!(e["error"]["param"], "type");

        ws.send_json(&json!({"model": "base", "input": "x"}))
            .await
            .unwrap();
        let e = assert_error_event(
            &ws.reply().await.unwrap(),
            400,
            "missing_required_parameter",
        );
        assert_eq!(e["error"]["param"], "type");

        let events = ws
            .create(&json!({"model": "base", "input": "x", "max_token": 5}))
            .await
            .unwrap();
        let e = assert_error_event(&events, 400, "unknown_parameter");
        assert_eq!(e["error"]["param"], "max_token");

        let events = ws
            .create(&json!({"model": "base", "input": "x", "temperature": 9}))
            .await
            .unwrap();
        let e = assert_error_event(&events, 400, "invalid_value");
        assert_eq!(e["error"]["param"], "temperature");

        // A schema that admits no value is the turn's 400 naming where,
        // not a turn that fails its output check.
        let schema =
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]});
        let format = json!({"format": {"type": "json_schema", "name": "a", "schema": schema}});
        let events = ws
            .create(&json!({"model": "base", "input": "x", "text": format}))
            .await
            .unwrap();
        let e = assert_error_event(&events, 400, "invalid_json_schema");
        assert_eq!(e["error"]["param"], "text.format.schema.properties.a.$ref");

        let events = ws
            .create(&json!({"model": "nope", "input": "x"}))
            .await
            .unwrap();
        assert_eq!(events[0]["type"], "error");
        assert_eq!(events[0]["status"], 404, "{events:?}");

        let events = ws
            .create(&json!({"model": "base", "input": "x", "background": true}))
            .await
            .unwrap();
        let e = assert_error_event(&events, 400, "unsupported_value");
        assert_eq!(e["error"]["param"], "background");

        ws.ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
        assert_error_event(&ws.reply().await.unwrap(), 400, "invalid_message");

        // Codex's acknowledgement of a response is taken without a reply:
        // the next reply is the next response's.
        ws.send_json(&json!({"type": "response.processed", "response_id": "resp_x"}))
            .await
            .unwrap();
        let ok = ws
            .create(
                &json!({"model": "base", "input": "fine synthetic:reply_tokens=3", "store": false}),
            )
            .await
            .unwrap();
        check_events(&ok);
    })
    .await;
}

#[tokio::test]
async fn one_response_at_a_time_a_second_create_meanwhile_is_a_409() {
    bounded(60, async {
        let (_stack, mut ws) = open().await;
        let mut slow = json!({
            "type": "response.create",
            "model": "base",
            "input": "slow synthetic:reply_tokens=40 synthetic:slow_ms=20",
            "store": false,
        });
        ws.send_json(&slow).await.unwrap();
        let first = ws.next_json().await.unwrap();
        assert_eq!(first["type"], "response.created");
        slow["input"] = json!("another");
        ws.send_json(&slow).await.unwrap();
        let mut events = vec![first];
        let mut conflicts = Vec::new();
        loop {
            let e = ws.next_json().await.unwrap();
            if e["type"] == "error" {
                conflicts.push(e);
                continue;
            }
            let done = e["type"] == "response.completed";
            events.push(e);
            if done {
                break;
            }
        }
        assert_eq!(conflicts.len(), 1, "{conflicts:?}");
        assert_eq!(conflicts[0]["status"], 409);
        assert_eq!(conflicts[0]["error"]["code"], "response_already_in_flight");
        let response = check_events(&events);
        assert_eq!(response["usage"]["output_tokens"], 40);
    })
    .await;
}

#[tokio::test]
async fn the_key_is_checked_before_the_upgrade() {
    bounded(60, async {
        let stack = Stack::single(WorkerOpts::default());
        let base = stack.gateway.base_url();
        for key in [None, Some("sk-wrong")] {
            match websocket::connect_with(&base, key, &[]).await {
                Err(WsError::Http(response)) => {
                    assert_eq!(response.status(), 401, "{key:?}");
                    let body: Value =
                        serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                            .expect("a JSON body");
                    assert_eq!(body["error"]["code"], "invalid_api_key", "{body}");
                    assert_eq!(body["error"]["status"], 401, "{body}");
                }
                Err(e) => panic!("{key:?}: {e}"),
                Ok(_) => panic!("{key:?}: upgraded"),
            }
        }
        // A plain GET (no upgrade) keeps its answer.
        let plain = stack.client().get("/responses").await.unwrap();
        harness::assert_error(&plain, 405, "method_not_allowed");
        // Another WebSocket version: 426 naming the one spoken.
        let other_version = stack
            .client()
            .request(reqwest::Method::GET, "/responses")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "8")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .send()
            .await
            .unwrap();
        assert_eq!(other_version.status(), 426);
        assert_eq!(other_version.headers()["sec-websocket-version"], "13");
    })
    .await;
}

#[tokio::test]
async fn closing_the_socket_mid_response_cancels_the_generation() {
    bounded(60, async {
        let stack = Stack::single(WorkerOpts::default());
        let worker = stack.worker("base");
        for how in ["close frame", "dropped connection"] {
            let before = worker.counters().await.unwrap();
            let mut ws = connect(&stack).await;
            ws.send_json(&json!({
                "type": "response.create",
                "model": "base",
                "input": "long synthetic:reply_tokens=2000 synthetic:slow_ms=20",
                "store": false,
            }))
            .await
            .unwrap();
            // Generating: a delta has arrived.
            loop {
                let e = ws.next_json().await.unwrap();
                if e["type"] == "response.output_text.delta" {
                    break;
                }
            }
            let left = Instant::now();
            if how == "close frame" {
                ws.ws.close(None).await.unwrap();
            } else {
                drop(ws);
            }
            let c = worker
                .wait_counters(Duration::from_secs(3), |c| c.cancelled > before.cancelled)
                .await
                .unwrap();
            assert!(
                c.cancelled > before.cancelled,
                "{how}: cancelled on the worker: {c:?}"
            );
            assert!(
                left.elapsed() < Duration::from_secs(2),
                "{how}: freed quickly: {:?}",
                left.elapsed()
            );
            let load = worker.load().await.unwrap();
            assert_eq!(load.running, 0, "{how}: {load:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_connection_s_turns_stay_on_one_worker() {
    bounded(90, async {
        let stack = Stack::builder()
            .models(&["base"])
            .workers_per_model(3)
            .start()
            .expect("stack starts");
        let mut ws = connect(&stack).await;
        for turn in 0..6 {
            // Unrelated prompts, no chaining: only the connection ties them.
            let events = ws
                .create(&json!({
                    "model": "base",
                    "input": format!("{turn} {} synthetic:reply_tokens=2", "x".repeat(turn * 37)),
                    "store": false,
                }))
                .await
                .unwrap();
            check_events(&events);
        }
        let mut started = Vec::new();
        for w in stack.workers_of("base") {
            started.push(w.counters().await.unwrap().started);
        }
        started.sort();
        assert_eq!(started, [0, 0, 6], "every turn on one worker: {started:?}");
    })
    .await;
}

#[tokio::test]
async fn pings_keep_the_connection_and_the_idle_timeout_ends_it() {
    bounded(60, async {
        let (_stack, mut ws) =
            open_with("[websocket]\nping_interval_seconds = 1\nidle_timeout_seconds = 3\n").await;
        let opened = Instant::now();
        // The client's ping is answered.
        ws.ws
            .send(Message::Ping(b"hi".to_vec().into()))
            .await
            .unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match ws.ws.next().await {
                    Some(Ok(Message::Pong(p))) => return p,
                    Some(Ok(_)) => continue,
                    other => panic!("{other:?}"),
                }
            }
        })
        .await
        .expect("a pong");
        assert_eq!(&pong[..], b"hi");
        // Silence brings the server's pings (answered by this client), and
        // after the idle timeout a normal close.
        let mut pings = 0;
        let code = loop {
            match ws.next().await.unwrap() {
                Received::Ping => pings += 1,
                Received::Closed(c) => break c,
                Received::Json(v) => panic!("{v}"),
            }
        };
        assert!(pings >= 1, "server pings on idle");
        let (code, reason) = code.expect("a close frame");
        assert_eq!(code, CloseCode::Normal);
        assert_eq!(reason, "idle timeout");
        let lived = opened.elapsed();
        assert!(
            lived >= Duration::from_millis(2500) && lived < Duration::from_secs(6),
            "{lived:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_message_over_the_body_limit_closes_with_1009() {
    bounded(60, async {
        let (_stack, mut ws) = open_with("max_body_bytes = 4096\n").await;
        // Under the bound: a response.
        let ok = ws
            .create(&json!({"model": "base", "input": "a".repeat(2000), "store": false}))
            .await
            .unwrap();
        check_events(&ok);
        // The refusal's error event (the body limit's), then the close.
        let refused = ws
            .create(&json!({"model": "base", "input": "a".repeat(8000)}))
            .await
            .unwrap();
        assert_error_event(&refused, 413, "request_too_large");
        let (after, close) = ws.closed().await.unwrap();
        assert!(after.is_empty(), "{after:?}");
        let (code, _) = close.expect("a close frame");
        assert_eq!(code, CloseCode::Size);
    })
    .await;
}

#[tokio::test]
async fn sigterm_lets_the_running_response_finish_then_closes_with_1001() {
    bounded(60, async {
        let gw = harness::GatewayOpts {
            grace_period_seconds: Some(10),
            ..Default::default()
        };
        let stack = Stack::builder()
            .models(&["base"])
            .gateway_opts(gw)
            .extra_toml("readiness_drain_millis = 200\n")
            .start()
            .expect("stack starts");
        let mut idle = connect(&stack).await;
        let mut busy = connect(&stack).await;
        busy.send_json(&json!({
            "type": "response.create",
            "model": "base",
            "input": "slow synthetic:reply_tokens=60 synthetic:slow_ms=20",
            "store": false,
        }))
        .await
        .unwrap();
        let first = busy.next_json().await.unwrap();
        assert_eq!(first["type"], "response.created");
        stack.gateway.signal(libc::SIGTERM);

        // The idle connection is told at once.
        let t = Instant::now();
        let (_, close) = idle.closed().await.unwrap();
        assert_eq!(close.expect("a close frame").0, CloseCode::Away);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

        // The busy one finishes its response first.
        let (rest, close) = busy.closed().await.unwrap();
        let mut events = vec![first];
        events.extend(rest);
        let response = check_events(&events);
        assert_eq!(response["usage"]["output_tokens"], 60);
        let (code, reason) = close.expect("a close frame");
        assert_eq!(code, CloseCode::Away);
        assert_eq!(reason, "server shutting down");

        // A new connection is refused while draining (or the listener is gone).
        match websocket::connect(&stack.gateway.base_url(), stack.gateway.api_key()).await {
            Err(_) => {}
            Ok(mut ws) => {
                let (_, close) = ws.closed().await.unwrap();
                panic!("a connection while draining: {close:?}");
            }
        }
    })
    .await;
}

/// A connection lives `max_connection_seconds`: a response running at
/// that point finishes, then the connection gets 1001 `connection lifetime
/// reached` (the client reconnects); pings do not extend it.
#[tokio::test]
async fn a_connection_ends_at_its_lifetime_but_never_during_a_response() {
    bounded(60, async {
        let (_stack, mut ws) = open_with(
            "[websocket]\nping_interval_seconds = 1\nidle_timeout_seconds = 30\nmax_connection_seconds = 2\n",
        )
        .await;
        let opened = Instant::now();
        ws.send_json(&json!({
            "type": "response.create",
            "model": "base",
            "input": "slow synthetic:reply_tokens=100 synthetic:slow_ms=50",
            "store": false,
        }))
        .await
        .unwrap();
        let (events, close) = ws.closed().await.unwrap();
        let response = check_events(&events);
        assert_eq!(response["status"], "completed");
        assert_eq!(response["usage"]["output_tokens"], 100, "not cut at the lifetime");
        let (code, reason) = close.expect("a close frame");
        assert_eq!(code, CloseCode::Away);
        assert_eq!(reason, "connection lifetime reached");
        let lived = opened.elapsed();
        assert!(lived >= Duration::from_millis(2500), "the response outlived the lifetime: {lived:?}");

        // An idle connection, pinged and answering, ends at its lifetime.
        let (_stack, mut idle) = open_with(
            "[websocket]\nping_interval_seconds = 1\nidle_timeout_seconds = 30\nmax_connection_seconds = 2\n",
        )
        .await;
        let opened = Instant::now();
        let (_, close) = idle.closed().await.unwrap();
        assert_eq!(close.expect("a close frame").1, "connection lifetime reached");
        let lived = opened.elapsed();
        assert!(
            lived >= Duration::from_millis(1800) && lived < Duration::from_secs(4),
            "{lived:?}"
        );
    })
    .await;
}

/// A peer that vanished without closing answers no ping: after one ping
/// interval unanswered the gateway drops the connection (no close
/// handshake with a peer that is gone).
#[tokio::test]
async fn a_peer_that_answers_no_ping_is_dropped() {
    bounded(60, async {
        let (_stack, mut ws) =
            open_with("[websocket]\nping_interval_seconds = 1\nidle_timeout_seconds = 30\n").await;
        // Not reading: the client's library answers pings only as it reads.
        tokio::time::sleep(Duration::from_secs(4)).await;
        let mut pings = 0;
        let close = loop {
            match ws.next().await.expect("the connection ends") {
                Received::Ping => pings += 1,
                Received::Closed(close) => break close,
                Received::Json(v) => panic!("{v}"),
            }
        };
        assert!(pings >= 1, "the gateway pinged");
        assert!(close.is_none(), "dropped, not closed: {close:?}");
    })
    .await;
}

/// The Codex shape: `stream: true`, `include`, `prompt_cache_key`, a
/// `client_metadata` map, `tool_choice` and tools, all in the event.
#[tokio::test]
async fn a_codex_shaped_create_is_served() {
    bounded(60, async {
        let (_stack, mut ws) = open().await;
        let events = ws
            .create(&json!({
                "model": "base",
                "instructions": "You are Codex.",
                "input": [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "hi synthetic:reply_tokens=3"}]}],
                "tools": [{"type": "function", "name": "shell", "description": "run",
                    "strict": false, "parameters": {"type": "object", "properties":
                        {"command": {"type": "array", "items": {"type": "string"}}},
                        "required": ["command"], "additionalProperties": false}}],
                "tool_choice": "auto",
                "parallel_tool_calls": false,
                "reasoning": null,
                "store": false,
                "stream": true,
                "include": [],
                "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53",
                "client_metadata": {"x-codex-turn-metadata": "{}"},
            }))
            .await
            .unwrap();
        let response = check_events(&events);
        assert_eq!(
            response["prompt_cache_key"],
            "0199a213-81c0-7800-8aa1-bbab2a035a53"
        );
    })
    .await;
}

/// Backpressure: a client that stops reading loses its connection after
/// `write_timeout_seconds` (the gateway buffers one batch, never the
/// response): the worker's call is cancelled and the organisation's one
/// concurrency slot is free again.
#[tokio::test]
async fn a_client_that_stops_reading_loses_its_connection_after_the_write_timeout() {
    bounded(60, async {
        // `base-ultra` (a 1M-token window): a reply of megabytes more than
        // the sockets buffer (the gateway's send buffer grows to 4 MiB).
        let stack = Stack::builder()
            .models(&["base-ultra"])
            .extra_toml("write_timeout_seconds = 2\n[plans.default]\nmax_concurrent = 1\n")
            .start()
            .expect("stack starts");
        // A receive buffer of its own (loopback autotunes one to 32 MiB).
        let mut ws = websocket::connect_small_buffer(
            &stack.gateway.base_url(),
            stack.gateway.api_key(),
            64 << 10,
        )
        .await
        .unwrap();
        let worker = stack.worker("base-ultra");
        let before = worker.counters().await.unwrap();
        ws.send_json(&json!({
            "type": "response.create",
            "model": "base-ultra",
            "input": "Go on. synthetic:reply_tokens=600000",
            "store": false,
        }))
        .await
        .unwrap();
        let first = ws.next_json().await.unwrap();
        assert_eq!(first["type"], "response.created", "{first}");
        // Read no more: the socket fills, then a write stalls.
        let started = Instant::now();
        let gauge = |metrics: &str| {
            metrics
                .lines()
                .find(|l| l.starts_with("gateway_websocket_connections "))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        let dropped_after = loop {
            if let Ok((_, metrics)) = stack.gateway.admin_get("/metrics").await {
                if gauge(&metrics) == Some(0.0) {
                    break started.elapsed();
                }
            }
            assert!(started.elapsed() < Duration::from_secs(30), "never dropped");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(dropped_after >= Duration::from_secs(2), "{dropped_after:?}");
        // Nothing runs on the worker any more (its call was dropped; a fast
        // worker may have finished into the gRPC buffers first).
        let load = worker.load().await.unwrap();
        assert_eq!(load.running + load.queued, 0, "{load:?}");
        let c = worker.counters().await.unwrap();
        assert_eq!(c.started, before.started + 1, "{c:?}");
        // The one concurrency slot is free: another connection is served.
        let mut again = connect(&stack).await;
        turn(
            &mut again,
            json!({"model": "base-ultra", "input": "hi synthetic:reply_tokens=2", "store": false}),
        )
        .await;
        drop(ws);
    })
    .await;
}
