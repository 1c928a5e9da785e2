//! Worker events as Anthropic's stream: `message_start`, then per content
//! block `content_block_start`, its deltas (`thinking_delta` then a
//! `signature_delta`, `text_delta`, `input_json_delta`) and
//! `content_block_stop`, then `message_delta` (stop reason, usage) and
//! `message_stop`. `ping` follows `message_start` and fills silences (the
//! relay's keep-alive, `routes/sinks.rs`); a failure after the start is an
//! in-band `error` event.

use super::{signature, stop_of, tool_use_id, usage};
use crate::api::messages::{Message, Usage};
use crate::error::ApiError;
use crate::sse;
use crate::validate::messages::ValidMessagesRequest;
use bytes::BytesMut;
use inference_proto::v1 as pb;
use serde_json::json;
use sha2::{Digest, Sha256};

/// The block open in the stream.
enum Open {
    None,
    Thinking(Box<Sha256>),
    Text,
    /// A tool call, by the worker's index.
    Tool(u32),
}

pub struct MessagesStreamEncoder {
    id: String,
    model: String,
    omit_thinking: bool,
    /// The request's `stop_sequences`: the one that ended the reply is
    /// named in `message_delta`.
    stops: Vec<String>,
    open: Open,
    /// The index of the next block.
    next: u32,
    /// Whether the last event (`message_stop`) was encoded.
    done: bool,
}

impl MessagesStreamEncoder {
    pub fn new(id: String, model: &str, omit_thinking: bool) -> Self {
        Self {
            id,
            model: model.to_owned(),
            omit_thinking,
            stops: Vec::new(),
            open: Open::None,
            next: 0,
            done: false,
        }
    }

    /// The encoder of `valid`'s reply.
    pub fn of(id: String, valid: &ValidMessagesRequest) -> Self {
        Self {
            stops: valid.stop.clone(),
            ..Self::new(id, valid.model.id, valid.omit_thinking)
        }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// `message_start` (the message with no content yet; its usage comes
    /// with `message_delta`, when the worker has counted it), then a ping.
    pub fn start(&self, out: &mut BytesMut) {
        let message = Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage::default(),
        };
        let data = json!({"type": "message_start", "message": message});
        sse::event(out, "message_start", &data.to_string());
        ping(out);
    }

    pub fn event(&mut self, event: &pb::GenerateEvent, out: &mut BytesMut) {
        use pb::generate_event::Event;
        match &event.event {
            Some(Event::Reasoning(r)) if !r.text.is_empty() => {
                if !matches!(self.open, Open::Thinking(_)) {
                    self.open_block(
                        out,
                        Open::Thinking(Box::default()),
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                    );
                }
                if let Open::Thinking(hash) = &mut self.open {
                    hash.update(r.text.as_bytes());
                }
                if !self.omit_thinking {
                    self.delta(out, json!({"type": "thinking_delta", "thinking": r.text}));
                }
            }
            Some(Event::Text(t)) if !t.text.is_empty() => {
                if !matches!(self.open, Open::Text) {
                    self.open_block(out, Open::Text, json!({"type": "text", "text": ""}));
                }
                self.delta(out, json!({"type": "text_delta", "text": t.text}));
            }
            Some(Event::ToolCall(d)) => {
                if !matches!(self.open, Open::Tool(i) if i == d.index) {
                    let block = json!({
                        "type": "tool_use",
                        "id": tool_use_id(&d.id),
                        "name": d.name,
                        "input": {},
                    });
                    self.open_block(out, Open::Tool(d.index), block);
                }
                if !d.arguments_fragment.is_empty() {
                    self.delta(
                        out,
                        json!({"type": "input_json_delta", "partial_json": d.arguments_fragment}),
                    );
                }
            }
            Some(Event::Finished(f)) => self.finish(f, out),
            _ => {}
        }
    }

    /// Closes the open block and opens `block` as the next index.
    fn open_block(&mut self, out: &mut BytesMut, open: Open, block: serde_json::Value) {
        self.close(out);
        let data =
            json!({"type": "content_block_start", "index": self.next, "content_block": block});
        sse::event(out, "content_block_start", &data.to_string());
        self.open = open;
    }

    fn delta(&self, out: &mut BytesMut, delta: serde_json::Value) {
        let data = json!({"type": "content_block_delta", "index": self.next, "delta": delta});
        sse::event(out, "content_block_delta", &data.to_string());
    }

    /// Ends the open block: a thinking block's signature goes first.
    fn close(&mut self, out: &mut BytesMut) {
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Thinking(hash) => {
                self.delta(
                    out,
                    json!({"type": "signature_delta", "signature": signature(*hash)}),
                );
            }
            Open::Text | Open::Tool(_) => {}
        }
        let data = json!({"type": "content_block_stop", "index": self.next});
        sse::event(out, "content_block_stop", &data.to_string());
        self.next += 1;
    }

    fn finish(&mut self, f: &pb::Finished, out: &mut BytesMut) {
        self.close(out);
        let (stop_reason, stop_sequence) = stop_of(f, &self.stops);
        let data = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage(&f.usage.unwrap_or_default()),
        });
        sse::event(out, "message_delta", &data.to_string());
        sse::event(out, "message_stop", r#"{"type":"message_stop"}"#);
        self.done = true;
    }
}

/// A `ping` event: keeps idle proxies (and clients' read timeouts) from
/// closing a quiet stream.
pub fn ping(out: &mut BytesMut) {
    sse::event(out, "ping", r#"{"type":"ping"}"#);
}

/// The in-band failure of a stream that already started.
pub fn error(out: &mut BytesMut, e: &ApiError) {
    sse::event(out, "error", &e.anthropic_event());
}

/// A whole stream from its folded events: what a retry with the same
/// `Idempotency-Key` is sent.
pub fn replay(id: String, valid: &ValidMessagesRequest, events: &[pb::GenerateEvent]) -> BytesMut {
    let mut out = BytesMut::new();
    let mut enc = MessagesStreamEncoder::of(id, valid);
    enc.start(&mut out);
    for e in events {
        enc.event(e, &mut out);
    }
    out
}
