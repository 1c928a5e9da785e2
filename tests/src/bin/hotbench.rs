//! `hotbench`: what each front costs per request on its hot path, side by
//! side in one run: this gateway (in front of an `upstream` worker), SMG
//! 1.13 (`smg launch`, scripts/smg.sh) and nginx as a plain keep-alive
//! proxy, all before the same engine (`steady_engine.rs`: keep-alive, a
//! fixed six-token reply in microseconds), all driven by `wrk` with the
//! same connections and body. The figure is the front's own CPU time (user
//! plus system, every process of it) per request, from `/proc`, beside the
//! requests/s and latency `wrk` saw; for the gateway, its worker's CPU is
//! printed beside (the engine adapter, not part of the front). The
//! `messages` front is the same gateway driven with the Anthropic Messages
//! API (`POST /v1/messages`, `x-api-key`) instead of chat completions,
//! with the very same body bytes (`max_tokens`, one user message): the
//! cost of the Messages route beside a chat completion's.
//!
//! `--gateway-bin-before PATH` adds the front `gateway @before`: that
//! gateway binary (another commit's build) with the same worker, engine
//! and config, driven as `gateway` is, right after it: a before/after of
//! the gateway in one run.
//!
//! ```text
//! cargo run --release -p tests --bin hotbench -- --duration 10
//! cargo run --release -p tests --bin hotbench -- --fronts gateway --gateway-bin-before OLD/gateway
//! ```

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use harness::process::{free_addr, ChildProcess, Spec};
use harness::smg::ProcessGroup;
use harness::steady_engine::{SteadyEngine, MODEL};
use harness::{Gateway, GatewayOpts, Worker, WorkerOpts};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The model the gateway serves (one of the service's own ids), its worker
/// relaying to the engine's.
const GATEWAY_MODEL: &str = "base";

#[derive(Parser, Debug)]
#[command(about = "CPU per request of the gateway, SMG 1.13 and nginx before one engine")]
struct Args {
    /// Seconds of measured load per front and mode.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Connections `wrk` keeps open.
    #[arg(long, default_value_t = 8)]
    connections: u32,
    /// Rounds of every front and mode, alternating.
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "nginx,smg,gateway,messages,floor"
    )]
    fronts: Vec<Front>,
    /// Another gateway binary, run as the front `gateway @before` (added
    /// after `gateway` unless `--fronts` names `before`).
    #[arg(long)]
    gateway_bin_before: Option<PathBuf>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Front {
    Nginx,
    Smg,
    Gateway,
    /// `--gateway-bin-before`'s gateway, driven as [`Front::Gateway`].
    Before,
    /// The gateway, driven with `POST /v1/messages`.
    Messages,
    /// `floor_proxy` (Pingora HTTP/1 and a tonic call to the same worker,
    /// nothing else): the floor of the gateway's architecture. One body
    /// only: it writes no streams.
    Floor,
}

impl Front {
    fn label(self) -> &'static str {
        match self {
            Front::Nginx => "nginx (keep-alive proxy)",
            Front::Smg => "SMG 1.13",
            Front::Gateway => "gateway",
            Front::Before => "gateway @before",
            Front::Messages => "gateway, Anthropic Messages",
            Front::Floor => "floor (Pingora + tonic, no features)",
        }
    }
}

/// The processes of a front.
#[derive(Clone, Copy)]
enum Cpu {
    /// Every process of a group it leads (nginx, SMG and its helpers).
    Group(u32),
    /// One process (the gateway).
    Process(u32),
}

impl Cpu {
    fn micros(self) -> Result<u64> {
        match self {
            Cpu::Group(pgid) => harness::procfs::group_cpu_micros(pgid),
            Cpu::Process(pid) => harness::procfs::cpu_micros(pid),
        }
    }
}

/// A front running before the engine.
struct Running {
    base: String,
    key: Option<String>,
    /// Whose CPU is the front's.
    front: Cpu,
    /// The model id callers name.
    model: &'static str,
    /// The gateway's worker: printed beside.
    worker_pid: Option<u32>,
    _nginx: Option<ProcessGroup>,
    _smg: Option<ProcessGroup>,
    _gateway: Option<Gateway>,
    _worker: Option<Worker>,
    _floor: Option<ChildProcess>,
    _dir: Option<PathBuf>,
}

fn nginx_conf(dir: &Path, listen: &str, engine: &str) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\n\
events {{ worker_connections 4096; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
  upstream engine {{ server {engine}; keepalive 64; }}\n\
  server {{\n    listen {listen};\n    location / {{\n      proxy_pass http://engine;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    )
}

/// `before`: the binary of [`Front::Before`].
async fn start(front: Front, engine: &SteadyEngine, before: Option<&Path>) -> Result<Running> {
    match front {
        Front::Nginx => {
            let dir = std::env::temp_dir().join(format!("hotbench-nginx-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            let listen = free_addr()?;
            let conf = dir.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&dir, &listen, &engine.addr().to_string()))?;
            let child = Command::new("nginx")
                .arg("-c")
                .arg(&conf)
                .arg("-p")
                .arg(&dir)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .process_group(0)
                .spawn()
                .context("starting nginx (apt-get install nginx)")?;
            let pgid = child.id();
            let base = format!("http://{listen}");
            wait_ready(&format!("{base}/v1/models")).await?;
            Ok(Running {
                base,
                key: None,
                model: MODEL,
                front: Cpu::Group(pgid),
                worker_pid: None,
                _nginx: Some(ProcessGroup(child)),
                _smg: None,
                _gateway: None,
                _worker: None,
                _floor: None,
                _dir: Some(dir),
            })
        }
        Front::Smg => {
            let smg = harness::smg::launch(&[engine.url()], None, "hotbench-smg.log").await?;
            Ok(Running {
                base: smg.base,
                key: None,
                model: MODEL,
                front: Cpu::Group(smg.pgid),
                worker_pid: None,
                _nginx: None,
                _smg: Some(smg.group),
                _gateway: None,
                _worker: None,
                _floor: None,
                _dir: None,
            })
        }
        Front::Floor => {
            let worker = relay_worker(engine)?;
            let listen = free_addr()?;
            let spec = Spec {
                name: "floor_proxy".into(),
                program: harness::bins::bin("floor_proxy")?,
                args: vec![
                    "--listen".into(),
                    listen.clone(),
                    "--worker".into(),
                    worker.grpc_url(),
                ],
                env: vec![],
                env_remove: vec![],
                ready_prefix: "floor listening on".into(),
                ready_timeout: Duration::from_secs(20),
            };
            let (floor, _) = ChildProcess::start(&spec)?;
            Ok(Running {
                base: format!("http://{listen}"),
                key: None,
                model: GATEWAY_MODEL,
                front: Cpu::Process(floor.pid()),
                worker_pid: worker.pid(),
                _nginx: None,
                _smg: None,
                _gateway: None,
                _worker: Some(worker),
                _floor: Some(floor),
                _dir: None,
            })
        }
        Front::Gateway | Front::Messages | Front::Before => {
            let worker = relay_worker(engine)?;
            let mut opts = GatewayOpts::default();
            if front == Front::Before {
                opts.binary = Some(
                    before
                        .context("`before` needs --gateway-bin-before")?
                        .into(),
                );
            }
            opts.workers
                .insert(GATEWAY_MODEL.into(), vec![worker.addr().to_owned()]);
            opts.rust_log = Some("warn".into());
            let gateway = Gateway::start(opts)?;
            let pid = gateway.pid().context("the gateway's pid")?;
            let client = gateway.client();
            let body = serde_json::json!({"model": GATEWAY_MODEL, "messages": [{"role": "user", "content": "Hi"}]});
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while client
                .post_json("/chat/completions", &body)
                .await
                .map(|r| r.status)
                .unwrap_or(0)
                != 200
            {
                if std::time::Instant::now() > deadline {
                    bail!("the gateway did not answer:\n{}", gateway.log_tail());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Running {
                base: gateway.base_url().trim_end_matches("/v1").to_owned(),
                key: Some(gateway.api_key().to_owned()),
                model: GATEWAY_MODEL,
                front: Cpu::Process(pid),
                worker_pid: worker.pid(),
                _nginx: None,
                _smg: None,
                _gateway: Some(gateway),
                _worker: Some(worker),
                _floor: None,
                _dir: None,
            })
        }
    }
}

/// The gateway's worker before the engine: `upstream`, OpenAI-compatible.
fn relay_worker(engine: &SteadyEngine) -> Result<Worker> {
    Worker::start(
        GATEWAY_MODEL,
        WorkerOpts {
            engine: "upstream".into(),
            extra_args: vec![
                "--upstream-url".into(),
                engine.url(),
                "--upstream-kind".into(),
                "openai".into(),
                "--context-window".into(),
                "4096".into(),
            ],
            ..WorkerOpts::default()
        },
    )
}

async fn wait_ready(url: &str) -> Result<()> {
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = http.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if std::time::Instant::now() > deadline {
            bail!("{url} did not answer");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What `wrk` printed.
struct Load {
    requests: u64,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
}

/// The `wrk` script of a front: the same body whichever API (both take
/// `max_tokens`, above the engine's six tokens), to the Messages route
/// with Anthropic's headers for [`Front::Messages`].
fn wrk_script(front: Front, model: &str, key: Option<&str>, stream: bool) -> String {
    let stream = if stream { r#","stream":true"# } else { "" };
    let body = format!(
        r#"{{"model":"{model}","max_tokens":16,"messages":[{{"role":"user","content":"Say hi"}}]{stream}}}"#
    );
    let path = match front {
        Front::Messages => "/v1/messages",
        _ => "/v1/chat/completions",
    };
    let mut lua = format!(
        "wrk.method = \"POST\"\nwrk.path = \"{path}\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
    );
    match (front, key) {
        (Front::Messages, Some(k)) => {
            lua += &format!("wrk.headers[\"x-api-key\"] = \"{k}\"\n");
            lua += "wrk.headers[\"anthropic-version\"] = \"2023-06-01\"\n";
        }
        (_, Some(k)) => lua += &format!("wrk.headers[\"Authorization\"] = \"Bearer {k}\"\n"),
        (_, None) => {}
    }
    lua
}

fn millis(text: &str) -> Option<f64> {
    let text = text.trim();
    for (unit, scale) in [("us", 0.001), ("ms", 1.0), ("s", 1000.0)] {
        if let Some(n) = text.strip_suffix(unit) {
            return n.parse::<f64>().ok().map(|v| v * scale);
        }
    }
    None
}

fn run_wrk(base: &str, script: &Path, connections: u32, seconds: u64) -> Result<Load> {
    let out = Command::new("wrk")
        .args(["-t", "1", "-c", &connections.to_string()])
        .args(["-d", &format!("{seconds}s"), "--latency", "-s"])
        .arg(script)
        .arg(base)
        .output()
        .context("running wrk (apt-get install wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line_value = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find(|l| l.starts_with(prefix))
            .map(|l| l[prefix.len()..].trim().to_owned())
    };
    let requests = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("wrk printed no request count:\n{text}"))?;
    let errors = text
        .lines()
        .filter(|l| l.contains("Non-2xx") || l.contains("Socket errors"))
        .flat_map(|l| {
            l.split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u64>().ok())
        })
        .sum();
    Ok(Load {
        requests,
        rps: line_value("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        p50_ms: line_value("50%").and_then(|v| millis(&v)).unwrap_or(0.0),
        p99_ms: line_value("99%").and_then(|v| millis(&v)).unwrap_or(0.0),
        errors,
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.gateway_bin_before.is_some() && !args.fronts.contains(&Front::Before) {
        let at = args.fronts.iter().position(|&f| f == Front::Gateway);
        args.fronts
            .insert(at.map_or(args.fronts.len(), |i| i + 1), Front::Before);
    }
    let engine = SteadyEngine::start().await?;
    println!(
        "hotbench: wrk, 1 thread, {} connections, {} s per front and mode, {} round(s); load average {}",
        args.connections,
        args.duration,
        args.rounds,
        load_average()
    );
    if let Some(path) = &args.gateway_bin_before {
        println!("gateway @before: {}", path.display());
    }
    println!("\n| round | front | mode | µs CPU per request | req/s | p50 | p99 | errors | worker µs per request |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let dir = std::env::temp_dir();
    for round in 1..=args.rounds {
        for &front in &args.fronts {
            let running = start(front, &engine, args.gateway_bin_before.as_deref()).await?;
            for stream in [false, true] {
                if stream && front == Front::Floor {
                    continue;
                }
                let script = dir.join(format!("hotbench-{}-{stream}.lua", std::process::id()));
                std::fs::write(
                    &script,
                    wrk_script(front, running.model, running.key.as_deref(), stream),
                )?;
                // Warm-up: connections, caches, the allocator's pages.
                run_wrk(&running.base, &script, args.connections, 2)?;
                let cpu = running.front.micros()?;
                let worker = running
                    .worker_pid
                    .map(harness::procfs::cpu_micros)
                    .transpose()?;
                let load = run_wrk(&running.base, &script, args.connections, args.duration)?;
                let cpu = running.front.micros()? - cpu;
                let worker = match (running.worker_pid, worker) {
                    (Some(pid), Some(before)) => {
                        let used = harness::procfs::cpu_micros(pid)? - before;
                        format!("{:.1}", used as f64 / load.requests.max(1) as f64)
                    }
                    _ => "-".into(),
                };
                println!(
                    "| {round} | {} | {} | **{:.1}** | {:.0} | {:.2} ms | {:.2} ms | {} | {worker} |",
                    front.label(),
                    if stream { "6-token stream" } else { "one body" },
                    cpu as f64 / load.requests.max(1) as f64,
                    load.rps,
                    load.p50_ms,
                    load.p99_ms,
                    load.errors,
                );
                let _ = std::fs::remove_file(&script);
            }
        }
    }
    println!("\nload average at the end {}", load_average());
    Ok(())
}
