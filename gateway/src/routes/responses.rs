//! The Responses API over HTTP: `POST /v1/responses` (the transport of
//! the Responses path, `crate::responses`), retrieve (with replay of a
//! background run's events), delete, cancel, and input item listing.

use super::ending::end_stream;
use super::follow::{follow, not_found};
use super::idempotent::{self, Begin, Claim};
use super::sinks::ResponseEvents;
use super::steps;
use crate::accounts::Account;
use crate::api::responses::{DeletedResponse, InputItemList, ResponseObject};
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::http::Exchange;
use crate::idempotency::Outcome as KeyOutcome;
use crate::responses::{self, Checked, Ended, Request, Started};
use crate::runs::Cancel;
use serde_json::Value;
use std::sync::Arc;

pub async fn create(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    // 1. Read, parse and validate; check the key may use this model (and
    //    read the `Idempotency-Key`, with the body's print).
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let key = idempotent::header(ex)?;
    let checked = responses::check(&app.responses(), &account, &body, &mut ex.model)?;
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
    let svc = app.responses();
    // 3. The conversation: the stored chain, then this input (bounded).
    let prepared = responses::prepare(&svc, &account.principal, checked, None).await?;
    let (stream, background) = (prepared.valid.stream, prepared.valid.background);

    // 4. Admit under the plan's limits (sets the x-ratelimit-* headers).
    let max_output = prepared.valid.max_output_tokens;
    let admitted = responses::admit(&svc, account, &prepared, &ex.request_id, max_output).await;
    let reservation = steps::admitted(ex, admitted)?;

    // 5. Translate; store the new response, owned here (its run lease).
    let request = Request {
        request_id: &ex.request_id,
        session: ex.session_id(),
        trace: ex.trace,
        timed_from: stream.then_some(ex.started),
    };
    let Started { encoder, run, .. } =
        responses::start(&svc, account, prepared, reservation, request).await?;

    // 6a. Background (always stored): the run goes on without this request.
    if background {
        let object = encoder.object.clone();
        tokio::spawn(run.detach(&svc, encoder, key_digest(ex)).await?.drive());
        // A retry gets this run: its object, or its stream from the start.
        let outcome = KeyOutcome::Stored {
            response_id: object.id.clone(),
            stream,
            background: true,
        };
        idempotent::complete(claim, outcome).await;
        if stream {
            return follow(app, ex, &object.id, None).await;
        }
        ex.send_json(200, &object, &[]).await;
        return Ok(());
    }

    // 6b. In the foreground: relay to this client. The one ending stores
    //     the end, then (7.) records a finished reply's outcome for its
    //     key, then lets the stream's last batch go out.
    let mut events = ResponseEvents::new(ex, encoder, stream, app.shutdown.clone());
    let ended = run.drive(&svc, &mut events, claim).await;
    let ResponseEvents { reply, encoder, .. } = events;
    match ended {
        Ended::NotStarted(e) => {
            drop(reply);
            Err(e)
        }
        Ended::Gone => {
            reply.left();
            Ok(())
        }
        Ended::Failed(e) if stream => {
            reply.end_failed(e.status).await;
            Ok(())
        }
        Ended::Failed(e) => {
            drop(reply);
            Err(e)
        }
        // The drain cut it: `response.incomplete` went out last.
        Ended::Cut if stream => {
            reply.end().await;
            Ok(())
        }
        Ended::Finished if stream => {
            // A reply that failed its output check ended `response.failed`.
            end_stream(reply, encoder.failure().map(|e| e.status)).await;
            Ok(())
        }
        Ended::Cut | Ended::Finished => {
            drop(reply);
            // A reply that failed its output check is a server error, never a success.
            match encoder.failure() {
                Some(e) => Err(e.clone()),
                None => {
                    ex.send_json(200, &encoder.object, &[]).await;
                    Ok(())
                }
            }
        }
    }
}

/// The sha256 of the request's bearer key (authorized already), for a
/// peer that takes its background run over to admit and bill it the same.
fn key_digest(ex: &Exchange) -> [u8; 32] {
    let token = crate::auth::bearer_token(ex.header("authorization")).unwrap_or_default();
    crate::auth::hash_key(token)
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
