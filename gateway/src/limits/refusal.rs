//! Why the limiter refused a request ([`Refusal`]), the refusal with the
//! window state it was decided under ([`Refused`]), what a client is told
//! of a rate limit ([`RateLimited`]), and the local stage's refusal before
//! any store was asked ([`LocalRefusal`]).

use super::headers::rate_limit_headers;
use super::store::{Admission, Verdict};
use crate::accounts::RatePlan;
use std::time::Duration;

/// A request admission refused: why, and the plan's windows as the
/// decision saw them (none when no store answered).
#[derive(Debug)]
pub struct Refused {
    pub refusal: Refusal,
    plan: RatePlan,
    window: Option<Admission>,
}

impl Refused {
    pub(super) fn new(refusal: Refusal, plan: RatePlan, window: Option<Admission>) -> Self {
        Self {
            refusal,
            plan,
            window,
        }
    }

    /// The `x-ratelimit-*` (and `retry-after-ms`) headers of the refusal,
    /// for a caller that answers over HTTP.
    pub fn rate_headers(&self) -> Vec<(&'static str, String)> {
        self.window
            .map(|w| rate_limit_headers(&self.plan, &w))
            .unwrap_or_default()
    }
}

/// Why the limiter refused a request. The HTTP layer maps it to the
/// spec's envelope (`error/map.rs`): 429, 402 or 503.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A rate limit of the plan is reached.
    RateLimited(RateLimited),
    /// The organisation's budget is spent.
    OverBudget,
    /// The global count did not answer and the policy is `fail_closed`.
    StoreUnavailable,
}

/// A refusal by a rate limit: which one, and when to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    /// `Requests`, `Tokens` or `Concurrency`.
    pub verdict: Verdict,
    /// What this request reserves (input estimate plus output allowance).
    pub tokens: u64,
    /// The plan's limit that refused it, in the verdict's unit.
    pub limit: u64,
    pub retry_after_ms: u64,
}

impl RateLimited {
    pub(super) fn new(verdict: Verdict, tokens: u64, plan: &RatePlan, retry_after_ms: u64) -> Self {
        let limit = match verdict {
            Verdict::Requests => u64::from(plan.rpm),
            Verdict::Tokens => plan.tpm,
            _ => u64::from(plan.max_concurrent),
        };
        Self {
            verdict,
            tokens,
            limit,
            retry_after_ms,
        }
    }

    /// `retry-after` in whole seconds, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000).max(1)
    }
}

impl std::fmt::Display for RateLimited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (tokens, limit, secs) = (self.tokens, self.limit, self.retry_after_secs());
        match self.verdict {
            Verdict::Requests => write!(
                f,
                "Rate limit reached: {limit} requests per minute. Retry after {secs}s."
            ),
            Verdict::Tokens if tokens > limit => write!(
                f,
                "Request too large: it needs {tokens} tokens (input estimate plus max_tokens), the limit is {limit} tokens per minute. Lower max_tokens or shorten the input."
            ),
            Verdict::Tokens => write!(
                f,
                "Rate limit reached: {limit} tokens per minute; this request reserves {tokens}. Retry after {secs}s."
            ),
            _ => write!(
                f,
                "Too many concurrent requests: the limit is {limit}. Retry when one finishes."
            ),
        }
    }
}

/// A refusal that happened before any store was asked.
#[derive(Debug)]
pub(crate) struct LocalRefusal {
    pub verdict: Verdict,
    pub retry_after: Duration,
}

impl LocalRefusal {
    pub(super) fn snapshot(&self, plan: &RatePlan) -> Admission {
        let ms = self.retry_after.as_millis() as u64;
        Admission {
            verdict: self.verdict,
            used_requests: if self.verdict == Verdict::Requests {
                plan.rpm.into()
            } else {
                0
            },
            used_tokens: if self.verdict == Verdict::Tokens {
                plan.tpm
            } else {
                0
            },
            reset_requests_ms: ms,
            reset_tokens_ms: ms,
            retry_after_ms: ms,
        }
    }

    pub(super) fn into_refusal(self, tokens: u64, plan: &RatePlan) -> Refusal {
        Refusal::RateLimited(RateLimited::new(
            self.verdict,
            tokens,
            plan,
            self.retry_after.as_millis() as u64,
        ))
    }
}
