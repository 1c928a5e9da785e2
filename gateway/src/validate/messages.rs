//! Rules for the Anthropic Messages API (`POST /v1/messages`, and the same
//! body on `/v1/messages/count_tokens`).
//!
//! Parsing (`api::messages`) already refused unknown top-level fields
//! (except the beta fields it lists) and wrong JSON types. Here:
//!
//! | field | what happens |
//! |---|---|
//! | `model`, `messages`, `max_tokens` (≥ 1) | required; unknown model → 404 |
//! | `max_tokens` at or over the model's window | clamped: the reply may use the rest of the window after the prompt (Claude Code sends 32,000 whatever the model) |
//! | `messages.N.role` | `user`, `assistant`, or `system` (Claude Code sends one; it joins the system prompt where it stands) |
//! | blocks | `text`, `image` (models with image input), `tool_use` (assistant), `tool_result` (user), `thinking`/`redacted_thinking` (assistant; signatures not checked); `document` → 400 |
//! | `system` | a string or `text` blocks |
//! | `temperature` 0..1, `top_p` 0..1, `stop_sequences` (≤ 4, non-empty) | honoured; the stop sequence that ended a reply is its `stop_sequence` |
//! | `top_k` ≥ 0 | honoured: sampling keeps the k likeliest tokens (0: no cut); by the in-process engine, and vLLM, SGLang and llama-server upstream (an `openai`-kind upstream has no such field) |
//! | `tools` | custom tools (`input_schema` required, checked as the other APIs check schemas; `strict` applies their strict rules); server tools → 400 naming `tools.N.type` |
//! | `tool_choice` | `auto`, `any`, `tool` (with `name` among the tools), `none`; `disable_parallel_tool_use` |
//! | `thinking` | `enabled` (`budget_tokens` ≥ 1, capped at 16,384 and applied on models with a configurable budget), `adaptive` (the model's default budget), `disabled`; `display: omitted` sends thinking blocks without their text |
//! | `output_config.effort` | `low`, `medium`, `high`, `max` (as `high`): the reasoning effort |
//! | `service_tier` | `auto` (the key's plan decides), `standard_only` (`default`) |
//! | `metadata.user_id`, `cache_control`, `context_management`, a tool's `defer_loading`/`input_examples`/`eager_input_streaming` | accepted and ignored |

use super::common::{self, check_at_least, check_range, FunctionSpec};
use crate::api::messages::{Block, Content, MessagesRequest, Tool, ToolResultContent};
use crate::catalog::{Catalog, ModelSpec};
use crate::error::ApiError;

/// What validation learned that later stages need.
#[derive(Debug, Clone)]
pub struct ValidMessagesRequest {
    pub model: &'static ModelSpec,
    pub stream: bool,
    /// The worker's `max_tokens`: the request's, or 0 (the rest of the
    /// window) when the request's would not fit the window whatever the
    /// prompt.
    pub max_tokens: u32,
    /// What admission reserves for the output: the request's bound, no
    /// more than the window.
    pub max_output: u32,
    pub stop: Vec<String>,
    /// `top_k`, when it cuts (0 does not).
    pub top_k: Option<u32>,
    pub reasoning: bool,
    /// Hard cap on reasoning tokens; 0 = the model's default.
    pub reasoning_budget: u32,
    /// `low`, `medium`, `high`, or empty.
    pub effort: &'static str,
    /// `thinking.display: "omitted"`: thinking blocks carry no text.
    pub omit_thinking: bool,
    /// The public tier name the plan is asked for.
    pub service_tier: Option<&'static str>,
    /// `max_tokens` as requested.
    pub requested_max_tokens: u32,
}

impl ValidMessagesRequest {
    /// Clamps `max_tokens` to `window` as to the catalogue's (see
    /// [`validate`]): the window the model's workers report, which for a
    /// small real model is well below the catalogue's.
    pub fn fit_window(&mut self, window: u32) {
        if self.requested_max_tokens >= window {
            self.max_tokens = 0;
            self.max_output = self.max_output.min(window);
        }
    }
}

/// Checks a parsed request against every rule above.
pub fn validate(
    catalog: &Catalog,
    req: &MessagesRequest,
) -> Result<ValidMessagesRequest, ApiError> {
    let model = common::check_model(catalog, req.model.as_deref())?;
    let requested = req
        .max_tokens
        .ok_or_else(|| ApiError::missing_parameter("max_tokens"))
        .and_then(|v| check_at_least("max_tokens", v, 1))?;
    let messages = common::check_messages_given(req.messages.as_ref())?;
    let mut input_bytes = match &req.system {
        None => 0,
        Some(system) => check_content("system", system, model, Role::System)?,
    };
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_deref() {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some("system") => Role::System,
            None => return Err(ApiError::missing_parameter(format!("messages.{i}.role"))),
            Some(other) => {
                return Err(ApiError::invalid_value(
                    format!("messages.{i}.role"),
                    format!("Invalid role '{other}': use 'user' or 'assistant'."),
                ))
            }
        };
        let content = m
            .content
            .as_ref()
            .ok_or_else(|| ApiError::missing_parameter(format!("messages.{i}.content")))?;
        input_bytes += check_content(&format!("messages.{i}.content"), content, model, role)?;
    }

    // ---- sampling -------------------------------------------------------------
    if let Some(t) = req.temperature {
        check_range("temperature", t, 0.0, 1.0)?;
    }
    if let Some(p) = req.top_p {
        check_range("top_p", p, 0.0, 1.0)?;
    }
    if let Some(k) = req.top_k {
        check_at_least("top_k", k, 0)?;
    }
    let stop = req
        .stop_sequences
        .clone()
        .map(|s| s.into_vec())
        .unwrap_or_default();
    common::check_stops(&stop, |i| format!("stop_sequences.{i}"))?;

    // ---- tools ----------------------------------------------------------------
    let tools = req.tools.as_deref().unwrap_or_default();
    for (i, tool) in tools.iter().enumerate() {
        check_tool(i, tool)?;
        if tools[..i].iter().any(|t| t.name == tool.name) {
            return Err(ApiError::invalid_value(
                format!("tools.{i}.name"),
                "Tool names must be unique.",
            ));
        }
    }
    if let Some(choice) = &req.tool_choice {
        let kind = choice
            .kind
            .as_deref()
            .ok_or_else(|| ApiError::missing_parameter("tool_choice.type"))?;
        match kind {
            "auto" | "none" => {}
            "any" | "tool" if tools.is_empty() => {
                return Err(ApiError::invalid_value(
                    "tool_choice.type",
                    format!("'tool_choice' of type '{kind}' needs 'tools'."),
                ))
            }
            "any" => {}
            "tool" => {
                let name = choice
                    .name
                    .as_deref()
                    .ok_or_else(|| ApiError::missing_parameter("tool_choice.name"))?;
                if !tools.iter().any(|t| t.name.as_deref() == Some(name)) {
                    return Err(ApiError::invalid_value(
                        "tool_choice.name",
                        format!("No tool named '{name}' is in 'tools'."),
                    ));
                }
            }
            other => {
                return Err(ApiError::invalid_value(
                    "tool_choice.type",
                    format!("Invalid value '{other}': use 'auto', 'any', 'tool' or 'none'."),
                ))
            }
        }
    }

    // ---- thinking -------------------------------------------------------------
    let (mut reasoning, mut budget, mut omit_thinking) = (false, 0, false);
    if let Some(t) = &req.thinking {
        match t.kind.as_deref() {
            None => return Err(ApiError::missing_parameter("thinking.type")),
            Some("disabled") => {}
            Some("adaptive") => reasoning = true,
            Some("enabled") => {
                let b = t
                    .budget_tokens
                    .ok_or_else(|| ApiError::missing_parameter("thinking.budget_tokens"))
                    .and_then(|b| check_at_least("thinking.budget_tokens", b, 1))?;
                reasoning = true;
                // Anthropic's budgets run far past ours: capped, not refused.
                budget = b.min(common::MAX_THINKING_BUDGET as u32);
            }
            Some(other) => {
                return Err(ApiError::invalid_value(
                    "thinking.type",
                    format!("Invalid value '{other}': use 'enabled', 'adaptive' or 'disabled'."),
                ))
            }
        }
        match t.display.as_deref() {
            None | Some("summarized") => {}
            Some("omitted") => omit_thinking = true,
            Some(other) => {
                return Err(ApiError::invalid_value(
                    "thinking.display",
                    format!("Invalid value '{other}': use 'summarized' or 'omitted'."),
                ))
            }
        }
    }
    let effort = match req.output_config.as_ref().and_then(|o| o.effort.as_deref()) {
        None => "",
        Some("low") => "low",
        Some("medium") => "medium",
        Some("high" | "max") => "high",
        Some(other) => {
            return Err(ApiError::invalid_value(
                "output_config.effort",
                format!("Invalid value '{other}': use 'low', 'medium', 'high' or 'max'."),
            ))
        }
    };
    let service_tier = match req.service_tier.as_deref() {
        None => None,
        Some("auto") => Some("auto"),
        Some("standard_only") => Some("default"),
        Some(other) => {
            return Err(ApiError::invalid_value(
                "service_tier",
                format!("Invalid value '{other}': use 'auto' or 'standard_only'."),
            ))
        }
    };

    // ---- the context window ---------------------------------------------------
    // A bound at or past the window leaves no room for any prompt: it is
    // clamped to the rest of the window (the worker's `max_tokens: 0`)
    // rather than refused.
    let window = model.context_window;
    let max_tokens = if requested >= window { 0 } else { requested };
    let max_output = requested.min(window);
    common::check_context_window(
        model,
        input_bytes,
        Some(max_tokens),
        "messages",
        "max_tokens",
    )?;

    Ok(ValidMessagesRequest {
        model,
        stream: req.stream.unwrap_or(false),
        max_tokens,
        max_output,
        stop,
        top_k: req
            .top_k
            .filter(|k| *k > 0)
            .map(|k| u32::try_from(k).unwrap_or(u32::MAX)),
        reasoning,
        reasoning_budget: if model.reasoning_budget { budget } else { 0 },
        effort,
        omit_thinking,
        service_tier,
        requested_max_tokens: requested,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    System,
    User,
    Assistant,
}

/// Checks a `content` (or `system`) field; returns its text bytes for the
/// early context check.
fn check_content(
    param: &str,
    content: &Content,
    model: &ModelSpec,
    role: Role,
) -> Result<usize, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(t.len()),
        Content::Blocks(b) => b,
    };
    let mut bytes = 0;
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{param}.{j}");
        let allowed = match block {
            Block::Text { text } => {
                bytes += text.len();
                true
            }
            Block::Image { .. } => {
                check_image(&at, block, model)?;
                role == Role::User
            }
            Block::ToolUse { input, name, .. } => {
                bytes += name.len() + input.to_string().len();
                if !input.is_object() {
                    return Err(ApiError::invalid_type(
                        format!("{at}.input"),
                        "A tool_use block's 'input' must be a JSON object.",
                    ));
                }
                role == Role::Assistant
            }
            Block::ToolResult { content, .. } => {
                match content {
                    None => {}
                    Some(ToolResultContent::Text(t)) => bytes += t.len(),
                    Some(ToolResultContent::Blocks(inner)) => {
                        bytes += check_result_blocks(&format!("{at}.content"), inner, model)?
                    }
                }
                role == Role::User
            }
            Block::Thinking { thinking, .. } => {
                bytes += thinking.len();
                role == Role::Assistant
            }
            Block::RedactedThinking { .. } => role == Role::Assistant,
            Block::Document { .. } => {
                return Err(ApiError::unsupported_value(
                    format!("{at}.type"),
                    "Document blocks are not supported: send the text as a 'text' block.",
                ))
            }
        };
        if !allowed {
            return Err(ApiError::invalid_value(
                format!("{at}.type"),
                format!("This block type is not allowed in a {role:?} message.").to_lowercase(),
            ));
        }
    }
    Ok(bytes)
}

/// A tool result's blocks: text and images only.
fn check_result_blocks(
    param: &str,
    blocks: &[Block],
    model: &ModelSpec,
) -> Result<usize, ApiError> {
    let mut bytes = 0;
    for (k, b) in blocks.iter().enumerate() {
        let at = format!("{param}.{k}");
        match b {
            Block::Text { text } => bytes += text.len(),
            Block::Image { .. } => check_image(&at, b, model)?,
            _ => {
                return Err(ApiError::invalid_value(
                    format!("{at}.type"),
                    "A tool result holds 'text' and 'image' blocks only.",
                ))
            }
        }
    }
    Ok(bytes)
}

fn check_image(at: &str, block: &Block, model: &ModelSpec) -> Result<(), ApiError> {
    if !model.image_input {
        return Err(ApiError::unsupported_value(
            format!("{at}.type"),
            format!("The model '{}' does not accept images.", model.id),
        ));
    }
    let Block::Image { source } = block else {
        return Ok(());
    };
    if source.url().is_none() {
        return Err(ApiError::invalid_value(
            format!("{at}.source"),
            "An image source is {type:'base64', media_type, data} or {type:'url', url}.",
        ));
    }
    Ok(())
}

/// One tool: a custom tool with a valid schema, nothing it does not define.
fn check_tool(i: usize, tool: &Tool) -> Result<(), ApiError> {
    match tool.kind.as_deref() {
        None | Some("custom") => {}
        Some(other) => {
            return Err(ApiError::unsupported_value(
                format!("tools.{i}.type"),
                format!("Server tools ('{other}') are not supported: define a custom tool with 'name' and 'input_schema', and run it yourself."),
            ))
        }
    }
    if let Some(key) = tool.other.keys().next() {
        return Err(ApiError::unknown_parameter(format!("tools.{i}.{key}")));
    }
    if tool.input_schema.as_ref().is_none_or(|s| s.is_null()) {
        return Err(ApiError::missing_parameter(format!(
            "tools.{i}.input_schema"
        )));
    }
    let prefix = format!("tools.{i}");
    common::check_function_tool(&FunctionSpec {
        prefix: &prefix,
        name: tool.name.as_deref(),
        parameters: tool.input_schema.as_ref(),
        strict: tool.strict.unwrap_or(false),
    })
    // The shared check names the schema as the other APIs do.
    .map_err(|mut e| {
        if let Some(p) = &mut e.param {
            if let Some(head) = p.strip_suffix(".parameters") {
                *p = format!("{head}.input_schema");
            }
        }
        e
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::json_body;

    fn check(body: &str) -> Result<ValidMessagesRequest, ApiError> {
        let req: MessagesRequest = json_body(body.as_bytes())?;
        validate(&Catalog::default(), &req)
    }

    fn param(body: &str) -> (u16, String, String) {
        let e = check(body).unwrap_err();
        (e.status, e.code.to_string(), e.param.unwrap_or_default())
    }

    const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn a_max_tokens_past_the_window_is_clamped_not_refused() {
        let v = check(&format!(
            r#"{{"model":"base","max_tokens":32000000,{MSG}}}"#
        ))
        .unwrap();
        assert_eq!(v.max_tokens, 0, "the rest of the window");
        assert_eq!(v.max_output, v.model.context_window);
        let mut v = check(&format!(r#"{{"model":"base","max_tokens":32000,{MSG}}}"#)).unwrap();
        assert_eq!((v.max_tokens, v.max_output), (32000, 32000));
        // Workers whose window is smaller than the catalogue's.
        v.fit_window(8192);
        assert_eq!((v.max_tokens, v.max_output), (0, 8192));
        let mut v = check(&format!(r#"{{"model":"base","max_tokens":64,{MSG}}}"#)).unwrap();
        v.fit_window(8192);
        assert_eq!((v.max_tokens, v.max_output), (64, 64));
    }

    #[test]
    fn required_fields_and_their_params() {
        assert_eq!(
            param(&format!(r#"{{"model":"base",{MSG}}}"#)),
            (
                400,
                "missing_required_parameter".into(),
                "max_tokens".into()
            )
        );
        assert_eq!(
            param(&format!(r#"{{"model":"nope","max_tokens":5,{MSG}}}"#)).0,
            404
        );
        assert_eq!(
            param(r#"{"model":"base","max_tokens":5,"messages":[{"role":"tool","content":"x"}]}"#)
                .2,
            "messages.0.role"
        );
    }

    #[test]
    fn server_tools_and_bad_schemas_name_their_field() {
        let server = format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"tools":[{{"type":"web_search_20250305","name":"web_search"}}]}}"#
        );
        assert_eq!(
            param(&server),
            (400, "unsupported_value".into(), "tools.0.type".into())
        );
        let bad = format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"tools":[{{"name":"f","input_schema":{{"type":"nope"}}}}]}}"#
        );
        assert_eq!(param(&bad).2, "tools.0.input_schema");
        let extra = format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"tools":[{{"name":"f","input_schema":{{"type":"object"}},"bogus":1}}]}}"#
        );
        assert_eq!(
            param(&extra),
            (400, "unknown_parameter".into(), "tools.0.bogus".into())
        );
        let claude_code = format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"tools":[{{"name":"f","input_schema":{{"type":"object"}},"defer_loading":true,"cache_control":{{"type":"ephemeral"}}}}]}}"#
        );
        assert!(check(&claude_code).is_ok());
    }

    #[test]
    fn thinking_maps_to_reasoning() {
        let v = check(&format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"thinking":{{"type":"enabled","budget_tokens":99999}}}}"#
        ))
        .unwrap();
        assert!(v.reasoning);
        assert_eq!(v.reasoning_budget, common::MAX_THINKING_BUDGET as u32);
        let v = check(&format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"thinking":{{"type":"adaptive","display":"omitted"}},"output_config":{{"effort":"max"}}}}"#
        ))
        .unwrap();
        assert!(v.reasoning && v.omit_thinking);
        assert_eq!((v.reasoning_budget, v.effort), (0, "high"));
        let v = check(&format!(
            r#"{{"model":"base","max_tokens":5,{MSG},"thinking":{{"type":"disabled"}}}}"#
        ))
        .unwrap();
        assert!(!v.reasoning);
    }

    #[test]
    fn tool_choice_names_a_listed_tool() {
        let body = |choice: &str| {
            format!(
                r#"{{"model":"base","max_tokens":5,{MSG},"tools":[{{"name":"f","input_schema":{{"type":"object"}}}}],"tool_choice":{choice}}}"#
            )
        };
        assert!(check(&body(r#"{"type":"tool","name":"f"}"#)).is_ok());
        assert_eq!(
            param(&body(r#"{"type":"tool","name":"g"}"#)).2,
            "tool_choice.name"
        );
        assert_eq!(
            param(&body(r#"{"type":"sometimes"}"#)).2,
            "tool_choice.type"
        );
    }

    #[test]
    fn blocks_are_checked_by_role() {
        let body = r#"{"model":"base","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"toolu_1","name":"f","input":{}}]}]}"#;
        assert_eq!(param(body).2, "messages.0.content.0.type");
        let body = r#"{"model":"base","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#;
        assert_eq!(param(body).1, "unsupported_value");
        let body = r#"{"model":"base","max_tokens":5,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"system","content":"more"},{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"x"},{"type":"redacted_thinking","data":"y"},{"type":"tool_use","id":"toolu_1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"42","is_error":false}]}]}"#;
        check(body).unwrap();
    }
}
