//! `POST /v1/chat/completions` with `planner_mode: true`: the HTTP side of
//! a planner run (see `planner/`). Before anything is sent: the session's
//! lock (409), resume checks (400), the first model call's admission
//! (429, with the `x-ratelimit-*` headers). Then the run, watched for a
//! client that goes away (which drops the run: its model calls and agent
//! tasks are cancelled), and its reply: one body, or a stream that starts
//! with the first thing to say.

use super::steps;
use crate::accounts::Account;
use crate::api::chat::{ChatCompletionRequest, ChatUsage};
use crate::app::App;
use crate::error::ApiError;
use crate::http::{ClientGone, Exchange, Pumped, SseReply};
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::planner_mode::calls::RequestCalls;
use crate::planner_mode::sessions::session_key;
use crate::sse;
use crate::translate::planner::reply::{self, tool_thought, StreamFrames};
use crate::translate::planner::{run_input, tool_results};
use crate::validate::chat::ValidChatRequest;
use futures::{future, stream, StreamExt};
use planner::{Ending, Event, RunError};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::UnboundedReceiverStream;

pub async fn create(
    app: &App,
    ex: &mut Exchange,
    account: Arc<Account>,
    req: ChatCompletionRequest,
    valid: ValidChatRequest,
    input_estimate: u64,
) -> Result<(), ApiError> {
    let session = ex.session_id().unwrap_or_default().trim().to_owned();
    let results = tool_results(req.messages.as_deref().unwrap_or_default());
    let planner::Begun { lock, start } = app
        .planner
        .begin(
            session_key(&account.principal.org, &session),
            results,
            || run_input(&req, valid.max_tokens),
        )
        .await?;
    let admitted = steps::admit(
        app,
        ex,
        &account,
        valid.model,
        input_estimate.max(estimate_input_tokens(1024)),
        app.planner.config.max_plan_tokens,
    )
    .await;
    let reservation = match admitted {
        Ok(r) => r,
        Err(e) => {
            lock.release().await;
            return Err(e);
        }
    };
    let calls = RequestCalls::new(
        &app.pools,
        &app.limiter,
        &account,
        valid.model,
        ex.trace,
        ex.request_id.clone(),
        session.clone(),
        reservation,
    )
    .with_tier(account.plan.service_tier(req.service_tier.as_deref()));
    let calls_ref = &calls;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let key = lock.key().to_owned();
    // The run owns the event sender (the events end with it) and the
    // session's lock, released before the reply's last write so a
    // client's next request on the session finds it free.
    let run = async move {
        let ended = app.planner.run(calls_ref, key, start, &tx).await;
        lock.release().await;
        ended.map_err(|e| match e {
            RunError::Model(e) => e,
            RunError::Session(e) => ApiError::from(e),
        })
    };
    let id = new_id("chatcmpl-");

    if !valid.stream {
        let ending = tokio::select! {
            ending = run => ending?,
            _ = ex.client_gone() => {
                ex.client_left();
                return Ok(());
            }
        };
        let (mut thought, mut tool_thoughts, mut data) = (Vec::new(), Vec::new(), Vec::new());
        while let Ok(e) = rx.try_recv() {
            match e {
                Event::Thought(t) => thought.push(t),
                Event::ToolThought(t) => tool_thoughts.push(tool_thought(t)),
                Event::Data(d) => data.push(d),
                // The ending carries the whole answer; these are its deltas.
                Event::Answer(_) => {}
            }
        }
        let mut completion = reply::completion(
            id,
            valid.model.id,
            &session,
            ending,
            usage_of(&calls),
            thought,
            tool_thoughts,
            data,
        );
        completion.service_tier = calls.tier.as_str();
        ex.send_json(200, &completion, &[]).await;
        return Ok(());
    }

    // Streaming: the events as they happen, then the ending. The head goes
    // out with the first frame, so a run that fails before doing anything
    // still answers with its error status.
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    let driven = async move {
        let _ = ended_tx.send(run.await);
    };
    let items = stream::select(
        UnboundedReceiverStream::new(rx).map(Item::Event),
        stream::once(driven).filter_map(|()| future::ready(None::<Item>)),
    )
    .chain(stream::once(ended_rx).map(|ended| {
        Item::Ended(
            ended.unwrap_or_else(|_| Err(ApiError::internal("the planner run ended unheard"))),
        )
    }));
    let frames = StreamFrames::new(id, valid.model.id, &session, valid.include_usage)
        .served_at(calls.tier.as_str());
    let keepalive = Duration::from_millis(app.planner.config.keepalive_ms.max(100));
    let mut reply = SseReply::new(ex, 0).with_keepalive(keepalive);
    let mut opened = false;
    let mut failed = None;
    let pumped = reply
        .pump(items, |item, out| {
            if let Pumped::Item(Item::Ended(Err(e))) = &item {
                if !opened {
                    return ControlFlow::Break(e.clone());
                }
            }
            // The role chunk opens the stream, whatever comes first.
            if !opened {
                frames.role(out);
                opened = true;
            }
            match item {
                Pumped::KeepAlive => sse::keepalive(out),
                Pumped::Item(Item::Event(e)) => match e {
                    Event::Thought(t) => frames.entries(out, &[t], &[], &[]),
                    Event::ToolThought(t) => frames.entries(out, &[], &[tool_thought(t)], &[]),
                    Event::Data(d) => frames.entries(out, &[], &[], &[d]),
                    Event::Answer(a) => frames.content(out, &a),
                },
                Pumped::Item(Item::Ended(Ok(Ending::Pause(pending)))) => {
                    frames.pause(out, &pending);
                    frames.finish(out, "tool_calls", &usage_of(&calls));
                }
                Pumped::Item(Item::Ended(Ok(Ending::Answer(answer)))) => {
                    frames.finish(out, answer.finish_reason(), &usage_of(&calls));
                }
                Pumped::Item(Item::Ended(Err(e))) => {
                    sse::error(out, &e);
                    failed = Some(e.status);
                }
            }
            ControlFlow::Continue(())
        })
        .await;
    match pumped {
        Err(ClientGone) => reply.left(),
        Ok(Some(e)) => return Err(e),
        Ok(None) => match failed {
            Some(status) => reply.end_failed(status).await,
            None => reply.end().await,
        },
    }
    Ok(())
}

/// What a planner stream relays: the run's events, then how it ended.
enum Item {
    Event(Event),
    Ended(Result<Ending, ApiError>),
}

/// Usage of every model call of the request.
fn usage_of(calls: &RequestCalls<'_>) -> ChatUsage {
    crate::translate::chat::usage(&calls.usage())
}
