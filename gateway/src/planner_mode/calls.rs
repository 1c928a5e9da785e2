//! The planner's model calls (plan, repair, re-plan, `llm` steps,
//! synthesis; its [`ModelCalls`] port), each one a generation of the
//! request's own model through the one driver: the same pool and routing,
//! limits (each call is admitted and settled like any generation),
//! billing, deadline and cancellation (dropping a call cancels the
//! worker's generation). The worker request comes from the translate
//! layer (`translate::planner::to_worker`), like chat's and the
//! Responses'.

use crate::accounts::{Account, ServiceTier};
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::{End, Generation, Gone, Sink};
use crate::limits::{estimate_input_tokens, Limiter, Reservation};
use crate::pool::Pools;
use crate::translate::planner::{to_worker, PlannerCall};
use inference_proto::v1 as pb;
use planner::ports::{Call, CallFailure, ModelCalls, Reply};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use telemetry::TraceParent;
use tokio::sync::mpsc::UnboundedSender;

/// The model calls of one planner request.
pub struct RequestCalls<'a> {
    pub pools: &'a Pools,
    pub limiter: &'a Arc<Limiter>,
    pub account: &'a Arc<Account>,
    pub model: &'static ModelSpec,
    pub trace: TraceParent,
    pub request_id: String,
    /// The session: calls of one session stick to one worker.
    pub session_id: String,
    /// The request's own admission, used by its first model call.
    pub first: Mutex<Option<Reservation>>,
    /// Usage of every call so far.
    usage: Mutex<pb::Usage>,
    /// The tier every call of the run queues at (the request's, capped by
    /// the plan).
    pub tier: ServiceTier,
    calls: AtomicU32,
}

/// A call's failure is the request's own error (a run whose first call
/// is refused answers with it).
impl CallFailure for ApiError {
    fn refused(&self) -> bool {
        matches!(self.status, 402 | 429 | 503)
    }

    fn message(&self) -> &str {
        &self.message
    }
}

impl<'a> RequestCalls<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        pools: &'a Pools,
        limiter: &'a Arc<Limiter>,
        account: &'a Arc<Account>,
        model: &'static ModelSpec,
        trace: TraceParent,
        request_id: String,
        session_id: String,
        first: Reservation,
    ) -> Self {
        Self {
            pools,
            limiter,
            account,
            model,
            trace,
            request_id,
            session_id,
            first: Mutex::new(Some(first)),
            usage: Mutex::new(pb::Usage::default()),
            tier: account.plan.service_tier(None),
            calls: AtomicU32::new(0),
        }
    }

    /// Calls queued at `tier` rather than the plan's default.
    pub fn with_tier(mut self, tier: ServiceTier) -> Self {
        self.tier = tier;
        self
    }

    /// Usage of every call so far.
    pub fn usage(&self) -> pb::Usage {
        self.usage.lock().map(|u| *u).unwrap_or_default()
    }

    /// One generation of `call`, asking for at most `max_tokens`.
    async fn call_once(
        &self,
        call: &Call,
        max_tokens: u32,
        deltas: Option<&UnboundedSender<String>>,
    ) -> Result<Reply, ApiError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let request_id = format!("{}-m{n}", self.request_id);
        let input_bytes: usize = call.messages.iter().map(|t| t.text.len()).sum::<usize>()
            + call.schema.as_ref().map_or(0, |s| s.to_string().len());
        let first = self.first.lock().ok().and_then(|mut f| f.take());
        let reservation = match first {
            Some(r) => r,
            None => {
                self.limiter
                    .admit_request(
                        self.account,
                        self.model,
                        request_id.clone(),
                        estimate_input_tokens(input_bytes),
                        max_tokens,
                    )
                    .await?
            }
        };
        let streamed = deltas.is_some();
        let work = to_worker(&PlannerCall {
            request_id: &request_id,
            model: self.model.id,
            messages: call
                .messages
                .iter()
                .map(|t| (t.role.as_str(), t.text.as_str()))
                .collect(),
            schema: call.schema.as_ref(),
            max_tokens,
            session_id: &self.session_id,
            streamed,
        });
        let generation = Generation {
            pools: self.pools,
            model: self.model.id,
            work,
            trace: self.trace,
            deadline: call.deadline,
            timed_from: None,
            tier: self.tier,
        };
        let mut collect = Collect {
            text: String::new(),
            deltas,
            finished: None,
        };
        let end = generation.run(reservation, &mut collect).await;
        if let Some(f) = &collect.finished {
            if let (Ok(mut sum), Some(u)) = (self.usage.lock(), f.usage) {
                sum.prompt_tokens += u.prompt_tokens;
                sum.completion_tokens += u.completion_tokens;
                sum.cached_prompt_tokens += u.cached_prompt_tokens;
                sum.reasoning_tokens += u.reasoning_tokens;
            }
        }
        let output_tokens = collect
            .finished
            .as_ref()
            .and_then(|f| f.usage)
            .map_or(0, |u| u.completion_tokens);
        let at_length = collect
            .finished
            .as_ref()
            .is_some_and(|f| f.reason == pb::finished::Reason::Length as i32);
        match end {
            End::Finished(_) => Ok(Reply {
                text: collect.text,
                output_tokens,
                at_length,
            }),
            End::NotStarted(e) | End::Failed(e) => Err(e),
            End::Gone => Err(ApiError::internal("the model call was abandoned")),
        }
    }
}

impl ModelCalls for RequestCalls<'_> {
    type Error = ApiError;

    async fn call(
        &self,
        call: Call,
        deltas: Option<&UnboundedSender<String>>,
    ) -> Result<Reply, ApiError> {
        match self.call_once(&call, call.max_tokens, deltas).await {
            // A worker whose window is smaller than the planner's output
            // cap (a real engine's context): ask for what fits instead.
            Err(e) if e.code == "context_length_exceeded" && call.max_tokens > 0 => {
                self.call_once(&call, 0, deltas).await
            }
            result => result,
        }
    }

    fn tokens_used(&self) -> u64 {
        let u = self.usage();
        u64::from(u.prompt_tokens) + u64::from(u.completion_tokens)
    }
}

/// Folds a call's text (and forwards deltas when the answer streams).
struct Collect<'s> {
    text: String,
    deltas: Option<&'s UnboundedSender<String>>,
    finished: Option<pb::Finished>,
}

impl Sink for Collect<'_> {
    fn event(&mut self, event: pb::GenerateEvent) {
        use pb::generate_event::Event;
        match event.event {
            Some(Event::Text(t)) => {
                if let Some(tx) = self.deltas {
                    let _ = tx.send(t.text.clone());
                }
                self.text.push_str(&t.text);
            }
            Some(Event::Finished(f)) => self.finished = Some(f),
            _ => {}
        }
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        Ok(())
    }

    /// The planner watches its client itself (dropping the whole run).
    async fn gone(&mut self) {
        std::future::pending::<()>().await
    }

    async fn gone_while_starting(&mut self) {
        std::future::pending::<()>().await
    }

    async fn fail(&mut self, _e: &ApiError) {}
}
