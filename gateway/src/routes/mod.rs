//! Routing: method and path to handler. Every known route authorizes first
//! (`Accounts::authorize`: key 401, organisation 402, scope 403), except
//! the public interface description (`/v1/openapi.json`); an unknown route
//! is a 404 in the standard envelope.

//!
//! This file only dispatches. The route handlers below it do not import
//! one another; what they share are the helpers beside them (`steps.rs`:
//! the key and method checks, admission, a foreground generation;
//! `idempotent.rs`, `sinks.rs`, `follow.rs`, `ending.rs`), which
//! import no handler. The Responses path itself is `crate::responses`.

pub mod chat;
pub mod compact;
mod ending;
mod follow;
mod idempotent;
pub mod messages;
pub mod models;
pub mod openapi;
pub mod planner;
pub mod responses;
pub mod responses_ws;
mod sinks;
mod steps;

use crate::accounts::Scope;
use crate::app::App;
use crate::error::ApiError;
use crate::http::websocket::Handshake;
use crate::http::{Dialect, Exchange};
use http::Method;
use steps::{allow, authorize};

/// Routes one request to its handler.
///
/// Each route's future is boxed: a connection's task then holds only the
/// state of the route it is serving, not the size of the largest route,
/// which matters for thousands of long-lived streams. The box is made in
/// its own `let`: in `Box::pin(route(..)).await` the unboxed future is a
/// temporary that lives to the end of the statement, so this function's
/// state would still reserve room for it (measured: 8.3 KiB, not 1).
pub async fn dispatch(app: &App, ex: &mut Exchange) -> Result<(), ApiError> {
    let method = ex.method().clone();
    let path = ex.path().trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["v1", "chat", "completions"] => {
            ex.route = "chat.completions";
            allow(ex, &[Method::POST], &path)?;
            let account = authorize(app, ex, Scope::ChatWrite).await?;
            let served = {
                let route = Box::pin(chat::create(app, ex, account));
                route.await?
            };
            match served {
                chat::Served::Done => Ok(()),
                chat::Served::Planner(turn) => {
                    let chat::PlannerTurn {
                        account,
                        req,
                        valid,
                        input_estimate,
                    } = *turn;
                    let route = Box::pin(planner::create(
                        app,
                        ex,
                        account,
                        req,
                        valid,
                        input_estimate,
                    ));
                    route.await
                }
            }
        }
        // Anthropic's Messages API: its envelope for every error, from
        // the key check on (Claude Code adds `?beta=true`: the query is
        // not part of the path).
        ["v1", "messages"] => {
            ex.route = "messages.create";
            ex.dialect = Dialect::Anthropic;
            allow(ex, &[Method::POST], &path)?;
            let account = authorize(app, ex, Scope::ChatWrite).await?;
            let route = Box::pin(messages::create(app, ex, account));
            route.await
        }
        ["v1", "messages", "count_tokens"] => {
            ex.route = "messages.count_tokens";
            ex.dialect = Dialect::Anthropic;
            allow(ex, &[Method::POST], &path)?;
            let account = authorize(app, ex, Scope::ChatWrite).await?;
            let route = Box::pin(messages::count_tokens(app, ex, account));
            route.await
        }
        ["v1", "openapi.json"] => {
            ex.route = "openapi";
            allow(ex, &[Method::GET, Method::HEAD], &path)?;
            let route = Box::pin(openapi::serve(ex));
            route.await
        }
        ["v1", "models"] => {
            ex.route = "models.list";
            ex.dialect = models::dialect(ex);
            allow(ex, &[Method::GET], &path)?;
            authorize(app, ex, Scope::ModelsRead).await?;
            let route = Box::pin(models::list(&app.catalog, ex));
            route.await
        }
        ["v1", "models", id] => {
            ex.route = "models.retrieve";
            ex.dialect = models::dialect(ex);
            allow(ex, &[Method::GET], &path)?;
            authorize(app, ex, Scope::ModelsRead).await?;
            let route = Box::pin(models::retrieve(&app.catalog, ex, id));
            route.await
        }
        ["v1", "responses"] => {
            // Responses over WebSocket: the same key check first (a 401
            // in the envelope, before any upgrade).
            if method == Method::GET && Handshake::requested(ex) {
                ex.route = "responses.websocket";
                let account = authorize(app, ex, Scope::ResponsesWrite).await?;
                let route = Box::pin(responses_ws::serve(app, ex, account));
                return route.await;
            }
            ex.route = "responses.create";
            allow(ex, &[Method::POST], &path)?;
            let account = authorize(app, ex, Scope::ResponsesWrite).await?;
            let route = Box::pin(responses::create(app, ex, account));
            route.await
        }
        ["v1", "responses", "compact"] => {
            ex.route = "responses.compact";
            allow(ex, &[Method::POST], &path)?;
            let account = authorize(app, ex, Scope::ResponsesWrite).await?;
            let route = Box::pin(compact::compact(app, ex, account));
            route.await
        }
        ["v1", "responses", id] => {
            if method == Method::DELETE {
                ex.route = "responses.delete";
            } else {
                ex.route = "responses.retrieve";
                allow(ex, &[Method::GET, Method::DELETE], &path)?;
            }
            // Deleting destroys data: a read-only key may not.
            let scope = if method == Method::DELETE {
                Scope::ResponsesWrite
            } else {
                Scope::ResponsesRead
            };
            let principal = authorize(app, ex, scope).await?.principal.clone();
            let id = id.to_string();
            if method == Method::DELETE {
                let route = Box::pin(responses::delete(app, ex, principal, &id));
                route.await
            } else {
                let route = Box::pin(responses::retrieve(app, ex, principal, &id));
                route.await
            }
        }
        ["v1", "responses", id, "cancel"] => {
            ex.route = "responses.cancel";
            allow(ex, &[Method::POST], &path)?;
            // Cancelling ends a run: a write.
            let principal = authorize(app, ex, Scope::ResponsesWrite)
                .await?
                .principal
                .clone();
            let id = id.to_string();
            let route = Box::pin(responses::cancel(app, ex, principal, &id));
            route.await
        }
        ["v1", "responses", id, "input_items"] => {
            ex.route = "responses.input_items";
            allow(ex, &[Method::GET], &path)?;
            let principal = authorize(app, ex, Scope::ResponsesRead)
                .await?
                .principal
                .clone();
            let id = id.to_string();
            let route = Box::pin(responses::input_items(app, ex, principal, &id));
            route.await
        }
        _ => Err(ApiError::route_not_found(method.as_str(), &path)),
    }
}
