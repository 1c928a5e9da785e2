//! A finished reply told again as a stream, folded: what a retry with the
//! same `Idempotency-Key` gets when the first request streamed. The first
//! stream's token-by-token deltas are not kept (that would cost about 150
//! bytes of framing per token); the same reply arrives in a few frames
//! that every client accumulates into the same message.

use super::chat::ChunkHead;
use crate::api::chat::{ChatCompletion, Delta, FunctionChunk, ToolCallChunk};
use crate::api::responses::{
    EncodedEvent, OutputItem, OutputText, ResponseObject, ResponseStatus, StreamEvent, SummaryPart,
};
use crate::sse;
use bytes::BytesMut;

/// A chat completion as `chat.completion.chunk` frames: the role (with
/// `content: ""`, as a stream opens), the reasoning, the content, each
/// tool call whole, the finish chunk, the usage chunk when asked, and
/// `[DONE]`.
pub fn chat_stream(c: &ChatCompletion, include_usage: bool, out: &mut BytesMut) {
    let head = ChunkHead {
        id: &c.id,
        created: c.created,
        model: &c.model,
        service_tier: c.service_tier,
        include_usage,
    };
    if let Some(choice) = c.choices.first() {
        let m = &choice.message;
        let opening = Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Default::default()
        };
        head.chunk(out, opening, None);
        if let Some(reasoning) = m.reasoning_content.as_deref().filter(|r| !r.is_empty()) {
            let delta = Delta {
                reasoning_content: Some(reasoning),
                ..Default::default()
            };
            head.chunk(out, delta, None);
        }
        if let Some(content) = m.content.as_deref().filter(|t| !t.is_empty()) {
            let delta = Delta {
                content: Some(content),
                ..Default::default()
            };
            head.chunk(out, delta, None);
        }
        for (index, call) in m.tool_calls.iter().enumerate() {
            let delta = Delta {
                tool_calls: vec![ToolCallChunk {
                    index: index as u32,
                    id: Some(&call.id),
                    kind: Some("function"),
                    function: FunctionChunk {
                        name: Some(&call.function.name),
                        arguments: &call.function.arguments,
                    },
                }],
                ..Default::default()
            };
            head.chunk(out, delta, None);
        }
        head.chunk(out, Delta::default(), Some(choice.finish_reason));
    }
    if include_usage {
        head.usage(out, &c.usage);
    }
    sse::done(out);
}

/// A finished response as its stream events: `response.created` and
/// `response.in_progress` (the object as it started: in progress, no
/// output, no usage), each output item opened, its text (summary,
/// arguments) in one delta, closed, then the terminal event carrying the
/// whole object. Sequence numbers from 0, as on the first stream.
pub fn response_events(done: &ResponseObject) -> Vec<EncodedEvent> {
    let mut events = Events::default();
    let mut start = done.clone();
    start.status = ResponseStatus::InProgress;
    start.output.clear();
    start.usage = None;
    start.error = None;
    start.incomplete_details = None;
    start.completed_at = None;
    events.emit(StreamEvent::Created { response: &start });
    events.emit(StreamEvent::InProgress { response: &start });
    for (index, item) in done.output.iter().enumerate() {
        events.item(index, item);
    }
    events.emit(match done.status {
        ResponseStatus::Completed => StreamEvent::Completed { response: done },
        ResponseStatus::Incomplete => StreamEvent::Incomplete { response: done },
        _ => StreamEvent::Failed { response: done },
    });
    events.out
}

#[derive(Default)]
struct Events {
    out: Vec<EncodedEvent>,
}

impl Events {
    fn emit(&mut self, event: StreamEvent<'_>) {
        let seq = self.out.len() as u64;
        self.out.push(EncodedEvent::new(event, seq));
    }

    /// One output item: opened (empty, as the first stream announced it),
    /// its parts each in one delta, closed with its final form.
    fn item(&mut self, index: usize, item: &OutputItem) {
        let output_index = index;
        match item {
            OutputItem::Message {
                id, role, content, ..
            } => {
                let opened = OutputItem::Message {
                    id: id.clone(),
                    status: "in_progress".into(),
                    role: role.clone(),
                    content: Vec::new(),
                };
                self.emit(StreamEvent::OutputItemAdded {
                    output_index,
                    item: &opened,
                });
                let empty = OutputText::new(String::new());
                for (content_index, part) in content.iter().enumerate() {
                    self.emit(StreamEvent::ContentPartAdded {
                        item_id: id,
                        output_index,
                        content_index,
                        part: &empty,
                    });
                    self.emit(StreamEvent::OutputTextDelta {
                        item_id: id,
                        output_index,
                        content_index,
                        delta: &part.text,
                        logprobs: [],
                    });
                    self.emit(StreamEvent::OutputTextDone {
                        item_id: id,
                        output_index,
                        content_index,
                        text: &part.text,
                        logprobs: [],
                    });
                    self.emit(StreamEvent::ContentPartDone {
                        item_id: id,
                        output_index,
                        content_index,
                        part,
                    });
                }
            }
            OutputItem::Reasoning { id, summary, .. } => {
                let opened = OutputItem::Reasoning {
                    id: id.clone(),
                    summary: Vec::new(),
                    status: None,
                    encrypted_content: None,
                };
                self.emit(StreamEvent::OutputItemAdded {
                    output_index,
                    item: &opened,
                });
                let empty = SummaryPart::new(String::new());
                for (summary_index, part) in summary.iter().enumerate() {
                    self.emit(StreamEvent::ReasoningSummaryPartAdded {
                        item_id: id,
                        output_index,
                        summary_index,
                        part: &empty,
                    });
                    self.emit(StreamEvent::ReasoningSummaryTextDelta {
                        item_id: id,
                        output_index,
                        summary_index,
                        delta: &part.text,
                    });
                    self.emit(StreamEvent::ReasoningSummaryTextDone {
                        item_id: id,
                        output_index,
                        summary_index,
                        text: &part.text,
                    });
                    self.emit(StreamEvent::ReasoningSummaryPartDone {
                        item_id: id,
                        output_index,
                        summary_index,
                        part,
                    });
                }
            }
            OutputItem::FunctionCall {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                let opened = OutputItem::FunctionCall {
                    id: id.clone(),
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    status: "in_progress".into(),
                };
                self.emit(StreamEvent::OutputItemAdded {
                    output_index,
                    item: &opened,
                });
                self.emit(StreamEvent::FunctionCallArgumentsDelta {
                    item_id: id,
                    output_index,
                    delta: arguments,
                });
                self.emit(StreamEvent::FunctionCallArgumentsDone {
                    item_id: id,
                    output_index,
                    name,
                    arguments,
                });
            }
        }
        self.emit(StreamEvent::OutputItemDone { output_index, item });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::chat::ChatCompletionRequest;
    use crate::api::event_log::fold_output;
    use crate::output_check::OutputFormat;
    use crate::translate::chat::ChatAggregate;
    use inference_proto::v1 as pb;
    use pb::generate_event::Event;
    use serde_json::Value;

    /// The completion a non-streamed reply of these worker events is.
    fn completion(events: Vec<Event>, reason: pb::finished::Reason) -> ChatCompletion {
        let body = br#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#;
        let req: ChatCompletionRequest = crate::parse::json_body(body).unwrap();
        let catalog = crate::catalog::Catalog::default();
        let valid = crate::validate::chat::validate(&catalog, &req, &Default::default()).unwrap();
        let mut aggregate = ChatAggregate::default();
        let finished = Event::Finished(pb::Finished {
            reason: reason as i32,
            stop_index: None,
            usage: Some(pb::Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                ..Default::default()
            }),
        });
        for event in events.into_iter().chain([finished]) {
            aggregate.push(pb::GenerateEvent {
                event: Some(event),
                output_tokens: 0,
            });
        }
        aggregate
            .into_completion("chatcmpl-1".into(), "base", &valid, &OutputFormat::Text)
            .unwrap()
    }

    fn frames(out: &BytesMut) -> Vec<String> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|f| f.strip_prefix("data: ").unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_chat_reply_folds_into_role_content_finish_usage_done() {
        let text = |t: &str| Event::Text(pb::TextDelta { text: t.into() });
        let reply = completion(
            vec![text("Hello"), text(" there")],
            pb::finished::Reason::Stop,
        );
        let mut out = BytesMut::new();
        chat_stream(&reply, true, &mut out);
        let f = frames(&out);
        assert_eq!(f.len(), 5, "{f:?}");
        let chunk = |i: usize| serde_json::from_str::<Value>(&f[i]).unwrap();
        assert_eq!(chunk(0)["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunk(1)["choices"][0]["delta"]["content"], "Hello there");
        assert_eq!(chunk(1)["id"], "chatcmpl-1");
        assert!(chunk(1)["usage"].is_null());
        assert_eq!(chunk(2)["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunk(3)["choices"], serde_json::json!([]));
        assert_eq!(chunk(3)["usage"]["total_tokens"], 5);
        assert_eq!(f[4], "[DONE]");

        // A tool call, without usage: no usage chunk, no `usage` field.
        let call = Event::ToolCall(pb::ToolCallDelta {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments_fragment: "{\"a\":1}".into(),
        });
        let reply = completion(vec![call], pb::finished::Reason::ToolCalls);
        let mut out = BytesMut::new();
        chat_stream(&reply, false, &mut out);
        let f = frames(&out);
        assert_eq!(f.len(), 4, "{f:?}");
        let call: Value = serde_json::from_str(&f[1]).unwrap();
        assert!(call.get("usage").is_none());
        let tc = &call["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(tc["id"], "call_1");
        assert_eq!(tc["function"]["name"], "f");
        assert_eq!(tc["function"]["arguments"], "{\"a\":1}");
        let finish: Value = serde_json::from_str(&f[2]).unwrap();
        assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_response_folds_into_events_that_fold_back_into_it() {
        let mut done = crate::store::suite::object("resp_1", false);
        done.output = vec![
            OutputItem::Reasoning {
                id: "rs_1".into(),
                summary: vec![SummaryPart::new("thinking".into())],
                status: None,
                encrypted_content: None,
            },
            OutputItem::Message {
                id: "msg_1".into(),
                status: "completed".into(),
                role: "assistant".into(),
                content: vec![OutputText::new("Hello".into())],
            },
        ];
        done.end(ResponseStatus::Completed);
        let events = response_events(&done);
        let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.first(), Some(&"response.created"));
        assert_eq!(names.last(), Some(&"response.completed"));
        assert!(events.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        assert_eq!(fold_output(&events), done.output);
        let last: Value = serde_json::from_str(&events.last().unwrap().data).unwrap();
        assert_eq!(last["response"]["id"], "resp_1");
        assert_eq!(last["sequence_number"], events.len() - 1);
    }
}
