//! `routebench`: routers in front of a fleet of real engines, each arm on
//! the same request sequence, every arm on freshly started (cold) engines.
//!
//! Engines: `--engines` llama.cpp `llama-server` processes (`--engine
//! llama-server`: `--slots` slots, one thread, host prompt cache off, so a
//! slot's KV cells are the only cache, as on a GPU with a full KV pool), or
//! in-process `llama` workers (`--engine llama`, same slots and thread).
//!
//! Arms: SMG 1.13 (`smg launch`, scripts/smg.sh) with its `random`,
//! `round_robin`, `power_of_two` and `cache_aware` policies in front of the
//! llama-servers directly; this gateway with its default pool policy or a
//! named one in front of one worker per engine (`upstream` workers for
//! llama-server).
//!
//! Workloads (seeded, the same sequence for every arm):
//! - `a`: apps with their own long system prompt, Zipf-distributed;
//! - `b`: multi-turn conversations, each request one turn longer;
//! - `c`: one shared long block, then short per-app prompts (Zipf 0.3) and
//!   unique tails: the hot-spot trap;
//! - `d`: unrelated prompts (nothing to share).
//!
//! `--family` runs a family of cells instead: the shape of (a) varied one
//! dimension at a time (apps, prompt length, shared head, Zipf exponent,
//! concurrency, engines, slots) plus unrelated prompts (where the
//! gateway's `least_loaded` runs too, as the yardstick), and prints one
//! table of every cell with how many the gateway wins.
//!
//! Figures per arm: the effective prefix-cache hit, 1 − prompt tokens the
//! engines computed (their own counters: `llamacpp:prompt_tokens_total`,
//! or the worker's prompt minus cached-prompt tokens) ÷ prompt tokens sent
//! (the replies' `usage.prompt_tokens`); TTFT p50 / p95 (first content
//! delta of a streamed reply); requests/s and wall time; the coefficient of
//! variation of tokens computed across engines; and the share of 100 ms
//! samples in which one engine sat idle while another had requests waiting.
//! `--trace` prints every request: its app, its prompt and cached tokens
//! (the engine's own `timings` where the reply carries them) and its TTFT.
//!
//! ```text
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin routebench -- --engines 2 --workloads a,b,c,d
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin routebench -- --family
//! ```

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use harness::process::free_addr;
use harness::smg::ProcessGroup;
use harness::{Client, Gateway, GatewayOpts, LlamaServer, LlamaServerOpts, Worker, WorkerOpts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
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
    /// Context tokens per slot (raised for a cell whose prompts need more).
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
    /// The family of cells instead of `--workloads`.
    #[arg(long)]
    family: bool,
    /// Only the family's cells with these names (`base`, `apps-2`, ...).
    #[arg(long, value_delimiter = ',')]
    cells: Vec<String>,
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
    /// Print every request of every arm.
    #[arg(long)]
    trace: bool,
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

/// What the prompts of a cell look like.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// `apps` apps, each a system prompt of `app_tokens` (after a head of
    /// `head_tokens` every app shares), picked with Zipf exponent `zipf`;
    /// then a short unique request.
    Apps {
        apps: usize,
        head_tokens: usize,
        app_tokens: usize,
        zipf: f64,
    },
    /// Multi-turn conversations, each request one turn longer.
    Conversations,
    /// Unrelated prompts of about `tokens` each.
    Unrelated { tokens: usize },
}

/// One point of the benchmark: a fleet, a load and a shape of prompts.
#[derive(Clone, Debug)]
struct Cell {
    name: String,
    engines: usize,
    slots: u32,
    concurrency: usize,
    shape: Shape,
}

impl Cell {
    fn describe(&self) -> String {
        let shape = match self.shape {
            Shape::Apps {
                apps,
                head_tokens,
                app_tokens,
                zipf,
            } => format!(
                "{apps} apps, ~{app_tokens}-token system prompts{}, Zipf {zipf}",
                if head_tokens > 0 {
                    format!(" after a ~{head_tokens}-token head they all share")
                } else {
                    String::new()
                }
            ),
            Shape::Conversations => "8 conversations growing a turn per request".into(),
            Shape::Unrelated { tokens } => format!("unrelated ~{tokens}-token prompts"),
        };
        format!(
            "{}: {} engines x {} slots, concurrency {}; {shape}",
            self.name, self.engines, self.slots, self.concurrency
        )
    }

    /// Context per slot: the longest prompt, the reply and the template.
    fn n_ctx(&self, floor: u32) -> u32 {
        let longest = match self.shape {
            Shape::Apps {
                head_tokens,
                app_tokens,
                ..
            } => head_tokens + app_tokens + 64,
            Shape::Conversations => 1500,
            Shape::Unrelated { tokens } => tokens + 64,
        };
        floor.max((longest as u32 + 512).next_power_of_two())
    }
}

/// The named workloads at the fleet and load of `args`.
fn workload_cell(w: Workload, args: &Args) -> Cell {
    let (name, shape) = match w {
        Workload::A => (
            "a",
            Shape::Apps {
                apps: 6,
                head_tokens: 0,
                app_tokens: 280,
                zipf: 0.8,
            },
        ),
        Workload::B => ("b", Shape::Conversations),
        Workload::C => (
            "c",
            Shape::Apps {
                apps: 8,
                head_tokens: 190,
                app_tokens: 70,
                zipf: 0.3,
            },
        ),
        Workload::D => ("d", Shape::Unrelated { tokens: 150 }),
    };
    Cell {
        name: name.into(),
        engines: args.engines,
        slots: args.slots,
        concurrency: args.concurrency,
        shape,
    }
}

/// The family: workload (a) on 2 engines x 2 slots at concurrency 4, then
/// one dimension at a time over the range a fleet meets, then unrelated
/// prompts (where nothing can be saved and balance is all).
fn family() -> Vec<Cell> {
    let base = Cell {
        name: "base".into(),
        engines: 2,
        slots: 2,
        concurrency: 4,
        shape: Shape::Apps {
            apps: 6,
            head_tokens: 0,
            app_tokens: 280,
            zipf: 0.8,
        },
    };
    let apps = |name: &str, apps: usize, head: usize, app: usize, zipf: f64| Cell {
        name: name.into(),
        shape: Shape::Apps {
            apps,
            head_tokens: head,
            app_tokens: app,
            zipf,
        },
        ..base.clone()
    };
    let fleet = |name: &str, engines: usize, slots: u32, concurrency: usize| Cell {
        name: name.into(),
        engines,
        slots,
        concurrency,
        ..base.clone()
    };
    vec![
        base.clone(),
        apps("apps-2", 2, 0, 280, 0.8),
        apps("apps-12", 12, 0, 280, 0.8),
        apps("apps-24", 24, 0, 280, 0.8),
        apps("prompt-100", 6, 0, 100, 0.8),
        apps("prompt-1000", 6, 0, 1000, 0.8),
        apps("prompt-2000", 6, 0, 2000, 0.8),
        apps("head-200", 8, 200, 80, 0.3),
        apps("head-600", 6, 600, 280, 0.8),
        apps("zipf-0", 6, 0, 280, 0.0),
        apps("zipf-1.2", 6, 0, 280, 1.2),
        fleet("conc-2", 2, 2, 2),
        fleet("conc-16", 2, 2, 16),
        fleet("engines-3", 3, 2, 6),
        fleet("engines-4", 4, 2, 8),
        fleet("slots-1", 2, 1, 4),
        fleet("slots-4", 2, 4, 8),
        Cell {
            name: "unrelated".into(),
            shape: Shape::Unrelated { tokens: 150 },
            ..base
        },
    ]
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Arm {
    SmgRandom,
    SmgRoundRobin,
    SmgPowerOfTwo,
    SmgCacheAware,
    /// The gateway with no `policy` configured: its default.
    GwDefault,
    GwLeastLoaded,
    GwPrefixAffinity,
    GwCacheAware,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Arm::SmgRandom => "SMG 1.13 random",
            Arm::SmgRoundRobin => "SMG 1.13 round_robin",
            Arm::SmgPowerOfTwo => "SMG 1.13 power_of_two",
            Arm::SmgCacheAware => "SMG 1.13 cache_aware",
            Arm::GwDefault => "gateway default",
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
            _ => None,
        }
    }

    /// The gateway's pool `policy`, for the gateway arms (`None` inside:
    /// the default, left unconfigured).
    fn gateway_policy(self) -> Option<Option<&'static str>> {
        match self {
            Arm::GwDefault => Some(None),
            Arm::GwLeastLoaded => Some(Some("least_loaded")),
            Arm::GwPrefixAffinity => Some(Some("prefix_affinity")),
            Arm::GwCacheAware => Some(Some("cache_aware")),
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

/// Words of about `tokens` tokens of the reference model's tokenizer
/// (these words average about 1.3 tokens with their space).
fn words_for_tokens(rng: &mut StdRng, tokens: usize) -> String {
    words(rng, tokens * 10 / 13)
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

/// One request: its messages and the app or conversation it belongs to
/// (for `--trace`).
struct Request {
    messages: Value,
    group: usize,
}

/// The requests of a cell.
fn sequence(shape: Shape, n: usize, seed: u64) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(seed);
    match shape {
        Shape::Apps {
            apps,
            head_tokens,
            app_tokens,
            zipf: s,
        } => {
            let head = if head_tokens > 0 {
                format!(
                    "Shared policy. {}\n",
                    words_for_tokens(&mut rng, head_tokens)
                )
            } else {
                String::new()
            };
            let prompts: Vec<String> = (0..apps)
                .map(|i| {
                    format!(
                        "{head}You are the assistant of app {i}. {}",
                        words_for_tokens(&mut rng, app_tokens)
                    )
                })
                .collect();
            (0..n)
                .map(|r| {
                    let app = zipf(&mut rng, apps, s);
                    Request {
                        messages: json!([
                            message("system", prompts[app].clone()),
                            message("user", format!("Request {r}: {}", words(&mut rng, 12))),
                        ]),
                        group: app,
                    }
                })
                .collect()
        }
        Shape::Conversations => {
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
                    let messages = Value::Array(history.clone());
                    // The next turn carries a fixed reply, so the sequence
                    // is the same whatever the engines answered.
                    history.push(message("assistant", words(&mut rng, 20)));
                    Request { messages, group: c }
                })
                .collect()
        }
        Shape::Unrelated { tokens } => (0..n)
            .map(|r| Request {
                messages: json!([message(
                    "user",
                    format!("Note {r}: {}", words_for_tokens(&mut rng, tokens))
                )]),
                group: r,
            })
            .collect(),
    }
}

// ---- the fleet ----------------------------------------------------------------

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
    _router: Option<ProcessGroup>,
}

async fn start_fleet(arm: Arm, cell: &Cell, args: &Args, model: &Path) -> Result<Fleet> {
    let http = reqwest::Client::new();
    let n_ctx = cell.n_ctx(args.n_ctx);
    let mut servers = Vec::new();
    let mut urls = Vec::new();
    if args.engine == EngineKind::LlamaServer {
        // Host prompt cache off: a slot holds one prefix, as routed.
        let opts = LlamaServerOpts {
            extra_args: vec!["--cache-ram".into(), "0".into()],
            ..LlamaServerOpts::new(n_ctx, cell.slots)
        };
        for _ in 0..cell.engines {
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
        let smg = harness::smg::launch(&urls, Some(policy), "routebench-smg.log").await?;
        let probes = urls
            .iter()
            .map(|u| Probe::Server {
                metrics: format!("{u}/metrics"),
                worker: None,
            })
            .collect();
        let model = harness::smg::engine_model_id(&urls[0]).await?;
        return Ok(Fleet {
            client: Client::new(&format!("{}/v1", smg.base), None),
            model,
            probes,
            _servers: servers,
            _workers: Vec::new(),
            _gateway: None,
            _router: Some(smg.group),
        });
    }
    let policy = arm
        .gateway_policy()
        .context("an arm is SMG's or the gateway's")?;
    let mut workers = Vec::new();
    let mut probes = Vec::new();
    // One worker per engine: in front of its llama-server (`upstream`), or
    // the engine itself (`llama`, no URL).
    let engines: Vec<Option<&String>> = (0..cell.engines).map(|i| urls.get(i)).collect();
    for url in engines {
        let metrics = free_addr()?;
        let mut opts = match (args.engine, url) {
            (EngineKind::LlamaServer, Some(url)) => WorkerOpts::upstream(url, "llama-server"),
            (EngineKind::LlamaServer, None) => bail!("a llama-server per upstream worker"),
            (EngineKind::Llama, _) => WorkerOpts::llama(model, n_ctx, cell.slots),
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
    if let Some(policy) = policy {
        gw.extra_toml = format!("[models.base]\npolicy = \"{policy}\"\n");
    }
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
    wall: Duration,
    cv: f64,
    idle_while_waiting: f64,
    failed: usize,
    computed: Vec<f64>,
}

/// What one streamed request showed.
struct Outcome {
    index: usize,
    ttft: Duration,
    prompt_tokens: u64,
    /// Cached prompt tokens as the reply reports them (`usage` or, from
    /// llama-server through SMG, its `timings`); `None` if it does not.
    cached_tokens: Option<u64>,
}

async fn stream_one(
    client: &Client,
    model: &str,
    messages: &Value,
    max_tokens: u32,
) -> Result<(Duration, u64, Option<u64>)> {
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
    let (mut prompt_tokens, mut cached) = (0, None);
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
        cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .or_else(|| v["timings"]["cache_n"].as_u64())
            .or(cached);
    }
    Ok((
        first.unwrap_or_else(|| started.elapsed()),
        prompt_tokens,
        cached,
    ))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

async fn run_arm(fleet: &Fleet, requests: &[Request], cell: &Cell, args: &Args) -> Result<Figures> {
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
    let messages: Arc<Vec<Value>> = Arc::new(requests.iter().map(|r| r.messages.clone()).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let began = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..cell.concurrency {
        let (messages, next, results) = (
            Arc::clone(&messages),
            Arc::clone(&next),
            Arc::clone(&results),
        );
        let (client, model, max_tokens) =
            (fleet.client.clone(), fleet.model.clone(), args.max_tokens);
        tasks.push(tokio::spawn(async move {
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(m) = messages.get(index) else {
                    break;
                };
                let outcome = stream_one(&client, &model, m, max_tokens).await.map(
                    |(ttft, prompt_tokens, cached_tokens)| Outcome {
                        index,
                        ttft,
                        prompt_tokens,
                        cached_tokens,
                    },
                );
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
    let mut traced = Vec::new();
    for r in results {
        match r {
            Ok(o) => {
                ttfts.push(o.ttft);
                sent += o.prompt_tokens;
                traced.push(o);
            }
            Err(e) => {
                failed += 1;
                eprintln!("  request failed: {e}");
            }
        }
    }
    if args.trace {
        traced.sort_by_key(|o| o.index);
        for o in &traced {
            let cached = o
                .cached_tokens
                .map_or_else(|| "?".to_owned(), |c| c.to_string());
            eprintln!(
                "  #{:<3} group {:<3} prompt {:>5} cached {:>5} ttft {:>6.2} s",
                o.index,
                requests[o.index].group,
                o.prompt_tokens,
                cached,
                o.ttft.as_secs_f64()
            );
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
        wall,
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

/// Runs every arm on one cell, cold engines each.
async fn run_cell(
    cell: &Cell,
    args: &Args,
    model: &Path,
    seed: u64,
) -> Result<Vec<(Arm, Figures)>> {
    let requests = sequence(cell.shape, args.requests, seed);
    let mut arms = args.arms.clone();
    // Unrelated prompts in the family: least_loaded is the yardstick there
    // (nothing to save, balance is all).
    if args.family
        && matches!(cell.shape, Shape::Unrelated { .. })
        && !arms.contains(&Arm::GwLeastLoaded)
    {
        arms.push(Arm::GwLeastLoaded);
    }
    let mut out = Vec::new();
    for arm in arms {
        if arm.smg_policy().is_some() && args.engine != EngineKind::LlamaServer {
            continue;
        }
        let fleet = start_fleet(arm, cell, args, model)
            .await
            .with_context(|| format!("starting the fleet of {}", arm.label()))?;
        if args.trace {
            eprintln!("{} on {}", arm.label(), cell.name);
        }
        let f = run_arm(&fleet, &requests, cell, args).await?;
        drop(fleet);
        eprintln!(
            "  {} {}: hit {:.1} %, TTFT p95 {:.2} s, wall {:.1} s; computed per engine {:?}",
            cell.name,
            arm.label(),
            f.hit * 100.0,
            f.ttft_p95.as_secs_f64(),
            f.wall.as_secs_f64(),
            f.computed
        );
        out.push((arm, f));
    }
    Ok(out)
}

fn print_arms(cell: &Cell, arms: &[(Arm, Figures)], args: &Args) {
    let requests = sequence(cell.shape, args.requests, 0);
    let messages: Vec<Value> = requests.into_iter().map(|r| r.messages).collect();
    let (hashing, parsing) = hashing_cost(&messages);
    let bytes: usize =
        messages.iter().map(|m| m.to_string().len()).sum::<usize>() / messages.len().max(1);
    println!("\n{}", cell.describe());
    println!(
        "prefix block hashes (cache_aware): {:.1} µs per request of ~{bytes} bytes; parsing its JSON body: {:.1} µs",
        hashing.as_secs_f64() * 1e6,
        parsing.as_secs_f64() * 1e6,
    );
    println!(
        "| router | effective hit | TTFT p50 | TTFT p95 | req/s | CV computed | idle while waiting | failed |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (arm, f) in arms {
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
    }
}

fn figures_of(arms: &[(Arm, Figures)], want: Arm) -> Option<&Figures> {
    arms.iter().find(|(a, _)| *a == want).map(|(_, f)| f)
}

/// The family's table: per cell, each arm's hit, TTFT p50/p95 and wall;
/// then, for the first gateway arm against SMG `cache_aware`, the cells
/// it wins on hit and on TTFT p95, the mean hit difference and the mean
/// TTFT p95 ratio; on unrelated prompts, the gateway beside `least_loaded`.
fn print_family(results: &[(Cell, Vec<(Arm, Figures)>)]) {
    println!("\n| cell | fleet | router | hit | TTFT p50 | TTFT p95 | wall |");
    println!("|---|---|---|---|---|---|---|");
    for (cell, arms) in results {
        for (arm, f) in arms {
            println!(
                "| {} | {}x{}, c{} | {} | {:.1} % | {:.2} s | {:.2} s | {:.0} s |",
                cell.name,
                cell.engines,
                cell.slots,
                cell.concurrency,
                arm.label(),
                f.hit * 100.0,
                f.ttft_p50.as_secs_f64(),
                f.ttft_p95.as_secs_f64(),
                f.wall.as_secs_f64()
            );
        }
    }
    let Some(ours) = results.first().and_then(|(_, arms)| {
        arms.iter()
            .map(|(a, _)| *a)
            .find(|a| a.gateway_policy().is_some())
    }) else {
        return;
    };
    let (mut cells, mut hit_wins, mut ttft_wins) = (0, 0, 0);
    let (mut hit_diff, mut ttft_ratio) = (0.0, 0.0);
    for (cell, arms) in results {
        let (Some(g), Some(smg)) = (figures_of(arms, ours), figures_of(arms, Arm::SmgCacheAware))
        else {
            continue;
        };
        if let Shape::Unrelated { .. } = cell.shape {
            if let Some(ll) = figures_of(arms, Arm::GwLeastLoaded) {
                println!(
                    "\nunrelated prompts: {} {:.2} req/s, TTFT p95 {:.2} s; gateway least_loaded {:.2} req/s, {:.2} s ({:.2}x its throughput)",
                    ours.label(),
                    g.rps,
                    g.ttft_p95.as_secs_f64(),
                    ll.rps,
                    ll.ttft_p95.as_secs_f64(),
                    g.rps / ll.rps.max(1e-9)
                );
            }
            continue;
        }
        cells += 1;
        hit_wins += usize::from(g.hit >= smg.hit);
        ttft_wins += usize::from(g.ttft_p95 <= smg.ttft_p95);
        hit_diff += (g.hit - smg.hit) * 100.0;
        ttft_ratio += g.ttft_p95.as_secs_f64() / smg.ttft_p95.as_secs_f64().max(1e-9);
    }
    if cells > 0 {
        println!(
            "\n{} against SMG 1.13 cache_aware over {cells} cells with shared prefixes: hit at least SMG's in {hit_wins}, TTFT p95 at most SMG's in {ttft_wins}; mean hit difference {:+.1} points; mean TTFT p95 ratio {:.2}",
            ours.label(),
            hit_diff / cells as f64,
            ttft_ratio / cells as f64,
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let model = match &args.model_file {
        Some(f) => f.clone(),
        None => harness::model::model_file()?,
    };
    let cells: Vec<Cell> = if args.family {
        family()
            .into_iter()
            .filter(|c| args.cells.is_empty() || args.cells.contains(&c.name))
            .collect()
    } else {
        args.workloads
            .iter()
            .map(|&w| workload_cell(w, &args))
            .collect()
    };
    println!(
        "routebench: {:?} engines, one thread each; {} requests per arm, max_tokens {}, seed {}; load average {}",
        args.engine, args.requests, args.max_tokens, args.seed, load_average()
    );
    let mut results = Vec::new();
    for (k, cell) in cells.iter().enumerate() {
        let seed = args.seed ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let arms = run_cell(cell, &args, &model, seed).await?;
        print_arms(cell, &arms, &args);
        results.push((cell.clone(), arms));
    }
    if args.family {
        print_family(&results);
    }
    println!("\nload average at the end {}", load_average());
    Ok(())
}
