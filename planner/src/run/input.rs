//! What a new run starts from: the caller's conversation as text turns
//! (the host renders tool calls and results as text, tool results quoted
//! with [`quote`](super::text::quote)), its tools, its agents and what
//! `tool_choice` asks; and what a resumed run receives.

use super::plan::{ToolDemand, ToolTarget};
pub use crate::ports::Turn;

/// What a new run starts from.
#[derive(Debug, Clone)]
pub struct RunInput {
    pub conversation: Vec<Turn>,
    /// The last user message's text.
    pub last_user: String,
    pub tools: Vec<ToolTarget>,
    /// The request's `agents`.
    pub agents: Vec<String>,
    /// What the request's `tool_choice` asks of the first plan.
    pub demand: ToolDemand,
    /// The answer's output cap (0: the model's window).
    pub max_tokens: u32,
}

/// A trailing `tool` message of a request: the result of a call the
/// session's paused plan waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The message's index in the request (what a 400 names).
    pub index: usize,
    pub call_id: String,
    pub text: String,
}
