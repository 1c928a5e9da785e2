//! `stack`: starts a whole service (one synthetic worker per model and a
//! gateway) on free loopback ports for suites written in other languages.
//! With `--engine llama` or `--engine upstream` the one model `base` is
//! served by the real SmolLM2 model instead: in process, or through
//! llama.cpp's own `llama-server` behind an upstream worker.
//!
//! Prints one JSON line `{"base_url", "api_key", "admin_url", "gateway_pid"}`
//! on stdout once everything is ready, then runs until its stdin closes (the
//! parent exited or closed the pipe); the children die with it. With `--tls`
//! the gateway serves HTTPS with a certificate for `localhost` and
//! `127.0.0.1` from a CA made for the run, whose PEM file the line names as
//! `ca_file`.

use clap::{Parser, ValueEnum};
use harness::{LlamaServer, Stack, WorkerOpts};
use std::io::Read;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Engine {
    Synthetic,
    Llama,
    Upstream,
}

/// Context per sequence of the real engines (as in the Rust real-model
/// tests).
const N_CTX: u32 = 1024;

#[derive(Parser)]
#[command(about = "Start a test stack and print its address and key as JSON")]
struct Args {
    /// Use the test Redis ($TEST_REDIS_URL) under a random key prefix.
    #[arg(long)]
    redis: bool,
    /// Simulated time to first token of the workers.
    #[arg(long, default_value_t = 0)]
    ttft_ms: u64,
    /// Simulated decode speed of the workers (0 = unpaced).
    #[arg(long, default_value_t = 0)]
    tokens_per_second: u64,
    /// Only these models get workers (comma-separated; default: all three).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// More gateway config (TOML text), merged as `GatewayOpts::extra_toml`:
    /// extra keys, plans, orgs, or a model on a dead address.
    #[arg(long, default_value = "")]
    extra_toml: String,
    /// The engine of the workers; `llama` and `upstream` serve only `base`,
    /// with the real model.
    #[arg(long, value_enum, default_value = "synthetic")]
    engine: Engine,
    /// Serve HTTPS (`[tls]`) with a certificate of a CA made for this run.
    #[arg(long)]
    tls: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    let mut server = None;
    let opts = match args.engine {
        Engine::Synthetic => WorkerOpts::paced(args.ttft_ms, args.tokens_per_second),
        Engine::Llama => WorkerOpts::llama(&harness::model::model_file()?, N_CTX, 2),
        Engine::Upstream => {
            let file = harness::model::model_file()?;
            let started = runtime.block_on(LlamaServer::start(&file, N_CTX, 2))?;
            let opts = WorkerOpts::upstream(started.url(), "llama-server");
            server = Some(started);
            opts
        }
    };
    let mut builder = Stack::builder().worker_opts(opts);
    if args.engine != Engine::Synthetic {
        builder = builder.models(&["base"]);
    }
    if args.redis {
        builder = builder.redis();
    }
    if !args.models.is_empty() {
        let models: Vec<&str> = args.models.iter().map(String::as_str).collect();
        builder = builder.models(&models);
    }
    if !args.extra_toml.is_empty() {
        builder = builder.extra_toml(&args.extra_toml);
    }
    let ca = if args.tls {
        let ca = harness::certs::TestCa::new("stack")?;
        builder = builder.gateway_tls(ca.server("gateway", &["localhost", "127.0.0.1"])?);
        Some(ca)
    } else {
        None
    };
    let stack = builder.start()?;
    println!(
        "{}",
        serde_json::json!({
            "base_url": stack.gateway.base_url(),
            "api_key": stack.gateway.api_key(),
            "admin_url": stack.gateway.admin_url(),
            "gateway_pid": stack.gateway.pid(),
            "ca_file": ca.as_ref().map(|ca| ca.ca_file().display().to_string()),
        })
    );
    // Wait for EOF on stdin; dropping the stack then stops everything.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    drop(stack);
    drop(server);
    drop(ca);
    Ok(())
}
