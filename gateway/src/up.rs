//! `gateway up`: the whole service on one machine in one command.
//!
//! Starts one synthetic worker per model as a child process on a free
//! loopback port (the workers are SIMULATED engines; real fleets run
//! `worker serve` or an upstream engine per model), then serves the gateway
//! against them over real gRPC with the embedded in-process store.

use anyhow::{bail, Context};
use clap::Args;
use gateway::catalog::MODELS;
use gateway::config::{Config, ModelPool, StaticKey, StoreConfig};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct UpArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    #[arg(long, default_value = "127.0.0.1:9090")]
    admin_listen: String,
    /// The development key clients use (`Authorization: Bearer KEY`).
    #[arg(long, default_value = "sk-local-dev")]
    dev_key: String,
    /// Simulated time to first token of the local workers.
    #[arg(long, default_value_t = 80)]
    ttft_ms: u64,
    /// Simulated decode speed of the local workers (0 = unpaced).
    #[arg(long, default_value_t = 120)]
    tokens_per_second: u64,
}

pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let worker_bin = locate_worker()?;
    let mut models = BTreeMap::new();
    for model in MODELS {
        let addr = free_loopback_addr()?;
        start_worker(&worker_bin, model.id, &addr, &args)?;
        models.insert(
            model.id.to_string(),
            ModelPool {
                workers: vec![addr],
                policy: Default::default(),
            },
        );
    }
    let config = Config {
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
        keys: vec![StaticKey {
            sha256: gateway::auth::hash_key_hex(&args.dev_key),
            org: "org-local".into(),
            name: "dev".into(),
            plan: None,
            scopes: None,
            models: None,
        }],
        store: StoreConfig::default(),
        models,
        ..Config::defaults()
    };
    println!("Inference gateway (local, simulated workers)");
    println!("  base URL:  http://{}/v1", args.listen);
    println!("  API key:   {}", args.dev_key);
    println!("  metrics:   http://{}/metrics", args.admin_listen);
    println!(
        "  try:       curl http://{}/v1/chat/completions -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d '{{\"model\":\"base\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'",
        args.listen, args.dev_key
    );
    gateway::server::run(config)
}

/// The `worker` executable next to this one. Under `cargo run` (the
/// README's command builds only the gateway's package) a missing worker is
/// built with the same cargo and profile first, so one command is enough.
fn locate_worker() -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("locating the gateway executable")?;
    let worker = dir.join("worker");
    if worker.exists() {
        return Ok(worker);
    }
    let (Some(cargo), Some(manifest_dir)) = (
        std::env::var_os("CARGO"),
        std::env::var_os("CARGO_MANIFEST_DIR"),
    ) else {
        bail!(
            "the worker binary is missing at {}; build it with `cargo build --release --bins`",
            worker.display()
        );
    };
    let mut build = Command::new(cargo);
    build
        .current_dir(manifest_dir)
        .args(["build", "-p", "worker", "--bin", "worker"]);
    if dir.file_name().is_some_and(|name| name == "release") {
        build.arg("--release");
    }
    println!("Building the worker binary (first run)...");
    let status = build
        .status()
        .context("running cargo to build the worker")?;
    if !status.success() || !worker.exists() {
        bail!("building the worker failed; run `cargo build --release --bins`");
    }
    Ok(worker)
}

fn free_loopback_addr() -> anyhow::Result<String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// Spawns a worker that dies with this process, and waits for its ready line.
fn start_worker(
    bin: &std::path::Path,
    model: &str,
    addr: &str,
    args: &UpArgs,
) -> anyhow::Result<()> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "serve",
        "--model",
        model,
        "--engine",
        "synthetic",
        "--listen",
        addr,
    ])
    .args(["--ttft-ms", &args.ttft_ms.to_string()])
    .args(["--tokens-per-second", &args.tokens_per_second.to_string()])
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to send
    // SIGTERM to the child when this process exits, so workers never leak.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting the {model} worker"))?;
    let stdout = child.stdout.take().context("worker stdout")?;
    let started = Instant::now();
    let mut lines = BufReader::new(stdout).lines();
    while started.elapsed() < Duration::from_secs(30) {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("worker listening on") => {
                // Keep draining stdout so the worker never blocks on a full pipe.
                std::thread::spawn(move || for _ in lines {});
                return Ok(());
            }
            Some(Ok(_)) => continue,
            _ => break,
        }
    }
    bail!("the {model} worker did not become ready")
}
