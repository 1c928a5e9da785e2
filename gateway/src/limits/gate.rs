//! Admission: [`Limiter::admit_request`], the gate the request path
//! calls. The local stage first ([`super::local`]), then the global count
//! (a [`super::store::LimitStore`]); an admitted request leaves with a
//! [`Reservation`], a refused one [`Refused`]; both keep the window state
//! they were decided under, which a caller that answers over HTTP asks for
//! as `x-ratelimit-*` headers ([`super::headers`]).

use super::limiter::Limiter;
use super::local::LocalEntry;
use super::refusal::{RateLimited, Refusal, Refused};
use super::reservation::Reservation;
use super::store::{Admission, AdmitRequest, Holder, Verdict};
use crate::accounts::{Account, RatePlan};
use crate::catalog::ModelSpec;
use crate::metrics::LimitStage;
use std::sync::Arc;
use std::time::Instant;

/// Output tokens reserved when neither the request nor the plan says.
pub const FALLBACK_MAX_TOKENS: u32 = 4096;

impl Limiter {
    /// Admits a request of `account` to `model` or refuses it: 429
    /// `rate_limit_exceeded` (with `retry-after`), 402 over budget, or 503
    /// when Redis is down under `fail_closed`. Either way the answer keeps
    /// the window state it was decided under, for a caller that sends the
    /// `x-ratelimit-*` headers (`rate_headers`).
    /// `input_estimate` is the prompt's token estimate
    /// ([`estimate_input_tokens`]); `max_tokens` 0 means the request set none.
    pub async fn admit_request(
        self: &Arc<Self>,
        account: &Arc<Account>,
        model: &'static ModelSpec,
        request_id: String,
        input_estimate: u64,
        max_tokens: u32,
    ) -> Result<Reservation, Refused> {
        let plan = account.plan;
        let req = self.count_of(
            account,
            model,
            &request_id,
            input_estimate,
            max_tokens,
            false,
        );
        let tokens = req.tokens;

        // Stage 1: this process.
        let local = self.local.entry(&account.principal.org, model.id, &plan);
        if let Err(refusal) = local.check(&plan, self.now_ms()) {
            count_decision(model, LimitStage::Local, refusal.verdict);
            let window = refusal.snapshot(&plan);
            return Err(Refused::new(
                refusal.into_refusal(tokens, &plan),
                plan,
                Some(window),
            ));
        }

        // Stage 2: the global count (nothing to count for an unlimited plan
        // without a budget: no round trip).
        let unasked = plan.is_unlimited() && req.budget_nano.is_none();
        let (admission, holder) = match self.count(&req, unasked, &local).await {
            Ok(a) => a,
            Err(e) => return Err(Refused::new(e, plan, None)),
        };
        count_decision(model, holder.stage(), admission.verdict);
        if admission.verdict == Verdict::Requests {
            local.requests_full_for(self.now_ms(), admission.retry_after_ms);
        }
        match admission.verdict {
            Verdict::Admitted => {
                let mut reservation = self.reservation(
                    account,
                    model,
                    request_id,
                    input_estimate,
                    tokens,
                    holder,
                    local,
                );
                reservation.window = Some(admission);
                Ok(reservation)
            }
            verdict => {
                local.release();
                let refusal = match verdict {
                    Verdict::OverBudget => Refusal::OverBudget,
                    _ => Refusal::RateLimited(RateLimited::new(
                        verdict,
                        tokens,
                        &plan,
                        admission.retry_after_ms,
                    )),
                };
                Err(Refused::new(refusal, plan, Some(admission)))
            }
        }
    }

    /// Takes over a request admitted on another replica: a background run
    /// a draining peer handed over (`responses::adopt`). The plan's limits never
    /// refuse it (it was admitted once; refusing it now would lose work its
    /// client was promised), but it holds its tokens and concurrency slot
    /// while it runs, and is not counted again as a request. `billed`: the
    /// first owner had started it and billed the request and its input, so
    /// this settlement bills only the output it adds and counts no request.
    /// `Err` only when the store cannot be asked under `fail_closed`.
    pub async fn take_over(
        self: &Arc<Self>,
        account: &Arc<Account>,
        model: &'static ModelSpec,
        request_id: String,
        input_estimate: u64,
        max_tokens: u32,
        billed: bool,
    ) -> Result<Reservation, Refusal> {
        let input_estimate = if billed { 0 } else { input_estimate };
        let req = self.count_of(
            account,
            model,
            &request_id,
            input_estimate,
            max_tokens,
            true,
        );
        let tokens = req.tokens;
        let local = self
            .local
            .entry(&account.principal.org, model.id, &account.plan);
        local.hold();
        // Only counted (never refused): an unlimited plan has nothing to
        // count, whatever its budget.
        let (_, holder) = self
            .count(&req, account.plan.is_unlimited(), &local)
            .await?;
        let mut reservation = self.reservation(
            account,
            model,
            request_id,
            input_estimate,
            tokens,
            holder,
            local,
        );
        reservation.counts_request = !billed;
        Ok(reservation)
    }

    /// What the global count is asked for a request: its tokens (the
    /// prompt's estimate and its output allowance) under the plan.
    fn count_of<'r>(
        &self,
        account: &'r Account,
        model: &'static ModelSpec,
        request_id: &'r str,
        input_estimate: u64,
        max_tokens: u32,
        taken_over: bool,
    ) -> AdmitRequest<'r> {
        let plan = account.plan;
        AdmitRequest {
            org: &account.principal.org,
            model: model.id,
            request_id,
            tokens: input_estimate + u64::from(output_allowance(&plan, max_tokens)),
            plan,
            budget_nano: account.org.budget_nano,
            slot_lease_ms: self.slots.lease_ms(),
            renew_every_ms: self.slots.renew_every_ms(),
            taken_over,
        }
    }

    /// The global count's answer, or (`unasked`: nothing to count) its
    /// holder without a round trip. A store that cannot be asked lets the
    /// local hold go.
    async fn count(
        &self,
        req: &AdmitRequest<'_>,
        unasked: bool,
        local: &LocalEntry,
    ) -> Result<(Admission, Holder), Refusal> {
        if unasked {
            let holder = if self.global.is_some() {
                Holder::Global
            } else {
                Holder::Memory
            };
            return Ok((Admission::unlimited(), holder));
        }
        self.ask_store(req).await.inspect_err(|_| local.release())
    }

    /// The hold of an admitted request: its local count, its reserved
    /// tokens and (under a concurrency limit) its slot in the heartbeat.
    #[allow(clippy::too_many_arguments)]
    fn reservation(
        self: &Arc<Self>,
        account: &Arc<Account>,
        model: &'static ModelSpec,
        request_id: String,
        input_estimate: u64,
        tokens: u64,
        holder: Holder,
        local: Arc<LocalEntry>,
    ) -> Reservation {
        let plan = account.plan;
        Reservation {
            limiter: self.clone(),
            account: account.clone(),
            model,
            // Only a plan with a concurrency limit takes a slot.
            slot: (plan.max_concurrent > 0).then(|| {
                self.live.hold(
                    &account.principal.org,
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
            counts_request: true,
            window: None,
        }
    }
}

/// Output tokens a request may use: its own `max_tokens`, else its plan's
/// default, else [`FALLBACK_MAX_TOKENS`].
fn output_allowance(plan: &RatePlan, max_tokens: u32) -> u32 {
    match (max_tokens, plan.default_max_tokens) {
        (0, 0) => FALLBACK_MAX_TOKENS,
        (0, d) => d,
        (m, _) => m,
    }
}

fn count_decision(model: &ModelSpec, stage: LimitStage, verdict: Verdict) {
    if let Some(series) = crate::metrics::model_series(model.id) {
        series.limiter_decision(stage, verdict.decision()).inc();
    }
}

/// A cheap upper-side estimate of a prompt's tokens from its JSON body:
/// about four bytes per token. Settling corrects it to the real count.
pub fn estimate_input_tokens(body_len: usize) -> u64 {
    (body_len as u64).div_ceil(4).max(1)
}
