//! One request and its response on a Pingora session: reading the body
//! under limits, writing JSON and errors (streams go through
//! [`super::SseReply`]), and noticing a client that went away.

use crate::error::ApiError;
use bytes::{Bytes, BytesMut};
use pingora_core::protocols::http::ServerSession;
use pingora_http::ResponseHeader;
use serde::Serialize;
use std::time::{Duration, Instant};

/// The status recorded for a request whose client went away first; never
/// sent (nobody is left to read it).
pub const CLIENT_CLOSED_REQUEST: u16 = 499;

pub struct Exchange {
    pub session: ServerSession,
    pub request_id: String,
    /// Trace context sent to workers (`traceparent` gRPC metadata): the
    /// request span's when spans are exported, else one that continues the
    /// client's `traceparent` or starts a trace.
    pub trace: telemetry::TraceParent,
    pub started: Instant,
    /// Metric label of the matched route (`-` until routed).
    pub route: &'static str,
    /// Metric label of the model (`-` when none applies).
    pub model: &'static str,
    /// Status sent (or, for a stream, the status a failure in it carried).
    pub status: u16,
    response_started: bool,
    /// Extra headers every response of this exchange carries (rate limits).
    pub extra_headers: Vec<(&'static str, String)>,
    /// Whose envelope and statuses its errors take: set by the route.
    pub dialect: Dialect,
}

/// The wire family of a route, for its errors: the OpenAI-shaped envelope
/// of every route, or Anthropic's on the Messages routes
/// (`crate::error::AnthropicError`'s table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dialect {
    #[default]
    OpenAi,
    Anthropic,
}

impl Exchange {
    pub fn new(session: ServerSession, request_id: String, trace: telemetry::TraceParent) -> Self {
        Self {
            session,
            request_id,
            trace,
            started: Instant::now(),
            route: "-",
            model: "-",
            status: 0,
            response_started: false,
            extra_headers: Vec::new(),
            dialect: Dialect::OpenAi,
        }
    }

    pub fn method(&self) -> &http::Method {
        &self.session.req_header().method
    }

    pub fn path(&self) -> &str {
        self.session.req_header().uri.path()
    }

    pub fn query(&self) -> Option<&str> {
        self.session.req_header().uri.query()
    }

    /// A request header's raw value.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.session.get_header(name).map(|v| v.as_bytes())
    }

    /// The `x-session-id` header, when it is valid UTF-8: groups a
    /// session's turns (worker affinity, planner mode).
    pub fn session_id(&self) -> Option<&str> {
        self.header("x-session-id")
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn response_started(&self) -> bool {
        self.response_started
    }

    /// Reads a JSON request body: the content type must say JSON (415
    /// otherwise, see [`is_json_content_type`]), then [`Self::read_body`].
    pub async fn read_json_body(
        &mut self,
        limit: usize,
        timeout: Duration,
    ) -> Result<Bytes, ApiError> {
        let content_type = self.header("content-type");
        if !content_type.is_some_and(is_json_content_type) {
            let shown = content_type.map(|v| String::from_utf8_lossy(v).into_owned());
            // The unread body would be taken for the next request.
            self.session.set_keepalive(None);
            return Err(ApiError::unsupported_media_type(shown.as_deref()));
        }
        self.read_body(limit, timeout).await
    }

    /// Reads the whole body, refusing more than `limit` bytes (413) and a
    /// body that trickles in slower than `timeout` (408).
    pub async fn read_body(&mut self, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
        if let Some(len) = self
            .header("content-length")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<usize>().ok())
        {
            if len > limit {
                self.session.set_keepalive(None);
                return Err(ApiError::payload_too_large(limit));
            }
        }
        let read = async {
            let mut body = BytesMut::new();
            loop {
                match self.session.read_request_body().await {
                    Ok(Some(chunk)) => {
                        if body.len() + chunk.len() > limit {
                            return Err(ApiError::payload_too_large(limit));
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(None) => return Ok(body.freeze()),
                    Err(e) => {
                        return Err(ApiError::invalid_json(format!(
                            "The request body could not be read: {}",
                            e.etype().as_str()
                        )))
                    }
                }
            }
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(body)) => Ok(body),
            Ok(Err(e)) => {
                self.session.set_keepalive(None);
                Err(e)
            }
            Err(_) => {
                self.session.set_keepalive(None);
                Err(ApiError::request_timeout(
                    "The request body was not received in time.",
                ))
            }
        }
    }

    /// Sends a response head: the content type, the request id, the extra
    /// headers, then `headers`. Takes the extra headers: only one head is
    /// sent, and a stream holds its exchange for its whole life. An error
    /// means the client is gone (or the head could not be built).
    pub(super) async fn write_head(
        &mut self,
        status: u16,
        content_type: &str,
        headers: &[(&str, String)],
    ) -> Result<(), ()> {
        self.status = status;
        self.response_started = true;
        let mut h =
            ResponseHeader::build(status, Some(6 + self.extra_headers.len())).map_err(|_| ())?;
        let set = |h: &mut ResponseHeader, k: &'static str, v: &str| {
            h.insert_header(k, v).map_err(|_| ())
        };
        set(&mut h, "content-type", content_type)?;
        set(&mut h, "x-request-id", &self.request_id)?;
        // Anthropic's clients read theirs from `request-id`.
        if self.dialect == Dialect::Anthropic {
            set(&mut h, "request-id", &self.request_id)?;
        }
        for (k, v) in std::mem::take(&mut self.extra_headers) {
            set(&mut h, k, &v)?;
        }
        for (k, v) in headers {
            let _ = h.insert_header(k.to_string(), v.as_str());
        }
        self.session
            .write_response_header(Box::new(h))
            .await
            .map_err(|_| ())
    }

    /// Sends `101 Switching Protocols` with `headers` (and the request id):
    /// from then on the session's body carries another protocol's bytes
    /// (`super::websocket`). An error means the client is gone.
    pub(super) async fn write_switching_protocols(
        &mut self,
        headers: &[(&str, String)],
    ) -> Result<(), ()> {
        self.status = 101;
        self.response_started = true;
        let mut h = ResponseHeader::build(101, Some(headers.len() + 1)).map_err(|_| ())?;
        h.insert_header("x-request-id", &self.request_id)
            .map_err(|_| ())?;
        for (k, v) in headers {
            h.insert_header(k.to_string(), v.as_str()).map_err(|_| ())?;
        }
        self.session
            .write_response_header(Box::new(h))
            .await
            .map_err(|_| ())
    }

    /// Sends a complete response. Write failures mean the client is gone;
    /// there is nobody left to tell, so they only end the exchange.
    pub async fn send(
        &mut self,
        status: u16,
        content_type: &str,
        headers: &[(&str, String)],
        body: Bytes,
    ) {
        let mut all = Vec::with_capacity(1 + headers.len());
        all.push(("content-length", body.len().to_string()));
        all.extend(headers.iter().cloned());
        if self.write_head(status, content_type, &all).await.is_err() {
            return;
        }
        let _ = self.session.write_response_body(body, true).await;
    }

    /// Sends a representation with its `etag`: 304 without a body when the
    /// request's `If-None-Match` names it ([`if_none_match`]), the head alone
    /// for HEAD, else the whole body.
    pub async fn send_cacheable(&mut self, content_type: &str, etag: &str, body: Bytes) {
        let etag = ("etag", etag.to_owned());
        let not_modified = self
            .header("if-none-match")
            .is_some_and(|v| if_none_match(v, &etag.1));
        if not_modified || *self.method() == http::Method::HEAD {
            let (status, headers) = if not_modified {
                (304, vec![etag])
            } else {
                // What GET would send, without the body.
                (200, vec![("content-length", body.len().to_string()), etag])
            };
            if self
                .write_head(status, content_type, &headers)
                .await
                .is_ok()
            {
                let _ = self.session.write_response_body(Bytes::new(), true).await;
            }
            return;
        }
        self.send(200, content_type, &[etag], body).await;
    }

    pub async fn send_json<T: Serialize>(
        &mut self,
        status: u16,
        value: &T,
        headers: &[(&str, String)],
    ) {
        match serde_json::to_vec(value) {
            Ok(body) => {
                self.send(status, "application/json", headers, body.into())
                    .await
            }
            Err(_) => {
                self.send_error(&ApiError::internal("could not encode the response"))
                    .await
            }
        }
    }

    pub async fn send_error(&mut self, e: &ApiError) {
        if e.status >= 500 {
            tracing::warn!(request_id = %self.request_id, status = e.status, code = %e.code, "request failed: {}", e.message);
        }
        let headers = e.headers();
        let (status, body) = match self.dialect {
            Dialect::OpenAi => (e.status, e.body()),
            Dialect::Anthropic => (e.anthropic().status, e.anthropic_body(&self.request_id)),
        };
        self.send(status, "application/json", &headers, body.into())
            .await;
    }

    /// Writes (and flushes) one chunk of a started stream.
    pub(super) async fn write_chunk(&mut self, data: Bytes) -> Result<(), ()> {
        self.session
            .write_response_body(data, false)
            .await
            .map_err(|_| ())
    }

    /// Ends a started stream (the terminating chunk).
    pub(super) async fn end_stream(&mut self) {
        let _ = self.session.finish_body().await;
    }

    /// The client went away before its answer was complete: recorded as
    /// 499 (nginx's "client closed request") in the access log and metrics.
    pub fn client_left(&mut self) {
        self.status = CLIENT_CLOSED_REQUEST;
    }

    /// Resolves when the client closes its connection. Only call once the
    /// request body has been read.
    pub async fn client_gone(&mut self) {
        // Treat a FIN as a disconnect; by default Pingora would wait forever
        // for a half-closed client.
        self.session.set_abort_on_close(true);
        loop {
            match self.session.read_body_or_idle(true).await {
                // Extra bytes on an idle request are not a disconnect. A
                // pipelined next request is kept for its turn (Pingora then
                // stops watching, so a later close is seen by a write).
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// Whether an `If-None-Match` value matches `etag` (RFC 9110 13.1.2): `*`
/// matches any current representation; otherwise it is a list of entity
/// tags compared weakly, so `W/"x"` matches `"x"`.
pub fn if_none_match(header: &[u8], etag: &str) -> bool {
    let Ok(value) = std::str::from_utf8(header) else {
        return false;
    };
    let weak = |t: &str| t.strip_prefix("W/").unwrap_or(t).to_owned();
    let ours = weak(etag);
    value.trim() == "*" || value.split(',').any(|t| weak(t.trim()) == ours)
}

/// Whether a `Content-Type` announces a JSON body: `application/json` or a
/// `+json` subtype, in any case, with an optional `charset` that must be
/// UTF-8 (JSON on the wire is UTF-8, RFC 8259). The public API's SDKs always
/// send `application/json`; anything else (a form post from `curl -d`
/// without `-H`, a missing header) gets 415 with a message that says what
/// to send, rather than a confusing parse error.
pub fn is_json_content_type(value: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    let mut parts = value.split(';');
    let media = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let json = media == "application/json"
        || (media.starts_with("application/") && media.ends_with("+json"));
    json && parts.all(|p| {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        !k.trim().eq_ignore_ascii_case("charset")
            || matches!(
                v.trim().trim_matches('"').to_ascii_lowercase().as_str(),
                "utf-8" | "utf8"
            )
    })
}

#[cfg(test)]
mod tests {
    use super::is_json_content_type;

    #[test]
    fn json_content_types() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
            "application/vnd.api+json",
        ] {
            assert!(is_json_content_type(ok.as_bytes()), "{ok}");
        }
        for bad in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/json; charset=utf-16",
            "application/jsonx",
        ] {
            assert!(!is_json_content_type(bad.as_bytes()), "{bad}");
        }
    }
}
