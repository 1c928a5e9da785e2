//! `worker serve`: one model behind the `inference.v1` gRPC protocol.

use clap::{Parser, Subcommand, ValueEnum};
use inference_proto::v1::worker_server::WorkerServer;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use worker::admission::Admission;
use worker::counters::Counters;
use worker::drain::{self, DrainFlag};
use worker::engine::synthetic::{SyntheticConfig, SyntheticEngine};
use worker::model::ModelProfile;
use worker::prefix_cache::PrefixCache;
use worker::service::{WorkerService, WorkerState};

const SYNTHETIC_DESCRIPTION: &str = "SIMULATED output from the synthetic engine: deterministic \
    English-like text, tool calls and JSON for tests, benchmarks and load. Not a language model.";

/// Largest accepted request: a full 1M-token context (~4 MB of text) plus
/// `data:` images, above tonic's 4 MiB default.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

#[derive(Parser)]
#[command(
    name = "worker",
    version,
    about = "A model worker serving one model over the inference.v1 gRPC protocol. \
             Engine `synthetic` = SIMULATED output (not a language model)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one model.
    #[command(
        long_about = "Serve one model over gRPC (inference.v1.Worker and grpc.health.v1).

The `synthetic` engine is SIMULATED: its output is not from a language model. It is
deterministic given the prompt and seed, counts tokens with the real o200k_base BPE,
and is paced by --ttft-ms and --tokens-per-second.

Test controls of the SIMULATED engine, written anywhere in the last user message:
  synthetic:reply_tokens=N   reply with exactly N tokens (capped by max_tokens)
  synthetic:fail_after=N     after N tokens, fail with INTERNAL + ENGINE_FAILURE
  synthetic:hang             send nothing until the stream is dropped
  synthetic:slow_ms=N        wait N ms between tokens
  synthetic:echo             reply with the last user message's text
  synthetic:echo_messages    reply with every message received, one line each

Tools: AUTO calls a tool when the last user message names it (whole word);
REQUIRED calls the named-in-message tools or the first; NAMED calls that one;
NONE never calls. Several calls only with parallel_tool_calls.

Images cost 85 tokens (detail=low) or 765 (high/auto), counted in prompt_tokens.

SIGTERM drains: health NOT_SERVING, new requests fail with DRAINING, running ones
get --grace-period-seconds to finish, then the process exits 0."
    )]
    Serve(ServeArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum EngineKind {
    /// SIMULATED output (deterministic; for tests, benchmarks and load).
    Synthetic,
}

#[derive(Parser, Debug)]
struct ServeArgs {
    /// The public model id served: base, base-mini or base-ultra.
    #[arg(long)]
    model: String,
    /// The engine. `synthetic` is SIMULATED output, not a language model.
    #[arg(long, value_enum, default_value = "synthetic")]
    engine: EngineKind,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Delay before the first event of a reply, in milliseconds.
    #[arg(long, default_value_t = 0)]
    ttft_ms: u64,
    /// Output pace; 0 = as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    tokens_per_second: f64,
    /// Generations running at once.
    #[arg(long, default_value_t = 64)]
    max_concurrency: u32,
    /// Requests waiting for a slot; beyond this they fail with OVERLOADED.
    #[arg(long, default_value_t = 1024)]
    max_queue: u32,
    /// Context window in tokens (default: the model's: base 196608,
    /// base-ultra 1000000, base-mini 262144).
    #[arg(long)]
    context_window: Option<u32>,
    /// On SIGTERM, how long running generations get to finish.
    #[arg(long, default_value_t = 10)]
    grace_period_seconds: u64,
    /// When unpaced (--tokens-per-second 0, no slow_ms), merge up to N
    /// tokens into one event: fewer, larger deltas for load tests. 1 = one
    /// token per event.
    #[arg(long, default_value_t = 1)]
    coalesce_tokens: u32,
    /// Prefix-cache capacity in 64-token blocks.
    #[arg(long, default_value_t = 65_536)]
    prefix_cache_blocks: usize,
    /// Chaos testing: every generation fails (INTERNAL, ENGINE_FAILURE)
    /// after N completion tokens, like a worker with a broken device.
    #[arg(long)]
    fail_after_tokens: Option<u32>,
    /// OTLP/gRPC collector (`http://host:4317`) to export generation spans
    /// to, as children of the gateway's request spans; absent or empty =
    /// export nothing. The trace id from the gateway's `traceparent` is
    /// recorded either way.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// `service.name` of exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "worker")]
    service_name: String,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let Command::Serve(args) = cli.command;
    let mut telemetry = telemetry::init(&telemetry::Options {
        service_name: &args.service_name,
        otlp_endpoint: args.otlp_endpoint.as_deref(),
        default_log_filter: "warn",
        export_targets: &["worker"],
    })?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(args));
    telemetry.shutdown();
    result
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let EngineKind::Synthetic = args.engine;
    let engine = SyntheticEngine::new(SyntheticConfig {
        ttft: Duration::from_millis(args.ttft_ms),
        tokens_per_second: args.tokens_per_second.max(0.0),
        coalesce_tokens: args.coalesce_tokens,
        fail_after_tokens: args.fail_after_tokens,
    });
    // Load the BPE before taking traffic, so the first request is not slow.
    let _ = worker::tokenizer::count("warm up");

    let state = Arc::new(WorkerState {
        model: ModelProfile::new(&args.model, args.context_window),
        engine_name: "synthetic",
        description: SYNTHETIC_DESCRIPTION.to_owned(),
        engine: Arc::new(engine),
        admission: Admission::new(args.max_concurrency, args.max_queue),
        cache: PrefixCache::new(args.prefix_cache_blocks),
        counters: Counters::default(),
        drain: DrainFlag::default(),
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<WorkerServer<WorkerService>>().await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let max_streams = args
        .max_concurrency
        .saturating_add(args.max_queue)
        .saturating_add(64);
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(max_streams)
        .add_service(health_service)
        .add_service(
            WorkerServer::new(WorkerService::new(Arc::clone(&state)))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    let mut server = tokio::spawn(server);

    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "worker listening on {addr} model={} engine=synthetic",
            args.model
        )?;
        out.flush()?;
    }

    tokio::select! {
        _ = drain::shutdown_signal() => {}
        res = &mut server => {
            // The server ended on its own: a transport error.
            return match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.into()),
                Err(e) => Err(e.into()),
            };
        }
    }

    tracing::info!("draining");
    state.drain.start();
    health
        .set_not_serving::<WorkerServer<WorkerService>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let grace = Duration::from_secs(args.grace_period_seconds);
    if !drain::wait_idle(&state.admission, grace).await {
        tracing::warn!(
            running = state.admission.running(),
            queued = state.admission.queued(),
            "grace period over; stopping with generations still open"
        );
    }
    let _ = stop_tx.send(());
    // Let open connections close; do not wait on a client that keeps one.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    Ok(())
}
