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

impl LlamaServer {
    /// Starts llama-server on `model` with `parallel` slots of `n_ctx`
    /// tokens each and one thread (tests run two at a time on 2 cores);
    /// returns once its `/health` answers 200.
    pub async fn start(model: &Path, n_ctx: u32, parallel: u32) -> Result<LlamaServer> {
        let bin = binary()?;
        let addr = free_addr()?;
        let (host, port) = addr.rsplit_once(':').context("free address")?;
        let args: Vec<String> = vec![
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
            (n_ctx * parallel).to_string(),
            "-np".into(),
            parallel.to_string(),
            "-t".into(),
            "1".into(),
            "--metrics".into(),
            "--jinja".into(),
        ];
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
        let deadline = Instant::now() + Duration::from_secs(60);
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
