//! `agentbench`: a coding agent's loop on the real model, the way Codex
//! drives the Responses API, over three transports of the gateway and the
//! same loop through vLLM's Agentic API (`agentic-api` on PyPI, its Rust
//! Responses server) as the yardstick, every arm in front of one fresh
//! llama-server (cold per arm).
//!
//! A turn is one response: a long system prompt (the agent's rules), the
//! conversation so far, a `run_shell` function tool. When the model calls
//! the tool the client answers with a canned output; otherwise it sends
//! the next step as a user message. The arms:
//!
//! - `http-full`: `POST /v1/responses` streamed, `store: false`, the whole
//!   conversation every turn (what Codex does over HTTP);
//! - `http-chain`: streamed, stored, `previous_response_id` and the new
//!   items only;
//! - `ws`: `GET /v1/responses` upgraded to a WebSocket, `store: false` and
//!   `previous_response_id` from the connection's own state (Codex with
//!   `supports_websockets = true`);
//! - `agentic-full`, `agentic-chain`, `agentic-ws`: the same three against
//!   agentic-server (skipped, with the reason, when it does not run);
//! - `messages` (`--api messages`): the loop as Claude Code runs it over
//!   the Anthropic Messages API: `POST /v1/messages` streamed, the whole
//!   conversation every turn (system prompt, tools, every message so far),
//!   the tool's results as `tool_result` blocks, the session named in
//!   `X-Claude-Code-Session-Id`.
//!
//! Per turn it prints the time, the prompt tokens the response reports,
//! the prompt tokens the engine actually prefilled (llama-server's own
//! `llamacpp:prompt_tokens_total`, read before and after) and so the share
//! of the prompt served from the engine's cache, and the cached share the
//! API itself reports (Responses' `input_tokens_details.cached_tokens`,
//! Messages' `cache_read_input_tokens` over the whole prompt, which there
//! is `input_tokens + cache_read_input_tokens +
//! cache_creation_input_tokens`); then each arm's total.
//!
//! `--engines N` puts N llama-servers behind the gateway (one upstream
//! worker each) and `--policy` picks the pool's routing: a conversation
//! resent in full to an engine that does not hold it is prefilled from
//! scratch, which a WebSocket (its turns pinned to one engine) never is.
//!
//! ```text
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) AGENTIC_SERVER=$(bash scripts/agentic-api.sh) \
//!   cargo run --release -p tests --bin agentbench -- --turns 20
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin agentbench -- --engines 2 --policy least_loaded --arms http-full,ws
//! LLAMA_SERVER=$(bash scripts/llama-server.sh) \
//!   cargo run --release -p tests --bin agentbench -- --api messages --engines 2 --turns 20
//! ```

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use harness::llama_server::{LlamaServer, LlamaServerOpts};
use harness::process::{free_port, ChildProcess, Spec};
use harness::{websocket, Client, Gateway, GatewayOpts, WorkerOpts};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "A coding agent's loop over HTTP+SSE and WebSocket, beside vLLM's Agentic API")]
struct Args {
    /// Turns per arm.
    #[arg(long, default_value_t = 20)]
    turns: usize,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 24)]
    max_output_tokens: u32,
    /// Words of the agent's system prompt (about 1.3 tokens each).
    #[arg(long, default_value_t = 1200)]
    system_words: usize,
    /// The GGUF file (default: IGW_MODEL_FILE).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: PathBuf,
    /// agentic-server's binary (`bash scripts/agentic-api.sh` prints it);
    /// without it the yardstick is skipped.
    #[arg(long, env = "AGENTIC_SERVER")]
    agentic_server: Option<PathBuf>,
    /// Engine threads.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Only these arms (comma-separated).
    #[arg(long)]
    arms: Option<String>,
    /// llama-servers behind the gateway, one upstream worker each (the
    /// Agentic API fronts one engine: its arms need 1).
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// The gateway pool's policy (`least_loaded`, `prefix_affinity`,
    /// `cache_aware`); default: the gateway's.
    #[arg(long)]
    policy: Option<String>,
    /// Words of file content each user step pastes after its ask (what a
    /// coding agent's tool outputs add to a conversation every turn).
    #[arg(long, default_value_t = 0)]
    step_words: usize,
    /// Which API the agent speaks: the Responses arms (Codex) or the
    /// Messages arm (Claude Code).
    #[arg(long, value_enum, default_value = "responses")]
    api: Api,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Api {
    Responses,
    Messages,
}

/// How a loop talks to its front.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Transport {
    HttpFull,
    HttpChain,
    WebSocket,
    /// `POST /v1/messages` streamed, the whole conversation every turn.
    Messages,
}

impl Transport {
    fn api(self) -> Api {
        match self {
            Transport::Messages => Api::Messages,
            _ => Api::Responses,
        }
    }
}

/// Which front the loop goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Front {
    Gateway,
    Agentic,
}

struct Arm {
    name: &'static str,
    front: Front,
    transport: Transport,
}

const ARMS: [Arm; 7] = [
    Arm {
        name: "http-full",
        front: Front::Gateway,
        transport: Transport::HttpFull,
    },
    Arm {
        name: "http-chain",
        front: Front::Gateway,
        transport: Transport::HttpChain,
    },
    Arm {
        name: "ws",
        front: Front::Gateway,
        transport: Transport::WebSocket,
    },
    Arm {
        name: "agentic-full",
        front: Front::Agentic,
        transport: Transport::HttpFull,
    },
    Arm {
        name: "agentic-chain",
        front: Front::Agentic,
        transport: Transport::HttpChain,
    },
    Arm {
        name: "agentic-ws",
        front: Front::Agentic,
        transport: Transport::WebSocket,
    },
    Arm {
        name: "messages",
        front: Front::Gateway,
        transport: Transport::Messages,
    },
];

/// One turn as measured.
#[derive(Debug, Clone, Copy)]
struct Turn {
    seconds: f64,
    /// The prompt's tokens, as the response's `usage` says.
    input_tokens: u64,
    /// What the engine prefilled for it (its counter's increase).
    prefilled: u64,
    /// Of the prompt, the tokens the API reports read from the cache.
    reported_cached: u64,
    tool_call: bool,
}

impl Turn {
    fn cached_share(&self) -> f64 {
        if self.input_tokens == 0 {
            return 0.0;
        }
        1.0 - (self.prefilled as f64 / self.input_tokens as f64).min(1.0)
    }

    fn reported_share(&self) -> f64 {
        if self.input_tokens == 0 {
            return 0.0;
        }
        (self.reported_cached as f64 / self.input_tokens as f64).min(1.0)
    }

    fn print_row(&self, n: usize) {
        println!(
            "| {n} | {:.2} | {} | {} | {:.0} % | {:.0} % | {} |",
            self.seconds,
            self.input_tokens,
            self.prefilled,
            self.cached_share() * 100.0,
            self.reported_share() * 100.0,
            if self.tool_call { "yes" } else { "" }
        );
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let wanted: Option<Vec<String>> = args
        .arms
        .as_ref()
        .map(|a| a.split(',').map(str::to_owned).collect());
    println!(
        "agentbench ({:?} API): {} turns per arm, replies of at most {} tokens, a system prompt of {} words; load average {}",
        args.api,
        args.turns,
        args.max_output_tokens,
        args.system_words,
        load_average()
    );
    let mut totals = Vec::new();
    for arm in &ARMS {
        if arm.transport.api() != args.api
            || wanted
                .as_ref()
                .is_some_and(|w| !w.iter().any(|n| n == arm.name))
        {
            continue;
        }
        if arm.front == Front::Agentic && args.agentic_server.is_none() {
            println!("\n{}: skipped (no AGENTIC_SERVER)", arm.name);
            continue;
        }
        match run_arm(&args, arm).await {
            Ok(turns) => totals.push((arm.name, turns)),
            Err(e) => println!("\n{}: did not run: {e:#}", arm.name),
        }
    }
    println!("\n| arm | turns | tool calls | total s | s per turn (mean) | prompt tokens (last turn) | cached after turn 1 (mean) | turns after the first ≥ 90 % cached | reported cached after turn 1 (mean) | turns after the first reported ≥ 90 % cached |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, turns) in &totals {
        let total: f64 = turns.iter().map(|t| t.seconds).sum();
        let later = &turns[1.min(turns.len())..];
        let mean = |share: fn(&Turn) -> f64| {
            later.iter().map(share).sum::<f64>() / later.len().max(1) as f64
        };
        let warm = |share: fn(&Turn) -> f64| later.iter().filter(|t| share(t) >= 0.9).count();
        println!(
            "| {name} | {} | {} | {total:.1} | {:.2} | {} | {:.1} % | {} of {} | {:.1} % | {} of {} |",
            turns.len(),
            turns.iter().filter(|t| t.tool_call).count(),
            total / turns.len().max(1) as f64,
            turns.last().map_or(0, |t| t.input_tokens),
            mean(Turn::cached_share) * 100.0,
            warm(Turn::cached_share),
            later.len(),
            mean(Turn::reported_share) * 100.0,
            warm(Turn::reported_share),
            later.len()
        );
    }
    let total_of = |name: &str| {
        totals
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.iter().map(|t| t.seconds).sum::<f64>())
    };
    if let (Some(full), Some(ws)) = (total_of("http-full"), total_of("ws")) {
        println!(
            "\nws vs http-full end to end: {:.2}x the time ({:.0} % faster)",
            ws / full,
            (1.0 - ws / full) * 100.0
        );
    }
    println!("load average at end: {}", load_average());
    Ok(())
}

/// Starts a fresh engine and front, runs the loop, stops them.
async fn run_arm(args: &Args, arm: &Arm) -> Result<Vec<Turn>> {
    let mut opts = LlamaServerOpts::new(8192, 1);
    opts.threads = args.threads;
    if arm.front == Front::Agentic && args.engines != 1 {
        bail!(
            "{}: the Agentic API fronts one engine (--engines 1)",
            arm.name
        );
    }
    let mut engines = Vec::with_capacity(args.engines);
    for _ in 0..args.engines.max(1) {
        engines.push(
            LlamaServer::start_with(&args.model_file, &opts)
                .await
                .context("llama-server")?,
        );
    }
    let engine = &engines[0];
    let (client, key, _gateway, _workers, _agentic) = match arm.front {
        Front::Gateway => {
            let upstreams: Vec<WorkerOpts> = engines
                .iter()
                .map(|e| WorkerOpts::upstream(e.url(), "llama-server"))
                .collect();
            let workers = harness::start_workers("base", &upstreams);
            let mut gopts = GatewayOpts::default();
            gopts.workers.insert(
                "base".into(),
                workers.iter().map(|w| w.addr().to_string()).collect(),
            );
            if let Some(policy) = &args.policy {
                gopts.extra_toml = format!("[models.base]\npolicy = \"{policy}\"\n");
            }
            let gateway = Gateway::start(gopts)?;
            let key = gateway.api_key().to_owned();
            (gateway.client(), key, Some(gateway), workers, None)
        }
        Front::Agentic => {
            let (process, url) = start_agentic(args, engine.url())?;
            (
                Client::new(&url, Some("unused")),
                "unused".to_owned(),
                None,
                Vec::new(),
                Some(process),
            )
        }
    };
    let model = match arm.front {
        Front::Gateway => "base".to_owned(),
        Front::Agentic => engine_model(engine).await?,
    };
    println!("\n{} ({:?} over {:?})", arm.name, arm.front, arm.transport);
    println!("| turn | s | prompt tokens | prefilled | cached | reported cached | tool call |");
    println!("|---|---|---|---|---|---|---|");
    if arm.transport == Transport::Messages {
        return messages_loop(args, &client, &key, &engines).await;
    }
    let mut ws = match arm.transport {
        Transport::WebSocket => Some(
            websocket::connect(&client.url(""), &key)
                .await
                .context("the WebSocket")?,
        ),
        _ => None,
    };
    let mut conversation: Vec<Value> = Vec::new();
    let mut previous: Option<String> = None;
    let mut pending: Vec<Value> = vec![user(&step(0, args.step_words))];
    let mut turns = Vec::new();
    for n in 0..args.turns {
        let mut body = json!({
            "model": model,
            "instructions": system_prompt(args.system_words),
            "tools": [{"type": "function", "name": "run_shell",
                "description": "Run a shell command in the repository and return its output.",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                    "required": ["cmd"], "additionalProperties": false}}],
            "max_output_tokens": args.max_output_tokens,
            "temperature": 0,
            "store": arm.transport == Transport::HttpChain,
        });
        conversation.extend(pending.iter().cloned());
        match arm.transport {
            Transport::HttpFull | Transport::Messages => body["input"] = json!(conversation),
            Transport::HttpChain | Transport::WebSocket => {
                body["input"] = json!(pending);
                if let Some(prev) = &previous {
                    body["previous_response_id"] = json!(prev);
                }
            }
        }
        let before = prompt_tokens_total(&engines).await?;
        let started = Instant::now();
        let response = match &mut ws {
            Some(ws) => {
                let events = ws.create(&body).await?;
                terminal_response(&events)?
            }
            None => {
                body["stream"] = json!(true);
                let stream = client.stream("/responses", &body).await?;
                let status = stream.status;
                if status != 200 {
                    let said: Vec<String> = stream
                        .collect()
                        .await
                        .map(|frames| frames.into_iter().map(|f| f.raw).collect())
                        .unwrap_or_default();
                    bail!("turn {n}: HTTP {status}: {}", said.join(" "));
                }
                let events: Vec<Value> = stream
                    .collect()
                    .await?
                    .iter()
                    .filter_map(|f| serde_json::from_str(&f.data).ok())
                    .collect();
                terminal_response(&events)?
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        let prefilled = prompt_tokens_total(&engines).await?.saturating_sub(before);
        let output = response["output"].as_array().cloned().unwrap_or_default();
        let call = output
            .iter()
            .find(|i| i["type"] == "function_call")
            .cloned();
        let usage = &response["usage"];
        let turn = Turn {
            seconds,
            input_tokens: usage["input_tokens"].as_u64().unwrap_or(0),
            prefilled,
            reported_cached: usage["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            tool_call: call.is_some(),
        };
        turn.print_row(n + 1);
        turns.push(turn);
        previous = response["id"].as_str().map(str::to_owned);
        // What the conversation holds now, as input items.
        for item in &output {
            conversation.push(as_input(item));
        }
        pending = match call {
            Some(call) => vec![json!({"type": "function_call_output",
                "call_id": call["call_id"], "output": tool_output(n)})],
            None => vec![user(&step(n + 1, args.step_words))],
        };
    }
    Ok(turns)
}

/// The agent's loop as Claude Code runs it over the Messages API: every
/// turn streams the whole conversation (system prompt, tools, every
/// message so far) and names its session as Claude Code does, so the
/// gateway keeps it on the engine that holds its prefix.
async fn messages_loop(
    args: &Args,
    client: &Client,
    key: &str,
    engines: &[LlamaServer],
) -> Result<Vec<Turn>> {
    let session = format!("agentbench-{}", std::process::id());
    let tools = json!([{"name": "run_shell",
        "description": "Run a shell command in the repository and return its output.",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}},
            "required": ["cmd"], "additionalProperties": false}}]);
    let mut conversation: Vec<Value> = vec![user(&step(0, args.step_words))];
    let mut turns = Vec::new();
    for n in 0..args.turns {
        let body = json!({
            "model": "base",
            "max_tokens": args.max_output_tokens,
            "temperature": 0,
            "system": system_prompt(args.system_words),
            "tools": tools,
            "messages": conversation,
            "stream": true,
        });
        let before = prompt_tokens_total(engines).await?;
        let started = Instant::now();
        let request = harness::anthropic::request(client, key, "/messages")
            .header("x-claude-code-session-id", &session)
            .json(&body);
        let stream = client.open_stream(request).await?;
        let status = stream.status;
        let frames = stream.collect().await?;
        if status != 200 {
            let said: Vec<String> = frames.into_iter().map(|f| f.raw).collect();
            bail!("turn {n}: HTTP {status}: {}", said.join(" "));
        }
        let message = harness::anthropic::accumulate(&frames)?;
        let seconds = started.elapsed().as_secs_f64();
        let prefilled = prompt_tokens_total(engines).await?.saturating_sub(before);
        let usage = &message["usage"];
        let count = |field: &str| usage[field].as_u64().unwrap_or(0);
        let read = count("cache_read_input_tokens");
        let content = message["content"].as_array().cloned().unwrap_or_default();
        let call = content.iter().find(|b| b["type"] == "tool_use").cloned();
        let turn = Turn {
            seconds,
            // Anthropic's `input_tokens` leaves out what was read from the
            // cache: the prompt is the sum.
            input_tokens: count("input_tokens") + read + count("cache_creation_input_tokens"),
            prefilled,
            reported_cached: read,
            tool_call: call.is_some(),
        };
        turn.print_row(n + 1);
        turns.push(turn);
        conversation.push(json!({"role": "assistant", "content": content}));
        conversation.push(match call {
            Some(call) => json!({"role": "user", "content": [{"type": "tool_result",
                "tool_use_id": call["id"], "content": tool_output(n)}]}),
            None => user(&step(n + 1, args.step_words)),
        });
    }
    Ok(turns)
}

/// The response a stream or a WebSocket reply ended with.
fn terminal_response(events: &[Value]) -> Result<Value> {
    let last = events.last().context("no events")?;
    match last["type"].as_str() {
        Some("response.completed" | "response.incomplete") => Ok(last["response"].clone()),
        _ => bail!("the turn did not complete: {last}"),
    }
}

/// An output item as the next request's input item.
fn as_input(item: &Value) -> Value {
    match item["type"].as_str() {
        Some("message") => {
            let text: String = item["content"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["text"].as_str())
                .collect();
            json!({"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]})
        }
        Some("function_call") => json!({"type": "function_call", "call_id": item["call_id"],
            "name": item["name"], "arguments": item["arguments"]}),
        _ => json!({"role": "assistant", "content": ""}),
    }
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// The agent's next instruction.
fn step(n: usize, pasted_words: usize) -> String {
    const STEPS: [&str; 5] = [
        "List the files in src/ and tell me which one parses the config.",
        "Open that file and find where the port is read.",
        "Change the default port to 8080 and show the diff.",
        "Run the tests and tell me whether they pass.",
        "Summarise what you changed in one sentence.",
    ];
    let mut text = format!("Step {}: {}", n + 1, STEPS[n % STEPS.len()]);
    if pasted_words > 0 {
        text.push_str("\n```\n");
        for w in 0..pasted_words {
            // Distinct per step and line, as source files are.
            text.push_str(&format!("let v{n}_{w} = read(\"key{w}\");"));
            text.push(if w % 8 == 7 { '\n' } else { ' ' });
        }
        text.push_str("\n```");
    }
    text
}

/// A command's output, as the client's tool answers it.
fn tool_output(n: usize) -> String {
    format!(
        "exit 0\nsrc/main.rs\nsrc/config.rs\nsrc/server.rs\ntests/config_test.rs\n(step {} output, 12 lines omitted)",
        n + 1
    )
}

/// A coding agent's rules, `words` words long (deterministic).
fn system_prompt(words: usize) -> String {
    const RULES: [&str; 8] = [
        "You are a coding agent working in a git repository on the user's machine.",
        "Use the run_shell tool to inspect files and run commands before you answer.",
        "Keep changes minimal and focused on the task; do not reformat unrelated code.",
        "Never commit secrets, and never print the contents of environment files.",
        "When tests fail, read the failure, fix the cause, and run them again.",
        "Explain each change briefly, naming the files and functions you touched.",
        "Prefer the project's existing libraries and conventions to new dependencies.",
        "Ask before destructive operations such as deleting files or rewriting history.",
    ];
    let mut out = String::new();
    let mut count = 0;
    let mut i = 0;
    while count < words {
        let rule = RULES[i % RULES.len()];
        out.push_str(&format!("Rule {}: {rule}\n", i + 1));
        count += rule.split_whitespace().count() + 2;
        i += 1;
    }
    out
}

/// The engines' count of prompt tokens they processed (not served from
/// their caches), from each llama-server's Prometheus exposition.
async fn prompt_tokens_total(engines: &[LlamaServer]) -> Result<u64> {
    let mut total = 0;
    for engine in engines {
        let text = reqwest::get(format!("{}/metrics", engine.url()))
            .await?
            .text()
            .await?;
        total += text
            .lines()
            .find(|l| l.starts_with("llamacpp:prompt_tokens_total"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .context("llamacpp:prompt_tokens_total in /metrics (llama-server --metrics)")?;
    }
    Ok(total)
}

/// The model id llama-server reports (what agentic-server forwards).
async fn engine_model(engine: &LlamaServer) -> Result<String> {
    let models: Value = reqwest::get(format!("{}/v1/models", engine.url()))
        .await?
        .json()
        .await?;
    models["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .context("a model in llama-server's /v1/models")
}

/// agentic-server in front of `engine_url`, on a free port with its own
/// SQLite file; its base URL (`.../v1`).
fn start_agentic(args: &Args, engine_url: &str) -> Result<(ChildProcess, String)> {
    let binary = args.agentic_server.clone().context("AGENTIC_SERVER")?;
    let port = free_port()?;
    let db = std::env::temp_dir().join(format!("agentbench-{port}.db"));
    let spec = Spec {
        name: "agentic-server".into(),
        program: binary,
        args: vec![
            "--llm-api-base".into(),
            format!("{engine_url}/v1"),
            "--gateway-host".into(),
            "127.0.0.1".into(),
            "--gateway-port".into(),
            port.to_string(),
            "--db-url".into(),
            format!("sqlite://{}?mode=rwc", db.display()),
        ],
        env: Vec::new(),
        env_remove: Vec::new(),
        ready_prefix: "gateway listening on".into(),
        ready_timeout: Duration::from_secs(60),
    };
    let (process, _) = ChildProcess::start(&spec)?;
    Ok((process, format!("http://127.0.0.1:{port}/v1")))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
