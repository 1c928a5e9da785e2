//! The message-level engine seam: for engines that take chat messages, not
//! tokens (an OpenAI-compatible server in front of its own model, see
//! [`crate::engine::upstream`]).
//!
//! Such an engine applies its own chat template, tokenizer, stop strings,
//! reasoning parser and tool parser, so the token pipeline of
//! [`super::sequence`] has nothing to do. What stays with the service is the
//! same as for every engine: draining, the context-window check (on the
//! engine's own count and window, with the same `context_length_exceeded`
//! status), admission and counters.

use super::Started;
use inference_proto::v1 as pb;
use std::sync::Arc;
use tonic::Status;

/// Told what the engine reused from its cache and where the sequence sits,
/// once it is known (for the worker's counters and its cache report).
pub type OnCached = Box<dyn FnMut(super::CacheHit) + Send>;

/// The engine's own view of its load, when it reports one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests generating.
    pub running: u32,
    /// Requests waiting inside the engine.
    pub waiting: u32,
    /// Sequences it runs at once, when it says so.
    pub capacity: Option<u32>,
    /// KV cache in use, 0..=1, when it says so.
    pub kv_cache_usage: Option<f64>,
}

/// A model engine at the message level.
#[async_trait::async_trait]
pub trait ChatEngine: Send + Sync + 'static {
    /// `upstream`, ... (reported in `Info.engine`).
    fn name(&self) -> &'static str;
    /// Human-readable: what serves the model and where.
    fn description(&self) -> String;
    /// Tokens one request may hold (prompt plus completion).
    fn context_window(&self) -> u32;
    /// The engine's last reported load; `None` when it reports none or the
    /// report is stale.
    fn load(&self) -> Option<EngineLoad>;
    /// The prompt's token count with the engine's own template and
    /// tokenizer; `None` when the engine cannot count (its own 400 then
    /// catches an overflow).
    async fn count_prompt(&self, request: &pb::GenerateRequest) -> Result<Option<u32>, Status>;
    /// Whether the engine says which slot each request took
    /// ([`super::CacheHit::slot`]; the worker's cache report is then exact).
    fn has_slots(&self) -> bool {
        false
    }
    /// Whether it continues a moved generation (`GenerateRequest.resume`):
    /// the engine must continue a final assistant message rather than
    /// open a new turn after it.
    fn resumes(&self) -> bool {
        false
    }
    /// Sends the request and waits for the engine to accept it: a refusal
    /// (overload, invalid, context length) is a plain status here, before
    /// the stream opens, so the gateway may still retry elsewhere.
    /// `completion_limit` is `max_tokens`, or the rest of the window;
    /// `prompt_tokens` the count from [`ChatEngine::count_prompt`];
    /// `prompt_blocks` the prompt's prefix blocks
    /// ([`inference_proto::prefix`]), for an engine that places prompts.
    async fn start(
        &self,
        request: pb::GenerateRequest,
        prompt_blocks: &Arc<[u64]>,
        completion_limit: Option<u32>,
        prompt_tokens: Option<u32>,
        on_cached: OnCached,
    ) -> Result<Box<dyn Started>, Status>;
}
