//! The upstream engine's HTTP wire types: OpenAI-compatible chat
//! completions as vLLM, SGLang and llama-server speak them, and the few
//! engine-specific endpoints (tokenize, props, models). Kept apart from the
//! proto types; `request.rs` and `relay.rs` translate.
//!
//! Every field the engines may leave out is optional: a chunk that lacks
//! one must not fail the stream.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub stream: bool,
    pub stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// vLLM, SGLang, llama-server (not in OpenAI's API).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// vLLM, SGLang, llama-server: passed to the chat template
    /// (`enable_thinking`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<Value>,
    /// vLLM: tokens the thinking section may take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_token_budget: Option<u32>,
    /// OpenAI: `low` / `medium` / `high`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// SGLang: the request id `/abort_request` takes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rid: Option<String>,
    /// vLLM, SGLang: the request's place in the engine's own priority
    /// scheduling ([`super::kind::Kind::priority`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// llama-server: the slot to run in ([`super::slots`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_slot: Option<u32>,
    /// vLLM, SGLang: continue the final (assistant) message rather than
    /// open a new turn (a moved generation), with
    /// `add_generation_prompt: false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub add_generation_prompt: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct StreamOptions {
    pub include_usage: bool,
}

#[derive(Debug, Clone, Serialize, Default, PartialEq)]
pub struct Message {
    pub role: String,
    /// A string, or content parts when the message carries images.
    pub content: Value,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tool_call_id: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: ToolFunction,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolFunction {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub parameters: Value,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub strict: bool,
}

/// One `data:` frame of the stream.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Chunk {
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<Usage>,
    /// A failure after the stream started.
    #[serde(default)]
    pub error: Option<ErrorBody>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct Choice {
    #[serde(default)]
    pub delta: Delta,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: the stop string (or token id) that ended the reply.
    #[serde(default)]
    pub stop_reason: Option<Value>,
    /// SGLang: the same.
    #[serde(default)]
    pub matched_stop: Option<Value>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    /// vLLM since late 2025.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// llama-server, SGLang, older vLLM.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct ToolCallDelta {
    #[serde(default)]
    pub index: u32,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionDelta>,
}

#[derive(Debug, Clone, Deserialize, Default)]
pub struct FunctionDelta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u32>,
}

/// `{"error": {...}}`: the body of a refusal, or a frame mid-stream. The
/// engines disagree on the shape beyond `message` (llama-server adds
/// `type: exceed_context_size_error`, vLLM `type: BadRequestError`).
#[derive(Debug, Clone, Deserialize, Default)]
pub struct ErrorBody {
    #[serde(default)]
    pub message: String,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub code: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Deserialize)]
pub struct Models {
    #[serde(default)]
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// vLLM, SGLang.
    #[serde(default)]
    pub max_model_len: Option<u32>,
    /// llama-server: `meta.n_ctx_train`.
    #[serde(default)]
    pub meta: Option<Value>,
}

/// llama-server `GET /props`.
#[derive(Debug, Clone, Deserialize)]
pub struct Props {
    #[serde(default)]
    pub default_generation_settings: Option<GenerationSettings>,
    #[serde(default)]
    pub total_slots: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GenerationSettings {
    /// The context of one slot (`-c` / `-np`).
    #[serde(default)]
    pub n_ctx: Option<u32>,
}

/// vLLM `POST /tokenize` (chat form; SGLang takes the same).
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenize<'a> {
    pub model: &'a str,
    pub messages: &'a [Message],
    /// Templates render tool definitions into the prompt: they count.
    #[serde(skip_serializing_if = "<[Tool]>::is_empty")]
    pub tools: &'a [Tool],
    pub add_generation_prompt: bool,
}

/// llama-server `POST /apply-template`.
#[derive(Debug, Clone, Serialize)]
pub struct ApplyTemplate<'a> {
    pub messages: &'a [Message],
    #[serde(skip_serializing_if = "<[Tool]>::is_empty")]
    pub tools: &'a [Tool],
}

#[derive(Debug, Clone, Deserialize)]
pub struct Applied {
    pub prompt: String,
}

/// llama-server `POST /tokenize`.
#[derive(Debug, Clone, Serialize)]
pub struct TextTokenize<'a> {
    pub content: &'a str,
    pub add_special: bool,
    pub parse_special: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Tokenized {
    /// vLLM.
    #[serde(default)]
    pub count: Option<u32>,
    #[serde(default)]
    pub tokens: Vec<Value>,
}

impl Tokenized {
    pub fn token_count(&self) -> u32 {
        self.count
            .unwrap_or_else(|| u32::try_from(self.tokens.len()).unwrap_or(u32::MAX))
    }
}
