//! `POST /v1/chat/completions`: the request path, top to bottom.

use crate::accounts::{Account, Scope};
use crate::api::chat::ChatCompletionRequest;
use crate::app::App;
use crate::error::ApiError;
use crate::http::exchange::Exchange;
use crate::http::relay::{relay, RelayEnd};
use crate::limits::{estimate_input_tokens, Outcome};
use crate::metrics::METRICS;
use crate::translate::chat::{output_format, to_worker, ChatAggregate, ChatStreamEncoder};
use crate::translate::{new_id, sse_error};
use crate::{parse, validate};
use bytes::BytesMut;
use inference_proto::v1 as pb;
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
    let session_id = ex
        .header("x-session-id")
        .and_then(|v| std::str::from_utf8(v).ok());
    let plan = validate::chat::validate(&req, &validate::chat::ChatHeaders { session_id })?;
    let session_key = session_id.map(session_cache_key);
    ex.model = plan.model.id;
    account.check_model(plan.model.id)?;
    if req.planner_mode == Some(true) {
        account.check_scope(Scope::Planner)?;
    }

    // 3. Admit under the plan's limits (sets the x-ratelimit-* headers).
    let mut reservation = app
        .limiter
        .admit(ex, &account, plan.model, input_estimate, plan.max_tokens)
        .await?;

    // 4. Translate and start the generation on a worker of the model's pool.
    let pool = app.pools.get(plan.model.id).ok_or_else(|| {
        ApiError::overloaded(format!(
            "Model '{}' has no workers configured.",
            plan.model.id
        ))
    })?;
    let mut work = to_worker(&req, &plan, &ex.request_id);
    if work.cache_key.is_empty() {
        // No explicit prompt_cache_key: a session's turns share a prefix,
        // so they stick to one worker through the session id.
        work.cache_key = session_key.unwrap_or_default();
    }
    let format = output_format(&req);
    drop(req);
    let deadline = tokio::time::Instant::now() + app.request_timeout();
    let call = tokio::time::timeout_at(deadline, pool.generate(work, &ex.trace))
        .await
        .map_err(|_| ApiError::timeout("No worker answered before the request deadline."))??;
    reservation.mark_started();
    let mut output_seen = 0u64;
    if plan.stream {
        // Only a stream has a first token to time: a non-streaming reply
        // comes from the worker in one batch at its end.
        if let Some(series) = crate::metrics::model_series(plan.model.id) {
            series
                .time_to_first_token()
                .observe(ex.started.elapsed().as_secs_f64());
        }
    }

    // 5. Relay: SSE chunks, or one aggregated body.
    let id = new_id("chatcmpl-");
    if plan.stream {
        let mut encoder = ChatStreamEncoder::new(id, plan.model.id, plan.include_usage, format);
        let mut opening = BytesMut::with_capacity(256);
        encoder.start(&mut opening);
        if ex.start_sse().await.is_err() {
            ex.status = 499;
            return Ok(());
        }
        METRICS.open_streams.inc();
        let end = relay(ex, call, deadline, opening, |event, out| {
            output_seen += u64::from(is_output(&event));
            encoder.event(&event, out)
        })
        .await;
        METRICS.open_streams.dec();
        reservation.observe_output(output_seen);
        match end {
            RelayEnd::Finished(f) => {
                let usage = f.usage.unwrap_or_default();
                reservation.settle(Outcome::Finished(&usage)).await;
                if let Some(e) = encoder.failure() {
                    ex.status = e.status;
                }
                ex.end_stream().await;
            }
            RelayEnd::ClientGone => {
                reservation.settle(Outcome::Abandoned).await;
                ex.status = 499;
            }
            RelayEnd::Failed(e) => {
                reservation.settle(Outcome::Abandoned).await;
                // The status line is long gone: the failure travels in-band.
                let mut frame = BytesMut::new();
                sse_error(&mut frame, &e);
                let _ = ex.write_chunk(frame.freeze()).await;
                ex.end_stream().await;
                ex.status = e.status;
            }
        }
    } else {
        let mut aggregate = ChatAggregate::default();
        let end = relay(ex, call, deadline, BytesMut::new(), |event, _| {
            output_seen += u64::from(is_output(&event));
            aggregate.push(event)
        })
        .await;
        reservation.observe_output(output_seen);
        match end {
            RelayEnd::Finished(f) => {
                let usage = f.usage.unwrap_or_default();
                reservation.settle(Outcome::Finished(&usage)).await;
                let completion = aggregate.into_completion(id, plan.model.id, &plan, &format)?;
                ex.send_json(200, &completion, &[]).await;
            }
            RelayEnd::ClientGone => {
                reservation.settle(Outcome::Abandoned).await;
                ex.status = 499;
            }
            RelayEnd::Failed(e) => {
                reservation.settle(Outcome::Abandoned).await;
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Whether a worker event carries generated output (about one token each).
fn is_output(event: &pb::GenerateEvent) -> bool {
    use pb::generate_event::Event;
    matches!(
        event.event,
        Some(Event::Text(_) | Event::Reasoning(_) | Event::ToolCall(_))
    )
}

/// The worker-affinity key of a session (`x-session-id`), used when the
/// request names no `prompt_cache_key`.
pub fn session_cache_key(session_id: &str) -> String {
    format!("session:{session_id}")
}
