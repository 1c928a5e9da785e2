//! The planner's replies in the chat wire format: one `chat.completion`
//! with `conversation_id`, `thought`, `tool_thought` and
//! `executable_data`, or a stream of `chat.completion.chunk` frames whose
//! extra fields carry those entries as they happen.
//!
//! Stream order: the role chunk; `thought`/`tool_thought`/
//! `executable_data` chunks (empty delta) and `: keep-alive` comments
//! (written by the route's `SseReply`) while the plan runs; the answer as `delta.content`, or a pause as
//! `delta.tool_calls` (id, type and name once per index, then the
//! arguments); the finish chunk (`stop` or `tool_calls`); the usage chunk
//! when asked; `[DONE]`.

use crate::api::chat::{
    AssistantMessage, ChatCompletion, ChatUsage, Delta, FunctionCall, PlannerChunk, ToolCall,
    ToolThought,
};
use crate::sse;
use crate::translate::chat::{
    call_arguments, call_header, completion as chat_completion, ChunkHead,
};
use crate::translate::now_unix;
use bytes::BytesMut;
use planner::{Ending, PendingCall};
use serde_json::Value;

/// A `tool_thought` entry on the wire.
pub fn tool_thought(t: planner::ToolThought) -> ToolThought {
    ToolThought {
        step: t.step,
        kind: t.kind,
        target: t.target,
        outcome: t.outcome,
        latency_ms: t.latency_ms,
        detail: t.detail,
    }
}

/// The non-streaming reply.
#[allow(clippy::too_many_arguments)]
pub fn completion(
    id: String,
    model: &str,
    session: &str,
    ending: Ending,
    usage: ChatUsage,
    thought: Vec<String>,
    tool_thought: Vec<ToolThought>,
    executable_data: Vec<Value>,
) -> ChatCompletion {
    let (content, tool_calls, finish) = match ending {
        Ending::Answer(answer) => {
            let finish = answer.finish_reason();
            (Some(answer.text), Vec::new(), finish)
        }
        Ending::Pause(calls) => (None, tool_calls(&calls), "tool_calls"),
    };
    let message = AssistantMessage {
        role: "assistant",
        content,
        refusal: None,
        tool_calls,
        reasoning_content: None,
        annotations: Vec::new(),
    };
    ChatCompletion {
        conversation_id: Some(session.to_owned()),
        thought,
        tool_thought,
        executable_data,
        ..chat_completion(id, model, message, finish, usage)
    }
}

fn tool_calls(calls: &[PendingCall]) -> Vec<ToolCall> {
    calls
        .iter()
        .map(|c| ToolCall {
            id: c.call_id.clone(),
            kind: "function".into(),
            function: FunctionCall {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            },
        })
        .collect()
}

/// Writes a planner stream's frames.
pub struct StreamFrames {
    id: String,
    model: String,
    session: String,
    created: u64,
    service_tier: &'static str,
    include_usage: bool,
}

impl StreamFrames {
    pub fn new(id: String, model: &str, session: &str, include_usage: bool) -> Self {
        Self {
            id,
            model: model.to_owned(),
            session: session.to_owned(),
            created: now_unix(),
            service_tier: "default",
            include_usage,
        }
    }

    /// The tier the stream's chunks report (`default` unless set).
    pub fn served_at(mut self, tier: &'static str) -> Self {
        self.service_tier = tier;
        self
    }

    fn head(&self) -> ChunkHead<'_> {
        ChunkHead {
            id: &self.id,
            created: self.created,
            model: &self.model,
            service_tier: self.service_tier,
            include_usage: self.include_usage,
        }
    }

    fn chunk(
        &self,
        out: &mut BytesMut,
        delta: Delta<'_>,
        finish: Option<&'static str>,
        extras: (&[String], &[ToolThought], &[Value]),
    ) {
        let head = self.head();
        let chunk = PlannerChunk {
            chunk: head.choice_chunk(delta, finish),
            conversation_id: &self.session,
            thought: extras.0,
            tool_thought: extras.1,
            executable_data: extras.2,
        };
        sse::data(out, &chunk);
    }

    /// The first frame: `delta:{role:"assistant", content:""}`.
    pub fn role(&self, out: &mut BytesMut) {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Default::default()
        };
        self.chunk(out, delta, None, (&[], &[], &[]));
    }

    /// A frame carrying planner entries (an empty delta).
    pub fn entries(
        &self,
        out: &mut BytesMut,
        thought: &[String],
        tool_thought: &[ToolThought],
        data: &[Value],
    ) {
        self.chunk(out, Delta::default(), None, (thought, tool_thought, data));
    }

    pub fn content(&self, out: &mut BytesMut, text: &str) {
        let delta = Delta {
            content: Some(text),
            ..Default::default()
        };
        self.chunk(out, delta, None, (&[], &[], &[]));
    }

    /// A pause: each call's header, then its arguments, then the finish.
    pub fn pause(&self, out: &mut BytesMut, calls: &[PendingCall]) {
        for (i, c) in calls.iter().enumerate() {
            let index = i as u32;
            self.chunk(
                out,
                call_header(index, &c.call_id, &c.name),
                None,
                (&[], &[], &[]),
            );
            self.chunk(
                out,
                call_arguments(index, &c.arguments),
                None,
                (&[], &[], &[]),
            );
        }
    }

    /// The finish chunk, the usage chunk when asked, `[DONE]`.
    pub fn finish(&self, out: &mut BytesMut, reason: &'static str, usage: &ChatUsage) {
        self.chunk(out, Delta::default(), Some(reason), (&[], &[], &[]));
        if self.include_usage {
            let head = self.head();
            let chunk = PlannerChunk {
                chunk: head.usage_chunk(usage),
                conversation_id: &self.session,
                thought: &[],
                tool_thought: &[],
                executable_data: &[],
            };
            sse::data(out, &chunk);
        }
        sse::done(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(out: &BytesMut) -> Vec<String> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_paused_stream_announces_each_call_once_and_ends_with_tool_calls() {
        let w = StreamFrames::new("chatcmpl-1".into(), "base", "sess", true);
        let mut out = BytesMut::new();
        w.role(&mut out);
        w.entries(&mut out, &["Plan: x".into()], &[], &[]);
        sse::keepalive(&mut out);
        let calls = vec![PendingCall {
            call_id: "call_1".into(),
            step_id: "s1".into(),
            name: "get_time".into(),
            arguments: "{\"tz\":\"UTC\"}".into(),
        }];
        w.pause(&mut out, &calls);
        w.finish(&mut out, "tool_calls", &ChatUsage::default());
        let f = frames(&out);
        assert_eq!(f.len(), 8, "{f:?}");
        let json = |i: usize| -> Value {
            serde_json::from_str(f[i].strip_prefix("data: ").unwrap()).unwrap()
        };
        assert_eq!(json(0)["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(json(0)["conversation_id"], "sess");
        assert!(json(0).get("thought").is_none());
        assert_eq!(json(1)["thought"][0], "Plan: x");
        assert_eq!(f[2], ": keep-alive");
        assert_eq!(
            json(3)["choices"][0]["delta"]["tool_calls"][0]["id"],
            "call_1"
        );
        assert!(json(4)["choices"][0]["delta"]["tool_calls"][0]
            .get("id")
            .is_none());
        assert_eq!(json(5)["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(json(6)["choices"], serde_json::json!([]));
        assert_eq!(f[7], "data: [DONE]");
    }

    /// The wire entry's bytes, field order included, as clients parse them.
    #[test]
    fn tool_thought_entries_keep_their_wire_bytes() {
        let cases = [
            (
                planner::ToolThought {
                    step: None,
                    kind: "agent",
                    target: "http://a:1".into(),
                    outcome: "no_card",
                    latency_ms: 0,
                    detail: "agent unreachable".into(),
                },
                serde_json::json!({
                    "step": null, "kind": "agent", "target": "http://a:1",
                    "outcome": "no_card", "latency_ms": 0, "detail": "agent unreachable",
                }),
            ),
            (
                planner::ToolThought {
                    step: Some("2".into()),
                    kind: "llm",
                    target: "model".into(),
                    outcome: "timeout",
                    latency_ms: 300_000,
                    detail: "abandoned at the run's deadline".into(),
                },
                serde_json::json!({
                    "step": "2", "kind": "llm", "target": "model",
                    "outcome": "timeout", "latency_ms": 300_000_u64,
                    "detail": "abandoned at the run's deadline",
                }),
            ),
        ];
        for (entry, wire) in cases {
            let bytes = serde_json::to_string(&tool_thought(entry)).unwrap();
            assert_eq!(bytes, wire.to_string());
        }
    }

    #[test]
    fn the_body_carries_the_planner_fields() {
        let c = completion(
            "chatcmpl-2".into(),
            "base",
            "sess",
            Ending::Answer(planner::Answer {
                text: "hi".into(),
                at_length: false,
            }),
            ChatUsage::default(),
            vec!["Plan: x".into()],
            vec![ToolThought {
                step: Some("s1".into()),
                kind: "llm",
                target: "model".into(),
                outcome: "ok",
                latency_ms: 3,
                detail: String::new(),
            }],
            Vec::new(),
        );
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["conversation_id"], "sess");
        assert_eq!(v["tool_thought"][0]["step"], "s1");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["thought"][0], "Plan: x");
        assert_eq!(v["executable_data"], serde_json::json!([]));
    }
}
