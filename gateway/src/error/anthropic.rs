//! The Anthropic rendering of the one [`ApiError`]: the Messages routes
//! (`/v1/messages`, `/v1/messages/count_tokens`) answer in Anthropic's
//! envelope, `{"type":"error","error":{"type","message"},"request_id"}`,
//! with Anthropic's statuses. One table, [`ApiError::anthropic`], maps
//! every status and code the gateway can give:
//!
//! | gateway status (code) | Anthropic status | `error.type` |
//! |---|---|---|
//! | 400, 405, 415 | same | `invalid_request_error` |
//! | 401 | 401 | `authentication_error` |
//! | 402 (blocked, over budget) | 402 | `billing_error` |
//! | 403 | 403 | `permission_error` |
//! | 404 | 404 | `not_found_error` |
//! | 408 (body not received in time) | 408 | `timeout_error` |
//! | 409 (`Idempotency-Key` in use, conflicts), 422 (key reused) | same | `invalid_request_error` |
//! | 413, 431 | same | `request_too_large` |
//! | 429 | 429 | `rate_limit_error` |
//! | 500 | 500 | `api_error` |
//! | 502 | 502 | `api_error` |
//! | 503 `server_overloaded` (pool full, queue full or timed out, no worker) | 529 | `overloaded_error` |
//! | 503 other (`store_unavailable`, `replica_shutdown`) | 503 | `api_error` |
//! | 504 | 504 | `timeout_error` |
//!
//! Anthropic's envelope has no `param`: a field the error is about leads
//! the message (`max_tokens: ...`), as Anthropic writes its own. The
//! `retry-after` and `x-should-retry` headers are the gateway's
//! ([`ApiError::headers`]); the official SDKs honour both.

use super::ApiError;
use serde::Serialize;

/// An [`ApiError`] as an Anthropic client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnthropicError {
    pub status: u16,
    pub r#type: &'static str,
}

#[derive(Serialize)]
struct Envelope<'a> {
    r#type: &'static str,
    error: Inner<'a>,
    request_id: &'a str,
}

#[derive(Serialize)]
struct Inner<'a> {
    r#type: &'static str,
    message: &'a str,
}

impl ApiError {
    /// The status and `error.type` an Anthropic client gets (the table above).
    pub fn anthropic(&self) -> AnthropicError {
        let (status, r#type) = match (self.status, self.code.as_ref()) {
            (401, _) => (401, "authentication_error"),
            (402, _) => (402, "billing_error"),
            (403, _) => (403, "permission_error"),
            (404, _) => (404, "not_found_error"),
            (408, _) => (408, "timeout_error"),
            (s @ (413 | 431), _) => (s, "request_too_large"),
            (429, _) => (429, "rate_limit_error"),
            (503, "server_overloaded") => (529, "overloaded_error"),
            (504, _) => (504, "timeout_error"),
            (s, _) if s >= 500 => (s, "api_error"),
            (s, _) => (s, "invalid_request_error"),
        };
        AnthropicError { status, r#type }
    }

    /// The message, led by the field it is about when there is one.
    fn anthropic_message(&self) -> std::borrow::Cow<'_, str> {
        match &self.param {
            Some(p) => format!("{p}: {}", self.message).into(),
            None => self.message.as_str().into(),
        }
    }

    /// The JSON body of an error response on a Messages route.
    pub fn anthropic_body(&self, request_id: &str) -> Vec<u8> {
        let message = self.anthropic_message();
        let envelope = Envelope {
            r#type: "error",
            error: Inner {
                r#type: self.anthropic().r#type,
                message: &message,
            },
            request_id,
        };
        serde_json::to_vec(&envelope).unwrap_or_else(|_| {
            br#"{"type":"error","error":{"type":"api_error","message":"internal error"}}"#.to_vec()
        })
    }

    /// The data of the in-band `error` event of a Messages stream that
    /// already started: the envelope without `request_id` (it is in the
    /// response headers).
    pub fn anthropic_event(&self) -> String {
        let message = self.anthropic_message();
        let event = serde_json::json!({
            "type": "error",
            "error": {"type": self.anthropic().r#type, "message": message},
        });
        event.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{RateLimited, Refusal, Verdict};
    use crate::pool::{PoolError, Shed};

    fn row(e: &ApiError) -> (u16, &'static str) {
        let a = e.anthropic();
        (a.status, a.r#type)
    }

    /// Every status the gateway gives, through the one table.
    #[test]
    fn every_gateway_error_has_its_anthropic_status_and_type() {
        let cases: Vec<(ApiError, u16, &str)> = vec![
            (
                ApiError::invalid_value("max_tokens", "m"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::unknown_parameter("foo"),
                400,
                "invalid_request_error",
            ),
            (ApiError::invalid_api_key(), 401, "authentication_error"),
            (
                ApiError::blocked("budget_exceeded", 2),
                402,
                "billing_error",
            ),
            (ApiError::permission_denied("m"), 403, "permission_error"),
            (
                ApiError::storage_quota_exceeded(1, 2, 3),
                403,
                "permission_error",
            ),
            (ApiError::model_not_found("x"), 404, "not_found_error"),
            (
                ApiError::route_not_found("GET", "/x"),
                404,
                "not_found_error",
            ),
            (
                ApiError::method_not_allowed("GET", "/v1/messages"),
                405,
                "invalid_request_error",
            ),
            (ApiError::request_timeout("m"), 408, "timeout_error"),
            (
                ApiError::idempotency_key_in_use(2),
                409,
                "invalid_request_error",
            ),
            (ApiError::payload_too_large(10), 413, "request_too_large"),
            (
                ApiError::unsupported_media_type(None),
                415,
                "invalid_request_error",
            ),
            (
                ApiError::idempotency_key_reused(),
                422,
                "invalid_request_error",
            ),
            (
                ApiError::from(Refusal::RateLimited(RateLimited {
                    verdict: Verdict::Requests,
                    tokens: 1,
                    limit: 1,
                    retry_after_ms: 1000,
                })),
                429,
                "rate_limit_error",
            ),
            (ApiError::headers_too_large(10), 431, "request_too_large"),
            (ApiError::internal("m"), 500, "api_error"),
            (ApiError::upstream("m"), 502, "api_error"),
            (
                ApiError::from(PoolError::Shed(Shed::Full)),
                529,
                "overloaded_error",
            ),
            (
                ApiError::from(PoolError::AtCapacity),
                529,
                "overloaded_error",
            ),
            (ApiError::store_unavailable("m"), 503, "api_error"),
            (ApiError::replica_shutdown(), 503, "api_error"),
            (ApiError::timeout("m"), 504, "timeout_error"),
        ];
        for (e, status, ty) in cases {
            assert_eq!(row(&e), (status, ty), "{e}");
            let v: serde_json::Value = serde_json::from_slice(&e.anthropic_body("req_1")).unwrap();
            assert_eq!(v["type"], "error", "{e}");
            assert_eq!(v["error"]["type"], ty, "{e}");
            assert_eq!(v["request_id"], "req_1", "{e}");
            assert!(v["error"]["message"].is_string(), "{e}");
        }
    }

    #[test]
    fn the_param_leads_the_message_and_the_event_has_the_same_error() {
        let e = ApiError::invalid_value("max_tokens", "must be at least 1");
        let v: serde_json::Value = serde_json::from_slice(&e.anthropic_body("r")).unwrap();
        assert_eq!(v["error"]["message"], "max_tokens: must be at least 1");
        let ev: serde_json::Value = serde_json::from_str(&e.anthropic_event()).unwrap();
        assert_eq!(ev["type"], "error");
        assert_eq!(ev["error"], v["error"]);
        assert!(ev.get("request_id").is_none());
    }
}
