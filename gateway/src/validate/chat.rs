//! Rules for `POST /v1/chat/completions`.

use crate::api::chat::{ChatCompletionRequest, ContentPart, MessageContent};
use crate::catalog::{self, ModelSpec};
use crate::error::ApiError;

/// What validation learned that later stages need.
#[derive(Debug, Clone)]
pub struct ChatPlan {
    pub model: &'static ModelSpec,
    pub stream: bool,
    pub include_usage: bool,
    /// Reasoning was requested (`reasoning_content` is then a string, else null).
    pub reasoning: bool,
    pub reasoning_budget: u32,
    pub max_tokens: u32,
    pub stop: Vec<String>,
}

pub fn validate(req: &ChatCompletionRequest) -> Result<ChatPlan, ApiError> {
    let model_id = req
        .model
        .as_deref()
        .ok_or_else(|| ApiError::missing_parameter("model"))?;
    let model = catalog::find(model_id).ok_or_else(|| ApiError::model_not_found(model_id))?;
    let messages = req
        .messages
        .as_ref()
        .ok_or_else(|| ApiError::missing_parameter("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "'messages' must contain at least one message.",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        let role = m
            .role
            .as_deref()
            .ok_or_else(|| ApiError::missing_parameter(format!("messages.{i}.role")))?;
        match role {
            "system" | "developer" | "user" | "assistant" | "tool" => {}
            other => {
                return Err(ApiError::invalid_value(
                    format!("messages.{i}.role"),
                    format!(
                    "Invalid role '{other}'; expected system, developer, user, assistant or tool."
                ),
                ))
            }
        }
        if role == "tool" && m.tool_call_id.is_none() {
            return Err(ApiError::missing_parameter(format!(
                "messages.{i}.tool_call_id"
            )));
        }
        if m.content.is_none()
            && !(role == "assistant" && m.tool_calls.as_ref().is_some_and(|t| !t.is_empty()))
        {
            return Err(ApiError::missing_parameter(format!("messages.{i}.content")));
        }
        if let Some(MessageContent::Parts(parts)) = &m.content {
            for (j, part) in parts.iter().enumerate() {
                if let ContentPart::ImageUrl { .. } = part {
                    if !model.image_input {
                        return Err(ApiError::invalid_value(
                            format!("messages.{i}.content.{j}"),
                            format!(
                                "Model '{}' does not accept image input; use 'base'.",
                                model.id
                            ),
                        ));
                    }
                }
            }
        }
    }
    if let Some(t) = req.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid_value(
                "temperature",
                format!("'temperature' must be between 0 and 2, got {t}."),
            ));
        }
    }
    if let Some(p) = req.top_p {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::invalid_value(
                "top_p",
                format!("'top_p' must be between 0 and 1, got {p}."),
            ));
        }
    }
    let max_tokens = match (req.max_completion_tokens, req.max_tokens) {
        (Some(v), _) => positive_u32("max_completion_tokens", v)?,
        (None, Some(v)) => positive_u32("max_tokens", v)?,
        (None, None) => 0,
    };
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid_value(
            "stop",
            "'stop' takes at most 4 sequences.",
        ));
    }
    let reasoning = req.enable_thinking.unwrap_or(false);
    let reasoning_budget = match req.thinking_budget {
        Some(b) if !(0..=16384).contains(&b) => {
            return Err(ApiError::invalid_value(
                "thinking_budget",
                format!("'thinking_budget' must be between 0 and 16384, got {b}."),
            ))
        }
        Some(b) => b as u32,
        None => 0,
    };
    Ok(ChatPlan {
        model,
        stream: req.stream.unwrap_or(false),
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        reasoning,
        reasoning_budget,
        max_tokens,
        stop,
    })
}

fn positive_u32(param: &str, v: i64) -> Result<u32, ApiError> {
    if v < 1 {
        return Err(ApiError::invalid_value(
            param,
            format!("'{param}' must be at least 1, got {v}."),
        ));
    }
    u32::try_from(v).map_err(|_| ApiError::invalid_value(param, format!("'{param}' is too large.")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::json_body;

    fn check(body: &str) -> Result<ChatPlan, ApiError> {
        validate(&json_body::<ChatCompletionRequest>(body.as_bytes())?)
    }

    #[test]
    fn minimal_request_is_valid() {
        let plan =
            check(r#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(plan.model.id, "base");
        assert!(!plan.stream && !plan.reasoning);
    }

    #[test]
    fn unknown_model_is_404() {
        let e =
            check(r#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#).unwrap_err();
        assert_eq!((e.status, e.code.as_ref()), (404, "model_not_found"));
    }

    #[test]
    fn bounds_name_their_param() {
        for (body, param) in [
            (
                r#"{"model":"base","messages":[{"role":"user","content":"x"}],"temperature":2.5}"#,
                "temperature",
            ),
            (
                r#"{"model":"base","messages":[{"role":"user","content":"x"}],"top_p":-0.1}"#,
                "top_p",
            ),
            (
                r#"{"model":"base","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"base","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e"]}"#,
                "stop",
            ),
            (
                r#"{"model":"base","messages":[{"role":"user","content":"x"}],"thinking_budget":16385}"#,
                "thinking_budget",
            ),
            (
                r#"{"model":"base","messages":[{"role":"tool","content":"x"}]}"#,
                "messages.0.tool_call_id",
            ),
        ] {
            let e = check(body).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}");
        }
    }

    #[test]
    fn images_only_on_base() {
        let img = r#"[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]"#;
        assert!(check(&format!(
            r#"{{"model":"base","messages":[{{"role":"user","content":{img}}}]}}"#
        ))
        .is_ok());
        let e = check(&format!(
            r#"{{"model":"base-mini","messages":[{{"role":"user","content":{img}}}]}}"#
        ))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages.0.content.0"));
    }
}
