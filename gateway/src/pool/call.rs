//! A started call: its first event and stream, and the guard that holds
//! the worker's slot, measures the engine and stops the generation.

use super::endpoint::{self, WorkerEndpoint};
use super::{classify, queue, timing, WorkerAuth};
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Status, Streaming};

/// A running generation: the first event (already received) and the rest.
pub struct WorkerCall {
    pub first: pb::GenerateEvent,
    pub rest: Streaming<pb::GenerateEvent>,
    /// Keep until the call ends: the worker's in-flight slot, and where to
    /// report a failure after the first event.
    pub guard: CallGuard,
}

/// The worker side of a started call.
pub struct CallGuard {
    /// The worker serving the call, so a failure after the first event
    /// still counts against its health.
    pub(super) endpoint: Arc<WorkerEndpoint>,
    /// Holds the worker's in-flight slot until the guard is dropped.
    pub(super) _slot: endpoint::InflightSlot,
    pub(super) _prompt: RunningPrompt,
    pub(super) timing: CallTiming,
    /// The request's turn in the pool's queue: dropped after the slot (the
    /// fields drop in this order), so the next waiter finds it free.
    pub(super) turn: queue::Turn,
    /// The worker's token, for `Cancel`.
    pub(super) auth: WorkerAuth,
}

/// How long a client that left waits for the worker to say what it
/// generated before the call is dropped and billed for what arrived.
const CANCEL_WAIT: Duration = Duration::from_millis(500);

/// When a call started and what it asked of the engine, to measure the
/// engine by ([`timing::EngineTimes`]).
pub(super) struct CallTiming {
    pub(super) dispatched: Instant,
    pub(super) first_event: Instant,
    /// The worker had no free slot when the call went out: its times
    /// include a wait and say nothing of the engine's speed.
    pub(super) waited: bool,
    /// The prompt's prefix blocks (0: not computed for this pool's policy).
    pub(super) blocks: usize,
}

/// The call's prompt, running on its worker until dropped (cache-aware
/// routing on engines whose cached prefix serves one sequence at a time).
pub(super) struct RunningPrompt {
    pub(super) endpoint: Arc<WorkerEndpoint>,
    pub(super) id: Option<u64>,
}

impl Drop for RunningPrompt {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.endpoint.prefixes().end_running(id);
        }
    }
}

impl CallGuard {
    /// The worker finished the reply: resets its failure count, and
    /// measures the engine by it.
    pub fn record_finished(&self, usage: Option<&pb::Usage>) {
        self.endpoint.record_success();
        let t = &self.timing;
        let Some(usage) = usage.filter(|u| u.prompt_tokens > 0) else {
            return;
        };
        if t.waited || t.blocks == 0 {
            return;
        }
        let uncached = usage
            .prompt_tokens
            .saturating_sub(usage.cached_prompt_tokens);
        self.endpoint.times().record(timing::CallSample {
            first_event: t.first_event.duration_since(t.dispatched),
            whole: t.dispatched.elapsed(),
            prefilled_blocks: t.blocks as f64 * f64::from(uncached)
                / f64::from(usage.prompt_tokens),
        });
    }

    /// The call ended having relayed `output_tokens`: the service its
    /// organisation received, for the order of the pool's queue.
    pub fn record_served(&self, output_tokens: u64) {
        self.turn.served(output_tokens);
    }

    /// Stops the call's generation on its worker and asks how many tokens
    /// it generated there; `None` when the worker did not say in time (or
    /// predates `Cancel`). Called while the call's stream is still open,
    /// so the worker still finds the generation.
    pub async fn cancel(&self, request_id: &str) -> Option<u32> {
        let mut request = tonic::Request::new(pb::CancelRequest {
            request_id: request_id.to_owned(),
        });
        if let Some(value) = &self.auth {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let mut client = self.endpoint.client();
        let reply = tokio::time::timeout(CANCEL_WAIT, client.cancel(request))
            .await
            .ok()?
            .ok()?
            .into_inner();
        reply.found.then_some(reply.generated_tokens)
    }

    /// Registers the running call with its pool's queue as one a higher
    /// tier may preempt, when the pool's policy allows it for its tier and
    /// past preemptions; the lever the queue pulls then.
    pub fn preemptible(&mut self) -> Option<Arc<super::Lever>> {
        self.turn.preemptible()
    }

    /// The preemptible call noted its first event: see `Turn::offer`.
    pub fn offer_preemptible(&self) {
        self.turn.offer();
    }

    /// Whether the worker's engine continues any generation, not only a
    /// text answer (see `WorkerEndpoint::resumes_any`).
    pub fn resumes_any(&self) -> bool {
        self.endpoint.resumes_any()
    }

    /// The worker serving the call (its address).
    pub fn worker(&self) -> &str {
        self.endpoint.addr()
    }

    /// Records a failure of the stream after its first event: a worker
    /// fault (the worker died, reset the stream, ended it unfinished)
    /// counts toward opening its circuit like one before the first token,
    /// so a worker that always fails mid-reply leaves selection. Client
    /// errors never count.
    pub fn record_stream_failure(&self, status: Option<&Status>) {
        let fault = status.is_none_or(|s| classify(s).worker_fault);
        if fault {
            self.endpoint.record_failure();
        }
    }
}
