//! The one map from each layer's error to the spec's status table (section
//! 7). The layers below (the store, the limiter, accounts, the pool,
//! idempotency records, the planner's sessions) return their own error
//! types and know nothing of statuses; their failures get one here and
//! nowhere else. A store outage is one answer whichever layer noticed it:
//! 503 `store_unavailable` with `retry-after: 1`
//! ([`ApiError::store_unavailable`]).
//!
//! The conversions are `From` impls, so a `?` applies them wherever an
//! [`ApiError`] is built: in the routes and in the generation driver.

use super::{ApiError, BLOCKED_EV, OVER_BUDGET_EV};
use crate::accounts::AccountError;
use crate::idempotency::IdempotencyError;
use crate::limits::{Refusal, Refused, TooManyConnections};
use crate::pool::{PoolError, Shed};
use crate::store::StoreError;
use planner::SessionError;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable { .. } => ApiError::store_unavailable(
                "The response store is briefly unavailable; retry shortly.",
            ),
            StoreError::Corrupt { what } => {
                ApiError::internal(format!("A stored response could not be read ({what})."))
            }
            StoreError::Encode => ApiError::internal("could not encode a stored response"),
            StoreError::QuotaExceeded { used, needed, cap } => {
                ApiError::storage_quota_exceeded(used, needed, cap)
            }
        }
    }
}

/// The idempotency records: an outage is every store outage's 503, so a
/// create with a key is refused rather than run unprotected.
impl From<IdempotencyError> for ApiError {
    fn from(e: IdempotencyError) -> Self {
        match e {
            IdempotencyError::Unavailable { .. } => ApiError::store_unavailable(
                "The idempotency store is briefly unavailable; retry shortly with the same 'Idempotency-Key'.",
            ),
            IdempotencyError::Corrupt => {
                ApiError::internal("An idempotency record could not be read.")
            }
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::RateLimited(limited) => {
                ApiError::rate_limited(limited.to_string(), limited.retry_after_secs())
            }
            Refusal::OverBudget => ApiError::blocked("budget_exceeded", OVER_BUDGET_EV),
            Refusal::StoreUnavailable => ApiError::store_unavailable(
                "Rate limiting is temporarily unavailable. Retry shortly.",
            ),
        }
    }
}

impl From<Refused> for ApiError {
    fn from(r: Refused) -> Self {
        r.refusal.into()
    }
}

impl From<AccountError> for ApiError {
    fn from(e: AccountError) -> Self {
        match e {
            AccountError::InvalidKey => ApiError::invalid_api_key(),
            AccountError::Blocked { reason } => ApiError::blocked(reason, BLOCKED_EV),
            AccountError::MissingScope(scope) => ApiError::permission_denied(format!(
                "This API key lacks the '{}' permission required for this request.",
                scope.as_str()
            )),
            AccountError::ModelNotAllowed { model } => ApiError::permission_denied(format!(
                "This API key is not allowed to use the model '{model}'."
            ))
            .with_param("model"),
            AccountError::StoreUnavailable => ApiError::store_unavailable(
                "The account store is temporarily unavailable. Retry shortly.",
            ),
        }
    }
}

impl From<TooManyConnections> for ApiError {
    fn from(e: TooManyConnections) -> Self {
        ApiError::too_many_connections(e.limit)
    }
}

impl From<PoolError> for ApiError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::ContextLengthExceeded { message } => {
                ApiError::new(400, "context_length_exceeded", message).with_param("messages")
            }
            PoolError::InvalidRequest { message } => ApiError::invalid_value("messages", message),
            PoolError::AtCapacity => {
                ApiError::overloaded("The model is at capacity; retry shortly.")
            }
            PoolError::Draining => ApiError::overloaded("The worker is restarting; retry shortly."),
            PoolError::Unreachable => {
                ApiError::overloaded("The model's workers are unreachable; retry shortly.")
            }
            PoolError::WorkerTimeout => ApiError::timeout("The worker did not answer in time."),
            PoolError::WorkerFailed => {
                ApiError::upstream("The model worker failed; retry with backoff.")
            }
            PoolError::NoWorkerAvailable { model } => ApiError::overloaded(format!(
                "No worker of model '{model}' is available right now; retry shortly."
            )),
            PoolError::Shed(Shed::Full) => ApiError::overloaded(
                "The model is at capacity and its queue is full; retry shortly.",
            ),
            PoolError::Shed(Shed::Timeout) => ApiError::overloaded(
                "The model is at capacity: the request waited its longest in the queue; retry shortly.",
            ),
            PoolError::Shed(Shed::Draining) => ApiError::replica_shutdown().with_message(
                "The gateway replica holding this request is restarting and had not started it; \
                 retry the request (another replica will serve it).",
            ),
        }
    }
}

/// The planner's session store: busy, a tool result nothing waits for, or
/// the store down (503 `store_unavailable`, like every store outage).
impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Store(_) => {
                tracing::warn!("planner session store: {e}");
                ApiError::store_unavailable(
                    "The planner's session store is unavailable; retry shortly.",
                )
            }
            SessionError::Busy { retry_after } => ApiError::conflict(
                "session_busy",
                "Another request is using this session ('x-session-id'); retry when it has finished.",
            )
            .with_retry_after(retry_after.as_secs().clamp(1, 60)),
            SessionError::NotPending { index, call_id } => ApiError::invalid_value(
                format!("messages.{index}.tool_call_id"),
                format!(
                    "No paused plan of this session waits for a tool call with id '{call_id}'."
                ),
            ),
            SessionError::Vanished => ApiError::internal("the paused plan disappeared"),
            SessionError::Encode(e) => ApiError::internal(format!("plan state: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::Scope;
    use crate::limits::{RateLimited, Verdict};

    #[test]
    fn a_store_outage_is_one_retryable_503_whichever_layer_noticed() {
        let outages = [
            ApiError::from(StoreError::Unavailable { op: "read" }),
            ApiError::from(Refusal::StoreUnavailable),
            ApiError::from(AccountError::StoreUnavailable),
            ApiError::from(IdempotencyError::Unavailable { op: "claim" }),
        ];
        for e in outages {
            assert_eq!((e.status, &*e.code), (503, "store_unavailable"), "{e}");
            assert_eq!(e.retry_after_secs, Some(1), "{e}");
        }
        let e = ApiError::from(StoreError::Corrupt { what: "object" });
        assert_eq!(e.status, 500);
        let e = ApiError::from(StoreError::QuotaExceeded {
            used: 900,
            needed: 200,
            cap: 1000,
        });
        assert_eq!((e.status, &*e.code), (403, "storage_quota_exceeded"));
        assert_eq!(e.param.as_deref(), Some("store"));
        assert!(!e.retryable());
    }

    #[test]
    fn over_budget_is_the_unwrapped_402() {
        let e = ApiError::from(Refusal::OverBudget);
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(e.status, 402);
        assert_eq!(v["ev"], OVER_BUDGET_EV);
        assert_eq!(v["data"]["reason"], "budget_exceeded");
    }

    #[test]
    fn a_rate_limit_is_a_429_with_whole_seconds_to_wait() {
        let e = ApiError::from(Refusal::RateLimited(RateLimited {
            verdict: Verdict::Requests,
            tokens: 10,
            limit: 3,
            retry_after_ms: 1_200,
        }));
        assert_eq!((e.status, &*e.code), (429, "rate_limit_exceeded"));
        assert_eq!(e.retry_after_secs, Some(2));
        assert!(e.message.contains("3 requests per minute"), "{}", e.message);
    }

    #[test]
    fn account_refusals_are_401_402_403() {
        let e = ApiError::from(AccountError::InvalidKey);
        assert_eq!((e.status, &*e.code), (401, "invalid_api_key"));
        let e = ApiError::from(AccountError::MissingScope(Scope::ResponsesWrite));
        assert_eq!(
            (e.status, e.code.as_ref(), e.error_type()),
            (403, "permission_denied", "permission_error")
        );
        let e = ApiError::from(AccountError::ModelNotAllowed {
            model: "base-ultra".into(),
        });
        assert_eq!((e.status, e.param.as_deref()), (403, Some("model")));
        let e = ApiError::from(AccountError::Blocked {
            reason: "payment_overdue".into(),
        });
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(e.status, 402);
        assert!(v.get("error").is_none());
        assert_eq!(v["code"], 402);
        assert_eq!(v["ev"], BLOCKED_EV);
        assert_eq!(v["data"]["reason"], "payment_overdue");
    }

    #[test]
    fn pool_failures_keep_their_statuses() {
        let e = ApiError::from(PoolError::ContextLengthExceeded {
            message: "too long".into(),
        });
        assert_eq!(
            (e.status, e.code.as_ref(), e.param.as_deref()),
            (400, "context_length_exceeded", Some("messages"))
        );
        for (error, status) in [
            (PoolError::AtCapacity, 503),
            (PoolError::Draining, 503),
            (PoolError::Unreachable, 503),
            (
                PoolError::NoWorkerAvailable {
                    model: "base".into(),
                },
                503,
            ),
            (PoolError::WorkerTimeout, 504),
            (PoolError::WorkerFailed, 502),
        ] {
            let e = ApiError::from(error);
            assert_eq!(e.status, status, "{e}");
            if status == 503 {
                assert_eq!(e.code, "server_overloaded", "{e}");
            }
        }
    }
}
