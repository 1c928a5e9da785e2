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
use worker::engine::synthetic::{SyntheticConfig, SyntheticEngine};
use worker::model::ModelProfile;
use worker::sampling_defaults::SamplingDefaults;
use worker::service::{Engines, WorkerService, WorkerState};

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

#[derive(Parser, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["url", "s3", "hf_repo"])))]
struct FetchArgs {
    /// The directory the file goes to (created if missing).
    #[arg(long)]
    dest: std::path::PathBuf,
    /// The file's expected sha256 (64 hex digits).
    #[arg(long)]
    sha256: String,
    /// The file's name in --dest (default: the source's last path segment).
    #[arg(long)]
    file: Option<String>,
    /// An http:// or https:// URL.
    #[arg(long)]
    url: Option<String>,
    /// An object of an S3-compatible bucket: s3://BUCKET/KEY.
    #[arg(long, requires = "s3_endpoint")]
    s3: Option<String>,
    /// The S3 endpoint (`https://s3.eu-west-1.amazonaws.com`, a MinIO URL).
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// The bucket's region (signed into the request).
    #[arg(long, default_value = "us-east-1")]
    s3_region: String,
    /// Address the bucket as BUCKET.ENDPOINT (virtual-host style) instead
    /// of ENDPOINT/BUCKET (path style, what MinIO and most S3-compatible
    /// stores take).
    #[arg(long)]
    s3_virtual_host: bool,
    /// A Hugging Face model repository: ORG/NAME.
    #[arg(long, requires = "hf_file")]
    hf_repo: Option<String>,
    /// The file in the repository (`model-q4_k_m.gguf`, `sub/dir/file`).
    #[arg(long)]
    hf_file: Option<String>,
    /// A branch, tag or commit of the repository.
    #[arg(long, default_value = "main")]
    hf_revision: String,
    /// The Hub (a mirror, or a test server).
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    hf_endpoint: String,
    /// Attempts in a row without progress before giving up.
    #[arg(long, default_value_t = 8)]
    retries: u32,
    /// The first wait between attempts, in milliseconds (doubling, at most 30 s).
    #[arg(long, default_value_t = 500)]
    retry_backoff_ms: u64,
    #[arg(long, default_value_t = 30)]
    connect_timeout_seconds: u64,
    /// Longest silence of a response (head or body) before the connection
    /// counts as cut.
    #[arg(long, default_value_t = 60)]
    idle_timeout_seconds: u64,
    /// A PEM bundle of further trusted CAs (a private object store).
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// The file's size in bytes, when known: never more is written, and a
    /// server declaring another size is refused.
    #[arg(long)]
    size: Option<u64>,
    /// The longest the whole fetch may take, every attempt and wait included.
    #[arg(long, default_value_t = 86_400)]
    deadline_seconds: u64,
    /// A further host redirects may go to (`cdn.example`, or `.example`
    /// for every host under it); repeatable.
    #[arg(long)]
    allow_redirect_host: Vec<String>,
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
    /// llama: the GGUF model file.
    #[arg(long)]
    model_file: Option<std::path::PathBuf>,
    /// llama: a display name for the weights (default: the file name).
    #[arg(long)]
    model_name: Option<String>,
    /// llama: context window of each sequence in tokens (default: the
    /// model's training context).
    #[arg(long, default_value_t = 0)]
    n_ctx: u32,
    /// llama: sequences decoded together (slots); the running capacity.
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// llama: CPU threads (default: the available cores).
    #[arg(long)]
    threads: Option<i32>,
    /// upstream: the engine's base URL (`http://127.0.0.1:8000`).
    #[arg(long)]
    upstream_url: Option<String>,
    /// upstream: which engine serves there (field mapping, tokenizer,
    /// metrics).
    #[arg(long, value_enum, default_value = "vllm")]
    upstream_kind: worker::engine::upstream::kind::Kind,
    /// upstream: the engine's model id (default: the first it lists).
    #[arg(long)]
    upstream_model: Option<String>,
    /// upstream: enforce `tool_choice` required/named with a JSON schema of
    /// the call (default: on for llama-server, off for the others).
    #[arg(long)]
    upstream_enforce_tools: Option<bool>,
    /// upstream: the engine's API key, if it was started with one.
    #[arg(long, env = "UPSTREAM_API_KEY", hide_env_values = true)]
    upstream_api_key: Option<String>,
    /// upstream: how long to wait for the engine at start-up.
    #[arg(long, default_value_t = 600)]
    upstream_startup_timeout_seconds: u64,
    /// upstream: health and load scrape interval, in milliseconds.
    #[arg(long, default_value_t = 250)]
    upstream_scrape_ms: u64,
    /// upstream: longest wait from sending a request to the engine's first
    /// SSE event (prefill of a long prompt included), in milliseconds.
    /// Past it the generation fails with DEADLINE_EXCEEDED (gateway: 504)
    /// and the worker reports NOT_SERVING until the engine answers again.
    #[arg(long, default_value_t = 60_000)]
    upstream_first_byte_timeout_ms: u64,
    /// upstream: longest silence between the engine's SSE events once the
    /// reply streams, in milliseconds; past it, as the first-byte timeout.
    #[arg(long, default_value_t = 15_000)]
    upstream_idle_timeout_ms: u64,
    /// upstream: largest SSE event accepted from the engine, in bytes; a
    /// longer one (a line without its newline) fails the generation with
    /// ENGINE_FAILURE instead of growing the worker's memory.
    #[arg(long, default_value_t = 1024 * 1024)]
    upstream_max_event_bytes: usize,
    /// upstream llama-server: leave the choice of slot to the engine
    /// instead of naming one per request (`id_slot`). Use it when other
    /// clients share the engine: the worker's cache report is then an
    /// estimate from what it sent.
    #[arg(long)]
    upstream_no_slot_pinning: bool,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Serve Prometheus metrics (`GET /metrics`: worker_requests_running,
    /// worker_requests_waiting, worker_capacity, totals) on this address;
    /// absent = no metrics listener.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Delay before the first event of a reply, in milliseconds.
    #[arg(long, default_value_t = 0)]
    ttft_ms: u64,
    /// Output pace; 0 = as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    tokens_per_second: f64,
    /// Synthetic: prefill pace of prompt tokens not in its prefix cache,
    /// added to --ttft-ms; 0 = prefill takes no time.
    #[arg(long, default_value_t = 0.0)]
    prefill_tokens_per_second: f64,
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
    /// synthetic: merge up to N tokens into one event when they come
    /// faster than the stream takes them (unpaced): fewer, larger deltas
    /// for load tests. 1 = one token per event.
    #[arg(long, default_value_t = 1)]
    coalesce_tokens: u32,
    /// The synthetic engine's simulated prefix cache: its capacity in
    /// 64-token blocks.
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
    use worker::weights::source::{S3Credentials, Source};
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let source = if let Some(url) = args.url {
        Source::Url(url)
    } else if let Some(s3) = args.s3 {
        let (bucket, key) = Source::parse_s3_url(&s3)?;
        let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
            (Some(key), Some(secret)) => Some(S3Credentials {
                key,
                secret,
                token: env("AWS_SESSION_TOKEN"),
            }),
            (None, None) => None,
            _ => anyhow::bail!("set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither (a public bucket)"),
        };
        Source::S3 {
            bucket,
            key,
            endpoint: args.s3_endpoint.unwrap_or_default(),
            region: args.s3_region,
            virtual_host: args.s3_virtual_host,
            credentials,
        }
    } else if let Some(repo) = args.hf_repo {
        let valid = repo.split('/').count() == 2
            && repo.split('/').all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            });
        if !valid {
            anyhow::bail!("--hf-repo must be ORG/NAME, got '{repo}'");
        }
        Source::HuggingFace {
            endpoint: args.hf_endpoint,
            repo,
            file: args.hf_file.unwrap_or_default(),
            revision: args.hf_revision,
            token: env("HF_TOKEN"),
        }
    } else {
        anyhow::bail!("give one source: --url, --s3 or --hf-repo");
    };
    let opts = worker::weights::FetchOptions {
        source,
        dest: args.dest,
        file_name: args.file,
        sha256: args.sha256,
        retries: args.retries,
        backoff: Duration::from_millis(args.retry_backoff_ms.max(1)),
        connect_timeout: Duration::from_secs(args.connect_timeout_seconds.max(1)),
        idle_timeout: Duration::from_secs(args.idle_timeout_seconds.max(1)),
        ca_file: args.ca_file,
        expected_size: args.size,
        deadline: Duration::from_secs(args.deadline_seconds.max(1)),
        redirect_hosts: args.allow_redirect_host,
    };
    let path = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(worker::weights::fetch(&opts))?;
    println!("{}", path.display());
    Ok(())
}

/// The engine, its name and description, its model profile and capacity.
struct Loaded {
    engine: Engines,
    name: &'static str,
    description: String,
    model: ModelProfile,
    capacity: u32,
    /// Prompts the engine's cache holds at most (its slots), for the cache
    /// report.
    cache_slots: u32,
    /// A held prefix serves concurrent sequences too (see `PrefixCache`).
    concurrent_reuse: bool,
    /// Readiness reported by the engine itself (upstream), when it has one.
    ready: Option<tokio::sync::watch::Receiver<bool>>,
    /// What the weights file says to sample with (llama's GGUF metadata).
    model_sampling: SamplingDefaults,
}

async fn load_engine(args: &ServeArgs) -> anyhow::Result<Loaded> {
    match args.engine {
        EngineKind::Synthetic => {
            let model = ModelProfile::for_serving(&args.model, args.context_window)?;
            let engine = SyntheticEngine::new(
                SyntheticConfig {
                    ttft: Duration::from_millis(args.ttft_ms),
                    prefill_tokens_per_second: args.prefill_tokens_per_second.max(0.0),
                    tokens_per_second: args.tokens_per_second.max(0.0),
                    coalesce_tokens: args.coalesce_tokens,
                    fail_after_tokens: args.fail_after_tokens,
                    prefix_cache_blocks: args.prefix_cache_blocks,
                },
                model.clone(),
            );
            // Load the BPE before taking traffic, so the first request is not slow.
            let _ = worker::engine::synthetic::tokenizer::count("warm up");
            Ok(Loaded {
                engine: Engines::Sequence(Arc::new(engine)),
                name: "synthetic",
                description: worker::engine::synthetic::DESCRIPTION.to_owned(),
                model,
                capacity: args.max_concurrency,
                cache_slots: args.max_concurrency,
                concurrent_reuse: true,
                ready: None,
                model_sampling: SamplingDefaults::default(),
            })
        }
        EngineKind::Llama => load_llama(args),
        EngineKind::Upstream => load_upstream(args).await,
    }
}

async fn load_upstream(args: &ServeArgs) -> anyhow::Result<Loaded> {
    use worker::engine::upstream::kind::Kind;
    use worker::engine::upstream::{UpstreamConfig, UpstreamEngine};
    use worker::seam::chat::ChatEngine;
    let Some(url) = args.upstream_url.clone() else {
        anyhow::bail!("--engine upstream needs --upstream-url http://HOST:PORT");
    };
    let kind = args.upstream_kind;
    let scrape = Duration::from_millis(args.upstream_scrape_ms.max(10));
    let engine = UpstreamEngine::connect(&UpstreamConfig {
        url,
        kind,
        model: args.upstream_model.clone(),
        context_window: args.context_window,
        enforce_tools: args.upstream_enforce_tools,
        api_key: args.upstream_api_key.clone(),
        startup_timeout: Duration::from_secs(args.upstream_startup_timeout_seconds),
        scrape_interval: scrape,
        first_byte_timeout: Duration::from_millis(args.upstream_first_byte_timeout_ms),
        idle_timeout: Duration::from_millis(args.upstream_idle_timeout_ms),
        max_event_bytes: args.upstream_max_event_bytes,
        pin_slots: !args.upstream_no_slot_pinning,
    })
    .await?;
    let ready = engine.spawn_scraper(scrape);
    let mut model = ModelProfile::new(&args.model, Some(engine.context_window()));
    model.reasoning_budget = kind == Kind::Vllm;
    // llama-server says its slots (`/props`); others: what we send at once.
    let cache_slots = engine.capacity().unwrap_or(args.max_concurrency);
    Ok(Loaded {
        description: engine.description(),
        engine: Engines::Chat(Arc::new(engine)),
        name: "upstream",
        model,
        capacity: args.max_concurrency,
        cache_slots,
        // llama-server's slots each hold one sequence's cells; vLLM and
        // SGLang page theirs and share a prefix across sequences.
        concurrent_reuse: kind != Kind::LlamaServer,
        ready: Some(ready),
        model_sampling: SamplingDefaults::default(),
    })
}

#[cfg(feature = "llama")]
fn load_llama(args: &ServeArgs) -> anyhow::Result<Loaded> {
    use worker::engine::llama::{LlamaConfig, LlamaEngine};
    use worker::seam::sequence::SequenceEngine;
    let Some(file) = args.model_file.clone() else {
        anyhow::bail!("--engine llama needs --model-file PATH (a GGUF file)");
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(2, |n| i32::try_from(n.get()).unwrap_or(2))
    });
    let engine = LlamaEngine::load(&LlamaConfig {
        model_file: file.clone(),
        n_ctx: args.n_ctx,
        parallel: args.parallel,
        threads,
    })?;
    let mut model = ModelProfile::new(&args.model, Some(engine.context_window()));
    // A text-only model; the think section honours a budget.
    model.image_input = false;
    model.reasoning_budget = true;
    let name = args.model_name.clone().unwrap_or_else(|| {
        file.file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let description = format!("{name}: {}", engine.description());
    let model_sampling = engine.model_sampling();
    Ok(Loaded {
        engine: Engines::Sequence(Arc::new(engine)),
        name: "llama",
        description,
        model,
        capacity: args.parallel.max(1),
        cache_slots: args.parallel.max(1),
        // A busy slot's prefix is copied into a free one.
        concurrent_reuse: true,
        ready: None,
        model_sampling,
    })
}

#[cfg(not(feature = "llama"))]
fn load_llama(_: &ServeArgs) -> anyhow::Result<Loaded> {
    anyhow::bail!("this worker was built without the `llama` feature")
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
