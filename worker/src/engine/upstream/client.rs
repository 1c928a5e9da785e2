//! The HTTP/1.1 client to the engine (hyper's pooled client: keep-alive
//! connections reused across requests, TCP_NODELAY so small SSE frames are
//! not held back), and the engine's refusals mapped to worker statuses.

use super::wire::ErrorEnvelope;
use crate::status;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use inference_proto::v1::ErrorReason;
use std::time::Duration;
use tonic::{Code, Status};

/// Largest non-streamed reply read (models, props, tokenize, metrics).
const MAX_REPLY_BYTES: usize = 8 * 1024 * 1024;

/// Idle keep-alive connections kept per engine: one per concurrent stream
/// is what a busy worker reuses.
const MAX_IDLE: usize = 256;

/// A client bound to one engine's base URL.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    /// `http://host:port` plus any path prefix, without a trailing slash.
    base: String,
    authorization: Option<http::HeaderValue>,
}

impl Http {
    pub fn new(base_url: &str, api_key: Option<&str>) -> anyhow::Result<Self> {
        let base = base_url.trim_end_matches('/').to_owned();
        let uri: http::Uri = base.parse()?;
        if uri.scheme_str() != Some("http") {
            anyhow::bail!(
                "--upstream-url must be http:// (the engine runs beside the worker): {base_url}"
            );
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(MAX_IDLE)
            .build(connector);
        let authorization = api_key
            .filter(|k| !k.is_empty())
            .map(|k| http::HeaderValue::from_str(&format!("Bearer {k}")))
            .transpose()?;
        Ok(Self {
            client,
            base,
            authorization,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
    ) -> Result<http::Request<Full<Bytes>>, Status> {
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if !body.is_empty() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        if let Some(auth) = &self.authorization {
            builder = builder.header(http::header::AUTHORIZATION, auth.clone());
        }
        builder
            .body(Full::new(body))
            .map_err(|e| status::engine_failure(format!("upstream request: {e}")))
    }

    /// Sends a request; the reply's head, its body still streaming.
    pub async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
    ) -> Result<http::Response<Incoming>, Status> {
        let req = self.request(method, path, body)?;
        self.client.request(req).await.map_err(|e| {
            status::engine_failure(format!("upstream engine at {} unreachable: {e}", self.base))
        })
    }

    /// A whole (small) reply: status and body, within `timeout`.
    pub async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(http::StatusCode, Bytes), Status> {
        let fut = async {
            let resp = self.send(method, path, body).await?;
            let code = resp.status();
            let body = Limited::new(resp.into_body(), MAX_REPLY_BYTES)
                .collect()
                .await
                .map_err(|e| status::engine_failure(format!("upstream {path}: {e}")))?
                .to_bytes();
            Ok((code, body))
        };
        tokio::time::timeout(timeout, fut).await.map_err(|_| {
            status::engine_failure(format!("upstream {path}: no reply in {timeout:?}"))
        })?
    }

    /// A JSON reply of a 2xx, else the engine's refusal as a status.
    pub async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: http::Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<T, Status> {
        let (code, bytes) = self.call(method, path, body, timeout).await?;
        if !code.is_success() {
            return Err(refusal(code, &bytes, None));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| status::engine_failure(format!("upstream {path}: unreadable reply: {e}")))
    }
}

/// What the worker knew when the engine refused, to word a context
/// overflow exactly as the in-process engine does.
#[derive(Debug, Clone, Copy)]
pub struct Known {
    pub window: u32,
    pub prompt: u32,
    pub max_tokens: u32,
}

/// Whether an engine's 400 says the prompt does not fit (vLLM: "maximum
/// context length", SGLang: "longer than the model's context length",
/// llama-server: `exceed_context_size_error`).
fn is_context_overflow(kind: Option<&str>, message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    kind == Some("exceed_context_size_error")
        || m.contains("context length")
        || m.contains("context size")
        || m.contains("context window")
}

/// An engine's non-2xx reply as a worker status: 400 context overflow →
/// `CONTEXT_LENGTH_EXCEEDED`; other 4xx → `INVALID_REQUEST` (the caller's
/// fault, never the worker's); 429 and 503 → `OVERLOADED` (retryable on
/// another worker before the first token); other 5xx → `ENGINE_FAILURE`.
pub fn refusal(code: http::StatusCode, body: &[u8], known: Option<Known>) -> Status {
    let err = serde_json::from_slice::<ErrorEnvelope>(body)
        .map(|e| e.error)
        .unwrap_or_default();
    let message = if err.message.is_empty() {
        String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned()
    } else {
        err.message
    };
    let n = code.as_u16();
    match n {
        429 | 503 => status::with_reason(
            Code::ResourceExhausted,
            ErrorReason::Overloaded,
            format!("upstream engine overloaded (HTTP {n}): {message}"),
        ),
        400..=499 if is_context_overflow(err.kind.as_deref(), &message) => match known {
            Some(k) => status::context_length_exceeded(k.window, k.prompt, k.max_tokens),
            None => status::with_reason(
                Code::InvalidArgument,
                ErrorReason::ContextLengthExceeded,
                message,
            ),
        },
        400..=499 => {
            status::invalid_request(format!("the model's engine refused the request: {message}"))
        }
        _ => status::engine_failure(format!("upstream engine failed (HTTP {n}): {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(s: &Status) -> &str {
        status::reason_of(s).unwrap_or("")
    }

    #[test]
    fn engine_errors_map_to_worker_statuses() {
        let vllm = br#"{"error":{"message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens","type":"BadRequestError","code":400}}"#;
        let s = refusal(http::StatusCode::BAD_REQUEST, vllm, None);
        assert_eq!(reason(&s), "CONTEXT_LENGTH_EXCEEDED");
        assert_eq!(s.code(), Code::InvalidArgument);

        let llama = br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":2000,"n_ctx":1024}}"#;
        let s = refusal(
            http::StatusCode::BAD_REQUEST,
            llama,
            Some(Known {
                window: 1024,
                prompt: 2000,
                max_tokens: 16,
            }),
        );
        assert_eq!(reason(&s), "CONTEXT_LENGTH_EXCEEDED");
        assert!(s
            .message()
            .contains("maximum context length is 1024 tokens"));

        let sglang = br#"{"object":"error","message":"The input (5000 tokens) is longer than the model's context length (4096 tokens).","type":"BadRequestError","code":400}"#;
        // SGLang's flat shape: the text is still recognised.
        let s = refusal(http::StatusCode::BAD_REQUEST, sglang, None);
        assert_eq!(reason(&s), "CONTEXT_LENGTH_EXCEEDED");

        let s = refusal(
            http::StatusCode::BAD_REQUEST,
            br#"{"error":{"message":"bad tool"}}"#,
            None,
        );
        assert_eq!(reason(&s), "INVALID_REQUEST");
        for code in [429, 503] {
            let s = refusal(
                http::StatusCode::from_u16(code).expect("code"),
                b"busy",
                None,
            );
            assert_eq!(reason(&s), "OVERLOADED");
            assert_eq!(s.code(), Code::ResourceExhausted);
        }
        let s = refusal(http::StatusCode::INTERNAL_SERVER_ERROR, b"oops", None);
        assert_eq!(reason(&s), "ENGINE_FAILURE");
        assert_eq!(s.code(), Code::Internal);
    }
}
