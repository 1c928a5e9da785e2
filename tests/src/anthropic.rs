//! The Anthropic Messages API as its clients use it: a request with
//! Anthropic's headers, and a stream's events folded back into the
//! message, as the SDKs accumulate it.

use crate::client::{Client, SseFrame};
use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

/// A `POST` as an Anthropic SDK sends it: `x-api-key` (no bearer) and
/// `anthropic-version`.
pub fn request(client: &Client, key: &str, path: &str) -> reqwest::RequestBuilder {
    client
        .with_key(None)
        .request(Method::POST, path)
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
}

/// The streamed message rebuilt from its events: `message_start`'s message,
/// each block from its start and deltas (a `tool_use` block's `input` parsed
/// from its `input_json_delta`s), `message_delta`'s `stop_reason`,
/// `stop_sequence` and usage. An event it does not know is an error.
pub fn accumulate(frames: &[SseFrame]) -> Result<Value> {
    let mut message = Value::Null;
    for f in frames {
        let d: Value = serde_json::from_str(&f.data)
            .with_context(|| format!("SSE data is not JSON: {:?}", f.raw))?;
        match d["type"].as_str().unwrap_or_default() {
            "message_start" => message = d["message"].clone(),
            "content_block_start" => message["content"]
                .as_array_mut()
                .context("content_block_start before message_start")?
                .push(d["content_block"].clone()),
            "content_block_delta" => {
                let block = block_of(&mut message, &d)?;
                let delta = &d["delta"];
                let (field, add) = match delta["type"].as_str().unwrap_or_default() {
                    "text_delta" => ("text", &delta["text"]),
                    "thinking_delta" => ("thinking", &delta["thinking"]),
                    "input_json_delta" => ("partial", &delta["partial_json"]),
                    "signature_delta" => {
                        block["signature"] = delta["signature"].clone();
                        continue;
                    }
                    other => bail!("unknown delta {other}: {d}"),
                };
                let text = block[field].as_str().unwrap_or_default().to_owned()
                    + add.as_str().unwrap_or_default();
                block[field] = json!(text);
            }
            "content_block_stop" => {
                let block = block_of(&mut message, &d)?;
                if let Some(partial) = block.get("partial").and_then(Value::as_str) {
                    block["input"] = serde_json::from_str(partial)
                        .with_context(|| format!("a tool_use input that is not JSON: {partial}"))?;
                    if let Some(b) = block.as_object_mut() {
                        b.remove("partial");
                    }
                }
            }
            "message_delta" => {
                message["stop_reason"] = d["delta"]["stop_reason"].clone();
                message["stop_sequence"] = d["delta"]["stop_sequence"].clone();
                message["usage"] = d["usage"].clone();
            }
            "message_stop" | "ping" => {}
            other => bail!("unexpected event {other}: {d}"),
        }
    }
    Ok(message)
}

/// The block an event's `index` names.
fn block_of<'m>(message: &'m mut Value, event: &Value) -> Result<&'m mut Value> {
    let i = event["index"].as_u64().context("an event without index")? as usize;
    message["content"]
        .get_mut(i)
        .with_context(|| format!("no block {i} for {event}"))
}
