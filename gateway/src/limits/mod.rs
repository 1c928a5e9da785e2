//! Plan limits per organisation and model: requests per minute, tokens per
//! minute (input plus output) and concurrent requests.
//!
//! Two stages:
//! 1. [`local`]: what this process already knows: the request window's
//!    reset from the global stage's last refusal, and an in-flight counter
//!    sized at the plan's full allowance; so it never refuses what the
//!    global stage would admit (one replica may legitimately take
//!    everything), and its refusals carry the global stage's reset.
//! 2. The global truth, a [`LimitStore`]: atomic Lua scripts in Redis
//!    ([`redis_lua`]), one round trip to admit and one to settle, exact
//!    across replicas; or, without Redis, the in-process [`memory`] store
//!    with the same semantics.
//!
//! Tokens are reserved on admission (input estimate plus `max_tokens`, or
//! the plan's default) and settled to real usage when the request ends. The
//! [`Reservation`] guard settles on drop, so a request abandoned anywhere
//! (client gone, task dropped) cannot leak its reservation or its
//! concurrency slot. A slot is also a lease its replica renews while the
//! request runs ([`slots`]): a replica that dies frees its slots within
//! one lease.
//!
//! When Redis cannot be reached, `limits.on_store_failure` decides:
//! `fail_open_local` (default) admits under this replica's in-process
//! limits; `fail_closed` answers 503.

pub mod headers;
pub mod local;
pub mod memory;
pub mod redis_lua;
pub mod slots;

use crate::accounts::Account;
use crate::catalog::ModelSpec;
use crate::config::{Config, OnStoreFailure};
use crate::metrics::{LimitDecision, LimitStage};
use crate::redis::RedisHandle;
use async_trait::async_trait;
use inference_proto::v1 as pb;
use local::{LocalEntry, LocalStage};
use slots::{LiveSlots, SlotLease};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Length of the sliding windows of "per minute" limits.
pub const WINDOW_MS: u64 = 60_000;

pub use crate::accounts::RatePlan;

/// Output tokens reserved when neither the request nor the plan says.
pub const FALLBACK_MAX_TOKENS: u32 = 4096;

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
    fn decision(self) -> LimitDecision {
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
    fn unlimited() -> Self {
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

pub use crate::usage::TokenUsage;

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

/// The admission gate the request path calls.
pub struct Limiter {
    local: LocalStage,
    /// Redis, when configured.
    global: Option<Arc<dyn LimitStore>>,
    /// The embedded store, and the fail-open fallback when Redis is down.
    memory: Arc<memory::MemoryLimits>,
    policy: OnStoreFailure,
    slots: SlotLease,
    /// Slots of this replica's live reservations, renewed by [`Self::maintain`].
    live: LiveSlots,
    /// While now < this (ms since `epoch`), Redis is considered down and not
    /// asked (so an outage costs one timeout per second, not per request).
    global_down_until: AtomicU64,
    epoch: Instant,
}

/// How long Redis is left alone after a failure.
const GLOBAL_RETRY_MS: u64 = 1000;

/// Request ids renewed in one call (bounds one command's size).
const MAX_RENEW_IDS: usize = 500;

/// Which store holds a reservation (settle goes back to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    Global,
    Memory,
}

impl Limiter {
    pub fn from_config(config: &Config, redis: Option<Arc<RedisHandle>>) -> Self {
        Self::new(
            redis.map(|r| Arc::new(redis_lua::RedisLimits::new(r)) as Arc<dyn LimitStore>),
            config.limits.on_store_failure,
            SlotLease::from_config(config),
        )
    }

    pub fn new(
        global: Option<Arc<dyn LimitStore>>,
        policy: OnStoreFailure,
        slots: SlotLease,
    ) -> Self {
        Self {
            local: LocalStage::default(),
            global,
            memory: Arc::new(memory::MemoryLimits::default()),
            policy,
            slots,
            live: LiveSlots::default(),
            global_down_until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Admits a request of `account` to `model` or refuses it: 429
    /// `rate_limit_exceeded` (with `retry-after`), 402 over budget, or 503
    /// when Redis is down under `fail_closed`. Returns the `x-ratelimit-*`
    /// headers either way, for every later response to carry.
    /// `input_estimate` is the prompt's token estimate
    /// ([`estimate_input_tokens`]); `max_tokens` 0 means the request set none.
    pub async fn admit_request(
        self: &Arc<Self>,
        account: &Arc<Account>,
        model: &'static ModelSpec,
        request_id: String,
        input_estimate: u64,
        max_tokens: u32,
    ) -> (Result<Reservation, Refusal>, Vec<(&'static str, String)>) {
        let plan = account.plan;
        let output_allowance = match (max_tokens, plan.default_max_tokens) {
            (0, 0) => FALLBACK_MAX_TOKENS,
            (0, d) => d,
            (m, _) => m,
        };
        let tokens = input_estimate + u64::from(output_allowance);
        let org = &account.principal.org;

        // Stage 1: this process.
        let local = self.local.entry(org, model.id, &plan);
        if let Err(refusal) = local.check(&plan, self.now_ms()) {
            count_decision(model, LimitStage::Local, refusal.verdict);
            let headers = headers::rate_limit_headers(&plan, &refusal.snapshot(&plan));
            return (Err(refusal.into_refusal(tokens, &plan)), headers);
        }

        // Stage 2: the global count (nothing to count for an unlimited plan
        // without a budget: no round trip).
        let req = AdmitRequest {
            org,
            model: model.id,
            request_id: &request_id,
            tokens,
            plan,
            budget_nano: account.org.budget_nano,
            slot_lease_ms: self.slots.lease_ms(),
            renew_every_ms: self.slots.renew_every_ms(),
        };
        let asked = if plan.is_unlimited() && req.budget_nano.is_none() {
            let holder = if self.global.is_some() {
                Holder::Global
            } else {
                Holder::Memory
            };
            Ok((Admission::unlimited(), holder))
        } else {
            self.ask_store(&req).await
        };
        let (admission, holder) = match asked {
            Ok(a) => a,
            Err(e) => {
                local.release();
                return (Err(e), Vec::new());
            }
        };
        count_decision(model, holder.stage(), admission.verdict);
        if admission.verdict == Verdict::Requests {
            local.requests_full_for(self.now_ms(), admission.retry_after_ms);
        }
        let headers = headers::rate_limit_headers(&plan, &admission);
        let result = match admission.verdict {
            Verdict::Admitted => Ok(Reservation {
                limiter: self.clone(),
                account: account.clone(),
                model,
                // Only a plan with a concurrency limit takes a slot.
                slot: (plan.max_concurrent > 0).then(|| {
                    self.live.hold(
                        org,
                        model.id,
                        &request_id,
                        holder,
                        Instant::now() + self.slots.max_hold,
                    )
                }),
                request_id,
                input_estimate,
                reserved_tokens: if plan.tpm > 0 { tokens } else { 0 },
                holder,
                local,
                output_seen: 0,
                started: false,
                done: false,
            }),
            verdict => {
                local.release();
                Err(match verdict {
                    Verdict::OverBudget => Refusal::OverBudget,
                    _ => Refusal::RateLimited(RateLimited::new(
                        verdict,
                        tokens,
                        &plan,
                        admission.retry_after_ms,
                    )),
                })
            }
        };
        (result, headers)
    }

    /// The global stage did not answer, so the request runs on this
    /// replica's limits; but Redis may still have applied the admission
    /// (a reply lost in a stall). A settlement of nothing, retried until it
    /// lands, frees whatever slot and tokens it may hold there.
    fn release_lost_admission(global: &Arc<dyn LimitStore>, req: &AdmitRequest<'_>) {
        let release = OwnedSettlement {
            org: req.org.to_owned(),
            model: req.model.to_owned(),
            // No usage is recorded, so no key is named.
            key_id: String::new(),
            request_id: req.request_id.to_owned(),
            reserved_tokens: if req.plan.tpm > 0 { req.tokens } else { 0 },
            actual_tokens: 0,
            usage: None,
            cost_nano: 0,
            day: crate::usage::utc_today().to_string(),
        };
        tokio::spawn(settle_until_applied(global.clone(), release));
    }

    async fn ask_store(&self, req: &AdmitRequest<'_>) -> Result<(Admission, Holder), Refusal> {
        let Some(global) = &self.global else {
            return Ok((self.memory.admit_now(req), Holder::Memory));
        };
        if self.now_ms() >= self.global_down_until.load(Ordering::Relaxed) {
            match global.admit(req).await {
                Ok(a) => return Ok((a, Holder::Global)),
                Err(e) => {
                    tracing::warn!("limiter store unreachable: {e:#}");
                    Self::release_lost_admission(global, req);
                    self.global_down_until
                        .store(self.now_ms() + GLOBAL_RETRY_MS, Ordering::Relaxed);
                }
            }
        }
        match self.policy {
            OnStoreFailure::FailOpenLocal => Ok((self.memory.admit_now(req), Holder::Memory)),
            OnStoreFailure::FailClosed => Err(Refusal::StoreUnavailable),
        }
    }

    /// Waits until queued settlements have reached the store.
    pub async fn flush(&self) {
        if let Some(g) = &self.global {
            g.flush().await;
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The slot heartbeat, until the process ends: renews the concurrency
    /// slots of this replica's live reservations every renewal period.
    pub async fn maintain(&self) {
        let mut every = tokio::time::interval(self.slots.renew_every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            self.renew_slots().await;
        }
    }

    /// One heartbeat: one renewal per in-flight set (org and model), all
    /// sent at once, so they share the pipe's writes (on a cluster each
    /// goes to its org's node). A renewal that fails is tried again on the
    /// next beat; a slot whose renewals fail for a whole lease lapses.
    pub async fn renew_slots(&self) {
        let groups = self.live.due(Instant::now());
        if groups.is_empty() {
            return;
        }
        let lease_ms = self.slots.lease_ms();
        let calls = groups.iter().flat_map(|g| {
            let store: &dyn LimitStore = match (g.holder, &self.global) {
                (Holder::Global, Some(global)) => global.as_ref(),
                _ => self.memory.as_ref(),
            };
            g.request_ids
                .chunks(MAX_RENEW_IDS)
                .map(move |ids| store.renew(&g.org, g.model, ids, lease_ms))
        });
        // A renewal later than a lease is of no use; do not let one hold
        // up the next beat longer than that.
        let results =
            tokio::time::timeout(self.slots.lease, futures::future::join_all(calls)).await;
        let failed = match &results {
            Ok(results) => results.iter().filter(|r| r.is_err()).count(),
            Err(_) => groups.len(),
        };
        if failed > 0 {
            let first = results
                .ok()
                .and_then(|r| r.into_iter().find_map(Result::err))
                .map(|e| format!("{e:#}"))
                .unwrap_or_else(|| "timed out".into());
            tracing::warn!(
                sets = groups.len(),
                failed,
                "renewing concurrency slots failed: {first}"
            );
        }
    }

    async fn settle(&self, s: &Settlement<'_>, holder: Holder) {
        let result = match (holder, &self.global) {
            (Holder::Global, Some(g)) => match g.settle(s).await {
                Ok(()) => Ok(()),
                Err(e) => {
                    // Settling is idempotent: retry until it lands, so a
                    // store blip leaves no slot or tokens held.
                    tracing::warn!(
                        request_id = s.request_id,
                        "settling limits failed, retrying in the background: {e:#}"
                    );
                    tokio::spawn(settle_until_applied(g.clone(), OwnedSettlement::of(s)));
                    Ok(())
                }
            },
            _ => self.memory.settle(s).await,
        };
        if let Err(e) = result {
            // The slot lapses unrenewed and the window expires the tokens.
            tracing::warn!(request_id = s.request_id, "settling limits failed: {e:#}");
        }
    }
}

/// A [`Settlement`] that owns its strings, for a retry that outlives the
/// request.
struct OwnedSettlement {
    org: String,
    model: String,
    key_id: String,
    request_id: String,
    reserved_tokens: u64,
    actual_tokens: u64,
    usage: Option<TokenUsage>,
    cost_nano: i64,
    day: String,
}

impl OwnedSettlement {
    fn of(s: &Settlement<'_>) -> Self {
        Self {
            org: s.org.to_owned(),
            model: s.model.to_owned(),
            key_id: s.key_id.to_owned(),
            request_id: s.request_id.to_owned(),
            reserved_tokens: s.reserved_tokens,
            actual_tokens: s.actual_tokens,
            usage: s.usage,
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
async fn settle_until_applied(store: Arc<dyn LimitStore>, s: OwnedSettlement) {
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

impl Holder {
    fn stage(self) -> LimitStage {
        match self {
            Holder::Global => LimitStage::Global,
            Holder::Memory => LimitStage::Memory,
        }
    }
}

fn count_decision(model: &ModelSpec, stage: LimitStage, verdict: Verdict) {
    if let Some(series) = crate::metrics::model_series(model.id) {
        series.limiter_decision(stage, verdict.decision()).inc();
    }
}

/// Why the limiter refused a request. The HTTP layer maps it to the
/// spec's envelope (`edge.rs`): 429, 402 or 503.
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
    fn new(verdict: Verdict, tokens: u64, plan: &RatePlan, retry_after_ms: u64) -> Self {
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

/// How an admitted request ended, for settling.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The worker finished and reported usage.
    Finished(&'a pb::Usage),
    /// Nothing ran on a worker (no capacity, rejected before generating):
    /// the reservation is released and nothing is billed.
    NotRun,
    /// The client went away or the worker failed mid-way: billed as the
    /// input estimate plus the output relayed so far.
    Abandoned,
}

/// An admitted request's hold on its limits. Settle it with
/// [`Reservation::settle`]; dropping it unsettled settles in the
/// background, billing the input estimate plus the output seen so far if
/// the generation had started ([`Reservation::mark_started`]).
pub struct Reservation {
    limiter: Arc<Limiter>,
    account: Arc<Account>,
    model: &'static ModelSpec,
    request_id: String,
    input_estimate: u64,
    reserved_tokens: u64,
    holder: Holder,
    local: Arc<LocalEntry>,
    /// This request's concurrency slot in the renewal heartbeat.
    slot: Option<u64>,
    output_seen: u64,
    started: bool,
    done: bool,
}

impl Reservation {
    /// The account the request was admitted for.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The prompt tokens it was admitted with (an estimate from the body).
    pub fn input_estimate(&self) -> u64 {
        self.input_estimate
    }

    /// The generation reached a worker (an abandoned request is then billed).
    pub fn mark_started(&mut self) {
        self.started = true;
    }

    /// Counts output relayed to the client, billed if the request is
    /// abandoned before the worker reports usage.
    pub fn observe_output(&mut self, tokens: u64) {
        self.output_seen += tokens;
    }

    /// Settles now: releases the concurrency slot, corrects the token
    /// window to real usage, and records usage (per model and per account)
    /// and cost. The one place a finished generation is accounted.
    pub async fn settle(mut self, outcome: Outcome<'_>) {
        self.done = true;
        let usage = match outcome {
            Outcome::Finished(u) => {
                let usage = TokenUsage::from_worker(u);
                crate::usage::record(self.model, &usage);
                Some(usage)
            }
            Outcome::NotRun => None,
            Outcome::Abandoned => {
                self.started = true;
                self.abandoned_usage()
            }
        };
        self.settle_with(usage).await;
    }

    fn abandoned_usage(&self) -> Option<TokenUsage> {
        self.started.then_some(TokenUsage {
            input: self.input_estimate,
            cached_input: 0,
            output: self.output_seen,
            reasoning: 0,
        })
    }

    /// Stops renewing the slot and frees the local count.
    fn release_here(&self) {
        self.local.release();
        if let Some(token) = self.slot {
            self.limiter.live.release(token);
        }
    }

    async fn settle_with(&self, usage: Option<TokenUsage>) {
        self.release_here();
        let cost_nano = usage.map(|u| cost_nano(self.model, &u)).unwrap_or(0);
        if let Some(u) = &usage {
            crate::usage::record_account(
                self.model,
                &self.account.principal,
                &self.account.series,
                u,
                cost_nano,
            );
        }
        let day = crate::usage::utc_today();
        let settlement = Settlement {
            org: &self.account.principal.org,
            model: self.model.id,
            key_id: &self.account.principal.key_id,
            request_id: &self.request_id,
            reserved_tokens: self.reserved_tokens,
            actual_tokens: usage.map(|u| u.total()).unwrap_or(0),
            usage,
            cost_nano,
            day: &day,
        };
        self.limiter.settle(&settlement, self.holder).await;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let usage = self.abandoned_usage();
        let this = Reservation {
            limiter: self.limiter.clone(),
            account: self.account.clone(),
            model: self.model,
            request_id: std::mem::take(&mut self.request_id),
            input_estimate: self.input_estimate,
            reserved_tokens: self.reserved_tokens,
            holder: self.holder,
            local: self.local.clone(),
            slot: self.slot,
            output_seen: self.output_seen,
            started: self.started,
            done: true,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move { this.settle_with(usage).await });
            }
            // No runtime (process teardown): release locally; the global
            // slot lapses unrenewed within a lease.
            Err(_) => this.release_here(),
        }
    }
}

/// Cost in nano-dollars (exact: every price is a whole number of
/// nano-dollars per token). Cached input at the cached rate, the rest of
/// the input at the input rate, output (reasoning included) at the output rate.
pub fn cost_nano(model: &ModelSpec, u: &TokenUsage) -> i64 {
    let nano = |usd_per_million: f64| (usd_per_million * 1000.0).round() as i64;
    let fresh = u.input.saturating_sub(u.cached_input) as i64;
    fresh * nano(model.price.input)
        + u.cached_input as i64 * nano(model.price.cached_input)
        + u.output as i64 * nano(model.price.output)
}

/// A cheap upper-side estimate of a prompt's tokens from its JSON body:
/// about four bytes per token. Settling corrects it to the real count.
pub fn estimate_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(4).max(1)
}

/// A refusal that happened before any store was asked.
#[derive(Debug)]
pub(crate) struct LocalRefusal {
    pub verdict: Verdict,
    pub retry_after: Duration,
}

impl LocalRefusal {
    fn snapshot(&self, plan: &RatePlan) -> Admission {
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

    fn into_refusal(self, tokens: u64, plan: &RatePlan) -> Refusal {
        Refusal::RateLimited(RateLimited::new(
            self.verdict,
            tokens,
            plan,
            self.retry_after.as_millis() as u64,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;

    #[test]
    fn cost_in_nano_dollars_matches_the_price_table() {
        let base = crate::catalog::Catalog::default().find("base").unwrap();
        let u = TokenUsage {
            input: 1_000_000,
            cached_input: 400_000,
            output: 200_000,
            reasoning: 50_000,
        };
        // 600k * 0.50 + 400k * 0.05 + 200k (reasoning included) * 1.90 = 0.70 USD
        assert_eq!(cost_nano(base, &u), 700_000_000);
        let mini = crate::catalog::Catalog::default()
            .find("base-mini")
            .unwrap();
        let one_each = TokenUsage {
            input: 2,
            cached_input: 1,
            output: 1,
            reasoning: 0,
        };
        assert_eq!(cost_nano(mini, &one_each), 180 + 18 + 450);
    }

    fn account(plan: RatePlan) -> Arc<Account> {
        Arc::new(Account {
            principal: crate::auth::Principal {
                org: "org-drop".into(),
                key_name: "k".into(),
                key_id: "0123456789ab".into(),
            },
            scopes: crate::accounts::Scopes::ALL,
            models: None,
            plan_name: "p".into(),
            plan,
            org: Default::default(),
            series: Default::default(),
        })
    }

    fn test_slots() -> SlotLease {
        SlotLease::new(
            Duration::from_secs(60),
            Duration::from_secs(1),
            Duration::from_secs(600),
        )
    }

    fn retry_after_ms(headers: &[(&str, String)]) -> Option<u64> {
        headers
            .iter()
            .find(|(k, _)| *k == "retry-after-ms")
            .and_then(|(_, v)| v.parse().ok())
    }

    /// A heartbeat keeps a live reservation's slot for many leases; a
    /// reservation past its renewal deadline (a guard leaked by a live
    /// replica, or a dead replica's, which renews nothing) loses it within
    /// one lease, and the refusal before says when.
    #[tokio::test]
    async fn the_heartbeat_keeps_a_live_slot_and_an_unrenewed_one_lapses_within_a_lease() {
        let lease = Duration::from_millis(400);
        let limiter = Arc::new(Limiter::new(
            None,
            OnStoreFailure::FailOpenLocal,
            SlotLease::new(lease, Duration::from_millis(50), Duration::from_secs(600)),
        ));
        let heartbeat = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.maintain().await }
        });
        let plan = RatePlan {
            max_concurrent: 1,
            ..RatePlan::default()
        };
        let acc = account(plan);
        let base = crate::catalog::Catalog::default().find("base").unwrap();
        let (r, _) = limiter.admit_request(&acc, base, "r1".into(), 1, 1).await;
        let held = r.unwrap();
        tokio::time::sleep(lease * 3).await;
        // Another replica's view: this process's local count aside, the
        // store still holds the slot, and its live owner gets a short hint.
        let r2 = AdmitRequest {
            org: &acc.principal.org,
            model: base.id,
            request_id: "r2",
            tokens: 1,
            plan,
            budget_nano: None,
            slot_lease_ms: limiter.slots.lease_ms(),
            renew_every_ms: limiter.slots.renew_every_ms(),
        };
        let a = limiter.memory.admit_now(&r2);
        assert_eq!(a.verdict, Verdict::Concurrency);
        assert!(
            (1..=slots::LIVE_RETRY_MS).contains(&a.retry_after_ms),
            "{a:?}"
        );
        assert_eq!(limiter.live.len(), 1);

        // The owner stops renewing (as a dead replica does).
        heartbeat.abort();
        let stopped = Instant::now();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let a = limiter.memory.admit_now(&r2);
        assert_eq!(a.verdict, Verdict::Concurrency);
        // Two renewals missed: the refusal says when the slot lapses.
        assert!(a.retry_after_ms <= 200, "{a:?}");
        tokio::time::sleep(Duration::from_millis(a.retry_after_ms)).await;
        let a = limiter.memory.admit_now(&r2);
        assert_eq!(a.verdict, Verdict::Admitted, "lapsed when it said");
        assert!(stopped.elapsed() < lease + Duration::from_millis(150));
        held.settle(Outcome::NotRun).await;
        assert_eq!(limiter.live.len(), 0, "a settled slot is not renewed");
    }

    #[tokio::test]
    async fn a_reservation_past_its_deadline_is_no_longer_renewed() {
        let lease = Duration::from_millis(300);
        let limiter = Arc::new(Limiter::new(
            None,
            OnStoreFailure::FailOpenLocal,
            SlotLease::new(lease, Duration::from_millis(50), lease),
        ));
        let heartbeat = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.maintain().await }
        });
        let plan = RatePlan {
            max_concurrent: 1,
            ..RatePlan::default()
        };
        let (acc, base) = (
            account(plan),
            crate::catalog::Catalog::default().find("base").unwrap(),
        );
        let (r, _) = limiter.admit_request(&acc, base, "r1".into(), 1, 1).await;
        let _leaked = r.unwrap();
        let (r, headers) = limiter.admit_request(&acc, base, "r2".into(), 1, 1).await;
        assert!(r.is_err());
        assert!(retry_after_ms(&headers).is_some());
        // Renewed until its deadline (one lease here), then lapsed within
        // one more lease, while the heartbeat goes on.
        tokio::time::sleep(lease * 2 + Duration::from_millis(50)).await;
        let r2 = AdmitRequest {
            org: &acc.principal.org,
            model: base.id,
            request_id: "r2",
            tokens: 1,
            plan,
            budget_nano: None,
            slot_lease_ms: limiter.slots.lease_ms(),
            renew_every_ms: limiter.slots.renew_every_ms(),
        };
        assert_eq!(limiter.memory.admit_now(&r2).verdict, Verdict::Admitted);
        heartbeat.abort();
    }

    #[tokio::test]
    async fn a_dropped_reservation_releases_its_slot_and_tokens() {
        let limiter = Arc::new(Limiter::new(
            None,
            OnStoreFailure::FailOpenLocal,
            test_slots(),
        ));
        let plan = RatePlan {
            rpm: 0,
            tpm: 1000,
            max_concurrent: 1,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        let acc = account(plan);
        let base = crate::catalog::Catalog::default().find("base").unwrap();
        let (r, headers) = limiter
            .admit_request(&acc, base, "r1".into(), 100, 800)
            .await;
        let mut reservation = r.unwrap();
        assert!(headers
            .iter()
            .any(|(k, v)| *k == "x-ratelimit-remaining-tokens" && v == "100"));
        // Busy: one in flight, 900 of 1000 tokens reserved.
        let (r, headers) = limiter.admit_request(&acc, base, "r2".into(), 10, 1).await;
        assert_eq!(r.err().map(|e| ApiError::from(e).status), Some(429));
        assert!(headers.iter().any(|(k, _)| *k == "retry-after-ms"));
        // The request is abandoned mid-stream: dropped, never settled.
        reservation.mark_started();
        reservation.observe_output(5);
        drop(reservation);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (r, headers) = limiter
            .admit_request(&acc, base, "r3".into(), 10, 800)
            .await;
        assert!(r.is_ok(), "slot and unused tokens are back");
        // 100 input estimate + 5 output billed for r1, 810 reserved by r3.
        assert!(
            headers
                .iter()
                .any(|(k, v)| *k == "x-ratelimit-remaining-tokens" && v == "85"),
            "{headers:?}"
        );
    }

    /// Every 429 for one full window carries the same reset, whichever
    /// stage answers it: the global stage's first, then the local stage's.
    #[tokio::test]
    async fn refusals_of_one_full_window_carry_the_same_reset_at_both_stages() {
        let limiter = Arc::new(Limiter::new(
            None,
            OnStoreFailure::FailOpenLocal,
            test_slots(),
        ));
        let plan = RatePlan {
            rpm: 3,
            ..RatePlan::default()
        };
        let acc = account(plan);
        let base = crate::catalog::Catalog::default().find("base").unwrap();
        for i in 0..3 {
            let (r, _) = limiter
                .admit_request(&acc, base, format!("r{i}"), 1, 1)
                .await;
            r.unwrap().settle(Outcome::NotRun).await;
        }
        let header =
            |h: &[(&str, String)], k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        let mut waits = Vec::new();
        for i in 3..6 {
            let (r, headers) = limiter
                .admit_request(&acc, base, format!("r{i}"), 1, 1)
                .await;
            let e = ApiError::from(r.err().expect("refused"));
            assert_eq!(
                (e.status, e.retry_after_secs),
                (429, Some(60)),
                "{headers:?}"
            );
            let ms: u64 = header(&headers, "retry-after-ms").unwrap().parse().unwrap();
            assert!((58_000..=60_000).contains(&ms), "{headers:?}");
            assert!(header(&headers, "x-ratelimit-reset-requests").is_some());
            assert_eq!(
                header(&headers, "x-ratelimit-remaining-requests").as_deref(),
                Some("0")
            );
            waits.push(ms);
        }
        // One reset, counted down (the first refusal is the global stage's,
        // the others the local stage's).
        assert!(
            waits
                .windows(2)
                .all(|w| w[0] >= w[1] && w[0] - w[1] < 1_000),
            "{waits:?}"
        );
    }

    #[test]
    fn each_verdict_is_counted_under_its_own_decision_label() {
        for (verdict, label) in [
            (Verdict::Admitted, "admitted"),
            (Verdict::Requests, "requests"),
            (Verdict::Tokens, "tokens"),
            (Verdict::Concurrency, "concurrency"),
            (Verdict::OverBudget, "budget"),
        ] {
            assert_eq!(verdict.decision().label(), label);
        }
    }

    /// The client's view of a rate-limit refusal.
    fn refusal_error(verdict: Verdict, tokens: u64, plan: &RatePlan, retry_ms: u64) -> ApiError {
        ApiError::from(Refusal::RateLimited(RateLimited::new(
            verdict, tokens, plan, retry_ms,
        )))
    }

    #[test]
    fn refusal_messages_and_retry_after() {
        let plan = RatePlan {
            rpm: 10,
            tpm: 100,
            max_concurrent: 2,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        let e = refusal_error(Verdict::Requests, 5, &plan, 1500);
        assert_eq!(
            (e.status, e.code.as_ref(), e.error_type()),
            (429, "rate_limit_exceeded", "rate_limit_error")
        );
        assert_eq!(e.retry_after_secs, Some(2));
        assert_eq!(
            refusal_error(Verdict::Concurrency, 5, &plan, 0).retry_after_secs,
            Some(1)
        );
        assert!(refusal_error(Verdict::Tokens, 500, &plan, 60_000)
            .message
            .contains("too large"));
    }
}

/// The hot-path benchmark: gateway CPU of authentication (warm key cache)
/// plus admission and settlement against the real Redis, and the Redis
/// commands each request costs. Run:
/// `cargo test --release -p gateway --lib bench_ -- --ignored --nocapture`
#[cfg(test)]
mod bench {
    use super::*;
    use crate::accounts::cache::Accounts;
    use crate::accounts::store::AccountStore;
    use crate::accounts::Scopes;
    use crate::redis::testing::{cleanup, test_redis};
    use harness::procfs::{thread_cpu, thread_user_cpu};

    async fn evalsha_calls(redis: &RedisHandle) -> u64 {
        let mut conn = redis.conn().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    #[test]
    #[ignore = "benchmark; run with --ignored --nocapture"]
    fn bench_hot_path_auth_and_limits() {
        // One thread runs everything the gateway does (including the Redis
        // connection's driver task), so its CPU clock is the gateway's cost.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let redis = test_redis();
            let mut config = Config::defaults();
            config.limits.key_cache_ttl_ms = 600_000;
            let store = AccountStore::new(redis.clone());
            let plan = RatePlan {
                rpm: 10_000_000,
                tpm: 10_000_000_000,
                max_concurrent: 100_000,
                default_max_tokens: 0,
                ..RatePlan::default()
            };
            store.set_plan("bench", &plan).await.unwrap();
            let (secret, _) = store
                .create_key("org-bench", "bench", "bench", Scopes::ALL, None)
                .await
                .unwrap();
            let header = format!("Bearer {secret}");
            let accounts = Accounts::from_config(&config, Some(redis.clone())).unwrap();
            let limiter = Arc::new(Limiter::from_config(&config, Some(redis.clone())));
            let model = crate::catalog::Catalog::default().find("base").unwrap();
            let usage = pb::Usage {
                prompt_tokens: 20,
                cached_prompt_tokens: 0,
                completion_tokens: 30,
                reasoning_tokens: 0,
                image_tokens: 0,
            };
            let one = |i: usize| {
                let accounts = &accounts;
                let limiter = &limiter;
                let header = &header;
                let usage = &usage;
                async move {
                    let account = accounts.authenticate(Some(header.as_bytes())).await.unwrap();
                    account.check_org().unwrap();
                    account.check_model(model.id).unwrap();
                    let (r, headers) = limiter
                        .admit_request(&account, model, format!("req_bench{i}"), 25, 64)
                        .await;
                    assert_eq!(headers.len(), 6);
                    r.unwrap().settle(Outcome::Finished(usage)).await;
                }
            };
            for i in 0..500 {
                one(i).await;
            }
            let n = 5000;
            let calls_before = evalsha_calls(&redis).await;
            let (cpu0, user0, wall0) = (thread_cpu(), thread_user_cpu(), Instant::now());
            for i in 0..n {
                one(1000 + i).await;
            }
            limiter.flush().await;
            let (cpu, user, wall) = (
                thread_cpu() - cpu0,
                thread_user_cpu() - user0,
                wall0.elapsed(),
            );
            let calls = evalsha_calls(&redis).await - calls_before;

            // The same with 64 requests in flight (a loaded gateway: the
            // multiplexed connection then writes many commands per syscall).
            // Longer: this is the figure the target is about, and the
            // user/system split is only sampled at clock ticks.
            let loaded_n = 10 * n;
            let (cpu2, user2) = (thread_cpu(), thread_user_cpu());
            let mut in_flight = futures::stream::FuturesUnordered::new();
            for i in 0..loaded_n {
                in_flight.push(one(100_000 + i));
                if in_flight.len() >= 64 {
                    futures::StreamExt::next(&mut in_flight).await;
                }
            }
            while futures::StreamExt::next(&mut in_flight).await.is_some() {}
            limiter.flush().await;
            let (loaded_cpu, loaded_user) = (thread_cpu() - cpu2, thread_user_cpu() - user2);

            // A bare PING round trip through the same connection: the floor.
            let mut conn = redis.conn().await.unwrap();
            let cpu3 = thread_cpu();
            for _ in 0..n {
                let _: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
            }
            let ping_cpu = thread_cpu() - cpu3;

            // Authentication alone (warm cache).
            let cpu1 = thread_cpu();
            for _ in 0..n {
                let a = accounts.authenticate(Some(header.as_bytes())).await.unwrap();
                std::hint::black_box(a);
            }
            let auth_cpu = thread_cpu() - cpu1;
            let us = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
            let loaded_us = |d: Duration| d.as_secs_f64() * 1e6 / loaded_n as f64;
            println!(
                "hot path, per request over {n}: auth+admit+settle {:.2} µs gateway CPU one at a time \
                 ({:.2} µs user mode, the rest is the kernel's socket work), {:.2} µs with 64 in flight \
                 ({:.2} µs user mode); auth alone {:.2} µs; one bare Redis PING round trip {:.2} µs; \
                 {:.1} µs wall; {:.2} Redis scripts (round trips) per request",
                us(cpu),
                us(user),
                loaded_us(loaded_cpu),
                loaded_us(loaded_user),
                us(auth_cpu),
                us(ping_cpu),
                us(wall),
                calls as f64 / n as f64,
            );
            cleanup(&redis).await;
        });
    }
}

/// One behavioural suite that every [`LimitStore`] must pass.
#[cfg(test)]
pub(crate) mod tests_shared {
    use super::*;

    fn req<'a>(
        model: &'a str,
        rid: &'a str,
        tokens: u64,
        plan: RatePlan,
        budget: Option<i64>,
    ) -> AdmitRequest<'a> {
        AdmitRequest {
            org: "org-suite",
            model,
            request_id: rid,
            tokens,
            plan,
            budget_nano: budget,
            slot_lease_ms: 60_000,
            renew_every_ms: 1_000,
        }
    }

    pub(crate) fn settlement<'a>(
        model: &'a str,
        rid: &'a str,
        reserved: u64,
        usage: Option<TokenUsage>,
        cost: i64,
    ) -> Settlement<'a> {
        Settlement {
            org: "org-suite",
            model,
            key_id: "k1",
            request_id: rid,
            reserved_tokens: reserved,
            actual_tokens: usage.map(|u| u.total()).unwrap_or(0),
            usage,
            cost_nano: cost,
            day: "2026-11-23",
        }
    }

    async fn settle_now(store: &dyn LimitStore, s: Settlement<'_>) {
        store.settle(&s).await.unwrap();
        store.flush().await;
    }

    /// Leased concurrency slots: renewal keeps a slot past its lease; an
    /// unrenewed slot lapses within one lease, and the refusals before say
    /// when; a lapsed or settled slot is not brought back by a renewal.
    pub(crate) async fn lease_suite(store: &dyn LimitStore) {
        const LEASE_MS: u64 = 1000;
        const RENEW_MS: u64 = 100;
        let plan = RatePlan {
            max_concurrent: 2,
            ..RatePlan::default()
        };
        let admit = |rid: &'static str| {
            let r = AdmitRequest {
                org: "org-lease",
                model: "base",
                request_id: rid,
                tokens: 1,
                plan,
                budget_nano: None,
                slot_lease_ms: LEASE_MS,
                renew_every_ms: RENEW_MS,
            };
            async move { store.admit(&r).await.unwrap() }
        };
        let renew = |rids: &[&str]| {
            let ids: Vec<String> = rids.iter().map(|s| s.to_string()).collect();
            async move {
                store
                    .renew("org-lease", "base", &ids, LEASE_MS)
                    .await
                    .unwrap()
            }
        };
        let release = |rid: &'static str| async move {
            let mut s = settlement("base", rid, 0, None, 0);
            s.org = "org-lease";
            settle_now(store, s).await;
        };
        let beat = Duration::from_millis(RENEW_MS);

        assert_eq!(admit("a").await.verdict, Verdict::Admitted);
        assert_eq!(admit("b").await.verdict, Verdict::Admitted);
        let refused = admit("c").await;
        assert_eq!(refused.verdict, Verdict::Concurrency);
        // Both owners just wrote their slots: a short hint.
        assert!(
            (1..=slots::LIVE_RETRY_MS).contains(&refused.retry_after_ms),
            "{refused:?}"
        );

        // Renewed for two leases: still held, still live.
        let until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
        while Instant::now() < until {
            renew(&["a", "b"]).await;
            tokio::time::sleep(beat).await;
        }
        let refused = admit("c").await;
        assert_eq!(refused.verdict, Verdict::Concurrency, "renewal keeps slots");
        assert!(
            refused.retry_after_ms <= slots::LIVE_RETRY_MS,
            "{refused:?}"
        );

        // `a`'s owner stops renewing (dies); `b`'s goes on.
        renew(&["a", "b"]).await;
        let stopped = Instant::now();
        for _ in 0..5 {
            tokio::time::sleep(beat).await;
            renew(&["b"]).await;
        }
        let waited = stopped.elapsed().as_millis() as u64;
        let refused = admit("c").await;
        assert_eq!(refused.verdict, Verdict::Concurrency);
        // Two renewals missed: the refusal says when `a` lapses (at most
        // one lease after its last renewal; +2: clocks in whole ms).
        let said = refused.retry_after_ms;
        let at_most = LEASE_MS - waited + 2;
        assert!(said > 0 && said <= at_most, "{refused:?}, {at_most}");
        tokio::time::sleep(Duration::from_millis(said)).await;
        assert_eq!(admit("c").await.verdict, Verdict::Admitted, "when it said");
        assert!(stopped.elapsed() < Duration::from_millis(LEASE_MS + 300));

        // A renewal of the lapsed `a` does not bring it back: with `b`
        // settled, only `c` holds a slot.
        renew(&["a", "b", "c"]).await;
        release("b").await;
        assert_eq!(admit("d").await.verdict, Verdict::Admitted);
        // A settled slot neither: with `c` settled, only `d` holds one.
        release("c").await;
        renew(&["b", "c", "d"]).await;
        assert_eq!(admit("e").await.verdict, Verdict::Admitted);
        assert_eq!(admit("f").await.verdict, Verdict::Concurrency);
        release("d").await;
        release("e").await;
    }

    pub(crate) async fn suite(store: &dyn LimitStore) {
        // Requests and concurrency on `base`.
        let plan = RatePlan {
            rpm: 3,
            tpm: 1000,
            max_concurrent: 2,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        let a = store
            .admit(&req("base", "r1", 300, plan, None))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::Admitted);
        assert_eq!((a.used_requests, a.used_tokens), (1, 300));
        assert!((59_000..=60_000).contains(&a.reset_requests_ms), "{a:?}");
        assert!((59_000..=60_000).contains(&a.reset_tokens_ms), "{a:?}");
        let a = store
            .admit(&req("base", "r2", 300, plan, None))
            .await
            .unwrap();
        assert_eq!(
            (a.verdict, a.used_requests, a.used_tokens),
            (Verdict::Admitted, 2, 600)
        );
        // Third concurrent request: refused, and a refusal records nothing.
        let a = store
            .admit(&req("base", "r3", 100, plan, None))
            .await
            .unwrap();
        assert_eq!(
            (a.verdict, a.used_requests, a.used_tokens),
            (Verdict::Concurrency, 2, 600)
        );
        assert!(a.retry_after_ms > 0);

        // r1 ends having used 100 tokens: slot and 200 tokens come back.
        let used = TokenUsage {
            input: 100,
            cached_input: 10,
            output: 0,
            reasoning: 5,
        };
        settle_now(store, settlement("base", "r1", 300, Some(used), 777)).await;
        let a = store
            .admit(&req("base", "r3", 600, plan, None))
            .await
            .unwrap();
        assert_eq!(
            (a.verdict, a.used_requests, a.used_tokens),
            (Verdict::Admitted, 3, 1000)
        );

        // Both in flight end without running; the request window is full.
        settle_now(store, settlement("base", "r2", 300, None, 0)).await;
        settle_now(store, settlement("base", "r3", 600, None, 0)).await;
        let a = store
            .admit(&req("base", "r4", 1, plan, None))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::Requests);
        assert_eq!(a.used_tokens, 100);
        assert!((59_000..=60_000).contains(&a.retry_after_ms), "{a:?}");

        // Tokens on `base-mini`, a model of its own.
        let plan = RatePlan {
            rpm: 0,
            tpm: 1000,
            max_concurrent: 0,
            default_max_tokens: 0,
            ..RatePlan::default()
        };
        let a = store
            .admit(&req("base-mini", "t1", 800, plan, None))
            .await
            .unwrap();
        assert_eq!(
            (a.verdict, a.used_requests, a.used_tokens),
            (Verdict::Admitted, 0, 800)
        );
        let a = store
            .admit(&req("base-mini", "t2", 300, plan, None))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::Tokens);
        assert!((59_000..=60_000).contains(&a.retry_after_ms), "{a:?}");
        let a = store
            .admit(&req("base-mini", "t3", 1001, plan, None))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::Tokens);
        // t1 used only 500: 300 more fit.
        let half = TokenUsage {
            input: 250,
            cached_input: 0,
            output: 250,
            reasoning: 0,
        };
        settle_now(store, settlement("base-mini", "t1", 800, Some(half), 0)).await;
        let a = store
            .admit(&req("base-mini", "t2", 300, plan, None))
            .await
            .unwrap();
        assert_eq!((a.verdict, a.used_tokens), (Verdict::Admitted, 800));
        // A request that used more than it reserved counts in full.
        let over = TokenUsage {
            input: 100,
            cached_input: 0,
            output: 400,
            reasoning: 0,
        };
        settle_now(store, settlement("base-mini", "t2", 300, Some(over), 0)).await;
        let a = store
            .admit(&req("base-mini", "t4", 1, plan, None))
            .await
            .unwrap();
        assert_eq!((a.verdict, a.used_tokens), (Verdict::Tokens, 1000));
        let a = store
            .admit(&req("base-mini", "t4", 0, plan, None))
            .await
            .unwrap();
        assert_eq!((a.verdict, a.used_tokens), (Verdict::Admitted, 1000));

        // Budget: r1 cost 777 nano-dollars.
        let open = RatePlan::default();
        let a = store
            .admit(&req("base-ultra", "b1", 1, open, Some(777)))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::OverBudget);
        let a = store
            .admit(&req("base-ultra", "b2", 1, open, Some(778)))
            .await
            .unwrap();
        assert_eq!(a.verdict, Verdict::Admitted);
    }
}
