//! Small helpers of the real-model suites (`llama_e2e`, `upstream_e2e`):
//! greedy chat bodies for `base`, and the text out of replies.

use crate::{json, Stack, Value};

/// A greedy chat completion body for `base`.
pub fn chat(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// Posts a chat completion; panics unless it is a 200 (with every log).
pub async fn post_chat(stack: &Stack, body: &Value) -> Value {
    let reply = stack
        .client()
        .post_json("/chat/completions", body)
        .await
        .expect("reply");
    assert_eq!(reply.status, 200, "{reply}\n{}", stack.logs());
    reply.json()
}

/// The first choice's message content ("" when none).
pub fn content(reply: &Value) -> String {
    reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The text of a Responses object's message items.
pub fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect()
}
