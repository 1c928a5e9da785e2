//! Wire types of `GET /v1/models` and `GET /v1/models/{model}`, and the
//! Codex CLI's catalogue format served on the same route.

use crate::catalog::ModelSpec;
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

#[derive(Debug, Serialize)]
pub struct Model {
    pub id: &'static str,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
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

/// `{"models":[...]}`: what the Codex CLI expects from `GET /models`.
#[derive(Debug, Serialize)]
pub struct CodexCatalogue {
    pub models: Vec<CodexModel>,
}

#[derive(Debug, Serialize)]
pub struct CodexModel {
    pub slug: &'static str,
    pub display_name: &'static str,
    pub description: &'static str,
    pub default_reasoning_level: &'static str,
    pub supported_reasoning_levels: Vec<ReasoningLevel>,
    pub shell_type: &'static str,
    pub visibility: &'static str,
    pub supported_in_api: bool,
    pub priority: i32,
    pub base_instructions: Option<String>,
    pub supports_reasoning_summaries: bool,
    pub support_verbosity: bool,
    pub default_verbosity: Option<String>,
    pub truncation_policy: TruncationPolicy,
    pub supports_parallel_tool_calls: bool,
    pub context_window: u32,
    pub experimental_supported_tools: Vec<String>,
    pub input_modalities: Vec<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct ReasoningLevel {
    pub effort: &'static str,
    pub description: &'static str,
}

#[derive(Debug, Serialize)]
pub struct TruncationPolicy {
    pub mode: &'static str,
    pub limit: u32,
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
            base_instructions: None,
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
