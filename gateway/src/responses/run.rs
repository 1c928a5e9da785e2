//! Steps 2 to 4 of the path: admission, the start (worker request,
//! response object, stored run), and the run: driven to its one ending in
//! the foreground, or detached into the store.

use super::prepare::Prepared;
use super::Services;
use crate::accounts::{Account, ServiceTier};
use crate::api::responses::{EncodedEvent, InputItem, ResponseObject, ResponseStatus};
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::{self, End, Generation, Gone, Sink};
use crate::idempotency::Outcome as KeyOutcome;
use crate::ids::new_id;
use crate::limits::{Outcome, Refused, Reservation};
use crate::output_check::OutputFormat;
use crate::runs::background::{BackgroundRun, Origin};
use crate::runs::{NewRun, StoredRun, REPLICA_SHUTDOWN};
use crate::translate::responses::{new_object, to_worker, usage, ResponseEncoder};
use inference_proto::v1 as pb;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemetry::TraceParent;

/// What the transport knows of one request.
pub struct Request<'r> {
    pub request_id: &'r str,
    /// The prefix-affinity key when the body names no `prompt_cache_key`:
    /// the session (`x-session-id`), or a WebSocket connection's own.
    pub session: Option<&'r str>,
    /// Sent to the worker as `traceparent`.
    pub trace: TraceParent,
    /// When the request started, for the time to first token (a streamed
    /// reply; `None` for one that comes in one piece).
    pub timed_from: Option<Instant>,
}

/// Admits a prepared create under its plan's limits, reserving
/// `max_output` output tokens: a reservation, or a refusal (either keeps
/// its `x-ratelimit-*` headers for a transport that sends them).
pub async fn admit(
    svc: &Services<'_>,
    account: &Arc<Account>,
    prepared: &Prepared,
    request_id: &str,
    max_output: u32,
) -> Result<Reservation, Refused> {
    svc.limiter
        .admit_request(
            account,
            prepared.valid.model,
            request_id.to_owned(),
            prepared.input_estimate,
            max_output,
        )
        .await
}

/// An admitted generation before it runs: what a create starts, and what
/// a peer's adoption of a handed-over run continues.
pub struct Admitted {
    /// The hold on the plan's limits, settled however the run ends.
    pub reservation: Reservation,
    pub model: &'static ModelSpec,
    pub work: pb::GenerateRequest,
    /// Its place in the order of a saturated pool.
    pub tier: ServiceTier,
    pub trace: TraceParent,
}

impl Admitted {
    /// The run goes on without a client, into its stored event log (a
    /// background create, or a run adopted from a peer: `resumed`, its
    /// log already opened), within `timeout`.
    pub fn detach(
        self,
        svc: &Services<'_>,
        stored: StoredRun,
        encoder: ResponseEncoder,
        origin: Origin,
        timeout: Duration,
        resumed: bool,
    ) -> BackgroundRun {
        BackgroundRun {
            runs: svc.runs.clone(),
            pools: svc.pools.clone(),
            model: self.model,
            work: self.work,
            trace: self.trace,
            encoder,
            run: stored,
            reservation: self.reservation,
            timeout,
            tier: self.tier,
            in_flight: svc.shutdown.begin(),
            shutdown: svc.shutdown.clone(),
            origin,
            resumed,
        }
    }
}

/// A response started: its encoder, for the transport's sink, and its run.
pub struct Started {
    pub encoder: ResponseEncoder,
    /// What the model is given (the conversation, then this input), for a
    /// transport that keeps the conversation.
    pub context: Vec<InputItem>,
    pub run: Run,
}

/// A started response's generation: driven to its end in the foreground
/// ([`Run::drive`]) or detached ([`Run::detach`]).
pub struct Run {
    admitted: Admitted,
    stored: Option<StoredRun>,
    timed_from: Option<Instant>,
    id: String,
    stream: bool,
    format: OutputFormat,
    input_estimate: u64,
    max_output_tokens: u32,
}

/// Translates an admitted create into its worker request (with the
/// session's affinity), makes its response object (`queued` for a
/// background one) and stores it when asked, owned by this replica (its
/// run lease). A store that refuses settles the reservation unused.
pub async fn start(
    svc: &Services<'_>,
    account: &Account,
    prepared: Prepared,
    reservation: Reservation,
    request: Request<'_>,
) -> Result<Started, ApiError> {
    let status = if prepared.valid.background {
        ResponseStatus::Queued
    } else {
        ResponseStatus::InProgress
    };
    let (
        Created {
            object,
            tier,
            stored,
        },
        reservation,
    ) = create(svc, account, &prepared, status, reservation).await?;
    let Prepared {
        req,
        valid,
        input_estimate,
        context,
        ..
    } = prepared;
    let mut work = to_worker(&req, &valid, &context, request.request_id);
    generation::session_affinity(&mut work, request.session);
    drop(req);
    let id = object.id.clone();
    Ok(Started {
        encoder: ResponseEncoder::new(object, valid.format.clone()),
        context,
        run: Run {
            admitted: Admitted {
                reservation,
                model: valid.model,
                work,
                tier,
                trace: request.trace,
            },
            stored,
            timed_from: request.timed_from,
            id,
            stream: valid.stream,
            format: valid.format,
            input_estimate,
            max_output_tokens: valid.max_output_tokens,
        },
    })
}

/// How a response driven in the foreground ended, once stored (and its
/// held end released): what the transport has left to write.
#[derive(Debug)]
pub enum Ended {
    /// The worker finished: completed, or incomplete at its length; or it
    /// failed its output check (`encoder.failure()`, delivered in band).
    Finished,
    /// The worker failed after its first event; the sink delivered the
    /// failure in band.
    Failed(ApiError),
    /// Nothing was delivered: no worker started it, or the drain cut it
    /// before one did (503 `replica_shutdown`, which a client retries).
    /// Stored `failed`; the transport answers with the error.
    NotStarted(ApiError),
    /// The client went away (a stored run is cancelled), or went before
    /// the held end reached it.
    Gone,
    /// The drain's grace period ran out mid-generation: the reply ended
    /// `incomplete` with the output its client got (`response.incomplete`
    /// last, released), and the store keeps exactly that.
    Cut,
}

/// A sink of Responses events (a stream of any transport, or the object
/// folded), as the one ending needs it.
pub trait ResponseSink: Sink {
    /// The encoder, and the frames it encoded not yet taken.
    fn frames(&mut self) -> (&mut ResponseEncoder, &mut Vec<EncodedEvent>);
    /// Takes the encoded frames into the pending output (the next
    /// delivery's, or the held end's).
    fn take_frames(&mut self);
    /// Sends what is pending (the held end); `Err` when the client left.
    fn release(&mut self) -> impl Future<Output = Result<(), Gone>> + Send;

    fn encoder(&mut self) -> &mut ResponseEncoder {
        self.frames().0
    }

    /// Ends a reply the drain cut: `response.incomplete` with the output
    /// delivered, pending like a held end.
    fn stop_early(&mut self) {
        let (encoder, frames) = self.frames();
        encoder.stop_early(REPLICA_SHUTDOWN, frames);
        self.take_frames();
    }
}

/// Where a finished reply's idempotency outcome goes before its held end
/// is released: an `Idempotency-Key`'s claim (a route's), or nowhere
/// ([`NoKey`]). Kept before the end goes out, so a client that retries as
/// soon as it has read it finds the outcome.
pub trait KeepOutcome: Send {
    /// Whether an outcome is kept (only then is it made).
    fn wanted(&self) -> bool;
    fn keep(&mut self, outcome: KeyOutcome) -> impl Future<Output = ()> + Send;
}

/// A request without an `Idempotency-Key`.
pub struct NoKey;

impl KeepOutcome for NoKey {
    fn wanted(&self) -> bool {
        false
    }

    async fn keep(&mut self, _outcome: KeyOutcome) {}
}

impl Run {
    /// Drives the generation through the one driver into `sink`, then ends
    /// it the one way: the end folded, stored first (a client that reads
    /// the end and at once retrieves the response, or chains to it, finds
    /// it), a finished reply's outcome kept for its key, then the held end
    /// released.
    pub async fn drive<S: ResponseSink>(
        self,
        svc: &Services<'_>,
        sink: &mut S,
        key: &mut impl KeepOutcome,
    ) -> Ended {
        let Run {
            admitted,
            stored,
            timed_from,
            id,
            stream,
            ..
        } = self;
        let generation = Generation {
            pools: svc.pools,
            model: admitted.model.id,
            work: admitted.work,
            trace: admitted.trace,
            deadline: tokio::time::Instant::now() + svc.request_timeout,
            timed_from,
            tier: admitted.tier,
        };
        let end = generation.run(admitted.reservation, sink).await;
        let ended = match end {
            End::Gone if sink.cut_by_replica() => {
                if sink.encoder().next_seq() == 0 {
                    Ended::NotStarted(ApiError::replica_shutdown())
                } else {
                    sink.stop_early();
                    Ended::Cut
                }
            }
            End::Gone => {
                if let Some(run) = stored {
                    let object = sink.encoder().object.clone();
                    run.cancel(object, svc.shutdown.begin()).await;
                }
                return Ended::Gone;
            }
            End::NotStarted(e) => Ended::NotStarted(e),
            End::Finished(_) => Ended::Finished,
            End::Failed(e) => Ended::Failed(e),
        };
        if let Ended::NotStarted(e) = &ended {
            sink.encoder().fail(e, &mut Vec::new());
        }
        // Stored first: what its client is told is what the store keeps
        // (retried in the background if the store does not answer now).
        let is_stored = stored.is_some();
        if let Some(run) = stored {
            let object = sink.encoder().object.clone();
            run.finish(object, svc.shutdown.begin()).await;
        }
        let encoder = sink.encoder();
        if matches!(ended, Ended::Finished) && encoder.failure().is_none() && key.wanted() {
            if let Some(outcome) = outcome(&encoder.object, id, stream, is_stored) {
                key.keep(outcome).await;
            }
        }
        if matches!(ended, Ended::Finished | Ended::Cut) && sink.release().await.is_err() {
            return Ended::Gone;
        }
        ended
    }

    /// A background create: the run goes on without its client
    /// ([`Admitted::detach`]); `key_digest` is the creating key's, for a
    /// peer that takes the run over on a drain.
    pub async fn detach(
        self,
        svc: &Services<'_>,
        encoder: ResponseEncoder,
        key_digest: [u8; 32],
    ) -> Result<BackgroundRun, ApiError> {
        let Some(stored) = self.stored else {
            self.admitted.reservation.settle(Outcome::NotRun).await;
            // Validation refuses `background` without `store`.
            return Err(ApiError::internal("a background response is always stored"));
        };
        let origin = Origin {
            key_digest,
            format: self.format,
            input_estimate: self.input_estimate,
            max_output_tokens: self.max_output_tokens,
        };
        Ok(self
            .admitted
            .detach(svc, stored, encoder, origin, svc.request_timeout, false))
    }
}

/// The outcome a retry with a finished reply's key gets: the stored
/// response, or this object when it was not stored.
fn outcome(
    object: &ResponseObject,
    response_id: String,
    stream: bool,
    stored: bool,
) -> Option<KeyOutcome> {
    if stored {
        return Some(KeyOutcome::Stored {
            response_id,
            stream,
            background: false,
        });
    }
    match serde_json::to_string(object) {
        Ok(body) => Some(KeyOutcome::Response { body, stream }),
        Err(e) => {
            // Not kept: the key is freed, and a retry runs again.
            tracing::warn!("a response could not be encoded for its idempotency record: {e}");
            None
        }
    }
}

/// A response prepared without generating (a WebSocket `generate: false`):
/// created and completed with no output and no worker call, stored when
/// asked, so a later request can chain from its id. The reservation
/// settles `Prepared` (the input was taken in), or unused when the store
/// refuses. Returns the object as created, as completed, and its context.
pub async fn warm_up(
    svc: &Services<'_>,
    account: &Account,
    prepared: Prepared,
    reservation: Reservation,
) -> Result<(ResponseObject, ResponseObject, Vec<InputItem>), ApiError> {
    let (
        Created {
            mut object, stored, ..
        },
        reservation,
    ) = create(
        svc,
        account,
        &prepared,
        ResponseStatus::InProgress,
        reservation,
    )
    .await?;
    let created = object.clone();
    object.usage = Some(usage(&pb::Usage::default()));
    object.end(ResponseStatus::Completed);
    if let Some(run) = stored {
        run.finish(object.clone(), svc.shutdown.begin()).await;
    }
    reservation.settle(Outcome::Prepared).await;
    Ok((created, object, prepared.context))
}

/// A new response, as [`create`] made it.
struct Created {
    object: ResponseObject,
    /// Served at the tier it asked for, as far as its plan allows.
    tier: ServiceTier,
    stored: Option<StoredRun>,
}

/// Makes a prepared create's response object (a fresh id, `status`) and
/// stores it when asked, owned by this request (its run lease). A store
/// that refuses settles the reservation unused.
async fn create(
    svc: &Services<'_>,
    account: &Account,
    prepared: &Prepared,
    status: ResponseStatus,
    reservation: Reservation,
) -> Result<(Created, Reservation), ApiError> {
    let Prepared {
        req,
        valid,
        sampling,
        context,
        input_items,
        ..
    } = prepared;
    let mut object = new_object(new_id("resp_"), req, valid, status, *sampling);
    let tier = account.plan.service_tier(req.service_tier.as_deref());
    object.service_tier = tier.as_str().to_owned();
    if !valid.store {
        let created = Created {
            object,
            tier,
            stored: None,
        };
        return Ok((created, reservation));
    }
    let stored = StoredRun::create(
        svc.runs,
        NewRun {
            org: &account.principal.org,
            object: &object,
            input_items,
            context,
            run_timeout: svc.request_timeout,
            max_stored_bytes: account.plan.max_stored_bytes,
        },
    )
    .await;
    match stored {
        Ok(run) => {
            let created = Created {
                object,
                tier,
                stored: Some(run),
            };
            Ok((created, reservation))
        }
        Err(e) => {
            reservation.settle(Outcome::NotRun).await;
            Err(e.into())
        }
    }
}
