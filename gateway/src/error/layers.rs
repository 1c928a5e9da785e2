//! The errors of the layers below HTTP, mapped to the spec's envelope. The
//! store and the limiter know nothing of statuses; this is where their
//! failures get one.

use super::{ApiError, OVER_BUDGET_EV};
use crate::limits::Refusal;
use crate::store::StoreError;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable { .. } => ApiError::new(
                503,
                "store_unavailable",
                "The response store is briefly unavailable; retry shortly.",
            )
            .with_retry_after(1),
            StoreError::Corrupt { what } => {
                ApiError::internal(format!("A stored response could not be read ({what})."))
            }
            StoreError::Encode => ApiError::internal("could not encode a stored response"),
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
            Refusal::StoreUnavailable => ApiError::new(
                503,
                "service_unavailable",
                "Rate limiting is temporarily unavailable. Retry shortly.",
            )
            .with_retry_after(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{RateLimited, Verdict};

    #[test]
    fn a_store_outage_is_a_retryable_503() {
        let e = ApiError::from(StoreError::Unavailable { op: "read" });
        assert_eq!((e.status, &*e.code), (503, "store_unavailable"));
        assert_eq!(e.retry_after_secs, Some(1));
        let e = ApiError::from(StoreError::Corrupt { what: "object" });
        assert_eq!(e.status, 500);
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
        let e = ApiError::from(Refusal::StoreUnavailable);
        assert_eq!((e.status, &*e.code), (503, "service_unavailable"));
    }
}
