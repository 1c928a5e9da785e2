//! `[limits]`, `[plans.*]`, `[orgs.*]` and `[[keys]]`: who may call, and
//! how much.

use serde::Deserialize;

/// One plan's limits per organisation and model; 0 means unlimited.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatePlanConfig {
    #[serde(default)]
    pub rpm: u32,
    #[serde(default)]
    pub tpm: u64,
    #[serde(default)]
    pub max_concurrent: u32,
    /// Output tokens reserved on admission when a request sets no `max_tokens`.
    #[serde(default)]
    pub default_max_tokens: u32,
    /// The highest `service_tier` the plan's requests are served at:
    /// `priority`, `default` (the default) or `flex`.
    #[serde(default)]
    pub max_service_tier: Option<String>,
    /// The organisation's share of a saturated pool within its tier
    /// (default 1).
    #[serde(default)]
    pub weight: Option<u32>,
    /// The most bytes of stored responses (`store: true`) the organisation
    /// may keep; 0: no cap.
    #[serde(default)]
    pub max_stored_bytes: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrgConfig {
    #[serde(default)]
    pub blocked: bool,
    #[serde(default)]
    pub blocked_reason: String,
    /// Spending budget in US dollars; past it requests get 402.
    pub budget_usd: Option<f64>,
}

/// What the limiter does when Redis (the global truth) cannot be reached.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnStoreFailure {
    /// Keep serving under this replica's own in-process limits (the default:
    /// an outage of the limiter store must not take the API down).
    #[default]
    FailOpenLocal,
    /// Refuse generation requests with 503 until Redis is back.
    FailClosed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default)]
    pub on_store_failure: OnStoreFailure,
    /// How long a key looked up in Redis is trusted before it is read again
    /// (revocations also arrive at once over pub/sub; this bounds a missed one).
    #[serde(default = "default_key_cache_ttl")]
    pub key_cache_ttl_ms: u64,
    /// Plan of keys that name none.
    #[serde(default = "default_plan_name")]
    pub default_plan: String,
    /// The longest one concurrency slot is held. A slot is a lease renewed
    /// by its replica (`store.lease_millis`, `store.heartbeat_millis`), so
    /// a crashed replica's slots free within one lease; a live replica
    /// renews a slot until its request's deadline plus a lease, and never
    /// past this (the default, 900 s, is above that deadline: it only
    /// matters set lower).
    #[serde(default = "default_concurrency_ttl")]
    pub concurrency_ttl_seconds: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            on_store_failure: OnStoreFailure::default(),
            key_cache_ttl_ms: default_key_cache_ttl(),
            default_plan: default_plan_name(),
            concurrency_ttl_seconds: default_concurrency_ttl(),
        }
    }
}

/// A key from the config file, stored as the sha256 of the secret.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticKey {
    pub sha256: String,
    #[serde(default = "default_org")]
    pub org: String,
    #[serde(default)]
    pub name: String,
    /// Plan name; absent = `limits.default_plan`.
    #[serde(default)]
    pub plan: Option<String>,
    /// Scopes (`models.read`, `chat.write`, `responses.write`,
    /// `responses.read`, `planner`); absent = all of them.
    #[serde(default)]
    pub scopes: Option<Vec<String>>,
    /// Model allow-list; absent = every model.
    #[serde(default)]
    pub models: Option<Vec<String>>,
}

fn default_org() -> String {
    "org-default".into()
}
fn default_key_cache_ttl() -> u64 {
    5000
}
fn default_plan_name() -> String {
    "default".into()
}
fn default_concurrency_ttl() -> u64 {
    900
}
