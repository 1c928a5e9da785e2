//! The [`Limiter`]: the stores it asks (Redis, else or when Redis is
//! down the in-process one, by `limits.on_store_failure`), the settlements
//! it hands them, and the slot heartbeat of this replica's live
//! reservations. Admission itself is [`super::gate`].

use super::local::LocalStage;
use super::memory;
use super::redis_lua;
use super::refusal::Refusal;
use super::slots::{LiveSlots, SlotLease};
use super::store::{
    settle_until_applied, Admission, AdmitRequest, Holder, LimitStore, OwnedSettlement, Settlement,
};
use crate::config::{Config, OnStoreFailure};
use crate::redis::RedisHandle;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The admission gate the request path calls.
pub struct Limiter {
    pub(super) local: LocalStage,
    /// Redis, when configured.
    pub(super) global: Option<Arc<dyn LimitStore>>,
    /// The embedded store, and the fail-open fallback when Redis is down.
    pub(super) memory: Arc<memory::MemoryLimits>,
    policy: OnStoreFailure,
    pub(super) slots: SlotLease,
    /// Slots of this replica's live reservations, renewed by [`Self::maintain`].
    pub(super) live: LiveSlots,
    /// While now < this (ms since `epoch`), Redis is considered down and not
    /// asked (so an outage costs one timeout per second, not per request).
    global_down_until: AtomicU64,
    epoch: Instant,
    /// Open WebSocket connections per key (`[websocket]
    /// max_connections_per_key`).
    pub connections: super::connections::Connections,
}

/// How long Redis is left alone after a failure.
const GLOBAL_RETRY_MS: u64 = 1000;

/// Request ids renewed in one call (bounds one command's size).
const MAX_RENEW_IDS: usize = 500;

impl Limiter {
    pub fn from_config(config: &Config, redis: Option<Arc<RedisHandle>>) -> Self {
        let mut limiter = Self::new(
            redis.map(|r| Arc::new(redis_lua::RedisLimits::new(r)) as Arc<dyn LimitStore>),
            config.limits.on_store_failure,
            SlotLease::from_config(config),
        );
        limiter.connections =
            super::connections::Connections::new(config.websocket.max_connections_per_key);
        limiter
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
            connections: Default::default(),
        }
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
            counts_request: false,
            cost_nano: 0,
            day: crate::usage::utc_today().to_string(),
        };
        tokio::spawn(settle_until_applied(global.clone(), release));
    }

    pub(super) async fn ask_store(
        &self,
        req: &AdmitRequest<'_>,
    ) -> Result<(Admission, Holder), Refusal> {
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

    pub(super) fn now_ms(&self) -> u64 {
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

    pub(super) async fn settle(&self, s: &Settlement<'_>, holder: Holder) {
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
