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

use super::{Ending, PendingCall};
use crate::api::chat::{
    AssistantMessage, ChatCompletion, ChatUsage, Choice, ChunkChoice, Delta, FunctionCall,
    FunctionChunk, PlannerChunk, ToolCall, ToolCallChunk, ToolThought, UsageField,
};
use crate::sse;
use crate::translate::now_unix;
use bytes::BytesMut;
use serde_json::Value;

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
    ChatCompletion {
        id,
        object: "chat.completion",
        created: now_unix(),
        model: model.to_owned(),
        choices: vec![Choice {
            index: 0,
            message: AssistantMessage {
                role: "assistant",
                content,
                refusal: None,
                tool_calls,
                reasoning_content: None,
                annotations: Vec::new(),
            },
            logprobs: None,
            finish_reason: finish,
        }],
        usage,
        system_fingerprint: None,
        service_tier: "default",
        conversation_id: Some(session.to_owned()),
        thought,
        tool_thought,
        executable_data,
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
    include_usage: bool,
}

impl StreamFrames {
    pub fn new(id: String, model: &str, session: &str, include_usage: bool) -> Self {
        Self {
            id,
            model: model.to_owned(),
            session: session.to_owned(),
            created: now_unix(),
            include_usage,
        }
    }

    fn chunk(
        &self,
        out: &mut BytesMut,
        delta: Option<Delta<'_>>,
        finish: Option<&'static str>,
        extras: (&[String], &[ToolThought], &[Value]),
        usage: Option<&ChatUsage>,
    ) {
        let choices = match delta {
            Some(delta) => vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
            }],
            None => Vec::new(),
        };
        let chunk = PlannerChunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices,
            usage: match (usage, self.include_usage) {
                (Some(u), _) => UsageField::Totals(u),
                (None, true) => UsageField::Null,
                (None, false) => UsageField::Absent,
            },
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
        self.chunk(out, Some(delta), None, (&[], &[], &[]), None);
    }

    /// A frame carrying planner entries (an empty delta).
    pub fn entries(
        &self,
        out: &mut BytesMut,
        thought: &[String],
        tool_thought: &[ToolThought],
        data: &[Value],
    ) {
        self.chunk(
            out,
            Some(Delta::default()),
            None,
            (thought, tool_thought, data),
            None,
        );
    }

    pub fn content(&self, out: &mut BytesMut, text: &str) {
        let delta = Delta {
            content: Some(text),
            ..Default::default()
        };
        self.chunk(out, Some(delta), None, (&[], &[], &[]), None);
    }

    /// A pause: each call's header, then its arguments, then the finish.
    pub fn pause(&self, out: &mut BytesMut, calls: &[PendingCall]) {
        for (i, c) in calls.iter().enumerate() {
            let header = Delta {
                tool_calls: vec![ToolCallChunk {
                    index: i as u32,
                    id: Some(&c.call_id),
                    kind: Some("function"),
                    function: FunctionChunk {
                        name: Some(&c.name),
                        arguments: "",
                    },
                }],
                ..Default::default()
            };
            self.chunk(out, Some(header), None, (&[], &[], &[]), None);
            let args = Delta {
                tool_calls: vec![ToolCallChunk {
                    index: i as u32,
                    id: None,
                    kind: None,
                    function: FunctionChunk {
                        name: None,
                        arguments: &c.arguments,
                    },
                }],
                ..Default::default()
            };
            self.chunk(out, Some(args), None, (&[], &[], &[]), None);
        }
    }

    /// The finish chunk, the usage chunk when asked, `[DONE]`.
    pub fn finish(&self, out: &mut BytesMut, reason: &'static str, usage: &ChatUsage) {
        self.chunk(
            out,
            Some(Delta::default()),
            Some(reason),
            (&[], &[], &[]),
            None,
        );
        if self.include_usage {
            self.chunk(out, None, None, (&[], &[], &[]), Some(usage));
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

    #[test]
    fn the_body_carries_the_planner_fields() {
        let c = completion(
            "chatcmpl-2".into(),
            "base",
            "sess",
            Ending::Answer(crate::planner::Answer {
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
