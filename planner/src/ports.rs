//! What the planner needs from its host, and nothing else: model calls,
//! a store for paused plans, and a store of directory entries. The gateway
//! implements them (its generation driver, Redis or memory); tests
//! implement them in a few lines.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

/// One message of a model call's conversation, as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

impl Turn {
    pub fn new(role: &str, text: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            text: text.into(),
        }
    }
}

/// One model call of a run: a plan, a repair, a re-plan, an `llm` step or
/// the synthesis.
#[derive(Debug, Clone)]
pub struct Call {
    pub messages: Vec<Turn>,
    /// A JSON Schema the reply must follow.
    pub schema: Option<Value>,
    /// 0 = up to the model's window.
    pub max_tokens: u32,
    pub deadline: Instant,
}

/// What a call answered.
#[derive(Debug, Clone)]
pub struct Reply {
    pub text: String,
    pub output_tokens: u32,
    /// The call ended at its `max_tokens` (or the window), not by itself.
    pub at_length: bool,
}

/// Why a model call failed, as far as the planner cares.
pub trait CallFailure: Send {
    /// The call could not run at all (a limit, the budget, no capacity):
    /// on a run's first call, nothing was done yet, so the run fails with
    /// it rather than answering around it.
    fn refused(&self) -> bool;
    /// What happened, for a person (quoted in `tool_thought` and
    /// `thought`).
    fn message(&self) -> &str;
}

/// The model calls of one planner request: the request's own model, its
/// limits, billing and cancellation are the host's business.
pub trait ModelCalls: Sync {
    type Error: CallFailure;

    /// Runs one call to its end; text deltas also go to `deltas` as they
    /// arrive (the streamed answer).
    fn call(
        &self,
        call: Call,
        deltas: Option<&UnboundedSender<String>>,
    ) -> impl Future<Output = Result<Reply, Self::Error>> + Send;

    /// Tokens of every call so far (input plus output): the run's budget.
    fn tokens_used(&self) -> u64;
}

/// A store that failed or could not be reached.
#[derive(Debug)]
pub struct StoreUnavailable(pub Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for StoreUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for StoreUnavailable {}

/// A store's answer.
pub type StoreResult<T> = Result<T, StoreUnavailable>;

/// Where paused plans wait for their tool results, and the lock that makes
/// a second request on a busy session a 409 rather than a second run over
/// the same plan. Keys are opaque (the host scopes them to a tenant).
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Takes the session's lock for `ttl` unless someone holds it.
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool>;
    /// Drops the lock if `token` still holds it.
    async fn unlock(&self, key: &str, token: &str) -> StoreResult<()>;
    /// Extends the lock to `ttl` from now if `token` still holds it.
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool>;
    /// How long the lock is held for yet (`None`: free).
    async fn lock_left(&self, key: &str) -> StoreResult<Option<Duration>>;
    /// The paused plan's state (JSON), if any.
    async fn load(&self, key: &str) -> StoreResult<Option<String>>;
    async fn save(&self, key: &str, state: &str, ttl: Duration) -> StoreResult<()>;
    async fn clear(&self, key: &str) -> StoreResult<()>;
}

/// Directory entries kept beside the config's (`gateway agents ...`).
#[async_trait]
pub trait DirectoryStore: Send + Sync {
    /// Every stored entry, as the JSON of an
    /// [`AgentEntry`](crate::agents::AgentEntry) (an entry that does not
    /// parse is skipped).
    async fn list(&self) -> StoreResult<Vec<String>>;
}
