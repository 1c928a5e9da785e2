//! `planbench`: planner mode on the real model, for BENCHMARKS.md.
//!
//! Starts `gateway up` (llama.cpp workers on SmolLM2-135M-Instruct, the
//! README's local service) and A2A test agents on loopback, and reports:
//!
//! - plan validity: `--requests` varied planner requests (0 to 4 agents
//!   named, 0 to 3 caller tools, ten different asks); how many plan calls
//!   ended with a plan the guard accepted, read from each reply's
//!   `thought` (requests with neither agents nor tools make no plan call);
//! - output tokens per plan call: min, p50, p90, max;
//! - end-to-end time of a planner request naming one good agent (p50, p90
//!   of `--latency-runs`), next to the yardstick of the same run: a plain
//!   chat completion of the same ask on the same model, same `max_tokens`.
//!
//! ```text
//! cargo build --release -p gateway -p worker -p tests --bins
//! target/release/planbench --requests 50 --latency-runs 20
//! ```

use anyhow::{bail, Context, Result};
use clap::Parser;
use harness::a2a_agents::{Behavior, TestAgent};
use harness::process::{free_addr, ChildProcess, Spec};
use harness::{json, Client, Value};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Planner mode on the real model: plan validity, plan tokens, latency")]
struct Args {
    /// Varied planner requests for the plan-validity figures.
    #[arg(long, default_value_t = 50)]
    requests: usize,
    /// Planner requests with one good agent (and plain chats) timed.
    #[arg(long, default_value_t = 20)]
    latency_runs: usize,
    /// The model every request asks.
    #[arg(long, default_value = "base")]
    model: String,
    /// Output cap of the answers (the planner's synthesis, the plain chat);
    /// 0 sends none, as a newcomer does.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Print each timed reply's `thought`, `tool_thought`, usage and answer
    /// length (where the time went: plan tokens, steps, repairs, synthesis).
    #[arg(long)]
    show: bool,
    /// The GGUF `gateway up` serves (default: its own, SmolLM2).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: Option<String>,
}

const ASKS: [&str; 10] = [
    "What is the weather in Paris tomorrow?",
    "Find me a flight from Berlin to Rome next Friday.",
    "What time is it in Tokyo?",
    "Summarise today's technology news.",
    "Book a hotel in Lisbon for two nights.",
    "Convert 100 euros to dollars.",
    "What is 2+2?",
    "Plan a weekend trip to Madrid with a budget of 500 euros.",
    "Is it going to rain in London this week?",
    "Recommend a good book about history.",
];

const AGENTS: [(&str, &str); 4] = [
    ("weather", "Weather forecasts for any city"),
    ("flights", "Searches and books flights"),
    ("hotels", "Finds and books hotels"),
    ("news", "Summarises the news of the day"),
];

fn tools(n: usize) -> Value {
    let all = [
        json!({"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 40}}, "required": ["tz"]}}}),
        json!({"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}}}),
        json!({"type": "function", "function": {"name": "convert_currency", "description": "Converts an amount between currencies",
            "parameters": {"type": "object", "properties": {
                "amount": {"type": "number", "minimum": 0, "maximum": 1000000},
                "from": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]},
                "to": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]}},
                "required": ["amount", "from", "to"]}}}),
    ];
    json!(all[..n.min(3)])
}

/// What one reply says about its plan calls: `(valid, output tokens)`
/// each, from the planner's `thought` lines.
fn plan_calls(reply: &Value) -> Vec<(bool, Option<u32>)> {
    let tokens = |t: &str| {
        let at = t.find(" output tokens")?;
        let digits: String = t[..at]
            .chars()
            .rev()
            .take_while(char::is_ascii_digit)
            .collect::<Vec<char>>()
            .into_iter()
            .rev()
            .collect();
        digits.parse().ok()
    };
    reply["thought"]
        .as_array()
        .map(|lines| {
            lines
                .iter()
                .filter_map(Value::as_str)
                .filter_map(|t| {
                    if t.starts_with("Plan (") {
                        Some((true, tokens(t)))
                    } else if t.starts_with("Repair:")
                        || t.starts_with("Fallback: the repaired plan")
                    {
                        Some((false, tokens(t)))
                    } else if t.starts_with("Fallback: the model could not plan") {
                        Some((false, None))
                    } else {
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn percentile<T: Copy + Ord>(sorted: &[T], p: f64) -> T {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// Posts a chat completion and returns the 200 reply's body. Planner
/// requests on a loaded machine outlast the harness client's 60 s limit:
/// this one waits up to 10 minutes.
async fn post(client: &Client, session: Option<&str>, body: &Value) -> Result<Value> {
    let mut rb = client
        .request(reqwest::Method::POST, "/chat/completions")
        .timeout(Duration::from_secs(600));
    if let Some(s) = session {
        rb = rb.header("x-session-id", s);
    }
    let resp = rb.json(body).send().await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    if status != 200 {
        bail!("{status} {text}");
    }
    Ok(serde_json::from_str(&text)?)
}

fn planner_body(
    model: &str,
    ask: &str,
    agents: &[String],
    tools_n: usize,
    max_tokens: u32,
) -> Value {
    let mut b = json!({
        "model": model,
        "planner_mode": true,
        "messages": [{"role": "user", "content": ask}],
    });
    if max_tokens > 0 {
        b["max_tokens"] = json!(max_tokens);
    }
    if !agents.is_empty() {
        b["agents"] = json!(agents);
    }
    if tools_n > 0 {
        b["tools"] = tools(tools_n);
    }
    b
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut agents = Vec::new();
    for (name, description) in AGENTS {
        let good = Behavior::Good {
            delay: Duration::ZERO,
        };
        agents.push(TestAgent::start(name, description, good).await);
    }
    let listen = free_addr()?;
    let admin = free_addr()?;
    let key = "sk-planbench";
    let mut up_args = vec![
        "up".to_owned(),
        "--listen".into(),
        listen.clone(),
        "--admin-listen".into(),
        admin.clone(),
        "--dev-key".into(),
        key.into(),
    ];
    if let Some(f) = &args.model_file {
        up_args.extend(["--model-file".to_owned(), f.clone()]);
    }
    let (_gateway, _) = ChildProcess::start(&Spec {
        name: "gateway-up".into(),
        program: harness::bins::bin("gateway")?,
        args: up_args,
        env: Vec::new(),
        env_remove: Vec::new(),
        ready_prefix: "gateway listening on".into(),
        ready_timeout: Duration::from_secs(300),
    })
    .context("starting gateway up")?;
    let client = Client::new(&format!("http://{listen}/v1"), Some(key));
    println!("gateway up on {listen}; load average {}", load_average());
    // Warm-up: the model's first prompt, the agents' cards.
    post(&client, None, &harness::chat_body(&args.model, "Hello")).await?;

    // Plan validity over varied requests.
    let began = Instant::now();
    let (mut calls, mut valid, mut without_call) = (0usize, 0usize, 0usize);
    let mut tokens: Vec<u32> = Vec::new();
    for i in 0..args.requests {
        let n_agents = i % 5;
        let n_tools = (i / 5) % 4;
        let urls: Vec<String> = agents[..n_agents].iter().map(|a| a.url()).collect();
        let ask = ASKS[i % ASKS.len()];
        let body = planner_body(&args.model, ask, &urls, n_tools, args.max_tokens);
        let session = format!("bench-{}", harness::random_hex(12));
        let reply = post(&client, Some(&session), &body).await?;
        let seen = plan_calls(&reply);
        if seen.is_empty() {
            without_call += 1;
        }
        for (ok, t) in seen {
            calls += 1;
            valid += usize::from(ok);
            tokens.extend(t);
        }
    }
    tokens.sort_unstable();
    println!(
        "plan validity: {valid} of {calls} plan calls wrote a valid plan ({} requests, {} with no agent and no tool made no plan call; {:.0} s)",
        args.requests,
        without_call,
        began.elapsed().as_secs_f64()
    );
    if !tokens.is_empty() {
        println!(
            "output tokens per plan call: min {}, p50 {}, p90 {}, max {} ({} calls)",
            tokens[0],
            percentile(&tokens, 0.5),
            percentile(&tokens, 0.9),
            tokens[tokens.len() - 1],
            tokens.len()
        );
    }

    // Latency: one good agent, against a plain chat of the same ask.
    let ask = ASKS[0];
    let one = [agents[0].url()];
    let (mut planner, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..args.latency_runs.max(1) {
        let session = format!("bench-{}", harness::random_hex(12));
        let body = planner_body(&args.model, ask, &one, 0, args.max_tokens);
        let t = Instant::now();
        let reply = post(&client, Some(&session), &body).await?;
        planner.push(t.elapsed());
        if args.show {
            println!(
                "timed reply {} ({} ms): thought {:#}\ntool_thought {:#}\nusage {}, answer {} chars, finish_reason {}",
                planner.len(),
                t.elapsed().as_millis(),
                reply["thought"],
                reply["tool_thought"],
                reply["usage"],
                reply["choices"][0]["message"]["content"].as_str().map_or(0, str::len),
                reply["choices"][0]["finish_reason"]
            );
        }
        let asked = reply["tool_thought"].as_array().is_some_and(|a| {
            a.iter()
                .any(|t| t["target"] == AGENTS[0].0 && t["outcome"] == "completed")
        });
        if !asked {
            bail!("the agent was not asked: {}", reply["tool_thought"]);
        }
        let mut chat = json!({"model": args.model,
                              "messages": [{"role": "user", "content": ask}]});
        if args.max_tokens > 0 {
            chat["max_tokens"] = json!(args.max_tokens);
        }
        let t = Instant::now();
        post(&client, None, &chat).await?;
        plain.push(t.elapsed());
    }
    planner.sort();
    plain.sort();
    let ms = |d: Duration| d.as_millis();
    println!(
        "planner request with one good agent: p50 {} ms, p90 {} ms ({} runs)",
        ms(percentile(&planner, 0.5)),
        ms(percentile(&planner, 0.9)),
        planner.len()
    );
    println!(
        "yardstick, a plain chat completion of the same ask: p50 {} ms, p90 {} ms",
        ms(percentile(&plain, 0.5)),
        ms(percentile(&plain, 0.9))
    );
    let metrics = Client::new(&format!("http://{admin}"), None)
        .get("/metrics")
        .await
        .map(|r| r.text())
        .unwrap_or_default();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("gateway_planner_plan_calls_total"))
    {
        println!("{line}");
    }
    println!("load average {}", load_average());
    Ok(())
}
