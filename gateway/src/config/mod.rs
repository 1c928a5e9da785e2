//! Gateway configuration: a TOML file, then environment overrides.
//! The keys and defaults are documented in `docs/process-contract.md`.
//!
//! [`Config::check`] is the one check of a loaded config; a section with
//! rules of its own keeps them beside it (`tls.rs`: `[tls]` and
//! `[worker_tls]`; the planner crate's `PlannerConfig::check`: `[planner]`)
//! and the check calls them in turn.

mod limits;
mod pools;
mod store;
mod telemetry;
#[cfg(test)]
mod tests;
mod tls;
mod websocket;

pub use limits::{LimitsConfig, OnStoreFailure, OrgConfig, RatePlanConfig, StaticKey};
pub use planner::PlannerConfig;
pub use pools::{ModelPool, PoolPolicy, PreemptibleTier};
pub use store::StoreConfig;
pub use telemetry::TelemetryConfig;
pub use tls::{ListenerTlsConfig, WorkerTlsConfig};
pub use websocket::WebSocketConfig;

use crate::catalog::{self, AddedModel, Catalog};
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
fn default_request_timeout() -> u64 {
    600
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
