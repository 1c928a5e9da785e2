//! `Idempotency-Key` on the generation creates, the HTTP side (the records
//! are `crate::idempotency`'s): the header read and checked, the key
//! claimed once the body is valid and before anything runs or is charged,
//! a retry answered from the record, and the claimant's [`Claim`], which
//! records a success's outcome or, on any other end, frees the key.
//!
//! The stages, in a create's order:
//! 1. [`header`]: the header (400 when invalid), before the body is
//!    parsed; [`KeyHeader::with_body`]: the body's fingerprint, once the
//!    bounded parse accepted it (a body it refuses is never fingerprinted);
//! 2. [`begin`]: claim, or answer from the record: the first's outcome
//!    (replayed, `idempotent-replayed: true`), 409 while it runs, 422 for
//!    another body under the same key; a claim is charged to the
//!    organisation's storage cap, and refused at it;
//! 3. [`complete`] at a success, before its reply is sent; [`release`] at
//!    the end of the route for anything else.
//!
//! A claim is a short lease that this replica's heartbeat renews while the
//! request runs (`idempotency::claims`), so it frees within one lease of
//! its holder's loss.

use super::ending::end_stream;
use crate::accounts::Account;
use crate::api::responses::ResponseObject;
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Exchange, SseReply};
use crate::idempotency::claims::Claims;
use crate::idempotency::{self, KeyProblem, Outcome, Record};
use crate::lifecycle::Shutdown;
use crate::responses::KeepOutcome;
use crate::runs::stored::{FINISH_RETRY_FIRST, FINISH_RETRY_MAX, PATIENCE};
use crate::sse;
use crate::store::{ResponseStore, StoreError};
use crate::translate::replay;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The request header.
pub const HEADER: &str = "Idempotency-Key";

/// The `retry-after` of a 409 while the first request runs.
const IN_USE_RETRY_AFTER_SECS: u64 = 2;

/// A checked key, before the body is known to be acceptable.
pub struct KeyHeader(String);

/// What a request with the header asks for: its key and what makes it
/// "the same request".
pub struct Requested {
    key: String,
    fingerprint: String,
}

/// The header, checked; `None` without it.
pub fn header(ex: &Exchange) -> Result<Option<KeyHeader>, ApiError> {
    let mut values = ex.session.req_header().headers.get_all(HEADER).iter();
    let Some(raw) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(super::steps::duplicate_header(HEADER).with_param(HEADER));
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
    Ok(Some(KeyHeader(key.to_owned())))
}

impl KeyHeader {
    /// The key with the fingerprint of `route` and `body`. Call it only
    /// once the bounded parse accepted `body`: the fingerprint reads the
    /// whole body as JSON, which only the parse's bounds keep cheap.
    pub fn with_body(self, route: &str, body: &[u8]) -> Requested {
        Requested {
            key: self.0,
            fingerprint: idempotency::fingerprint(route, body),
        }
    }
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
    claims: Arc<Claims>,
    key: String,
    record: Record,
    keep: Duration,
    max_bytes: usize,
    /// The organisation's storage cap the record is charged to (0: none).
    cap: Cap,
    shutdown: Arc<Shutdown>,
    settled: bool,
}

/// Where and how much a record is charged ([`charge`]).
struct Cap {
    store: Arc<dyn ResponseStore>,
    org: Arc<str>,
    max_stored_bytes: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (claims, key, token) = (
            self.claims.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.record.token),
        );
        claims.let_go(&key, &token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = claims.store.release(&key, &token).await;
            });
        }
    }
}

/// Claims the key of `requested` for this request, or answers a retry
/// from the key's record. The claim is renewed until the request's
/// deadline and a lease; charged to the organisation's storage cap, and
/// refused (403 `storage_quota_exceeded`) at it.
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
    let claims = &app.idempotency;
    let renew_until = Instant::now() + app.request_timeout() + claims.lease();
    let Some(found) = claims.claim(&key, &record, renew_until).await? else {
        let claim = Claim {
            claims: claims.clone(),
            keep: Duration::from_secs(app.config.store.idempotency_window_seconds),
            max_bytes: app.config.store.idempotency_max_record_bytes,
            cap: Cap {
                store: app.store.clone(),
                org: org.clone(),
                max_stored_bytes: account.plan.max_stored_bytes,
            },
            shutdown: app.shutdown.clone(),
            settled: false,
            record,
            key,
        };
        let bytes = idempotency::record_bytes(&claim.key, &claim.record);
        if let Err(e) = charge(&claim.cap, bytes, claim.keep, true).await {
            release(Some(claim)).await;
            return Err(e.into());
        }
        return Ok(Begin::Run(Some(claim)));
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

/// Counts `bytes` of a key's record against its organisation's storage
/// cap, as a stored response's are (nothing without a cap). `enforced`:
/// refused past the cap (a new claim); else counted whatever (an outcome:
/// its request was admitted, so like a run that ends past the cap, the
/// next create is refused, not this reply).
async fn charge(cap: &Cap, bytes: usize, keep: Duration, enforced: bool) -> Result<(), StoreError> {
    if cap.max_stored_bytes == 0 {
        return Ok(());
    }
    let max = if enforced {
        cap.max_stored_bytes
    } else {
        u64::MAX
    };
    cap.store
        .charge_record(&cap.org, bytes as u64, max, keep)
        .await
}

/// Records a success's outcome: from now on a retry gets it. Call it
/// before the reply goes out, so a retry that races the reply finds it.
/// A reply over the record's bound pins the key without it; a kept one
/// is charged to the organisation's storage cap. A record the store does not take at once
/// is written in the background, retried until the store answers (the
/// claim renewed meanwhile), while the reply goes out.
pub async fn complete(claim: &mut Option<Claim>, outcome: Outcome) {
    let Some(mut claim) = claim.take() else {
        return;
    };
    claim.settled = true;
    let size = match &outcome {
        Outcome::Chat { body, .. } | Outcome::Response { body, .. } => body.len(),
        Outcome::Stored { .. } | Outcome::NotKept => 0,
    };
    if size > claim.max_bytes {
        claim.record.outcome = Some(Outcome::NotKept);
    } else {
        if let Err(e) = charge(&claim.cap, size, claim.keep, false).await {
            // Unmetered rather than unreplayable.
            tracing::warn!("an idempotency record was not charged: {e}");
        }
        claim.record.outcome = Some(outcome);
    }
    let (claims, key, record, keep) = (
        claim.claims.clone(),
        std::mem::take(&mut claim.key),
        std::mem::take(&mut claim.record),
        claim.keep,
    );
    match claims.store.complete(&key, &record, keep).await {
        Ok(written) => completed(&claims, &key, &record.token, written),
        Err(e) => {
            tracing::warn!("an idempotency outcome was not recorded, retrying: {e}");
            let in_flight = claim.shutdown.begin();
            tokio::spawn(async move {
                let give_up = tokio::time::Instant::now() + PATIENCE;
                let store = &claims.store;
                let written = crate::runs::retry_store(
                    &key,
                    give_up,
                    FINISH_RETRY_FIRST,
                    FINISH_RETRY_MAX,
                    || store.complete(&key, &record, keep),
                )
                .await;
                match written {
                    Ok(written) => completed(&claims, &key, &record.token, written),
                    Err(e) => {
                        // Its lease lapses, and a later retry runs again.
                        tracing::error!("gave up recording an idempotency outcome: {e}");
                        claims.let_go(&key, &record.token);
                    }
                }
                drop(in_flight);
            });
        }
    }
}

/// A Responses run's ending keeps its finished reply's outcome here.
impl KeepOutcome for Option<Claim> {
    fn wanted(&self) -> bool {
        self.is_some()
    }

    async fn keep(&mut self, outcome: Outcome) {
        complete(self, outcome).await
    }
}

/// The outcome write of `key` answered: the claim is no longer renewed.
fn completed(claims: &Claims, key: &str, token: &str, written: bool) {
    claims.let_go(key, token);
    if !written {
        tracing::warn!("an idempotency claim lapsed before its request finished");
    }
}

/// Frees the key of a request that did not succeed (refused, failed, or
/// its client left), so a retry runs. Nothing without a claim.
pub async fn release(claim: Option<Claim>) {
    let Some(mut claim) = claim else {
        return;
    };
    claim.settled = true;
    claim.claims.let_go(&claim.key, &claim.record.token);
    if let Err(e) = claim
        .claims
        .store
        .release(&claim.key, &claim.record.token)
        .await
    {
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
            end_stream(reply, None).await;
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
    end_stream(reply, None).await;
}
