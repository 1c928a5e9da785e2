//! What clients send: a create body, a compaction request, input items
//! and their content, tools and the text and reasoning parameters.

use super::object::{ResponseUsage, SummaryPart};
use crate::api::bounds;
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
