//! An admitted request's hold on its limits, and its one settlement.

use super::limiter::Limiter;
use super::local::LocalEntry;
use super::store::{Holder, Settlement};
use crate::accounts::Account;
use crate::catalog::ModelSpec;
use crate::usage::{cost_nano, TokenUsage};
use inference_proto::v1 as pb;
use std::sync::Arc;

/// How an admitted request ended, for settling.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The worker finished and reported usage.
    Finished(&'a pb::Usage),
    /// Nothing ran on a worker (no capacity, rejected before generating),
    /// or nothing of what ran reached the client (a body the replica's
    /// drain cut before its end: the client retries elsewhere): the
    /// reservation is released and nothing is billed.
    NotRun,
    /// The client went away or the worker failed mid-way: billed as the
    /// input estimate plus the output relayed so far.
    Abandoned,
    /// Nothing was generated, but the input was taken in (a WebSocket
    /// warm-up, `generate: false`, prepares a response from it): the
    /// request and its input estimate stay counted in the plan's windows;
    /// nothing is billed.
    Prepared,
}

/// An admitted request's hold on its limits. Settle it with
/// [`Reservation::settle`]; dropping it unsettled settles in the
/// background, billing the input estimate plus the output seen so far if
/// the generation had started ([`Reservation::mark_started`]).
pub struct Reservation {
    pub(super) limiter: Arc<Limiter>,
    pub(super) account: Arc<Account>,
    pub(super) model: &'static ModelSpec,
    pub(super) request_id: String,
    pub(super) input_estimate: u64,
    pub(super) reserved_tokens: u64,
    pub(super) holder: Holder,
    pub(super) local: Arc<LocalEntry>,
    /// This request's concurrency slot in the renewal heartbeat.
    pub(super) slot: Option<u64>,
    pub(super) output_seen: u64,
    pub(super) started: bool,
    pub(super) done: bool,
    /// Its usage counts a request: not when it continues one another
    /// replica billed ([`Limiter::take_over`]).
    pub(super) counts_request: bool,
    /// The plan's windows as admission saw them (none for a request taken
    /// over: it was admitted elsewhere).
    pub(super) window: Option<super::store::Admission>,
}

impl Reservation {
    /// The account the request was admitted for.
    pub fn account(&self) -> &Account {
        &self.account
    }

    /// The `x-ratelimit-*` headers of its admission, for a caller that
    /// answers over HTTP.
    pub fn rate_headers(&self) -> Vec<(&'static str, String)> {
        self.window
            .map(|w| super::headers::rate_limit_headers(&self.account.plan, &w))
            .unwrap_or_default()
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
    ///
    /// The future is boxed: its store round trip is needed only at the
    /// end, and unboxed it would be part of every generation's state for
    /// the whole life of a stream.
    pub fn settle<'a>(
        self,
        outcome: Outcome<'a>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(self.settle_now(outcome))
    }

    async fn settle_now(mut self, outcome: Outcome<'_>) {
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
            Outcome::Prepared => {
                let input = self.input_estimate;
                return self.settle_with(None, input).await;
            }
        };
        let counted = usage.map(|u| u.total()).unwrap_or(0);
        self.settle_with(usage, counted).await;
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

    /// Settles with `usage` billed and `counted` tokens left in the
    /// token window.
    async fn settle_with(&self, usage: Option<TokenUsage>, counted: u64) {
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
            actual_tokens: counted,
            usage,
            counts_request: self.counts_request,
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
            counts_request: self.counts_request,
            window: None,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let counted = usage.map(|u| u.total()).unwrap_or(0);
                rt.spawn(async move { this.settle_with(usage, counted).await });
            }
            // No runtime (process teardown): release locally; the global
            // slot lapses unrenewed within a lease.
            Err(_) => this.release_here(),
        }
    }
}
