//! `worker serve`: one model behind the `inference.v1` gRPC protocol.

use clap::{Parser, Subcommand, ValueEnum};
use inference_proto::v1::worker_server::WorkerServer;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::server::TcpIncoming;
use worker::admission::Admission;
use worker::auth::RequireToken;
use worker::cache_report::CacheReport;
use worker::counters::Counters;
use worker::drain::{self, DrainFlag};
use worker::engine::llama_args::LlamaArgs;
use worker::engine::synthetic::args::SyntheticArgs;
use worker::engine::upstream::args::UpstreamArgs;
use worker::engine::{Loaded, Serving};
use worker::sampling_defaults::SamplingDefaults;
use worker::service::{Engines, WorkerService, WorkerState};
use worker::weights::args::FetchArgs;

/// Largest accepted request: a full 1M-token context (~4 MB of text) plus
/// `data:` images, above tonic's 4 MiB default.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

#[derive(Parser)]
#[command(
    name = "worker",
    version,
    about = "A model worker serving one model over the inference.v1 gRPC protocol. \
             Engines: `llama` (llama.cpp in process on a GGUF file), `upstream` (an \
             OpenAI-compatible engine server: vLLM, SGLang, llama-server) and `synthetic` \
             (SIMULATED output, not a language model)."
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

Engines:
  llama      llama.cpp in process on a GGUF file (--model-file). Tokenizer, chat template
             and context window come from the file; --parallel sequences decode in one
             continuously batched loop (--n-ctx tokens each), further requests queue.
             Prefix reuse per slot (cached_prompt_tokens is the real count); JSON object,
             JSON schema and tool_choice required/named are enforced while decoding
             (llguidance); tool_choice auto answers in text. Reasoning on a model without
             thinking tags: a <think> section the prompt opens, closed by the model or when
             reasoning.budget_tokens (default by effort) is spent, streamed as reasoning.
             Image parts are refused (INVALID_ARGUMENT naming the part).
  upstream   An OpenAI-compatible engine server beside the worker (--upstream-url,
             --upstream-kind vllm|sglang|llama-server|openai). Each Generate is one
             streaming POST /v1/chat/completions on a pooled keep-alive connection; the
             engine applies its own template, tokenizer and parsers. The context window
             comes from the engine (/v1/models max_model_len, llama-server /props) or
             --context-window; the prompt is counted with the engine's /tokenize, so an
             overflow is context_length_exceeded before generating. Engine 429/503 ->
             OVERLOADED (retryable), other 4xx -> INVALID_REQUEST, 5xx -> ENGINE_FAILURE.
             Health from its /health and load from its /metrics, scraped every
             --upstream-scrape-ms. Closing the stream closes the request (SGLang also
             gets /abort_request). The engine is bounded: no event within
             --upstream-first-byte-timeout-ms or silence past --upstream-idle-timeout-ms
             fails the generation (DEADLINE_EXCEEDED) and marks the worker NOT_SERVING
             until the engine answers again; output past max_tokens ends with length;
             an SSE event over --upstream-max-event-bytes fails with ENGINE_FAILURE.
             Field mapping: docs/upstream-engines.md.
  synthetic  SIMULATED output (below).

Adding an engine: implement worker::seam::sequence::SequenceEngine in one file under
worker/src/engine/ (render + tokenize with the model's own template, context window,
start a sequence -> stream of prefill / token / finished events; dropping the stream
aborts it) and add it here. Stop strings, the length cut, UTF-8, tool-call parsing,
reasoning and usage are the shared pipeline's (worker/src/pipeline).

The `synthetic` engine is SIMULATED: its output is not from a language model. It is
deterministic given the prompt and seed, counts tokens with the real o200k_base BPE,
and is paced by --ttft-ms, --prefill-tokens-per-second and --tokens-per-second.

Test controls of the SIMULATED engine, written anywhere in the last user message:
  synthetic:reply_tokens=N   reply with exactly N tokens (capped by max_tokens)
  synthetic:fail_after=N     after N tokens, fail with INTERNAL + ENGINE_FAILURE
  synthetic:fail_unavailable with fail_after, fail with UNAVAILABLE instead
  synthetic:trailers_ms=N    end the stream N ms after its Finished event
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
    Serve(Box<ServeArgs>),
    /// Fetch a weights file into a directory, verified (init containers).
    #[command(
        long_about = "Fetch one weights file into --dest, verified by its sha256.

One source: --url (HTTP/HTTPS), --s3 s3://BUCKET/KEY with --s3-endpoint (SigV4-signed
with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY [/ AWS_SESSION_TOKEN] from the
environment; unsigned without them), or --hf-repo ORG/NAME with --hf-file (HF_TOKEN
from the environment as a bearer token when set).

The file is written to DEST/NAME.part; a cut connection resumes with a Range request
(backing off from --retry-backoff-ms, doubling up to 30 s; --retries attempts in a row
without progress (under 1 MiB each) end it, and so does --deadline-seconds). Never more
is written than the server declared and --size says; NAME.part is never written through
a symbolic link. Redirects may not go from https to http, to another host (but the Hub's
CDN, AWS's S3 endpoints and --allow-redirect-host), nor to a loopback, private or
link-local address unless the source's own host is one. The whole file's sha256 is checked, then it is renamed to
DEST/NAME. A wrong checksum deletes the download and exits 1 naming both digests. A file
already at DEST/NAME with the right checksum exits 0 at once, without a request. One
fetch per directory at a time (an advisory lock on DEST). Prints the file's path."
    )]
    FetchWeights(Box<FetchArgs>),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum EngineKind {
    /// SIMULATED output (deterministic; for tests, benchmarks and load).
    Synthetic,
    /// llama.cpp in process on a GGUF model (--model-file).
    Llama,
    /// An OpenAI-compatible engine server (--upstream-url, --upstream-kind).
    Upstream,
}

#[derive(Parser, Debug)]
struct ServeArgs {
    /// The public model id served: base, base-mini, base-ultra, or an id
    /// the gateway's config adds (`[models.NAME]`; the synthetic engine then
    /// needs --context-window).
    #[arg(long)]
    model: String,
    /// The engine. `synthetic` is SIMULATED output, not a language model.
    #[arg(long, value_enum, default_value = "synthetic")]
    engine: EngineKind,
    #[command(flatten)]
    llama: LlamaArgs,
    #[command(flatten)]
    upstream: UpstreamArgs,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Serve Prometheus metrics (`GET /metrics`: worker_requests_running,
    /// worker_requests_waiting, worker_capacity, totals) on this address;
    /// absent = no metrics listener.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    #[command(flatten)]
    synthetic: SyntheticArgs,
    /// Generations running at once (synthetic and upstream; llama runs
    /// --parallel). Upstream: requests in flight to the engine, which
    /// queues them itself.
    #[arg(long, default_value_t = 64)]
    max_concurrency: u32,
    /// Requests waiting for a slot; beyond this they fail with OVERLOADED.
    #[arg(long, default_value_t = 1024)]
    max_queue: u32,
    /// Context window in tokens (default: the model's: base 196608,
    /// base-ultra 1000000, base-mini 262144; upstream: the engine's). An
    /// added model id on the synthetic engine must give it.
    #[arg(long)]
    context_window: Option<u32>,
    /// On SIGTERM, how long running generations get to finish.
    #[arg(long, default_value_t = 10)]
    grace_period_seconds: u64,
    /// Temperature for requests that set none (0..=2). Default: the model
    /// file's `general.sampling.temp` (llama), else the engine's own (1;
    /// an upstream engine applies its model's generation config).
    #[arg(long)]
    default_temperature: Option<f64>,
    /// top_p for requests that set none (0..=1). Default: the model file's
    /// `general.sampling.top_p` (llama), else the engine's own (1).
    #[arg(long)]
    default_top_p: Option<f64>,
    /// llama: repetition penalty over the last 64 tokens for every request
    /// (1 = none; not an API field). Default: the model file's
    /// `general.sampling.penalty_repeat`, else none.
    #[arg(long)]
    default_repeat_penalty: Option<f64>,
    /// Require this token from callers (`authorization: Bearer <token>`,
    /// sent by gateways with GATEWAY_WORKER_TOKEN); unauthenticated calls
    /// fail with UNAUTHENTICATED. grpc.health.v1 stays open for probes.
    #[arg(long, env = "WORKER_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Serve gRPC over TLS with this certificate chain (PEM, leaf first);
    /// gateways then need `[worker_tls]`. Read at start-up.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Mutual TLS: refuse, at the handshake, clients without a certificate
    /// signed by this CA (PEM). Needs --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<std::path::PathBuf>,
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
    let args = match cli.command {
        Command::Serve(args) => *args,
        Command::FetchWeights(args) => return fetch_weights(*args),
    };
    let mut telemetry = telemetry::init(&telemetry::Options {
        service_name: &args.service_name,
        otlp_endpoint: args.otlp_endpoint.as_deref(),
        default_log_filter: "warn",
        export_targets: &["worker"],
        demoted: &[],
    })?;
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(args));
    telemetry.shutdown();
    result
}

fn fetch_weights(args: FetchArgs) -> anyhow::Result<()> {
    let opts = args.into_options()?;
    let path = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(worker::weights::fetch(&opts))?;
    println!("{}", path.display());
    Ok(())
}

/// The engine `--engine` names, loaded from its own flags.
async fn load_engine(args: &ServeArgs) -> anyhow::Result<Loaded<Engines>> {
    let serving = Serving {
        model: &args.model,
        context_window: args.context_window,
        max_concurrency: args.max_concurrency,
    };
    Ok(match args.engine {
        EngineKind::Synthetic => args.synthetic.load(&serving)?.map_engine(Engines::Sequence),
        EngineKind::Llama => args.llama.load(&serving)?.map_engine(Engines::Sequence),
        EngineKind::Upstream => args
            .upstream
            .load(&serving)
            .await?
            .map_engine(Engines::Chat),
    })
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let loaded = load_engine(&args).await?;
    let engine_name = loaded.name;
    let sampling_defaults = loaded
        .model_sampling
        .overridden_by(SamplingDefaults {
            temperature: args.default_temperature,
            top_p: args.default_top_p,
            repeat_penalty: args.default_repeat_penalty,
        })
        .validated()?;
    let cache_report = CacheReport::new(
        loaded.engine.cache_source(),
        loaded.cache_slots,
        loaded.concurrent_reuse,
    );
    let state = Arc::new(WorkerState {
        model: loaded.model,
        engine_name,
        description: loaded.description,
        engine: loaded.engine,
        admission: Admission::new(loaded.capacity, args.max_queue),
        counters: Counters::default(),
        drain: DrainFlag::default(),
        cache_report,
        sampling_defaults,
        running: Arc::default(),
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<WorkerServer<WorkerService>>().await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    if let Some(mut ready) = loaded.ready.clone() {
        // The engine's own health is the worker's: a sick engine takes the
        // worker out of the gateway's selection.
        let health = health.clone();
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            while ready.changed().await.is_ok() {
                if state.drain.is_draining() {
                    break;
                }
                let status = if *ready.borrow_and_update() {
                    tonic_health::ServingStatus::Serving
                } else {
                    tonic_health::ServingStatus::NotServing
                };
                tracing::info!(?status, "upstream engine health changed");
                if status == tonic_health::ServingStatus::NotServing {
                    // It may come back restarted, its cache empty.
                    state.cache_report.reset();
                }
                health.set_service_status("", status).await;
                health
                    .set_service_status(
                        <WorkerServer<WorkerService> as tonic::server::NamedService>::NAME,
                        status,
                    )
                    .await;
            }
        });
    }

    // Certificate files are read before binding: a bad one fails the
    // start, never a plain-text fallback.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(worker::tls::server_config(&worker::tls::TlsFiles {
            cert,
            key,
            client_ca: args.tls_client_ca.as_deref(),
        })?),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let addr = listener.local_addr()?;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let max_streams = loaded
        .capacity
        .saturating_add(args.max_queue)
        .saturating_add(64);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(max_streams)
        .add_service(health_service)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            WorkerServer::new(WorkerService::new(Arc::clone(&state)))
                .max_decoding_message_size(MAX_REQUEST_BYTES),
            RequireToken::new(args.auth_token.as_deref()),
        ));
    let stopped = async {
        let _ = stop_rx.await;
    };
    let mut server = match tls {
        Some(config) => tokio::spawn(
            router.serve_with_incoming_shutdown(worker::tls::incoming(listener, config), stopped),
        ),
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            stopped,
        )),
    };
    let metrics = match args.metrics_listen {
        Some(at) => {
            let (listener, bound) = worker::metrics::bind(at).await?;
            let page = worker::metrics::MetricsPage::new(Arc::clone(&state))?;
            tracing::info!("metrics on http://{bound}/metrics");
            tokio::spawn(page.serve(listener));
            Some(bound)
        }
        None => None,
    };

    {
        let mut out = std::io::stdout().lock();
        if let Some(bound) = metrics {
            writeln!(out, "worker metrics on {bound}")?;
        }
        writeln!(
            out,
            "worker listening on {addr} model={} engine={engine_name}{}",
            args.model,
            if args.tls_cert.is_some() { " tls" } else { "" }
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
            "grace period over; stopping the generations still open"
        );
        // Each ends its stream with DRAINING, so its client learns the
        // worker shut down; a moment for those last statuses to be sent.
        state.drain.end_grace();
        drain::wait_idle(&state.admission, Duration::from_secs(1)).await;
    }
    let _ = stop_tx.send(());
    // Let open connections close; do not wait on a client that keeps one.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    Ok(())
}
