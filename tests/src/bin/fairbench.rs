//! `fairbench`: who gets served when a model's pool saturates (#42, part 3).
//!
//! Two workloads, the same (seeded) sequence on every arm:
//! - `flood`: org B sends short interactive requests (streamed, small
//!   `max_tokens`) at Poisson arrivals, `--interactive-share` (20 %) of the
//!   pool's capacity, first alone (isolated), then while org A floods the
//!   same pool with batch requests offered at `--flood-factor` (10×) its
//!   capacity (A's plan allows `flex` and A asks for it; B's allows and asks
//!   for `priority`). Figures: B's TTFT (first content delta) p50 / p99
//!   isolated and under the flood, and p99 under flood ÷ p99 isolated;
//!   and the floor: B's TTFT p99 while A keeps every slot but one busy
//!   (closed loop, nothing queued), where slots share compute (two
//!   llama-servers on two cores) the best a preempting router can do.
//! - `equal`: two orgs on the same plan (C and D), both backlogged: each
//!   keeps `--backlog-factor` × the pool's slots requests outstanding (more
//!   than the pool runs), C with long requests, D with short ones, so first
//!   come first served gives them very different shares. Service is counted
//!   as it is delivered, in VTC's weighted tokens (input + 2 × output, ÷ the
//!   plan weight, equal here): a request's prompt at its first chunk, its
//!   output spread over its chunks. Figures over the measurement window: the
//!   served-token ratio C / D, Jain's index of the two, and the largest
//!   service gap |served C − served D| (counted from the window's start, and
//!   over any interval inside it) in units of the largest single request's
//!   cost (the paper's bound is 2).
//!
//! The pool's capacity (requests per second of each shape at every slot
//! busy) is measured once per engine kind before the arms: on the
//! llama-servers directly, closed loop at one request per slot; for the
//! simulator from its pace.
//!
//! Arms:
//! - `gw-tiers`: this gateway over `--engines` llama.cpp `llama-server`s
//!   (`--slots` slots, one thread, host prompt cache of `--cache-ram-mib`,
//!   0 by default, each behind an `upstream` worker reporting `--slots` as
//!   its capacity), plans with a tier ceiling per org, queue bound and
//!   timeout on the pool;
//! - `gw-tiers-off`: the same with preemption off (`max_preemptions = 0`):
//!   with it on (the default), B's request finding every slot on A's
//!   `flex` work preempts one, which resumes when a slot frees; A's
//!   completed tokens per second under the flood say what that costs;
//! - `gw-vtc`: the same with one plan for every org and no `service_tier`
//!   sent: what the virtual token counter does alone;
//! - `smg`: SMG 1.13 (scripts/smg.sh) on the same llama-servers, its
//!   priority scheduler on (`x-smg-priority`: `bulk` for A, `interactive`
//!   for B, `default` for C and D), one tenant per org (`--tenant-api-key`,
//!   clamped by `tenant_policies`), per-class bounded queues with the same
//!   bound and timeout, and each worker's `max_running_requests` label set
//!   to its slots (llama-server does not report it, and SMG then counts 64
//!   per worker and never queues); `smg-off` with no class allowed to
//!   preempt;
//! - `sim-tiers`, `sim-tiers-off`, `sim-vtc`: the gateway arms on the synthetic engine (a
//!   fixed decode rate, `max_concurrency` = slots), gateway only;
//! - `gw-tiers-2r`, `sim-tiers-2r`: `gw-tiers` and `sim-tiers` on two
//!   gateway replicas sharing one Redis (`--redis-url`), A and C calling
//!   the first, B and D the second: the pool's order and preemption must
//!   cross replicas (the flood and the interactive requests never meet on
//!   one replica).
//!
//! `--no-queue-config` writes none of #42's settings (tiers, weights, queue)
//! for a gateway built before them, whose config refuses unknown keys: the
//! gateway arms then show first come, first served.
//!
//! `FAIRBENCH_GATEWAY_LOG` and `FAIRBENCH_WORKER_LOG` set the processes'
//! log filters (kept with `IGW_KEEP_LOGS=1`); the B requests slow under
//! the flood are printed with the time they were sent.
//!
//! ```text
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin fairbench -- --engines 2 --slots 2 --duration-secs 60
//! ```

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use harness::process::free_addr;
use harness::smg::ProcessGroup;
use harness::{Client, Gateway, GatewayOpts, LlamaServer, LlamaServerOpts, Worker, WorkerOpts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::Method;
use serde_json::{json, Value};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

#[derive(Parser, Debug)]
#[command(
    about = "A fair share when a pool saturates: priority under a flood, fairness between backlogged orgs"
)]
struct Args {
    /// Engines in the pool.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Slots (sequences decoded together) per engine.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Context tokens per slot (llama-server).
    #[arg(long, default_value_t = 2048)]
    n_ctx: u32,
    /// llama-server's host-memory prompt cache (`--cache-ram`, MiB): a
    /// slot's KV cells are saved there when another request takes the
    /// slot, and a later prompt with their prefix loads them back, so a
    /// preempted generation that resumes on its engine prefills only what
    /// it lacks. 0: a slot's own cells are the only cache.
    #[arg(long, default_value_t = 0)]
    cache_ram_mib: u32,
    /// The gateway's workers leave the choice of slot to llama-server
    /// (`--upstream-no-slot-pinning`): only a slot the engine picks itself
    /// consults its host prompt cache.
    #[arg(long)]
    no_slot_pinning: bool,
    /// Seconds of each measured phase: B isolated, B under the flood, the
    /// equal orgs (each after a warm-up of a fifth of it, 2 to 10 s).
    #[arg(long, default_value_t = 60)]
    duration_secs: u64,
    /// Arms to run, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "gw-tiers,gw-tiers-off,gw-tiers-2r,gw-vtc,smg,smg-off,sim-tiers,sim-tiers-off,sim-tiers-2r,sim-vtc"
    )]
    arms: Vec<Arm>,
    /// Seed of arrivals and prompts.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The GGUF every llama-server serves (default: the reference model).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: Option<PathBuf>,
    /// Output cap of A's batch requests and of C's long ones.
    #[arg(long, default_value_t = 64)]
    batch_max_tokens: u32,
    /// Output cap of B's interactive requests and of D's short ones.
    #[arg(long, default_value_t = 16)]
    interactive_max_tokens: u32,
    /// A's offered load, in multiples of the pool's capacity.
    #[arg(long, default_value_t = 10.0)]
    flood_factor: f64,
    /// B's offered load, as a share of the pool's capacity.
    #[arg(long, default_value_t = 0.2)]
    interactive_share: f64,
    /// Requests each equal org keeps outstanding, in multiples of the
    /// pool's slots.
    #[arg(long, default_value_t = 2)]
    backlog_factor: u32,
    /// Longest wait in the router's queue (the gateway's
    /// `queue_timeout_ms`, SMG's per-class `queue_timeout_secs`).
    #[arg(long, default_value_t = 30)]
    queue_timeout_secs: u64,
    /// Queue bound (the gateway's `queue_max_depth` per pool, SMG's
    /// `queue_size` per class).
    #[arg(long, default_value_t = 64)]
    queue_depth: u32,
    /// Simulator: delay before the first token.
    #[arg(long, default_value_t = 100)]
    sim_ttft_ms: u64,
    /// Simulator: decode rate of each sequence.
    #[arg(long, default_value_t = 20)]
    sim_tokens_per_second: u64,
    /// SMG's routing policy (`power_of_two` compares in-flight requests).
    #[arg(long, default_value = "power_of_two")]
    smg_policy: String,
    /// The Redis the two-replica arms share (a key prefix of their own).
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis_url: String,
    /// Write none of #42's gateway settings (tiers, weights, queue), for a
    /// gateway built before them: its arms then show first come, first served.
    #[arg(long)]
    no_queue_config: bool,
}

impl Args {
    fn phase(&self) -> Duration {
        Duration::from_secs(self.duration_secs)
    }

    fn warmup(&self) -> Duration {
        (self.phase() / 5).clamp(Duration::from_secs(2), Duration::from_secs(10))
    }

    /// How long the requests of a finished phase get to end: a full queue
    /// wait and then some.
    fn grace(&self) -> Duration {
        Duration::from_secs(self.queue_timeout_secs + 90)
    }

    fn total_slots(&self) -> u32 {
        self.slots * self.engines as u32
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Arm {
    GwTiers,
    /// `gw-tiers` with preemption off (`max_preemptions = 0`).
    GwTiersOff,
    GwVtc,
    Smg,
    /// SMG with no class allowed to preempt.
    SmgOff,
    SimTiers,
    SimTiersOff,
    SimVtc,
    /// `gw-tiers` on two replicas.
    #[value(name = "gw-tiers-2r")]
    GwTiers2r,
    /// `sim-tiers` on two replicas.
    #[value(name = "sim-tiers-2r")]
    SimTiers2r,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Engine {
    LlamaServer,
    Simulator,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Arm::GwTiers => "gateway, plans with tiers, preemption (llama-server)",
            Arm::GwTiersOff => "gateway, plans with tiers, no preemption (llama-server)",
            Arm::GwVtc => "gateway, one plan: VTC alone (llama-server)",
            Arm::Smg => "SMG 1.13 priority scheduler, preemption (llama-server)",
            Arm::SmgOff => "SMG 1.13 priority scheduler, no preemption (llama-server)",
            Arm::SimTiers => "gateway, plans with tiers, preemption (simulator)",
            Arm::SimTiersOff => "gateway, plans with tiers, no preemption (simulator)",
            Arm::SimVtc => "gateway, one plan: VTC alone (simulator)",
            Arm::GwTiers2r => {
                "gateway x2 replicas (A on one, B on the other), tiers, preemption (llama-server)"
            }
            Arm::SimTiers2r => {
                "gateway x2 replicas (A on one, B on the other), tiers, preemption (simulator)"
            }
        }
    }

    fn engine(self) -> Engine {
        match self {
            Arm::SimTiers | Arm::SimTiersOff | Arm::SimVtc | Arm::SimTiers2r => Engine::Simulator,
            _ => Engine::LlamaServer,
        }
    }

    /// Gateway arms whose plans give A and B different tier ceilings.
    fn tiers(self) -> bool {
        matches!(
            self,
            Arm::GwTiers
                | Arm::GwTiersOff
                | Arm::SimTiers
                | Arm::SimTiersOff
                | Arm::GwTiers2r
                | Arm::SimTiers2r
        )
    }

    /// Gateway replicas (sharing a Redis when more than one).
    fn replicas(self) -> usize {
        match self {
            Arm::GwTiers2r | Arm::SimTiers2r => 2,
            _ => 1,
        }
    }

    /// Arms whose router may preempt running work for a higher tier.
    fn preempts(self) -> bool {
        !matches!(self, Arm::GwTiersOff | Arm::SimTiersOff | Arm::SmgOff)
    }
}

// ---- orgs and their requests ------------------------------------------------

/// A floods, B is interactive, C and D are the two equal backlogged orgs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Org {
    A,
    B,
    C,
    D,
}

impl Org {
    const ALL: [Org; 4] = [Org::A, Org::B, Org::C, Org::D];

    fn id(self) -> &'static str {
        match self {
            Org::A => "org-a",
            Org::B => "org-b",
            Org::C => "org-c",
            Org::D => "org-d",
        }
    }

    /// The gateway plan of this org's key.
    fn plan(self, tiers: bool) -> &'static str {
        match (tiers, self) {
            (true, Org::A) => "batch",
            (true, Org::B) => "interactive",
            _ => "standard",
        }
    }

    /// The `service_tier` this org asks the gateway for.
    fn service_tier(self, tiers: bool) -> Option<&'static str> {
        match (tiers, self) {
            (true, Org::A) => Some("flex"),
            (true, Org::B) => Some("priority"),
            _ => None,
        }
    }

    /// SMG's class: the `x-smg-priority` header and the tenant's ceiling.
    fn smg_class(self) -> &'static str {
        match self {
            Org::A => "bulk",
            Org::B => "interactive",
            Org::C | Org::D => "default",
        }
    }
}

const WORDS: [&str; 32] = [
    "river", "market", "signal", "garden", "copper", "winter", "ledger", "harbor", "pilot",
    "canvas", "orbit", "timber", "velvet", "cargo", "meadow", "lantern", "quartz", "basket",
    "engine", "violet", "summit", "pepper", "falcon", "marble", "anchor", "candle", "thunder",
    "willow", "saddle", "ribbon", "glacier", "mosaic",
];

/// What one kind of request looks like; every request gets its own words.
#[derive(Clone, Debug)]
struct Shape {
    words: usize,
    instruction: &'static str,
    max_tokens: u32,
    /// Simulator: reply exactly `max_tokens` tokens (`synthetic:reply_tokens`).
    sim: bool,
    seed: u64,
}

impl Shape {
    /// The user message of this shape's `n`-th request.
    fn prompt(&self, n: u64) -> String {
        let mut rng = StdRng::seed_from_u64(self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let words: Vec<&str> = (0..self.words)
            .map(|_| WORDS[rng.random_range(0..WORDS.len())])
            .collect();
        let control = if self.sim {
            format!(" synthetic:reply_tokens={}", self.max_tokens)
        } else {
            String::new()
        };
        format!("{}\n{}{control}", words.join(" "), self.instruction)
    }
}

/// The four request shapes of one engine kind.
struct Shapes {
    batch: Shape,
    interactive: Shape,
    long: Shape,
    short: Shape,
}

impl Shapes {
    fn new(args: &Args, engine: Engine) -> Self {
        let sim = engine == Engine::Simulator;
        let shape = |words, instruction, max_tokens, salt: u64| Shape {
            words,
            instruction,
            max_tokens,
            sim,
            seed: args.seed.wrapping_add(salt),
        };
        let count = "Count from 1 to 500, the numbers separated by commas.";
        let brief = "Answer in one short sentence: which of these words is the longest?";
        Self {
            batch: shape(120, count, args.batch_max_tokens, 1),
            interactive: shape(12, brief, args.interactive_max_tokens, 2),
            long: shape(120, count, args.batch_max_tokens, 3),
            short: shape(30, brief, args.interactive_max_tokens, 4),
        }
    }
}

/// One org's way into an arm's router.
#[derive(Clone)]
struct Caller {
    /// The router's `/v1` with this org's key.
    client: Client,
    model: String,
    service_tier: Option<&'static str>,
    /// SMG's `x-smg-priority`.
    priority: Option<&'static str>,
    /// Content deltas this org received, finished replies or not: its
    /// output tokens delivered (one per delta on llama-server and the
    /// paced simulator), which a flood's end does not cut off.
    delivered: Arc<AtomicU64>,
}

impl Caller {
    fn request(&self, prompt: String, max_tokens: u32) -> reqwest::RequestBuilder {
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(tier) = self.service_tier {
            body["service_tier"] = json!(tier);
        }
        let rb = self.client.request(Method::POST, "/chat/completions");
        match self.priority {
            Some(p) => rb.header("x-smg-priority", p),
            None => rb,
        }
        .json(&body)
    }
}

// ---- one request ----------------------------------------------------------------

/// A reply that streamed to its end.
#[derive(Debug, Clone)]
struct Served {
    /// When it was sent, on the wall clock (to find it in the logs).
    sent_at: std::time::SystemTime,
    /// Until the first content delta.
    ttft: Duration,
    /// When each content delta arrived.
    chunks: Vec<Instant>,
    prompt_tokens: u64,
    completion_tokens: u64,
    /// The `service_tier` the reply says it was served at.
    tier: Option<String>,
}

impl Served {
    /// VTC's weighted cost: input + 2 × output (plan weights are equal).
    fn cost(&self) -> f64 {
        self.prompt_tokens as f64 + 2.0 * self.completion_tokens as f64
    }
}

/// A request that got no whole reply: its HTTP status, or 0 for a
/// transport error or a broken stream.
#[derive(Debug, Clone, Copy)]
struct Refused(u16);

type Outcome = Result<Served, Refused>;

async fn send(caller: &Caller, prompt: String, max_tokens: u32, patience: Duration) -> Outcome {
    let started = Instant::now();
    let sent_at = std::time::SystemTime::now();
    let mut stream = match caller
        .client
        .open_stream(caller.request(prompt, max_tokens))
        .await
    {
        Ok(s) => s,
        Err(_) => return Err(Refused(0)),
    };
    if stream.status != 200 {
        return Err(Refused(stream.status));
    }
    stream.frame_timeout = patience;
    let (mut chunks, mut usage, mut finished, mut tier) = (Vec::new(), None, None, None);
    loop {
        match stream.next_frame().await {
            Ok(Some(frame)) if frame.is_done() => break,
            Ok(Some(frame)) => {
                let v: Value = serde_json::from_str(&frame.data).unwrap_or_default();
                if v["error"].is_object() {
                    // Refused after the head (a queue timeout, say).
                    let status = v["error"]["status"].as_u64().unwrap_or(0);
                    return Err(Refused(u16::try_from(status).unwrap_or(0)));
                }
                let choice = &v["choices"][0];
                if choice["delta"]["content"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
                {
                    chunks.push(Instant::now());
                    caller.delivered.fetch_add(1, Ordering::Relaxed);
                }
                if choice["finish_reason"].is_string() {
                    finished.get_or_insert(Instant::now());
                }
                if v["usage"].is_object() {
                    usage = Some(v["usage"].clone());
                }
                if let Some(t) = v["service_tier"].as_str() {
                    tier = Some(t.to_owned());
                }
            }
            Ok(None) => break,
            Err(_) => return Err(Refused(0)),
        }
    }
    let first = chunks
        .first()
        .copied()
        .or(finished)
        .unwrap_or_else(Instant::now);
    let tokens = |key: &str| usage.as_ref().and_then(|u| u[key].as_u64());
    Ok(Served {
        sent_at,
        ttft: first - started,
        prompt_tokens: tokens("prompt_tokens").unwrap_or(0),
        completion_tokens: tokens("completion_tokens").unwrap_or(chunks.len() as u64),
        chunks,
        tier,
    })
}

// ---- load generators ----------------------------------------------------------

/// A load running in the background: open loop (Poisson arrivals, a task
/// per request) or closed loop (a fixed number of requests outstanding).
struct Load {
    outcomes: Arc<Mutex<Vec<Outcome>>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// The open loop's arrivals.
    driver: Option<JoinHandle<()>>,
}

impl Load {
    /// Sends `shape` at Poisson arrivals of `rate` per second until `until`.
    fn open(caller: Caller, shape: Shape, rate: f64, until: Instant, patience: Duration) -> Load {
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let (out, spawned) = (Arc::clone(&outcomes), Arc::clone(&tasks));
        let driver = tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(shape.seed);
            let mut next = tokio::time::Instant::now();
            for n in (0u64..).take_while(|_| rate > 0.0) {
                next += Duration::from_secs_f64(-(1.0 - rng.random::<f64>()).ln() / rate);
                if next.into_std() >= until {
                    break;
                }
                tokio::time::sleep_until(next).await;
                let (caller, prompt, out) = (caller.clone(), shape.prompt(n), Arc::clone(&out));
                let max_tokens = shape.max_tokens;
                let task = tokio::spawn(async move {
                    let outcome = send(&caller, prompt, max_tokens, patience).await;
                    lock(&out).push(outcome);
                });
                lock(&spawned).push(task);
            }
        });
        Load {
            outcomes,
            tasks,
            driver: Some(driver),
        }
    }

    /// Keeps `outstanding` requests of `shape` in flight until `until`.
    fn closed(
        caller: Caller,
        shape: Shape,
        outstanding: u32,
        until: Instant,
        patience: Duration,
    ) -> Load {
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let next = Arc::new(AtomicU64::new(0));
        let tasks: Vec<JoinHandle<()>> = (0..outstanding)
            .map(|_| {
                let (caller, shape, out, next) = (
                    caller.clone(),
                    shape.clone(),
                    Arc::clone(&outcomes),
                    Arc::clone(&next),
                );
                tokio::spawn(async move {
                    while Instant::now() < until {
                        let prompt = shape.prompt(next.fetch_add(1, Ordering::Relaxed));
                        let outcome = send(&caller, prompt, shape.max_tokens, patience).await;
                        let refused = outcome.is_err();
                        lock(&out).push(outcome);
                        if refused {
                            // Not a hot loop against a router that refuses.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            outcomes,
            tasks: Arc::new(Mutex::new(tasks)),
            driver: None,
        }
    }

    /// Waits for the load to stop sending and its requests to end (at most
    /// `grace` more), aborts what is left, and returns the outcomes.
    async fn finish(self, grace: Duration) -> Vec<Outcome> {
        if let Some(driver) = self.driver {
            let _ = driver.await;
        }
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        let deadline = tokio::time::Instant::now() + grace;
        for mut task in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                task.abort();
            }
        }
        std::mem::take(&mut *lock(&self.outcomes))
    }

    /// Stops at once: requests still waiting or streaming are dropped
    /// (their connections closed). Returns the outcomes so far.
    fn abort(self) -> Vec<Outcome> {
        if let Some(driver) = &self.driver {
            driver.abort();
        }
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        std::mem::take(&mut *lock(&self.outcomes))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---- engines and routers ------------------------------------------------------

/// The llama-servers every llama arm shares, started once.
struct Llamas {
    servers: Vec<LlamaServer>,
    /// What they report on `/v1/models` (the file name): SMG routes by it.
    model_id: String,
}

async fn start_llamas(args: &Args) -> Result<Llamas> {
    let model = match &args.model_file {
        Some(f) => f.clone(),
        None => harness::model::model_file()?,
    };
    let opts = LlamaServerOpts {
        extra_args: vec!["--cache-ram".into(), args.cache_ram_mib.to_string()],
        ..LlamaServerOpts::new(args.n_ctx, args.slots)
    };
    let mut servers = Vec::new();
    for _ in 0..args.engines {
        servers.push(LlamaServer::start_with(&model, &opts).await?);
    }
    let http = reqwest::Client::new();
    for server in &servers {
        // An engine's first decode is slow: not part of any figure.
        http.post(format!("{}/v1/chat/completions", server.url()))
            .json(&json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}))
            .send()
            .await?
            .error_for_status()
            .context("llama-server warm-up")?;
    }
    let model_id = harness::smg::engine_model_id(servers[0].url()).await?;
    Ok(Llamas { servers, model_id })
}

/// One arm's router and workers; dropping it stops them.
struct Stack {
    callers: Vec<(Org, Caller)>,
    workers: Vec<Worker>,
    _gateways: Vec<Gateway>,
    _smg: Option<ProcessGroup>,
}

impl Stack {
    fn caller(&self, org: Org) -> Caller {
        self.callers
            .iter()
            .find(|(o, _)| *o == org)
            .map(|(_, c)| c.clone())
            .expect("every org has a caller")
    }

    /// One tiny request per org: keys, plans and headers are accepted.
    async fn check_callers(&self) -> Result<()> {
        for (org, caller) in &self.callers {
            let reply = caller
                .client
                .send(caller.request("Hi".into(), 1))
                .await
                .with_context(|| format!("{} warm-up", org.id()))?;
            if reply.status != 200 {
                bail!("{} warm-up: {reply}", org.id());
            }
        }
        Ok(())
    }
}

/// Keys of the four orgs: (org, secret).
fn org_keys() -> Vec<(Org, String)> {
    Org::ALL
        .iter()
        .map(|&o| (o, format!("sk-fair-{}", harness::random_hex(24))))
        .collect()
}

/// The gateway config an arm adds: plans, one key per org, the pool's queue.
fn gateway_toml(tiers: bool, preempts: bool, args: &Args, keys: &[(Org, String)]) -> String {
    let plans: &[(&str, &str)] = if tiers {
        &[
            ("batch", "flex"),
            ("interactive", "priority"),
            ("standard", "default"),
        ]
    } else {
        &[("standard", "default")]
    };
    let mut toml = String::new();
    for (name, ceiling) in plans {
        toml += &format!("[plans.{name}]\n");
        if !args.no_queue_config {
            toml += &format!("max_service_tier = \"{ceiling}\"\nweight = 1\n");
        }
    }
    for (org, key) in keys {
        toml += &format!(
            "[[keys]]\nsha256 = \"{}\"\norg = \"{}\"\nname = \"{}\"\nplan = \"{}\"\n",
            harness::hash_key(key),
            org.id(),
            org.id(),
            org.plan(tiers),
        );
    }
    if !args.no_queue_config {
        toml += &format!(
            "[models.base]\nqueue_timeout_ms = {}\nqueue_max_depth = {}\n",
            args.queue_timeout_secs * 1000,
            args.queue_depth,
        );
        if !preempts {
            toml += "max_preemptions = 0\n";
        }
    }
    toml
}

/// The gateway over one worker per engine: `upstream` workers in front of
/// the llama-servers, or paced simulators.
async fn start_gateway(arm: Arm, args: &Args, llamas: Option<&Llamas>) -> Result<Stack> {
    let mut workers = Vec::new();
    for i in 0..args.engines {
        let opts = match (arm.engine(), llamas) {
            (Engine::LlamaServer, Some(l)) => {
                WorkerOpts::upstream(l.servers[i].url(), "llama-server")
            }
            (Engine::LlamaServer, None) => bail!("llama arms need the llama-servers"),
            (Engine::Simulator, _) => {
                WorkerOpts::paced(args.sim_ttft_ms, args.sim_tokens_per_second)
            }
        };
        // The capacity the worker reports: the gateway queues past it.
        let mut opts = WorkerOpts {
            max_concurrency: Some(args.slots),
            ..opts
        };
        if let Ok(filter) = std::env::var("FAIRBENCH_WORKER_LOG") {
            opts.env.push(("RUST_LOG".into(), filter));
        }
        if args.no_slot_pinning && arm.engine() == Engine::LlamaServer {
            opts.extra_args.push("--upstream-no-slot-pinning".into());
        }
        workers.push(Worker::start("base", opts)?);
    }
    let keys = org_keys();
    let mut gw = GatewayOpts {
        extra_toml: gateway_toml(arm.tiers(), arm.preempts(), args, &keys),
        // The gateways' log filter, to see why a figure is what it is.
        rust_log: std::env::var("FAIRBENCH_GATEWAY_LOG").ok(),
        ..GatewayOpts::default()
    };
    gw.workers.insert(
        "base".into(),
        workers.iter().map(|w| w.addr().to_owned()).collect(),
    );
    if arm.replicas() > 1 {
        let prefix = format!("fairbench-{}:", harness::random_hex(6));
        gw.redis = Some((args.redis_url.clone(), prefix));
    }
    let mut gateways = Vec::new();
    for _ in 0..arm.replicas() {
        let gateway = Gateway::start(gw.clone())?;
        wait_until_served(&gateway).await?;
        gateways.push(gateway);
    }
    let callers = keys
        .iter()
        .map(|(org, key)| {
            // With two replicas, A and C on the first, B and D on the
            // second.
            let on = match org {
                Org::A | Org::C => 0,
                Org::B | Org::D => gateways.len() - 1,
            };
            let caller = Caller {
                client: Client::new(&gateways[on].base_url(), Some(key)),
                model: "base".into(),
                service_tier: org.service_tier(arm.tiers()),
                priority: None,
                delivered: Arc::default(),
            };
            (*org, caller)
        })
        .collect();
    Ok(Stack {
        callers,
        workers,
        _gateways: gateways,
        _smg: None,
    })
}

/// Every worker healthy in the gateway's pool: a request is served.
async fn wait_until_served(gateway: &Gateway) -> Result<()> {
    let client = gateway.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let body =
        json!({"model": "base", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]});
    while client
        .post_json("/chat/completions", &body)
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
    Ok(())
}

/// SMG's priority-scheduler YAML. Every class gets the bench's queue bound
/// and timeout, and SMG's shipped starvation thresholds and preemption
/// rights (none with `preempts` false). Of the shipped reservations (floors of 32 `system` and 128
/// `interactive` slots plus shares, sized for large fleets; scaled down to
/// a pool of 4 slots they keep 2 from `bulk`) only `interactive`'s 25 %
/// share is kept: a slot or so held free for B.
fn smg_priority_yaml(args: &Args, preempts: bool) -> String {
    let classes = [
        ("system", 0.0, 5, true),
        ("interactive", 0.25, 5, true),
        ("default", 0.0, 30, false),
        ("bulk", 0.0, 120, false),
    ];
    let mut yaml = String::from("classes:\n");
    for (class, share, starvation, preempt) in classes {
        let preempt = preempt && preempts;
        yaml += &format!(
            "  {class}:\n    reserved_floor: 0\n    reserved_per_slot: {share:.2}\n    queue_size: {}\n    queue_timeout_secs: {}\n    starvation_threshold_secs: {starvation}\n    can_preempt: {preempt}\n",
            args.queue_depth, args.queue_timeout_secs,
        );
    }
    yaml += "tenant_policies:\n";
    for org in Org::ALL {
        yaml += &format!(
            "  \"auth:{}\":\n    max_class: {}\n",
            org.id(),
            org.smg_class()
        );
    }
    yaml
}

/// SMG 1.13 in front of the llama-servers, its priority scheduler on and a
/// tenant per org.
async fn start_smg(args: &Args, llamas: &Llamas, preempts: bool) -> Result<Stack> {
    let dir = std::env::temp_dir();
    let config = dir.join(format!("fairbench-smg-{}.yaml", std::process::id()));
    std::fs::write(&config, smg_priority_yaml(args, preempts))?;
    let log_path = dir.join(format!("fairbench-smg-{}.log", std::process::id()));
    eprintln!("SMG logs to {}", log_path.display());
    let log = std::fs::File::create(&log_path)?;
    let (listen, prometheus) = (free_addr()?, free_addr()?);
    let (host, port) = listen.rsplit_once(':').context("free address")?;
    let (_, prom_port) = prometheus.rsplit_once(':').context("free address")?;
    let admin_key = format!("sk-fair-admin-{}", harness::random_hex(16));
    let keys = org_keys();
    let mut cmd = Command::new(harness::smg::binary()?);
    cmd.args(["launch", "--host", host, "--port", port, "--worker-urls"])
        .args(llamas.servers.iter().map(LlamaServer::url))
        .args(["--policy", &args.smg_policy]);
    if args.smg_policy == "power_of_two" {
        cmd.args(["--power-of-two-load-metric", "least_requests"]);
    }
    cmd.args([
        "--prometheus-port",
        prom_port,
        "--prometheus-host",
        "127.0.0.1",
    ])
    .args([
        "--priority-scheduler-enabled",
        "--priority-scheduler-config",
    ])
    .arg(&config)
    .args(["--priority-scheduler-default-max-class", "default"])
    .arg("--control-plane-api-keys")
    .arg(format!("fairbench:fairbench:admin:{admin_key}"));
    for (org, key) in &keys {
        cmd.arg("--tenant-api-key")
            .arg(format!("{}:{key}", org.id()));
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .process_group(0)
        .spawn()
        .context("starting SMG")?;
    let smg = ProcessGroup(child);
    let base = format!("http://{listen}");
    let admin = Client::new(&base, Some(&admin_key));
    harness::smg::workers_ready(&admin, args.engines).await?;
    smg_set_capacity(&admin, args.slots).await?;
    smg_capacity_seen(&log_path, args.total_slots()).await?;
    let callers = keys
        .iter()
        .map(|(org, key)| {
            let caller = Caller {
                client: Client::new(&format!("{base}/v1"), Some(key)),
                model: llamas.model_id.clone(),
                service_tier: None,
                priority: Some(org.smg_class()),
                delivered: Arc::default(),
            };
            (*org, caller)
        })
        .collect();
    Ok(Stack {
        callers,
        workers: Vec::new(),
        _smg: Some(smg),
        _gateways: Vec::new(),
    })
}

/// Labels each worker with `max_running_requests` = its slots: SMG's
/// scheduler sizes its slot pool from that label (SGLang reports it;
/// llama-server does not, and SMG then assumes 64 per worker).
async fn smg_set_capacity(admin: &Client, slots: u32) -> Result<()> {
    let workers: Value = serde_json::from_slice(&admin.get("/workers").await?.body)?;
    for w in workers["workers"].as_array().into_iter().flatten() {
        let id = w["id"].as_str().context("a worker without id")?;
        let patch = json!({"labels": {"max_running_requests": slots.to_string()}});
        let reply = admin
            .send(
                admin
                    .request(Method::PATCH, &format!("/workers/{id}"))
                    .json(&patch),
            )
            .await?;
        if !(200..300).contains(&reply.status) {
            bail!("SMG refused the worker label: {reply}");
        }
    }
    Ok(())
}

/// Waits for SMG's log to say its scheduler counts `slots` slots, all
/// reported by the workers; fails if the scheduler fell back to legacy
/// admission.
async fn smg_capacity_seen(log: &Path, slots: u32) -> Result<()> {
    let wanted = format!("new={slots} ");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = strip_ansi(&std::fs::read_to_string(log).unwrap_or_default());
        if text.contains("falling back to legacy admission") {
            bail!(
                "SMG's priority scheduler did not start (see {})",
                log.display()
            );
        }
        if text.lines().any(|l| {
            l.contains("backend capacity updated")
                && l.contains(&wanted)
                && l.contains("new_source=WorkerReported")
        }) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "SMG's scheduler never counted {slots} slots (see {})",
                log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // Skip to the end of the escape sequence (`ESC [ ... m`).
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Waits until no engine or worker runs or queues anything for a second:
/// a phase starts on an idle pool whatever the last one left behind.
async fn wait_idle(stack: &Stack, llamas: Option<&Llamas>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut quiet = 0;
    while quiet < 4 {
        let mut busy = 0;
        for s in llamas.map(|l| l.servers.as_slice()).unwrap_or_default() {
            let (running, waiting) = s.running_and_waiting().await.unwrap_or((1, 0));
            busy += running + waiting;
        }
        for w in &stack.workers {
            let load = w.load().await.unwrap_or_default();
            busy += load.running + load.queued;
        }
        quiet = if busy == 0 { quiet + 1 } else { 0 };
        if Instant::now() > deadline {
            bail!("the pool is still busy 300 s after the phase ended");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

// ---- capacity -------------------------------------------------------------------

/// Requests per second the pool serves with every slot busy, per shape.
#[derive(Clone, Copy, Debug)]
struct Capacity {
    batch_rps: f64,
    interactive_rps: f64,
}

/// The simulator's capacity follows from its pace.
fn sim_capacity(args: &Args) -> Capacity {
    let service = |tokens: u32| {
        args.sim_ttft_ms as f64 / 1000.0 + f64::from(tokens) / args.sim_tokens_per_second as f64
    };
    let slots = f64::from(args.total_slots());
    Capacity {
        batch_rps: slots / service(args.batch_max_tokens),
        interactive_rps: slots / service(args.interactive_max_tokens),
    }
}

/// The llama-servers' capacity, measured on them directly: one request
/// per slot, twice over, for each shape.
async fn llama_capacity(args: &Args, llamas: &Llamas, shapes: &Shapes) -> Result<Capacity> {
    Ok(Capacity {
        batch_rps: closed_loop_rate(args, llamas, &shapes.batch).await?,
        interactive_rps: closed_loop_rate(args, llamas, &shapes.interactive).await?,
    })
}

async fn closed_loop_rate(args: &Args, llamas: &Llamas, shape: &Shape) -> Result<f64> {
    const ROUNDS: u64 = 2;
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (e, server) in llamas.servers.iter().enumerate() {
        for s in 0..u64::from(args.slots) {
            let (http, url, model, shape) = (
                http.clone(),
                format!("{}/v1/chat/completions", server.url()),
                llamas.model_id.clone(),
                shape.clone(),
            );
            let lane = ((e as u64) << 32) | (s << 16);
            tasks.push(tokio::spawn(async move {
                for r in 0..ROUNDS {
                    let body = json!({
                        "model": model,
                        "messages": [{"role": "user", "content": shape.prompt(u64::MAX - lane - r)}],
                        "max_tokens": shape.max_tokens,
                        "temperature": 0,
                    });
                    http.post(&url).json(&body).send().await?.error_for_status()?;
                }
                anyhow::Ok(())
            }));
        }
    }
    for t in tasks {
        t.await??;
    }
    let requests = ROUNDS * u64::from(args.total_slots());
    Ok(requests as f64 / started.elapsed().as_secs_f64())
}

// ---- the workloads --------------------------------------------------------------

struct FloodFigures {
    isolated: Vec<Outcome>,
    /// B while A keeps every slot but one busy and nothing queued: the
    /// floor of B's TTFT where slots share compute (A's decoding slows
    /// B's prefill), which preemption cannot go below.
    floor: Vec<Outcome>,
    flooded: Vec<Outcome>,
    flood: Vec<Outcome>,
    /// How long A flooded: its completed tokens per second are over it.
    flood_secs: f64,
    /// A's output tokens delivered while it flooded, its unfinished
    /// replies' (preempted, or cut by the flood's end) included.
    flood_delivered: u64,
}

/// B alone, then B while A floods.
async fn run_flood(
    stack: &Stack,
    llamas: Option<&Llamas>,
    args: &Args,
    shapes: &Shapes,
    cap: Capacity,
) -> Result<FloodFigures> {
    let (b, a) = (stack.caller(Org::B), stack.caller(Org::A));
    let b_rate = args.interactive_share * cap.interactive_rps;
    let patience = args.grace();
    let isolated = Load::open(
        b.clone(),
        shapes.interactive.clone(),
        b_rate,
        Instant::now() + args.phase(),
        patience,
    )
    .finish(args.grace())
    .await;
    wait_idle(stack, llamas).await?;
    let floor = {
        let until = Instant::now() + args.warmup() + args.phase();
        let busy = args.total_slots().saturating_sub(1);
        let a_busy = Load::closed(a.clone(), shapes.batch.clone(), busy, until, patience);
        tokio::time::sleep(args.warmup()).await;
        let b_floor = Load::open(
            b.clone(),
            shapes.interactive.clone(),
            b_rate,
            Instant::now() + args.phase(),
            patience,
        );
        let (b_floor, _) = tokio::join!(b_floor.finish(args.grace()), a_busy.finish(args.grace()));
        b_floor
    };
    wait_idle(stack, llamas).await?;
    // A floods until B's last request has ended.
    let flood_started = Instant::now();
    let a_delivered_before = a.delivered.load(Ordering::Relaxed);
    let flood = Load::open(
        a.clone(),
        shapes.batch.clone(),
        args.flood_factor * cap.batch_rps,
        Instant::now() + args.warmup() + args.phase() + args.grace(),
        patience,
    );
    tokio::time::sleep(args.warmup()).await;
    let flooded = Load::open(
        b,
        shapes.interactive.clone(),
        b_rate,
        Instant::now() + args.phase(),
        patience,
    )
    .finish(args.grace())
    .await;
    let flood = flood.abort();
    // The slow ones, to find in the logs (`FAIRBENCH_GATEWAY_LOG`).
    let (_, isolated_p99, _, _) = ttft_summary(&isolated);
    for s in flooded.iter().flatten() {
        if s.ttft > isolated_p99 * 3 / 2 {
            let at = s
                .sent_at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!(
                "slow under the flood: B sent at {}.{:03} (unix s), TTFT {:.3} s",
                at.as_secs(),
                at.subsec_millis(),
                s.ttft.as_secs_f64()
            );
        }
    }
    let flood_secs = flood_started.elapsed().as_secs_f64();
    let flood_delivered = a.delivered.load(Ordering::Relaxed) - a_delivered_before;
    wait_idle(stack, llamas).await?;
    Ok(FloodFigures {
        isolated,
        floor,
        flooded,
        flood,
        flood_secs,
        flood_delivered,
    })
}

struct EqualFigures {
    served: [f64; 2],
    largest_cost: f64,
    gap_from_start: f64,
    gap_any_interval: f64,
    requests: [usize; 2],
    refused: String,
}

/// C (long requests) and D (short ones), both backlogged, on equal plans.
async fn run_equal(
    stack: &Stack,
    llamas: Option<&Llamas>,
    args: &Args,
    shapes: &Shapes,
) -> Result<EqualFigures> {
    let start = Instant::now() + args.warmup();
    let end = start + args.phase();
    let outstanding = args.backlog_factor * args.total_slots();
    let load = |org, shape: &Shape| {
        Load::closed(
            stack.caller(org),
            shape.clone(),
            outstanding,
            end,
            args.grace(),
        )
    };
    let (c, d) = (load(Org::C, &shapes.long), load(Org::D, &shapes.short));
    let (c, d) = tokio::join!(c.finish(args.grace()), d.finish(args.grace()));
    wait_idle(stack, llamas).await?;
    let (c_events, d_events) = (service_events(&c), service_events(&d));
    let (gap_from_start, gap_any_interval) = largest_gap(&c_events, &d_events, start, end);
    let served = |outcomes: &[Outcome]| outcomes.iter().filter(|o| o.is_ok()).count();
    Ok(EqualFigures {
        served: [
            served_in(&c_events, start, end),
            served_in(&d_events, start, end),
        ],
        largest_cost: c
            .iter()
            .chain(&d)
            .flatten()
            .map(Served::cost)
            .fold(0.0, f64::max),
        gap_from_start,
        gap_any_interval,
        requests: [served(&c), served(&d)],
        refused: refusals(&[c.as_slice(), d.as_slice()].concat()),
    })
}

/// When an org received its service, in weighted tokens: each served
/// request's prompt at its first chunk, its output spread over its chunks.
fn service_events(outcomes: &[Outcome]) -> Vec<(Instant, f64)> {
    let mut events = Vec::new();
    for s in outcomes.iter().flatten() {
        let Some(&first) = s.chunks.first() else {
            continue;
        };
        events.push((first, s.prompt_tokens as f64));
        let per_chunk = 2.0 * s.completion_tokens as f64 / s.chunks.len() as f64;
        events.extend(s.chunks.iter().map(|&t| (t, per_chunk)));
    }
    events.sort_by_key(|e| e.0);
    events
}

fn served_in(events: &[(Instant, f64)], start: Instant, end: Instant) -> f64 {
    events
        .iter()
        .filter(|(t, _)| (start..end).contains(t))
        .map(|(_, w)| w)
        .sum()
}

/// The largest |served C − served D| inside the window: counted from its
/// start, and over any interval in it (the range of the running difference).
fn largest_gap(
    c: &[(Instant, f64)],
    d: &[(Instant, f64)],
    start: Instant,
    end: Instant,
) -> (f64, f64) {
    let mut merged: Vec<(Instant, f64)> = c
        .iter()
        .copied()
        .chain(d.iter().map(|&(t, w)| (t, -w)))
        .filter(|(t, _)| (start..end).contains(t))
        .collect();
    merged.sort_by_key(|e| e.0);
    let (mut diff, mut lowest, mut highest) = (0.0f64, 0.0f64, 0.0f64);
    for (_, w) in merged {
        diff += w;
        lowest = lowest.min(diff);
        highest = highest.max(diff);
    }
    (highest.max(-lowest), highest - lowest)
}

/// Jain's fairness index: 1 when every share is equal, 1/n at worst.
fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

// ---- report ---------------------------------------------------------------------

/// TTFT p50 and p99 of the served outcomes, and how many were refused.
fn ttft_summary(outcomes: &[Outcome]) -> (Duration, Duration, usize, usize) {
    let mut ttfts: Vec<Duration> = outcomes.iter().flatten().map(|s| s.ttft).collect();
    ttfts.sort();
    (
        percentile(&ttfts, 0.5),
        percentile(&ttfts, 0.99),
        ttfts.len(),
        outcomes.len() - ttfts.len(),
    )
}

fn refusals(outcomes: &[Outcome]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for Refused(status) in outcomes.iter().filter_map(|o| o.as_ref().err()) {
        *counts.entry(*status).or_insert(0) += 1;
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(status, n)| match status {
            0 => format!("{n} broken"),
            s => format!("{n} x HTTP {s}"),
        })
        .collect();
    if counts.is_empty() {
        "none".into()
    } else {
        counts.join(", ")
    }
}

/// The tiers the served replies name, with their counts (`-`: none named).
fn tiers(outcomes: &[Outcome]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for s in outcomes.iter().flatten() {
        *counts.entry(s.tier.as_deref().unwrap_or("-")).or_insert(0) += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
    counts.join(", ")
}

fn flood_row(arm: Arm, f: &FloodFigures) -> String {
    let secs = |d: Duration| d.as_secs_f64();
    let (i50, i99, i_ok, i_bad) = ttft_summary(&f.isolated);
    let (f50, f99, f_ok, f_bad) = ttft_summary(&f.flooded);
    let (_, floor99, _, _) = ttft_summary(&f.floor);
    let over = |base: Duration| {
        if base.is_zero() {
            f64::NAN
        } else {
            secs(f99) / secs(base)
        }
    };
    let (ratio, over_floor) = (over(i99), over(floor99));
    let a_served = f.flood.iter().filter(|o| o.is_ok()).count();
    let a_tokens: u64 = f
        .flood
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .map(|s| s.completion_tokens)
        .sum();
    format!(
        "| {} | {:.3} s | {:.3} s | {:.3} s | {:.3} s | {ratio:.2}x | {:.3} s | {over_floor:.2}x | {i_ok} / {i_bad} | {f_ok} / {f_bad} | {a_served} served, {:.1} tok/s ({:.1} delivered); refused: {} | {}; {} |",
        arm.label(),
        secs(i50),
        secs(i99),
        secs(f50),
        secs(f99),
        secs(floor99),
        a_tokens as f64 / f.flood_secs.max(f64::EPSILON),
        f.flood_delivered as f64 / f.flood_secs.max(f64::EPSILON),
        refusals(&f.flood),
        tiers(&f.flooded),
        tiers(&f.flood),
    )
}

fn equal_row(arm: Arm, e: &EqualFigures) -> String {
    let [c, d] = e.served;
    let in_costs = |gap: f64| {
        if e.largest_cost > 0.0 {
            gap / e.largest_cost
        } else {
            f64::NAN
        }
    };
    format!(
        "| {} | {c:.0} | {d:.0} | {:.2} | {:.3} | {:.0} | {:.2} | {:.2} | {} / {} | {} |",
        arm.label(),
        if d > 0.0 { c / d } else { f64::NAN },
        jain(&e.served),
        e.largest_cost,
        in_costs(e.gap_from_start),
        in_costs(e.gap_any_interval),
        e.requests[0],
        e.requests[1],
        e.refused,
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---- main -----------------------------------------------------------------------

/// What every arm of one engine kind shares: the request shapes and the
/// pool's measured capacity.
struct Bench {
    shapes: Shapes,
    capacity: Capacity,
}

fn describe(engine: Engine, args: &Args, cap: Capacity) {
    println!(
        "capacity ({engine:?}, {} slots): {:.2} batch req/s, {:.2} interactive req/s -> A offers {:.2} req/s, B {:.2} req/s",
        args.total_slots(),
        cap.batch_rps,
        cap.interactive_rps,
        args.flood_factor * cap.batch_rps,
        args.interactive_share * cap.interactive_rps,
    );
}

async fn run_arm(
    arm: Arm,
    args: &Args,
    bench: &Bench,
    llamas: Option<&Llamas>,
) -> Result<(FloodFigures, EqualFigures)> {
    let stack = match arm {
        Arm::Smg | Arm::SmgOff => {
            start_smg(
                args,
                llamas.context("SMG needs the llama-servers")?,
                arm.preempts(),
            )
            .await?
        }
        _ => start_gateway(arm, args, llamas).await?,
    };
    stack.check_callers().await?;
    let llamas = llamas.filter(|_| arm.engine() == Engine::LlamaServer);
    wait_idle(&stack, llamas).await?;
    eprintln!("{}: flood", arm.label());
    let flood = run_flood(&stack, llamas, args, &bench.shapes, bench.capacity).await?;
    eprintln!("{}: equal", arm.label());
    let equal = run_equal(&stack, llamas, args, &bench.shapes).await?;
    Ok((flood, equal))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    println!(
        "fairbench: {} engines x {} slots, host prompt cache {} MiB; phases of {} s after {} s of warm-up; queue {} deep, {} s timeout; load average at start {}",
        args.engines,
        args.slots,
        args.cache_ram_mib,
        args.duration_secs,
        args.warmup().as_secs(),
        args.queue_depth,
        args.queue_timeout_secs,
        load_average(),
    );
    if args.no_queue_config {
        println!("--no-queue-config: the gateway runs without #42's tiers, weights and queue (first come, first served)");
    }
    let wants_llama = args.arms.iter().any(|a| a.engine() == Engine::LlamaServer);
    let llamas = match wants_llama {
        true => Some(start_llamas(&args).await?),
        false => None,
    };
    let mut llama_bench = None;
    if let Some(l) = &llamas {
        let shapes = Shapes::new(&args, Engine::LlamaServer);
        let capacity = llama_capacity(&args, l, &shapes).await?;
        describe(Engine::LlamaServer, &args, capacity);
        llama_bench = Some(Bench { shapes, capacity });
    }
    let sim_bench = Bench {
        shapes: Shapes::new(&args, Engine::Simulator),
        capacity: sim_capacity(&args),
    };
    if args.arms.iter().any(|a| a.engine() == Engine::Simulator) {
        describe(Engine::Simulator, &args, sim_bench.capacity);
    }
    let mut flood_rows = Vec::new();
    let mut equal_rows = Vec::new();
    for &arm in &args.arms {
        let bench = match arm.engine() {
            Engine::LlamaServer => llama_bench.as_ref().context("llama-servers started")?,
            Engine::Simulator => &sim_bench,
        };
        let (flood, equal) = run_arm(arm, &args, bench, llamas.as_ref())
            .await
            .with_context(|| format!("arm {}", arm.label()))?;
        flood_rows.push(flood_row(arm, &flood));
        equal_rows.push(equal_row(arm, &equal));
    }
    println!(
        "\nWorkload \"flood\": B interactive at {:.0} % of capacity, alone then under A's flood at {:.0}x (TTFT = first content delta)",
        args.interactive_share * 100.0,
        args.flood_factor,
    );
    println!("| arm | B TTFT p50 isolated | B TTFT p99 isolated | B TTFT p50 under flood | B TTFT p99 under flood | p99 flood / isolated | B TTFT p99, A on all slots but one (floor) | p99 flood / floor | B served / refused, isolated | B served / refused, flood | A | tiers served B; A |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &flood_rows {
        println!("{row}");
    }
    println!(
        "\nWorkload \"equal\": C (long requests) and D (short ones) on equal plans, each {} requests outstanding; weighted tokens = input + 2 x output",
        args.backlog_factor * args.total_slots(),
    );
    println!("| arm | served C | served D | ratio C/D | Jain | largest request cost | gap from window start (request costs) | gap over any interval (request costs) | requests served C / D | refused |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &equal_rows {
        println!("{row}");
    }
    println!("\ntargets (#42, #56): p99 flood / isolated <= 1.5; A's tok/s with preemption >= 90 % of without; Jain >= 0.98; gap <= 2 request costs");
    println!("load average at the end {}", load_average());
    Ok(())
}
