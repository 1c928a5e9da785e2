//! Chat Completions as a client sees them: a greedy request body, a reply
//! that must be a 200, and a stream's chunks with its framing checked.

use crate::{json, Client, SseFrame, Stack, Value};

/// A greedy chat completion body for `base`: one user message.
pub fn greedy(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    })
}

/// A streamed request for a story longer than any test waits for: up to
/// 800 tokens, sampled at temperature 0.9 with `seed`.
pub fn long_story(prompt: &str, seed: u32) -> Value {
    let mut body = greedy(prompt, 800);
    body["stream"] = json!(true);
    body["temperature"] = json!(0.9);
    body["seed"] = json!(seed);
    body
}

/// Posts a chat completion and returns its object; panics unless it is a
/// 200 (with every log of the stack).
pub async fn create(stack: &Stack, body: &Value) -> Value {
    let reply = stack
        .client()
        .post_json("/chat/completions", body)
        .await
        .expect("reply");
    assert_eq!(reply.status, 200, "{reply}\n{}", stack.logs());
    reply.json()
}

/// Posts `body` with `stream: true` and reads the stream to its end.
pub async fn stream(client: &Client, body: &Value) -> Vec<SseFrame> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    client
        .stream("/chat/completions", &body)
        .await
        .expect("stream")
        .collect()
        .await
        .expect("frames")
}

/// The chunks of a chat stream (every frame but `[DONE]`), asserting the
/// stream ends with exactly one `data: [DONE]` and nothing after it, and
/// that every frame is a bare `data:` line.
#[track_caller]
pub fn chunks(frames: &[SseFrame]) -> Vec<Value> {
    let last = frames.last().expect("at least one frame");
    assert!(last.is_done(), "stream must end with [DONE], got {last:?}");
    assert_eq!(last.raw, "data: [DONE]\n\n");
    assert_eq!(
        frames.iter().filter(|f| f.is_done()).count(),
        1,
        "one [DONE]"
    );
    for f in frames {
        assert!(f.event.is_none(), "chat frames carry no event: line: {f:?}");
        assert!(f.raw.starts_with("data: "), "frame is a data line: {f:?}");
    }
    frames[..frames.len() - 1]
        .iter()
        .map(|f| f.json())
        .collect()
}

/// The content deltas of a stream's chunks, joined.
pub fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect()
}

/// The first choice's message content ("" when none).
pub fn content(reply: &Value) -> String {
    reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Posts a chat completion and returns the reply, whatever its status.
pub async fn post(client: &Client, body: &Value) -> crate::Reply {
    client
        .post_json("/chat/completions", body)
        .await
        .expect("HTTP exchange")
}
