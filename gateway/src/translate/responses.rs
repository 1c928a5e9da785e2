//! Responses API <-> worker protocol.
//!
//! `to_worker` turns the conversation (the stored chain plus this request's
//! input) into a `GenerateRequest`. `ResponseEncoder` folds worker events
//! into the response object and, at the same time, produces the stream
//! events in the order clients rely on: a `reasoning` item first, then the
//! message and function calls, each opened and closed with its events, and
//! exactly one terminal event.

use super::chat::tool_choice;
use super::now_unix;
use crate::api::responses::{
    ContentPart, CreateResponseRequest, EncodedEvent, IncompleteDetails, InputItem,
    InputTokensDetails, ItemContent, OutputItem, OutputText, OutputTokensDetails, Reasoning,
    ResponseError, ResponseObject, ResponseStatus, ResponseUsage, StreamEvent, SummaryPart,
};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::output_check::{self, OutputFormat};
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

/// Builds the worker request. `conversation` is the full input: the stored
/// chain's items (inputs and outputs) followed by this request's items, with
/// item references already resolved.
pub fn to_worker(
    req: &CreateResponseRequest,
    valid: &ValidResponseRequest,
    conversation: &[InputItem],
    request_id: &str,
) -> pb::GenerateRequest {
    let mut messages: Vec<pb::Message> = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &req.instructions {
        messages.push(message("system", vec![text_part(i.clone())]));
    }
    // Reasoning of an earlier turn rides on the assistant message after it.
    let mut pending_reasoning = String::new();
    for item in conversation {
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = item.role.as_deref().unwrap_or("user");
                let mut m = message(role, content_parts(item.content.as_ref()));
                if role == "assistant" {
                    m.reasoning = std::mem::take(&mut pending_reasoning);
                }
                messages.push(m);
            }
            "function_call" => {
                let call = pb::ToolCall {
                    id: item.call_id.clone().unwrap_or_default(),
                    name: item.name.clone().unwrap_or_default(),
                    arguments: item.arguments.clone().unwrap_or_default(),
                };
                // Consecutive calls belong to one assistant turn.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
                        last.tool_calls.push(call)
                    }
                    _ => {
                        let mut m = message("assistant", Vec::new());
                        m.tool_calls.push(call);
                        m.reasoning = std::mem::take(&mut pending_reasoning);
                        messages.push(m);
                    }
                }
            }
            "function_call_output" => {
                let output = match &item.output {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                let mut m = message("tool", vec![text_part(output)]);
                m.tool_call_id = item.call_id.clone().unwrap_or_default();
                messages.push(m);
            }
            "reasoning" => {
                for s in item.summary.as_deref().unwrap_or_default() {
                    pending_reasoning.push_str(&s.text);
                }
            }
            // Validation let only a summary this gateway sealed through.
            "compaction" => {
                if let Some(summary) = item
                    .encrypted_content
                    .as_deref()
                    .and_then(crate::api::compaction::open)
                {
                    let text = super::compaction::as_message_text(&summary);
                    messages.push(message("user", vec![text_part(text)]));
                }
            }
            _ => {}
        }
    }
    pb::GenerateRequest {
        request_id: request_id.to_owned(),
        model: valid.model.id.to_owned(),
        messages,
        tools: valid
            .tools
            .iter()
            .map(|t| pb::FunctionTool {
                name: t.name.clone(),
                description: t.description.clone().unwrap_or_default(),
                parameters_json: t
                    .parameters
                    .as_ref()
                    .map(Value::to_string)
                    .unwrap_or_default(),
                strict: t.strict,
            })
            .collect(),
        tool_choice: Some(tool_choice(req.tool_choice.as_ref())),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        sampling: Some(pb::Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            max_tokens: valid.max_output_tokens,
            stop: Vec::new(),
            seed: req.seed.map(|s| s as u64),
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            // The worker's model default; no public field sets it.
            repeat_penalty: None,
            top_k: None,
        }),
        response_format: match &valid.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(pb::ResponseFormat {
                kind: pb::response_format::Kind::JsonObject as i32,
                ..Default::default()
            }),
            OutputFormat::JsonSchema(schema) => Some(pb::ResponseFormat {
                kind: pb::response_format::Kind::JsonSchema as i32,
                schema_name: valid.text["format"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                schema_json: schema.to_string(),
                strict: valid.text["format"]["strict"].as_bool().unwrap_or(false),
            }),
        },
        reasoning: Some(pb::Reasoning {
            enabled: valid.reasoning,
            budget_tokens: valid.reasoning_budget,
            effort: valid
                .effort
                .clone()
                .filter(|e| e != "none")
                .unwrap_or_default(),
        }),
        cache_key: req.prompt_cache_key.clone().unwrap_or_default(),
        // Token-sized events only where a client sees them: a stream now,
        // or a background run's event log (replayable later).
        batch_events: !valid.stream && !valid.background,
        resume: None,
    }
}

fn message(role: &str, content: Vec<pb::ContentPart>) -> pb::Message {
    pb::Message {
        role: role.to_owned(),
        content,
        ..Default::default()
    }
}

fn text_part(text: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text)),
    }
}

fn content_parts(content: Option<&ItemContent>) -> Vec<pb::ContentPart> {
    match content {
        None => Vec::new(),
        Some(ItemContent::Text(t)) => vec![text_part(t.clone())],
        Some(ItemContent::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                    Some(text_part(text.clone()))
                }
                ContentPart::Refusal { refusal } => Some(text_part(refusal.clone())),
                // Validation refuses image, file and audio parts.
                _ => None,
            })
            .collect(),
    }
}

/// An output item turned back into an input item, for chaining.
pub fn output_as_input(item: &OutputItem) -> InputItem {
    match item {
        OutputItem::Message {
            id, role, content, ..
        } => InputItem {
            kind: Some("message".into()),
            id: Some(id.clone()),
            role: Some(role.clone()),
            content: Some(ItemContent::Parts(
                content
                    .iter()
                    .map(|c| ContentPart::OutputText {
                        text: c.text.clone(),
                        annotations: Vec::new(),
                    })
                    .collect(),
            )),
            status: Some("completed".into()),
            ..Default::default()
        },
        OutputItem::FunctionCall {
            id,
            call_id,
            name,
            arguments,
            status,
        } => InputItem {
            kind: Some("function_call".into()),
            id: Some(id.clone()),
            call_id: Some(call_id.clone()),
            name: Some(name.clone()),
            arguments: Some(arguments.clone()),
            status: Some(status.clone()),
            ..Default::default()
        },
        OutputItem::Reasoning { id, summary, .. } => InputItem {
            kind: Some("reasoning".into()),
            id: Some(id.clone()),
            summary: Some(summary.clone()),
            ..Default::default()
        },
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

/// The item being generated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    Reasoning,
    Message,
    /// A function call, with the worker's tool-call index.
    Call(u32),
}

/// Folds worker events into the response object and its stream events.
pub struct ResponseEncoder {
    pub object: ResponseObject,
    next_seq: u64,
    open: Option<Open>,
    format: OutputFormat,
    failure: Option<ApiError>,
}

impl ResponseEncoder {
    pub fn new(object: ResponseObject, format: OutputFormat) -> Self {
        Self {
            object,
            next_seq: 0,
            open: None,
            format,
            failure: None,
        }
    }

    /// Set when the finished reply failed its output check; the run then
    /// ended with `response.failed` instead of `response.completed`.
    pub fn failure(&self) -> Option<&ApiError> {
        self.failure.as_ref()
    }

    /// The sequence number the next event gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn emit(&mut self, out: &mut Vec<EncodedEvent>, event: StreamEvent<'_>) {
        out.push(frame(event, self.next_seq));
        self.next_seq += 1;
    }

    /// `response.created` (with the status as created: `queued` for a
    /// background run) and `response.in_progress`.
    pub fn start(&mut self, out: &mut Vec<EncodedEvent>) {
        let created = self.object.clone();
        self.emit(out, StreamEvent::Created { response: &created });
        self.object.status = ResponseStatus::InProgress;
        let snapshot = self.object.clone();
        self.emit(
            out,
            StreamEvent::InProgress {
                response: &snapshot,
            },
        );
    }

    pub fn event(&mut self, event: pb::GenerateEvent, out: &mut Vec<EncodedEvent>) {
        use pb::generate_event::Event;
        match event.event {
            Some(Event::Reasoning(r)) if !r.text.is_empty() => {
                let index = self.ensure_open(Open::Reasoning, out);
                if let Some(OutputItem::Reasoning { id, summary, .. }) =
                    self.object.output.get_mut(index)
                {
                    if let Some(part) = summary.first_mut() {
                        part.text.push_str(&r.text);
                    }
                    let id = id.clone();
                    self.emit(
                        out,
                        StreamEvent::ReasoningSummaryTextDelta {
                            item_id: &id,
                            output_index: index,
                            summary_index: 0,
                            delta: &r.text,
                        },
                    );
                }
            }
            Some(Event::Text(t)) if !t.text.is_empty() => {
                let index = self.ensure_open(Open::Message, out);
                if let Some(OutputItem::Message { id, content, .. }) =
                    self.object.output.get_mut(index)
                {
                    if let Some(part) = content.first_mut() {
                        part.text.push_str(&t.text);
                    }
                    let id = id.clone();
                    self.emit(
                        out,
                        StreamEvent::OutputTextDelta {
                            item_id: &id,
                            output_index: index,
                            content_index: 0,
                            delta: &t.text,
                            logprobs: [],
                        },
                    );
                }
            }
            Some(Event::ToolCall(d)) => {
                let opening = self.open != Some(Open::Call(d.index));
                let index = self.ensure_open(Open::Call(d.index), out);
                if let Some(OutputItem::FunctionCall { call_id, name, .. }) =
                    self.object.output.get_mut(index)
                {
                    if call_id.is_empty() {
                        *call_id = if d.id.is_empty() {
                            new_id("call_")
                        } else {
                            d.id.clone()
                        };
                    }
                    if name.is_empty() {
                        name.clone_from(&d.name);
                    }
                }
                if opening {
                    // Announced once the first delta named the call; the
                    // item's `arguments` are still empty here.
                    let announced = self.object.output[index].clone();
                    self.emit(
                        out,
                        StreamEvent::OutputItemAdded {
                            output_index: index,
                            item: &announced,
                        },
                    );
                }
                if !d.arguments_fragment.is_empty() {
                    let mut item_id = String::new();
                    if let Some(OutputItem::FunctionCall { id, arguments, .. }) =
                        self.object.output.get_mut(index)
                    {
                        arguments.push_str(&d.arguments_fragment);
                        item_id.clone_from(id);
                    }
                    self.emit(
                        out,
                        StreamEvent::FunctionCallArgumentsDelta {
                            item_id: &item_id,
                            output_index: index,
                            delta: &d.arguments_fragment,
                        },
                    );
                }
            }
            Some(Event::Finished(f)) => self.finish(&f, out),
            _ => {}
        }
    }

    /// Opens `want` unless it is already the open item; returns its index.
    fn ensure_open(&mut self, want: Open, out: &mut Vec<EncodedEvent>) -> usize {
        if self.open == Some(want) {
            return self.object.output.len() - 1;
        }
        self.close_open("completed", out);
        let index = self.object.output.len();
        self.open = Some(want);
        match want {
            Open::Reasoning => {
                let item = OutputItem::Reasoning {
                    id: new_id("rs_"),
                    summary: Vec::new(),
                    status: None,
                    encrypted_content: None,
                };
                self.emit(
                    out,
                    StreamEvent::OutputItemAdded {
                        output_index: index,
                        item: &item,
                    },
                );
                let part = SummaryPart::new(String::new());
                self.emit(
                    out,
                    StreamEvent::ReasoningSummaryPartAdded {
                        item_id: item.id(),
                        output_index: index,
                        summary_index: 0,
                        part: &part,
                    },
                );
                let mut item = item;
                if let OutputItem::Reasoning { summary, .. } = &mut item {
                    summary.push(part);
                }
                self.object.output.push(item);
            }
            Open::Message => {
                let item = OutputItem::Message {
                    id: new_id("msg_"),
                    status: "in_progress".into(),
                    role: "assistant".into(),
                    content: Vec::new(),
                };
                self.emit(
                    out,
                    StreamEvent::OutputItemAdded {
                        output_index: index,
                        item: &item,
                    },
                );
                let part = OutputText::new(String::new());
                self.emit(
                    out,
                    StreamEvent::ContentPartAdded {
                        item_id: item.id(),
                        output_index: index,
                        content_index: 0,
                        part: &part,
                    },
                );
                let mut item = item;
                if let OutputItem::Message { content, .. } = &mut item {
                    content.push(part);
                }
                self.object.output.push(item);
            }
            Open::Call(_) => {
                // Announced by the caller once the first delta filled in
                // the call id and name.
                self.object.output.push(OutputItem::FunctionCall {
                    id: new_id("fc_"),
                    call_id: String::new(),
                    name: String::new(),
                    arguments: String::new(),
                    status: "in_progress".into(),
                });
            }
        }
        index
    }

    /// Closes the open item with its `.done` events.
    fn close_open(&mut self, status: &str, out: &mut Vec<EncodedEvent>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.object.output.len() - 1;
        let Some(mut item) = self.object.output.pop() else {
            return;
        };
        match (&mut item, open) {
            (OutputItem::Reasoning { id, summary, .. }, Open::Reasoning) => {
                let part = summary
                    .first()
                    .cloned()
                    .unwrap_or_else(|| SummaryPart::new(String::new()));
                let id = id.clone();
                self.emit(
                    out,
                    StreamEvent::ReasoningSummaryTextDone {
                        item_id: &id,
                        output_index: index,
                        summary_index: 0,
                        text: &part.text,
                    },
                );
                self.emit(
                    out,
                    StreamEvent::ReasoningSummaryPartDone {
                        item_id: &id,
                        output_index: index,
                        summary_index: 0,
                        part: &part,
                    },
                );
            }
            (
                OutputItem::Message {
                    id,
                    content,
                    status: s,
                    ..
                },
                Open::Message,
            ) => {
                *s = status.into();
                let part = content
                    .first()
                    .cloned()
                    .unwrap_or_else(|| OutputText::new(String::new()));
                let id = id.clone();
                self.emit(
                    out,
                    StreamEvent::OutputTextDone {
                        item_id: &id,
                        output_index: index,
                        content_index: 0,
                        text: &part.text,
                        logprobs: [],
                    },
                );
                self.emit(
                    out,
                    StreamEvent::ContentPartDone {
                        item_id: &id,
                        output_index: index,
                        content_index: 0,
                        part: &part,
                    },
                );
            }
            (
                OutputItem::FunctionCall {
                    id,
                    name,
                    arguments,
                    status: s,
                    ..
                },
                Open::Call(_),
            ) => {
                *s = status.into();
                let (id, name, arguments) = (id.clone(), name.clone(), arguments.clone());
                self.emit(
                    out,
                    StreamEvent::FunctionCallArgumentsDone {
                        item_id: &id,
                        output_index: index,
                        name: &name,
                        arguments: &arguments,
                    },
                );
            }
            _ => {}
        }
        self.emit(
            out,
            StreamEvent::OutputItemDone {
                output_index: index,
                item: &item,
            },
        );
        self.object.output.push(item);
    }

    /// The visible text of the reply (all message items).
    fn text(&self) -> String {
        self.object
            .output
            .iter()
            .filter_map(|i| match i {
                OutputItem::Message { content, .. } => {
                    Some(content.iter().map(|c| c.text.as_str()).collect::<String>())
                }
                _ => None,
            })
            .collect()
    }

    /// Closes the open item and ends with `response.completed`, or
    /// `response.incomplete` (reason `max_output_tokens`) when a token limit
    /// cut the reply, or `response.failed` when a finished reply does not
    /// match the requested format.
    fn finish(&mut self, f: &pb::Finished, out: &mut Vec<EncodedEvent>) {
        let length = f.reason == pb::finished::Reason::Length as i32;
        self.close_open(if length { "incomplete" } else { "completed" }, out);
        self.object.usage = Some(usage(&f.usage.unwrap_or_default()));
        if length {
            self.object.end(ResponseStatus::Incomplete);
            self.object.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens".into(),
            });
            let snapshot = self.object.clone();
            self.emit(
                out,
                StreamEvent::Incomplete {
                    response: &snapshot,
                },
            );
            return;
        }
        let has_calls = self
            .object
            .output
            .iter()
            .any(|i| matches!(i, OutputItem::FunctionCall { .. }));
        if !has_calls {
            if let Err(e) = output_check::check(&self.format, &self.text(), &self.object.model) {
                self.fail(&e, out);
                self.failure = Some(e);
                return;
            }
        }
        self.object.end(ResponseStatus::Completed);
        let snapshot = self.object.clone();
        self.emit(
            out,
            StreamEvent::Completed {
                response: &snapshot,
            },
        );
    }

    /// Ends the run with `response.failed` carrying `response.error`.
    pub fn fail(&mut self, e: &ApiError, out: &mut Vec<EncodedEvent>) {
        self.close_open("incomplete", out);
        self.object.end(ResponseStatus::Failed);
        self.object.error = Some(ResponseError {
            code: e.code.to_string(),
            message: e.message.clone(),
        });
        let snapshot = self.object.clone();
        self.emit(
            out,
            StreamEvent::Failed {
                response: &snapshot,
            },
        );
    }

    /// Ends a run that stopped before its worker finished (the replica's
    /// drain cut it) with `response.incomplete`: the output so far, the
    /// open item closed `incomplete`, `incomplete_details.reason` = `reason`.
    /// Nothing is emitted once the run already ended.
    pub fn stop_early(&mut self, reason: &str, out: &mut Vec<EncodedEvent>) {
        if self.is_done() {
            return;
        }
        self.close_open("incomplete", out);
        self.object.end(ResponseStatus::Incomplete);
        self.object.incomplete_details = Some(IncompleteDetails {
            reason: reason.into(),
        });
        let snapshot = self.object.clone();
        self.emit(
            out,
            StreamEvent::Incomplete {
                response: &snapshot,
            },
        );
    }

    /// An encoder for a run another replica started and handed over: its
    /// log already holds the events up to `next_seq` (the opening ones,
    /// and any output, folded into `object.output`), so [`Self::start`] is
    /// not called again and the run goes on `in_progress`. With
    /// `last_open`, the last item was still being written: the
    /// continuation's first deltas extend it rather than open another.
    pub fn resume(
        object: ResponseObject,
        format: OutputFormat,
        next_seq: u64,
        last_open: bool,
    ) -> Self {
        let mut encoder = Self::new(object, format);
        encoder.object.status = ResponseStatus::InProgress;
        encoder.next_seq = next_seq;
        if last_open {
            // The worker numbers a reply's tool calls from 0.
            let calls = encoder
                .object
                .output
                .iter()
                .filter(|item| matches!(item, OutputItem::FunctionCall { .. }))
                .count();
            encoder.open = encoder.object.output.last().map(|item| match item {
                OutputItem::Reasoning { .. } => Open::Reasoning,
                OutputItem::Message { .. } => Open::Message,
                OutputItem::FunctionCall { .. } => {
                    Open::Call(u32::try_from(calls.saturating_sub(1)).unwrap_or(u32::MAX))
                }
            });
        }
        encoder
    }

    /// Whether the object reached a terminal status.
    pub fn is_done(&self) -> bool {
        self.object.is_terminal()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
