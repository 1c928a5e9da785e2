//! `movebench`: the gap a move leaves in a stream, on the real model, for
//! BENCHMARKS.md.
//!
//! Two `llama` workers (llama.cpp in process, SmolLM2-135M) behind one
//! gateway. Each round opens one greedy stream, reads `--before` chunks,
//! SIGKILLs the worker carrying it and times the first chunk after the
//! kill: the gap the move left (detecting the failure, starting the
//! generation on the other worker with the delivered output as its
//! unfinished turn, prefilling prompt and output there, the next token).
//! Beside it, in the same run and on the same survivor: the model's own
//! time to first token for the same prompt (a fresh stream, its prefix
//! cached by the moved generation), for another ask (only the template's
//! head cached), and its inter-token gap. The killed worker is started again between rounds.
//!
//! ```text
//! cargo build --release --workspace --bins
//! IGW_BIN_DIR=target/release target/release/movebench --rounds 20
//! ```

use anyhow::{bail, Context, Result};
use clap::Parser;
use harness::{gateway_over, json, start_workers, Client, Value, Worker, WorkerOpts};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "The gap a worker kill leaves in a stream that moves, beside the model's TTFT")]
struct Args {
    #[arg(long, default_value_t = 20)]
    rounds: usize,
    /// Chunks read before the kill.
    #[arg(long, default_value_t = 24)]
    before: usize,
    /// The GGUF the workers serve (default: the reference SmolLM2).
    #[arg(long, env = "IGW_MODEL_FILE")]
    model_file: Option<String>,
}

const ASKS: [&str; 5] = [
    "Tell me a long story about a lighthouse keeper.",
    "Describe a walk through a forest in autumn, in detail.",
    "Explain how a steam engine works, step by step.",
    "Write a long letter to a friend about a trip to the sea.",
    "Describe the history of a small mountain village.",
];

fn body(round: usize) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": format!("{} (take {round})", ASKS[round % ASKS.len()])}],
        "max_tokens": 200,
        "temperature": 0,
        "stream": true,
    })
}

async fn started(w: &Worker) -> u64 {
    w.counters().await.map(|c| c.started).unwrap_or(0)
}

/// Reads frames until one carries content; the time it came.
async fn next_content(stream: &mut harness::client::SseStream) -> Result<Option<Instant>> {
    while let Some(frame) = stream.next_frame().await? {
        if frame.is_done() {
            return Ok(None);
        }
        let v = frame.json();
        if v.get("error").is_some() {
            bail!("the stream failed: {v}");
        }
        if v["choices"][0]["delta"]["content"].is_string() {
            return Ok(Some(Instant::now()));
        }
    }
    Ok(None)
}

/// The time to the first content chunk of a fresh stream, and the mean gap
/// between the next `n` chunks.
async fn ttft_and_gap(client: &Client, body: &Value, n: usize) -> Result<(Duration, Duration)> {
    let sent = Instant::now();
    let mut stream = client.stream("/chat/completions", body).await?;
    let first = next_content(&mut stream).await?.context("no first token")?;
    let mut last = first;
    for _ in 0..n {
        match next_content(&mut stream).await? {
            Some(at) => last = at,
            None => break,
        }
    }
    Ok((first - sent, (last - first) / n.max(1) as u32))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let file = match &args.model_file {
        Some(f) => std::path::PathBuf::from(f),
        None => harness::model::model_file()?,
    };
    let opts = WorkerOpts::llama(&file, 1024, 1);
    let mut workers = start_workers("base", &[opts.clone(), opts]);
    let gateway = gateway_over(
        &workers.iter().collect::<Vec<_>>(),
        "[models.base]\npolicy = \"least_loaded\"\n",
    );
    let client = gateway.client();
    // Warm both engines once.
    for w in 0..2 {
        let _ = ttft_and_gap(&client, &body(100 + w), 4).await?;
    }
    let (mut gaps, mut ttfts, mut itls) = (Vec::new(), Vec::new(), Vec::new());
    let mut fresh_ttfts = Vec::new();
    for round in 0..args.rounds {
        let before = [started(&workers[0]).await, started(&workers[1]).await];
        let mut stream = client.stream("/chat/completions", &body(round)).await?;
        for _ in 0..args.before {
            next_content(&mut stream)
                .await?
                .context("ended before the kill")?;
        }
        let victim = usize::from(started(&workers[1]).await > before[1]);
        workers[victim].kill();
        let killed = Instant::now();
        let Some(after) = next_content(&mut stream).await? else {
            bail!("round {round}: the stream ended at the kill");
        };
        gaps.push(after - killed);
        while next_content(&mut stream).await?.is_some() {}
        // The model's own first token for the same prompt, on the survivor.
        let (ttft, itl) = ttft_and_gap(&client, &body(round), 8).await?;
        ttfts.push(ttft);
        itls.push(itl);
        // And for a prompt the survivor's cache holds only the template
        // head of (another ask).
        let (fresh, _) = ttft_and_gap(&client, &body(round + 1), 1).await?;
        fresh_ttfts.push(fresh);
        workers[victim].restart()?;
        // Until the gateway's health loop selects it again.
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    gaps.sort();
    ttfts.sort();
    itls.sort();
    fresh_ttfts.sort();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "movebench: {} rounds, {} chunks before each kill, llama.cpp SmolLM2-135M, 2 workers",
        args.rounds, args.before
    );
    println!("| measure | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| gap a move left (kill to next token) | {} | {} |",
        ms(percentile(&gaps, 0.5)),
        ms(percentile(&gaps, 0.99))
    );
    println!(
        "| the model's time to first token, same prompt | {} | {} |",
        ms(percentile(&ttfts, 0.5)),
        ms(percentile(&ttfts, 0.99))
    );
    println!(
        "| the model's time to first token, another ask (cold but for the template) | {} | {} |",
        ms(percentile(&fresh_ttfts, 0.5)),
        ms(percentile(&fresh_ttfts, 0.99))
    );
    println!(
        "| the model's gap between tokens | {} | {} |",
        ms(percentile(&itls, 0.5)),
        ms(percentile(&itls, 0.99))
    );
    println!(
        "load average: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let moved = gateway.admin_get("/metrics").await.map(|(_, page)| {
        page.lines()
            .filter(|l| {
                l.starts_with("gateway_generation_moves_total") && l.contains("outcome=\"moved\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    })?;
    println!("moves counted by the gateway: {moved}");
    let (_, page) = gateway.admin_get("/metrics").await?;
    for line in page.lines().filter(|l| {
        l.starts_with("gateway_queue_wait_seconds_sum")
            || l.starts_with("gateway_queue_wait_seconds_count")
            || l.starts_with("gateway_generation_move_gap_seconds_sum")
    }) {
        println!("{line}");
    }
    Ok(())
}
