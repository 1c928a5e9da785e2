//! `routebench`: routers in front of a fleet of real engines, each arm on
//! the same request sequence, every arm on freshly started (cold) engines.
//!
//! Engines: `--engines` llama.cpp `llama-server` processes (`--engine
//! llama-server`: `--slots` slots, one thread, host prompt cache off, so a
//! slot's KV cells are the only cache, as on a GPU with a full KV pool), or
//! in-process `llama` workers (`--engine llama`, same slots and thread).
//!
//! Arms: SMG (`sglang-router`, scripts/smg.sh) with its `random`,
//! `round_robin`, `power_of_two` and `cache_aware` policies in front of the
//! llama-servers directly; this gateway with each of its pool policies in
//! front of one worker per engine (`upstream` workers for llama-server).
//!
//! Workloads (seeded, the same sequence for every arm):
//! - `a`: apps with their own long system prompt, Zipf-distributed;
//! - `b`: multi-turn conversations, each request one turn longer;
//! - `c`: one shared long block, then short per-app prompts (Zipf 0.3) and
//!   unique tails: the hot-spot trap;
//! - `d`: unrelated prompts (nothing to share).
//!
//! Figures per arm: the effective prefix-cache hit, 1 − prompt tokens the
//! engines computed (their own counters: `llamacpp:prompt_tokens_total`,
//! or the worker's prompt minus cached-prompt tokens) ÷ prompt tokens sent
//! (the replies' `usage.prompt_tokens`); TTFT p50 / p95 (first content
//! delta of a streamed reply); requests/s; the coefficient of variation of
//! tokens computed across engines; and the share of 100 ms samples in
//! which one engine sat idle while another had requests waiting.
//!
//! ```text
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin routebench -- --engines 2 --workloads a,b,c,d
//! ```

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use harness::process::free_addr;
use harness::{Client, Gateway, GatewayOpts, LlamaServer, LlamaServerOpts, Worker, WorkerOpts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Routers over a fleet of real engines: prefix-cache hit, TTFT, balance")]
struct Args {
    /// Engines in the fleet.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Slots (sequences decoded together) per engine.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Context tokens per slot.
    #[arg(long, default_value_t = 2048)]
    n_ctx: u32,
    /// Requests per arm.
    #[arg(long, default_value_t = 48)]
    requests: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Output cap of every request (small: prefill is what routing saves).
    #[arg(long, default_value_t = 8)]
    max_tokens: u32,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "a,b,c,d")]
    workloads: Vec<Workload>,
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "smg-random,smg-round-robin,smg-power-of-two,smg-cache-aware,gw-least-loaded,gw-prefix-affinity,gw-cache-aware"
    )]
    arms: Vec<Arm>,
    #[arg(long, value_enum, default_value = "llama-server")]
    engine: EngineKind,
    /// Seed of the request sequences.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The GGUF every engine serves (default: the reference model).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: Option<PathBuf>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Workload {
    A,
    B,
    C,
    D,
}

impl Workload {
    fn describe(self) -> &'static str {
        match self {
            Workload::A => "(a) 6 apps, each its own long system prompt, Zipf 0.8",
            Workload::B => "(b) 8 conversations growing a turn per request",
            Workload::C => "(c) one shared long block + 8 short app prompts, Zipf 0.3",
            Workload::D => "(d) unrelated prompts",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Arm {
    SmgRandom,
    SmgRoundRobin,
    SmgPowerOfTwo,
    SmgCacheAware,
    GwLeastLoaded,
    GwPrefixAffinity,
    GwCacheAware,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Arm::SmgRandom => "SMG random",
            Arm::SmgRoundRobin => "SMG round_robin",
            Arm::SmgPowerOfTwo => "SMG power_of_two",
            Arm::SmgCacheAware => "SMG cache_aware",
            Arm::GwLeastLoaded => "gateway least_loaded",
            Arm::GwPrefixAffinity => "gateway prefix_affinity",
            Arm::GwCacheAware => "gateway cache_aware",
        }
    }

    /// SMG's `--policy`, for the SMG arms.
    fn smg_policy(self) -> Option<&'static str> {
        match self {
            Arm::SmgRandom => Some("random"),
            Arm::SmgRoundRobin => Some("round_robin"),
            Arm::SmgPowerOfTwo => Some("power_of_two"),
            Arm::SmgCacheAware => Some("cache_aware"),
            Arm::GwLeastLoaded | Arm::GwPrefixAffinity | Arm::GwCacheAware => None,
        }
    }

    /// The gateway's pool `policy`, for the gateway arms.
    fn gateway_policy(self) -> Option<&'static str> {
        match self {
            Arm::GwLeastLoaded => Some("least_loaded"),
            Arm::GwPrefixAffinity => Some("prefix_affinity"),
            Arm::GwCacheAware => Some("cache_aware"),
            _ => None,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum EngineKind {
    LlamaServer,
    Llama,
}

// ---- request sequences ------------------------------------------------------

const WORDS: [&str; 64] = [
    "river", "market", "signal", "garden", "copper", "winter", "ledger", "harbor", "pilot",
    "canvas", "orbit", "timber", "velvet", "cargo", "meadow", "lantern", "quartz", "basket",
    "engine", "violet", "summit", "pepper", "falcon", "marble", "anchor", "candle", "thunder",
    "willow", "saddle", "ribbon", "glacier", "mosaic", "tunnel", "walnut", "beacon", "cobalt",
    "prairie", "compass", "harvest", "jasmine", "kettle", "lagoon", "mirror", "nectar", "olive",
    "parcel", "quiver", "rocket", "sphinx", "tundra", "umbrella", "vessel", "wander", "yonder",
    "zephyr", "almond", "bramble", "cedar", "dune", "ember", "fjord", "granite", "hollow", "ivory",
];

fn words(rng: &mut StdRng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.random_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// An index in `0..n` with probability ∝ 1 / (rank + 1)^s.
fn zipf(rng: &mut StdRng, n: usize, s: f64) -> usize {
    let weights: Vec<f64> = (0..n).map(|k| 1.0 / ((k + 1) as f64).powf(s)).collect();
    let mut pick = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (k, w) in weights.iter().enumerate() {
        if pick < *w {
            return k;
        }
        pick -= w;
    }
    n - 1
}

fn message(role: &str, content: String) -> Value {
    json!({"role": role, "content": content})
}

/// The message lists of `n` requests of `workload`.
fn sequence(workload: Workload, n: usize, seed: u64) -> Vec<Value> {
    let mut rng = StdRng::seed_from_u64(seed ^ workload as u64);
    match workload {
        Workload::A => {
            let apps: Vec<String> = (0..6)
                .map(|i| format!("You are the assistant of app {i}. {}", words(&mut rng, 200)))
                .collect();
            (0..n)
                .map(|r| {
                    let app = zipf(&mut rng, apps.len(), 0.8);
                    json!([
                        message("system", apps[app].clone()),
                        message("user", format!("Request {r}: {}", words(&mut rng, 12))),
                    ])
                })
                .collect()
        }
        Workload::B => {
            const CONVERSATIONS: usize = 8;
            const MAX_TURNS: usize = 12;
            let mut conversations: Vec<Vec<Value>> = Vec::new();
            let mut opened = 0;
            let mut open = |rng: &mut StdRng| {
                opened += 1;
                vec![message(
                    "system",
                    format!("Conversation {opened}. {}", words(rng, 40)),
                )]
            };
            for _ in 0..CONVERSATIONS {
                conversations.push(open(&mut rng));
            }
            (0..n)
                .map(|r| {
                    let c = rng.random_range(0..CONVERSATIONS);
                    if conversations[c].len() > 2 * MAX_TURNS {
                        conversations[c] = open(&mut rng);
                    }
                    let history = &mut conversations[c];
                    history.push(message(
                        "user",
                        format!("Turn {r}: {}", words(&mut rng, 20)),
                    ));
                    let request = Value::Array(history.clone());
                    // The next turn carries a fixed reply, so the sequence
                    // is the same whatever the engines answered.
                    history.push(message("assistant", words(&mut rng, 20)));
                    request
                })
                .collect()
        }
        Workload::C => {
            let shared = format!("Shared policy. {}", words(&mut rng, 150));
            let apps: Vec<String> = (0..8)
                .map(|i| format!("App {i}. {}", words(&mut rng, 55)))
                .collect();
            (0..n)
                .map(|r| {
                    let app = zipf(&mut rng, apps.len(), 0.3);
                    json!([
                        message("system", format!("{shared}\n{}", apps[app])),
                        message("user", format!("Request {r}: {}", words(&mut rng, 12))),
                    ])
                })
                .collect()
        }
        Workload::D => (0..n)
            .map(|r| {
                json!([message(
                    "user",
                    format!("Note {r}: {}", words(&mut rng, 120))
                )])
            })
            .collect(),
    }
}

// ---- the fleet ----------------------------------------------------------------

/// A process group (SMG): killed as a whole, so no router outlives its arm.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: signals the process group this struct started and owns.
        unsafe {
            libc::killpg(self.0.id() as i32, libc::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

/// Where an engine's counters are read.
#[derive(Clone)]
enum Probe {
    /// A llama-server's `/metrics`, and its upstream worker's when a
    /// gateway arm queues there.
    Server {
        metrics: String,
        worker: Option<String>,
    },
    /// An in-process `llama` worker's `/metrics`.
    Worker { metrics: String },
}

#[derive(Default, Clone, Copy)]
struct Counts {
    /// Prompt tokens the engine computed (cache hits excluded).
    computed: f64,
    running: f64,
    waiting: f64,
}

/// The sum of a Prometheus text page's samples of `name` whose labels
/// contain `label`.
fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            (key.split('{').next()? == name && key.contains(label)).then_some(())?;
            value.trim().parse::<f64>().ok()
        })
        .sum()
}

async fn page(http: &reqwest::Client, url: &str) -> Result<String> {
    Ok(http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

impl Probe {
    async fn read(&self, http: &reqwest::Client) -> Result<Counts> {
        match self {
            Probe::Server { metrics, worker } => {
                let text = page(http, metrics).await?;
                let mut counts = Counts {
                    computed: metric(&text, "llamacpp:prompt_tokens_total", ""),
                    running: metric(&text, "llamacpp:requests_processing", ""),
                    waiting: metric(&text, "llamacpp:requests_deferred", ""),
                };
                if let Some(w) = worker {
                    let text = page(http, w).await?;
                    counts.waiting += metric(&text, "worker_requests_waiting", "");
                }
                Ok(counts)
            }
            Probe::Worker { metrics } => {
                let text = page(http, metrics).await?;
                Ok(Counts {
                    computed: metric(&text, "worker_tokens_total", "kind=\"prompt\"")
                        - metric(&text, "worker_tokens_total", "kind=\"cached_prompt\""),
                    running: metric(&text, "worker_requests_running", ""),
                    waiting: metric(&text, "worker_requests_waiting", ""),
                })
            }
        }
    }
}

/// One arm's running processes; dropping it stops them all.
struct Fleet {
    client: Client,
    model: String,
    probes: Vec<Probe>,
    _servers: Vec<LlamaServer>,
    _workers: Vec<Worker>,
    _gateway: Option<Gateway>,
    _router: Option<Group>,
}

async fn wait_healthy(http: &reqwest::Client, url: &str, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = http.get(url).send().await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("{what} did not become healthy at {url}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn smg_python() -> Result<PathBuf> {
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

async fn start_fleet(arm: Arm, args: &Args, model: &Path) -> Result<Fleet> {
    let http = reqwest::Client::new();
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    if args.engine == EngineKind::LlamaServer {
        // Host prompt cache off: a slot holds one prefix, as routed.
        let opts = LlamaServerOpts {
            extra_args: vec!["--cache-ram".into(), "0".into()],
            ..LlamaServerOpts::new(args.n_ctx, args.slots)
        };
        for _ in 0..args.engines {
            let server = LlamaServer::start_with(model, &opts).await?;
            urls.push(server.url().to_owned());
            servers.push(server);
        }
        for url in &urls {
            // One unrelated request each: the engine's first decode is
            // not part of any arm's figures.
            let r = http
                .post(format!("{url}/v1/chat/completions"))
                .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}))
                .send()
                .await?;
            if !r.status().is_success() {
                bail!("llama-server warm-up: HTTP {}", r.status());
            }
        }
    }
    if let Some(policy) = arm.smg_policy() {
        if args.engine != EngineKind::LlamaServer {
            bail!("SMG fronts HTTP engines only: use --engine llama-server");
        }
        let python = smg_python()?;
        let listen = free_addr()?;
        let prometheus = free_addr()?;
        let (host, port) = listen.rsplit_once(':').context("free address")?;
        let (_, prom_port) = prometheus.rsplit_once(':').context("free address")?;
        let log = std::fs::File::create(std::env::temp_dir().join("routebench-smg.log"))?;
        let child = Command::new(python)
            .args([
                "-m",
                "sglang_router.launch_router",
                "--host",
                host,
                "--port",
                port,
            ])
            .args(["--policy", policy, "--worker-urls"])
            .args(&urls)
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
        let router = Group(child);
        wait_healthy(&http, &format!("http://{listen}/health"), "SMG").await?;
        let probes = urls
            .iter()
            .map(|u| Probe::Server {
                metrics: format!("{u}/metrics"),
                worker: None,
            })
            .collect();
        return Ok(Fleet {
            client: Client::new(&format!("http://{listen}/v1"), None),
            model: "base".into(),
            probes,
            _servers: servers,
            _workers: Vec::new(),
            _gateway: None,
            _router: Some(router),
        });
    }
    let policy = arm
        .gateway_policy()
        .context("an arm is SMG's or the gateway's")?;
    let mut workers = Vec::new();
    let mut probes = Vec::new();
    // One worker per engine: in front of its llama-server (`upstream`), or
    // the engine itself (`llama`, no URL).
    let engines: Vec<Option<&String>> = (0..args.engines).map(|i| urls.get(i)).collect();
    for url in engines {
        let metrics = free_addr()?;
        let mut opts = match (args.engine, url) {
            (EngineKind::LlamaServer, Some(url)) => WorkerOpts::upstream(url, "llama-server"),
            (EngineKind::LlamaServer, None) => bail!("a llama-server per upstream worker"),
            (EngineKind::Llama, _) => WorkerOpts::llama(model, args.n_ctx, args.slots),
        };
        opts.extra_args
            .extend(["--metrics-listen".to_owned(), metrics.clone()]);
        workers.push(Worker::start("base", opts)?);
        probes.push(match url {
            Some(url) => Probe::Server {
                metrics: format!("{url}/metrics"),
                worker: Some(format!("http://{metrics}/metrics")),
            },
            None => Probe::Worker {
                metrics: format!("http://{metrics}/metrics"),
            },
        });
    }
    let mut gw = GatewayOpts::default();
    gw.workers.insert(
        "base".into(),
        workers.iter().map(|w| w.addr().to_owned()).collect(),
    );
    gw.extra_toml = format!("[models.base]\npolicy = \"{policy}\"\n");
    let gateway = Gateway::start(gw)?;
    let client = gateway.client();
    // Every worker healthy in the gateway's pool before the first request.
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .post_json(
            "/chat/completions",
            &json!({"model": "base", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}),
        )
        .await
        .map(|r| r.status)
        .unwrap_or(0)
        != 200
    {
        if Instant::now() > deadline {
            bail!("the gateway did not answer:\n{}", gateway.log_tail());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(Fleet {
        client,
        model: "base".into(),
        probes,
        _servers: servers,
        _workers: workers,
        _gateway: Some(gateway),
        _router: None,
    })
}

// ---- one arm -----------------------------------------------------------------

struct Figures {
    hit: f64,
    ttft_p50: Duration,
    ttft_p95: Duration,
    rps: f64,
    cv: f64,
    idle_while_waiting: f64,
    failed: usize,
    computed: Vec<f64>,
}

async fn stream_one(
    client: &Client,
    model: &str,
    messages: &Value,
    max_tokens: u32,
) -> Result<(Duration, u64)> {
    let body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0,
        "max_tokens": max_tokens,
    });
    let started = Instant::now();
    let mut stream = client.stream("/chat/completions", &body).await?;
    if stream.status != 200 {
        bail!("HTTP {}", stream.status);
    }
    let mut first = None;
    let mut prompt_tokens = 0;
    while let Some(frame) = stream.next_frame().await? {
        if frame.is_done() {
            break;
        }
        let v = frame.json();
        let delta = &v["choices"][0]["delta"];
        let content = delta["content"].as_str().is_some_and(|c| !c.is_empty())
            || v["choices"][0]["finish_reason"].is_string();
        if content {
            first.get_or_insert(started.elapsed());
        }
        if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = p;
        }
    }
    Ok((first.unwrap_or_else(|| started.elapsed()), prompt_tokens))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

async fn run_arm(fleet: &Fleet, requests: &[Value], args: &Args) -> Result<Figures> {
    let http = reqwest::Client::new();
    let mut before = Vec::new();
    for p in &fleet.probes {
        before.push(p.read(&http).await?);
    }
    // Balance samples: an engine idle while another has requests waiting.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, probes, http) = (Arc::clone(&stop), fleet.probes.clone(), http.clone());
        tokio::spawn(async move {
            let (mut samples, mut unbalanced) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let mut counts = Vec::new();
                for p in &probes {
                    counts.push(p.read(&http).await.unwrap_or_default());
                }
                samples += 1;
                let idle = counts.iter().any(|c| c.running == 0.0 && c.waiting == 0.0);
                let waiting = counts.iter().any(|c| c.waiting > 0.0);
                unbalanced += u64::from(idle && waiting);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (samples, unbalanced)
        })
    };
    let requests = Arc::new(requests.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (requests, next, results) = (
            Arc::clone(&requests),
            Arc::clone(&next),
            Arc::clone(&results),
        );
        let (client, model, max_tokens) =
            (fleet.client.clone(), fleet.model.clone(), args.max_tokens);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(messages) = requests.get(i) else {
                    break;
                };
                let outcome = stream_one(&client, &model, messages, max_tokens).await;
                if let Ok(mut r) = results.lock() {
                    r.push(outcome.map_err(|e| format!("{e:#}")));
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    let wall = began.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (samples, unbalanced) = sampler.await?;
    let mut computed = Vec::new();
    for (p, b) in fleet.probes.iter().zip(&before) {
        computed.push(p.read(&http).await?.computed - b.computed);
    }
    let results = std::mem::take(&mut *results.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    let mut ttfts = Vec::new();
    let (mut sent, mut failed) = (0u64, 0usize);
    for r in results {
        match r {
            Ok((ttft, prompt)) => {
                ttfts.push(ttft);
                sent += prompt;
            }
            Err(e) => {
                failed += 1;
                eprintln!("  request failed: {e}");
            }
        }
    }
    ttfts.sort();
    let total: f64 = computed.iter().sum();
    let mean = total / computed.len().max(1) as f64;
    let var =
        computed.iter().map(|c| (c - mean).powi(2)).sum::<f64>() / computed.len().max(1) as f64;
    Ok(Figures {
        hit: if sent == 0 {
            0.0
        } else {
            1.0 - total / sent as f64
        },
        ttft_p50: percentile(&ttfts, 0.5),
        ttft_p95: percentile(&ttfts, 0.95),
        rps: ttfts.len() as f64 / wall.as_secs_f64(),
        cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
        idle_while_waiting: if samples == 0 {
            0.0
        } else {
            unbalanced as f64 / samples as f64
        },
        failed,
        computed,
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// What `cache_aware` adds per request: the prompt's block hashes, timed
/// against parsing the same request body (which every request pays).
/// Returns (hashing, parsing) per request.
fn hashing_cost(requests: &[Value]) -> (Duration, Duration) {
    use inference_proto::v1 as pb;
    let bodies: Vec<Vec<u8>> = requests
        .iter()
        .map(|m| serde_json::to_vec(&json!({"model": "base", "messages": m})).unwrap_or_default())
        .collect();
    let protos: Vec<pb::GenerateRequest> = requests
        .iter()
        .map(|m| pb::GenerateRequest {
            messages: m
                .as_array()
                .into_iter()
                .flatten()
                .map(|msg| pb::Message {
                    role: msg["role"].as_str().unwrap_or_default().to_owned(),
                    content: vec![pb::ContentPart {
                        part: Some(pb::content_part::Part::Text(
                            msg["content"].as_str().unwrap_or_default().to_owned(),
                        )),
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    const ROUNDS: u32 = 200;
    let start = Instant::now();
    for _ in 0..ROUNDS {
        for p in &protos {
            std::hint::black_box(inference_proto::prefix::prompt_blocks(
                std::hint::black_box(p),
            ));
        }
    }
    let hashing = start.elapsed() / (ROUNDS * protos.len().max(1) as u32);
    let start = Instant::now();
    for _ in 0..ROUNDS {
        for b in &bodies {
            std::hint::black_box(serde_json::from_slice::<Value>(std::hint::black_box(b)).ok());
        }
    }
    let parsing = start.elapsed() / (ROUNDS * bodies.len().max(1) as u32);
    (hashing, parsing)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let model = match &args.model_file {
        Some(f) => f.clone(),
        None => harness::model::model_file()?,
    };
    println!(
        "routebench: {} {:?} engines x {} slots, one thread each; {} requests per arm at concurrency {}, max_tokens {}; load average {}",
        args.engines, args.engine, args.slots, args.requests, args.concurrency, args.max_tokens, load_average()
    );
    for &workload in &args.workloads {
        let requests = sequence(workload, args.requests, args.seed);
        println!("\n{}", workload.describe());
        let (hashing, parsing) = hashing_cost(&requests);
        let bytes: usize =
            requests.iter().map(|m| m.to_string().len()).sum::<usize>() / requests.len().max(1);
        println!(
            "prefix block hashes (cache_aware): {:.1} µs per request of ~{bytes} bytes; parsing its JSON body: {:.1} µs",
            hashing.as_secs_f64() * 1e6,
            parsing.as_secs_f64() * 1e6,
        );
        println!(
            "| router | effective hit | TTFT p50 | TTFT p95 | req/s | CV computed | idle while waiting | failed |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for &arm in &args.arms {
            if arm.smg_policy().is_some() && args.engine != EngineKind::LlamaServer {
                continue;
            }
            let fleet = start_fleet(arm, &args, &model)
                .await
                .with_context(|| format!("starting the fleet of {}", arm.label()))?;
            let f = run_arm(&fleet, &requests, &args).await?;
            drop(fleet);
            println!(
                "| {} | {:.1} % | {:.2} s | {:.2} s | {:.2} | {:.2} | {:.0} % | {} |",
                arm.label(),
                f.hit * 100.0,
                f.ttft_p50.as_secs_f64(),
                f.ttft_p95.as_secs_f64(),
                f.rps,
                f.cv,
                f.idle_while_waiting * 100.0,
                f.failed,
            );
            eprintln!("  {}: computed per engine {:?}", arm.label(), f.computed);
        }
    }
    println!("\nload average at the end {}", load_average());
    Ok(())
}
