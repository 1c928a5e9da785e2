//! Wire types of `POST /v1/chat/completions`, exactly as the public API
//! spells them. Nothing here knows about workers; `translate::chat` maps
//! these to and from the worker protocol.

use super::bounds;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The request body. Unknown top-level fields are rejected
/// (`unknown_parameter`); the accepted set is the full public parameter set
/// plus the spec's extensions, wider than what the spec documents.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    /// At most [`bounds::MAX_MESSAGES`], counted while parsing.
    #[serde(default, deserialize_with = "deserialize_messages")]
    pub messages: Option<Vec<ChatMessage>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<StopSequences>,
    /// At most [`bounds::MAX_TOOLS`].
    #[serde(default, deserialize_with = "bounds::tools")]
    pub tools: Option<Vec<ChatTool>>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub response_format: Option<ResponseFormat>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub logit_bias: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub user: Option<String>,
    pub service_tier: Option<String>,
    pub store: Option<bool>,
    /// Checked while parsing (`bounds::metadata`), then ignored.
    #[serde(default, deserialize_with = "bounds::metadata")]
    pub metadata: Option<BTreeMap<String, String>>,
    pub reasoning_effort: Option<String>,
    #[serde(default, deserialize_with = "bounds::list")]
    pub modalities: Option<Vec<String>>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub audio: Option<Value>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub prediction: Option<Value>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub web_search_options: Option<Value>,
    pub verbosity: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    /// Deprecated predecessors of `tools`/`tool_choice`; accepted, then refused
    /// with a clear message by validation.
    #[serde(default, deserialize_with = "bounds::json")]
    pub functions: Option<Value>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub function_call: Option<Value>,
    // ---- extensions of the spec -------------------------------------------
    pub enable_thinking: Option<bool>,
    pub thinking_budget: Option<i64>,
    pub planner_mode: Option<bool>,
    #[serde(default, deserialize_with = "bounds::list")]
    pub agents: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub include_obfuscation: Option<bool>,
}

/// `stop`: one string or up to [`bounds::MAX_STOPS`], each of at most
/// [`bounds::MAX_STOP_CHARS`] characters, checked while parsing (a
/// hand-written `Deserialize`: `untagged` would copy every string before
/// trying a variant, and lose the index of the culprit, `stop.2`).
#[derive(Debug, Clone)]
pub enum StopSequences {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StopSequences {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = StopSequences;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<StopSequences, E> {
                serde::de::Visitor::visit_str(stop_string(), v).map(StopSequences::One)
            }
            fn visit_seq<A>(self, mut seq: A) -> Result<StopSequences, A::Error>
            where
                A: serde::de::SeqAccess<'de>,
            {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element_seed(stop_string())? {
                    if out.len() == bounds::MAX_STOPS {
                        return Err(serde::de::Error::custom(format_args!(
                            "'stop' takes at most {} sequences",
                            bounds::MAX_STOPS
                        )));
                    }
                    out.push(s);
                }
                Ok(StopSequences::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

fn stop_string() -> bounds::BoundedString {
    bounds::BoundedString {
        max: bounds::MAX_STOP_CHARS,
        what: "stop string",
    }
}

impl StopSequences {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSequences::One(s) => vec![s],
            StopSequences::Many(v) => v,
        }
    }
}

/// One message of the conversation. Nested unknown fields are tolerated so
/// that a client can echo back an assistant message it received.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatMessage {
    pub role: Option<String>,
    #[serde(default, deserialize_with = "deserialize_content")]
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    pub tool_call_id: Option<String>,
    #[serde(default, deserialize_with = "bounds::list")]
    pub tool_calls: Option<Vec<ToolCall>>,
    pub reasoning_content: Option<String>,
    pub refusal: Option<String>,
}

/// `messages`: an array of at most [`bounds::MAX_MESSAGES`] (null is
/// `None`), refused as soon as the count is passed.
fn deserialize_messages<'de, D>(d: D) -> Result<Option<Vec<ChatMessage>>, D::Error>
where
    D: Deserializer<'de>,
{
    struct MessagesVisitor;
    impl<'de> serde::de::Visitor<'de> for MessagesVisitor {
        type Value = Option<Vec<ChatMessage>>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of messages")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A>(self, seq: A) -> Result<Self::Value, A::Error>
        where
            A: serde::de::SeqAccess<'de>,
        {
            bounds::bounded_seq(seq, bounds::MAX_MESSAGES, "messages").map(Some)
        }
    }
    d.deserialize_any(MessagesVisitor)
}

/// `content`: a string or an array of parts (null is `None`).
#[derive(Debug, Clone)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

fn deserialize_content<'de, D>(d: D) -> Result<Option<MessageContent>, D::Error>
where
    D: Deserializer<'de>,
{
    struct ContentVisitor;
    impl<'de> serde::de::Visitor<'de> for ContentVisitor {
        type Value = Option<MessageContent>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string, an array of content parts, or null")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(MessageContent::Text(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(MessageContent::Text(v)))
        }
        fn visit_seq<A>(self, seq: A) -> Result<Self::Value, A::Error>
        where
            A: serde::de::SeqAccess<'de>,
        {
            let parts =
                bounds::bounded_tagged_seq(seq, bounds::MAX_CONTENT_PARTS, "content parts")?;
            Ok(Some(MessageContent::Parts(parts)))
        }
    }
    d.deserialize_any(ContentVisitor)
}

/// A content part. `type` selects the variant; an unknown type is a 400.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
    InputAudio { input_audio: Value },
    File { file: Value },
    Refusal { refusal: String },
}

#[derive(Debug, Clone, Deserialize)]
pub struct ImageUrl {
    pub url: String,
    pub detail: Option<String>,
}

/// A tool call on an assistant message: `{id, type:"function", function:{name, arguments}}`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_owned()
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct FunctionCall {
    pub name: String,
    /// JSON text, as the API sends it.
    pub arguments: String,
}

/// A tool definition in the chat (nested) shape.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatTool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub function: Option<FunctionDefinition>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDefinition {
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// `response_format`: `{type}` or `{type:"json_schema", json_schema:{...}}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub json_schema: Option<JsonSchemaFormat>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

// ---- replies ----------------------------------------------------------------

/// A non-streaming reply.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: ChatUsage,
    pub system_fingerprint: Option<String>,
    pub service_tier: &'static str,
    /// Extra fields of the spec's reference reply; empty when unused.
    pub conversation_id: Option<String>,
    pub thought: Vec<String>,
    pub tool_thought: Vec<ToolThought>,
    pub executable_data: Vec<Value>,
}

#[derive(Debug, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<Value>,
    pub finish_reason: &'static str,
}

#[derive(Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: Option<String>,
    pub refusal: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    pub reasoning_content: Option<String>,
    pub annotations: Vec<Value>,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct ChatUsage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
    /// The spec's top-level copy of the reasoning count.
    pub reasoning_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
    pub audio_tokens: u32,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: u32,
    pub audio_tokens: u32,
    pub accepted_prediction_tokens: u32,
    pub rejected_prediction_tokens: u32,
}

/// One streamed chunk. `usage` is serialized only when the client asked for
/// it (`stream_options.include_usage`): `null` on every chunk but the last.
#[derive(Debug, Serialize)]
pub struct ChatChunk<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    /// The tier the request is served at, on every chunk as on a body.
    pub service_tier: &'a str,
    pub system_fingerprint: Option<&'a str>,
    pub choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: UsageField<'a>,
}

/// The chunk's `usage`: absent, `null`, or the totals.
#[derive(Debug)]
pub enum UsageField<'a> {
    Absent,
    Null,
    Totals(&'a ChatUsage),
}

impl UsageField<'_> {
    fn is_absent(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}

impl Serialize for UsageField<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UsageField::Totals(u) => u.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    pub delta: Delta<'a>,
    pub logprobs: Option<Value>,
    pub finish_reason: Option<&'static str>,
}

/// A chunk's delta. Every field is omitted when absent, so a tool-call
/// continuation carries only `index` and its `arguments` fragment.
#[derive(Debug, Default, Serialize)]
pub struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallChunk<'a>>,
}

#[derive(Debug, Serialize)]
pub struct ToolCallChunk<'a> {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionChunk<'a>,
}

#[derive(Debug, Serialize)]
pub struct FunctionChunk<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    pub arguments: &'a str,
}

/// One entry of a planner reply's `tool_thought`: one attempt of a plan's
/// step (or an agent of the request that could not be used). The fields
/// are in their wire order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolThought {
    /// The plan's step id; null for an agent that failed before planning.
    pub step: Option<String>,
    /// `agent`, `function` or `llm`.
    pub kind: &'static str,
    /// The agent id or address, the tool's name, or `model`.
    pub target: String,
    /// A bounded label (docs/request-contract.md lists them).
    pub outcome: &'static str,
    pub latency_ms: u64,
    /// What happened, for a person; never a network detail of an agent
    /// ("agent unreachable").
    pub detail: String,
}

/// A chunk of a planner-mode stream: a chat chunk plus the planner's
/// fields, each carrying only the entries new since the previous chunk
/// (omitted when empty), and the session as `conversation_id`.
#[derive(Debug, Serialize)]
pub struct PlannerChunk<'a> {
    #[serde(flatten)]
    pub chunk: ChatChunk<'a>,
    pub conversation_id: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    pub thought: &'a [String],
    #[serde(skip_serializing_if = "is_empty")]
    pub tool_thought: &'a [ToolThought],
    #[serde(skip_serializing_if = "is_empty")]
    pub executable_data: &'a [Value],
}

fn is_empty<T>(s: &&[T]) -> bool {
    s.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_accepts_string_parts_and_null() {
        let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert!(matches!(m.content, Some(MessageContent::Text(ref t)) if t == "hi"));
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}"#,
        )
        .unwrap();
        assert!(matches!(m.content, Some(MessageContent::Parts(ref p)) if p.len() == 2));
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"assistant","content":null,"tool_calls":[]}"#).unwrap();
        assert!(m.content.is_none());
    }

    #[test]
    fn echoed_assistant_message_is_accepted() {
        let m: Result<ChatMessage, _> = serde_json::from_str(
            r#"{"role":"assistant","content":"x","refusal":null,"audio":null,"function_call":null,"annotations":[]}"#,
        );
        assert!(m.is_ok());
    }

    #[test]
    fn unknown_top_level_field_is_an_error() {
        let r: Result<ChatCompletionRequest, _> =
            serde_json::from_str(r#"{"model":"base","messages":[],"max_token":5}"#);
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains("unknown field `max_token`"), "{msg}");
    }

    #[test]
    fn tool_continuation_delta_has_only_index_and_arguments() {
        let d = Delta {
            tool_calls: vec![ToolCallChunk {
                index: 0,
                id: None,
                kind: None,
                function: FunctionChunk {
                    name: None,
                    arguments: "{\"a\"",
                },
            }],
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\""}}]}"#
        );
    }
}
