//! llama.cpp's own `llama-server`, a real engine for the `upstream` worker:
//! the binary is `$LLAMA_SERVER`, else the path `scripts/llama-server.sh`
//! prints (it builds the server once into `target/` and answers from there
//! after), run on the reference model with `--metrics --jinja`.

use crate::process::{free_addr, ChildProcess, Spec};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `llama-server` binary, located (and built, the first time) once per
/// test process.
pub fn binary() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("LLAMA_SERVER").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    crate::model::script_path("llama-server.sh")
}

/// A running llama-server. Dropping it kills the process.
#[derive(Debug)]
pub struct LlamaServer {
    url: String,
    process: ChildProcess,
    http: reqwest::Client,
}

/// How a llama-server is started beyond its model: what the benchmarks
/// vary (threads, the host prompt cache, the binary).
#[derive(Debug, Clone)]
pub struct LlamaServerOpts {
    /// Tokens of context per slot.
    pub n_ctx: u32,
    pub slots: u32,
    pub threads: u32,
    /// The binary; `None`: [`binary`].
    pub binary: Option<PathBuf>,
    /// Further arguments (`--cache-ram 0`).
    pub extra_args: Vec<String>,
}

impl LlamaServerOpts {
    /// `slots` slots of `n_ctx` tokens each, one thread (tests run two
    /// engines at a time on 2 cores).
    pub fn new(n_ctx: u32, slots: u32) -> Self {
        Self {
            n_ctx,
            slots,
            threads: 1,
            binary: None,
            extra_args: Vec::new(),
        }
    }
}

impl LlamaServer {
    /// Starts llama-server on `model` with `parallel` slots of `n_ctx`
    /// tokens each and one thread; returns once its `/health` answers 200.
    pub async fn start(model: &Path, n_ctx: u32, parallel: u32) -> Result<LlamaServer> {
        Self::start_with(model, &LlamaServerOpts::new(n_ctx, parallel)).await
    }

    /// Starts llama-server on `model` as `opts` say, with `--metrics
    /// --jinja`; returns once its `/health` answers 200.
    pub async fn start_with(model: &Path, opts: &LlamaServerOpts) -> Result<LlamaServer> {
        let bin = match &opts.binary {
            Some(bin) => bin.clone(),
            None => binary()?,
        };
        let addr = free_addr()?;
        let (host, port) = addr.rsplit_once(':').context("free address")?;
        let mut args: Vec<String> = vec![
            "-c".into(),
            "exec \"$0\" \"$@\" 2>&1".into(),
            bin.display().to_string(),
            "-m".into(),
            model.display().to_string(),
            "--host".into(),
            host.into(),
            "--port".into(),
            port.into(),
            "-c".into(),
            (opts.n_ctx * opts.slots).to_string(),
            "-np".into(),
            opts.slots.to_string(),
            "-t".into(),
            opts.threads.to_string(),
            "--metrics".into(),
            "--jinja".into(),
        ];
        args.extend(opts.extra_args.iter().cloned());
        // Its log goes to stderr, folded into stdout here: the first line
        // means it started; `/health` says when it is ready.
        let (process, _) = ChildProcess::start(&Spec {
            name: "llama-server".into(),
            program: PathBuf::from("bash"),
            args,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready_prefix: String::new(),
            ready_timeout: Duration::from_secs(30),
        })?;
        let server = LlamaServer {
            url: format!("http://{addr}"),
            process,
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(r) = server
                .http
                .get(format!("{}/health", server.url))
                .send()
                .await
            {
                if r.status().is_success() {
                    return Ok(server);
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "llama-server did not become healthy:\n{}",
                    server.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn log_tail(&self) -> String {
        self.process.log_tail(4000)
    }

    /// The server's own (requests processing, requests deferred), from its
    /// Prometheus `/metrics`.
    pub async fn running_and_waiting(&self) -> Result<(u32, u32)> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await?
            .text()
            .await?;
        let gauge = |name: &str| -> u32 {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| l.strip_prefix(name))
                .filter_map(|rest| rest.split_whitespace().next())
                .filter_map(|v| v.parse::<f64>().ok())
                .map(|v| v as u32)
                .sum()
        };
        Ok((
            gauge("llamacpp:requests_processing"),
            gauge("llamacpp:requests_deferred"),
        ))
    }

    /// Slots busy generating, from `/slots`.
    pub async fn busy_slots(&self) -> Result<usize> {
        let slots: Value = self
            .http
            .get(format!("{}/slots", self.url))
            .send()
            .await?
            .json()
            .await?;
        Ok(slots
            .as_array()
            .map(|s| s.iter().filter(|s| s["is_processing"] == true).count())
            .unwrap_or(0))
    }
}
