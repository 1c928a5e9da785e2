//! The response object, as returned by create, retrieve and cancel,
//! embedded in stream events and stored; its status, output items and
//! usage; and the other replies of the sub-resources.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

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
    pub(super) const ALL: [ResponseStatus; 6] = [
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
