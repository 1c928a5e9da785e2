//! What an open Responses WebSocket may do, end to end (issue 52): each
//! `response.create` runs under the key's and organisation's rights as
//! they are now, not as they were at the upgrade (a revoked key, a blocked
//! organisation, a budget set to zero refuse the turn as `POST` would, and
//! a revoked key's or blocked organisation's open connections close with
//! 1008 on every replica); a warm-up is admitted like any create; a key
//! holds a bounded number of connections, counted on the operator's
//! gauges.

use harness::prometheus::sample;
use harness::websocket::{self, CloseCode, WsClient, WsError};
use harness::{json, Gateway, Stack, TestKey, Value};
use std::future::Future;
use std::time::Duration;

async fn bounded<F: Future<Output = ()>>(secs: u64, test: F) {
    tokio::time::timeout(Duration::from_secs(secs), test)
        .await
        .expect("the test finished in time");
}

/// A stack on the test Redis and a second replica sharing it.
fn two_replicas() -> (Stack, Gateway) {
    let stack = Stack::builder()
        .models(&["base"])
        .redis()
        .start()
        .expect("stack starts");
    let b = Gateway::start(stack.gateway.opts().clone()).expect("replica b starts");
    (stack, b)
}

/// `gateway keys create --org org`: the secret.
fn create_key(stack: &Stack, org: &str) -> String {
    let key = stack
        .cli(&["keys", "create", "--org", org])
        .trim()
        .to_owned();
    assert!(key.starts_with("sk-"), "{key}");
    key
}

/// A key's id as `keys list` prints it.
fn key_id(secret: &str) -> String {
    harness::hash_key(secret)[..12].to_owned()
}

async fn connect(gateway: &Gateway, key: &str) -> WsClient {
    websocket::connect(&gateway.base_url(), key)
        .await
        .expect("connects")
}

/// A create body of a short reply (two tokens).
fn create(input: &str) -> Value {
    json!({"model": "base", "input": format!("{input} synthetic:reply_tokens=2"),
           "store": false, "max_output_tokens": 16})
}

/// The close frame that ends `ws` (messages before it are returned).
async fn closed(ws: &mut WsClient) -> (Vec<Value>, Option<(CloseCode, String)>) {
    ws.closed().await.expect("a close within the wait")
}

/// A turn sent right after the rights went: refused with `status` and
/// `code` in the error event, then the connection closes with 1008; or,
/// when the push closed it first, only the 1008. Never a response.
async fn refused_then_1008(ws: &mut WsClient, status: u16, code: &str) {
    let mut event = create("hi");
    event["type"] = json!("response.create");
    // The push may already have closed it: a failed send is that case.
    let _ = ws.send_json(&event).await;
    let (before, close) = closed(ws).await;
    for e in &before {
        assert_eq!(e["type"], "error", "no response runs: {before:?}");
        assert_eq!(e["status"], status, "{e}");
        assert_eq!(e["error"]["code"], code, "{e}");
    }
    let (code, _) = close.expect("a close frame");
    assert_eq!(code, CloseCode::Policy, "{before:?}");
}

#[tokio::test]
async fn a_revoked_key_closes_its_connections_on_every_replica_with_1008() {
    bounded(90, async {
        let (stack, b) = two_replicas();
        let key = create_key(&stack, "org-ws-revoke");
        let other = create_key(&stack, "org-ws-revoke");
        let mut on_a = connect(&stack.gateway, &key).await;
        let mut on_b = connect(&b, &key).await;
        let mut unrelated = connect(&b, &other).await;
        for ws in [&mut on_a, &mut on_b] {
            let events = ws.create(&create("hi")).await.unwrap();
            assert_eq!(events.last().unwrap()["type"], "response.completed");
        }
        stack.cli(&["keys", "revoke", &key_id(&key)]);
        // Idle connections are closed by the push, on both replicas.
        for ws in [&mut on_a, &mut on_b] {
            let (before, close) = closed(ws).await;
            assert!(before.is_empty(), "{before:?}");
            let (code, reason) = close.expect("a close frame");
            assert_eq!(code, CloseCode::Policy);
            assert!(reason.contains("key"), "{reason}");
        }
        // Another key of the organisation keeps its connection and works.
        let events = unrelated.create(&create("still here")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        // A new upgrade with the revoked key is a 401.
        match websocket::connect_with(&b.base_url(), Some(&key), &[]).await {
            Err(WsError::Http(r)) => assert_eq!(r.status(), 401),
            other => panic!("upgraded with a revoked key: {:?}", other.is_ok()),
        }
    })
    .await;
}

#[tokio::test]
async fn a_turn_sent_after_the_key_is_revoked_never_runs() {
    bounded(90, async {
        let (stack, b) = two_replicas();
        let key = create_key(&stack, "org-ws-turn");
        let mut ws = connect(&b, &key).await;
        // Revoked while a response runs (about a second): it ends whole,
        // and the create the client sends right after it never runs.
        let mut slow = json!({"model": "base", "store": false, "max_output_tokens": 40,
                              "input": "slow synthetic:reply_tokens=20 synthetic:slow_ms=50"});
        slow["type"] = json!("response.create");
        ws.send_json(&slow).await.unwrap();
        assert_eq!(ws.next_json().await.unwrap()["type"], "response.created");
        stack.cli(&["keys", "revoke", &key_id(&key)]);
        let rest = ws.reply().await.unwrap();
        assert_eq!(rest.last().unwrap()["type"], "response.completed");
        refused_then_1008(&mut ws, 401, "invalid_api_key").await;
    })
    .await;
}

#[tokio::test]
async fn a_blocked_organisation_s_turn_is_a_402_and_a_running_response_ends_before_the_1008() {
    bounded(90, async {
        let (stack, b) = two_replicas();
        let org = "org-ws-block";
        let key = create_key(&stack, org);
        let mut running = connect(&stack.gateway, &key).await;
        let mut idle = connect(&b, &key).await;
        let mut turn = connect(&b, &key).await;
        // A response that runs about a second.
        let mut slow = json!({"model": "base", "store": false, "max_output_tokens": 40,
                              "input": "slow synthetic:reply_tokens=20 synthetic:slow_ms=50"});
        slow["type"] = json!("response.create");
        running.send_json(&slow).await.unwrap();
        assert_eq!(
            running.next_json().await.unwrap()["type"],
            "response.created"
        );
        stack.cli(&["orgs", "block", org, "--reason", "payment_overdue"]);
        // The idle connection on the other replica is closed by the push.
        let (before, close) = closed(&mut idle).await;
        assert!(before.is_empty(), "{before:?}");
        let (code, reason) = close.expect("a close frame");
        assert_eq!(code, CloseCode::Policy);
        assert!(reason.contains("organization"), "{reason}");
        // A turn is the POST route's 402 (or the push closed it first).
        refused_then_1008(&mut turn, 402, "account_blocked").await;
        // The running response ends whole, then the connection closes.
        let (events, close) = closed(&mut running).await;
        assert_eq!(
            events.last().map(|e| e["type"].clone()),
            Some(json!("response.completed")),
            "{events:?}"
        );
        assert_eq!(close.expect("a close frame").0, CloseCode::Policy);
    })
    .await;
}

#[tokio::test]
async fn a_budget_set_to_zero_refuses_the_next_turn_with_the_post_route_s_402() {
    bounded(90, async {
        let (stack, b) = two_replicas();
        let org = "org-ws-budget";
        let key = create_key(&stack, org);
        let mut ws = connect(&b, &key).await;
        let events = ws.create(&create("hi")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        stack.cli(&["orgs", "budget", org, "--usd", "0"]);
        // What POST answers now.
        let post = stack
            .client()
            .with_key(Some(&key))
            .post_json("/responses", &create("hi"))
            .await
            .unwrap();
        assert_eq!(post.status, 402, "{post}");
        let post: Value = post.json();
        // The connection stays open (a budget can be raised); its turns
        // get the same refusal.
        let refused = ws.create(&create("hi")).await.unwrap();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0]["type"], "error");
        assert_eq!(refused[0]["status"], 402);
        assert_eq!(refused[0]["error"]["code"], "account_blocked");
        assert_eq!(refused[0]["error"]["message"], post["message"]);
        stack.cli(&["orgs", "budget", org, "--clear"]);
        let events = ws.create(&create("again")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
    })
    .await;
}

#[tokio::test]
async fn a_spent_budget_refuses_turns_on_the_embedded_store_too() {
    bounded(60, async {
        let key = TestKey::random("org-ws-spent");
        let extra = format!(
            "[orgs.org-ws-spent]\nbudget_usd = 0.000000001\n\n[[keys]]\nsha256 = \"{}\"\norg = \"org-ws-spent\"\nname = \"spent\"\n",
            harness::hash_key(&key.key)
        );
        let stack = Stack::builder()
            .models(&["base"])
            .extra_toml(&extra)
            .start()
            .expect("stack starts");
        let mut ws = connect(&stack.gateway, &key.key).await;
        let events = ws.create(&create("spend it")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        let refused = ws.create(&create("more")).await.unwrap();
        assert_eq!(refused[0]["status"], 402, "{refused:?}");
        assert_eq!(refused[0]["error"]["code"], "account_blocked");
    })
    .await;
}

/// Issue 52, item 5: a key limited to 5 requests a minute gets 5
/// warm-ups; the sixth is the POST route's 429, nothing of it is stored,
/// and the next POST is refused too.
#[tokio::test]
async fn warm_ups_are_admitted_like_any_create() {
    bounded(60, async {
        let key = TestKey::random("org-ws-warm");
        let extra = format!(
            "[plans.rpm5]\nrpm = 5\n\n[[keys]]\nsha256 = \"{}\"\norg = \"org-ws-warm\"\nname = \"warm\"\nplan = \"rpm5\"\n",
            harness::hash_key(&key.key)
        );
        let stack = Stack::builder()
            .models(&["base"])
            .extra_toml(&extra)
            .start()
            .expect("stack starts");
        let client = stack.client().with_key(Some(&key.key));
        let mut ws = connect(&stack.gateway, &key.key).await;
        let warm = json!({"model": "base", "input": "x".repeat(10_000), "store": true, "generate": false});
        let mut ids = Vec::new();
        for i in 0..6 {
            let events = ws.create(&warm).await.unwrap();
            let last = events.last().unwrap();
            if i < 5 {
                assert_eq!(last["type"], "response.completed", "{last}");
                ids.push(last["response"]["id"].as_str().unwrap().to_owned());
            } else {
                assert_eq!(events.len(), 1, "{events:?}");
                assert_eq!(last["type"], "error");
                assert_eq!(last["status"], 429, "{last}");
                assert_eq!(last["error"]["code"], "rate_limit_exceeded", "{last}");
            }
        }
        // The five admitted are stored; the POST after them is refused.
        for id in &ids {
            let r = client.get(&format!("/responses/{id}")).await.unwrap();
            assert_eq!(r.status, 200, "{r}");
        }
        let r = client
            .post_json("/responses", &create("after the warm-ups"))
            .await
            .unwrap();
        harness::assert_error(&r, 429, "rate_limit_exceeded");
    })
    .await;
}

/// Issue 52, item 10: `[websocket] max_connections_per_key`, refused at
/// the upgrade in the API envelope; the open connections and their
/// connection-local conversations on the operator's gauges.
#[tokio::test]
async fn a_key_holds_at_most_its_cap_of_connections_and_the_operator_sees_them() {
    bounded(60, async {
        let stack = Stack::builder()
            .models(&["base"])
            .extra_toml("[websocket]\nmax_connections_per_key = 2\n")
            .start()
            .expect("stack starts");
        let gw = &stack.gateway;
        let key = gw.api_key().to_owned();
        let org = gw.keys()[0].org.clone();
        let mut first = connect(gw, &key).await;
        let second = connect(gw, &key).await;
        match websocket::connect_with(&gw.base_url(), Some(&key), &[]).await {
            Err(WsError::Http(r)) => {
                assert_eq!(r.status(), 429);
                assert!(r.headers().get("retry-after").is_some());
                let body: Value =
                    serde_json::from_slice(r.body().as_deref().unwrap_or_default()).unwrap();
                assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
                assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
                assert!(
                    body["error"]["message"].as_str().unwrap().contains('2'),
                    "{body}"
                );
            }
            other => panic!("a third connection: {:?}", other.is_ok()),
        }
        // A conversation kept on the connection (store: false).
        let events = first.create(&create("hello there")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        let org_label = format!("org=\"{org}\"");
        let gauges = |page: &str| {
            [
                "gateway_websocket_org_connections",
                "gateway_websocket_conversations",
                "gateway_websocket_conversation_items",
            ]
            .map(|name| sample(page, name, &[&org_label]))
        };
        // The gauges move just after the terminal event went out.
        let settled = |want: [f64; 3]| async move {
            let mut page = String::new();
            for _ in 0..100 {
                page = gw.admin_get("/metrics").await.unwrap().1;
                if gauges(&page) == want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            page
        };
        // Its input and its output: two items.
        let page = settled([2.0, 1.0, 2.0]).await;
        assert_eq!(gauges(&page), [2.0, 1.0, 2.0], "{page}");
        // Closing one frees its place and its conversation.
        first.ws.close(None).await.unwrap();
        drop(first);
        let page = settled([1.0, 0.0, 0.0]).await;
        assert_eq!(gauges(&page), [1.0, 0.0, 0.0], "{page}");
        let mut third = connect(gw, &key).await;
        let events = third.create(&create("hi")).await.unwrap();
        assert_eq!(events.last().unwrap()["type"], "response.completed");
        drop(second);
    })
    .await;
}
