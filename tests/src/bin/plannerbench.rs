//! `plannerbench`: the planner's own overhead, for BENCHMARKS.md.
//!
//! Starts a stack (zero-delay SIMULATED workers, one gateway) and A2A test
//! agents on loopback, scripts the plan calls (`synthetic:json_replies=`),
//! and reports:
//!
//! - wall time of a plan of 4 independent agents of `--agent-ms` each
//!   against a plan of 1 such agent (median of `--runs`), and their ratio;
//!   the target is under 1.5 × one agent's time plus the model calls;
//! - the gateway's CPU time per plan step: plans of `--steps` instant
//!   agents, the gateway process's CPU (from `/proc`) over `--runs` plans
//!   divided by the steps run, next to the CPU of a plain chat completion.
//!
//! ```text
//! cargo run --release -p tests --bin plannerbench -- --runs 30 --agent-ms 200 --steps 4 --cpu-runs 500
//! ```

use anyhow::{bail, Result};
use clap::Parser;
use harness::a2a_agents::{Behavior, TestAgent};
use harness::{json, Stack, Value};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Measure the planner's overhead (wall time and gateway CPU per step)")]
struct Args {
    /// Plans per measurement.
    #[arg(long, default_value_t = 30)]
    runs: usize,
    /// Delay of each agent in the wall-time measurement.
    #[arg(long, default_value_t = 200)]
    agent_ms: u64,
    /// Steps per plan in the CPU measurement (at most 8).
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Plans (and plain chats) in the CPU measurement: enough for `/proc`'s
    /// 10 ms clock ticks to resolve microseconds per step.
    #[arg(long, default_value_t = 500)]
    cpu_runs: usize,
    #[arg(long, default_value = "base-mini")]
    model: String,
}

const TOML: &str = r#"
[planner]
allow_private_addresses = true
hedge_after_ms = 60000
"#;

fn plan(targets: &[String]) -> Value {
    let steps: Vec<Value> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"id": i + 1, "kind": "agent", "target": t, "instruction": "go", "depends_on": []}))
        .collect();
    json!({"thought": "bench", "steps": steps})
}

async fn run_plan(stack: &Stack, model: &str, agents: &[&TestAgent]) -> Result<Duration> {
    let names: Vec<String> = agents.iter().map(|a| a.name.clone()).collect();
    let urls: Vec<String> = agents.iter().map(|a| a.url()).collect();
    let body = json!({
        "model": model,
        "planner_mode": true,
        "agents": urls,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": format!("bench synthetic:json_replies={}", plan(&names))}],
    });
    let client = stack.client();
    let began = Instant::now();
    let reply = client
        .send(
            client
                .request(reqwest::Method::POST, "/chat/completions")
                .header("x-session-id", format!("bench-{}", harness::random_hex(12)))
                .json(&body),
        )
        .await?;
    let took = began.elapsed();
    if reply.status != 200 {
        bail!("planner request failed: {} {}", reply.status, reply.text());
    }
    let r = reply.json();
    let done = r["tool_thought"]
        .as_array()
        .map(|a| a.iter().filter(|t| t["outcome"] == "completed").count())
        .unwrap_or(0);
    if done != agents.len() {
        bail!(
            "expected {} completed steps: {}",
            agents.len(),
            r["tool_thought"]
        );
    }
    Ok(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let stack = Stack::builder()
        .models(&[&args.model])
        .extra_toml(TOML)
        .start()?;
    let delay = Duration::from_millis(args.agent_ms);
    let mut slow = Vec::new();
    for i in 0..4 {
        slow.push(
            TestAgent::start(&format!("wait{i}"), "bench agent", Behavior::Good { delay }).await,
        );
    }
    let mut instant = Vec::new();
    for i in 0..args.steps.clamp(1, 8) {
        instant.push(
            TestAgent::start(
                &format!("fast{i}"),
                "bench agent",
                Behavior::Good {
                    delay: Duration::ZERO,
                },
            )
            .await,
        );
    }
    // Warm-up: channels, caches of cards.
    let all_slow: Vec<&TestAgent> = slow.iter().collect();
    let all_fast: Vec<&TestAgent> = instant.iter().collect();
    run_plan(&stack, &args.model, &all_slow).await?;
    run_plan(&stack, &args.model, &all_fast).await?;

    let mut one = Vec::new();
    let mut four = Vec::new();
    for _ in 0..args.runs {
        one.push(run_plan(&stack, &args.model, &all_slow[..1]).await?);
        four.push(run_plan(&stack, &args.model, &all_slow).await?);
    }
    let (one, four) = (median(one), median(four));

    // Gateway CPU per step, against a plain chat completion.
    let cpu0 = stack.gateway.cpu_micros()?;
    for _ in 0..args.cpu_runs {
        run_plan(&stack, &args.model, &all_fast).await?;
    }
    let plan_cpu = stack.gateway.cpu_micros()? - cpu0;
    let cpu1 = stack.gateway.cpu_micros()?;
    for _ in 0..args.cpu_runs {
        let r = stack
            .client()
            .post_json("/chat/completions", &json!({"model": args.model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
            .await?;
        if r.status != 200 {
            bail!("chat failed: {}", r.text());
        }
    }
    let chat_cpu = stack.gateway.cpu_micros()? - cpu1;
    let steps = (args.cpu_runs * all_fast.len()) as f64;
    let per_plan = plan_cpu as f64 / args.cpu_runs as f64;
    let per_chat = chat_cpu as f64 / args.cpu_runs as f64;

    println!("| measurement | value |");
    println!("|---|---|");
    println!(
        "| plan of 1 agent of {} ms (median of {}) | {:.0} ms |",
        args.agent_ms,
        args.runs,
        one.as_secs_f64() * 1000.0
    );
    println!(
        "| plan of 4 independent agents of {} ms (median) | {:.0} ms |",
        args.agent_ms,
        four.as_secs_f64() * 1000.0
    );
    println!(
        "| ratio 4 agents / 1 agent | {:.2} |",
        four.as_secs_f64() / one.as_secs_f64()
    );
    println!(
        "| gateway CPU per plan of {} instant agents | {:.0} µs |",
        all_fast.len(),
        per_plan
    );
    println!(
        "| gateway CPU per plan step (plan CPU / steps) | {:.0} µs |",
        plan_cpu as f64 / steps
    );
    println!(
        "| gateway CPU per plain chat completion | {:.0} µs |",
        per_chat
    );
    println!(
        "| planner overhead per step beyond its model calls ((plan − 2 chats) / steps) | {:.0} µs |",
        (per_plan - 2.0 * per_chat).max(0.0) / all_fast.len() as f64
    );
    Ok(())
}
