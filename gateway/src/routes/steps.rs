//! The steps every HTTP route shares: the key check ([`authorize`]), the
//! method check ([`allow`]), admission with its rate headers ([`admit`],
//! [`admitted`]) and a foreground generation ([`generation`]). A helper of
//! the handlers: it imports none of them.

use crate::accounts::{Account, Scope, ServiceTier};
use crate::app::App;
use crate::catalog::ModelSpec;
use crate::error::ApiError;
use crate::generation::Generation;
use crate::http::{Dialect, Exchange};
use crate::limits::{Refused, Reservation};
use http::Method;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The generation of a foreground request: its deadline starts now, and a
/// stream's first token is timed from the request's start.
pub(super) fn generation<'a>(
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
///
/// Boxed: a key's lookup (a store round trip on a miss) is needed once,
/// and inline it would be part of the dispatcher's state, which lives as
/// long as the request.
pub(super) fn authorize<'a>(
    app: &'a App,
    ex: &'a Exchange,
    scope: Scope,
) -> Pin<Box<dyn Future<Output = Result<Arc<Account>, ApiError>> + Send + 'a>> {
    Box::pin(authorize_now(app, ex, scope))
}

async fn authorize_now(app: &App, ex: &Exchange, scope: Scope) -> Result<Arc<Account>, ApiError> {
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
pub(super) fn duplicate_header(name: &str) -> ApiError {
    ApiError::new(
        400,
        "duplicate_header",
        format!("The request has more than one '{name}' header; send exactly one."),
    )
}

/// Admits the request under its plan's limits (see `Limiter::admit_request`);
/// the `x-ratelimit-*` headers go on whatever response follows.
pub(super) async fn admit(
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
    self::admitted(ex, admitted)
}

/// Admission's answer over HTTP: its `x-ratelimit-*` headers go on
/// whatever response follows.
pub(super) fn admitted(
    ex: &mut Exchange,
    admitted: Result<Reservation, Refused>,
) -> Result<Reservation, ApiError> {
    ex.extra_headers.extend(match &admitted {
        Ok(reservation) => reservation.rate_headers(),
        Err(refused) => refused.rate_headers(),
    });
    Ok(admitted?)
}

/// 405 unless the request's method is one of `allowed`, with the `Allow`
/// header RFC 9110 requires on a 405 (the error response carries
/// `extra_headers`).
pub(super) fn allow(ex: &mut Exchange, allowed: &[Method], path: &str) -> Result<(), ApiError> {
    if allowed.contains(ex.method()) {
        return Ok(());
    }
    let list: Vec<&str> = allowed.iter().map(Method::as_str).collect();
    ex.extra_headers.push(("allow", list.join(", ")));
    Err(ApiError::method_not_allowed(ex.method().as_str(), path))
}
