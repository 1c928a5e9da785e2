//! `loadgen`: load and overhead measurements of the gateway.
//!
//! By default it starts its own stack (synthetic workers, zero delay unless
//! `--ttft-ms` / `--tokens-per-second`, and one gateway) and drives chat
//! completions at it, closed-loop (`--concurrency N`) or open-loop
//! (`--rate R` per second), streaming (`--stream`) or not. It reports
//! throughput, latency, time to first token and inter-token latency, tokens
//! per second, errors by status, and the gateway process's CPU time per
//! request and per streamed token and its peak memory, all read from
//! `/proc` over the measured window (warm-up excluded).
//!
//! `--baseline` sends the same workload straight to the worker over gRPC,
//! so the gateway's cost is the difference. `--idle-streams N` holds N open,
//! idle streams and reports the gateway's memory per stream,
//! `--idle-websockets N` the same for upgraded Responses WebSocket
//! connections (`harness::idle`). `--url` targets a running gateway instead
//! (`--gateway-pid` to read its CPU); `--gateway-bin` starts another
//! build's gateway (a before/after in one run).
//!
//! ```text
//! cargo run --release -p tests --bin loadgen -- --concurrency 32 --duration 10
//! cargo run --release -p tests --bin loadgen -- --stream --reply-tokens 256 --concurrency 64
//! cargo run --release -p tests --bin loadgen -- --rate 1000 --duration 300 --workers-per-model 3
//! cargo run --release -p tests --bin loadgen -- --baseline --concurrency 32
//! cargo run --release -p tests --bin loadgen -- --idle-streams 10000
//! cargo run --release -p tests --bin loadgen -- --idle-websockets 1000 --gateway-bin OLD/gateway
//! ```

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use harness::process::{free_addr, ChildProcess, Spec};
use harness::procfs::{self, thread_cpu};
use harness::{idle, GatewayOpts, Stack, TestKey, WorkerOpts};
use inference_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(Parser, Debug, Clone)]
#[command(about = "Drive chat completions at the gateway (or a worker) and report its cost")]
struct Args {
    /// Target a running gateway (`http://host:port/v1`) instead of starting a stack.
    #[arg(long)]
    url: Option<String>,
    /// API key for `--url`.
    #[arg(long, default_value = "sk-local-dev")]
    key: String,
    /// Pid of the gateway behind `--url`, to read its CPU and memory.
    #[arg(long)]
    gateway_pid: Option<u32>,
    /// Model to call.
    #[arg(long, default_value = "base")]
    model: String,
    /// Workers per model in the started stack.
    #[arg(long, default_value_t = 1)]
    workers_per_model: usize,
    /// Simulated time to first token of the started workers.
    #[arg(long, default_value_t = 0)]
    ttft_ms: u64,
    /// Simulated decode speed of the started workers (0 = unpaced).
    #[arg(long, default_value_t = 0)]
    tokens_per_second: u64,
    /// Public listener threads of the started gateway (its default if unset).
    #[arg(long)]
    gateway_threads: Option<usize>,
    /// Closed loop: this many requests in flight at all times.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Open loop: start this many requests per second, whatever the latency
    /// (overrides --concurrency).
    #[arg(long)]
    rate: Option<f64>,
    /// Measured seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before measuring (not counted).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Streaming requests (SSE), with `stream_options.include_usage`.
    #[arg(long)]
    stream: bool,
    /// Completion tokens per reply (`synthetic:reply_tokens`).
    #[arg(long, default_value_t = 16)]
    reply_tokens: u32,
    /// Request body variant.
    #[arg(long, value_enum, default_value_t = Payload::Plain)]
    payload: Payload,
    /// Repeated-prefix workload: each request starts with one of N long
    /// shared system prompts (about 1,500 tokens) and ends with a short
    /// varying question; the report then shows the share of prompt tokens
    /// served from the workers' prefix caches. 0 = off.
    #[arg(long, default_value_t = 0)]
    prefixes: usize,
    /// Selection policy of the started gateway's pool (`prefix_affinity`,
    /// `least_loaded`); the gateway's default if unset.
    #[arg(long)]
    policy: Option<String>,
    /// Prefix-cache size of the started workers, in 64-token blocks (their
    /// default if unset); small values make cache locality matter.
    #[arg(long)]
    prefix_cache_blocks: Option<u64>,
    /// Send the same workload straight to the worker over gRPC.
    #[arg(long)]
    baseline: bool,
    /// Hold this many idle open streams and report memory per stream.
    #[arg(long, default_value_t = 0)]
    idle_streams: usize,
    /// Hold this many idle upgraded Responses WebSocket connections (no
    /// response sent) and report memory per connection.
    #[arg(long, default_value_t = 0)]
    idle_websockets: usize,
    /// With --idle-streams / --idle-websockets: how many are being opened
    /// at once.
    #[arg(long, default_value_t = 32)]
    open_parallelism: usize,
    /// Start this `gateway` binary instead of the build's (another
    /// commit's, for a before/after in one run; the workers stay the
    /// build's).
    #[arg(long)]
    gateway_bin: Option<std::path::PathBuf>,
    /// Measure the machine's floor instead: the CPU of one lone loopback
    /// write that wakes a waiting reader (a token relayed on its own).
    #[arg(long)]
    write_floor: bool,
    /// The marginal gateway CPU of one relayed token: streams of SHORT and
    /// of LONG tokens alternate (two windows each, same stack), and the
    /// report gives the slope of gateway CPU per request against reply
    /// length (CPU per relayed token, the per-stream cost taken out) and
    /// the intercept (the per-stream cost). Implies --stream.
    #[arg(long, value_name = "SHORT,LONG", value_parser = parse_pair)]
    token_slope: Option<(u32, u32)>,
    /// Drive `floor_proxy` (started over the stack's first worker) instead
    /// of the gateway: the least an HTTP/1 front with a gRPC client costs
    /// per non-streaming request on this machine.
    #[arg(long)]
    floor: bool,
    /// Print the report as JSON too.
    #[arg(long)]
    json: bool,
}

fn parse_pair(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s.split_once(',').ok_or("expected SHORT,LONG")?;
    let (a, b): (u32, u32) = (
        a.trim().parse().map_err(|e| format!("{e}"))?,
        b.trim().parse().map_err(|e| format!("{e}"))?,
    );
    if a >= b {
        return Err("SHORT must be less than LONG".into());
    }
    Ok((a, b))
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Payload {
    /// A system and a user message.
    Plain,
    /// Plus 3 function tools and a `json_schema` response format.
    Tools,
}

// ---- workload ----------------------------------------------------------------

const SYSTEM: &str = "You are a concise assistant.";

fn user_text(args: &Args) -> String {
    format!(
        "Write a short note about load testing an inference gateway. synthetic:reply_tokens={}",
        args.reply_tokens
    )
}

fn tool_defs() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        (
            "get_weather",
            "Current weather for a city.",
            json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "unit"], "additionalProperties": false}),
        ),
        (
            "search_docs",
            "Search the documentation.",
            json!({"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query", "limit"], "additionalProperties": false}),
        ),
        (
            "create_ticket",
            "Open a support ticket.",
            json!({"type": "object", "properties": {"title": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "high"]}}, "required": ["title", "priority"], "additionalProperties": false}),
        ),
    ]
}

fn note_schema() -> Value {
    json!({"type": "object", "properties": {"title": {"type": "string"}, "points": {"type": "array", "items": {"type": "string"}}}, "required": ["title", "points"], "additionalProperties": false})
}

/// The chat request body, serialised once.
fn http_body(args: &Args) -> Bytes {
    let mut body = json!({
        "model": args.model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user_text(args)},
        ],
    });
    if args.stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    if args.payload == Payload::Tools {
        body["tools"] = tool_defs()
            .into_iter()
            .map(|(name, description, parameters)| {
                json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters, "strict": true}})
            })
            .collect();
        body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "note", "schema": note_schema(), "strict": true}});
    }
    Bytes::from(body.to_string())
}

/// The request bodies to send: one, or with `--prefixes N` every
/// combination of N shared prefixes and 16 short questions.
fn http_bodies(args: &Args) -> Vec<Bytes> {
    if args.prefixes == 0 {
        return vec![http_body(args)];
    }
    let mut bodies = Vec::new();
    for p in 0..args.prefixes {
        let prefix: String = (0..300)
            .map(|i| format!("Policy {p} clause {i} applies. "))
            .collect();
        for q in 0..16 {
            let mut body = json!({
                "model": args.model,
                "messages": [
                    {"role": "system", "content": prefix},
                    {"role": "user", "content": format!("Question {q}: which clause matters? synthetic:reply_tokens={}", args.reply_tokens)},
                ],
            });
            if args.stream {
                body["stream"] = json!(true);
                body["stream_options"] = json!({"include_usage": true});
            }
            bodies.push(Bytes::from(body.to_string()));
        }
    }
    bodies
}

/// The same workload as a worker request (what the gateway would send).
fn grpc_request(args: &Args) -> pb::GenerateRequest {
    let text = |role: &str, t: &str| pb::Message {
        role: role.into(),
        content: vec![pb::ContentPart {
            part: Some(pb::content_part::Part::Text(t.into())),
        }],
        ..Default::default()
    };
    let mut req = pb::GenerateRequest {
        request_id: "loadgen".into(),
        model: args.model.clone(),
        messages: vec![text("system", SYSTEM), text("user", &user_text(args))],
        sampling: Some(pb::Sampling::default()),
        ..Default::default()
    };
    if args.payload == Payload::Tools {
        req.tools = tool_defs()
            .into_iter()
            .map(|(name, description, parameters)| pb::FunctionTool {
                name: name.into(),
                description: description.into(),
                parameters_json: parameters.to_string(),
                strict: true,
            })
            .collect();
        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonSchema as i32,
            schema_name: "note".into(),
            schema_json: note_schema().to_string(),
            strict: true,
        });
    }
    req
}

// ---- one request -------------------------------------------------------------

/// What one request saw.
#[derive(Debug, Default)]
struct Outcome {
    /// HTTP status, or `None` for a transport failure.
    status: Option<u16>,
    error: Option<String>,
    latency: Duration,
    ttft: Option<Duration>,
    /// Gaps between consecutive token arrivals.
    gaps: Vec<Duration>,
    completion_tokens: u64,
    prompt_tokens: u64,
    cached_tokens: u64,
    finished_at: Option<Instant>,
}

#[derive(Deserialize)]
struct ChunkLite<'a> {
    #[serde(borrow, default)]
    choices: Vec<ChoiceLite<'a>>,
    #[serde(default)]
    usage: Option<UsageLite>,
}

#[derive(Deserialize)]
struct ChoiceLite<'a> {
    #[serde(borrow, default)]
    delta: Option<DeltaLite<'a>>,
}

#[derive(Deserialize)]
struct DeltaLite<'a> {
    #[serde(borrow, default)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Value>,
}

#[derive(Deserialize)]
struct UsageLite {
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetailsLite>,
}

#[derive(Deserialize)]
struct PromptDetailsLite {
    #[serde(default)]
    cached_tokens: u64,
}

impl UsageLite {
    fn record(&self, o: &mut Outcome) {
        o.completion_tokens = self.completion_tokens;
        o.prompt_tokens = self.prompt_tokens;
        o.cached_tokens = self
            .prompt_tokens_details
            .as_ref()
            .map_or(0, |d| d.cached_tokens);
    }
}

#[derive(Deserialize)]
struct CompletionLite {
    usage: Option<UsageLite>,
}

async fn http_shot(client: &reqwest::Client, url: &str, key: &str, body: Bytes) -> Outcome {
    let start = Instant::now();
    let mut o = Outcome::default();
    let resp = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            o.error = Some(e.to_string());
            o.latency = start.elapsed();
            return o;
        }
    };
    o.status = Some(resp.status().as_u16());
    let streaming = resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !streaming {
        match resp.bytes().await {
            Ok(b) => {
                if o.status == Some(200) {
                    if let Ok(CompletionLite { usage: Some(u) }) =
                        serde_json::from_slice::<CompletionLite>(&b)
                    {
                        u.record(&mut o);
                    }
                }
            }
            Err(e) => o.error = Some(e.to_string()),
        }
        o.latency = start.elapsed();
        o.finished_at = Some(Instant::now());
        return o;
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut last_token: Option<Instant> = None;
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                o.error = Some(e.to_string());
                break;
            }
        };
        let now = Instant::now();
        buf.extend_from_slice(&chunk);
        let mut consumed = 0;
        while let Some(end) = find(&buf[consumed..], b"\n\n") {
            let frame = &buf[consumed..consumed + end];
            consumed += end + 2;
            let Some(data) = frame.strip_prefix(b"data: ") else {
                continue;
            };
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let Ok(c) = serde_json::from_slice::<ChunkLite>(data) else {
                o.error = Some(format!(
                    "unparsable frame {}",
                    String::from_utf8_lossy(frame)
                ));
                continue;
            };
            if data.starts_with(b"{\"error\"") {
                o.error = Some(String::from_utf8_lossy(data).into_owned());
            }
            if let Some(u) = c.usage {
                u.record(&mut o);
            }
            let token = c.choices.iter().any(|ch| {
                ch.delta.as_ref().is_some_and(|d| {
                    d.content.as_deref().is_some_and(|t| !t.is_empty()) || d.tool_calls.is_some()
                })
            });
            if token {
                match last_token {
                    None => o.ttft = Some(now - start),
                    Some(prev) => o.gaps.push(now - prev),
                }
                last_token = Some(now);
            }
        }
        buf.drain(..consumed);
    }
    if !done && o.error.is_none() {
        o.error = Some("stream closed before [DONE]".into());
    }
    o.latency = start.elapsed();
    o.finished_at = Some(Instant::now());
    o
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn grpc_shot(
    mut client: pb::worker_client::WorkerClient<tonic::transport::Channel>,
    req: pb::GenerateRequest,
) -> Outcome {
    let start = Instant::now();
    let mut o = Outcome::default();
    let mut stream = match client.generate(req).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            o.error = Some(format!("{:?}", e.code()));
            o.latency = start.elapsed();
            return o;
        }
    };
    let mut last_token: Option<Instant> = None;
    loop {
        match stream.message().await {
            Ok(Some(ev)) => {
                let now = Instant::now();
                match ev.event {
                    Some(pb::generate_event::Event::Finished(f)) => {
                        o.completion_tokens = f.usage.map_or(0, |u| u64::from(u.completion_tokens));
                        o.status = Some(200);
                    }
                    Some(_) => {
                        match last_token {
                            None => o.ttft = Some(now - start),
                            Some(prev) => o.gaps.push(now - prev),
                        }
                        last_token = Some(now);
                    }
                    None => {}
                }
            }
            Ok(None) => break,
            Err(e) => {
                o.error = Some(format!("{:?}", e.code()));
                break;
            }
        }
    }
    o.latency = start.elapsed();
    o.finished_at = Some(Instant::now());
    o
}

// ---- driving -----------------------------------------------------------------

#[derive(Clone)]
enum Shooter {
    Http {
        client: reqwest::Client,
        url: Arc<str>,
        key: Arc<str>,
        bodies: Arc<Vec<Bytes>>,
    },
    Grpc {
        client: pb::worker_client::WorkerClient<tonic::transport::Channel>,
        req: Arc<pb::GenerateRequest>,
    },
}

impl Shooter {
    /// Chat completions at `url` with `args`' workload.
    fn http(client: reqwest::Client, url: &str, key: &str, args: &Args) -> Shooter {
        Shooter::Http {
            client,
            url: url.into(),
            key: key.into(),
            bodies: Arc::new(http_bodies(args)),
        }
    }

    async fn shot(&self) -> Outcome {
        match self {
            Shooter::Http {
                client,
                url,
                key,
                bodies,
            } => {
                let body = if bodies.len() == 1 {
                    bodies[0].clone()
                } else {
                    bodies[rand::random_range(0..bodies.len())].clone()
                };
                http_shot(client, url, key, body).await
            }
            Shooter::Grpc { client, req } => grpc_shot(client.clone(), (**req).clone()).await,
        }
    }
}

/// Runs the workload until `end`, sending every outcome to `tx`.
async fn drive(args: &Args, shooter: Shooter, end: Instant, tx: mpsc::UnboundedSender<Outcome>) {
    if let Some(rate) = args.rate {
        let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        while Instant::now() < end {
            tick.tick().await;
            let (s, tx) = (shooter.clone(), tx.clone());
            tokio::spawn(async move {
                let _ = tx.send(s.shot().await);
            });
        }
    } else {
        let mut tasks = Vec::new();
        for _ in 0..args.concurrency {
            let (s, tx) = (shooter.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                while Instant::now() < end {
                    let _ = tx.send(s.shot().await);
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Processes whose CPU and memory the report shows.
struct Watched {
    gateway: Option<u32>,
    /// Every key the gateway accepts (idle WebSockets spread over them).
    keys: Vec<String>,
    workers: Vec<u32>,
    /// gRPC URLs of the workers, for their counters.
    worker_urls: Vec<String>,
}

/// The workers' counters summed (started, completed, cancelled, failed, rejected).
async fn worker_counters(urls: &[String]) -> Value {
    let mut sum = pb::Counters::default();
    for url in urls {
        let Ok(mut c) = pb::worker_client::WorkerClient::connect(url.clone()).await else {
            continue;
        };
        if let Ok(info) = c.info(pb::InfoRequest {}).await {
            let k = info.into_inner().counters.unwrap_or_default();
            sum.started += k.started;
            sum.completed += k.completed;
            sum.cancelled += k.cancelled;
            sum.failed += k.failed;
            sum.rejected += k.rejected;
        }
    }
    json!({"started": sum.started, "completed": sum.completed, "cancelled": sum.cancelled, "failed": sum.failed, "rejected": sum.rejected})
}

fn cpu_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| procfs::cpu_micros(*p).ok())
        .sum()
}

fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!((d.as_secs_f64() * 1e5).round() / 100.0)
    })
}

async fn run_load(args: &Args, shooter: Shooter, watched: &Watched) -> Result<Value> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = Instant::now();
    let measure_from = started + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.duration);
    let driver = {
        let args = args.clone();
        tokio::spawn(async move { drive(&args, shooter, end, tx).await })
    };
    tokio::time::sleep_until(measure_from.into()).await;
    let gw_cpu0 = watched.gateway.map(|p| cpu_of(&[p]));
    let wk_cpu0 = cpu_of(&watched.workers);
    tokio::time::sleep_until(end.into()).await;
    let gw_cpu1 = watched.gateway.map(|p| cpu_of(&[p]));
    let wk_cpu1 = cpu_of(&watched.workers);
    let window = end - measure_from;

    let mut ok = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut lat, mut ttft, mut gaps) = (Vec::new(), Vec::new(), Vec::new());
    let mut tokens = 0u64;
    let (mut prompt_tokens, mut cached_tokens) = (0u64, 0u64);
    let mut first_error: Option<String> = None;
    // Collect until the driver is done and every in-flight request reported.
    let collect_deadline = end + Duration::from_secs(30);
    loop {
        let next = tokio::time::timeout_at(collect_deadline.into(), rx.recv()).await;
        let Ok(Some(o)) = next else { break };
        let in_window = o.finished_at.is_some_and(|t| t >= measure_from && t <= end)
            || (o.finished_at.is_none() && Instant::now() <= end + Duration::from_secs(1));
        if !in_window {
            continue;
        }
        match (o.status, &o.error) {
            (Some(200), None) => {
                ok += 1;
                lat.push(o.latency);
                ttft.extend(o.ttft);
                gaps.extend(o.gaps);
                tokens += o.completion_tokens;
                prompt_tokens += o.prompt_tokens;
                cached_tokens += o.cached_tokens;
            }
            (status, err) => {
                let label = match status {
                    Some(200) => "200 (failed mid-stream)".to_string(),
                    Some(s) => s.to_string(),
                    None => "transport".to_string(),
                };
                *errors.entry(label).or_default() += 1;
                if first_error.is_none() {
                    first_error = err.clone().or(status.map(|s| format!("HTTP {s}")));
                }
            }
        }
    }
    let _ = driver.await;
    lat.sort();
    ttft.sort();
    gaps.sort();
    let secs = window.as_secs_f64();
    let gw_cpu = gw_cpu0.zip(gw_cpu1).map(|(a, b)| b.saturating_sub(a));
    let wk_cpu = wk_cpu1.saturating_sub(wk_cpu0);
    let per = |cpu: u64, n: u64| {
        if n == 0 {
            Value::Null
        } else {
            json!((cpu as f64 / n as f64 * 10.0).round() / 10.0)
        }
    };
    let mut report = json!({
        "target": if args.baseline { "worker (gRPC baseline)" } else { "gateway" },
        "mode": match args.rate { Some(r) => format!("open loop, {r} req/s"), None => format!("closed loop, concurrency {}", args.concurrency) },
        "stream": args.stream,
        "payload": format!("{:?}", args.payload).to_lowercase(),
        "reply_tokens": args.reply_tokens,
        "window_s": secs,
        "ok": ok,
        "errors": errors,
        "first_error": first_error,
        "requests_per_s": (ok as f64 / secs * 10.0).round() / 10.0,
        "latency_ms": {"p50": ms(percentile(&lat, 0.5)), "p90": ms(percentile(&lat, 0.9)), "p99": ms(percentile(&lat, 0.99))},
        "completion_tokens_per_s": (tokens as f64 / secs).round(),
        "worker_cpu_us_per_request": per(wk_cpu, ok),
    });
    if prompt_tokens > 0 {
        report["cached_prompt_share"] =
            json!((cached_tokens as f64 / prompt_tokens as f64 * 1000.0).round() / 1000.0);
    }
    if let Some(policy) = &args.policy {
        report["policy"] = json!(policy);
    }
    if args.stream || args.baseline {
        report["ttft_ms"] =
            json!({"p50": ms(percentile(&ttft, 0.5)), "p99": ms(percentile(&ttft, 0.99))});
        report["inter_token_ms"] =
            json!({"p50": ms(percentile(&gaps, 0.5)), "p99": ms(percentile(&gaps, 0.99))});
    }
    if !watched.worker_urls.is_empty() {
        report["worker_counters_total"] = worker_counters(&watched.worker_urls).await;
    }
    if let (Some(cpu), Some(pid)) = (gw_cpu, watched.gateway) {
        report["gateway_cpu_us_per_request"] = per(cpu, ok);
        report["gateway_cores_busy"] = json!((cpu as f64 / 1e6 / secs * 100.0).round() / 100.0);
        if args.stream {
            report["gateway_cpu_us_per_streamed_token"] = per(cpu, tokens);
        }
        if let Ok(kib) = procfs::peak_rss_kib(pid) {
            report["gateway_peak_rss_mib"] = json!((kib as f64 / 1024.0 * 10.0).round() / 10.0);
        }
    }
    Ok(report)
}

// ---- marginal cost of a relayed token -------------------------------------------

/// `--token-slope SHORT,LONG`: alternating windows of short and long
/// streams on one stack, fitted as CPU per request = intercept + slope ×
/// reply tokens. The slope is what relaying one more token costs the
/// gateway; the intercept is the stream's own cost (request, head, end).
async fn token_slope(
    args: &Args,
    (short, long): (u32, u32),
    http: &reqwest::Client,
    url: &str,
    key: &str,
    watched: &Watched,
) -> Result<Value> {
    let mut runs = Vec::new();
    let (mut sum_short, mut sum_long) = (0.0, 0.0);
    for tokens in [short, long, short, long] {
        let args = Args {
            reply_tokens: tokens,
            stream: true,
            ..args.clone()
        };
        let shooter = Shooter::http(http.clone(), url, key, &args);
        let report = run_load(&args, shooter, watched).await?;
        if report["ok"].as_u64() == Some(0) || report["errors"] != json!({}) {
            bail!("a window had errors: {report}");
        }
        let cpu = report["gateway_cpu_us_per_request"]
            .as_f64()
            .context("--token-slope needs the gateway's CPU (a started stack or --gateway-pid)")?;
        if tokens == short {
            sum_short += cpu;
        } else {
            sum_long += cpu;
        }
        runs.push(json!({
            "reply_tokens": tokens,
            "gateway_cpu_us_per_request": cpu,
            "gateway_cpu_us_per_streamed_token": report["gateway_cpu_us_per_streamed_token"],
            "worker_cpu_us_per_request": report["worker_cpu_us_per_request"],
            "requests_per_s": report["requests_per_s"],
        }));
    }
    let (cpu_short, cpu_long) = (sum_short / 2.0, sum_long / 2.0);
    let slope = (cpu_long - cpu_short) / f64::from(long - short);
    let intercept = cpu_short - slope * f64::from(short);
    let round2 = |v: f64| (v * 100.0).round() / 100.0;
    Ok(json!({
        "target": "gateway",
        "mode": format!("closed loop, concurrency {}, streams of {short} and {long} tokens alternating", args.concurrency),
        "windows": runs,
        "gateway_cpu_us_per_relayed_token_marginal": round2(slope),
        "gateway_cpu_us_per_stream_fixed": round2(intercept),
    }))
}

// ---- idle connections ------------------------------------------------------------

/// What an idle kind of connection costs the gateway (`harness::idle`):
/// its resident memory per connection held, and its CPU while they idle.
async fn idle_connections(
    args: &Args,
    url: &str,
    key: &str,
    gateway_pid: u32,
    watched: &Watched,
) -> Result<Value> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .build()?;
    // Warm the gateway (runtimes, pools, first connection) before the baseline.
    for _ in 0..20 {
        let _ = http_shot(&client, url, key, http_body(args)).await;
    }
    let parallelism = args.open_parallelism;
    let (kind, n) = if args.idle_websockets > 0 {
        ("websockets", args.idle_websockets)
    } else {
        ("streams", args.idle_streams)
    };
    let base = url.trim_end_matches("/chat/completions");
    let keys = watched.keys.clone();
    if kind == "websockets" {
        // The same for a connection's first upgrade.
        drop(idle::websockets(base, &keys, 4, 4).await);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Held open until the report is taken.
    let (mut streams, mut sockets) = (Vec::new(), Vec::new());
    let (cost, failures, opened_in) = if kind == "websockets" {
        let opening = idle::websockets(base, &keys, n, parallelism);
        let (cost, held) = idle::measure(gateway_pid, opening).await?;
        sockets = held.open;
        (cost, held.failures, held.opened_in)
    } else {
        let opening = async {
            idle::streams(url, key, &args.model, n, parallelism)
                .await
                .unwrap_or_else(|e| idle::Held {
                    open: Vec::new(),
                    failures: [(format!("{e:#}"), n as u64)].into(),
                    opened_in: Duration::ZERO,
                })
        };
        let (cost, held) = idle::measure(gateway_pid, opening).await?;
        streams = held.open;
        (cost, held.failures, held.opened_in)
    };
    let cpu0 = procfs::cpu_micros(gateway_pid)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_cpu = procfs::cpu_micros(gateway_pid)?.saturating_sub(cpu0);
    let hwm = procfs::peak_rss_kib(gateway_pid)?;
    let counters = worker_counters(&watched.worker_urls).await;
    drop((streams, sockets));
    let mib = |kib: u64| (kib as f64 / 1024.0 * 10.0).round() / 10.0;
    Ok(json!({
        format!("idle_{kind}_requested"): n,
        format!("idle_{kind}_held"): cost.held,
        "failures": failures,
        "opened_in_s": (opened_in.as_secs_f64() * 10.0).round() / 10.0,
        "gateway_rss_before_mib": mib(cost.rss_before_kib),
        format!("gateway_rss_with_{kind}_mib"): mib(cost.rss_with_kib),
        "gateway_peak_rss_mib": mib(hwm),
        format!("gateway_kib_per_{}", kind.trim_end_matches('s')): (cost.kib_per_connection() * 100.0).round() / 100.0,
        "gateway_cpu_ms_per_s_while_idle": (idle_cpu as f64 / 1000.0 / 5.0 * 100.0).round() / 100.0,
        "gateway_binary": args.gateway_bin.as_ref().map_or("this build's".to_string(), |p| p.display().to_string()),
        "worker_counters_total": counters,
    }))
}

// ---- main ----------------------------------------------------------------------

/// Raises the open-file limit to the hard limit; children inherit it.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit on our own process with a valid struct.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Report keys in reading order; anything else follows alphabetically.
const REPORT_ORDER: &[&str] = &[
    "target",
    "mode",
    "stream",
    "payload",
    "reply_tokens",
    "window_s",
    "ok",
    "errors",
    "first_error",
    "requests_per_s",
    "latency_ms",
    "ttft_ms",
    "inter_token_ms",
    "completion_tokens_per_s",
    "gateway_cpu_us_per_request",
    "gateway_cpu_us_per_streamed_token",
    "gateway_cores_busy",
    "gateway_peak_rss_mib",
    "worker_cpu_us_per_request",
    "cached_prompt_share",
    "policy",
    "worker_counters_total",
];

/// The floor under "gateway CPU per streamed token" when tokens arrive one
/// at a time: whatever a relay does in user space, each token that travels
/// alone costs one small loopback TCP write, and that write wakes a reader
/// that has gone back to sleep. Writes are 2 ms apart, so each finds its
/// reader asleep, like a client between tokens at 50 tokens/s.
fn write_floor() -> Result<Value> {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut writer = std::net::TcpStream::connect(listener.local_addr()?)?;
    writer.set_nodelay(true)?;
    let (mut reader, _) = listener.accept()?;
    let drain = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
    });
    // About the size of one SSE chunk carrying one token.
    let chunk = [b'x'; 200];
    let (n, mut spent) = (2000u32, Duration::ZERO);
    for _ in 0..n {
        std::thread::sleep(Duration::from_millis(2));
        let before = thread_cpu();
        writer.write_all(&chunk)?;
        spent += thread_cpu() - before;
    }
    drop(writer);
    let _ = drain.join();
    let mut report = BTreeMap::new();
    report.insert(
        "mode",
        json!("write floor: lone 200-byte loopback writes, 2 ms apart"),
    );
    report.insert("writes", json!(n));
    report.insert(
        "cpu_us_per_write",
        json!((spent.as_secs_f64() * 1e6 / f64::from(n) * 100.0).round() / 100.0),
    );
    Ok(serde_json::to_value(report)?)
}

fn print_report(report: &Value, json_too: bool) {
    if let Some(obj) = report.as_object() {
        let mut keys: Vec<&String> = obj.keys().collect();
        keys.sort_by_key(|k| {
            (
                REPORT_ORDER
                    .iter()
                    .position(|o| o == k)
                    .unwrap_or(usize::MAX),
                k.to_string(),
            )
        });
        for k in keys {
            println!("{k:>36}: {}", obj[k.as_str()]);
        }
    }
    if json_too {
        println!("{report}");
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.write_floor {
        print_report(&write_floor()?, args.json);
        return Ok(());
    }
    raise_fd_limit();
    if args.rate.is_some_and(|r| r <= 0.0) {
        bail!("--rate must be positive");
    }
    // Start the stack before the runtime: its processes are independent.
    let stack = if args.url.is_none() {
        let inflight = args
            .idle_streams
            .max(args.concurrency)
            .max(args.rate.map_or(0, |r| (r * 2.0) as usize));
        let workers = WorkerOpts {
            max_concurrency: Some((inflight + 64) as u32),
            max_queue: Some(1024),
            env: vec![("RUST_LOG".into(), "warn".into())],
            extra_args: args
                .prefix_cache_blocks
                .map(|n| vec!["--prefix-cache-blocks".to_string(), n.to_string()])
                .unwrap_or_default(),
            ..WorkerOpts::paced(args.ttft_ms, args.tokens_per_second)
        };
        // A key holds a bounded number of WebSocket connections (64 by
        // default): idle ones spread over a key per 32.
        let keys = (0..args.idle_websockets.div_ceil(32).max(1))
            .map(|_| TestKey::random("org-test"))
            .collect();
        let gateway = GatewayOpts {
            threads: args.gateway_threads,
            rust_log: Some("warn".into()),
            keys,
            binary: args.gateway_bin.clone(),
            extra_toml: args
                .policy
                .as_ref()
                .map(|p| format!("[models.{}]\npolicy = \"{p}\"\n", args.model))
                .unwrap_or_default(),
            ..GatewayOpts::default()
        };
        Some(
            Stack::builder()
                .models(&[args.model.as_str()])
                .workers_per_model(args.workers_per_model)
                .worker_opts(workers)
                .gateway_opts(gateway)
                .start()
                .context("starting the stack")?,
        )
    } else {
        None
    };
    let floor = match (&stack, args.floor) {
        (Some(s), true) => {
            let worker = s.workers.first().context("--floor needs a worker")?;
            Some(start_floor_proxy(
                worker,
                args.gateway_threads.unwrap_or(2),
            )?)
        }
        (None, true) => bail!("--floor needs a started stack (no --url)"),
        _ => None,
    };
    let (base, key, gateway_pid) = match (&stack, &floor) {
        (_, Some((process, addr))) => (
            format!("http://{addr}/v1"),
            String::new(),
            Some(process.pid()),
        ),
        (Some(s), None) => (
            s.gateway.base_url(),
            s.gateway.api_key().to_string(),
            s.gateway.pid(),
        ),
        (None, None) => (
            args.url.clone().unwrap_or_default(),
            args.key.clone(),
            args.gateway_pid,
        ),
    };
    let watched = Watched {
        gateway: if args.baseline { None } else { gateway_pid },
        keys: match &stack {
            Some(s) => s.gateway.keys().iter().map(|k| k.key.clone()).collect(),
            None => vec![key.clone()],
        },
        workers: stack
            .as_ref()
            .map(|s| s.workers.iter().filter_map(|w| w.pid()).collect())
            .unwrap_or_default(),
        worker_urls: stack
            .as_ref()
            .map(|s| s.workers.iter().map(|w| w.grpc_url()).collect())
            .unwrap_or_default(),
    };
    let url = format!("{}/chat/completions", base.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        if args.idle_streams > 0 || args.idle_websockets > 0 {
            let pid = gateway_pid.context("idle connections need the gateway pid")?;
            return idle_connections(&args, &url, &key, pid, &watched).await;
        }
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(args.concurrency.max(64))
            .tcp_nodelay(true)
            .build()?;
        if let Some(lengths) = args.token_slope {
            return token_slope(&args, lengths, &http, &url, &key, &watched).await;
        }
        let shooter = if args.baseline {
            let worker = stack
                .as_ref()
                .and_then(|s| s.workers.first())
                .context("--baseline needs a started stack (no --url)")?;
            Shooter::Grpc {
                client: worker.grpc().await?,
                req: Arc::new(grpc_request(&args)),
            }
        } else {
            Shooter::http(http, &url, &key, &args)
        };
        run_load(&args, shooter, &watched).await
    })?;
    print_report(&report, args.json);
    drop(floor);
    drop(stack);
    Ok(())
}

/// Starts `floor_proxy` over `worker`; returns it and its address.
fn start_floor_proxy(worker: &harness::Worker, threads: usize) -> Result<(ChildProcess, String)> {
    let addr = free_addr()?;
    let spec = Spec {
        name: "floor_proxy".into(),
        program: harness::bins::bin("floor_proxy")?,
        args: vec![
            "--listen".into(),
            addr.clone(),
            "--worker".into(),
            worker.grpc_url(),
            "--threads".into(),
            threads.to_string(),
        ],
        env: vec![],
        env_remove: vec![],
        ready_prefix: "floor listening on".into(),
        ready_timeout: Duration::from_secs(20),
    };
    let (process, _) = ChildProcess::start(&spec)?;
    Ok((process, addr))
}
