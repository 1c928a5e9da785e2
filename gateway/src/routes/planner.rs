//! `POST /v1/chat/completions` with `planner_mode: true`: the HTTP side of
//! a planner run (see `planner/`). Before anything is sent: the session's
//! lock (409), resume checks (400), the first model call's admission
//! (429, with the `x-ratelimit-*` headers). Then the run, watched for a
//! client that goes away (which drops the run: its model calls and agent
//! tasks are cancelled), and its reply: one body, or a stream that starts
//! with the first thing to say.

use crate::accounts::Account;
use crate::api::chat::{ChatCompletionRequest, ChatUsage};
use crate::app::App;
use crate::error::ApiError;
use crate::http::{Exchange, Quiet, SseReply};
use crate::ids::new_id;
use crate::limits::estimate_input_tokens;
use crate::planner::model::ModelCalls;
use crate::planner::plan::{ToolDemand, ToolTarget};
use crate::planner::reply::{self, StreamFrames};
use crate::planner::{Ending, Event, RunInput};
use crate::sse;
use crate::validate::chat::ValidChatRequest;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

pub async fn create(
    app: &App,
    ex: &mut Exchange,
    account: Arc<Account>,
    req: ChatCompletionRequest,
    valid: ValidChatRequest,
    input_estimate: u64,
) -> Result<(), ApiError> {
    let session = ex.session_id().unwrap_or_default().trim().to_owned();
    let messages = req.messages.clone().unwrap_or_default();
    let tools_offered = !matches!(&req.tool_choice, Some(Value::String(c)) if c == "none");
    let crate::planner::Begun { lock, start } = app
        .planner
        .begin(&account.principal.org, &session, &messages, || {
            let (conversation, last_user) = RunInput::from_messages(&messages);
            RunInput {
                conversation,
                last_user,
                tools: if tools_offered {
                    tools_of(&req)
                } else {
                    Vec::new()
                },
                agents: req.agents.clone().unwrap_or_default(),
                demand: demand_of(req.tool_choice.as_ref()),
                max_tokens: valid.max_tokens,
            }
        })
        .await?;
    let admitted = super::admit(
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
    let calls = ModelCalls::new(
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
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let run = app.planner.run(&calls, lock.key().to_owned(), start, &tx);
    tokio::pin!(run);
    // Released before the reply's last write, so a client's next request
    // on the session finds it free.
    let mut lock = Some(lock);
    let id = new_id("chatcmpl-");

    if !valid.stream {
        let ending = tokio::select! {
            ending = &mut run => ending,
            _ = ex.client_gone() => {
                ex.client_left();
                return Ok(());
            }
        };
        if let Some(l) = lock.take() {
            l.release().await;
        }
        let ending = ending?;
        let (mut thought, mut tool_thought, mut data) = (Vec::new(), Vec::new(), Vec::new());
        while let Ok(e) = rx.try_recv() {
            match e {
                Event::Thought(t) => thought.push(t),
                Event::ToolThought(t) => tool_thought.push(t),
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
            tool_thought,
            data,
        );
        completion.service_tier = calls.tier.as_str();
        ex.send_json(200, &completion, &[]).await;
        return Ok(());
    }

    // Streaming: the head goes out with the first frame, so a run that
    // fails before doing anything still answers with its error status.
    let frames = StreamFrames::new(id, valid.model.id, &session, valid.include_usage);
    let keepalive = Duration::from_millis(app.planner.config.keepalive_ms.max(100));
    let mut reply = SseReply::new(ex, 0).with_keepalive(keepalive);
    enum Next {
        Event(Option<Event>),
        Ended(Result<Ending, ApiError>),
        Tick,
        Gone,
    }
    let mut ended: Option<Result<Ending, ApiError>> = None;
    loop {
        let next = if let Some(result) = ended.take() {
            // The run is over: drain what it said, then finish.
            match rx.try_recv() {
                Ok(e) => {
                    ended = Some(result);
                    Next::Event(Some(e))
                }
                Err(_) => Next::Ended(result),
            }
        } else {
            tokio::select! {
                biased;
                e = rx.recv() => Next::Event(e),
                r = &mut run => { ended = Some(r); continue; }
                q = reply.quiet() => match q {
                    Quiet::KeepAlive => Next::Tick,
                    Quiet::Gone => Next::Gone,
                },
            }
        };
        // The role chunk opens the stream, whatever comes first.
        let opening = !reply.started();
        match next {
            Next::Event(Some(e)) => {
                let out = reply.buf();
                if opening {
                    frames.role(out);
                }
                match e {
                    Event::Thought(t) => frames.entries(out, &[t], &[], &[]),
                    Event::ToolThought(t) => frames.entries(out, &[], &[t], &[]),
                    Event::Data(d) => frames.entries(out, &[], &[], &[d]),
                    Event::Answer(a) => frames.content(out, &a),
                }
            }
            Next::Event(None) => {}
            Next::Tick => {
                let out = reply.buf();
                if opening {
                    frames.role(out);
                }
                sse::keepalive(out);
            }
            Next::Gone => {
                reply.left();
                return Ok(());
            }
            Next::Ended(Err(e)) if opening => {
                if let Some(l) = lock.take() {
                    l.release().await;
                }
                return Err(e);
            }
            Next::Ended(result) => {
                if let Some(l) = lock.take() {
                    l.release().await;
                }
                let out = reply.buf();
                if opening {
                    frames.role(out);
                }
                let failed = match result {
                    Ok(Ending::Pause(calls_made)) => {
                        frames.pause(out, &calls_made);
                        frames.finish(out, "tool_calls", &usage_of(&calls));
                        None
                    }
                    Ok(Ending::Answer(answer)) => {
                        frames.finish(out, answer.finish_reason(), &usage_of(&calls));
                        None
                    }
                    Err(e) => {
                        sse::error(out, &e);
                        Some(e.status)
                    }
                };
                if reply.write().await.is_err() {
                    reply.left();
                    return Ok(());
                }
                match failed {
                    Some(status) => reply.end_failed(status).await,
                    None => reply.end().await,
                }
                return Ok(());
            }
        }
        if reply.write().await.is_err() {
            reply.left();
            return Ok(());
        }
    }
}

/// The caller's function tools, as plan targets.
fn tools_of(req: &ChatCompletionRequest) -> Vec<ToolTarget> {
    req.tools
        .iter()
        .flatten()
        .filter_map(|t| t.function.as_ref())
        .map(|f| ToolTarget {
            name: f.name.clone().unwrap_or_default(),
            description: f.description.clone().unwrap_or_default(),
            parameters: f
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        })
        .collect()
}

/// What `tool_choice` asks of the plan (validation has checked it: a
/// named function is among `tools`; `none` leaves the tools out).
fn demand_of(choice: Option<&Value>) -> ToolDemand {
    match choice {
        Some(Value::String(c)) if c == "required" => ToolDemand::Required,
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map_or(ToolDemand::Auto, |n| ToolDemand::Named(n.to_owned())),
        _ => ToolDemand::Auto,
    }
}

/// Usage of every model call of the request.
fn usage_of(calls: &ModelCalls<'_>) -> ChatUsage {
    let u = calls.usage.lock().map(|u| *u).unwrap_or_default();
    crate::translate::chat::usage(&u)
}
