//! `[models.*]`: each model's worker pool, its routing and queue, and its
//! catalogue entry.

use crate::catalog::{AddedModel, Price};
use anyhow::bail;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPool {
    /// gRPC addresses of this model's workers: `host:port`, `http://host:port`,
    /// `dns://name:port`, or `k8s://[namespace/]service:port` (a Service's
    /// ready endpoints from the Kubernetes API); the last two are
    /// re-resolved every few seconds.
    pub workers: Vec<String>,
    /// `cache_aware` (default: on what the engines hold and how fast they
    /// prefill), `prefix_affinity` (requests sharing a prefix or session
    /// stick to one worker while its load allows) or `least_loaded`.
    #[serde(default)]
    pub policy: PoolPolicy,
    /// When every worker is busy, how long a request may wait in the
    /// gateway's queue for one before a 503 `server_overloaded`.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// How many requests may wait in that queue (503 beyond).
    #[serde(default = "default_queue_max_depth")]
    pub queue_max_depth: u32,
    /// A worker that sends nothing for this long once a generation has
    /// started (its engine stuck, its link alive) is taken as failed: the
    /// generation moves to another worker.
    #[serde(default = "default_stall_timeout_ms")]
    pub stall_timeout_ms: u64,
    /// The tiers whose running generations a waiting request of a higher
    /// tier preempts when every worker slot is taken: stopped on their
    /// worker and resumed (their clients see a pause) once a slot frees.
    /// `flex` by default; `default` may be added; `priority` never.
    #[serde(default = "default_preempt_tiers")]
    pub preempt_tiers: Vec<PreemptibleTier>,
    /// Times one generation may be preempted (0: never).
    #[serde(default = "default_max_preemptions")]
    pub max_preemptions: u32,
    /// The catalogue fields below describe a model id beyond the spec's
    /// three (whose facts are the spec's: setting any of these on `base`,
    /// `base-ultra` or `base-mini` is refused). Context window in tokens;
    /// required for an added id.
    #[serde(default)]
    pub context_window: Option<u32>,
    /// US dollars per million input tokens; required for an added id.
    #[serde(default)]
    pub input_price: Option<f64>,
    /// US dollars per million cached input tokens (default: 10 % of
    /// `input_price`).
    #[serde(default)]
    pub cached_input_price: Option<f64>,
    /// US dollars per million output tokens (reasoning included); required
    /// for an added id.
    #[serde(default)]
    pub output_price: Option<f64>,
    /// `thinking_budget` / `reasoning.budget_tokens` accepted (default false).
    #[serde(default)]
    pub reasoning_budget: Option<bool>,
    /// Image parts accepted on chat completions (default false).
    #[serde(default)]
    pub image_input: Option<bool>,
    /// One line for the Codex catalogue (default: empty).
    #[serde(default)]
    pub description: Option<String>,
}

/// A tier whose generations may be preempted (never `priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptibleTier {
    Default,
    Flex,
}

/// How a pool picks a worker for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolPolicy {
    /// The less loaded of two random workers.
    LeastLoaded,
    /// Requests sharing a prefix, cache key or session stick to one worker
    /// while its load allows.
    PrefixAffinity,
    /// The worker with the lowest expected time to first token: what its
    /// engine holds of the prompt (as the workers report their prefix
    /// caches), the wait for a slot, and the engine's measured prefill.
    /// The default: it won the routing family (BENCHMARKS.md, routebench).
    #[default]
    CacheAware,
}

impl ModelPool {
    /// A pool of `workers` with the default policy and no catalogue fields.
    pub fn of(workers: Vec<String>) -> Self {
        Self {
            workers,
            policy: PoolPolicy::default(),
            queue_timeout_ms: default_queue_timeout_ms(),
            queue_max_depth: default_queue_max_depth(),
            stall_timeout_ms: default_stall_timeout_ms(),
            preempt_tiers: default_preempt_tiers(),
            max_preemptions: default_max_preemptions(),
            context_window: None,
            input_price: None,
            cached_input_price: None,
            output_price: None,
            reasoning_budget: None,
            image_input: None,
            description: None,
        }
    }

    /// Whether any catalogue field is set.
    pub(super) fn has_catalogue_fields(&self) -> bool {
        self.context_window.is_some()
            || self.input_price.is_some()
            || self.cached_input_price.is_some()
            || self.output_price.is_some()
            || self.reasoning_budget.is_some()
            || self.image_input.is_some()
            || self.description.is_some()
    }

    /// The catalogue entry of an added id `id`, checked: a window and the
    /// input and output prices are required, prices are finite and not
    /// negative.
    pub(super) fn added_model(&self, id: &str) -> anyhow::Result<AddedModel> {
        let Some(context_window) = self.context_window else {
            bail!(
                "models.{id}: context_window is required for a model id beyond base, base-ultra and base-mini"
            );
        };
        if context_window == 0 {
            bail!("models.{id}: context_window must be at least 1");
        }
        let price = |field: &str, v: Option<f64>| -> anyhow::Result<f64> {
            let Some(v) = v else {
                bail!("models.{id}: {field} (US dollars per million tokens) is required for a model id beyond base, base-ultra and base-mini");
            };
            if !v.is_finite() || v < 0.0 {
                bail!("models.{id}: {field} must be a number of at least 0, got {v}");
            }
            Ok(v)
        };
        let input = price("input_price", self.input_price)?;
        let output = price("output_price", self.output_price)?;
        let cached_input = match self.cached_input_price {
            Some(v) => price("cached_input_price", Some(v))?,
            None => input / 10.0,
        };
        Ok(AddedModel {
            id: id.to_owned(),
            description: self.description.clone().unwrap_or_default(),
            context_window,
            image_input: self.image_input.unwrap_or(false),
            reasoning_budget: self.reasoning_budget.unwrap_or(false),
            price: Price {
                input,
                cached_input,
                output,
            },
        })
    }
}

fn default_queue_timeout_ms() -> u64 {
    30_000
}
fn default_stall_timeout_ms() -> u64 {
    30_000
}
fn default_preempt_tiers() -> Vec<PreemptibleTier> {
    vec![PreemptibleTier::Flex]
}
fn default_max_preemptions() -> u32 {
    2
}
fn default_queue_max_depth() -> u32 {
    1024
}
