//! Caller authentication: with `--auth-token` (or `WORKER_AUTH_TOKEN`),
//! every `inference.v1.Worker` call must carry `authorization: Bearer
//! <token>`, so that only gateways (which enforce keys, limits and billing)
//! can generate. `grpc.health.v1` stays open: a kubelet probe cannot send
//! metadata, and health reveals nothing.

use std::sync::Arc;
use tonic::{Request, Status};

/// The interceptor of the worker service; `None` accepts every caller.
#[derive(Clone)]
pub struct RequireToken {
    expected: Option<Arc<[u8]>>,
}

impl RequireToken {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            expected: token
                .filter(|t| !t.is_empty())
                .map(|t| format!("Bearer {t}").into_bytes().into()),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.expected.is_some()
    }
}

impl tonic::service::Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let sent = request
            .metadata()
            .get("authorization")
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if constant_time_eq(sent, expected) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "this worker requires the gateway's token (authorization: Bearer ...)",
            ))
        }
    }
}

/// Compares without an early exit, so timing does not reveal how much of
/// a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    fn with_auth(value: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(v) = value {
            r.metadata_mut()
                .insert("authorization", v.parse().expect("ascii"));
        }
        r
    }

    #[test]
    fn only_the_right_bearer_token_passes() {
        let mut auth = RequireToken::new(Some("s3cret"));
        assert!(auth.call(with_auth(Some("Bearer s3cret"))).is_ok());
        for bad in [
            None,
            Some("Bearer s3cre"),
            Some("Bearer s3cretX"),
            Some("s3cret"),
        ] {
            let e = auth.call(with_auth(bad)).expect_err("refused");
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
        }
        let mut open = RequireToken::new(None);
        assert!(!open.is_enabled());
        assert!(open.call(with_auth(None)).is_ok());
        assert!(!RequireToken::new(Some("")).is_enabled());
    }
}
