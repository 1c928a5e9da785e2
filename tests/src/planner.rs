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
    try_post(client, session, body).await.expect("request")
}

/// [`post`], with a transport error returned rather than a panic.
pub async fn try_post(client: &Client, session: &str, body: &Value) -> anyhow::Result<Reply> {
    client
        .send(
            client
                .request(reqwest::Method::POST, "/chat/completions")
                .header("x-session-id", session)
                .json(body),
        )
        .await
}

/// A user message whose plan calls get `plans` in turn (scripted through
/// the simulator) and whose answer echoes the synthesis prompt.
pub fn scripted(ask: &str, plans: &[Value]) -> String {
    let values: Vec<String> = plans.iter().map(Value::to_string).collect();
    format!(
        "{ask} synthetic:echo synthetic:json_replies={}",
        values.join(" ")
    )
}

/// The caller's `get_time` function tool.
pub fn time_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": false}}}])
}

/// A plan that asks `agent`, then pauses on the caller's `get_time`
/// ([`time_tool`]), then summarises.
pub fn tool_pause_plan(agent: &str) -> Value {
    json!({"thought": "a scripted plan", "steps": [
        {"id": 1, "kind": "agent", "target": agent, "instruction": "Do part s1.", "depends_on": [], "alternates": []},
        {"id": 2, "kind": "function", "target": "get_time", "instruction": "Get the time.",
         "arguments": {"tz": "UTC"}, "depends_on": [1]},
        {"id": 3, "kind": "llm", "target": "model", "instruction": "Summarise.", "depends_on": [2]}
    ]})
}

/// The messages that answer a paused reply's tool call `call_id` with
/// `result`, after the user's `text`.
pub fn resume_messages(text: &str, paused: &Value, call_id: &str, result: &str) -> Value {
    let mut calls = paused["choices"][0]["message"]["tool_calls"].clone();
    calls[0]["id"] = json!(call_id);
    json!([
        {"role": "user", "content": text},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": call_id, "content": result}
    ])
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
