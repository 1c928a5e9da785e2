//! Responses API <-> worker protocol.
//!
//! `to_worker` turns the conversation (the stored chain plus this request's
//! input) into a `GenerateRequest`. `ResponseEncoder` folds worker events
//! into the response object and, at the same time, produces the stream
//! events in the order clients rely on: a `reasoning` item first, then the
//! message and function calls, each opened and closed with its events, and
//! exactly one terminal event.
//!
//! `request.rs`: the request side; `encoder.rs`: the reply side.

mod encoder;
mod request;

pub use encoder::ResponseEncoder;
pub use request::{output_as_input, to_worker};

use crate::api::responses::{
    CreateResponseRequest, EncodedEvent, InputTokensDetails, OutputTokensDetails, Reasoning,
    ResponseObject, ResponseStatus, ResponseUsage, StreamEvent,
};
use crate::translate::now_unix;
use crate::validate::responses::ValidResponseRequest;
use inference_proto::v1 as pb;
use serde_json::Value;

/// Encodes one event with its sequence number.
pub fn frame(event: StreamEvent<'_>, seq: u64) -> EncodedEvent {
    EncodedEvent::new(event, seq)
}

/// The response object at creation, before any output.
/// The response object a request starts with. `sampling` is what the
/// model's workers apply to a value the request left unset: the object
/// reports the values used (the API's 1 where neither says).
pub fn new_object(
    id: String,
    req: &CreateResponseRequest,
    valid: &ValidResponseRequest,
    status: ResponseStatus,
    sampling: pb::SamplingDefaults,
) -> ResponseObject {
    ResponseObject {
        id,
        object: "response".into(),
        created_at: now_unix(),
        status,
        background: valid.background,
        error: None,
        incomplete_details: None,
        instructions: req.instructions.clone(),
        max_output_tokens: (valid.max_output_tokens > 0).then_some(valid.max_output_tokens),
        model: valid.model.id.into(),
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id.clone(),
        reasoning: Reasoning {
            effort: valid.effort.clone(),
            summary: req
                .reasoning
                .as_ref()
                .and_then(|r| r.summary.clone().or_else(|| r.generate_summary.clone())),
        },
        store: valid.store,
        temperature: Some(req.temperature.or(sampling.temperature).unwrap_or(1.0)),
        text: valid.text.clone(),
        tool_choice: req
            .tool_choice
            .clone()
            .unwrap_or_else(|| Value::String("auto".into())),
        tools: valid.tools.iter().map(|t| t.wire()).collect(),
        top_p: Some(req.top_p.or(sampling.top_p).unwrap_or(1.0)),
        truncation: req.truncation.clone().unwrap_or_else(|| "disabled".into()),
        usage: None,
        metadata: valid.metadata.clone(),
        service_tier: "default".to_owned(),
        completed_at: None,
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        // Validation refuses any other value.
        top_logprobs: 0,
        max_tool_calls: req.max_tool_calls.and_then(|n| u32::try_from(n).ok()),
        safety_identifier: req.safety_identifier.clone(),
        prompt_cache_key: req.prompt_cache_key.clone(),
        user: req.user.clone(),
    }
}

/// Worker usage in the responses shape.
pub fn usage(u: &pb::Usage) -> ResponseUsage {
    ResponseUsage {
        input_tokens: u.prompt_tokens,
        input_tokens_details: InputTokensDetails {
            cached_tokens: u.cached_prompt_tokens,
        },
        output_tokens: u.completion_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: u.reasoning_tokens,
        },
        total_tokens: u.prompt_tokens + u.completion_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::responses::OutputItem;
    use crate::error::ApiError;
    use crate::output_check::OutputFormat;
    use crate::parse::json_body;
    use crate::validate::responses::validate;
    use pb::generate_event::Event;
    use serde_json::json;

    fn setup(body: &str) -> (CreateResponseRequest, ValidResponseRequest) {
        let req: CreateResponseRequest = json_body(body.as_bytes()).unwrap();
        let valid = validate(&crate::catalog::Catalog::default(), &req).unwrap();
        (req, valid)
    }

    fn ev(e: Event) -> pb::GenerateEvent {
        pb::GenerateEvent {
            event: Some(e),
            output_tokens: 0,
        }
    }

    fn finished(reason: pb::finished::Reason) -> pb::GenerateEvent {
        ev(Event::Finished(pb::Finished {
            reason: reason as i32,
            stop_index: None,
            usage: Some(pb::Usage {
                prompt_tokens: 10,
                cached_prompt_tokens: 4,
                completion_tokens: 6,
                reasoning_tokens: 2,
                image_tokens: 0,
            }),
        }))
    }

    fn run(body: &str, events: Vec<pb::GenerateEvent>) -> (ResponseEncoder, Vec<EncodedEvent>) {
        let (req, valid) = setup(body);
        let obj = new_object(
            "resp_1".into(),
            &req,
            &valid,
            ResponseStatus::InProgress,
            Default::default(),
        );
        let mut enc = ResponseEncoder::new(obj, valid.format.clone());
        let mut out = Vec::new();
        enc.start(&mut out);
        for e in events {
            enc.event(e, &mut out);
        }
        (enc, out)
    }

    fn names(frames: &[EncodedEvent]) -> Vec<&str> {
        frames.iter().map(|f| f.name.as_str()).collect()
    }

    /// A run cut after `cut` of `events`, its log folded and continued by
    /// another encoder with the rest: the two logs read as the uncut run's
    /// log (names, sequence numbers, item ids, the final object).
    fn assert_continues_as_one(body: &str, events: Vec<pb::GenerateEvent>, cut: usize) {
        let (whole, whole_out) = run(body, events.clone());
        let (first, mut log) = run(body, events[..cut].to_vec());
        let (output, last_open) =
            crate::api::event_log::fold_to_continue(&log).expect("one encoder's log");
        let mut object = first.object.clone();
        object.output = output;
        let mut second =
            ResponseEncoder::resume(object, first.format.clone(), first.next_seq(), last_open);
        for e in events[cut..].iter().cloned() {
            second.event(e, &mut log);
        }
        assert_eq!(names(&log), names(&whole_out));
        for (i, f) in log.iter().enumerate() {
            let v: Value = serde_json::from_str(&f.data).unwrap();
            assert_eq!(v["sequence_number"], i as u64);
        }
        let mut got = second.object.clone();
        let mut want = whole.object.clone();
        for o in [&mut got, &mut want] {
            for item in o.output.iter_mut() {
                match item {
                    OutputItem::Message { id, .. }
                    | OutputItem::FunctionCall { id, .. }
                    | OutputItem::Reasoning { id, .. } => id.clear(),
                }
            }
            o.completed_at = None;
        }
        assert_eq!(
            serde_json::to_value(&got.output).unwrap(),
            serde_json::to_value(&want.output).unwrap()
        );
        assert_eq!(got.status, ResponseStatus::Completed);
        let last: Value = serde_json::from_str(&log.last().unwrap().data).unwrap();
        let first_item = second.object.output[0].id().to_owned();
        assert_eq!(
            last["response"]["output"][0]["id"],
            first_item.as_str(),
            "the item keeps its id"
        );
    }

    #[test]
    fn a_run_continued_from_its_log_mid_message_reads_as_one_run() {
        let text = |t: &str| ev(Event::Text(pb::TextDelta { text: t.into() }));
        let events = vec![
            text("Hel"),
            text("lo, "),
            text("world"),
            finished(pb::finished::Reason::Stop),
        ];
        for cut in 1..3 {
            assert_continues_as_one(r#"{"model":"base","input":"hi"}"#, events.clone(), cut);
        }
    }

    #[test]
    fn a_run_continued_from_its_log_mid_tool_call_reads_as_one_run() {
        let call = |index: u32, id: &str, name: &str, args: &str| {
            ev(Event::ToolCall(pb::ToolCallDelta {
                index,
                id: id.into(),
                name: name.into(),
                arguments_fragment: args.into(),
            }))
        };
        let body = r#"{"model":"base","input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}"#;
        let events = vec![
            call(0, "call_a", "f", ""),
            call(0, "", "", "{\"x\": "),
            call(0, "", "", "1}"),
            call(1, "call_b", "f", "{}"),
            finished(pb::finished::Reason::ToolCalls),
        ];
        for cut in 2..4 {
            assert_continues_as_one(body, events.clone(), cut);
        }
    }

    #[test]
    fn text_reply_event_order_and_sequence() {
        let (enc, out) = run(
            r#"{"model":"base","input":"hi"}"#,
            vec![
                ev(Event::Text(pb::TextDelta { text: "Hel".into() })),
                ev(Event::Text(pb::TextDelta { text: "lo".into() })),
                finished(pb::finished::Reason::Stop),
            ],
        );
        assert_eq!(
            names(&out),
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (i, f) in out.iter().enumerate() {
            let v: Value = serde_json::from_str(&f.data).unwrap();
            assert_eq!(v["sequence_number"], i as u64);
            assert_eq!(v["type"], f.name);
        }
        let done: Value = serde_json::from_str(&out[9].data).unwrap();
        let r = &done["response"];
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output"][0]["content"][0]["text"], "Hello");
        assert_eq!(r["output"][0]["content"][0]["annotations"], json!([]));
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
        assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
        assert_eq!(r["usage"]["total_tokens"], 16);
        let delta: Value = serde_json::from_str(&out[4].data).unwrap();
        assert_eq!(delta["item_id"], r["output"][0]["id"]);
        assert_eq!(enc.object.status, ResponseStatus::Completed);
    }

    #[test]
    fn reasoning_item_comes_first_then_message() {
        let (enc, out) = run(
            r#"{"model":"base","input":"hi","reasoning":{"effort":"low"}}"#,
            vec![
                ev(Event::Reasoning(pb::ReasoningDelta {
                    text: "think".into(),
                })),
                ev(Event::Text(pb::TextDelta { text: "ok".into() })),
                finished(pb::finished::Reason::Stop),
            ],
        );
        let n = names(&out);
        assert_eq!(
            &n[2..9],
            [
                "response.output_item.added",
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "response.output_item.done",
                "response.output_item.added",
            ]
        );
        let added: Value = serde_json::from_str(&out[8].data).unwrap();
        assert_eq!(added["output_index"], 1);
        assert!(
            matches!(enc.object.output[0], OutputItem::Reasoning { ref summary, .. } if summary[0].text == "think")
        );
    }

    #[test]
    fn function_call_events() {
        let call = |id: &str, name: &str, frag: &str| {
            ev(Event::ToolCall(pb::ToolCallDelta {
                index: 0,
                id: id.into(),
                name: name.into(),
                arguments_fragment: frag.into(),
            }))
        };
        let (enc, out) = run(
            r#"{"model":"base","input":"hi","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]}"#,
            vec![
                call("call_1", "get_weather", "{\"city\""),
                call("", "", ":\"Paris\"}"),
                finished(pb::finished::Reason::ToolCalls),
            ],
        );
        assert_eq!(
            &names(&out)[2..],
            [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let added: Value = serde_json::from_str(&out[2].data).unwrap();
        assert_eq!(added["item"]["arguments"], "");
        assert_eq!(added["item"]["call_id"], "call_1");
        assert_eq!(added["item"]["name"], "get_weather");
        let done: Value = serde_json::from_str(&out[5].data).unwrap();
        assert_eq!(done["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(done["name"], "get_weather");
        assert_eq!(enc.object.status, ResponseStatus::Completed);
    }

    #[test]
    fn a_run_stopped_early_keeps_its_output() {
        let (req, valid) = setup(r#"{"model":"base","input":"hi"}"#);
        let object = new_object(
            "resp_1".into(),
            &req,
            &valid,
            ResponseStatus::InProgress,
            pb::SamplingDefaults::default(),
        );
        let mut enc = ResponseEncoder::new(object, OutputFormat::Text);
        let mut out = Vec::new();
        enc.start(&mut out);
        enc.event(
            ev(Event::Text(pb::TextDelta {
                text: "partial".into(),
            })),
            &mut out,
        );
        enc.stop_early("replica_shutdown", &mut out);
        assert_eq!(out.last().unwrap().name, "response.incomplete");
        assert_eq!(enc.object.status, ResponseStatus::Incomplete);
        assert_eq!(enc.text(), "partial");
        let n = out.len();
        enc.stop_early("replica_shutdown", &mut out);
        assert_eq!(out.len(), n, "nothing after the terminal event");
    }

    #[test]
    fn length_is_incomplete_with_reason() {
        let (enc, out) = run(
            r#"{"model":"base","input":"hi","max_output_tokens":1}"#,
            vec![
                ev(Event::Text(pb::TextDelta { text: "a".into() })),
                finished(pb::finished::Reason::Length),
            ],
        );
        assert_eq!(out.last().unwrap().name, "response.incomplete");
        assert_eq!(enc.object.status, ResponseStatus::Incomplete);
        assert_eq!(
            enc.object.incomplete_details.as_ref().unwrap().reason,
            "max_output_tokens"
        );
    }

    #[test]
    fn failure_closes_items_and_carries_the_error() {
        let (mut enc, mut out) = run(
            r#"{"model":"base","input":"hi"}"#,
            vec![ev(Event::Text(pb::TextDelta { text: "a".into() }))],
        );
        enc.fail(&ApiError::upstream("worker died"), &mut out);
        let last: Value = serde_json::from_str(&out.last().unwrap().data).unwrap();
        assert_eq!(last["type"], "response.failed");
        assert_eq!(last["response"]["error"]["code"], "upstream_error");
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
    }

    #[test]
    fn bad_json_output_fails_the_response() {
        let (enc, out) = run(
            r#"{"model":"base","input":"hi","text":{"format":{"type":"json_object"}}}"#,
            vec![
                ev(Event::Text(pb::TextDelta {
                    text: "nope".into(),
                })),
                finished(pb::finished::Reason::Stop),
            ],
        );
        assert_eq!(out.last().unwrap().name, "response.failed");
        assert_eq!(
            enc.object.error.as_ref().unwrap().code,
            "output_validation_failed"
        );
        assert_eq!(enc.failure().unwrap().status, 500);
    }

    #[test]
    fn conversation_maps_calls_outputs_and_instructions() {
        let (req, valid) = setup(
            r#"{"model":"base","instructions":"be brief","input":[
                {"role":"user","content":"weather?"},
                {"type":"function_call","call_id":"call_1","name":"w","arguments":"{}"},
                {"type":"function_call","call_id":"call_2","name":"w","arguments":"{}"},
                {"type":"function_call_output","call_id":"call_1","output":"sunny"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"and?"}]}]}"#,
        );
        let g = to_worker(&req, &valid, &valid.items, "req");
        let roles: Vec<&str> = g.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(g.messages[2].tool_calls.len(), 2);
        assert_eq!(g.messages[3].tool_call_id, "call_1");
    }

    #[test]
    fn an_external_terminal_event_carries_its_sequence_number() {
        let (req, valid) = setup(r#"{"model":"base","input":"hi","background":true}"#);
        let obj = new_object(
            "resp_1".into(),
            &req,
            &valid,
            ResponseStatus::Cancelled,
            Default::default(),
        );
        let event = crate::api::responses::external_terminal(&obj, 7);
        assert_eq!((event.name.as_str(), event.seq), ("response.incomplete", 7));
        let v: Value = serde_json::from_str(&event.data).unwrap();
        assert_eq!(v["type"], "response.incomplete");
        assert_eq!(v["sequence_number"], 7);
        assert_eq!(v["response"]["status"], "cancelled");
    }
}
