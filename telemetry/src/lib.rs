//! Logs and distributed tracing, shared by the gateway and the workers.
//!
//! - [`init`] installs the process's `tracing` subscriber: human-readable
//!   logs on stderr (filtered by `RUST_LOG`), plus, only when an OTLP
//!   endpoint is configured, an OpenTelemetry layer whose spans a batch
//!   exporter sends over OTLP/gRPC from a thread and runtime of its own.
//!   Without an endpoint no OpenTelemetry layer exists at all.
//! - [`TraceParent`] is the W3C trace context the gateway sends to a worker
//!   in the `traceparent` gRPC metadata entry of every `Generate` call
//!   ([`TRACEPARENT`]), whether or not anything is exported, so that the
//!   logs of both sides correlate on one trace id.

mod demote;
mod traceparent;

pub use demote::Demoted;
pub use traceparent::TraceParent;

use anyhow::Context as _;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::Layer;

/// gRPC metadata key (and HTTP header) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";
/// gRPC metadata key (and HTTP header) of the gateway's request id.
pub const REQUEST_ID: &str = "x-request-id";
/// The standard OpenTelemetry variable naming the OTLP collector.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard OpenTelemetry variable naming this service.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";

/// How long a shutdown waits for the last spans to be exported.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound on one export call.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether spans are exported (an OpenTelemetry layer is installed).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// What [`init`] sets up.
pub struct Options<'a> {
    /// `service.name` of exported spans.
    pub service_name: &'a str,
    /// `http://host:4317`; `None` (or empty) = export nothing.
    pub otlp_endpoint: Option<&'a str>,
    /// Log filter when `RUST_LOG` is not set.
    pub default_log_filter: &'a str,
    /// Targets (crate or module paths) whose spans are exported, at INFO and
    /// above. Keeping the exporter's own dependencies (tonic, hyper, h2) out
    /// of this list keeps its work out of the traces.
    pub export_targets: &'a [&'a str],
    /// `log` records of dependencies passed on at DEBUG rather than at the
    /// level they were logged at.
    pub demoted: &'a [Demoted],
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] (or drop) flushes it.
#[must_use = "dropping the handle stops span export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    runtime_stop: Option<std::sync::mpsc::Sender<()>>,
    runtime_thread: Option<std::thread::JoinHandle<()>>,
}

impl Telemetry {
    /// Whether spans are exported over OTLP.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is left (bounded by a short timeout) and stops the
    /// exporter's runtime. Idempotent.
    pub fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                eprintln!("telemetry: flushing spans at shutdown failed: {e}");
            }
            EXPORTING.store(false, Ordering::Relaxed);
        }
        if let Some(stop) = self.runtime_stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.runtime_thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Installs the global `tracing` subscriber (logs to stderr, and OTLP span
/// export when `otlp_endpoint` is set). Call once, early in `main`, outside
/// any async runtime (the exporter gets a runtime of its own).
pub fn init(options: &Options<'_>) -> anyhow::Result<Telemetry> {
    let log_filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(options.default_log_filter));
    // Colours only on a terminal, not in log files and collectors.
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(log_filter);

    let endpoint = options
        .otlp_endpoint
        .map(str::trim)
        .filter(|e| !e.is_empty());
    let Some(endpoint) = endpoint else {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(logs))?;
        demote::install(options.demoted)?;
        return Ok(Telemetry {
            provider: None,
            runtime_stop: None,
            runtime_thread: None,
        });
    };

    // The tonic exporter's channel spawns its connection tasks on the
    // runtime current when it is built; give it one that lives as long as
    // the exporter, on a thread of its own (the gateway's Pingora runtimes
    // do not exist yet, and the batch processor exports from its own
    // thread, blocking on futures those tasks complete).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("otel-export")
        .build()
        .context("starting the OTLP exporter's runtime")?;
    let exporter = {
        let _entered = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("OTLP exporter for {endpoint}"))?
    };
    let (runtime_stop, stopped) = std::sync::mpsc::channel::<()>();
    let runtime_thread = std::thread::Builder::new()
        .name("otel-export".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Park this runtime until shutdown; its tasks (the channel's
                // connection) keep running meanwhile.
                let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
            });
        })
        .context("starting the OTLP exporter's thread")?;

    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(options.service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer(options.service_name.to_owned());
    let mut targets = tracing_subscriber::filter::Targets::new();
    for target in options.export_targets {
        targets = targets.with_target(*target, tracing::Level::INFO);
    }
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_threads(false)
        .with_filter(targets);
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(logs).with(spans))?;
    demote::install(options.demoted)?;
    EXPORTING.store(true, Ordering::Relaxed);
    tracing::info!(
        endpoint,
        service = options.service_name,
        "exporting spans over OTLP"
    );
    Ok(Telemetry {
        provider: Some(provider),
        runtime_stop: Some(runtime_stop),
        runtime_thread: Some(runtime_thread),
    })
}

/// Whether an OpenTelemetry layer is installed (see [`init`]).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The trace context to send downstream for work done under `span`.
///
/// `incoming` is the caller's context (a client's `traceparent` header, or
/// the gateway's metadata on a worker), which `span` continues. When spans
/// are exported, the result names `span` itself, so downstream spans nest
/// under it; otherwise it keeps the incoming trace id (or starts a new
/// trace) with a fresh span id, so logs still correlate across processes.
/// Call before `span` is first entered.
pub fn continue_trace(span: &tracing::Span, incoming: Option<TraceParent>) -> TraceParent {
    if exporting() && !span.is_disabled() {
        if let Some(parent) = incoming {
            let _ = span.set_parent(parent.otel_context());
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        if span_context.is_valid() {
            return TraceParent::from_span_context(&span_context);
        }
    }
    match incoming {
        Some(parent) => parent.child(),
        None => TraceParent::new_root(),
    }
}

/// Links `span` to a remote parent (a worker's generation span under the
/// gateway's request span). Does nothing unless spans are exported.
pub fn set_remote_parent(span: &tracing::Span, parent: &TraceParent) {
    if exporting() && !span.is_disabled() {
        let _ = span.set_parent(parent.otel_context());
    }
}

/// Renames an exported span once its name is known (a request's route is
/// known only after routing, and the span has started by then). Does
/// nothing unless spans are exported.
pub fn rename(span: &tracing::Span, name: &'static str) {
    if exporting() && !span.is_disabled() {
        span.context().span().update_name(name);
    }
}
