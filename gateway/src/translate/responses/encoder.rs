//! The reply side: worker events folded into the response object and,
//! at the same time, the stream events in the order clients rely on.

use super::{frame, usage};
use crate::api::responses::{
    EncodedEvent, IncompleteDetails, OutputItem, OutputText, ResponseError, ResponseObject,
    ResponseStatus, StreamEvent, SummaryPart,
};
use crate::error::ApiError;
use crate::ids::new_id;
use crate::output_check::{self, OutputFormat};
use inference_proto::v1 as pb;

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
    pub(super) format: OutputFormat,
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
    pub(super) fn text(&self) -> String {
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
