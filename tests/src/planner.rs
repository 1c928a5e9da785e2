//! Planner mode as a client uses it: a request in a session (`x-session-id`),
//! and what a reply says of each agent in `tool_thought` and of its plan in
//! `thought`. Plans are scripted per suite (`synthetic:json_replies=`).

use crate::{json, Client, Reply, Stack, Value};

/// `[planner]` deadlines short enough for tests on loopback agents, after
/// `lines` (the suite's own settings of that table). More settings of the
/// table can be appended to the result.
pub fn config(lines: &str) -> String {
    format!(
        "\n[planner]\n{lines}connect_timeout_ms = 500\nfirst_byte_timeout_ms = 1500\n\
         idle_timeout_ms = 1500\nstep_timeout_ms = 4000\nrun_timeout_ms = 6000\n\
         synthesis_timeout_ms = 10000\nkeepalive_ms = 150\n"
    )
}

/// A fresh session id.
pub fn session() -> String {
    format!("sess-{}", crate::random_hex(12))
}

/// A planner-mode chat body for `model`: one user message, and the agents
/// the request names (no `agents` field when there are none).
pub fn body(model: &str, text: &str, agents: &[String]) -> Value {
    let mut b = json!({
        "model": model,
        "planner_mode": true,
        "messages": [{"role": "user", "content": text}],
    });
    if !agents.is_empty() {
        b["agents"] = json!(agents);
    }
    b
}

/// Posts a chat completion in `session`.
pub async fn post(client: &Client, session: &str, body: &Value) -> Reply {
    client
        .send(
            client
                .request(reqwest::Method::POST, "/chat/completions")
                .header("x-session-id", session)
                .json(body),
        )
        .await
        .expect("request")
}

/// Posts `body` in a fresh session; panics unless it is a 200 (with every
/// log of the stack).
pub async fn ask(stack: &Stack, body: &Value) -> Reply {
    let reply = post(&stack.client(), &session(), body).await;
    assert_eq!(reply.status, 200, "{}\n{}", reply.text(), stack.logs());
    reply
}

/// Every `tool_thought` entry as (target, outcome).
#[track_caller]
pub fn outcomes(reply: &Value) -> Vec<(String, String)> {
    reply["tool_thought"]
        .as_array()
        .expect("tool_thought is an array")
        .iter()
        .map(|t| {
            (
                t["target"].as_str().unwrap_or("").to_owned(),
                t["outcome"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The `tool_thought` entry of `target`, if any.
pub fn tool_thought(reply: &Value, target: &str) -> Option<Value> {
    reply["tool_thought"]
        .as_array()?
        .iter()
        .find(|t| t["target"] == target)
        .cloned()
}

/// The outcome of `target`'s `tool_thought` entry; panics when it has none.
#[track_caller]
pub fn outcome_of(reply: &Value, target: &str) -> String {
    tool_thought(reply, target)
        .and_then(|t| t["outcome"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no tool_thought for {target}: {}", reply["tool_thought"]))
}

/// The reply's `thought`: what the planner says of its plan, line by line.
#[track_caller]
pub fn thoughts(reply: &Value) -> Vec<String> {
    serde_json::from_value(reply["thought"].clone()).expect("thought is an array of strings")
}
