//! The in-process [`LimitStore`]: the same sliding windows, leased
//! concurrency slots and spend as the Redis scripts, for the embedded mode
//! (no Redis) and as the fail-open fallback of one replica. The per-key
//! daily usage log lives in Redis only (`gateway usage` reads it there).

use super::slots::concurrency_retry_ms;
use super::store::{Admission, AdmitRequest, LimitStore, Settlement, Verdict, WINDOW_MS};
use async_trait::async_trait;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

pub struct MemoryLimits {
    inner: Mutex<Inner>,
    epoch: Instant,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            epoch: Instant::now(),
        }
    }
}

#[derive(Default)]
struct Inner {
    /// By "org\nmodel".
    windows: HashMap<String, Window>,
    spend_nano: HashMap<String, i64>,
}

#[derive(Default)]
struct Window {
    requests: VecDeque<u64>,
    /// (admitted ms, entry id) in admission order; sizes in `token_of`.
    tokens: VecDeque<(u64, String)>,
    token_of: HashMap<String, u64>,
    token_sum: u64,
    /// Request id -> when its slot lapses (ms) unless renewed.
    in_flight: HashMap<String, u64>,
}

impl Window {
    fn expire(&mut self, now: u64) {
        let edge = now.saturating_sub(WINDOW_MS);
        while self.requests.front().is_some_and(|t| *t <= edge) {
            self.requests.pop_front();
        }
        while self.tokens.front().is_some_and(|(t, _)| *t <= edge) {
            if let Some((_, id)) = self.tokens.pop_front() {
                if let Some(n) = self.token_of.remove(&id) {
                    self.token_sum = self.token_sum.saturating_sub(n);
                }
            }
        }
        self.in_flight.retain(|_, deadline| *deadline > now);
    }

    fn reset_ms(newest: Option<u64>, now: u64) -> u64 {
        newest.map_or(0, |t| (t + WINDOW_MS).saturating_sub(now))
    }
}

impl MemoryLimits {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// The admission decision (never fails; the trait method wraps it).
    pub fn admit_now(&self, r: &AdmitRequest<'_>) -> Admission {
        let now = self.now_ms();
        let Ok(mut inner) = self.inner.lock() else {
            // A poisoned lock means a panic elsewhere; admit rather than wedge.
            return Admission::unlimited();
        };
        let spent = inner.spend_nano.get(r.org).copied().unwrap_or(0);
        let w = inner
            .windows
            .entry(format!("{}\n{}", r.org, r.model))
            .or_default();
        w.expire(now);
        let plan = &r.plan;
        let used_req = w.requests.len() as u64;
        let mut verdict = Verdict::Admitted;
        let mut retry = 0;
        if r.taken_over {
            // Admitted once already (on another replica): never refused.
            verdict = Verdict::Admitted;
        } else if r.budget_nano.is_some_and(|b| spent >= b) {
            verdict = Verdict::OverBudget;
        } else if plan.max_concurrent > 0
            && w.in_flight.len() as u64 >= u64::from(plan.max_concurrent)
        {
            verdict = Verdict::Concurrency;
            let first_lapse = w.in_flight.values().min().copied().unwrap_or(now + 1);
            retry = concurrency_retry_ms(first_lapse - now, r.slot_lease_ms, r.renew_every_ms);
        } else if plan.rpm > 0 && used_req >= u64::from(plan.rpm) {
            verdict = Verdict::Requests;
            retry = Window::reset_ms(w.requests.front().copied(), now);
        } else if plan.tpm > 0 && w.token_sum + r.tokens > plan.tpm {
            verdict = Verdict::Tokens;
            retry = WINDOW_MS;
            if r.tokens <= plan.tpm {
                let need = w.token_sum + r.tokens - plan.tpm;
                let mut freed = 0;
                for (t, id) in &w.tokens {
                    freed += w.token_of.get(id).copied().unwrap_or(0);
                    if freed >= need {
                        retry = Window::reset_ms(Some(*t), now);
                        break;
                    }
                }
            }
        }
        if verdict == Verdict::Admitted {
            if plan.rpm > 0 && !r.taken_over {
                w.requests.push_back(now);
            }
            if plan.tpm > 0 {
                w.tokens.push_back((now, r.request_id.to_owned()));
                w.token_of.insert(r.request_id.to_owned(), r.tokens);
                w.token_sum += r.tokens;
            }
            if plan.max_concurrent > 0 {
                w.in_flight
                    .insert(r.request_id.to_owned(), now + r.slot_lease_ms);
            }
        }
        Admission {
            verdict,
            used_requests: if plan.rpm > 0 {
                w.requests.len() as u64
            } else {
                0
            },
            used_tokens: if plan.tpm > 0 { w.token_sum } else { 0 },
            reset_requests_ms: Window::reset_ms(w.requests.back().copied(), now),
            reset_tokens_ms: Window::reset_ms(w.tokens.back().map(|(t, _)| *t), now),
            retry_after_ms: retry,
        }
    }
}

#[async_trait]
impl LimitStore for MemoryLimits {
    async fn admit(&self, r: &AdmitRequest<'_>) -> anyhow::Result<Admission> {
        Ok(self.admit_now(r))
    }

    async fn renew(
        &self,
        org: &str,
        model: &str,
        request_ids: &[String],
        lease_ms: u64,
    ) -> anyhow::Result<()> {
        let now = self.now_ms();
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("limiter state poisoned"))?;
        if let Some(w) = inner.windows.get_mut(&format!("{org}\n{model}")) {
            // What lapsed stays gone, as in Redis.
            w.in_flight.retain(|_, lapse| *lapse > now);
            for id in request_ids {
                if let Some(lapse) = w.in_flight.get_mut(id) {
                    *lapse = now + lease_ms;
                }
            }
        }
        Ok(())
    }

    async fn settle(&self, s: &Settlement<'_>) -> anyhow::Result<()> {
        let now = self.now_ms();
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("limiter state poisoned"))?;
        if let Some(w) = inner.windows.get_mut(&format!("{}\n{}", s.org, s.model)) {
            w.in_flight.remove(s.request_id);
            if s.reserved_tokens > 0 {
                match w.token_of.get_mut(s.request_id) {
                    Some(n) => {
                        w.token_sum = (w.token_sum + s.actual_tokens).saturating_sub(*n);
                        *n = s.actual_tokens;
                    }
                    None if s.actual_tokens > s.reserved_tokens => {
                        let extra = s.actual_tokens - s.reserved_tokens;
                        let id = format!("{}:x", s.request_id);
                        w.tokens.push_back((now, id.clone()));
                        w.token_of.insert(id, extra);
                        w.token_sum += extra;
                    }
                    None => {}
                }
            }
        }
        if s.cost_nano > 0 {
            *inner.spend_nano.entry(s.org.to_owned()).or_default() += s.cost_nano;
        }
        Ok(())
    }
}
