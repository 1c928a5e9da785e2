//! Stream events (SSE and WebSocket) and the encoded frames a run's event
//! log stores.

use super::object::*;
use serde::Serialize;

/// A stream event's payload. Serialized inside [`Sequenced`], which adds
/// `sequence_number`; `type` repeats the SSE `event:` name.
#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent<'a> {
    #[serde(rename = "response.created")]
    Created { response: &'a ResponseObject },
    #[serde(rename = "response.queued")]
    Queued { response: &'a ResponseObject },
    #[serde(rename = "response.in_progress")]
    InProgress { response: &'a ResponseObject },
    #[serde(rename = "response.completed")]
    Completed { response: &'a ResponseObject },
    #[serde(rename = "response.failed")]
    Failed { response: &'a ResponseObject },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: &'a ResponseObject },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: &'a OutputText,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: &'a OutputText,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
        logprobs: [(); 0],
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
        logprobs: [(); 0],
    },
    #[serde(rename = "response.reasoning_summary_part.added")]
    ReasoningSummaryPartAdded {
        item_id: &'a str,
        output_index: usize,
        summary_index: usize,
        part: &'a SummaryPart,
    },
    #[serde(rename = "response.reasoning_summary_part.done")]
    ReasoningSummaryPartDone {
        item_id: &'a str,
        output_index: usize,
        summary_index: usize,
        part: &'a SummaryPart,
    },
    #[serde(rename = "response.reasoning_summary_text.delta")]
    ReasoningSummaryTextDelta {
        item_id: &'a str,
        output_index: usize,
        summary_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.reasoning_summary_text.done")]
    ReasoningSummaryTextDone {
        item_id: &'a str,
        output_index: usize,
        summary_index: usize,
        text: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: &'a str,
        output_index: usize,
        name: &'a str,
        arguments: &'a str,
    },
}

impl StreamEvent<'_> {
    /// The event name (`event:` line and `type` field).
    pub fn name(&self) -> &'static str {
        match self {
            StreamEvent::Created { .. } => "response.created",
            StreamEvent::Queued { .. } => "response.queued",
            StreamEvent::InProgress { .. } => "response.in_progress",
            StreamEvent::Completed { .. } => "response.completed",
            StreamEvent::Failed { .. } => "response.failed",
            StreamEvent::Incomplete { .. } => "response.incomplete",
            StreamEvent::OutputItemAdded { .. } => "response.output_item.added",
            StreamEvent::OutputItemDone { .. } => "response.output_item.done",
            StreamEvent::ContentPartAdded { .. } => "response.content_part.added",
            StreamEvent::ContentPartDone { .. } => "response.content_part.done",
            StreamEvent::OutputTextDelta { .. } => "response.output_text.delta",
            StreamEvent::OutputTextDone { .. } => "response.output_text.done",
            StreamEvent::ReasoningSummaryPartAdded { .. } => {
                "response.reasoning_summary_part.added"
            }
            StreamEvent::ReasoningSummaryPartDone { .. } => "response.reasoning_summary_part.done",
            StreamEvent::ReasoningSummaryTextDelta { .. } => {
                "response.reasoning_summary_text.delta"
            }
            StreamEvent::ReasoningSummaryTextDone { .. } => "response.reasoning_summary_text.done",
            StreamEvent::FunctionCallArgumentsDelta { .. } => {
                "response.function_call_arguments.delta"
            }
            StreamEvent::FunctionCallArgumentsDone { .. } => {
                "response.function_call_arguments.done"
            }
        }
    }
}

/// An event with its `sequence_number` (from 0, strictly increasing).
#[derive(Debug, Serialize)]
pub struct Sequenced<'a> {
    #[serde(flatten)]
    pub event: StreamEvent<'a>,
    pub sequence_number: u64,
}

/// A failure on the WebSocket transport (`GET /v1/responses` upgraded):
/// Open Responses' `WebSocketErrorEvent`, one text message. A request
/// refused before its response started (a bad message, a limit, an
/// unknown `previous_response_id`) gets this; a response that fails once
/// started ends with `response.failed` as on the event stream.
#[derive(Debug, Serialize)]
pub struct WebSocketErrorEvent<'a> {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The HTTP status the same failure has on `POST /v1/responses`.
    pub status: u16,
    pub error: WebSocketError<'a>,
}

/// `event: error`: a failure after a Responses event stream started (a
/// followed run's store failing, the replica restarting under it). Flat
/// for the OpenAI SDKs' error event, and again under `error` for Open
/// Responses' `ErrorStreamingEvent`: one event satisfies both.
#[derive(Debug, Serialize)]
pub struct StreamErrorEvent<'a> {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: &'a str,
    pub message: &'a str,
    pub param: Option<&'a str>,
    /// The HTTP status the failure would have had.
    pub status: u16,
    pub sequence_number: u64,
    pub error: WebSocketError<'a>,
}

/// The failure inside a [`WebSocketErrorEvent`] and a
/// [`StreamErrorEvent`]: the error envelope's `type`, `code`, `message`
/// and `param`.
#[derive(Debug, Serialize)]
pub struct WebSocketError<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub code: &'a str,
    pub message: &'a str,
    pub param: Option<&'a str>,
}

/// Terminal event names: a stream ends after one of these.
pub fn is_terminal_event(name: &str) -> bool {
    matches!(
        name,
        "response.completed" | "response.failed" | "response.incomplete"
    )
}

/// One encoded stream event: its name, sequence number and JSON payload
/// (which repeats both). Stored as is in the event log.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedEvent {
    pub seq: u64,
    pub name: String,
    pub data: String,
}

impl EncodedEvent {
    /// `event` with its sequence number `seq`, encoded.
    pub fn new(event: StreamEvent<'_>, seq: u64) -> Self {
        let name = event.name().to_owned();
        // Serializing our own wire structs into memory cannot fail.
        let data = serde_json::to_string(&Sequenced {
            event,
            sequence_number: seq,
        })
        .unwrap_or_default();
        EncodedEvent { seq, name, data }
    }

    pub fn is_terminal(&self) -> bool {
        is_terminal_event(&self.name)
    }
}

/// The terminal event that a replica other than the run's owner writes
/// (cancel, or the sweeper after a lost lease), for an object whose status
/// it already set, as event `seq` of the run's log: the store closes the log
/// to the owner first, so the number after its last event is final.
pub fn external_terminal(object: &ResponseObject, seq: u64) -> EncodedEvent {
    let event = match object.status {
        ResponseStatus::Failed => StreamEvent::Failed { response: object },
        ResponseStatus::Completed => StreamEvent::Completed { response: object },
        // A cancelled run stopped early: `response.incomplete` is the
        // terminal event every client knows (there is no `response.cancelled`).
        _ => StreamEvent::Incomplete { response: object },
    };
    EncodedEvent::new(event, seq)
}
