//! `GET /v1/models` and `GET /v1/models/{model}`. Codex CLI requests get
//! the Codex catalogue on the list route, with a stable `ETag`; Anthropic
//! clients (an `anthropic-version` header) get Anthropic's shapes and
//! error envelope.

use crate::api::models::{
    AnthropicModel, AnthropicModelList, CodexCatalogue, CodexModel, Model, ModelList,
    ReasoningLevel, TruncationPolicy,
};
use crate::catalog::{Catalog, ModelSpec};
use crate::error::ApiError;
use crate::http::Dialect;
use crate::http::Exchange;
use bytes::Bytes;
use sha2::{Digest, Sha256};

/// The list body (a few hundred bytes: encoded per request).
fn model_list(catalog: &Catalog) -> Bytes {
    let list = ModelList {
        object: "list",
        data: catalog.models().iter().copied().map(Model::from).collect(),
    };
    serde_json::to_vec(&list).unwrap_or_default().into()
}

/// The Codex catalogue and its ETag (a digest of the body, so it changes
/// exactly when the catalogue does).
fn codex_catalogue(catalog: &Catalog) -> (Bytes, String) {
    let mut models: Vec<CodexModel> = catalog
        .models()
        .iter()
        .copied()
        .map(CodexModel::from)
        .collect();
    models.sort_by_key(|m| m.priority);
    let body = serde_json::to_vec(&CodexCatalogue { models }).unwrap_or_default();
    let etag = format!("\"{}\"", &hex::encode(Sha256::digest(&body))[..32]);
    (body.into(), etag)
}

/// The system prompt the catalogue gives Codex for every model. Short, so a
/// small model's context is left to the conversation (Codex's own default
/// prompt with its tool schemas is about 6,200 tokens).
const CODEX_BASE_INSTRUCTIONS: &str = "You are Codex, a coding agent working in the user's \
    terminal and workspace. Be concise and direct. When a task needs facts about the workspace, \
    use the provided tools to read files and run commands instead of guessing, and never invent \
    command output. Respect the sandbox and approval settings you are given. Make focused \
    changes that follow the conventions of the existing code. End with a short summary of what \
    you did and anything left for the user.";

/// Codex identifies itself by `originator` or `User-Agent` starting `codex_`.
fn is_codex(ex: &Exchange) -> bool {
    ["originator", "user-agent"]
        .iter()
        .any(|h| ex.header(h).is_some_and(|v| v.starts_with(b"codex_")))
}

/// An Anthropic client sends `anthropic-version` on every request.
pub fn dialect(ex: &Exchange) -> Dialect {
    if ex.header("anthropic-version").is_some() {
        Dialect::Anthropic
    } else {
        Dialect::OpenAi
    }
}

/// Anthropic's list: every model, one page (`has_more: false`).
fn anthropic_list(catalog: &Catalog) -> AnthropicModelList {
    let data: Vec<AnthropicModel> = catalog
        .models()
        .iter()
        .copied()
        .map(AnthropicModel::from)
        .collect();
    AnthropicModelList {
        first_id: data.first().map(|m| m.id),
        last_id: data.last().map(|m| m.id),
        data,
        has_more: false,
    }
}

pub async fn list(catalog: &Catalog, ex: &mut Exchange) -> Result<(), ApiError> {
    if ex.dialect == Dialect::Anthropic {
        ex.send_json(200, &anthropic_list(catalog), &[]).await;
    } else if is_codex(ex) {
        let (body, etag) = codex_catalogue(catalog);
        ex.send_cacheable("application/json", &etag, body).await;
    } else {
        ex.send(200, "application/json", &[], model_list(catalog))
            .await;
    }
    Ok(())
}

pub async fn retrieve(catalog: &Catalog, ex: &mut Exchange, id: &str) -> Result<(), ApiError> {
    let model = catalog
        .find(id)
        .ok_or_else(|| ApiError::model_not_found(id))?;
    if ex.dialect == Dialect::Anthropic {
        ex.send_json(200, &AnthropicModel::from(model), &[]).await;
    } else {
        ex.send_json(200, &Model::from(model), &[]).await;
    }
    Ok(())
}

impl From<&ModelSpec> for AnthropicModel {
    fn from(m: &ModelSpec) -> Self {
        AnthropicModel {
            kind: "model",
            id: m.id,
            display_name: m.display_name,
            // The catalogue has no dates; a fixed one keeps the list stable.
            created_at: "2025-01-01T00:00:00Z",
            max_input_tokens: m.context_window,
            max_tokens: m.context_window,
        }
    }
}

impl From<&ModelSpec> for Model {
    fn from(m: &ModelSpec) -> Self {
        Model {
            id: m.id,
            object: "model",
            created: 0,
            owned_by: "base",
        }
    }
}

impl From<&ModelSpec> for CodexModel {
    fn from(m: &ModelSpec) -> Self {
        let levels = [
            ("minimal", "Fastest answers, very little reasoning"),
            ("low", "Quick answers with light reasoning"),
            ("medium", "Balanced reasoning depth and speed"),
            ("high", "Deepest reasoning for hard problems"),
        ];
        CodexModel {
            slug: m.id,
            display_name: m.display_name,
            description: m.description,
            default_reasoning_level: "medium",
            supported_reasoning_levels: levels
                .iter()
                .map(|(effort, description)| ReasoningLevel {
                    effort,
                    description,
                })
                .collect(),
            shell_type: "default",
            visibility: "list",
            supported_in_api: true,
            priority: m.priority,
            base_instructions: CODEX_BASE_INSTRUCTIONS,
            supports_reasoning_summaries: true,
            support_verbosity: false,
            default_verbosity: None,
            truncation_policy: TruncationPolicy {
                mode: "tokens",
                limit: 10_000,
            },
            supports_parallel_tool_calls: true,
            context_window: m.context_window,
            experimental_supported_tools: Vec::new(),
            input_modalities: if m.image_input {
                vec!["text", "image"]
            } else {
                vec!["text"]
            },
        }
    }
}
