//! Wire types of the Responses API (`/v1/responses` and its sub-resources),
//! exactly as the public API spells them. Nothing here knows about workers
//! or the store; `translate::responses` maps these to the worker protocol.

use super::bounds;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The body of `POST /v1/responses`. Unknown top-level fields are rejected
/// (`unknown_parameter`); the accepted set is the full public parameter set,
/// what the Codex CLI sends, and the spec's extensions. Nested objects
/// tolerate unknown fields so that clients can echo back items they received.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateResponseRequest {
    pub model: Option<String>,
    pub input: Option<Input>,
    pub instructions: Option<String>,
    pub stream: Option<bool>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub stream_options: Option<Value>,
    pub background: Option<bool>,
    pub store: Option<bool>,
    pub previous_response_id: Option<String>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub conversation: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub max_tool_calls: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub top_logprobs: Option<i64>,
    /// At most [`bounds::MAX_TOOLS`].
    #[serde(default, deserialize_with = "bounds::tools")]
    pub tools: Option<Vec<ResponseTool>>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextParam>,
    /// The chat-completions spelling; `text.format` wins when both are given.
    pub response_format: Option<FormatParam>,
    pub reasoning: Option<ReasoningParam>,
    /// Checked while parsing (`bounds::metadata`).
    #[serde(default, deserialize_with = "bounds::metadata")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "bounds::list")]
    pub include: Option<Vec<String>>,
    pub prompt_cache_key: Option<String>,
    pub prompt_cache_retention: Option<String>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub prompt: Option<Value>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub client_metadata: Option<Value>,
    pub truncation: Option<String>,
    pub service_tier: Option<String>,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub seed: Option<i64>,
    // ---- extensions of the spec -------------------------------------------
    pub enable_thinking: Option<bool>,
    pub thinking_budget: Option<i64>,
}

/// The body of `POST /v1/responses/compact` (Open Responses'
/// `CompactResponseMethodPublicBody`). Unknown fields are rejected
/// (`unknown_parameter`), as on create.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactRequest {
    pub model: Option<String>,
    pub input: Option<Input>,
    pub previous_response_id: Option<String>,
    pub instructions: Option<String>,
    pub prompt_cache_key: Option<String>,
}

/// A compacted conversation (`object: "response.compaction"`): the user's
/// messages and one `compaction` item that holds the rest as a summary.
/// Not stored.
#[derive(Debug, Clone, Serialize)]
pub struct CompactedConversation {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub output: Vec<InputItem>,
    pub usage: ResponseUsage,
}

/// `input`: one string (a user message) or a list of items.
#[derive(Debug, Clone)]
pub enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string_or_seq(
            d,
            Input::Text,
            Input::Items,
            "a string or an array of input items",
            (bounds::MAX_MESSAGES, "input items"),
            false,
        )
    }
}

/// One input item. The easy form `{role, content}` has no `type`; typed
/// items are `message`, `function_call`, `function_call_output`,
/// `item_reference` and `reasoning`. One flat struct keeps error paths
/// exact (`input.2.call_id`); validation checks what each type requires.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct InputItem {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<ItemContent>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
    /// `function_call_output.output`: a string (or, rarely, content parts).
    #[serde(
        default,
        deserialize_with = "bounds::json",
        skip_serializing_if = "Option::is_none"
    )]
    pub output: Option<Value>,
    #[serde(
        default,
        deserialize_with = "bounds::list",
        skip_serializing_if = "Option::is_none"
    )]
    pub summary: Option<Vec<SummaryPart>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
}

/// A message's `content`: a string or a list of parts.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl<'de> Deserialize<'de> for ItemContent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        string_or_seq(
            d,
            ItemContent::Text,
            ItemContent::Parts,
            "a string or an array of content parts",
            (bounds::MAX_CONTENT_PARTS, "content parts"),
            true,
        )
    }
}

/// A string or an array, without `untagged` (which would hide the inner
/// error and its path: `input.2.content.0.type` must stay exact). The
/// array holds at most `bound.0` elements (`bound.1` names them), counted
/// while parsing; `tagged` elements (an internally tagged enum, which serde
/// would buffer whole) are read as bounded JSON first
/// ([`bounds::bounded_tagged_seq`]).
fn string_or_seq<'de, D, T, E>(
    d: D,
    text: fn(String) -> T,
    seq: fn(Vec<E>) -> T,
    expecting: &'static str,
    bound: (usize, &'static str),
    tagged: bool,
) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    E: serde::de::DeserializeOwned,
{
    struct V<T, E> {
        text: fn(String) -> T,
        seq: fn(Vec<E>) -> T,
        expecting: &'static str,
        bound: (usize, &'static str),
        tagged: bool,
    }
    impl<'de, T, E: serde::de::DeserializeOwned> serde::de::Visitor<'de> for V<T, E> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(self.expecting)
        }
        fn visit_str<Er>(self, v: &str) -> Result<T, Er> {
            Ok((self.text)(v.to_owned()))
        }
        fn visit_string<Er>(self, v: String) -> Result<T, Er> {
            Ok((self.text)(v))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, a: A) -> Result<T, A::Error> {
            let (limit, what) = self.bound;
            let items = if self.tagged {
                bounds::bounded_tagged_seq(a, limit, what)?
            } else {
                bounds::bounded_seq(a, limit, what)?
            };
            Ok((self.seq)(items))
        }
    }
    d.deserialize_any(V {
        text,
        seq,
        expecting,
        bound,
        tagged,
    })
}

/// A content part of an input message. `type` selects the variant; image,
/// file and audio parts parse so that validation can name them precisely.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
        #[serde(default)]
        annotations: Vec<Value>,
    },
    Refusal {
        refusal: String,
    },
    InputImage {},
    InputFile {},
    InputAudio {},
}

/// A tool: the flat responses shape `{type, name, parameters, strict,
/// description}` or the nested chat shape `{type, function:{...}}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponseTool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
    pub function: Option<NestedFunction>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NestedFunction {
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// `text`: `{format, verbosity}`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TextParam {
    pub format: Option<FormatParam>,
    pub verbosity: Option<String>,
}

/// `text.format` (flat) or `response_format` (chat shape, with the schema
/// under `json_schema`). Both spellings are read by one struct.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FormatParam {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub schema: Option<Value>,
    pub strict: Option<bool>,
    pub json_schema: Option<Box<FormatParam>>,
}

/// `reasoning`: `{effort, summary}` (`generate_summary` is the old name).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReasoningParam {
    pub effort: Option<String>,
    pub summary: Option<String>,
    pub generate_summary: Option<String>,
}

// ---- replies ----------------------------------------------------------------

/// The response object, as returned by create, retrieve and cancel, embedded
/// in stream events, and stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResponseObject {
    pub id: String,
    pub object: String,
    pub created_at: u64,
    pub status: ResponseStatus,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Reasoning,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: Option<f64>,
    pub truncation: String,
    pub usage: Option<ResponseUsage>,
    pub metadata: BTreeMap<String, String>,
    /// The tier it was served at (`default` for objects stored before
    /// tiers were echoed).
    #[serde(default = "default_service_tier")]
    pub service_tier: String,
    /// Unix seconds at which it reached a terminal status; null before.
    /// Set only by [`Self::end`]. Every field from here on has a serde
    /// default, so objects stored by an older gateway still read.
    #[serde(default)]
    pub completed_at: Option<u64>,
    /// The effective penalties: the request's, else 0 (the API default).
    #[serde(default)]
    pub presence_penalty: f64,
    #[serde(default)]
    pub frequency_penalty: f64,
    /// Always 0: any other value is refused (no logprobs here).
    #[serde(default)]
    pub top_logprobs: u32,
    #[serde(default)]
    pub max_tool_calls: Option<u32>,
    #[serde(default)]
    pub safety_identifier: Option<String>,
    /// Null when not sent (the Open Responses document requires the field).
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub user: Option<String>,
}

fn default_service_tier() -> String {
    "default".to_owned()
}

impl ResponseObject {
    /// Whether `status` is one a run ends in.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }

    /// Moves it to `status`, stamping `completed_at` when that status ends
    /// the run: one place, so no path that ends a run forgets the stamp.
    pub fn end(&mut self, status: ResponseStatus) {
        self.status = status;
        self.completed_at = status.is_terminal().then(unix_now);
    }
}

/// Seconds since the epoch (0 on a clock before it).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A response's status. Code compares variants; the words exist only where
/// the status leaves the process: the wire (serde) and the store's own
/// fields ([`Self::as_str`], [`Self::parse`]).
///
/// Serialised by hand rather than derived: it is a string on the wire, as
/// `docs/openapi.json` documents it (the drift guard reads derived types
/// as objects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseStatus {
    /// A background run not yet started.
    Queued,
    InProgress,
    Completed,
    Failed,
    /// Ended by its client: a cancel, or a foreground client gone.
    Cancelled,
    /// Cut by a token limit, or stopped early.
    Incomplete,
}

impl ResponseStatus {
    const ALL: [ResponseStatus; 6] = [
        ResponseStatus::Queued,
        ResponseStatus::InProgress,
        ResponseStatus::Completed,
        ResponseStatus::Failed,
        ResponseStatus::Cancelled,
        ResponseStatus::Incomplete,
    ];
    const NAMES: [&'static str; 6] = [
        "queued",
        "in_progress",
        "completed",
        "failed",
        "cancelled",
        "incomplete",
    ];

    /// As the API (and the store) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ResponseStatus::Queued => "queued",
            ResponseStatus::InProgress => "in_progress",
            ResponseStatus::Completed => "completed",
            ResponseStatus::Failed => "failed",
            ResponseStatus::Cancelled => "cancelled",
            ResponseStatus::Incomplete => "incomplete",
        }
    }

    /// The status a word names (`None` for any other word).
    pub fn parse(word: &str) -> Option<ResponseStatus> {
        Self::ALL.into_iter().find(|s| s.as_str() == word)
    }

    /// `completed`, `failed`, `cancelled` and `incomplete` end a run.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            ResponseStatus::Completed
                | ResponseStatus::Failed
                | ResponseStatus::Cancelled
                | ResponseStatus::Incomplete
        )
    }
}

impl std::fmt::Display for ResponseStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ResponseStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ResponseStatus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let word = std::borrow::Cow::<'de, str>::deserialize(d)?;
        ResponseStatus::parse(&word)
            .ok_or_else(|| serde::de::Error::unknown_variant(&word, &ResponseStatus::NAMES))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct IncompleteDetails {
    pub reason: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Reasoning {
    pub effort: Option<String>,
    pub summary: Option<String>,
}

/// Usage in the responses shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct InputTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

/// An output item.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message {
        id: String,
        status: String,
        role: String,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: String,
    },
    Reasoning {
        id: String,
        summary: Vec<SummaryPart>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
        /// Always absent: reasoning is returned in clear in `summary`, never
        /// encrypted, so `include: ["reasoning.encrypted_content"]` (the
        /// Codex CLI's default with `store: false`) is answered truthfully
        /// with nothing to carry between turns. Omitted rather than `null`:
        /// Open Responses types it as a string when present.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
}

impl OutputItem {
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. }
            | OutputItem::Reasoning { id, .. } => id,
        }
    }
}

/// An `output_text` part: `annotations` is always present (clients require it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    pub annotations: Vec<Value>,
    #[serde(default)]
    pub logprobs: Vec<Value>,
}

impl OutputText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text".into(),
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// `{type:"summary_text", text}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SummaryPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
}

impl SummaryPart {
    pub fn new(text: String) -> Self {
        Self {
            kind: "summary_text".into(),
            text,
        }
    }
}

/// `DELETE /v1/responses/{id}`.
#[derive(Debug, Serialize)]
pub struct DeletedResponse<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub deleted: bool,
}

/// `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Serialize)]
pub struct InputItemList<'a> {
    pub object: &'static str,
    pub data: &'a [Value],
    pub first_id: Option<&'a str>,
    pub last_id: Option<&'a str>,
    pub has_more: bool,
}

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

/// The failure inside a [`WebSocketErrorEvent`]: the error envelope's
/// `type`, `code`, `message` and `param`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_accepts_string_easy_and_typed_items() {
        let r: CreateResponseRequest = serde_json::from_str(
            r#"{"model":"base","input":[
                {"role":"user","content":"hi"},
                {"type":"message","role":"assistant","id":"msg_1","content":[{"type":"output_text","text":"yo","annotations":[]}]},
                {"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"call_1","output":"42"},
                {"type":"item_reference","id":"msg_0"},
                {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}]}
            ]}"#,
        )
        .unwrap();
        let Some(Input::Items(items)) = r.input else {
            panic!("items")
        };
        assert_eq!(items.len(), 6);
        assert_eq!(items[2].call_id.as_deref(), Some("call_1"));
        let r: CreateResponseRequest =
            serde_json::from_str(r#"{"model":"base","input":"hello"}"#).unwrap();
        assert!(matches!(r.input, Some(Input::Text(ref t)) if t == "hello"));
    }

    #[test]
    fn codex_fields_are_accepted_and_typos_are_not() {
        let ok: Result<CreateResponseRequest, _> = serde_json::from_str(
            r#"{"model":"base","input":"x","include":["reasoning.encrypted_content"],"prompt_cache_key":"k",
                "client_metadata":{"a":"b"},"reasoning":{"effort":"low","summary":"auto"},"store":false,
                "truncation":"auto","service_tier":"auto","user":"u","safety_identifier":"s","top_logprobs":0,
                "stream_options":{"include_obfuscation":false},"text":{"verbosity":"low"},"max_tool_calls":3}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
        let bad: Result<CreateResponseRequest, _> =
            serde_json::from_str(r#"{"model":"base","input":"x","max_output_token":3}"#);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("unknown field `max_output_token`"));
    }

    #[test]
    fn events_carry_type_and_sequence_number() {
        let part = OutputText::new(String::new());
        let e = Sequenced {
            event: StreamEvent::ContentPartAdded {
                item_id: "msg_1",
                output_index: 0,
                content_index: 0,
                part: &part,
            },
            sequence_number: 3,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "response.content_part.added");
        assert_eq!(v["sequence_number"], 3);
        assert_eq!(
            v["part"],
            serde_json::json!({"type":"output_text","text":"","annotations":[],"logprobs":[]})
        );
        assert_eq!(e.event.name(), "response.content_part.added");
    }

    #[test]
    fn statuses_are_words_on_the_wire_and_variants_inside() {
        for status in ResponseStatus::ALL {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{status}\""));
            assert_eq!(
                serde_json::from_str::<ResponseStatus>(&json).unwrap(),
                status
            );
            assert_eq!(ResponseStatus::parse(status.as_str()), Some(status));
        }
        assert!(serde_json::from_str::<ResponseStatus>("\"canceled\"").is_err());
        assert_eq!(ResponseStatus::parse("done"), None);
        let ended: Vec<_> = ResponseStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(ResponseStatus::as_str)
            .collect();
        assert_eq!(ended, ["completed", "failed", "cancelled", "incomplete"]);
    }

    /// An object stored before `completed_at`, the penalties and the
    /// other Open Responses fields existed reads with their defaults.
    #[test]
    fn objects_stored_by_an_older_gateway_still_read() {
        let old = r#"{"id":"resp_1","object":"response","created_at":5,"status":"completed",
            "background":false,"error":null,"incomplete_details":null,"instructions":null,
            "max_output_tokens":null,"model":"base","output":[],"parallel_tool_calls":true,
            "previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,
            "temperature":null,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],
            "top_p":null,"truncation":"disabled","usage":null,"metadata":{}}"#;
        let o: ResponseObject = serde_json::from_str(old).unwrap();
        assert_eq!(o.completed_at, None);
        assert_eq!((o.presence_penalty, o.frequency_penalty), (0.0, 0.0));
        assert_eq!((o.top_logprobs, o.max_tool_calls), (0, None));
        assert_eq!(o.service_tier, "default");
        let v = serde_json::to_value(&o).unwrap();
        for field in [
            "completed_at",
            "safety_identifier",
            "prompt_cache_key",
            "max_tool_calls",
        ] {
            assert_eq!(v[field], Value::Null, "{field} is present as null");
        }
        assert!(v.get("prompt_cache_key").is_some());
    }

    #[test]
    fn ending_stamps_completed_at_only_for_a_terminal_status() {
        let mut o: ResponseObject = serde_json::from_value(serde_json::json!({
            "id":"r","object":"response","created_at":5,"status":"queued","background":true,
            "error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,
            "model":"base","output":[],"parallel_tool_calls":true,"previous_response_id":null,
            "reasoning":{},"store":true,"temperature":1.0,"text":{},"tool_choice":"auto",
            "tools":[],"top_p":1.0,"truncation":"disabled","usage":null,"metadata":{}}))
        .unwrap();
        o.end(ResponseStatus::InProgress);
        assert_eq!(o.completed_at, None);
        o.end(ResponseStatus::Cancelled);
        assert!(o.completed_at.is_some_and(|t| t >= 5));
    }

    #[test]
    fn output_items_round_trip() {
        let item = OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed".into(),
        };
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["type"], "function_call");
        let back: OutputItem = serde_json::from_value(v).unwrap();
        assert_eq!(back, item);
    }
}
