//! Gateway configuration: a TOML file, then environment overrides.
//! The keys and defaults are documented in `docs/process-contract.md`.

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
    /// Upper bound on one generation, start to last token.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_seconds: u64,
    #[serde(default)]
    pub keys: Vec<StaticKey>,
    #[serde(default)]
    pub store: StoreConfig,
    pub models: BTreeMap<String, ModelPool>,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://host:port/db`; absent = the embedded in-process store.
    pub redis_url: Option<String>,
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            key_prefix: default_key_prefix(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPool {
    /// gRPC addresses of this model's workers: `host:port`, `http://host:port`,
    /// or `dns://name:port` (re-resolved every few seconds).
    pub workers: Vec<String>,
    /// `prefix_affinity` (default: requests sharing a prefix or session stick
    /// to one worker while its load allows) or `least_loaded`.
    #[serde(default)]
    pub policy: crate::pool::Policy,
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
fn default_request_timeout() -> u64 {
    600
}
fn default_org() -> String {
    "org-default".into()
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
            request_timeout_seconds: default_request_timeout(),
            keys: Vec::new(),
            store: StoreConfig::default(),
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
        if let Some(v) = get("GATEWAY_KEY_PREFIX") {
            self.store.key_prefix = v;
        }
        Ok(())
    }

    fn check(&self) -> anyhow::Result<()> {
        for id in self.models.keys() {
            if crate::catalog::find(id).is_none() {
                bail!("config names model '{id}', which the service does not offer");
            }
        }
        for k in &self.keys {
            if k.sha256.len() != 64 || !k.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("keys[].sha256 must be 64 hex digits (see `gateway hash-key`)");
            }
        }
        if self.threads == 0 {
            bail!("threads must be at least 1");
        }
        Ok(())
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
