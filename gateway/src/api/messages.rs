//! Wire types of the Anthropic Messages API (`POST /v1/messages` and
//! `POST /v1/messages/count_tokens`), as Anthropic spells them. Nothing
//! here knows about workers; `translate::messages` maps these to and from
//! the worker protocol.
//!
//! Unknown top-level fields are refused (`unknown_parameter`), as Anthropic
//! refuses them, except the fields Claude Code sends under its betas, which
//! are accepted and ignored where they do not apply ([`BETA_FIELDS`]).
//! Content blocks tolerate fields they do not use (`cache_control`,
//! `citations`), so a client can send back what it received.

use super::bounds;
use super::chat::StopSequences;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The top-level fields accepted and ignored: what Claude Code sends
/// under its `anthropic-beta` list (`context-management-*`: clearing old
/// thinking and tool results, which a stateless gateway does not keep).
/// `output_config.effort` is honoured as the reasoning effort.
pub const BETA_FIELDS: [&str; 1] = ["context_management"];

/// The request body of both routes (`count_tokens` ignores the sampling
/// fields: it counts the prompt the same body would be billed for).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesRequest {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    /// At most [`bounds::MAX_MESSAGES`], counted while parsing.
    #[serde(default, deserialize_with = "bounds::messages")]
    pub messages: Option<Vec<InputMessage>>,
    #[serde(default, deserialize_with = "content")]
    pub system: Option<Content>,
    pub stop_sequences: Option<StopSequences>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub stream: Option<bool>,
    /// At most [`bounds::MAX_TOOLS`].
    #[serde(default, deserialize_with = "bounds::tools")]
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<ToolChoice>,
    pub thinking: Option<Thinking>,
    pub metadata: Option<Metadata>,
    pub service_tier: Option<String>,
    pub output_config: Option<OutputConfig>,
    // ---- beta fields, accepted and ignored ([`BETA_FIELDS`]) ------------------
    #[serde(default, deserialize_with = "bounds::json")]
    pub context_management: Option<Value>,
}

/// One message of the conversation.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct InputMessage {
    pub role: Option<String>,
    #[serde(default, deserialize_with = "content")]
    pub content: Option<Content>,
}

/// `content` (and `system`): a string or an array of blocks.
#[derive(Debug, Clone)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block a client sends. `type` selects the variant; an unknown
/// type is a 400 naming it.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    Image {
        source: ImageSource,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<ToolResultContent>,
        #[serde(default)]
        is_error: Option<bool>,
    },
    /// Reasoning of an earlier turn, sent back; its `signature` is not
    /// checked (it is opaque and the gateway keeps nothing to check it by).
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    /// Reasoning a client cannot read: nothing of it reaches the model.
    RedactedThinking {
        #[serde(default)]
        data: Option<String>,
    },
    /// PDFs and text documents: refused by validation (no model reads them).
    Document {
        #[serde(default)]
        source: Option<Value>,
    },
}

/// A `tool_result`'s content: a string or blocks (text and images).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ToolResultContent {
    Text(String),
    Blocks(Vec<Block>),
}

/// `{type:"base64", media_type, data}` or `{type:"url", url}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ImageSource {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub media_type: Option<String>,
    pub data: Option<String>,
    pub url: Option<String>,
}

impl ImageSource {
    /// The URL a worker reads: the `url`, or a `data:` URL of base64
    /// data. `None` for a source of neither shape.
    pub fn url(&self) -> Option<String> {
        match self.kind.as_deref() {
            Some("url") => self.url.clone(),
            Some("base64") => {
                let (media, data) = (self.media_type.as_deref()?, self.data.as_deref()?);
                Some(format!("data:{media};base64,{data}"))
            }
            _ => None,
        }
    }
}

/// A tool definition. Custom tools (`type` absent or `custom`) are served;
/// Anthropic's server tools (`web_search_…`, `bash_…`, …) are refused by
/// validation, naming `tools.N.type`. Fields a custom tool does not
/// define are kept in `other` for validation to name.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    /// A JSON Schema, bounded while parsing (`bounds::schema`).
    #[serde(default, deserialize_with = "bounds::schema")]
    pub input_schema: Option<Value>,
    pub strict: Option<bool>,
    // ---- accepted and ignored --------------------------------------------------
    #[serde(default, deserialize_with = "bounds::json")]
    pub cache_control: Option<Value>,
    /// Claude Code's tool search (`advanced-tool-use` beta): the gateway
    /// shows every tool to the model.
    pub defer_loading: Option<bool>,
    #[serde(default, deserialize_with = "bounds::json")]
    pub input_examples: Option<Value>,
    pub eager_input_streaming: Option<bool>,
    #[serde(flatten)]
    pub other: BTreeMap<String, IgnoredAny>,
}

/// `tool_choice`: `{type: auto|any|tool|none, name?, disable_parallel_tool_use?}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolChoice {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub name: Option<String>,
    pub disable_parallel_tool_use: Option<bool>,
}

/// `thinking`: `{type: enabled, budget_tokens}`, `{type: disabled}`, or
/// Claude Code's `{type: adaptive, display?}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thinking {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub budget_tokens: Option<i64>,
    /// `summarized` (the text) or `omitted` (thinking blocks carry only
    /// their signature).
    pub display: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub user_id: Option<String>,
}

/// `output_config`: the `effort` of Claude Code's effort beta.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    pub effort: Option<String>,
}

/// A string or an array of at most [`bounds::MAX_CONTENT_PARTS`] blocks
/// (each read as bounded JSON first: `bounds::bounded_tagged_seq`).
fn content<'de, D>(d: D) -> Result<Option<Content>, D::Error>
where
    D: Deserializer<'de>,
{
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Option<Content>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string or an array of content blocks")
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Content::Text(v.to_owned())))
        }
        fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Content::Text(v)))
        }
        fn visit_seq<A>(self, seq: A) -> Result<Self::Value, A::Error>
        where
            A: serde::de::SeqAccess<'de>,
        {
            let blocks =
                bounds::bounded_tagged_seq(seq, bounds::MAX_CONTENT_PARTS, "content blocks")?;
            Ok(Some(Content::Blocks(blocks)))
        }
    }
    d.deserialize_any(V)
}

// ---- replies ----------------------------------------------------------------

/// A whole reply (`stream: false`), and the object `message_start` carries
/// (with no content yet).
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<&'static str>,
    /// With `stop_reason: "stop_sequence"`, the stop sequence that ended
    /// the reply.
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}

/// A content block of a reply.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Thinking {
        thinking: String,
        signature: String,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Prompt tokens not read from the cache (Anthropic's meaning).
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens the engine reused from its prefix cache.
    pub cache_read_input_tokens: u32,
    /// Always 0: prefix reuse is automatic, nothing is written on request.
    pub cache_creation_input_tokens: u32,
}

/// The `count_tokens` reply.
#[derive(Debug, Serialize)]
pub struct TokenCount {
    pub input_tokens: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_a_string_or_blocks_and_blocks_tolerate_cache_control() {
        let m: InputMessage = serde_json::from_str(
            r#"{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},
                {"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"r"}],"is_error":true},
                {"type":"thinking","thinking":"t","signature":"s"}]}"#,
        )
        .unwrap();
        let Some(Content::Blocks(b)) = m.content else {
            panic!("blocks")
        };
        assert_eq!(b.len(), 3);
        assert!(
            matches!(&b[1], Block::ToolResult { content: Some(ToolResultContent::Blocks(c)), is_error: Some(true), .. } if c.len() == 1)
        );
        let m: InputMessage = serde_json::from_str(r#"{"role":"user","content":"hi"}"#).unwrap();
        assert!(matches!(m.content, Some(Content::Text(t)) if t == "hi"));
    }

    #[test]
    fn unknown_top_level_fields_are_refused_but_beta_fields_are_not() {
        let r: Result<MessagesRequest, _> =
            serde_json::from_str(r#"{"model":"base","max_tokens":5,"messages":[],"bogus":1}"#);
        assert!(r.unwrap_err().to_string().contains("unknown field `bogus`"));
        let r: MessagesRequest = serde_json::from_str(
            r#"{"model":"base","max_tokens":5,"messages":[],"context_management":{"edits":[]},"output_config":{"effort":"high"}}"#,
        )
        .unwrap();
        assert!(r.context_management.is_some());
    }

    #[test]
    fn a_reply_block_serializes_with_its_type() {
        let b = ContentBlock::ToolUse {
            id: "toolu_1".into(),
            name: "f".into(),
            input: serde_json::json!({"a":1}),
        };
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}}"#
        );
    }
}
