//! The global count's contract: what a [`LimitStore`] is asked
//! ([`AdmitRequest`], [`Settlement`], renewals) and answers ([`Admission`]),
//! which store holds a reservation ([`Holder`]), and a settlement retried
//! until the store applies it ([`settle_until_applied`]). The stores
//! themselves are [`super::redis_lua`] and [`super::memory`].

use crate::accounts::RatePlan;
use crate::metrics::{LimitDecision, LimitStage};
use crate::usage::TokenUsage;
use async_trait::async_trait;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Length of the sliding windows of "per minute" limits.
pub const WINDOW_MS: u64 = 60_000;

/// One admission question to a [`LimitStore`].
#[derive(Debug, Clone)]
pub struct AdmitRequest<'a> {
    pub org: &'a str,
    pub model: &'a str,
    pub request_id: &'a str,
    /// Tokens to reserve (input estimate plus output allowance).
    pub tokens: u64,
    pub plan: RatePlan,
    pub budget_nano: Option<i64>,
    /// A concurrency slot lapses this long after it was last written
    /// (admitted or renewed).
    pub slot_lease_ms: u64,
    /// How often owners renew their slots (a slot written more than two of
    /// these ago has a dead owner, for `retry-after`).
    pub renew_every_ms: u64,
    /// A request admitted on another replica and taken over here (a
    /// background run handed over on a drain): recorded (its tokens, its
    /// slot) but never refused, and not counted again in the request window.
    pub taken_over: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Admitted,
    Requests,
    Tokens,
    Concurrency,
    OverBudget,
}

impl Verdict {
    /// What the metrics call it.
    pub(super) fn decision(self) -> LimitDecision {
        match self {
            Verdict::Admitted => LimitDecision::Admitted,
            Verdict::Requests => LimitDecision::Requests,
            Verdict::Tokens => LimitDecision::Tokens,
            Verdict::Concurrency => LimitDecision::Concurrency,
            Verdict::OverBudget => LimitDecision::Budget,
        }
    }
}

/// A store's answer: the verdict and the window state after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    pub verdict: Verdict,
    pub used_requests: u64,
    pub used_tokens: u64,
    /// Time until the request window is back to its full allowance.
    pub reset_requests_ms: u64,
    pub reset_tokens_ms: u64,
    /// On refusal: when a retry can succeed (as far as the store can tell).
    pub retry_after_ms: u64,
}

impl Admission {
    /// Admitted with no window state: an unlimited plan without a budget
    /// (no store asked), or a store that cannot keep state.
    pub(super) fn unlimited() -> Self {
        Self {
            verdict: Verdict::Admitted,
            used_requests: 0,
            used_tokens: 0,
            reset_requests_ms: 0,
            reset_tokens_ms: 0,
            retry_after_ms: 0,
        }
    }
}

/// The end of an admitted request, for [`LimitStore::settle`].
#[derive(Debug, Clone)]
pub struct Settlement<'a> {
    pub org: &'a str,
    pub model: &'a str,
    pub key_id: &'a str,
    pub request_id: &'a str,
    /// Tokens reserved in the token window (0 = tokens not limited).
    pub reserved_tokens: u64,
    /// Tokens to count in the window instead.
    pub actual_tokens: u64,
    /// Usage to add to the day's counters (`None`: nothing ran).
    pub usage: Option<TokenUsage>,
    /// Whether its usage counts a request: not for the rest of a request
    /// another replica already billed (a run continued after a hand-over).
    pub counts_request: bool,
    pub cost_nano: i64,
    /// UTC day of the usage counters, `YYYY-MM-DD`.
    pub day: &'a str,
}

/// The global count of admissions: Redis, or in-process for the embedded mode.
#[async_trait]
pub trait LimitStore: Send + Sync {
    async fn admit(&self, req: &AdmitRequest<'_>) -> anyhow::Result<Admission>;
    /// Returns once the settlement is applied (it may share a round trip
    /// with others).
    async fn settle(&self, s: &Settlement<'_>) -> anyhow::Result<()>;
    /// Waits until every settlement handed over so far has been applied.
    async fn flush(&self) {}
    /// Extends the concurrency slots of these requests of `org` and
    /// `model` to `lease_ms` from now (the store's clock). A slot already
    /// settled or lapsed stays gone.
    async fn renew(
        &self,
        org: &str,
        model: &str,
        request_ids: &[String],
        lease_ms: u64,
    ) -> anyhow::Result<()>;
}

/// Which store holds a reservation (settle goes back to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Holder {
    Global,
    Memory,
}

impl Holder {
    pub(super) fn stage(self) -> LimitStage {
        match self {
            Holder::Global => LimitStage::Global,
            Holder::Memory => LimitStage::Memory,
        }
    }
}

/// A [`Settlement`] that owns its strings, for a retry that outlives the
/// request.
pub(super) struct OwnedSettlement {
    pub(super) org: String,
    pub(super) model: String,
    pub(super) key_id: String,
    pub(super) request_id: String,
    pub(super) reserved_tokens: u64,
    pub(super) actual_tokens: u64,
    pub(super) usage: Option<TokenUsage>,
    pub(super) counts_request: bool,
    pub(super) cost_nano: i64,
    pub(super) day: String,
}

impl OwnedSettlement {
    pub(super) fn of(s: &Settlement<'_>) -> Self {
        Self {
            org: s.org.to_owned(),
            model: s.model.to_owned(),
            key_id: s.key_id.to_owned(),
            request_id: s.request_id.to_owned(),
            reserved_tokens: s.reserved_tokens,
            actual_tokens: s.actual_tokens,
            usage: s.usage,
            counts_request: s.counts_request,
            cost_nano: s.cost_nano,
            day: s.day.to_owned(),
        }
    }

    fn borrow(&self) -> Settlement<'_> {
        Settlement {
            org: &self.org,
            model: &self.model,
            key_id: &self.key_id,
            request_id: &self.request_id,
            reserved_tokens: self.reserved_tokens,
            actual_tokens: self.actual_tokens,
            usage: self.usage,
            counts_request: self.counts_request,
            cost_nano: self.cost_nano,
            day: &self.day,
        }
    }
}

/// How long a failed settlement is retried: less than the window its
/// settled marker lives, so a late retry can never apply twice.
const SETTLE_RETRY_FOR: Duration = Duration::from_secs(50);

/// Retries a settlement with backoff until the store applies it (or
/// confirms an earlier attempt already did).
pub(super) async fn settle_until_applied(store: Arc<dyn LimitStore>, s: OwnedSettlement) {
    let give_up = Instant::now() + SETTLE_RETRY_FOR;
    let mut backoff = Duration::from_millis(100);
    loop {
        tokio::time::sleep(backoff).await;
        match store.settle(&s.borrow()).await {
            Ok(()) => return,
            Err(e) if Instant::now() + backoff < give_up => {
                tracing::debug!(request_id = %s.request_id, "settlement retry failed: {e:#}");
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                // The slot lapses unrenewed and the window expires the tokens.
                tracing::warn!(request_id = %s.request_id, "gave up settling limits: {e:#}");
                return;
            }
        }
    }
}
