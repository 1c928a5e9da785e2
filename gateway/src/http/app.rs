//! The public listener: reads a request under limits, routes it, writes the
//! answer, records metrics, and hands the connection back for keep-alive.

use super::exchange::Exchange;
use crate::app::App;
use crate::error::ApiError;
use crate::metrics::METRICS;
use crate::routes;
use async_trait::async_trait;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use std::sync::Arc;
use std::time::Duration;

pub struct PublicApp(pub Arc<App>);

#[async_trait]
impl HttpServerApp for PublicApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        let app = &self.0;
        // Slow or silent clients must not hold a connection forever.
        let read_timeout = Duration::from_secs(app.config.read_timeout_seconds);
        match tokio::time::timeout(read_timeout, session.read_request()).await {
            Ok(Ok(true)) => {}
            // A request head that cannot be parsed still gets an answer.
            Ok(Err(e)) if *e.etype() == pingora_core::ErrorType::InvalidHTTPHeader => {
                let err = if e.to_string().contains("larger than") {
                    ApiError::headers_too_large(app.config.max_header_bytes)
                } else {
                    ApiError::new(
                        400,
                        "invalid_request",
                        "The HTTP request head is malformed.",
                    )
                };
                session.set_keepalive(None);
                let mut ex = Exchange::new(session, crate::translate::new_id("req_"));
                ex.send_error(&err).await;
                METRICS
                    .requests
                    .with_label_values(&["-", "-", status_label(err.status)])
                    .inc();
                return None;
            }
            // Closed, failed, or too slow to send its head (a silent or
            // slowloris client, or an idle keep-alive connection): close.
            _ => return None,
        }
        let _in_flight = crate::lifecycle::InFlight::begin();
        let closing = *shutdown.borrow() || crate::lifecycle::is_draining();
        // While draining, answer but close the connection afterwards.
        session.set_keepalive(if closing { None } else { Some(60) });
        let mut ex = Exchange::new(session, crate::translate::new_id("req_"));

        if let Err(e) = handle(app, &mut ex).await {
            if ex.response_started() {
                // A streamed response reports its own failures in-band.
                ex.status = e.status;
            } else {
                ex.send_error(&e).await;
            }
        }
        METRICS
            .requests
            .with_label_values(&[ex.route, ex.model, status_label(ex.status)])
            .inc();
        METRICS
            .request_duration
            .with_label_values(&[ex.route, ex.model])
            .observe(ex.started.elapsed().as_secs_f64());

        let session = ex.session;
        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
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

/// Static labels for the statuses the gateway sends (no allocation per request).
fn status_label(status: u16) -> &'static str {
    match status {
        200 => "200",
        304 => "304",
        400 => "400",
        401 => "401",
        402 => "402",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        409 => "409",
        413 => "413",
        415 => "415",
        429 => "429",
        431 => "431",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => "other",
    }
}
