//! `GET /v1/openapi.json`: the interface description (spec section 9),
//! `docs/openapi.json` built into the binary, so what is served is what is
//! in the tree. It needs no key (docs/request-contract.md says why). The
//! tests below keep it true to the wire types (`api/`, the error shapes).

use crate::error::ApiError;
use crate::http::Exchange;
use bytes::Bytes;

/// The OpenAPI 3.1 document, version 1.0.0.
pub const DOCUMENT: &str = include_str!("../../../docs/openapi.json");

/// The document's ETag: a digest of its bytes, so it changes exactly when
/// the document does.
static ETAG: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use sha2::{Digest, Sha256};
    format!("\"{}\"", &hex::encode(Sha256::digest(DOCUMENT))[..32])
});

/// GET (304 when `If-None-Match` names the ETag) and HEAD.
pub async fn serve(ex: &mut Exchange) -> Result<(), ApiError> {
    ex.send_cacheable(
        "application/json",
        &ETAG,
        Bytes::from_static(DOCUMENT.as_bytes()),
    )
    .await;
    Ok(())
}

#[cfg(test)]
#[path = "openapi_drift.rs"]
mod drift;
