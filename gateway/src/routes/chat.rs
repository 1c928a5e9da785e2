//! `POST /v1/chat/completions`: the request path, top to bottom.

use crate::api::chat::ChatCompletionRequest;
use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::http::exchange::Exchange;
use crate::http::relay::{relay, RelayEnd};
use crate::metrics::METRICS;
use crate::translate::chat::{output_format, to_worker, ChatAggregate, ChatStreamEncoder};
use crate::translate::{new_id, sse_error};
use crate::{parse, usage, validate};
use bytes::BytesMut;

pub async fn create(app: &App, ex: &mut Exchange, _principal: Principal) -> Result<(), ApiError> {
    // 1. Read and parse.
    let body = ex
        .read_body(app.config.max_body_bytes, app.read_timeout())
        .await?;
    let req: ChatCompletionRequest = parse::json_body(&body)?;
    drop(body);

    // 2. Validate.
    let plan = validate::chat::validate(&req)?;
    ex.model = plan.model.id;

    // 3. Translate and start the generation on a worker of the model's pool.
    let pool = app.pools.get(plan.model.id).ok_or_else(|| {
        ApiError::overloaded(format!(
            "Model '{}' has no workers configured.",
            plan.model.id
        ))
    })?;
    let work = to_worker(&req, &plan, &ex.request_id);
    let format = output_format(&req);
    drop(req);
    let deadline = tokio::time::Instant::now() + app.request_timeout();
    let call = tokio::time::timeout_at(deadline, pool.generate(work))
        .await
        .map_err(|_| ApiError::timeout("No worker answered before the request deadline."))??;
    METRICS
        .time_to_first_token
        .with_label_values(&[plan.model.id])
        .observe(ex.started.elapsed().as_secs_f64());

    // 4. Relay: SSE chunks, or one aggregated body.
    let id = new_id("chatcmpl-");
    if plan.stream {
        let mut encoder = ChatStreamEncoder::new(id, plan.model.id, plan.include_usage, format);
        let mut first = BytesMut::new();
        encoder.start(&mut first);
        if ex.start_sse().await.is_err() || ex.write_chunk(first.freeze()).await.is_err() {
            ex.status = 499;
            return Ok(());
        }
        METRICS.open_streams.inc();
        let end = relay(ex, call, deadline, |event, out| encoder.event(&event, out)).await;
        METRICS.open_streams.dec();
        match end {
            RelayEnd::Finished(f) => {
                usage::record(plan.model, &f.usage.unwrap_or_default());
                if let Some(e) = encoder.failure() {
                    ex.status = e.status;
                }
                ex.end_stream().await;
            }
            RelayEnd::ClientGone => ex.status = 499,
            RelayEnd::Failed(e) => {
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
        match relay(ex, call, deadline, |event, _| aggregate.push(event)).await {
            RelayEnd::Finished(f) => {
                usage::record(plan.model, &f.usage.unwrap_or_default());
                let completion = aggregate.into_completion(id, plan.model.id, &plan, &format)?;
                ex.send_json(200, &completion, &[]).await;
            }
            RelayEnd::ClientGone => ex.status = 499,
            RelayEnd::Failed(e) => return Err(e),
        }
    }
    Ok(())
}
