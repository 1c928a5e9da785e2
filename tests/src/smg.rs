//! SMG 1.13 (`smg` on PyPI, installed by `scripts/smg.sh`), the peer router
//! the benchmarks run beside this gateway: its binary, its process group,
//! and the wait until it has registered its workers.

use crate::Client;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `smg` command, installed once into a venv under `target/`.
pub fn binary() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/smg.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/smg.sh")?;
    if !out.status.success() {
        bail!("scripts/smg.sh failed");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A router started in its own process group (`Command::process_group(0)`),
/// killed as a whole when dropped, so no router outlives its run (a
/// leftover keeps its Prometheus port).
pub struct ProcessGroup(pub Child);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: signals the process group this struct started and owns.
        unsafe {
            libc::killpg(self.0.id() as i32, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// SMG answers `/health` before it has registered the workers: polls
/// `GET /workers` until `engines` are there and healthy.
pub async fn workers_ready(admin: &Client, engines: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(reply) = admin.get("/workers").await {
            let healthy = serde_json::from_slice::<Value>(&reply.body)
                .ok()
                .and_then(|v| v["workers"].as_array().cloned())
                .map(|ws| ws.iter().filter(|w| w["is_healthy"] == true).count());
            if healthy == Some(engines) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("SMG did not register {engines} healthy workers");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The model id an OpenAI-compatible engine reports on `/v1/models`
/// (llama-server: its file name): SMG routes by it.
pub async fn engine_model_id(engine_url: &str) -> Result<String> {
    let models: Value = reqwest::Client::new()
        .get(format!("{engine_url}/v1/models"))
        .send()
        .await?
        .json()
        .await?;
    Ok(models["data"][0]["id"]
        .as_str()
        .context("the engine lists no model")?
        .to_owned())
}

/// SMG 1.13 running in front of some engines.
pub struct Launched {
    /// `http://host:port`, without `/v1`.
    pub base: String,
    /// The process group leader (its CPU: [`crate::procfs::group_cpu_micros`]).
    pub pgid: u32,
    pub group: ProcessGroup,
}

/// Starts `smg launch` in front of `engine_urls` (with `policy`, else its
/// default), logging to `$TMPDIR/<log_name>`, and waits until it has
/// registered every engine as healthy.
pub async fn launch(
    engine_urls: &[String],
    policy: Option<&str>,
    log_name: &str,
) -> Result<Launched> {
    use std::os::unix::process::CommandExt;
    let listen = crate::process::free_addr()?;
    let prometheus = crate::process::free_addr()?;
    let (host, port) = listen.rsplit_once(':').context("free address")?;
    let (_, prom_port) = prometheus.rsplit_once(':').context("free address")?;
    let log = std::fs::File::create(std::env::temp_dir().join(log_name))?;
    let mut cmd = Command::new(binary()?);
    cmd.args(["launch", "--host", host, "--port", port]);
    if let Some(policy) = policy {
        cmd.args(["--policy", policy]);
    }
    let child = cmd
        .arg("--worker-urls")
        .args(engine_urls)
        .args([
            "--prometheus-port",
            prom_port,
            "--prometheus-host",
            "127.0.0.1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .process_group(0)
        .spawn()
        .context("starting SMG")?;
    let pgid = child.id();
    let group = ProcessGroup(child);
    let base = format!("http://{listen}");
    workers_ready(&Client::new(&base, None), engine_urls.len()).await?;
    Ok(Launched { base, pgid, group })
}
