//! A client of the public API the way SDKs use it: reqwest with the bearer
//! key, plain replies as [`Reply`], event streams as [`SseStream`].

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::Method;
use serde_json::Value;
use std::time::Duration;

/// A client of one gateway. Cheap to clone; create one per test (a reqwest
/// client belongs to the tokio runtime it first ran on).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
}

impl Client {
    /// `base_url` ends in `/v1`; `key` is sent as `Authorization: Bearer`.
    pub fn new(base_url: &str, key: Option<&str>) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default();
        Self {
            http,
            base: base_url.trim_end_matches('/').to_string(),
            key: key.map(str::to_string),
        }
    }

    /// The same client with another key (`None`: no `Authorization` header).
    pub fn with_key(&self, key: Option<&str>) -> Self {
        Self {
            key: key.map(str::to_string),
            ..self.clone()
        }
    }

    /// `base_url` joined with `path` (`/chat/completions`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The underlying reqwest client (shares the connection pool).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request to `path` with the key set; add headers and body, then
    /// [`Client::send`] or [`Client::open_stream`].
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, self.url(path));
        match &self.key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    pub async fn get(&self, path: &str) -> Result<Reply> {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Reply> {
        self.send(self.request(Method::DELETE, path)).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Reply> {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    /// Sends and reads the whole body (60 s limit).
    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Result<Reply> {
        let resp = rb.timeout(Duration::from_secs(60)).send().await?;
        Reply::read(resp).await
    }

    /// POSTs `body` and returns the open event stream (check `status` first:
    /// an error before the stream starts is a plain JSON reply).
    pub async fn stream(&self, path: &str, body: &Value) -> Result<SseStream> {
        self.open_stream(self.request(Method::POST, path).json(body))
            .await
    }

    /// Sends and returns the response as an event stream.
    pub async fn open_stream(&self, rb: reqwest::RequestBuilder) -> Result<SseStream> {
        let resp = rb.send().await?;
        Ok(SseStream::new(resp))
    }
}

/// A chat request body: `model` and one user message.
pub fn chat_body(model: &str, content: &str) -> Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

/// [`chat_body`] with `stream: true`.
pub fn stream_body(model: &str, content: &str) -> Value {
    let mut body = chat_body(model, content);
    body["stream"] = serde_json::json!(true);
    body
}

/// A whole reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    async fn read(resp: reqwest::Response) -> Result<Self> {
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        Ok(Self {
            status,
            headers,
            body,
        })
    }

    /// The body as JSON; panics with the body text when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "reply (status {}) is not JSON ({e}): {}",
                self.status,
                self.text()
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.text())
    }
}

/// The envelope `type` the spec derives from a status.
pub fn error_type_for(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Asserts `reply` is the spec's error envelope with `status`, whatever its
/// `code` (a string): see [`assert_error`]. Returns the `error` object.
#[track_caller]
pub fn assert_envelope(reply: &Reply, status: u16) -> Value {
    assert_eq!(reply.status, status, "status of {reply}");
    assert!(
        reply
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/json")),
        "content-type of {reply}: {:?}",
        reply.header("content-type")
    );
    assert!(
        reply.header("x-request-id").is_some_and(|v| !v.is_empty()),
        "x-request-id on {reply}"
    );
    let body = reply.json();
    let e = body
        .get("error")
        .unwrap_or_else(|| panic!("no `error` in {reply}"));
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "message in {reply}"
    );
    assert_eq!(e["type"], error_type_for(status), "type in {reply}");
    assert!(e["code"].is_string(), "code (a string) in {reply}");
    assert_eq!(e["status"], status, "status field in {reply}");
    assert!(
        e.get("param").is_some_and(|p| p.is_null() || p.is_string()),
        "param (string or null) in {reply}"
    );
    if status == 429 || status == 503 {
        assert!(
            reply
                .header("retry-after")
                .is_some_and(|v| v.parse::<u64>().is_ok()),
            "retry-after (seconds) on {reply}"
        );
    }
    e.clone()
}

/// Asserts `reply` is the spec's error envelope with `status` and `code`:
/// `{error:{message (non-empty), type (from the status), param (present),
/// code (a string), status}}`, JSON content type, an `x-request-id`, and
/// `retry-after` on 429 and 503. Returns the `error` object for further checks.
#[track_caller]
pub fn assert_error(reply: &Reply, status: u16, code: &str) -> Value {
    let e = assert_envelope(reply, status);
    assert_eq!(e["code"], code, "code in {reply}");
    e
}

/// One server-sent event: the `event:` name if any, and the joined `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct SseFrame {
    pub event: Option<String>,
    pub data: String,
    /// The frame exactly as received, up to and including its blank line.
    pub raw: String,
}

impl SseFrame {
    /// `data` as JSON; panics with the frame when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {:?}", self.raw))
    }

    /// The chat stream's terminator `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data == "[DONE]"
    }
}

/// An open event-stream response, read frame by frame.
#[derive(Debug)]
pub struct SseStream {
    pub status: u16,
    pub headers: HeaderMap,
    resp: Option<reqwest::Response>,
    buf: Vec<u8>,
    /// Longest wait for the next frame before [`SseStream::next_frame`] fails.
    pub frame_timeout: Duration,
}

impl SseStream {
    fn new(resp: reqwest::Response) -> Self {
        Self {
            status: resp.status().as_u16(),
            headers: resp.headers().clone(),
            resp: Some(resp),
            buf: Vec::new(),
            frame_timeout: Duration::from_secs(30),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The next frame; `None` once the server closed the body cleanly.
    /// Comment-only frames (`: keep-alive`) are skipped.
    pub async fn next_frame(&mut self) -> Result<Option<SseFrame>> {
        loop {
            if let Some(frame) = self.take_frame()? {
                if frame.event.is_none() && frame.data.is_empty() {
                    continue;
                }
                return Ok(Some(frame));
            }
            let Some(resp) = self.resp.as_mut() else {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                bail!(
                    "stream ended inside a frame: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
            };
            match tokio::time::timeout(self.frame_timeout, resp.chunk()).await {
                Err(_) => bail!("no SSE frame within {:?}", self.frame_timeout),
                Ok(Err(e)) => return Err(e).context("reading the event stream"),
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                Ok(Ok(None)) => self.resp = None,
            }
        }
    }

    fn take_frame(&mut self) -> Result<Option<SseFrame>> {
        let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") else {
            return Ok(None);
        };
        let raw_bytes: Vec<u8> = self.buf.drain(..end + 2).collect();
        let raw = String::from_utf8(raw_bytes).context("SSE frame is not UTF-8")?;
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in raw.lines() {
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "event" => event = Some(value.to_string()),
                "data" => data.push(value),
                _ => {}
            }
        }
        let data = data.join("\n");
        Ok(Some(SseFrame { event, data, raw }))
    }

    /// Every remaining frame, until the server closes the body.
    pub async fn collect(mut self) -> Result<Vec<SseFrame>> {
        let mut frames = Vec::new();
        while let Some(f) = self.next_frame().await? {
            frames.push(f);
        }
        Ok(frames)
    }

    /// The rest of the body as one reply (for a stream request that failed
    /// before streaming and answered with a JSON error).
    pub async fn into_reply(mut self) -> Result<Reply> {
        let mut body = std::mem::take(&mut self.buf);
        if let Some(resp) = self.resp.take() {
            body.extend_from_slice(&resp.bytes().await?);
        }
        Ok(Reply {
            status: self.status,
            headers: self.headers,
            body: body.into(),
        })
    }
}
