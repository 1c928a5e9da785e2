//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: the Anthropic
//! Messages API over the same path as chat completions (read →
//! idempotency → parse → validate → admit → translate → the one generation
//! driver over a sink → reply). Only the wire format differs: the request
//! (`api::messages`, `validate::messages`), its translation
//! (`translate::messages`), the sinks, and the error envelope (the route's
//! `Dialect::Anthropic`, rendered by `error::anthropic`).

use super::idempotent::{self, Begin, Claim};
use super::sinks::{FoldedBody, MessagesStream};
use super::steps;
use crate::accounts::Account;
use crate::api::messages::{MessagesRequest, TokenCount};
use crate::app::App;
use crate::error::ApiError;
use crate::generation;
use crate::http::Exchange;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::translate::messages::stream::{self, MessagesStreamEncoder};
use crate::translate::messages::{to_worker, MessageAggregate};
use crate::validate::messages::ValidMessagesRequest;
use crate::{parse, validate};
use std::sync::Arc;

/// The idempotency fingerprint's route name.
const ROUTE: &str = "messages.create";

pub async fn create(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    // 1. Read and parse (and the `Idempotency-Key`, with the body's print).
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let key = idempotent::header(ex)?;
    let req: MessagesRequest = parse::json_body(&body)?;
    // Printed only once the bounded parse accepted the body.
    let idempotency = key.map(|k| k.with_body(ROUTE, &body));
    let input_estimate = estimate_input_tokens(body.len());
    drop(body);

    // 2. Validate, and check the key may use this model.
    let valid = validate::messages::validate(&app.catalog, &req)?;
    ex.model = valid.model.id;
    account.check_model(valid.model.id)?;

    // 3. With a key: claim it, or answer from the first request's record.
    let mut claim = match idempotent::begin(app, ex, &account, idempotency).await? {
        Begin::Run(claim) => claim,
        Begin::Replayed => return Ok(()),
    };
    let result = generate(app, ex, &account, req, valid, input_estimate, &mut claim).await;
    // Anything but a success frees the key: a retry runs.
    idempotent::release(claim).await;
    result
}

/// Claude Code names its session (`X-Claude-Code-Session-Id`): its turns
/// resend the whole conversation, so they keep to the engine holding it.
fn session(ex: &Exchange) -> Option<String> {
    ex.header("x-claude-code-session-id")
        .and_then(|v| std::str::from_utf8(v).ok())
        .or_else(|| ex.session_id())
        .map(str::to_owned)
}

/// Admission, the generation, the reply. A success records its outcome
/// in `claim` before its reply is sent.
async fn generate(
    app: &App,
    ex: &mut Exchange,
    account: &Arc<Account>,
    req: MessagesRequest,
    mut valid: ValidMessagesRequest,
    input_estimate: u64,
    claim: &mut Option<Claim>,
) -> Result<(), ApiError> {
    if let Some(window) = generation::pool_of(&app.pools, valid.model.id)
        .ok()
        .and_then(|pool| pool.context_window())
    {
        valid.fit_window(window);
    }
    let reservation = steps::admit(
        app,
        ex,
        account,
        valid.model,
        input_estimate,
        valid.max_output,
    )
    .await?;
    let mut work = to_worker(&req, &valid, &ex.request_id);
    generation::session_affinity(&mut work, session(ex).as_deref());
    let tier = account.plan.service_tier(valid.service_tier);
    drop(req);
    let generation = steps::generation(app, ex, valid.model.id, work, valid.stream, tier);
    let id = new_id("msg_");
    if !valid.stream {
        let mut body = FoldedBody::<MessageAggregate>::new(ex, app.shutdown.clone());
        let end = generation.run(reservation, &mut body).await;
        return body
            .end(end, claim, |aggregate| {
                serde_json::to_string(&aggregate.into_message(id, &valid))
                    .map_err(|_| ApiError::internal("could not encode the response"))
            })
            .await;
    }
    let encoder = MessagesStreamEncoder::of(id.clone(), &valid);
    let mut sink = MessagesStream::new(ex, encoder, app.shutdown.clone());
    // A key's record keeps the reply, folded.
    sink.aggregate = claim.is_some().then(MessageAggregate::default);
    let end = generation.run(reservation, &mut sink).await;
    sink.end(end, claim, |aggregate| {
        let folded = stream::replay(id, &valid, &aggregate.folded_events());
        Ok(String::from_utf8_lossy(&folded).into_owned())
    })
    .await
}

/// `POST /v1/messages/count_tokens`: the prompt the same body would be
/// billed for (`input_tokens` + `cache_read_input_tokens` of its reply),
/// counted by a worker of the model with the model's tokenizer and
/// template. `max_tokens` may be left out here. Not billed, and not held
/// to the plan's token limits (it generates nothing).
pub async fn count_tokens(
    app: &App,
    ex: &mut Exchange,
    account: Arc<Account>,
) -> Result<(), ApiError> {
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let mut req: MessagesRequest = parse::json_body(&body)?;
    drop(body);
    req.max_tokens.get_or_insert(1);
    let valid = validate::messages::validate(&app.catalog, &req)?;
    ex.model = valid.model.id;
    account.check_model(valid.model.id)?;
    let work = to_worker(&req, &valid, &ex.request_id);
    drop(req);
    let pool = generation::pool_of(&app.pools, valid.model.id)?;
    let input_tokens =
        tokio::time::timeout(app.request_timeout(), pool.count_tokens(&work, &ex.trace))
            .await
            .map_err(|_| {
                ApiError::timeout("No worker counted the prompt before the request deadline.")
            })??;
    ex.send_json(200, &TokenCount { input_tokens }, &[]).await;
    Ok(())
}
