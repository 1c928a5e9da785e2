//! `GET /v1/models` and `GET /v1/models/{model}`. Codex CLI requests get
//! the Codex catalogue on the list route, with a stable `ETag`.

use crate::api::models::{CodexCatalogue, CodexModel, Model, ModelList};
use crate::catalog::{self, MODELS};
use crate::error::ApiError;
use crate::http::exchange::Exchange;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// The list body never changes while the process runs: encode it once.
static MODEL_LIST: LazyLock<Bytes> = LazyLock::new(|| {
    let list = ModelList {
        object: "list",
        data: MODELS.iter().map(Model::from).collect(),
    };
    serde_json::to_vec(&list).unwrap_or_default().into()
});

/// The Codex catalogue and its ETag (a digest of the body, so it changes
/// exactly when the catalogue does).
static CODEX_CATALOGUE: LazyLock<(Bytes, String)> = LazyLock::new(|| {
    let mut models: Vec<CodexModel> = MODELS.iter().map(CodexModel::from).collect();
    models.sort_by_key(|m| m.priority);
    let body = serde_json::to_vec(&CodexCatalogue { models }).unwrap_or_default();
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..32]);
    (body.into(), etag)
});

/// The ETag Codex compares against `x-models-etag` on `/responses` replies.
pub fn codex_etag() -> &'static str {
    &CODEX_CATALOGUE.1
}

/// Codex identifies itself by `originator` or `User-Agent` starting `codex_`.
fn is_codex(ex: &Exchange) -> bool {
    ["originator", "user-agent"]
        .iter()
        .any(|h| ex.header(h).is_some_and(|v| v.starts_with(b"codex_")))
}

pub async fn list(ex: &mut Exchange) -> Result<(), ApiError> {
    if is_codex(ex) {
        let (body, etag) = &*CODEX_CATALOGUE;
        if ex.header("if-none-match") == Some(etag.as_bytes()) {
            ex.send(
                304,
                "application/json",
                &[("etag", etag.clone())],
                Bytes::new(),
            )
            .await;
            return Ok(());
        }
        ex.send(
            200,
            "application/json",
            &[("etag", etag.clone())],
            body.clone(),
        )
        .await;
    } else {
        ex.send(200, "application/json", &[], MODEL_LIST.clone())
            .await;
    }
    Ok(())
}

pub async fn retrieve(ex: &mut Exchange, id: &str) -> Result<(), ApiError> {
    let model = catalog::find(id).ok_or_else(|| ApiError::model_not_found(id))?;
    ex.send_json(200, &Model::from(model), &[]).await;
    Ok(())
}
