//! The admin listener: `/metrics`, `/healthz`, `/readyz`. Kept off the
//! public port so that operators can scrape and probe without a key.

use crate::metrics::METRICS;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::ShutdownWatch;
use pingora_http::ResponseHeader;
use std::sync::Arc;

/// Readiness fails as soon as the gateway starts draining, so the load
/// balancer stops sending traffic before listeners close.
pub struct AdminApp(pub std::sync::Arc<crate::lifecycle::Shutdown>);

#[async_trait]
impl HttpServerApp for AdminApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !matches!(session.read_request().await, Ok(true)) {
            return None;
        }
        let ready = !self.0.is_draining() && !*shutdown.borrow();
        let (status, content_type, body): (u16, &str, Bytes) = match session.req_header().uri.path()
        {
            "/metrics" => (200, "text/plain; version=0.0.4", METRICS.render().into()),
            "/healthz" => (200, "text/plain", Bytes::from_static(b"ok\n")),
            "/readyz" if ready => (200, "text/plain", Bytes::from_static(b"ready\n")),
            "/readyz" => (503, "text/plain", Bytes::from_static(b"draining\n")),
            _ => (404, "text/plain", Bytes::from_static(b"not found\n")),
        };
        let mut h = ResponseHeader::build(status, Some(2)).ok()?;
        h.insert_header("content-type", content_type).ok()?;
        h.insert_header("content-length", body.len().to_string())
            .ok()?;
        session.write_response_header(Box::new(h)).await.ok()?;
        session.write_response_body(body, true).await.ok()?;
        let settings = HttpPersistentSettings::for_session(&session);
        session
            .finish()
            .await
            .ok()
            .flatten()
            .map(|s| ReusedHttpStream::from_reusable_stream(s, settings))
    }
}
