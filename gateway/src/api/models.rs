//! Wire types of `GET /v1/models` and `GET /v1/models/{model}`, and the
//! Codex CLI's catalogue format served on the same route.

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

#[derive(Debug, Serialize)]
pub struct Model {
    pub id: &'static str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// `{"models":[...]}`: what the Codex CLI expects from `GET /models`.
#[derive(Debug, Serialize)]
pub struct CodexCatalogue {
    pub models: Vec<CodexModel>,
}

#[derive(Debug, Serialize)]
pub struct CodexModel {
    pub slug: &'static str,
    pub display_name: &'static str,
    pub description: &'static str,
    pub default_reasoning_level: &'static str,
    pub supported_reasoning_levels: Vec<ReasoningLevel>,
    pub shell_type: &'static str,
    pub visibility: &'static str,
    pub supported_in_api: bool,
    pub priority: i32,
    /// Codex's system prompt for this model. Codex refuses a catalogue
    /// entry without it (or an `instructions_template`), so never null.
    pub base_instructions: &'static str,
    pub supports_reasoning_summaries: bool,
    pub support_verbosity: bool,
    pub default_verbosity: Option<String>,
    pub truncation_policy: TruncationPolicy,
    pub supports_parallel_tool_calls: bool,
    pub context_window: u32,
    pub experimental_supported_tools: Vec<String>,
    pub input_modalities: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct ReasoningLevel {
    pub effort: &'static str,
    pub description: &'static str,
}

#[derive(Debug, Serialize)]
pub struct TruncationPolicy {
    pub mode: &'static str,
    pub limit: u32,
}

/// Anthropic's model list (`GET /v1/models` from an Anthropic client):
/// Claude Code's gateway model discovery reads each model's window from
/// `max_input_tokens`.
#[derive(Debug, Serialize)]
pub struct AnthropicModelList {
    pub data: Vec<AnthropicModel>,
    pub has_more: bool,
    pub first_id: Option<&'static str>,
    pub last_id: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct AnthropicModel {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: &'static str,
    pub display_name: &'static str,
    /// RFC 3339.
    pub created_at: &'static str,
    /// The context window: prompt and output together.
    pub max_input_tokens: u32,
    /// The most a reply may hold: the window (a larger `max_tokens` is
    /// clamped to what the prompt leaves).
    pub max_tokens: u32,
}
