//! Gateway configuration: a TOML file, then environment overrides.
//! The keys and defaults are documented in `docs/process-contract.md`.

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

/// The public listener's certificate (`[tls]`). Both files are PEM and
/// read again whenever their contents change (checked every 2 s): new
/// connections get the new certificate, open ones keep theirs, and a pair
/// that does not load is logged and the previous one kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: std::path::PathBuf,
    /// How long a client has from connecting to finishing its TLS
    /// handshake before the connection is closed (Pingora's own limit is
    /// 60 s).
    #[serde(default = "default_handshake_timeout_seconds")]
    pub handshake_timeout_seconds: u64,
}

fn default_handshake_timeout_seconds() -> u64 {
    10
}

/// TLS to the workers (`[worker_tls]`), whose addresses are then reached
/// over `https` (`host:port` or `https://host:port`). Read at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerTlsConfig {
    /// PEM of the CA(s) the workers' certificates must chain to.
    pub ca_file: std::path::PathBuf,
    /// The gateway's client certificate (PEM), for workers started with
    /// `--tls-client-ca`; goes with `key_file`.
    #[serde(default)]
    pub cert_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub key_file: Option<std::path::PathBuf>,
    /// The name checked on every worker's certificate instead of the
    /// address's host (needed when `dns://`/`k8s://` resolve to IPs).
    #[serde(default)]
    pub server_name: Option<String>,
}

/// Planner mode (`[planner]`). Every duration is in milliseconds; the
/// defaults are sized for real agents on the internet.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlannerConfig {
    /// Connecting to an agent (TCP and TLS).
    pub connect_timeout_ms: u64,
    /// From sending a request to an agent to the response head.
    pub first_byte_timeout_ms: u64,
    /// Longest silence inside an agent's response body or event stream.
    pub idle_timeout_ms: u64,
    /// One agent call, start to end.
    pub step_timeout_ms: u64,
    /// Soft deadline: a step still running after this starts its alternate
    /// (a hedge); the first good answer wins, the other is cancelled.
    pub hedge_after_ms: u64,
    /// Wall clock of a plan's execution (plan, steps, re-plans); the
    /// synthesis that follows has `synthesis_timeout_ms` more.
    pub run_timeout_ms: u64,
    pub synthesis_timeout_ms: u64,
    /// Steps one run may execute (plans are capped at 8 steps each).
    pub max_steps: u32,
    /// Re-plans after failed steps.
    pub max_replans: u32,
    /// Tokens (input + output) of every model call of one run; past it no
    /// further step or re-plan starts.
    pub max_run_tokens: u64,
    /// Output tokens of one plan or re-plan call (its grammar is sized to
    /// fit).
    pub max_plan_tokens: u32,
    /// Output tokens of one `llm` step: an intermediate result quoted into
    /// later prompts, so far shorter than an answer (a small model left
    /// unbounded runs on to the cap).
    pub max_step_tokens: u32,
    /// Output tokens of the answer when the request sets no `max_tokens`:
    /// a planner answer summarises what was gathered, and a small model
    /// left unbounded can run on until the synthesis deadline.
    pub max_answer_tokens: u32,
    /// Largest agent response body (or event stream) read; beyond, the
    /// step fails.
    pub max_response_bytes: usize,
    /// Largest agent card read.
    pub max_card_bytes: usize,
    /// Bytes of one step's output quoted into later prompts.
    pub max_step_output_bytes: usize,
    /// How long a fetched card is trusted (a failed fetch: a tenth of it,
    /// at most 30 s).
    pub card_ttl_seconds: u64,
    /// How long a paused plan waits for its tool results.
    pub session_ttl_seconds: u64,
    /// Keep-alive comments on a planner stream while nothing else is sent.
    pub keepalive_ms: u64,
    /// Agents on loopback, RFC 1918, CGNAT and unique-local addresses.
    /// Off by default: a request's `agents` could otherwise reach inside
    /// the network.
    pub allow_private_addresses: bool,
    /// Link-local addresses, cloud metadata endpoints included
    /// (169.254.169.254). Off by default; rarely right to turn on.
    pub allow_link_local: bool,
    /// Private addresses allowed without `allow_private_addresses`: CIDRs
    /// or addresses (`10.0.0.0/8`, `fd00::/8`), host names
    /// (`agents.ns.svc.cluster.local`) and `*.domain` patterns
    /// (`*.svc.cluster.local`), whose resolved addresses may be private.
    /// Never opens link-local or metadata addresses (`allow_link_local`)
    /// nor the reserved ranges.
    pub allowed_networks: Vec<String>,
    /// Whether a request's `agents` may name URLs (not only directory ids).
    pub allow_request_urls: bool,
    /// Most agents discovered in the directory for one request.
    pub max_discovered: usize,
    /// Directory entries of this config (besides Redis, `gateway agents`).
    pub agents: Vec<AgentEntryConfig>,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 3_000,
            first_byte_timeout_ms: 30_000,
            idle_timeout_ms: 30_000,
            step_timeout_ms: 120_000,
            hedge_after_ms: 15_000,
            run_timeout_ms: 300_000,
            synthesis_timeout_ms: 120_000,
            max_steps: 16,
            max_replans: 2,
            max_run_tokens: 200_000,
            max_plan_tokens: 2_048,
            max_step_tokens: 512,
            max_answer_tokens: 1_024,
            max_response_bytes: 1024 * 1024,
            max_card_bytes: 256 * 1024,
            max_step_output_bytes: 16 * 1024,
            card_ttl_seconds: 300,
            session_ttl_seconds: 24 * 3600,
            keepalive_ms: 10_000,
            allow_private_addresses: false,
            allow_link_local: false,
            allowed_networks: Vec::new(),
            allow_request_urls: true,
            max_discovered: 4,
            agents: Vec::new(),
        }
    }
}

/// One agent of the directory in the config file (`[[planner.agents]]`).
/// Also the agent directory's stored form (`planner::directory::Entry`):
/// one shape for an entry wherever it comes from.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntryConfig {
    /// Directory id (`[A-Za-z0-9._-]`, at most 64): what `agents` may name.
    pub id: String,
    /// The agent's base URL (its card at `/.well-known/agent-card.json`)
    /// or the card's own URL.
    pub url: String,
    /// A header sent on every call to the agent (e.g. `authorization`)...
    #[serde(default)]
    pub auth_header: Option<String>,
    /// ...whose value is read from this environment variable (a secret),
    /// never from the file or Redis.
    #[serde(default)]
    pub auth_secret_env: Option<String>,
    /// Hosts (`host` for any port, or `host:port`) besides the URL's own
    /// origin that the agent's card may name as its endpoint. Empty: the
    /// card must stay on the URL's origin (scheme, host and port), so the
    /// auth header never goes to a host the operator did not name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
}

/// Whether `s` is a host (`name`, `1.2.3.4`, `[::1]`) with an optional
/// `:port`: what `allowed_hosts` takes.
pub fn valid_allowed_host(s: &str) -> bool {
    let Ok(authority) = s.parse::<http::uri::Authority>() else {
        return false;
    };
    !s.is_empty() && !s.contains('@') && authority.as_str() == s && !authority.host().is_empty()
}

fn default_true() -> bool {
    true
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
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            ping_interval_seconds: default_ws_ping_interval(),
            idle_timeout_seconds: default_ws_idle_timeout(),
        }
    }
}

fn default_ws_ping_interval() -> u64 {
    30
}
fn default_ws_idle_timeout() -> u64 {
    900
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
    /// `prefix_affinity` (default: requests sharing a prefix or session stick
    /// to one worker while its load allows) or `least_loaded`.
    #[serde(default)]
    pub policy: PoolPolicy,
    /// When every worker is busy, how long a request may wait in the
    /// gateway's queue for one before a 503 `server_overloaded`.
    #[serde(default = "default_queue_timeout_ms")]
    pub queue_timeout_ms: u64,
    /// How many requests may wait in that queue (503 beyond).
    #[serde(default = "default_queue_max_depth")]
    pub queue_max_depth: u32,
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
    #[default]
    PrefixAffinity,
    /// The worker whose engine holds the longest part of the prompt (as
    /// the workers report their prefix caches), weighed against its load;
    /// never a queue while another worker is idle.
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
        if self.websocket.ping_interval_seconds == 0 || self.websocket.idle_timeout_seconds == 0 {
            bail!("websocket.ping_interval_seconds and websocket.idle_timeout_seconds must be at least 1");
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
        let mut agent_ids = std::collections::BTreeSet::new();
        for a in &self.planner.agents {
            let id_ok = !a.id.is_empty()
                && a.id.len() <= 64
                && a.id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !id_ok {
                bail!(
                    "planner.agents: id '{}' must be 1 to 64 of A-Z a-z 0-9 . _ -",
                    a.id
                );
            }
            if !agent_ids.insert(a.id.as_str()) {
                bail!("planner.agents: id '{}' appears twice", a.id);
            }
            if !(a.url.starts_with("http://") || a.url.starts_with("https://")) {
                bail!("planner.agents '{}': url must be http:// or https://", a.id);
            }
            if a.auth_header.is_some() != a.auth_secret_env.is_some() {
                bail!(
                    "planner.agents '{}': auth_header and auth_secret_env go together",
                    a.id
                );
            }
            if let Some(h) = a.allowed_hosts.iter().find(|h| !valid_allowed_host(h)) {
                bail!(
                    "planner.agents '{}': allowed_hosts entry '{h}' must be a host or host:port",
                    a.id
                );
            }
        }
        // `planner.allowed_networks` is parsed by the planner when it is
        // built (`planner::net::AddressPolicy::new`), which stops the start
        // on a bad entry with the same message.
        let p = &self.planner;
        if p.step_timeout_ms == 0 || p.run_timeout_ms == 0 || p.first_byte_timeout_ms == 0 {
            bail!("planner: step, run and first-byte timeouts must be above 0");
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint {
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                bail!(
                    "telemetry.otlp_endpoint must be an http:// or https:// URL, got '{endpoint}'"
                );
            }
        }
        if let Some(w) = &self.worker_tls {
            if w.cert_file.is_some() != w.key_file.is_some() {
                bail!("worker_tls: cert_file and key_file go together");
            }
            if w.server_name
                .as_deref()
                .is_some_and(|n| n.trim().is_empty())
            {
                bail!("worker_tls.server_name must not be empty");
            }
        }
        if self.store.redis_cluster && self.store.redis_url.is_none() {
            bail!("store.redis_cluster = true needs store.redis_url (the cluster's seed nodes)");
        }
        Ok(())
    }
}

/// `true`/`1`/`yes`/`on` or `false`/`0`/`no`/`off` (any case).
fn parse_bool(v: &str) -> anyhow::Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" | "" => Ok(false),
        other => bail!("expected true or false, got '{other}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_gets_defaults_and_env_overrides() {
        let mut c: Config = toml::from_str("[models.base]\nworkers = [\"127.0.0.1:1\"]\n").unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080");
        assert!(c.store.redis_url.is_none());
        c.apply_env(|k| (k == "GATEWAY_REDIS_URL").then(|| "redis://127.0.0.1/".to_string()))
            .unwrap();
        assert_eq!(c.store.redis_url.as_deref(), Some("redis://127.0.0.1/"));
        assert!(c.check().is_ok());
        assert!(!c.store.redis_cluster);
        c.apply_env(|k| (k == "GATEWAY_REDIS_CLUSTER").then(|| "true".to_string()))
            .unwrap();
        assert!(c.store.redis_cluster);
        assert!(c
            .apply_env(|k| (k == "GATEWAY_REDIS_CLUSTER").then(|| "maybe".to_string()))
            .is_err());
        let e = toml::from_str::<Config>(
            "[store]\nredis_cluster = true\n[models.base]\nworkers = []\n",
        )
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs store.redis_url"), "{e}");
        c.admin_listen = c.listen.clone();
        let e = c.check().unwrap_err().to_string();
        assert!(e.contains("must differ"), "{e}");
    }

    #[test]
    fn telemetry_defaults_file_and_env() {
        let mut c: Config = toml::from_str("[models.base]\nworkers = []\n").unwrap();
        assert_eq!(c.telemetry.otlp_endpoint, None);
        assert_eq!(c.telemetry.service_name, "gateway");
        let mut c2: Config = toml::from_str(
            "[telemetry]\notlp_endpoint = \"http://collector:4317\"\n[models.base]\nworkers = []\n",
        )
        .unwrap();
        assert_eq!(
            c2.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4317")
        );
        assert!(c2.check().is_ok());
        // The env var overrides the file; empty turns export off.
        c2.apply_env(|k| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(String::new))
            .unwrap();
        assert_eq!(c2.telemetry.otlp_endpoint, None);
        c.apply_env(|k| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://10.0.0.1:4317".into()),
            "OTEL_SERVICE_NAME" => Some("gw-eu".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://10.0.0.1:4317")
        );
        assert_eq!(c.telemetry.service_name, "gw-eu");
        c.telemetry.otlp_endpoint = Some("collector:4317".into());
        assert!(c.check().is_err());
    }

    #[test]
    fn planner_agents_are_checked() {
        let base = "[models.base]\nworkers = []\n";
        let ok: Config = toml::from_str(&format!(
            "[planner]\nrun_timeout_ms = 5000\n[[planner.agents]]\nid = \"weather\"\nurl = \"https://w.example\"\n{base}"
        ))
        .unwrap();
        assert!(ok.check().is_ok());
        assert_eq!(ok.planner.run_timeout_ms, 5000);
        assert_eq!(ok.planner.hedge_after_ms, 15_000, "defaults fill the rest");
        for bad in [
            "id = \"has space\"\nurl = \"https://w\"",
            "id = \"w\"\nurl = \"ftp://w\"",
            "id = \"w\"\nurl = \"https://w\"\nauth_header = \"authorization\"",
        ] {
            let c: Config = toml::from_str(&format!("[[planner.agents]]\n{bad}\n{base}")).unwrap();
            assert!(c.check().is_err(), "{bad}");
        }
        assert!(toml::from_str::<Config>(&format!("[planner]\nbogus = 1\n{base}")).is_err());
        let allowed: Config = toml::from_str(&format!(
            "[planner]\nallowed_networks = [\"10.0.0.0/8\", \"*.svc.cluster.local\"]\n{base}"
        ))
        .unwrap();
        assert!(allowed.check().is_ok());
    }

    #[test]
    fn added_models_need_a_window_and_prices_and_a_good_name() {
        let c: Config = toml::from_str(
            "[models.llama-70b]\nworkers = []\ncontext_window = 8192\ninput_price = 0.6\noutput_price = 0.8\nimage_input = true\ndescription = \"Llama 3.3 70B\"\n[models.base]\nworkers = []\n",
        )
        .unwrap();
        c.check().unwrap();
        let added = c.added_models().unwrap();
        assert_eq!(added.len(), 1);
        let l = &added[0];
        assert_eq!((l.id.as_str(), l.context_window), ("llama-70b", 8192));
        assert!((l.price.cached_input - 0.06).abs() < 1e-12, "10 % of input");
        assert!(l.image_input && !l.reasoning_budget);
        let catalog = c.catalog().unwrap();
        assert_eq!(catalog.models().len(), 4);
        assert_eq!(
            catalog.find("llama-70b").unwrap().description,
            "Llama 3.3 70B"
        );
        let refused = |toml: &str| {
            toml::from_str::<Config>(toml)
                .unwrap()
                .check()
                .unwrap_err()
                .to_string()
        };
        let e =
            refused("[models.llama-70b]\nworkers = []\ninput_price = 1.0\noutput_price = 1.0\n");
        assert!(
            e.contains("models.llama-70b: context_window is required"),
            "{e}"
        );
        let e =
            refused("[models.llama-70b]\nworkers = []\ncontext_window = 8192\ninput_price = 1.0\n");
        assert!(e.contains("output_price"), "{e}");
        let e = refused("[models.x]\nworkers = []\ncontext_window = 8\ninput_price = -1.0\noutput_price = 1.0\n");
        assert!(
            e.contains("input_price must be a number of at least 0"),
            "{e}"
        );
        let e = refused("[models.Llama]\nworkers = []\ncontext_window = 8192\ninput_price = 1.0\noutput_price = 1.0\n");
        assert!(e.contains("'Llama'") && e.contains("a-z 0-9"), "{e}");
        let e = refused("[models.base]\nworkers = []\ncontext_window = 8192\n");
        assert!(e.contains("are the spec's for base"), "{e}");
        let e = refused(&format!(
            "[[keys]]\nsha256 = \"{}\"\nmodels = [\"llama-8b\"]\n[models.base]\nworkers = []\n",
            "0".repeat(64)
        ));
        assert!(e.contains("keys[].models names 'llama-8b'"), "{e}");
        let e = refused("[models.gpt]\nworkers = []\n");
        assert!(
            e.contains("does not offer") && e.contains("context_window"),
            "{e}"
        );
    }

    #[test]
    fn tls_sections_parse_and_worker_client_files_go_together() {
        let base = "[models.base]\nworkers = []\n";
        let c: Config = toml::from_str(&format!(
            "[tls]\ncert_file = \"/s/tls.crt\"\nkey_file = \"/s/tls.key\"\n\
             [worker_tls]\nca_file = \"/w/ca.crt\"\ncert_file = \"/w/c.crt\"\n\
             key_file = \"/w/c.key\"\nserver_name = \"worker.ns.svc\"\n{base}"
        ))
        .unwrap();
        assert!(c.check().is_ok());
        assert_eq!(c.tls.unwrap().key_file, Path::new("/s/tls.key"));
        assert_eq!(
            c.worker_tls.unwrap().server_name.as_deref(),
            Some("worker.ns.svc")
        );
        let plain: Config = toml::from_str(base).unwrap();
        assert!(plain.tls.is_none() && plain.worker_tls.is_none());
        let half: Config = toml::from_str(&format!(
            "[worker_tls]\nca_file = \"/w/ca.crt\"\ncert_file = \"/w/c.crt\"\n{base}"
        ))
        .unwrap();
        let e = half.check().unwrap_err().to_string();
        assert!(e.contains("go together"), "{e}");
        assert!(toml::from_str::<Config>(&format!("[tls]\ncert_file = \"x\"\n{base}")).is_err());
        assert!(toml::from_str::<Config>(&format!(
            "[tls]\ncert_file = \"x\"\nkey_file = \"y\"\nca = 1\n{base}"
        ))
        .is_err());
    }

    #[test]
    fn unknown_model_and_bad_hash_are_rejected() {
        let c: Config = toml::from_str("[models.gpt]\nworkers = []\n").unwrap();
        assert!(c.check().is_err());
        let c: Config =
            toml::from_str("[[keys]]\nsha256 = \"abc\"\n[models.base]\nworkers = []\n").unwrap();
        assert!(c.check().is_err());
    }
}
