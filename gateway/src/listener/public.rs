//! The public listener: reads a request under limits, routes it, writes the
//! answer, records metrics, and hands the connection back for keep-alive.

use crate::app::App;
use crate::error::ApiError;
use crate::http::Exchange;
use crate::metrics::METRICS;
use crate::routes;
use async_trait::async_trait;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

pub struct PublicApp {
    pub app: Arc<App>,
    /// With `[tls]`: the handshake watchdogs this connection stops.
    pub handshakes: Option<Arc<crate::tls::handshake::HandshakeDeadline>>,
}

#[async_trait]
impl HttpServerApp for PublicApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let app = &self.app;
        if let Some(handshakes) = &self.handshakes {
            handshakes.reached_http(session.client_addr().and_then(|a| a.as_inet()));
        }
        // Requests sent before the previous answer was read (HTTP/1.1
        // pipelining) are served in order: Pingora keeps the bytes read
        // past a request and hands them to the next session on this
        // connection (`finish` → `ReusedHttpStream`). Without this it
        // answered the first and closed, dropping the others unanswered.
        session.set_pipelining_enabled(true);
        // A client that stops reading must not hold its stream, its worker
        // and its concurrency slot: a write that cannot complete in time
        // fails, and the stream ends as if the client had gone.
        session.set_write_timeout(Some(Duration::from_secs(app.config.write_timeout_seconds)));
        // Slow or silent clients must not hold a connection forever.
        let read_timeout = Duration::from_secs(app.config.read_timeout_seconds);
        // This future lives as long as its connection; the head's read, an
        // error's write and the session's finish are each boxed, so it
        // keeps room only for what a long stream waits on.
        let head = Box::pin(tokio::time::timeout(read_timeout, session.read_request()));
        match head.await {
            Ok(Ok(true)) => {}
            // A request head that cannot be parsed still gets an answer.
            Ok(Err(e)) if *e.etype() == pingora_core::ErrorType::InvalidHTTPHeader => {
                let err = if e.to_string().contains("larger than") {
                    ApiError::headers_too_large(app.config.max_header_bytes)
                } else if too_many_headers(&e) {
                    ApiError::new(
                        431,
                        "request_header_fields_too_large",
                        format!("The request has more than {MAX_HEADER_FIELDS} header fields."),
                    )
                } else {
                    ApiError::new(
                        400,
                        "invalid_request",
                        "The HTTP request head is malformed.",
                    )
                };
                session.set_keepalive(None);
                let mut ex = Exchange::new(
                    session,
                    crate::ids::new_id("req_"),
                    telemetry::TraceParent::new_root(),
                );
                let sent = Box::pin(ex.send_error(&err));
                sent.await;
                METRICS
                    .requests
                    .with_label_values(&["-", "-", crate::metrics::status_label(err.status)])
                    .inc();
                return None;
            }
            // Closed, failed, or too slow to send its head (a silent or
            // slowloris client, or an idle keep-alive connection): close.
            _ => return None,
        }
        let _in_flight = app.shutdown.begin();
        // Pingora has already decided whether this connection may be
        // reused (off for `Connection: close`, HTTP/1.0, and, per RFC 9112
        // section 6.1, a request with both Content-Length and
        // Transfer-Encoding, so nothing smuggled after it is answered):
        // keep its "no", set our idle timeout on its "yes", and close while
        // draining.
        let reusable = session.get_keepalive().is_some();
        let closing = *shutdown.borrow() || app.shutdown.is_draining() || !reusable;
        session.set_keepalive(if closing { None } else { Some(60) });
        let request_id = crate::ids::new_id("req_");
        // One span per request: ids, route, model and status only (never
        // prompts or keys). Disabled, and so free, unless spans are exported
        // or `RUST_LOG` asks for target `gateway::request`.
        let span = tracing::info_span!(
            target: "gateway::request",
            "request",
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            http.request.method = %session.req_header().method,
            http.route = tracing::field::Empty,
            http.response.status_code = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            request_id = %request_id,
            trace_id = tracing::field::Empty,
        );
        let incoming = session
            .get_header(telemetry::TRACEPARENT)
            .and_then(|v| telemetry::TraceParent::parse(v.as_bytes()));
        let trace = telemetry::continue_trace(&span, incoming);
        if !span.is_disabled() {
            span.record("trace_id", tracing::field::display(trace.trace_id_hex()));
        }
        let mut ex = Exchange::new(session, request_id, trace);

        async {
            if let Err(e) = handle(app, &mut ex).await {
                if ex.response_started() {
                    // A streamed response reports its own failures in-band.
                    ex.status = e.status;
                } else {
                    let sent = Box::pin(ex.send_error(&e));
                    sent.await;
                }
            }
        }
        .instrument(span.clone())
        .await;
        if !span.is_disabled() {
            if ex.route != "-" {
                telemetry::rename(&span, ex.route);
            }
            span.record("http.route", tracing::field::display(ex.route));
            span.record("gen_ai.request.model", tracing::field::display(ex.model));
            span.record("http.response.status_code", ex.status);
            if ex.status >= 500 {
                span.record("otel.status_code", "error");
            }
        }
        drop(span);
        crate::metrics::record_request(ex.route, ex.model, ex.status, ex.started);

        let session = ex.session;
        let settings = HttpPersistentSettings::for_session(&session);
        let finished = Box::pin(session.finish());
        match finished.await {
            Ok(Some(stream)) => Some(ReusedHttpStream::from_reusable_stream(stream, settings)),
            _ => None,
        }
    }
}

async fn handle(app: &App, ex: &mut Exchange) -> Result<(), ApiError> {
    check_header_size(ex, app.config.max_header_bytes)?;
    routes::dispatch(app, ex).await
}

/// 431 for a header block over the configured limit.
fn check_header_size(ex: &Exchange, limit: usize) -> Result<(), ApiError> {
    let size: usize = ex
        .session
        .req_header()
        .headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    if size > limit {
        return Err(ApiError::headers_too_large(limit));
    }
    Ok(())
}

/// How many header fields Pingora parses (its `MAX_HEADERS`); more is a
/// parse failure whose cause is httparse's `TooManyHeaders`.
const MAX_HEADER_FIELDS: usize = 256;

/// Whether a head failed to parse because it has too many fields: an
/// oversized header section (431), not a malformed one (400).
fn too_many_headers(e: &pingora_core::Error) -> bool {
    e.cause
        .as_ref()
        .is_some_and(|c| c.to_string() == "too many headers")
}
