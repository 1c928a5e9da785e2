//! Routing: method and path to handler. Every known route authorizes first
//! (`Accounts::authorize`: key 401, organisation 402, scope 403), except
//! the public interface description (`/v1/openapi.json`); an unknown route
//! is a 404 in the standard envelope.

pub mod chat;
pub mod compact;
mod conversation;
mod follow;
mod idempotent;
pub mod messages;
pub mod models;
pub mod openapi;
pub mod planner;
pub mod responses;
pub mod responses_ws;
mod sinks;
mod sinks_messages;

use crate::accounts::{Account, Scope, ServiceTier};
use crate::app::App;
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::Generation;
use crate::http::websocket::Handshake;
use crate::http::{Dialect, Exchange};
use crate::limits::Reservation;
use http::Method;
use std::sync::Arc;

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
            let route = Box::pin(chat::create(app, ex, account));
            route.await
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
            openapi::serve(ex).await
        }
        ["v1", "models"] => {
            ex.route = "models.list";
            ex.dialect = models::dialect(ex);
            allow(ex, &[Method::GET], &path)?;
            authorize(app, ex, Scope::ModelsRead).await?;
            models::list(&app.catalog, ex).await
        }
        ["v1", "models", id] => {
            ex.route = "models.retrieve";
            ex.dialect = models::dialect(ex);
            allow(ex, &[Method::GET], &path)?;
            authorize(app, ex, Scope::ModelsRead).await?;
            models::retrieve(&app.catalog, ex, id).await
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

/// The generation of a foreground request: its deadline starts now, and a
/// stream's first token is timed from the request's start.
fn generation<'a>(
    app: &'a App,
    ex: &Exchange,
    model: &'static str,
    work: inference_proto::v1::GenerateRequest,
    stream: bool,
    tier: ServiceTier,
) -> Generation<'a> {
    Generation {
        pools: &app.pools,
        model,
        work,
        trace: ex.trace,
        deadline: tokio::time::Instant::now() + app.request_timeout(),
        timed_from: stream.then_some(ex.started),
        tier,
    }
}

/// The access check of every route (see `Accounts::authorize`). Two
/// `Authorization` headers are refused before either is looked at: which
/// one counts would otherwise depend on who reads them (a proxy in front
/// may check the last one while we used the first). An Anthropic client
/// may send its key as `x-api-key` instead (checked the same way, when
/// there is no `Authorization`).
async fn authorize(app: &App, ex: &Exchange, scope: Scope) -> Result<Arc<Account>, ApiError> {
    let single = |name: &str| {
        let mut values = ex.session.req_header().headers.get_all(name).iter();
        let first = values.next().map(|v| v.as_bytes());
        match values.next() {
            Some(_) => Err(duplicate_header(name)),
            None => Ok(first),
        }
    };
    let from_key;
    let header = match single("Authorization")? {
        Some(h) => Some(h),
        None if ex.dialect == Dialect::Anthropic => {
            from_key = single("x-api-key")?.map(|key| [b"Bearer ".as_slice(), key].concat());
            from_key.as_deref()
        }
        None => None,
    };
    Ok(app.accounts.authorize(header, scope).await?)
}

/// 400 for a header that must appear at most once.
fn duplicate_header(name: &str) -> ApiError {
    ApiError::new(
        400,
        "duplicate_header",
        format!("The request has more than one '{name}' header; send exactly one."),
    )
}

/// Admits the request under its plan's limits (see `Limiter::admit_request`);
/// the `x-ratelimit-*` headers go on whatever response follows.
async fn admit(
    app: &App,
    ex: &mut Exchange,
    account: &Arc<Account>,
    model: &'static ModelSpec,
    input_estimate: u64,
    max_tokens: u32,
) -> Result<Reservation, ApiError> {
    let request_id = ex.request_id.clone();
    let admitted = app
        .limiter
        .admit_request(account, model, request_id, input_estimate, max_tokens)
        .await;
    ex.extra_headers.extend(match &admitted {
        Ok(reservation) => reservation.rate_headers(),
        Err(refused) => refused.rate_headers(),
    });
    Ok(admitted?)
}

/// 405 unless the request's method is one of `allowed`, with the `Allow`
/// header RFC 9110 requires on a 405 (the error response carries
/// `extra_headers`).
fn allow(ex: &mut Exchange, allowed: &[Method], path: &str) -> Result<(), ApiError> {
    if allowed.contains(ex.method()) {
        return Ok(());
    }
    let list: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    ex.extra_headers.push(("allow", list.join(", ")));
    Err(ApiError::method_not_allowed(ex.method().as_str(), path))
}
