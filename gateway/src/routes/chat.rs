//! `POST /v1/chat/completions`: the request path, top to bottom. A body
//! with `planner_mode` goes back to the dispatcher, checked
//! ([`Served::Planner`]), for the planner's route.

use super::idempotent::{self, Begin, Claim};
use super::sinks::{ChatBody, ChatStream};
use super::steps;
use crate::accounts::{Account, Scope};
use crate::api::chat::ChatCompletionRequest;
use crate::app::App;
use crate::error::ApiError;
use crate::generation;
use crate::http::Exchange;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::translate::chat::{output_format, to_worker, ChatAggregate, ChatStreamEncoder};
use crate::translate::replay;
use crate::validate::chat::ValidChatRequest;
use crate::{parse, validate};
use std::sync::Arc;

/// What [`create`] did with the request.
pub enum Served {
    /// Answered.
    Done,
    /// A planner turn, validated, its scope checked: the planner's route
    /// runs it (boxed: the request it carries is large, the route's
    /// future should not be).
    Planner(Box<PlannerTurn>),
}

/// A chat request in planner mode, ready for the planner's route.
pub struct PlannerTurn {
    pub account: Arc<Account>,
    pub req: ChatCompletionRequest,
    pub valid: ValidChatRequest,
    pub input_estimate: u64,
}

pub async fn create(
    app: &App,
    ex: &mut Exchange,
    account: Arc<Account>,
) -> Result<Served, ApiError> {
    // 1. Read and parse (and the `Idempotency-Key`, with the body's print).
    // Each stage before the generation is boxed, and so freed once done:
    // this future then stays as small as what an open stream waits on.
    let read = Box::pin(ex.read_json_body(app.config.max_body_bytes, app.read_timeout()));
    let body = read.await?;
    let key = idempotent::header(ex)?;
    let req: ChatCompletionRequest = parse::json_body(&body)?;
    // Printed only once the bounded parse accepted the body.
    let idempotency = key.map(|k| k.with_body("chat.completions", &body));
    let input_estimate = estimate_input_tokens(body.len());
    drop(body);

    // 2. Validate, and check the key may use this model (and the planner).
    let session_id = ex.session_id().map(str::to_owned);
    let valid = validate::chat::validate(
        &app.catalog,
        &req,
        &validate::chat::ChatHeaders {
            session_id: session_id.as_deref(),
        },
    )?;
    ex.model = valid.model.id;
    account.check_model(valid.model.id)?;
    if valid.planner {
        if idempotency.is_some() {
            return Err(idempotent::not_with_planner());
        }
        account.check_scope(Scope::Planner)?;
        return Ok(Served::Planner(Box::new(PlannerTurn {
            account,
            req,
            valid,
            input_estimate,
        })));
    }

    // 3. With a key: claim it, or answer from the first request's record.
    let begin = Box::pin(idempotent::begin(app, ex, &account, idempotency));
    let mut claim = match begin.await? {
        Begin::Run(claim) => claim,
        Begin::Replayed => return Ok(Served::Done),
    };
    let result = generate(app, ex, &account, req, valid, input_estimate, &mut claim).await;
    // Anything but a success frees the key: a retry runs.
    let release = Box::pin(idempotent::release(claim));
    release.await;
    result.map(|()| Served::Done)
}

/// Steps 4 to 6: admission, the generation, the reply. A success records
/// its outcome in `claim` before its reply is sent.
async fn generate(
    app: &App,
    ex: &mut Exchange,
    account: &Arc<Account>,
    req: ChatCompletionRequest,
    valid: ValidChatRequest,
    input_estimate: u64,
    claim: &mut Option<Claim>,
) -> Result<(), ApiError> {
    let session_id = ex.session_id().map(str::to_owned);
    // 4. Admit under the plan's limits (sets the x-ratelimit-* headers).
    let admit = Box::pin(steps::admit(
        app,
        ex,
        account,
        valid.model,
        input_estimate,
        valid.max_tokens,
    ));
    let reservation = admit.await?;

    // 5. Translate, and drive the generation on a worker of the model's
    //    pool: SSE chunks, or one aggregated body.
    let mut work = to_worker(&req, &valid, &ex.request_id);
    generation::session_affinity(&mut work, session_id.as_deref());
    let format = output_format(&req);
    // Served at the tier it asked for, as far as its plan allows.
    let tier = account.plan.service_tier(req.service_tier.as_deref());
    drop(req);
    let generation = steps::generation(app, ex, valid.model.id, work, valid.stream, tier);
    let id = new_id("chatcmpl-");
    if valid.stream {
        let encoder = ChatStreamEncoder::new(
            id.clone(),
            valid.model.id,
            valid.include_usage,
            format.clone(),
        )
        .served_at(tier.as_str());
        let mut stream = ChatStream::new(ex, encoder, app.shutdown.clone());
        // A key's record keeps the reply folded: the events are folded too.
        stream.aggregate = claim.is_some().then(ChatAggregate::default);
        let end = generation.run(reservation, &mut stream).await;
        // The reply's end, boxed as the stages before the generation are:
        // an open stream's future stays small.
        Box::pin(stream.end(end, claim, |aggregate| {
            let mut completion = aggregate.into_completion(id, valid.model.id, &valid, &format)?;
            completion.service_tier = tier.as_str();
            let mut folded = bytes::BytesMut::new();
            replay::chat_stream(&completion, valid.include_usage, &mut folded);
            Ok(String::from_utf8_lossy(&folded).into_owned())
        }))
        .await
    } else {
        let mut body = ChatBody::new(ex, app.shutdown.clone());
        let end = generation.run(reservation, &mut body).await;
        Box::pin(body.end(end, claim, |aggregate| {
            let mut completion = aggregate.into_completion(id, valid.model.id, &valid, &format)?;
            completion.service_tier = tier.as_str();
            serde_json::to_string(&completion)
                .map_err(|_| ApiError::internal("could not encode the response"))
        }))
        .await
    }
}
