//! One `gateway serve` process with a TOML config the harness writes.

use crate::process::{free_addr, ChildProcess, Spec};
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
use toml::{Table, Value};

/// The digest `keys[].sha256` wants (what `gateway hash-key KEY` prints).
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// A new key of `org` on `plan`, as `[[keys]]` config lines, and its secret.
pub fn key_on_plan(org: &str, plan: &str) -> (String, String) {
    let secret = format!("sk-test-{org}-{}", crate::random_hex(8));
    let toml = format!(
        "[[keys]]\nsha256 = \"{}\"\norg = \"{org}\"\nname = \"{org}\"\nplan = \"{plan}\"\n",
        hash_key(&secret)
    );
    (toml, secret)
}

/// An API key the gateway accepts, with the account it belongs to.
#[derive(Debug, Clone)]
pub struct TestKey {
    /// The secret a client sends as `Authorization: Bearer <key>`.
    pub key: String,
    pub org: String,
    pub name: String,
}

impl TestKey {
    /// A fresh random key (`sk-test-...`) of organisation `org`.
    pub fn random(org: &str) -> Self {
        Self {
            key: format!("sk-test-{}", crate::random_hex(24)),
            org: org.into(),
            name: "test".into(),
        }
    }
}

/// How to configure a gateway. `Default`: one random key, embedded store,
/// no workers (a [`crate::Stack`] fills them in).
#[derive(Debug, Clone)]
pub struct GatewayOpts {
    /// Worker addresses (`127.0.0.1:PORT`) per model id. Models absent here
    /// are left out of the config.
    pub workers: BTreeMap<String, Vec<String>>,
    /// Keys written to `[[keys]]`; the first is what [`crate::Client`] sends.
    pub keys: Vec<TestKey>,
    /// `Some((url, key_prefix))` puts the gateway on Redis; `None` keeps the
    /// embedded in-process store.
    pub redis: Option<(String, String)>,
    /// Public listener threads (`threads`); `None` keeps the gateway default.
    pub threads: Option<usize>,
    pub grace_period_seconds: Option<u64>,
    /// More config, merged into the generated TOML: tables merge key by key,
    /// arrays (such as `[[keys]]`) are appended to, other values replace.
    /// Features configure themselves here without changing the harness.
    pub extra_toml: String,
    /// `RUST_LOG` for the process (default `info,pingora_core=warn`).
    pub rust_log: Option<String>,
    pub env: Vec<(String, String)>,
    /// Run on this lab host (its own network namespace and address)
    /// instead of loopback.
    pub host: Option<crate::netlab::Host>,
    /// Serve HTTPS with this certificate (`[tls]`); `base_url` is then
    /// `https://`.
    pub tls: Option<crate::certs::CertFiles>,
    /// Run this `gateway` binary instead of the build's (another commit's
    /// build, for a before/after in one run).
    pub binary: Option<PathBuf>,
}

impl Default for GatewayOpts {
    fn default() -> Self {
        Self {
            workers: BTreeMap::new(),
            keys: vec![TestKey::random("org-test")],
            redis: None,
            threads: None,
            grace_period_seconds: None,
            extra_toml: String::new(),
            rust_log: None,
            env: Vec::new(),
            host: None,
            tls: None,
            binary: None,
        }
    }
}

impl GatewayOpts {
    /// The config file text for a gateway on `listen` / `admin`.
    pub fn config_toml(&self, listen: &str, admin: &str) -> Result<String> {
        let mut root = Table::new();
        root.insert("listen".into(), listen.into());
        root.insert("admin_listen".into(), admin.into());
        if let Some(t) = self.threads {
            root.insert("threads".into(), Value::Integer(t as i64));
        }
        if let Some(g) = self.grace_period_seconds {
            root.insert("grace_period_seconds".into(), Value::Integer(g as i64));
        }
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                let mut t = Table::new();
                t.insert("sha256".into(), hash_key(&k.key).into());
                t.insert("org".into(), k.org.clone().into());
                t.insert("name".into(), k.name.clone().into());
                Value::Table(t)
            })
            .collect();
        root.insert("keys".into(), Value::Array(keys));
        if let Some((url, prefix)) = &self.redis {
            let mut store = Table::new();
            store.insert("redis_url".into(), url.clone().into());
            store.insert("key_prefix".into(), prefix.clone().into());
            root.insert("store".into(), Value::Table(store));
        }
        let mut models = Table::new();
        for (model, workers) in &self.workers {
            let mut pool = Table::new();
            pool.insert(
                "workers".into(),
                Value::Array(workers.iter().map(|w| w.clone().into()).collect()),
            );
            models.insert(model.clone(), Value::Table(pool));
        }
        root.insert("models".into(), Value::Table(models));
        if let Some(tls) = &self.tls {
            let mut t = Table::new();
            t.insert(
                "cert_file".into(),
                tls.cert_file.display().to_string().into(),
            );
            t.insert("key_file".into(), tls.key_file.display().to_string().into());
            root.insert("tls".into(), Value::Table(t));
        }
        if !self.extra_toml.trim().is_empty() {
            let extra: Table = toml::from_str(&self.extra_toml).with_context(|| {
                format!("GatewayOpts.extra_toml is not TOML:\n{}", self.extra_toml)
            })?;
            merge(&mut root, extra);
        }
        Ok(toml::to_string(&root)?)
    }
}

/// Merges `extra` into `base`: tables recursively, arrays appended, the rest replaced.
fn merge(base: &mut Table, extra: Table) {
    for (k, v) in extra {
        match (base.get_mut(&k), v) {
            (Some(Value::Table(b)), Value::Table(e)) => merge(b, e),
            (Some(Value::Array(b)), Value::Array(e)) => b.extend(e),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A running gateway. Dropping it kills the process.
#[derive(Debug)]
pub struct Gateway {
    addr: String,
    admin_addr: String,
    opts: GatewayOpts,
    config_path: PathBuf,
    process: Option<ChildProcess>,
}

impl Gateway {
    /// Writes the config, starts `gateway serve` on free ports and waits for
    /// `gateway listening on ...`.
    pub fn start(opts: GatewayOpts) -> Result<Gateway> {
        let mut last_err = None;
        for _ in 0..3 {
            let (addr, admin_addr) = (free_addr()?, free_addr()?);
            let (addr, admin_addr) = match &opts.host {
                Some(host) => (on_host(host, &addr), on_host(host, &admin_addr)),
                None => (addr, admin_addr),
            };
            let config_path = crate::bins::log_root().join(format!(
                "gateway-{}-{}.toml",
                std::process::id(),
                crate::random_hex(8)
            ));
            match Self::start_with(&opts, &addr, &admin_addr, &config_path) {
                Ok(process) => {
                    return Ok(Gateway {
                        addr,
                        admin_addr,
                        opts,
                        config_path,
                        process: Some(process),
                    })
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("gateway did not start")))
    }

    fn start_with(
        opts: &GatewayOpts,
        addr: &str,
        admin: &str,
        config_path: &PathBuf,
    ) -> Result<ChildProcess> {
        if let Some(dir) = config_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(config_path, opts.config_toml(addr, admin)?)
            .with_context(|| format!("writing {}", config_path.display()))?;
        let mut env = vec![(
            "RUST_LOG".to_string(),
            opts.rust_log
                .clone()
                .unwrap_or_else(|| "info,pingora_core=warn".into()),
        )];
        env.extend(opts.env.iter().cloned());
        let binary = match &opts.binary {
            Some(path) => path.clone(),
            None => crate::bins::bin("gateway")?,
        };
        let (program, args) = crate::netlab::on(
            opts.host.as_ref(),
            binary,
            vec![
                "serve".into(),
                "--config".into(),
                config_path.display().to_string(),
            ],
        );
        let spec = Spec {
            name: "gateway".into(),
            program,
            args,
            env,
            env_remove: [
                "GATEWAY_CONFIG",
                "GATEWAY_LISTEN",
                "GATEWAY_ADMIN_LISTEN",
                "GATEWAY_THREADS",
                "GATEWAY_REDIS_URL",
                "GATEWAY_KEY_PREFIX",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            ready_prefix: "gateway listening on".into(),
            ready_timeout: Duration::from_secs(30),
        };
        Ok(ChildProcess::start(&spec)?.0)
    }

    /// `http://127.0.0.1:PORT/v1` (`https://` with [`GatewayOpts::tls`]):
    /// what SDKs take as `base_url`.
    pub fn base_url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}/v1", self.addr)
    }

    /// `127.0.0.1:PORT` of the public listener (for raw sockets).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://127.0.0.1:PORT` of the admin listener (`/metrics`, `/healthz`, `/readyz`).
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }

    /// The first configured key (what [`crate::Client`] sends).
    pub fn api_key(&self) -> &str {
        self.opts.keys.first().map(|k| k.key.as_str()).unwrap_or("")
    }

    pub fn keys(&self) -> &[TestKey] {
        &self.opts.keys
    }

    pub fn opts(&self) -> &GatewayOpts {
        &self.opts
    }

    /// The config file the gateway runs with.
    pub fn config_path(&self) -> &PathBuf {
        &self.config_path
    }

    /// A client for the public API with the first key.
    pub fn client(&self) -> crate::Client {
        crate::Client::new(&self.base_url(), Some(self.api_key()))
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildProcess::pid)
    }

    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(ChildProcess::is_running)
    }

    /// Sends a signal (`libc::SIGTERM` to drain).
    pub fn signal(&self, signal: i32) {
        if let Some(p) = &self.process {
            p.signal(signal);
        }
    }

    pub fn kill(&mut self) {
        // Keep the handle: its log stays readable for failure messages.
        if let Some(p) = self.process.as_mut() {
            p.kill();
        }
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.as_mut()?.wait_exit(timeout)
    }

    /// Kills the gateway if it runs and starts it again on the same ports
    /// with the same config (a replica restart).
    pub fn restart(&mut self) -> Result<()> {
        let (opts, addr, admin, config) =
            (&self.opts, &self.addr, &self.admin_addr, &self.config_path);
        crate::process::restart_in_place(&mut self.process, "gateway", || {
            Self::start_with(opts, addr, admin, config)
        })
    }

    /// The tail of the gateway's log, for assertion messages.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(4000))
            .unwrap_or_else(|| "(gateway is not running)".into())
    }

    /// CPU time of the gateway process so far, in microseconds.
    pub fn cpu_micros(&self) -> Result<u64> {
        crate::procfs::cpu_micros(self.pid().context("gateway is not running")?)
    }

    /// GET on the admin listener: `(status, body)`.
    pub async fn admin_get(&self, path: &str) -> Result<(u16, String)> {
        let resp = reqwest::Client::new()
            .get(format!("{}{path}", self.admin_url()))
            .send()
            .await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// Generations of `model` moved off a failed worker with `outcome`
    /// (`moved`, `refused`, `failed`), every reason together.
    pub async fn generation_moves(&self, model: &str, outcome: &str) -> f64 {
        let (_, page) = self.admin_get("/metrics").await.expect("metrics");
        let (model, outcome) = (
            format!("model=\"{model}\""),
            format!("outcome=\"{outcome}\""),
        );
        page.lines()
            .filter(|l| l.starts_with("gateway_generation_moves_total{"))
            .filter(|l| l.contains(&model) && l.contains(&outcome))
            .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
            // An empty f64 sum is -0.
            .fold(0.0, |total, n| total + n)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
        if !std::thread::panicking() && !crate::process::keep_logs() {
            let _ = std::fs::remove_file(&self.config_path);
        }
    }
}

/// `loopback:port` moved to the lab host's address (a fresh namespace has
/// every port free).
fn on_host(host: &crate::netlab::Host, loopback: &str) -> String {
    let port = loopback.rsplit(':').next().unwrap_or("0");
    format!("{}:{port}", host.ip)
}

/// A gateway over the given workers (any models, any flags), with
/// `extra_toml`: for tests that shape the pool themselves.
pub fn gateway_over<W: std::borrow::Borrow<crate::Worker>>(
    workers: &[W],
    extra_toml: &str,
) -> Gateway {
    let mut opts = GatewayOpts {
        extra_toml: extra_toml.to_string(),
        ..GatewayOpts::default()
    };
    for w in workers {
        let w = w.borrow();
        opts.workers
            .entry(w.model().to_string())
            .or_default()
            .push(w.addr().to_string());
    }
    Gateway::start(opts).expect("gateway starts")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_toml_merges_tables_and_appends_arrays() {
        let mut opts = GatewayOpts::default();
        opts.workers
            .insert("base".into(), vec!["127.0.0.1:1".into()]);
        opts.extra_toml = r#"
            read_timeout_seconds = 5
            [[keys]]
            sha256 = "00"
            [models.base]
            policy = "least_loaded"
        "#
        .into();
        let text = opts.config_toml("127.0.0.1:2", "127.0.0.1:3").unwrap();
        let t: Table = toml::from_str(&text).unwrap();
        assert_eq!(t["read_timeout_seconds"].as_integer(), Some(5));
        assert_eq!(t["keys"].as_array().unwrap().len(), 2);
        assert_eq!(
            t["keys"][0]["sha256"].as_str().unwrap(),
            hash_key(&opts.keys[0].key)
        );
        assert_eq!(t["models"]["base"]["policy"].as_str(), Some("least_loaded"));
        assert_eq!(
            t["models"]["base"]["workers"][0].as_str(),
            Some("127.0.0.1:1")
        );
        assert_eq!(t["listen"].as_str(), Some("127.0.0.1:2"));
    }

    #[test]
    fn hash_matches_sha256_hex() {
        assert_eq!(
            hash_key("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
