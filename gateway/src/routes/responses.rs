//! The Responses API: `POST /v1/responses` (the request path, top to
//! bottom), retrieve (with replay of a background run's events), delete,
//! cancel, and input item listing.

pub(super) use super::conversation::{conversation, Conversation};
use super::follow::{follow, not_found};
use super::idempotent::{self, Begin, Claim};
use super::sinks::ResponseEvents;
use crate::accounts::{Account, ServiceTier};
use crate::api::responses::{
    CreateResponseRequest, DeletedResponse, InputItem, InputItemList, ResponseObject,
    ResponseStatus,
};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::generation::{self, End};
use crate::http::{Exchange, SseReply};
use crate::idempotency::Outcome as KeyOutcome;
use crate::ids::new_id;
use crate::limits::{estimate_input_tokens, Outcome};
use crate::runs::background::{BackgroundRun, Origin};
use crate::runs::{Cancel, NewRun, StoredRun};
use crate::translate::responses::{new_object, to_worker, ResponseEncoder};
use crate::validate::responses::ValidResponseRequest;
use crate::{parse, validate};
use inference_proto::v1 as pb;
use serde_json::Value;
use std::sync::Arc;

pub async fn create(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    // 1. Read, parse and validate; check the key may use this model (and
    //    read the `Idempotency-Key`, with the body's print).
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let key = idempotent::header(ex)?;
    let checked = check(app, &account, &body, &mut ex.model)?;
    // Printed only once the bounded parse accepted the body.
    let idempotency = key.map(|k| k.with_body("responses", &body));
    drop(body);

    // 2. With a key: claim it, or answer from the first request's record.
    let mut claim = match idempotent::begin(app, ex, &account, idempotency).await? {
        Begin::Run(claim) => claim,
        Begin::Replayed => return Ok(()),
    };
    let result = run(app, ex, &account, checked, &mut claim).await;
    // Anything but a success frees the key: a retry runs.
    idempotent::release(claim).await;
    result
}

/// Steps 3 to 7: the conversation, admission, the stored run, the
/// generation and the reply. A success records its outcome in `claim`.
async fn run(
    app: &App,
    ex: &mut Exchange,
    account: &Arc<Account>,
    checked: Checked,
    claim: &mut Option<Claim>,
) -> Result<(), ApiError> {
    let principal = account.principal.clone();
    let Checked {
        req,
        valid,
        input_estimate,
        sampling,
    } = checked;

    // 3. The conversation: the stored chain, then this input (bounded).
    let Conversation {
        context,
        input_items,
        tokens,
    } = conversation(app, &principal, &req, &valid, None).await?;
    let input_estimate = input_estimate.max(tokens);

    // 4. Admit under the plan's limits (sets the x-ratelimit-* headers).
    let reservation = super::admit(
        app,
        ex,
        account,
        valid.model,
        input_estimate,
        valid.max_output_tokens,
    )
    .await?;

    // 5. Translate; store the new response, owned here (its run lease).
    let mut work = to_worker(&req, &valid, &context, &ex.request_id);
    generation::session_affinity(&mut work, ex.session_id());
    let status = if valid.background {
        ResponseStatus::Queued
    } else {
        ResponseStatus::InProgress
    };
    let (object, tier) = response_object(account, &req, &valid, status, sampling);
    let id = object.id.clone();
    drop(req);
    let run = if valid.store {
        match store_run(app, account, &object, &input_items, &context).await {
            Ok(run) => Some(run),
            Err(e) => {
                reservation.settle(Outcome::NotRun).await;
                return Err(e);
            }
        }
    } else {
        None
    };
    let encoder = ResponseEncoder::new(object.clone(), valid.format.clone());

    // 6a. Background (always stored): the run goes on without this request.
    if valid.background {
        let Some(run) = run else {
            reservation.settle(Outcome::NotRun).await;
            // Validation refuses `background` without `store`.
            return Err(ApiError::internal("a background response is always stored"));
        };
        let background = BackgroundRun {
            runs: app.runs.clone(),
            pools: app.pools.clone(),
            model: valid.model,
            work,
            trace: ex.trace,
            encoder,
            run,
            reservation,
            timeout: app.request_timeout(),
            tier,
            in_flight: app.shutdown.begin(),
            shutdown: app.shutdown.clone(),
            origin: Origin {
                key_digest: key_digest(ex),
                format: valid.format.clone(),
                input_estimate,
                max_output_tokens: valid.max_output_tokens,
            },
            resumed: false,
        };
        tokio::spawn(background.drive());
        // A retry gets this run: its object, or its stream from the start.
        let outcome = KeyOutcome::Stored {
            response_id: id.clone(),
            stream: valid.stream,
            background: true,
        };
        idempotent::complete(claim, outcome).await;
        if valid.stream {
            return follow(app, ex, &id, None).await;
        }
        ex.send_json(200, &object, &[]).await;
        return Ok(());
    }

    // 6b. In the foreground: relay to this client.
    let generation = super::generation(app, ex, valid.model.id, work, valid.stream, tier);
    let mut events = ResponseEvents::new(ex, encoder, valid.stream, app.shutdown.clone());
    // The stream's last batch waits for the store (a client that reads
    // the terminal event and at once retrieves the response, or chains to
    // it, finds it finished), and with a key for the record too (step 7).
    let end = generation.run(reservation, &mut events).await;
    if matches!(end, End::Gone) && events.cut.happened() {
        if let Some(object) = end_cut(app, events, run, valid.stream).await? {
            ex.send_json(200, &object, &[]).await;
        }
        return Ok(());
    }
    let ResponseEvents {
        reply,
        mut encoder,
        ..
    } = events;
    let finished = matches!(end, End::Finished(_)) && encoder.failure().is_none();
    let (result, held) = match end {
        End::NotStarted(e) => {
            drop(reply);
            encoder.fail(&e, &mut Vec::new());
            end_stored(app, run, &encoder).await;
            return Err(e);
        }
        End::Gone => {
            reply.left();
            if let Some(run) = run {
                run.cancel(encoder.object, app.shutdown.begin()).await;
            }
            return Ok(());
        }
        End::Finished(_) if valid.stream => (Ok(()), Some(reply)),
        End::Finished(_) => {
            drop(reply);
            (Ok(()), None)
        }
        End::Failed(e) if valid.stream => {
            reply.end_failed(e.status).await;
            (Ok(()), None)
        }
        End::Failed(e) => {
            drop(reply);
            (Err(e), None)
        }
    };
    end_stored(app, run, &encoder).await;
    // 7. A finished reply (completed, or incomplete at its length) is the
    //    outcome a retry with its key gets: the stored response, or this
    //    object when it was not stored. Recorded before the stream's last
    //    batch goes out, so a client retrying as soon as it read the
    //    terminal event finds it.
    if finished && claim.is_some() {
        let outcome = if valid.store {
            KeyOutcome::Stored {
                response_id: id,
                stream: valid.stream,
                background: false,
            }
        } else {
            KeyOutcome::Response {
                body: serde_json::to_string(&encoder.object)
                    .map_err(|_| ApiError::internal("could not encode the response"))?,
                stream: valid.stream,
            }
        };
        idempotent::complete(claim, outcome).await;
    }
    if let Some(mut reply) = held {
        if reply.write().await.is_err() {
            reply.left();
            return Ok(());
        }
        end_stream(reply, &encoder).await;
    }
    match result {
        Err(e) => Err(e),
        Ok(()) if valid.stream => Ok(()),
        // A reply that failed its output check is a server error, never a success.
        Ok(()) => match encoder.failure() {
            Some(e) => Err(e.clone()),
            None => {
                ex.send_json(200, &encoder.object, &[]).await;
                Ok(())
            }
        },
    }
}

/// Ends a finished stream: a reply that failed its output check ended
/// `response.failed`, and the request is recorded with its status.
async fn end_stream(reply: SseReply<'_>, encoder: &ResponseEncoder) {
    match encoder.failure() {
        Some(e) => reply.end_failed(e.status).await,
        None => reply.end().await,
    }
}

/// The drain's grace period ran out before the generation finished. A
/// reply that had started ends `incomplete` with the output its client
/// got (`response.incomplete` as the stream's last event, or the object as
/// the body), and the store keeps exactly that. One cut before the worker
/// started delivered nothing: a 503 the client retries, stored `failed`.
/// Returns the body of a reply that is not streamed.
async fn end_cut(
    app: &App,
    mut events: ResponseEvents<'_>,
    run: Option<StoredRun>,
    stream: bool,
) -> Result<Option<ResponseObject>, ApiError> {
    if events.encoder.next_seq() == 0 {
        let ResponseEvents {
            reply, mut encoder, ..
        } = events;
        drop(reply);
        let e = ApiError::replica_shutdown();
        encoder.fail(&e, &mut Vec::new());
        end_stored(app, run, &encoder).await;
        return Err(e);
    }
    // Stored first: the replica is about to exit, and a client that reads
    // the final event and asks another replica must find what it was told.
    events.stop_early();
    end_stored(app, run, &events.encoder).await;
    let ResponseEvents {
        mut reply, encoder, ..
    } = events;
    if stream {
        let _ = reply.write().await;
        reply.end().await;
    } else {
        drop(reply);
    }
    Ok((!stream).then_some(encoder.object))
}

/// The sha256 of the request's bearer key (authorized already), for a
/// peer that takes its background run over to admit and bill it the same.
fn key_digest(ex: &Exchange) -> [u8; 32] {
    let token = crate::auth::bearer_token(ex.header("authorization")).unwrap_or_default();
    crate::auth::hash_key(token)
}

/// A create body parsed and validated, its model allowed for the key and
/// served by workers: step 1 of the request path, whatever the transport
/// (a POST body, or a WebSocket `response.create` message).
pub(super) struct Checked {
    pub req: CreateResponseRequest,
    pub valid: ValidResponseRequest,
    /// Input tokens reserved on admission, from the body's size.
    pub input_estimate: u64,
    /// What the model's workers apply to sampling values left unset.
    pub sampling: pb::SamplingDefaults,
}

/// Parses and validates a create body (its model becomes `model_label`, the
/// metrics' label, as soon as it is known).
pub(super) fn check(
    app: &App,
    account: &Account,
    body: &[u8],
    model_label: &mut &'static str,
) -> Result<Checked, ApiError> {
    let req: CreateResponseRequest = parse::json_body(body)?;
    let input_estimate = estimate_input_tokens(body.len());
    let valid = validate::responses::validate(&app.catalog, &req)?;
    *model_label = valid.model.id;
    account.check_model(valid.model.id)?;
    if valid.background && app.shutdown.is_draining() {
        return Err(ApiError::overloaded(
            "This gateway replica is shutting down and takes no new background runs; retry.",
        ));
    }
    // A model without workers is refused before anything is stored.
    let sampling = generation::pool_of(&app.pools, valid.model.id)?.sampling_defaults();
    Ok(Checked {
        req,
        valid,
        input_estimate,
        sampling,
    })
}

/// A new response object with a fresh id, served at the tier it asked for
/// as far as its plan allows.
pub(super) fn response_object(
    account: &Account,
    req: &CreateResponseRequest,
    valid: &ValidResponseRequest,
    status: ResponseStatus,
    sampling: pb::SamplingDefaults,
) -> (ResponseObject, ServiceTier) {
    let mut object = new_object(new_id("resp_"), req, valid, status, sampling);
    let tier = account.plan.service_tier(req.service_tier.as_deref());
    object.service_tier = tier.as_str().to_owned();
    (object, tier)
}

/// Stores a new response, owned by this request (its run lease).
pub(super) async fn store_run(
    app: &App,
    account: &Account,
    object: &ResponseObject,
    input_items: &[InputItem],
    context: &[InputItem],
) -> Result<StoredRun, ApiError> {
    Ok(StoredRun::create(
        &app.runs,
        NewRun {
            org: &account.principal.org,
            object,
            input_items,
            context,
            run_timeout: app.request_timeout(),
            max_stored_bytes: account.plan.max_stored_bytes,
        },
    )
    .await?)
}

/// Records the final object of a foreground stored response: what its
/// client is told is what the store keeps, retried in the background if
/// the store does not answer now ([`StoredRun::finish`]).
pub(super) async fn end_stored(app: &App, run: Option<StoredRun>, encoder: &ResponseEncoder) {
    if let Some(run) = run {
        run.finish(encoder.object.clone(), app.shutdown.begin())
            .await;
    }
}

/// `GET /v1/responses/{id}` (`?stream=true&starting_after=N` for background runs).
pub async fn retrieve(
    app: &App,
    ex: &mut Exchange,
    principal: Principal,
    id: &str,
) -> Result<(), ApiError> {
    let query = Query::parse(ex.query());
    let stream = query.bool("stream")?.unwrap_or(false);
    let starting_after = query.u64("starting_after")?;
    let object = app
        .store
        .get(&principal.org, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    if !stream {
        ex.send_json(200, &object, &[]).await;
        return Ok(());
    }
    if !object.background {
        return Err(ApiError::invalid_value(
            "stream",
            "Only responses created with 'background': true can be streamed on retrieve.",
        ));
    }
    // An ended run's log is complete: a cursor past its last event would
    // give an empty stream without a terminal event, so name the cursor.
    if let Some(before) = starting_after.and_then(|n| n.checked_sub(1)) {
        if object.is_terminal() && app.store.read_events(id, Some(before), 1).await?.is_empty() {
            return Err(ApiError::invalid_value(
                "starting_after",
                "'starting_after' is beyond the last event of this response's stream.",
            ));
        }
    }
    follow(app, ex, id, starting_after).await
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    app: &App,
    ex: &mut Exchange,
    principal: Principal,
    id: &str,
) -> Result<(), ApiError> {
    if !app.runs.delete(&principal.org, id).await? {
        return Err(not_found(id));
    }
    ex.send_json(
        200,
        &DeletedResponse {
            id,
            object: "response",
            deleted: true,
        },
        &[],
    )
    .await;
    Ok(())
}

/// `POST /v1/responses/{id}/cancel`: a running background response ends
/// `cancelled`, exactly once; its owner (on any replica) notices and stops
/// the generation.
pub async fn cancel(
    app: &App,
    ex: &mut Exchange,
    principal: Principal,
    id: &str,
) -> Result<(), ApiError> {
    let not_cancellable = |o: &ResponseObject| {
        ApiError::new(
            400,
            "response_not_cancellable",
            if o.background {
                format!("Response '{id}' is already {}; only a queued or in-progress background response can be cancelled.", o.status)
            } else {
                format!("Response '{id}' was not created with 'background': true; only background responses can be cancelled.")
            },
        )
    };
    match app.runs.cancel(&principal.org, id).await? {
        Cancel::Cancelled(cancelled) => {
            ex.send_json(200, &cancelled, &[]).await;
            Ok(())
        }
        Cancel::NotCancellable(object) => Err(not_cancellable(&object)),
        Cancel::NotFound => Err(not_found(id)),
    }
}

/// `GET /v1/responses/{id}/input_items?after&limit&order&include`.
pub async fn input_items(
    app: &App,
    ex: &mut Exchange,
    principal: Principal,
    id: &str,
) -> Result<(), ApiError> {
    let query = Query::parse(ex.query());
    let limit = query.u64("limit")?.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid_value(
            "limit",
            format!("'limit' must be between 1 and 100, got {limit}."),
        ));
    }
    let order = query.get("order").unwrap_or("desc");
    if order != "asc" && order != "desc" {
        return Err(ApiError::invalid_value(
            "order",
            "'order' must be 'asc' or 'desc'.",
        ));
    }
    let items = app
        .store
        .input_items(&principal.org, id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let mut data: Vec<Value> = items
        .iter()
        .filter_map(|i| serde_json::to_value(i).ok())
        .collect();
    if order == "desc" {
        data.reverse();
    }
    let start = match query.get("after") {
        Some(after) => data
            .iter()
            .position(|v| v["id"].as_str() == Some(after))
            .map_or(data.len(), |p| p + 1),
        None => 0,
    };
    let page = &data[start..(start + limit as usize).min(data.len())];
    let has_more = start + page.len() < data.len();
    let list = InputItemList {
        object: "list",
        data: page,
        first_id: page.first().and_then(|v| v["id"].as_str()),
        last_id: page.last().and_then(|v| v["id"].as_str()),
        has_more,
    };
    ex.send_json(200, &list, &[]).await;
    Ok(())
}

/// A parsed query string (percent-decoded).
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(
            q.unwrap_or_default()
                .split('&')
                .filter(|s| !s.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some("true") | Some("1") => Ok(Some(true)),
            Some("false") | Some("0") => Ok(Some(false)),
            Some(_) => Err(ApiError::invalid_value(
                key,
                format!("'{key}' must be true or false."),
            )),
        }
    }

    fn u64(&self, key: &str) -> Result<Option<u64>, ApiError> {
        self.get(key)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::invalid_value(key, format!("'{key}' must be a non-negative integer."))
                })
            })
            .transpose()
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parsing() {
        let q = Query::parse(Some("stream=true&starting_after=3&include%5B%5D=a%20b"));
        assert_eq!(q.bool("stream").unwrap(), Some(true));
        assert_eq!(q.u64("starting_after").unwrap(), Some(3));
        assert_eq!(q.get("include[]"), Some("a b"));
        assert!(Query::parse(Some("limit=x")).u64("limit").is_err());
    }
}
