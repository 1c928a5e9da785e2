//! `Idempotency-Key` on the generation creates, the HTTP side (the records
//! are `crate::idempotency`'s): the header read and checked, the key
//! claimed once the body is valid and before anything runs or is charged,
//! a retry answered from the record, and the claimant's [`Claim`], which
//! records a success's outcome or, on any other end, frees the key.
//!
//! The stages, in a create's order:
//! 1. [`requested`]: the header (400 when invalid) and the body's
//!    fingerprint, taken while the body is at hand;
//! 2. [`begin`]: claim, or answer from the record: the first's outcome
//!    (replayed, `idempotent-replayed: true`), 409 while it runs, 422 for
//!    another body under the same key;
//! 3. [`complete`] at a success, before its reply is sent; [`release`] at
//!    the end of the route for anything else.

use crate::accounts::Account;
use crate::api::responses::ResponseObject;
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Exchange, SseReply};
use crate::idempotency::{self, IdempotencyStore, KeyProblem, Outcome, Record};
use crate::sse;
use crate::translate::replay;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

/// The request header.
pub const HEADER: &str = "Idempotency-Key";

/// A claim's lease beyond the request's own deadline: the reply is sent
/// and the outcome recorded after the generation ends.
const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// The `retry-after` of a 409 while the first request runs.
const IN_USE_RETRY_AFTER_SECS: u64 = 2;

/// What a request with the header asks for: its key and what makes it
/// "the same request".
pub struct Requested {
    key: String,
    fingerprint: String,
}

/// The header, checked, with the fingerprint of `route` and `body`;
/// `None` without the header.
pub fn requested(ex: &Exchange, route: &str, body: &[u8]) -> Result<Option<Requested>, ApiError> {
    let mut values = ex.session.req_header().headers.get_all(HEADER).iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(super::duplicate_header(HEADER).with_param(HEADER));
    }
    let key = idempotency::parse_key(raw.as_bytes()).map_err(|problem| {
        let why = match problem {
            KeyProblem::Empty => "is empty",
            KeyProblem::TooLong => "is longer than 255 characters",
            KeyProblem::NotVisibleAscii => {
                "may hold only visible ASCII characters (no spaces or control characters)"
            }
        };
        ApiError::invalid_value(HEADER, format!("The '{HEADER}' header {why}."))
    })?;
    Ok(Some(Requested {
        key: key.to_owned(),
        fingerprint: idempotency::fingerprint(route, body),
    }))
}

/// 400: planner mode keeps its own session state and lock (`x-session-id`);
/// a key on it is refused rather than silently not honoured.
pub fn not_with_planner() -> ApiError {
    ApiError::new(
        400,
        "unsupported_parameter",
        format!("The '{HEADER}' header is not supported with 'planner_mode'; the session ('x-session-id') already serializes its requests."),
    )
    .with_param(HEADER)
}

/// What [`begin`] decided.
pub enum Begin {
    /// Run the request; with a key, the claim to complete or release.
    Run(Option<Claim>),
    /// A retry: answered from the record.
    Replayed,
}

/// The claim of a key by the request that runs under it. Dropped without
/// [`complete`] or [`release`] (a panic, a cancelled future), it frees
/// the key in the background.
pub struct Claim {
    store: Arc<dyn IdempotencyStore>,
    key: String,
    record: Record,
    keep: Duration,
    max_bytes: usize,
    settled: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (store, key, token) = (
            self.store.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.record.token),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store.release(&key, &token).await;
            });
        }
    }
}

/// Claims the key of `requested` for this request, or answers a retry
/// from the key's record. The claim is a lease of the request's deadline
/// plus a margin: a replica that dies mid-run frees the key by itself.
pub async fn begin(
    app: &App,
    ex: &mut Exchange,
    account: &Account,
    requested: Option<Requested>,
) -> Result<Begin, ApiError> {
    let Some(Requested { key, fingerprint }) = requested else {
        return Ok(Begin::Run(None));
    };
    let org = &account.principal.org;
    let key = idempotency::record_key(org, &key);
    let record = Record {
        token: idempotency::new_token(),
        fingerprint,
        outcome: None,
    };
    let lease = app.request_timeout() + LEASE_MARGIN;
    let Some(found) = app.idempotency.claim(&key, &record, lease).await? else {
        return Ok(Begin::Run(Some(Claim {
            store: app.idempotency.clone(),
            key,
            record,
            keep: Duration::from_secs(app.config.store.idempotency_window_seconds),
            max_bytes: app.config.store.idempotency_max_record_bytes,
            settled: false,
        })));
    };
    if found.fingerprint != record.fingerprint {
        return Err(ApiError::idempotency_key_reused());
    }
    match found.outcome {
        None => Err(ApiError::idempotency_key_in_use(IN_USE_RETRY_AFTER_SECS)),
        Some(outcome) => {
            replay(app, ex, org, outcome).await?;
            Ok(Begin::Replayed)
        }
    }
}

/// Records a success's outcome: from now on a retry gets it. Call it
/// before the reply goes out, so a retry that races the reply finds it.
/// A reply over the record's bound pins the key without it. A record
/// that cannot be written is logged: the claim's lease then frees the key.
pub async fn complete(claim: &mut Option<Claim>, outcome: Outcome) {
    let Some(mut claim) = claim.take() else {
        return;
    };
    claim.settled = true;
    let size = match &outcome {
        Outcome::Chat { body, .. } | Outcome::Response { body, .. } => body.len(),
        Outcome::Stored { .. } | Outcome::NotKept => 0,
    };
    claim.record.outcome = Some(if size > claim.max_bytes {
        Outcome::NotKept
    } else {
        outcome
    });
    match claim
        .store
        .complete(&claim.key, &claim.record, claim.keep)
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::warn!("an idempotency claim lapsed before its request finished"),
        Err(e) => tracing::warn!("an idempotency outcome was not recorded: {e}"),
    }
}

/// Frees the key of a request that did not succeed (refused, failed, or
/// its client left), so a retry runs. Nothing without a claim.
pub async fn release(claim: Option<Claim>) {
    let Some(mut claim) = claim else {
        return;
    };
    claim.settled = true;
    if let Err(e) = claim.store.release(&claim.key, &claim.record.token).await {
        // The lease frees it.
        tracing::warn!("an idempotency claim was not released: {e}");
    }
}

/// Sends the first request's outcome again, marked `idempotent-replayed`.
async fn replay(app: &App, ex: &mut Exchange, org: &str, outcome: Outcome) -> Result<(), ApiError> {
    ex.extra_headers
        .push(("idempotent-replayed", "true".to_owned()));
    match outcome {
        Outcome::Chat {
            body,
            stream: false,
        }
        | Outcome::Response {
            body,
            stream: false,
        } => {
            ex.send(200, "application/json", &[], Bytes::from(body))
                .await;
        }
        Outcome::Chat { body, stream: true } => {
            let mut reply = SseReply::new(ex, 0);
            reply.buf().extend_from_slice(body.as_bytes());
            end_stream(reply).await;
        }
        Outcome::Response { body, stream: true } => {
            let object: ResponseObject = serde_json::from_str(&body)
                .map_err(|_| ApiError::internal("An idempotency record could not be read."))?;
            send_events(ex, &object).await;
        }
        Outcome::Stored {
            response_id,
            stream,
            background,
        } => {
            let object = app.store.get(org, &response_id).await?.ok_or_else(|| {
                ApiError::new(
                    404,
                    "response_not_found",
                    format!("The response this 'Idempotency-Key' created ('{response_id}') was deleted or is no longer stored."),
                )
            })?;
            match (stream, background) {
                // The run's own log, from its first event, live while it runs.
                (true, true) => return super::follow::follow(app, ex, &response_id, None).await,
                (true, false) => send_events(ex, &object).await,
                (false, _) => ex.send_json(200, &object, &[]).await,
            }
        }
        Outcome::NotKept => return Err(ApiError::idempotency_result_not_kept()),
    }
    Ok(())
}

/// A finished response as its stream, folded (`translate::replay`).
async fn send_events(ex: &mut Exchange, object: &ResponseObject) {
    let mut reply = SseReply::new(ex, 0);
    for e in replay::response_events(object) {
        sse::event(reply.buf(), &e.name, &e.data);
    }
    end_stream(reply).await;
}

async fn end_stream(mut reply: SseReply<'_>) {
    match reply.write().await {
        Ok(()) => reply.end().await,
        Err(_) => reply.left(),
    }
}
