//! The sequence-level engine seam: what a real model engine implements.
//!
//! An engine owns everything model-specific: its tokenizer and chat template
//! (from the model file), its context window, its KV/prefix cache, its
//! scheduler. It takes one [`Sequence`] (prompt tokens, sampling, a token
//! budget, an optional output constraint) and streams [`SeqEvent`]s: prefill
//! done (with the real count of reused prompt tokens), one event per token
//! (id and bytes), then how it ended. Dropping the [`SequenceStream`] aborts
//! the sequence; the engine frees its slot within one decode step.
//!
//! Everything else (UTF-8-safe detokenizing, stop strings, the length cut,
//! the reasoning split, tool-call parsing, coalescing, usage) is the shared
//! [`crate::pipeline`], the same for every engine. A new engine is one file
//! implementing [`SequenceEngine`].

use tokio::sync::mpsc;
use tonic::Status;

/// A token id in the engine's own vocabulary.
pub type TokenId = u32;

/// Stands for an image part in [`ChatMessage::content`], in the order of
/// [`ChatMessage::images`] (U+FFFC, the object replacement character).
pub const IMAGE_PLACEHOLDER: char = '\u{FFFC}';

/// An image part of a message (for engines that take images).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    /// `https:` or `data:` URL.
    pub url: String,
    /// `low`, `high`, `auto` or empty.
    pub detail: String,
}

/// One chat message, already flattened to text by the pipeline (tool calls
/// and results included); the engine renders a list of them with its own
/// chat template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    /// The text; each image part is an [`IMAGE_PLACEHOLDER`] here.
    pub content: String,
    /// The image parts, in order (only for an engine that
    /// [accepts images](SequenceEngine::accepts_images)).
    pub images: Vec<Image>,
    /// On a tool result: the call it answers (empty otherwise).
    pub tool_call_id: String,
}

/// Sampling of one sequence. `temperature` 0 (or unset with no `top_p`)
/// is greedy decoding.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingParams {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Only the k likeliest tokens are candidates (none: every token).
    pub top_k: Option<u32>,
    pub seed: Option<u64>,
    /// Multiplicative penalty on tokens among the last 64 generated (1 or
    /// none: off); the model's default, never the client's.
    pub repeat_penalty: Option<f32>,
}

/// What the output must match, enforced while decoding.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A JSON Schema (a `json_object` reply is `{"type": "object"}`).
    JsonSchema(serde_json::Value),
}

/// One sequence to generate.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    /// Tokens to generate at most; the engine ends with
    /// [`SeqEnd::MaxTokens`] when they are spent or the window is full.
    pub max_tokens: u32,
    pub constraint: Option<Constraint>,
    /// The caller's cache affinity key (may be empty); a hint only.
    pub cache_key: String,
    /// Output a failed worker already generated for this sequence (a moved
    /// generation, `GenerateRequest.resume`): it follows the prompt in the
    /// context, the constraint has already matched it, and generation
    /// continues after it. `max_tokens` counts only what follows. Empty
    /// for a new sequence.
    pub resumed: Vec<TokenId>,
}

/// How the engine ended a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqEnd {
    /// The model produced an end-of-generation token (not streamed).
    EndOfGeneration,
    /// `max_tokens` spent or the context window full.
    MaxTokens,
}

/// One event of a running sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqEvent {
    /// The prompt is in the cache, in slot `slot` (engines with fixed
    /// slots); `cached_tokens` of it were reused.
    Prefilled {
        cached_tokens: u32,
        slot: Option<u32>,
    },
    /// One generated token and its bytes (possibly a partial UTF-8 char).
    Token { id: TokenId, bytes: Vec<u8> },
    /// The last event of a sequence.
    Finished(SeqEnd),
}

/// Where an engine's decode loop spent its time since it started, for the
/// per-step comparison with other engines (`worker_engine_*` metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTimings {
    /// Steps that decoded only generated tokens (one per running sequence).
    pub generate: StepTotals,
    /// Steps that also carried prompt tokens (a prefill chunk).
    pub prefill: StepTotals,
}

/// Totals over one kind of decode step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepTotals {
    pub steps: u64,
    /// In the model's forward pass (`llama_decode`).
    pub decode_ns: u64,
    /// Sampling the next tokens and handing them to their streams.
    pub sample_ns: u64,
}

/// The events of one sequence; drop it to abort the sequence.
pub type SequenceStream = mpsc::UnboundedReceiver<Result<SeqEvent, Status>>;

/// A model engine at the sequence level.
#[async_trait::async_trait]
pub trait SequenceEngine: Send + Sync + 'static {
    /// `llama`, ... (reported in `Info.engine`).
    fn name(&self) -> &'static str;
    /// Human-readable: the model file and how it runs.
    fn description(&self) -> String;
    /// Tokens one sequence may hold (prompt plus completion).
    fn context_window(&self) -> u32;
    /// Renders messages with the model's chat template, ending with the
    /// opening of the assistant turn.
    fn render(&self, messages: &[ChatMessage]) -> Result<String, Status>;
    /// Share of the KV cache holding tokens (running or kept for prefix
    /// reuse), 0..=1; `None` if the engine does not track it.
    fn kv_cache_usage(&self) -> Option<f64> {
        None
    }
    /// Tokenizes rendered text (special tokens in it are parsed).
    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, Status>;
    /// Where the decode loop spent its time; `None` if the engine does not
    /// time its steps.
    fn step_timings(&self) -> Option<StepTimings> {
        None
    }
    /// Whether the engine takes image parts (rendered by its template);
    /// the pipeline refuses them otherwise.
    fn accepts_images(&self) -> bool {
        false
    }
    /// Prompt tokens one image part costs (`Usage.image_tokens`).
    fn image_tokens(&self, _image: &Image) -> u32 {
        0
    }
    /// Whether the engine keeps prompts in fixed slots and says which in
    /// [`SeqEvent::Prefilled`] (the worker's cache report is then exact).
    fn has_slots(&self) -> bool {
        false
    }
    /// The most tokens the pipeline merges into one event when they come
    /// faster than the stream takes them; `None` = no limit, `Some(1)` =
    /// one event per token.
    fn max_tokens_per_event(&self) -> Option<u32> {
        None
    }
    /// Starts a sequence: compiles its constraint (a bad schema fails here
    /// with INVALID_ARGUMENT) and queues it for the decode loop.
    async fn start(&self, sequence: Sequence) -> Result<SequenceStream, Status>;
}
