//! `POST /v1/chat/completions`: the request path, top to bottom.

use super::sinks::{ChatBody, ChatStream};
use crate::accounts::{Account, Scope};
use crate::api::chat::ChatCompletionRequest;
use crate::app::App;
use crate::error::ApiError;
use crate::generation::{self, End};
use crate::http::Exchange;
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::sse;
use crate::translate::chat::{output_format, to_worker, ChatStreamEncoder};
use crate::{parse, validate};
use std::sync::Arc;

pub async fn create(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    // 1. Read and parse.
    let body = ex
        .read_json_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let req: ChatCompletionRequest = parse::json_body(&body)?;
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
        account.check_scope(Scope::Planner)?;
        let route = Box::pin(super::planner::create(
            app,
            ex,
            account,
            req,
            valid,
            input_estimate,
        ));
        return route.await;
    }

    // 3. Admit under the plan's limits (sets the x-ratelimit-* headers).
    let reservation = super::admit(
        app,
        ex,
        &account,
        valid.model,
        input_estimate,
        valid.max_tokens,
    )
    .await?;

    // 4. Translate, and drive the generation on a worker of the model's
    //    pool: SSE chunks, or one aggregated body.
    let mut work = to_worker(&req, &valid, &ex.request_id);
    generation::session_affinity(&mut work, session_id.as_deref());
    let format = output_format(&req);
    // Served at the tier it asked for, as far as its plan allows.
    let tier = account.plan.service_tier(req.service_tier.as_deref());
    drop(req);
    let generation = super::generation(app, ex, valid.model.id, work, valid.stream, tier);
    let id = new_id("chatcmpl-");
    if valid.stream {
        let encoder = ChatStreamEncoder::new(id, valid.model.id, valid.include_usage, format);
        let mut stream = ChatStream::new(ex, encoder, app.shutdown.clone());
        let end = generation.run(reservation, &mut stream).await;
        let ChatStream {
            mut reply,
            encoder,
            cut,
        } = stream;
        match end {
            End::NotStarted(e) => return Err(e),
            // The drain's grace period ran out: the client gets an error it
            // can act on (retry elsewhere) instead of a cut connection;
            // before the head went out, as the response itself.
            End::Gone if cut.happened() => {
                let e = ApiError::replica_shutdown();
                if !reply.started() {
                    drop(reply);
                    return Err(e);
                }
                sse::error(reply.buf(), &e);
                let _ = reply.write().await;
                reply.end_failed(e.status).await;
            }
            // A reply that failed its output check ended with an error frame.
            End::Finished(_) => match encoder.failure() {
                Some(e) => reply.end_failed(e.status).await,
                None => reply.end().await,
            },
            End::Gone => reply.left(),
            End::Failed(e) => reply.end_failed(e.status).await,
        }
    } else {
        let mut body = ChatBody::new(ex, app.shutdown.clone());
        let end = generation.run(reservation, &mut body).await;
        let (aggregate, cut) = (body.aggregate, body.cut.happened());
        match end {
            End::NotStarted(e) | End::Failed(e) => return Err(e),
            // Cut by the drain: nothing was sent, so a plain error response.
            End::Gone if cut => return Err(ApiError::replica_shutdown()),
            End::Finished(_) => {
                let mut completion =
                    aggregate.into_completion(id, valid.model.id, &valid, &format)?;
                completion.service_tier = tier.as_str();
                ex.send_json(200, &completion, &[]).await;
            }
            End::Gone => ex.client_left(),
        }
    }
    Ok(())
}
