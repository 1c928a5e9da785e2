//! The one error type of the public API, mapped to the spec's status table
//! (section 7) here and nowhere else.
//!
//! Every failure a client can see is an [`ApiError`]. Its JSON envelope is
//! `{error:{message,type,param,code,status}}`, with `type` derived from the
//! status; the 402 blocked-account shape is the one exception and is
//! deliberately not wrapped in `error`. Every layer above the store may
//! build one; the layers below that return their own error types (the
//! store, the limiter, accounts, the pool, idempotency records, planner
//! sessions) get theirs mapped in `map.rs`, the only file here that
//! imports them.

mod anthropic;
mod map;

pub use anthropic::AnthropicError;

use serde::Serialize;
use std::borrow::Cow;

/// `ev` of the 402 body for an organisation blocked by the operator.
pub const BLOCKED_EV: i64 = 1;
/// `ev` of the 402 body for an organisation past its spending budget.
pub const OVER_BUDGET_EV: i64 = 2;

/// A client-visible failure: status, stable `code`, optional `param`, message.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub code: Cow<'static, str>,
    pub message: String,
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (429 and 503).
    pub retry_after_secs: Option<u64>,
    /// Set only for 402: the spec's unwrapped blocked-account body.
    pub blocked: Option<Box<BlockedAccount>>,
}

/// Detail of the 402 blocked-account shape (spec 2.9).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedAccount {
    /// Integer code; we use 402 (the spec leaves the value open).
    pub code: i64,
    /// Integer `ev`; we use 1 for "blocked by the operator", 2 for "over budget".
    pub ev: i64,
    pub reason: String,
}

impl ApiError {
    pub fn new(
        status: u16,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
            param: None,
            retry_after_secs: None,
            blocked: None,
        }
    }

    /// Names the request field concerned, in dot notation (`messages.0.content`).
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Replaces the human-readable message (code and param stay).
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    // ---- constructors for the conditions the gateway raises -----------------

    pub fn invalid_value(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_value", message).with_param(param)
    }

    /// A value the public API defines that this service cannot honour.
    pub fn unsupported_value(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(400, "unsupported_value", message).with_param(param)
    }

    pub fn invalid_type(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_type", message).with_param(param)
    }

    pub fn missing_parameter(param: impl Into<String>) -> Self {
        let param = param.into();
        Self::new(
            400,
            "missing_required_parameter",
            format!("Missing required parameter: '{param}'."),
        )
        .with_param(param)
    }

    pub fn unknown_parameter(param: impl Into<String>) -> Self {
        let param = param.into();
        Self::new(
            400,
            "unknown_parameter",
            format!("Unrecognized request argument supplied: '{param}'."),
        )
        .with_param(param)
    }

    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_json", message)
    }

    pub fn invalid_api_key() -> Self {
        Self::new(
            401,
            "invalid_api_key",
            "Incorrect or missing API key. Provide it as 'Authorization: Bearer <API_KEY>'.",
        )
    }

    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(403, "permission_denied", message)
    }

    pub fn blocked(reason: impl Into<String>, ev: i64) -> Self {
        let reason = reason.into();
        let mut e = Self::new(402, "account_blocked", format!("Account blocked: {reason}"));
        e.blocked = Some(Box::new(BlockedAccount {
            code: 402,
            ev,
            reason,
        }));
        e
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            404,
            "model_not_found",
            format!("The model '{model}' does not exist or you do not have access to it."),
        )
        .with_param("model")
    }

    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            404,
            "not_found",
            format!("Unknown request URL: {method} {path}."),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "method_not_allowed",
            format!("Method {method} is not allowed on {path}."),
        )
    }

    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "request_too_large",
            format!("Request body exceeds the limit of {limit} bytes."),
        )
    }

    /// 415: a JSON body was sent under another content type (or none).
    pub fn unsupported_media_type(content_type: Option<&str>) -> Self {
        let got = match content_type {
            Some(ct) => format!("'{ct}'"),
            None => "no Content-Type header".to_string(),
        };
        Self::new(
            415,
            "unsupported_media_type",
            format!("The request body must be JSON sent with 'Content-Type: application/json'; got {got}."),
        )
    }

    /// 408: the client did not send its request (or body) in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(408, "request_timeout", message)
    }

    /// 431: the request's header block is over the configured limit.
    pub fn headers_too_large(limit: usize) -> Self {
        Self::new(
            431,
            "request_header_fields_too_large",
            format!("Request headers exceed the limit of {limit} bytes."),
        )
    }

    /// 409: the request conflicts with the current state of a resource
    /// (e.g. chaining on a response that has not finished).
    pub fn conflict(code: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        Self::new(409, code, message)
    }

    /// 409: the first request with this `Idempotency-Key` is still
    /// running; retry after `retry_after_secs` for its outcome.
    pub fn idempotency_key_in_use(retry_after_secs: u64) -> Self {
        Self::conflict(
            "idempotency_key_in_use",
            "A request with this 'Idempotency-Key' is still running; retry after it finishes to receive its result.",
        )
        .with_retry_after(retry_after_secs)
    }

    /// 422: the `Idempotency-Key` was used with another body (or on the
    /// other endpoint) within its window. Not retryable: the key is the
    /// first request's.
    pub fn idempotency_key_reused() -> Self {
        Self::new(
            422,
            "idempotency_key_reused",
            "This 'Idempotency-Key' was already used with a different request body; use a new key for a new request.",
        )
    }

    /// 409 without a retry: the first request with this key succeeded,
    /// but its reply was too large to keep for a replay.
    pub fn idempotency_result_not_kept() -> Self {
        Self::conflict(
            "idempotency_result_not_kept",
            "The request with this 'Idempotency-Key' finished, but its reply was too large to keep for a retry; use a new key to run it again.",
        )
    }

    /// 403: storing this response would take the organisation past its
    /// plan's cap on stored bytes. Not a 429: waiting does not help, only
    /// deleting stored responses (or `store: false`) does.
    pub fn storage_quota_exceeded(used: u64, needed: u64, cap: u64) -> Self {
        Self::new(
            403,
            "storage_quota_exceeded",
            format!(
                "Storing this response ({needed} bytes) would exceed your organization's limit of {cap} bytes of stored responses ({used} in use). Delete stored responses, or send 'store': false."
            ),
        )
        .with_param("store")
    }

    pub fn rate_limited(message: impl Into<String>, retry_after_secs: u64) -> Self {
        Self::new(429, "rate_limit_exceeded", message).with_retry_after(retry_after_secs)
    }

    /// An upgrade past `[websocket] max_connections_per_key`.
    pub fn too_many_connections(limit: u32) -> Self {
        Self::new(
            429,
            "too_many_connections",
            format!(
                "This API key already holds {limit} open WebSocket connections to this server, its limit; close one, or retry later."
            ),
        )
        .with_retry_after(5)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal_error", message)
    }

    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(502, "upstream_error", message)
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self::new(503, "server_overloaded", message).with_retry_after(1)
    }

    /// 503: Redis (keys, limits, stored responses, planner sessions) cannot
    /// be reached. One code whichever layer noticed the outage.
    pub fn store_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "store_unavailable", message).with_retry_after(1)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "timeout", message)
    }

    /// 503 `replica_shutdown`: this gateway replica is restarting and its
    /// drain grace period ran out before the reply finished. The spec's
    /// "briefly unavailable during a deployment": another replica serves
    /// the retry, so it is worth one at once.
    pub fn replica_shutdown() -> Self {
        Self::new(
            503,
            "replica_shutdown",
            "The gateway replica serving this request is restarting and ended the reply \
             before it finished; retry the request (another replica will serve it).",
        )
        .with_retry_after(1)
    }

    // ---- the status table ---------------------------------------------------

    /// The envelope's `type`, derived from the status (spec 2.9).
    pub fn error_type(&self) -> &'static str {
        match self.status {
            401 => "authentication_error",
            402 => "billing_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Whether a retry can help. The SDKs retry 408/409/429/5xx unless told
    /// otherwise; every other 4xx gives the same answer again (spec 7, rule 3).
    pub fn retryable(&self) -> bool {
        matches!(self.status, 408 | 409 | 429) || self.status >= 500
    }

    /// Response headers this error carries beyond the content type.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = Vec::with_capacity(2);
        // 429 and 503 always tell the client when to come back (spec 7).
        let retry_after = match (self.retry_after_secs, self.status) {
            (Some(secs), _) => Some(secs),
            (None, 429 | 503) => Some(1),
            (None, _) => None,
        };
        if let Some(secs) = retry_after {
            headers.push(("retry-after", secs.to_string()));
        }
        if !self.retryable() {
            headers.push(("x-should-retry", "false".to_string()));
        }
        headers
    }

    /// The JSON body: the standard envelope, or the 402 shape unwrapped.
    pub fn body(&self) -> Vec<u8> {
        let result = match &self.blocked {
            Some(b) => serde_json::to_vec(&BlockedBody {
                message: &self.message,
                code: b.code,
                ev: b.ev,
                data: BlockedData { reason: &b.reason },
            }),
            None => serde_json::to_vec(&Envelope { error: self.wire() }),
        };
        // Serializing plain strings and integers cannot fail; keep a fallback anyway.
        result.unwrap_or_else(|_| br#"{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal_error","status":500}}"#.to_vec())
    }

    /// The inner error object, also used for SSE error frames and events.
    pub fn wire(&self) -> WireError<'_> {
        WireError {
            message: &self.message,
            r#type: self.error_type(),
            param: self.param.as_deref(),
            code: &self.code,
            status: self.status,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

#[derive(Serialize)]
struct Envelope<'a> {
    error: WireError<'a>,
}

/// `{message, type, param, code, status}`: the envelope's inner object.
#[derive(Serialize, Debug)]
pub struct WireError<'a> {
    pub message: &'a str,
    pub r#type: &'static str,
    pub param: Option<&'a str>,
    pub code: &'a str,
    pub status: u16,
}

#[derive(Serialize)]
struct BlockedBody<'a> {
    message: &'a str,
    code: i64,
    ev: i64,
    data: BlockedData<'a>,
}

#[derive(Serialize)]
struct BlockedData<'a> {
    reason: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn body(e: &ApiError) -> Value {
        serde_json::from_slice(&e.body()).expect("error body is JSON")
    }

    #[test]
    fn envelope_carries_status_type_code_param() {
        let e = ApiError::unknown_parameter("max_token");
        let v = body(&e);
        assert_eq!(v["error"]["status"], 400);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "unknown_parameter");
        assert_eq!(v["error"]["param"], "max_token");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_token")));
    }

    #[test]
    fn type_is_derived_from_status() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "invalid_request_error"),
            (409, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "server_error"),
            (502, "server_error"),
            (503, "server_error"),
        ];
        for (status, ty) in cases {
            assert_eq!(ApiError::new(status, "x", "m").error_type(), ty, "{status}");
        }
    }

    #[test]
    fn retry_headers_follow_the_status_table() {
        let rl = ApiError::rate_limited("slow down", 3);
        assert_eq!(rl.headers(), vec![("retry-after", "3".to_string())]);
        let ov = ApiError::overloaded("busy");
        assert_eq!(ov.headers(), vec![("retry-after", "1".to_string())]);
        let bad = ApiError::invalid_value("temperature", "too hot");
        assert_eq!(bad.headers(), vec![("x-should-retry", "false".to_string())]);
        assert!(ApiError::new(409, "conflict", "wait").headers().is_empty());
    }

    /// One row per status the gateway sends: the envelope's `type` and
    /// `status`, and the retry headers the SDKs act on.
    #[test]
    fn every_status_of_the_table() {
        let cases: Vec<(ApiError, &str, Option<&str>, Option<&str>)> = vec![
            // (error, type, retry-after, x-should-retry)
            (
                ApiError::invalid_value("temperature", "m"),
                "invalid_request_error",
                None,
                Some("false"),
            ),
            (
                ApiError::invalid_api_key(),
                "authentication_error",
                None,
                Some("false"),
            ),
            (
                ApiError::permission_denied("m"),
                "permission_error",
                None,
                Some("false"),
            ),
            (
                ApiError::model_not_found("x"),
                "invalid_request_error",
                None,
                Some("false"),
            ),
            (
                ApiError::request_timeout("m"),
                "invalid_request_error",
                None,
                None,
            ),
            (
                ApiError::conflict("response_not_finished", "m"),
                "invalid_request_error",
                None,
                None,
            ),
            (
                ApiError::payload_too_large(10),
                "invalid_request_error",
                None,
                Some("false"),
            ),
            (
                ApiError::unsupported_media_type(Some("text/plain")),
                "invalid_request_error",
                None,
                Some("false"),
            ),
            (
                ApiError::rate_limited("m", 7),
                "rate_limit_error",
                Some("7"),
                None,
            ),
            (
                ApiError::new(429, "rate_limit_exceeded", "m"),
                "rate_limit_error",
                Some("1"),
                None,
            ),
            (
                ApiError::headers_too_large(10),
                "invalid_request_error",
                None,
                Some("false"),
            ),
            (ApiError::internal("m"), "server_error", None, None),
            (ApiError::upstream("m"), "server_error", None, None),
            (ApiError::overloaded("m"), "server_error", Some("1"), None),
            (
                ApiError::new(503, "server_overloaded", "m"),
                "server_error",
                Some("1"),
                None,
            ),
            (ApiError::timeout("m"), "server_error", None, None),
        ];
        for (e, ty, retry_after, should_retry) in cases {
            let v = body(&e);
            assert_eq!(v["error"]["type"], ty, "{e}");
            assert_eq!(v["error"]["status"], e.status, "{e}");
            assert_eq!(v["error"]["code"], e.code.as_ref(), "{e}");
            assert!(v["error"]["message"].is_string(), "{e}");
            assert!(
                v["error"].get("param").is_some(),
                "param is always present: {e}"
            );
            let headers = e.headers();
            let get = |k: &str| {
                headers
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(get("retry-after"), retry_after, "{e}");
            assert_eq!(get("x-should-retry"), should_retry, "{e}");
        }
        // 402 is the unwrapped shape and is never retried.
        let blocked = ApiError::blocked("over budget", 2);
        assert_eq!(
            blocked.headers(),
            vec![("x-should-retry", "false".to_string())]
        );
        assert_eq!(body(&blocked)["code"], 402);
    }

    #[test]
    fn blocked_shape_is_unwrapped() {
        let v = body(&ApiError::blocked("payment overdue", 1));
        assert!(v.get("error").is_none());
        assert_eq!(v["code"], 402);
        assert_eq!(v["ev"], 1);
        assert_eq!(v["data"]["reason"], "payment overdue");
        assert!(v["message"].is_string());
    }
}
