//! Routing: method and path to handler. Every known route authenticates
//! first; an unknown route is a 404 in the standard envelope.

pub mod chat;
pub mod models;

use crate::app::App;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::http::exchange::Exchange;
use http::Method;

pub async fn dispatch(app: &App, ex: &mut Exchange) -> Result<(), ApiError> {
    let method = ex.method().clone();
    let path = ex.path().trim_end_matches('/').to_owned();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["v1", "chat", "completions"] => {
            ex.route = "chat.completions";
            allow(&method, Method::POST, &path)?;
            let principal = authenticate(app, ex)?;
            chat::create(app, ex, principal).await
        }
        ["v1", "models"] => {
            ex.route = "models.list";
            allow(&method, Method::GET, &path)?;
            authenticate(app, ex)?;
            models::list(ex).await
        }
        ["v1", "models", id] => {
            ex.route = "models.retrieve";
            allow(&method, Method::GET, &path)?;
            authenticate(app, ex)?;
            models::retrieve(ex, id).await
        }
        _ => Err(ApiError::route_not_found(method.as_str(), &path)),
    }
}

fn allow(method: &Method, expected: Method, path: &str) -> Result<(), ApiError> {
    if *method == expected {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(method.as_str(), path))
    }
}

fn authenticate(app: &App, ex: &Exchange) -> Result<Principal, ApiError> {
    app.auth.authenticate(ex.header("authorization"))
}
