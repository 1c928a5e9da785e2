//! Gateway configuration: a TOML file, then environment overrides.
//! The keys and defaults are documented in `docs/process-contract.md`.
//!
//! [`Config::check`] is the one check of a loaded config; a section with
//! rules of its own keeps them beside it (`tls.rs`: `[tls]` and
//! `[worker_tls]`; the planner crate's `PlannerConfig::check`: `[planner]`)
//! and the check calls them in turn.

#[cfg(test)]
mod tests;
mod tls;

pub use planner::PlannerConfig;
pub use tls::{ListenerTlsConfig, WorkerTlsConfig};

use crate::catalog::{self, AddedModel, Catalog, Price};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_admin_listen")]
    pub admin_listen: String,
    /// Threads of the public listener's runtime.
    #[serde(default = "default_threads")]
    pub threads: usize,
    /// SIGTERM: how long open streams may take to finish.
    #[serde(default = "default_grace")]
    pub grace_period_seconds: u64,
    /// SIGTERM: how long `/readyz` fails before the drain waits only for
    /// in-flight work (gives load balancers time to notice).
    #[serde(default = "default_readiness_drain")]
    pub readiness_drain_millis: u64,
    /// Largest request body accepted (413 beyond). The default fits a
    /// 1M-token prompt with room for JSON escaping.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: usize,
    /// Largest request header block accepted (431 beyond).
    #[serde(default = "default_max_header")]
    pub max_header_bytes: usize,
    /// Time allowed to receive a request's headers and body.
    #[serde(default = "default_read_timeout")]
    pub read_timeout_seconds: u64,
    /// Time one write to a client may wait for it to drain its socket; a
    /// client that stops reading loses its stream after this, freeing the
    /// worker and its concurrency slot.
    #[serde(default = "default_write_timeout")]
    pub write_timeout_seconds: u64,
    /// Upper bound on one generation, start to last token.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_seconds: u64,
    #[serde(default)]
    pub keys: Vec<StaticKey>,
    #[serde(default)]
    pub store: StoreConfig,
    /// Named plans (`[plans.NAME]`); a plan set in Redis with `gateway plans
    /// set` takes precedence over the one of the same name here.
    #[serde(default)]
    pub plans: BTreeMap<String, RatePlanConfig>,
    /// Organisation settings for the embedded mode (`[orgs.NAME]`); with
    /// Redis, `gateway orgs ...` manages them there.
    #[serde(default)]
    pub orgs: BTreeMap<String, OrgConfig>,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Responses over WebSocket (`[websocket]`): keep-alive pings and the
    /// idle timeout of an upgraded `GET /v1/responses`.
    #[serde(default)]
    pub websocket: WebSocketConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// The shared token the workers require (`worker serve --auth-token`),
    /// sent as `authorization: Bearer <token>` on every call. Best set with
    /// `GATEWAY_WORKER_TOKEN` from a secret rather than in this file.
    #[serde(default)]
    pub worker_token: Option<String>,
    /// Planner mode (`[planner]`): deadlines, budgets, safety, the agent
    /// directory's config entries.
    #[serde(default)]
    pub planner: PlannerConfig,
    /// HTTPS on the public listener (`[tls]`); absent = plain HTTP.
    #[serde(default)]
    pub tls: Option<ListenerTlsConfig>,
    /// TLS, optionally mutual, on the gRPC channels to the workers
    /// (`[worker_tls]`); absent = h2c.
    #[serde(default)]
    pub worker_tls: Option<WorkerTlsConfig>,
    pub models: BTreeMap<String, ModelPool>,
}

/// Distributed tracing (`[telemetry]`). Every request gets a `tracing`
/// span and a W3C trace context sent to its worker; spans are exported
/// over OTLP/gRPC only when an endpoint is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`; absent =
    /// export nothing. Env: `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported spans. Env: `OTEL_SERVICE_NAME`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: default_service_name(),
        }
    }
}

impl TelemetryConfig {
    /// The standard OpenTelemetry variables override the file.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) {
        if let Some(v) = get(telemetry::OTLP_ENDPOINT_ENV) {
            self.otlp_endpoint = Some(v).filter(|s| !s.trim().is_empty());
        }
        if let Some(v) = get(telemetry::SERVICE_NAME_ENV).filter(|s| !s.trim().is_empty()) {
            self.service_name = v;
        }
    }
}

fn default_service_name() -> String {
    "gateway".into()
}

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

/// `[websocket]`: the timers of a Responses WebSocket connection. Its
/// message size bound is `max_body_bytes` and each write's bound is
/// `write_timeout_seconds`, as for any request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSocketConfig {
    /// A connection with no response running and nothing sent either way
    /// for this long gets a ping; a ping unanswered for as long again ends
    /// the connection (a peer that vanished without closing).
    #[serde(default = "default_ws_ping_interval")]
    pub ping_interval_seconds: u64,
    /// A connection on which no `response.create` arrived (and none ran)
    /// for this long is closed (1000, "idle timeout"): pings keep a dead
    /// peer from holding it, this keeps an idle live one from doing so.
    #[serde(default = "default_ws_idle_timeout")]
    pub idle_timeout_seconds: u64,
    /// The longest a connection lives: past it, once no response is
    /// running, it is closed (1001, "connection lifetime reached") and the
    /// client reconnects, as it does on OpenAI's 60-minute limit. Bounds
    /// how long one connection pins its replica and its connection-local
    /// state.
    #[serde(default = "default_ws_max_connection")]
    pub max_connection_seconds: u64,
    /// The most connections one key holds open on this replica at once (an
    /// upgrade past it: 429 `too_many_connections`); 0: no cap. Each costs
    /// memory for as long as it is open, whatever its plan's rate limits.
    #[serde(default = "default_ws_max_connections_per_key")]
    pub max_connections_per_key: u32,
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            ping_interval_seconds: default_ws_ping_interval(),
            idle_timeout_seconds: default_ws_idle_timeout(),
            max_connection_seconds: default_ws_max_connection(),
            max_connections_per_key: default_ws_max_connections_per_key(),
        }
    }
}

fn default_ws_ping_interval() -> u64 {
    30
}
fn default_ws_idle_timeout() -> u64 {
    900
}
fn default_ws_max_connection() -> u64 {
    3600
}
fn default_ws_max_connections_per_key() -> u32 {
    64
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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS;
    /// absent = the embedded in-process store. With `redis_cluster`, one
    /// or more seed nodes of the cluster, separated by commas.
    pub redis_url: Option<String>,
    /// `redis_url` names nodes of a Redis Cluster (cluster mode enabled):
    /// commands go to the primary serving each key's slot, following the
    /// cluster's redirects. Database 0 only.
    #[serde(default)]
    pub redis_cluster: bool,
    /// PEM file of the CA that signed the Redis server's certificate (for
    /// `rediss://`); absent = the system's trusted roots.
    #[serde(default)]
    pub redis_ca_file: Option<std::path::PathBuf>,
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// How long stored responses (object, input items, event log) are kept.
    #[serde(default = "default_storage_window")]
    pub storage_window_seconds: u64,
    /// How long an `Idempotency-Key` of a generation create is remembered
    /// (its outcome replayed to a retry with the same key and body).
    #[serde(default = "default_idempotency_window")]
    pub idempotency_window_seconds: u64,
    /// The largest reply an idempotency record keeps (a chat completion,
    /// or an unstored response object); a larger success pins its key
    /// without a replayable reply (409 `idempotency_result_not_kept`).
    #[serde(default = "default_idempotency_max_record_bytes")]
    pub idempotency_max_record_bytes: usize,
    /// The embedded store only: the most bytes of idempotency records kept
    /// in the gateway's memory; past it the least recently used finished
    /// records go (a retry of an evicted key runs again).
    #[serde(default = "default_idempotency_max_memory_bytes")]
    pub idempotency_max_memory_bytes: usize,
    /// A run whose lease is not renewed within this is taken for dead and
    /// failed by another replica's sweeper.
    #[serde(default = "default_lease_millis")]
    pub lease_millis: u64,
    /// How often a replica renews the leases of its runs (one round trip).
    #[serde(default = "default_heartbeat_millis")]
    pub heartbeat_millis: u64,
    /// How often a replica looks for runs with expired leases.
    #[serde(default = "default_sweep_millis")]
    pub sweep_interval_millis: u64,
    /// While a background run's worker is quiet, how often its owner checks
    /// for a cancel from another replica (between batches it learns of it
    /// from every write).
    #[serde(default = "default_cancel_poll_millis")]
    pub cancel_poll_millis: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            redis_cluster: false,
            redis_ca_file: None,
            key_prefix: default_key_prefix(),
            storage_window_seconds: default_storage_window(),
            idempotency_window_seconds: default_idempotency_window(),
            idempotency_max_record_bytes: default_idempotency_max_record_bytes(),
            idempotency_max_memory_bytes: default_idempotency_max_memory_bytes(),
            lease_millis: default_lease_millis(),
            heartbeat_millis: default_heartbeat_millis(),
            sweep_interval_millis: default_sweep_millis(),
            cancel_poll_millis: default_cancel_poll_millis(),
        }
    }
}

fn default_storage_window() -> u64 {
    30 * 24 * 3600
}
fn default_idempotency_window() -> u64 {
    24 * 3600
}
fn default_idempotency_max_record_bytes() -> usize {
    1 << 20
}
fn default_idempotency_max_memory_bytes() -> usize {
    64 << 20
}
fn default_lease_millis() -> u64 {
    10_000
}
fn default_heartbeat_millis() -> u64 {
    2_000
}
fn default_sweep_millis() -> u64 {
    1_000
}
fn default_cancel_poll_millis() -> u64 {
    150
}

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
    fn has_catalogue_fields(&self) -> bool {
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
    fn added_model(&self, id: &str) -> anyhow::Result<AddedModel> {
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

fn default_listen() -> String {
    "127.0.0.1:8080".into()
}
fn default_admin_listen() -> String {
    "127.0.0.1:9090".into()
}
fn default_threads() -> usize {
    2
}
fn default_grace() -> u64 {
    10
}
fn default_readiness_drain() -> u64 {
    2000
}
fn default_max_body() -> usize {
    16 * 1024 * 1024
}
fn default_max_header() -> usize {
    64 * 1024
}
fn default_read_timeout() -> u64 {
    30
}
fn default_write_timeout() -> u64 {
    30
}
fn default_queue_timeout_ms() -> u64 {
    30_000
}
fn default_stall_timeout_ms() -> u64 {
    30_000
}
fn default_queue_max_depth() -> u32 {
    1024
}
fn default_request_timeout() -> u64 {
    600
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
fn default_key_prefix() -> String {
    "igw:".into()
}

impl Config {
    /// Every default, with no models: a base for configs built in code.
    pub fn defaults() -> Self {
        Self {
            listen: default_listen(),
            admin_listen: default_admin_listen(),
            threads: default_threads(),
            grace_period_seconds: default_grace(),
            readiness_drain_millis: default_readiness_drain(),
            max_body_bytes: default_max_body(),
            max_header_bytes: default_max_header(),
            read_timeout_seconds: default_read_timeout(),
            write_timeout_seconds: default_write_timeout(),
            request_timeout_seconds: default_request_timeout(),
            keys: Vec::new(),
            store: StoreConfig::default(),
            plans: BTreeMap::new(),
            orgs: BTreeMap::new(),
            limits: LimitsConfig::default(),
            websocket: WebSocketConfig::default(),
            telemetry: TelemetryConfig::default(),
            worker_token: None,
            planner: PlannerConfig::default(),
            tls: None,
            worker_tls: None,
            models: BTreeMap::new(),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading config {}", path.display()))?;
        let mut config: Config =
            toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))?;
        config.apply_env(|k| std::env::var(k).ok())?;
        config.check()?;
        Ok(config)
    }

    /// Environment overrides, for containers where a mounted file is awkward.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> anyhow::Result<()> {
        if let Some(v) = get("GATEWAY_LISTEN") {
            self.listen = v;
        }
        if let Some(v) = get("GATEWAY_ADMIN_LISTEN") {
            self.admin_listen = v;
        }
        if let Some(v) = get("GATEWAY_THREADS") {
            self.threads = v.parse().context("GATEWAY_THREADS")?;
        }
        if let Some(v) = get("GATEWAY_REDIS_URL") {
            self.store.redis_url = Some(v).filter(|s| !s.is_empty());
        }
        if let Some(v) = get("GATEWAY_REDIS_CLUSTER") {
            self.store.redis_cluster = parse_bool(&v).context("GATEWAY_REDIS_CLUSTER")?;
        }
        if let Some(v) = get("GATEWAY_REDIS_CA_FILE") {
            self.store.redis_ca_file =
                Some(v.into()).filter(|p: &std::path::PathBuf| !p.as_os_str().is_empty());
        }
        if let Some(v) = get("GATEWAY_KEY_PREFIX") {
            self.store.key_prefix = v;
        }
        if let Some(v) = get("GATEWAY_WORKER_TOKEN") {
            self.worker_token = Some(v).filter(|s| !s.is_empty());
        }
        self.telemetry.apply_env(&get);
        Ok(())
    }

    /// The models this config serves beyond the spec's three, checked:
    /// each `[models.NAME]` is a spec id without catalogue fields, or a
    /// valid new id with them.
    pub fn added_models(&self) -> anyhow::Result<Vec<AddedModel>> {
        let mut added = Vec::new();
        for (id, pool) in &self.models {
            if catalog::is_spec_model(id) {
                if pool.has_catalogue_fields() {
                    bail!(
                        "models.{id}: context_window, prices, capabilities and description are the spec's for {id}; set them only on model ids you add"
                    );
                }
                continue;
            }
            if !catalog::valid_model_id(id) {
                bail!(
                    "config names model '{id}': a model id is 1 to 64 of a-z 0-9 . _ - starting with a letter or digit"
                );
            }
            if !pool.has_catalogue_fields() {
                bail!(
                    "config names model '{id}', which the service does not offer; to add it, give [models.{id}] a context_window, input_price and output_price"
                );
            }
            added.push(pool.added_model(id)?);
        }
        Ok(added)
    }

    /// The catalogue: the spec's three and this config's added ids.
    pub fn catalog(&self) -> anyhow::Result<Catalog> {
        Ok(Catalog::with_added(self.added_models()?))
    }

    /// Every rule of the config, in order: the first broken one is the
    /// error (the sections' own rules are their `check`).
    fn check(&self) -> anyhow::Result<()> {
        let added = self.added_models()?;
        for m in self.keys.iter().flat_map(|k| k.models.iter().flatten()) {
            if !catalog::is_spec_model(m) && !added.iter().any(|a| a.id == *m) {
                bail!("keys[].models names '{m}', which the service does not offer");
            }
        }
        for k in &self.keys {
            if k.sha256.len() != 64 || !k.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("keys[].sha256 must be 64 hex digits (see `gateway hash-key`)");
            }
        }
        for (name, plan) in &self.plans {
            if let Some(tier) = &plan.max_service_tier {
                if !matches!(tier.as_str(), "priority" | "default" | "flex") {
                    bail!("plans.{name}.max_service_tier must be priority, default or flex, got '{tier}'");
                }
            }
            if plan.weight.is_some_and(|w| !(1..=1000).contains(&w)) {
                bail!("plans.{name}.weight must be 1 to 1000");
            }
        }
        if self.threads == 0 {
            bail!("threads must be at least 1");
        }
        if self.write_timeout_seconds == 0 {
            bail!("write_timeout_seconds must be at least 1");
        }
        let ws = &self.websocket;
        if ws.ping_interval_seconds == 0
            || ws.idle_timeout_seconds == 0
            || ws.max_connection_seconds == 0
        {
            bail!("websocket.ping_interval_seconds, idle_timeout_seconds and max_connection_seconds must be at least 1");
        }
        // Pingora listens with SO_REUSEPORT: one address for both would
        // start fine and then split connections between the API and the
        // admin endpoints at random.
        if self.listen == self.admin_listen {
            bail!(
                "listen and admin_listen must differ (both are {})",
                self.listen
            );
        }
        self.planner.check()?;
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                bail!(
                    "telemetry.otlp_endpoint must be an http:// or https:// URL, got '{endpoint}'"
                );
            }
        }
        if let Some(w) = &self.worker_tls {
            w.check()?;
        }
        if self.store.idempotency_window_seconds == 0 {
            bail!("store.idempotency_window_seconds must be at least 1");
        }
        if self.store.redis_cluster && self.store.redis_url.is_none() {
            bail!("store.redis_cluster = true needs store.redis_url (the cluster's seed nodes)");
        }
        for (name, pool) in &self.models {
            if pool.stall_timeout_ms < MIN_STALL_TIMEOUT_MS {
                bail!(
                    "models.{name}.stall_timeout_ms must be at least {MIN_STALL_TIMEOUT_MS}: a worker sends a non-streamed reply's output once a second, and a shorter silence is no stall"
                );
            }
        }
        Ok(())
    }
}

/// The shortest silence taken for a stalled worker: twice the period at
/// which a worker sends a batched (non-streamed) reply's output.
const MIN_STALL_TIMEOUT_MS: u64 = 2000;

/// `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off` (any case).
fn parse_bool(v: &str) -> anyhow::Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" | "" => Ok(false),
        other => bail!("expected true or false, got '{other}'"),
    }
}
