//! Rules for `POST /v1/chat/completions`.
//!
//! Parsing (`parse.rs` into `api::chat`) already rejected unknown top-level
//! fields and wrong JSON types. Here every accepted field is either honoured
//! (carried into the [`ValidChatRequest`] or the worker request), checked and
//! refused with a clear 400 when this service cannot serve it, or — only
//! where ignoring it cannot change the reply — accepted and ignored:
//!
//! | field | what happens |
//! |---|---|
//! | `model`, `messages` | required; unknown model → 404 `model_not_found` |
//! | `temperature` 0..2, `top_p` 0..1, `seed`, `presence_penalty`/`frequency_penalty` -2..2, `stop` (≤ 4, each ≤ 256 characters, checked while parsing) | honoured by the worker |
//! | `max_tokens`, `max_completion_tokens` ≥ 1 | honoured; the latter wins when both are set |
//! | `tools`, `tool_choice`, `parallel_tool_calls`, `response_format` | honoured (see `common`) |
//! | `stream`, `stream_options` | honoured; `stream_options` needs `stream: true` |
//! | `enable_thinking`, `reasoning_effort`, `thinking_budget` | honoured; the effort wins over `enable_thinking` (`none` = off); the budget applies on `base` only (a hard cap; 0 turns reasoning off) and is ignored on the other two (their budget is fixed), so switching models keeps a request valid (spec 9.3) |
//! | `prompt_cache_key` | honoured (worker prefix cache) |
//! | `n` | 1 only; `n > 1` → 400 `unsupported_value` |
//! | `logprobs: true`, `top_logprobs > 0`, non-empty `logit_bias` | 400 `unsupported_parameter` (ranges checked first) |
//! | `modalities` other than `["text"]`, `audio` | 400 `unsupported_value` / `unsupported_parameter` |
//! | `web_search_options` | 400 `unsupported_parameter` (no hosted tools) |
//! | `verbosity` other than `medium` | 400 `unsupported_value` |
//! | `functions`, `function_call` (deprecated) | 400 `unsupported_parameter`: use `tools`/`tool_choice` |
//! | `planner_mode: true` | needs the `x-session-id` header (400 `missing_required_parameter`, param `x-session-id`); routes to the planner. There a JSON `response_format`, `stop` and reasoning are 400 `unsupported_parameter` (the planner's answer is text it composes itself); `tool_choice` `required` or a named function makes the plan call a tool; tool messages are checked against the session's paused plan, not the history |
//! | `agents` | at most 16 addresses, each an `http(s)://` URL or a directory id (`[A-Za-z0-9._-]`, ≤ 64), else 400 `invalid_value` naming `agents.N`; only with `planner_mode: true` (400 naming `agents` otherwise) |
//! | `user`, `safety_identifier`, `metadata`, `store`, `service_tier`, `prediction` | checked (`metadata` while parsing), then ignored: none changes the reply (chat completions are not stored; `service_tier` is always `default`) |

use super::common::{
    self, check_at_least, check_range, check_tool_type, FormatKind, FormatSpec, FunctionSpec,
};
use crate::api::chat::{ChatCompletionRequest, ChatMessage, ContentPart, MessageContent};
use crate::catalog::{Catalog, ModelSpec};
use crate::error::ApiError;
use serde_json::Value;

/// What validation learned that later stages need.
#[derive(Debug, Clone)]
pub struct ValidChatRequest {
    pub model: &'static ModelSpec,
    pub stream: bool,
    pub include_usage: bool,
    /// Reasoning was requested (`reasoning_content` is then a string, else null).
    pub reasoning: bool,
    /// Hard cap on reasoning tokens; 0 = the model's default (always 0 on
    /// models whose budget is not configurable).
    pub reasoning_budget: u32,
    /// 0 = up to the remaining context window.
    pub max_tokens: u32,
    pub stop: Vec<String>,
    /// The output format asked for.
    pub format: FormatKind,
    /// `planner_mode: true` (with a session): the planner answers.
    pub planner: bool,
}

/// Request facts that live outside the body.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatHeaders<'a> {
    /// `x-session-id`: groups a session; required by planner mode.
    pub session_id: Option<&'a str>,
}

/// Checks a parsed request against every rule of the chat contract.
pub fn validate(
    catalog: &Catalog,
    req: &ChatCompletionRequest,
    headers: &ChatHeaders<'_>,
) -> Result<ValidChatRequest, ApiError> {
    let model = common::check_model(catalog, req.model.as_deref())?;
    let messages = common::check_messages_given(req.messages.as_ref())?;
    let planner = req.planner_mode == Some(true);
    let input_bytes = check_messages(messages, model, planner)?;

    // ---- sampling -------------------------------------------------------------
    common::check_openai_sampling(
        req.temperature,
        req.top_p,
        req.presence_penalty,
        req.frequency_penalty,
    )?;
    let max_completion = req
        .max_completion_tokens
        .map(|v| check_at_least("max_completion_tokens", v, 1))
        .transpose()?;
    let max_tokens = req
        .max_tokens
        .map(|v| check_at_least("max_tokens", v, 1))
        .transpose()?;
    let (max_output, output_param) = match (max_completion, max_tokens) {
        (Some(v), _) => (Some(v), "max_completion_tokens"),
        (None, v) => (v, "max_tokens"),
    };
    // Count and length are bounded while parsing (`api::bounds`).
    let stop = match &req.stop {
        None => Vec::new(),
        Some(s) => s.clone().into_vec(),
    };
    common::check_stops(&stop, |i| {
        if matches!(req.stop, Some(crate::api::chat::StopSequences::One(_))) {
            "stop".to_string()
        } else {
            format!("stop.{i}")
        }
    })?;
    check_unservable(req)?;

    // ---- tools and formats ----------------------------------------------------
    let tool_names = check_tools(req)?;
    check_tool_choice(req.tool_choice.as_ref(), &tool_names)?;
    let format = match &req.response_format {
        None => FormatKind::Text,
        Some(f) => {
            let schema = f.json_schema.as_ref();
            common::check_format(&FormatSpec {
                prefix: "response_format",
                schema_prefix: "response_format.json_schema",
                kind: f.kind.as_deref(),
                has_schema_object: schema.is_some(),
                name: schema.and_then(|s| s.name.as_deref()),
                schema: schema.and_then(|s| s.schema.as_ref()),
                strict: schema.and_then(|s| s.strict).unwrap_or(false),
            })?
        }
    };

    // ---- reasoning ------------------------------------------------------------
    let (reasoning, reasoning_budget) = common::reasoning(
        model,
        "reasoning_effort",
        req.reasoning_effort.as_deref(),
        req.enable_thinking,
        req.thinking_budget,
    )?;

    // ---- extensions and ignored fields -----------------------------------------
    if let Some(agents) = &req.agents {
        check_agents(agents)?;
    }
    if planner {
        if headers.session_id.is_none_or(|s| s.trim().is_empty()) {
            return Err(ApiError::missing_parameter("x-session-id").with_message(
                "Planner mode resumes a plan by session: send the 'x-session-id' header with 'planner_mode': true.",
            ));
        }
        check_planner_request(req, &format, reasoning)?;
    } else if req.agents.is_some() {
        return Err(ApiError::invalid_value(
            "agents",
            "'agents' lists agents for the planner: it is only allowed with 'planner_mode': true.",
        ));
    }
    if let Some(tier) = req.service_tier.as_deref() {
        common::check_service_tier(tier)?;
    }
    if let Some(p) = &req.prediction {
        check_prediction(p)?;
    }
    let stream = req.stream.unwrap_or(false);
    if req.stream_options.is_some() && !stream {
        return Err(ApiError::invalid_value(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true.",
        ));
    }

    // ---- the context window ---------------------------------------------------
    common::check_context_window(model, input_bytes, max_output, "messages", output_param)?;

    Ok(ValidChatRequest {
        model,
        stream,
        include_usage: req
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        reasoning,
        reasoning_budget,
        max_tokens: max_output.unwrap_or(0),
        stop,
        format,
        planner,
    })
}

/// Most agent addresses in one request.
pub const MAX_AGENTS: usize = 16;

/// `agents`: at most 16 addresses, each an `http(s)://` URL or a
/// directory id.
fn check_agents(agents: &[String]) -> Result<(), ApiError> {
    for (i, a) in agents.iter().enumerate() {
        let param = format!("agents.{i}");
        if i >= MAX_AGENTS {
            return Err(ApiError::invalid_value(
                param,
                format!("'agents' takes at most {MAX_AGENTS} addresses."),
            ));
        }
        let a = a.trim();
        if a.is_empty() {
            return Err(ApiError::invalid_value(
                param,
                "An agent address cannot be empty.",
            ));
        }
        let url = a.starts_with("http://") || a.starts_with("https://");
        let url_ok = url && a.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
        if !(url_ok || (!url && planner::agents::valid_id(a))) {
            return Err(ApiError::invalid_value(
                param,
                format!(
                    "'{}' is neither an http(s):// agent URL nor an agent directory id.",
                    a.chars().take(80).collect::<String>()
                ),
            ));
        }
    }
    Ok(())
}

/// What planner mode cannot honour: its answer is text the planner
/// composes, so output formats, stop sequences and reasoning are refused
/// rather than silently dropped. `tool_choice` is honoured by the plan
/// (`required`: it calls one of the tools; a named function: it calls
/// that one); one that cannot be satisfied was refused by
/// `check_tool_choice`.
fn check_planner_request(
    req: &ChatCompletionRequest,
    format: &FormatKind,
    reasoning: bool,
) -> Result<(), ApiError> {
    if *format != FormatKind::Text {
        return Err(unsupported_parameter(
            "response_format",
            "Planner mode answers in text; send the request without a JSON 'response_format'.",
        ));
    }
    if req.stop.is_some() {
        return Err(unsupported_parameter(
            "stop",
            "'stop' is not supported in planner mode.",
        ));
    }
    if reasoning {
        return Err(unsupported_parameter(
            "reasoning_effort",
            "Reasoning output is not available in planner mode; its 'thought' field says how the plan went.",
        ));
    }
    Ok(())
}

/// Roles, content and the tool-call bookkeeping of the conversation.
/// Returns the number of text bytes the messages carry (for the early
/// context check).
/// In planner mode (`planner`) tool messages answer the session's paused
/// plan, which the planner checks, not calls of the history.
fn check_messages(
    messages: &[ChatMessage],
    model: &ModelSpec,
    planner: bool,
) -> Result<usize, ApiError> {
    let mut bytes = 0usize;
    // Ids of the tool calls of the latest assistant message that made some.
    let mut open_calls: Vec<&str> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m
            .role
            .as_deref()
            .ok_or_else(|| ApiError::missing_parameter(format!("messages.{i}.role")))?;
        if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(ApiError::invalid_value(
                format!("messages.{i}.role"),
                format!(
                    "Invalid value for 'messages.{i}.role': '{role}'. Supported values are: 'system', 'developer', 'user', 'assistant' and 'tool'."
                ),
            ));
        }
        let has_calls = m.tool_calls.as_ref().is_some_and(|t| !t.is_empty());
        if m.tool_calls.is_some() && role != "assistant" {
            return Err(ApiError::invalid_value(
                format!("messages.{i}.tool_calls"),
                format!("'tool_calls' is only allowed on assistant messages, not on '{role}'."),
            ));
        }
        match &m.content {
            None if role == "assistant" && (has_calls || m.refusal.is_some()) => {}
            None => return Err(ApiError::missing_parameter(format!("messages.{i}.content"))),
            Some(MessageContent::Text(t)) => bytes += t.len(),
            Some(MessageContent::Parts(parts)) => {
                if parts.is_empty() && role != "assistant" {
                    return Err(ApiError::invalid_value(
                        format!("messages.{i}.content"),
                        "An array of content parts must hold at least one part.",
                    ));
                }
                for (j, part) in parts.iter().enumerate() {
                    bytes += check_part(i, j, role, part, model)?;
                }
            }
        }
        if let Some(r) = &m.reasoning_content {
            bytes += r.len();
        }
        if let Some(name) = &m.name {
            if name.is_empty() {
                return Err(ApiError::invalid_value(
                    format!("messages.{i}.name"),
                    "'name' cannot be empty.",
                ));
            }
        }
        match role {
            "assistant" => {
                open_calls.clear();
                for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                    let p = format!("messages.{i}.tool_calls.{j}");
                    if call.id.is_empty() {
                        return Err(ApiError::invalid_value(
                            format!("{p}.id"),
                            "A tool call id cannot be empty.",
                        ));
                    }
                    if call.kind != "function" {
                        return Err(ApiError::invalid_value(
                            format!("{p}.type"),
                            format!(
                                "Invalid value for '{p}.type': '{}'. Only 'function' tool calls are supported.",
                                call.kind
                            ),
                        ));
                    }
                    common::check_name(&format!("{p}.function.name"), &call.function.name)?;
                    bytes += call.function.arguments.len() + call.function.name.len();
                    open_calls.push(&call.id);
                }
            }
            "tool" => {
                let id = m.tool_call_id.as_deref().ok_or_else(|| {
                    ApiError::missing_parameter(format!("messages.{i}.tool_call_id"))
                })?;
                if !planner && !open_calls.contains(&id) {
                    return Err(ApiError::invalid_value(
                        format!("messages.{i}.tool_call_id"),
                        format!(
                            "A message with role 'tool' must answer a tool call of the preceding assistant message; no call has id '{id}'."
                        ),
                    ));
                }
            }
            _ => open_calls.clear(),
        }
    }
    Ok(bytes)
}

/// One content part: which kinds each role may send, and image input only on
/// models that take it. Returns the part's text bytes.
fn check_part(
    i: usize,
    j: usize,
    role: &str,
    part: &ContentPart,
    model: &ModelSpec,
) -> Result<usize, ApiError> {
    let param = format!("messages.{i}.content.{j}");
    let kind_not_allowed = |kind: &str| {
        ApiError::invalid_value(
            format!("{param}.type"),
            format!("Content parts of type '{kind}' are not allowed on '{role}' messages."),
        )
    };
    match part {
        ContentPart::Text { text } => Ok(text.len()),
        ContentPart::Refusal { refusal } => {
            if role != "assistant" {
                return Err(kind_not_allowed("refusal"));
            }
            Ok(refusal.len())
        }
        ContentPart::ImageUrl { image_url } => {
            if role != "user" {
                return Err(kind_not_allowed("image_url"));
            }
            if !model.image_input {
                return Err(ApiError::invalid_value(
                    param,
                    format!(
                        "Model '{}' does not accept image input; only 'base' does.",
                        model.id
                    ),
                ));
            }
            let url = image_url.url.as_str();
            let scheme_ok = url.starts_with("https://")
                || url.starts_with("http://")
                || url.starts_with("data:image/");
            if !scheme_ok {
                return Err(ApiError::invalid_value(
                    format!("{param}.image_url.url"),
                    "An image URL must be an 'https://' URL or a 'data:image/...;base64,' URL.",
                ));
            }
            if let Some(detail) = image_url.detail.as_deref() {
                if !["auto", "low", "high"].contains(&detail) {
                    return Err(ApiError::invalid_value(
                        format!("{param}.image_url.detail"),
                        format!("Invalid value for '{param}.image_url.detail': '{detail}'. Supported values are: 'auto', 'low' and 'high'."),
                    ));
                }
            }
            Ok(0)
        }
        ContentPart::InputAudio { .. } | ContentPart::File { .. } => {
            let kind = if matches!(part, ContentPart::File { .. }) {
                "file"
            } else {
                "input_audio"
            };
            if role != "user" {
                return Err(kind_not_allowed(kind));
            }
            Err(ApiError::new(
                400,
                "unsupported_value",
                format!("Content parts of type '{kind}' are not supported; send text (or images to 'base')."),
            )
            .with_param(format!("{param}.type")))
        }
    }
}

/// Public parameters this service accepts but cannot serve: refused clearly
/// rather than ignored, because ignoring them would change the reply.
fn check_unservable(req: &ChatCompletionRequest) -> Result<(), ApiError> {
    if let Some(n) = req.n {
        if n < 1 {
            return Err(ApiError::invalid_value(
                "n",
                format!("'n' must be at least 1, got {n}."),
            ));
        }
        if n > 1 {
            return Err(ApiError::new(
                400,
                "unsupported_value",
                format!("'n' = {n} is not supported: this service returns one choice per request. Send 'n' = 1 and repeat the request for more."),
            )
            .with_param("n"));
        }
    }
    if let Some(bias) = &req.logit_bias {
        match bias {
            Value::Null => {}
            Value::Object(map) => {
                for (token, v) in map {
                    let p = format!("logit_bias.{token}");
                    if token.parse::<u32>().is_err() {
                        return Err(ApiError::invalid_value(
                            p,
                            format!("'logit_bias' keys are token ids; '{token}' is not one."),
                        ));
                    }
                    match v.as_f64() {
                        Some(b) => check_range(&p, b, -100.0, 100.0)?,
                        None => {
                            return Err(ApiError::invalid_type(
                                p.as_str(),
                                format!("'{p}' must be a number between -100 and 100."),
                            ))
                        }
                    }
                }
                if !map.is_empty() {
                    return Err(unsupported_parameter(
                        "logit_bias",
                        "'logit_bias' is not supported: token ids differ between the models behind this service.",
                    ));
                }
            }
            _ => {
                return Err(ApiError::invalid_type(
                    "logit_bias",
                    "'logit_bias' must be an object mapping token ids to numbers.",
                ))
            }
        }
    }
    if let Some(k) = req.top_logprobs {
        if !(0..=20).contains(&k) {
            return Err(ApiError::invalid_value(
                "top_logprobs",
                format!("'top_logprobs' must be between 0 and 20, got {k}."),
            ));
        }
        if k > 0 && req.logprobs != Some(true) {
            return Err(ApiError::invalid_value(
                "top_logprobs",
                "'top_logprobs' requires 'logprobs' to be true.",
            ));
        }
    }
    if req.logprobs == Some(true) {
        return Err(unsupported_parameter(
            "logprobs",
            "'logprobs' is not supported by this service; send 'logprobs': false or omit it.",
        ));
    }
    if let Some(modalities) = &req.modalities {
        if let Some(i) = modalities.iter().position(|m| m != "text") {
            return Err(ApiError::new(
                400,
                "unsupported_value",
                format!(
                    "Only the 'text' output modality is supported, not '{}'.",
                    modalities[i]
                ),
            )
            .with_param(format!("modalities.{i}")));
        }
    }
    if req.audio.as_ref().is_some_and(|a| !a.is_null()) {
        return Err(unsupported_parameter(
            "audio",
            "Audio output is not supported; the models reply in text.",
        ));
    }
    if req
        .web_search_options
        .as_ref()
        .is_some_and(|a| !a.is_null())
    {
        return Err(unsupported_parameter(
            "web_search_options",
            "Web search is not available; tools are function tools that the caller executes.",
        ));
    }
    if let Some(v) = req.verbosity.as_deref() {
        match v {
            "medium" => {}
            "low" | "high" => {
                return Err(ApiError::new(
                    400,
                    "unsupported_value",
                    format!("'verbosity' = '{v}' is not supported; only 'medium' is."),
                )
                .with_param("verbosity"))
            }
            _ => {
                return Err(ApiError::invalid_value(
                    "verbosity",
                    format!("Invalid value for 'verbosity': '{v}'. Supported values are: 'low', 'medium' and 'high'."),
                ))
            }
        }
    }
    for (field, value, use_instead) in [
        ("functions", &req.functions, "tools"),
        ("function_call", &req.function_call, "tool_choice"),
    ] {
        if value.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(unsupported_parameter(
                field,
                &format!("'{field}' is deprecated and not supported; use '{use_instead}'."),
            ));
        }
    }
    Ok(())
}

/// Tool definitions; returns their names (for `tool_choice`).
fn check_tools(req: &ChatCompletionRequest) -> Result<Vec<&str>, ApiError> {
    let mut names = Vec::new();
    for (i, tool) in req.tools.iter().flatten().enumerate() {
        check_tool_type(&format!("tools.{i}.type"), tool.kind.as_deref())?;
        let prefix = format!("tools.{i}.function");
        let f = tool
            .function
            .as_ref()
            .ok_or_else(|| ApiError::missing_parameter(prefix.as_str()))?;
        common::check_function_tool(&FunctionSpec {
            prefix: &prefix,
            name: f.name.as_deref(),
            parameters: f.parameters.as_ref(),
            strict: f.strict.unwrap_or(false),
        })?;
        let name = f.name.as_deref().unwrap_or_default();
        if names.contains(&name) {
            return Err(ApiError::invalid_value(
                format!("{prefix}.name"),
                format!("Tool names must be unique; '{name}' appears twice."),
            ));
        }
        names.push(name);
    }
    Ok(names)
}

/// `tool_choice`: `auto|none|required` or `{type:"function", function:{name}}`
/// naming one of `tools`.
fn check_tool_choice(choice: Option<&Value>, tools: &[&str]) -> Result<(), ApiError> {
    let no_tools = |what: &str| {
        ApiError::invalid_value(
            "tool_choice",
            format!("'tool_choice' {what} requires 'tools' to be set."),
        )
    };
    match choice {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) => match s.as_str() {
            "auto" | "none" => Ok(()),
            "required" if tools.is_empty() => Err(no_tools("'required'")),
            "required" => Ok(()),
            other => Err(ApiError::invalid_value(
                "tool_choice",
                format!("Invalid value for 'tool_choice': '{other}'. Supported values are: 'auto', 'none', 'required', or an object naming a function."),
            )),
        },
        Some(Value::Object(o)) => {
            match o.get("type") {
                Some(Value::String(t)) if t == "function" => {}
                Some(Value::String(t)) => {
                    return Err(ApiError::invalid_value(
                        "tool_choice.type",
                        format!("Invalid value for 'tool_choice.type': '{t}'. Only 'function' is supported."),
                    ))
                }
                Some(_) => {
                    return Err(ApiError::invalid_type(
                        "tool_choice.type",
                        "'tool_choice.type' must be a string.",
                    ))
                }
                None => return Err(ApiError::missing_parameter("tool_choice.type")),
            }
            let name = match o.get("function") {
                Some(Value::Object(f)) => match f.get("name") {
                    Some(Value::String(n)) => n.as_str(),
                    Some(_) => {
                        return Err(ApiError::invalid_type(
                            "tool_choice.function.name",
                            "'tool_choice.function.name' must be a string.",
                        ))
                    }
                    None => return Err(ApiError::missing_parameter("tool_choice.function.name")),
                },
                Some(_) => {
                    return Err(ApiError::invalid_type(
                        "tool_choice.function",
                        "'tool_choice.function' must be an object with a 'name'.",
                    ))
                }
                None => return Err(ApiError::missing_parameter("tool_choice.function")),
            };
            if tools.is_empty() {
                return Err(no_tools("naming a function"));
            }
            if !tools.contains(&name) {
                return Err(ApiError::invalid_value(
                    "tool_choice",
                    format!("'tool_choice' names the function '{name}', which is not in 'tools'."),
                ));
            }
            Ok(())
        }
        Some(_) => Err(ApiError::invalid_type(
            "tool_choice",
            "'tool_choice' must be a string ('auto', 'none', 'required') or an object.",
        )),
    }
}

/// `prediction` (predicted outputs) only speeds up a reply that matches it;
/// ignoring it never changes the reply, so its shape is checked and it is
/// otherwise ignored.
fn check_prediction(p: &Value) -> Result<(), ApiError> {
    match p {
        Value::Null => Ok(()),
        Value::Object(o) => match o.get("type") {
            Some(Value::String(t)) if t == "content" => match o.get("content") {
                Some(Value::String(_)) | Some(Value::Array(_)) => Ok(()),
                None => Err(ApiError::missing_parameter("prediction.content")),
                Some(_) => Err(ApiError::invalid_type(
                    "prediction.content",
                    "'prediction.content' must be a string or an array of text parts.",
                )),
            },
            Some(_) => Err(ApiError::invalid_value(
                "prediction.type",
                "Invalid value for 'prediction.type'; the supported value is 'content'.",
            )),
            None => Err(ApiError::missing_parameter("prediction.type")),
        },
        _ => Err(ApiError::invalid_type(
            "prediction",
            "'prediction' must be an object.",
        )),
    }
}

fn unsupported_parameter(param: &str, message: &str) -> ApiError {
    ApiError::new(400, "unsupported_parameter", message).with_param(param)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::json_body;

    fn check_with(body: &str, session: Option<&str>) -> Result<ValidChatRequest, ApiError> {
        validate(
            &crate::catalog::Catalog::default(),
            &json_body::<ChatCompletionRequest>(body.as_bytes())?,
            &ChatHeaders {
                session_id: session,
            },
        )
    }

    fn check(body: &str) -> Result<ValidChatRequest, ApiError> {
        check_with(body, None)
    }

    #[test]
    fn minimal_request_is_valid() {
        let valid =
            check(r#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(valid.model.id, "base");
        assert!(!valid.stream && !valid.reasoning);
        assert_eq!(valid.format, FormatKind::Text);
    }

    #[test]
    fn unknown_model_is_404() {
        let e =
            check(r#"{"model":"nope","messages":[{"role":"user","content":"hi"}]}"#).unwrap_err();
        assert_eq!((e.status, e.code.as_ref()), (404, "model_not_found"));
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

    #[test]
    fn thinking_budget_applies_on_base_only() {
        let body = |model: &str| {
            format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"x"}}],"enable_thinking":true,"thinking_budget":512}}"#
            )
        };
        let valid = check(&body("base")).unwrap();
        assert_eq!((valid.reasoning, valid.reasoning_budget), (true, 512));
        for model in ["base-mini", "base-ultra"] {
            let valid = check(&body(model)).unwrap();
            assert_eq!(
                (valid.reasoning, valid.reasoning_budget),
                (true, 0),
                "{model}"
            );
        }
    }

    #[test]
    fn an_added_model_is_validated_with_its_own_facts() {
        use crate::catalog::{AddedModel, Catalog, Price};
        let added = |image_input, reasoning_budget| AddedModel {
            id: "llama-70b".into(),
            description: String::new(),
            context_window: 8192,
            image_input,
            reasoning_budget,
            price: Price {
                input: 1.0,
                cached_input: 0.1,
                output: 2.0,
            },
        };
        let plain = Catalog::with_added(vec![added(false, false)]);
        let able = Catalog::with_added(vec![added(true, true)]);
        let run = |catalog: &Catalog, body: &str| {
            validate(
                catalog,
                &json_body::<ChatCompletionRequest>(body.as_bytes()).unwrap(),
                &ChatHeaders::default(),
            )
        };
        let e = run(
            &Catalog::default(),
            r#"{"model":"llama-70b","messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap_err();
        assert_eq!((e.status, &*e.code), (404, "model_not_found"));
        // Its own window: 8192 output tokens leave no room for input.
        let e = run(
            &plain,
            r#"{"model":"llama-70b","messages":[{"role":"user","content":"x"}],"max_tokens":8192}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, "context_length_exceeded");
        assert!(e.message.contains("8192"), "{}", e.message);
        let img = r#"[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]"#;
        let with_image =
            format!(r#"{{"model":"llama-70b","messages":[{{"role":"user","content":{img}}}]}}"#);
        assert!(run(&plain, &with_image).is_err());
        assert!(run(&able, &with_image).is_ok());
        let budget = r#"{"model":"llama-70b","messages":[{"role":"user","content":"x"}],"enable_thinking":true,"thinking_budget":512}"#;
        assert_eq!(run(&plain, budget).unwrap().reasoning_budget, 0);
        assert_eq!(run(&able, budget).unwrap().reasoning_budget, 512);
    }

    #[test]
    fn a_zero_thinking_budget_turns_reasoning_off_where_it_applies() {
        let body = |model: &str| {
            format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"x"}}],"reasoning_effort":"high","thinking_budget":0}}"#
            )
        };
        assert!(!check(&body("base")).unwrap().reasoning);
        for model in ["base-mini", "base-ultra"] {
            let valid = check(&body(model)).unwrap();
            assert_eq!(
                (valid.reasoning, valid.reasoning_budget),
                (true, 0),
                "{model}"
            );
        }
    }

    #[test]
    fn reasoning_effort_wins_over_enable_thinking() {
        let valid = check(r#"{"model":"base","messages":[{"role":"user","content":"x"}],"enable_thinking":true,"reasoning_effort":"none"}"#).unwrap();
        assert!(!valid.reasoning);
        let valid = check(r#"{"model":"base","messages":[{"role":"user","content":"x"}],"reasoning_effort":"low"}"#).unwrap();
        assert!(valid.reasoning);
    }

    #[test]
    fn planner_mode_needs_a_session_and_takes_agents() {
        let body =
            r#"{"model":"base","messages":[{"role":"user","content":"x"}],"planner_mode":true}"#;
        let e = check(body).unwrap_err();
        assert_eq!(
            (e.status, e.code.as_ref(), e.param.as_deref()),
            (400, "missing_required_parameter", Some("x-session-id"))
        );
        assert!(check_with(body, Some("sess-1")).unwrap().planner);
        assert!(!check(
            r#"{"model":"base","messages":[{"role":"user","content":"x"}],"planner_mode":false}"#
        )
        .unwrap()
        .planner);
        let err = |body: &str| {
            let e = check_with(body, Some("s")).unwrap_err();
            (e.code.to_string(), e.param.unwrap_or_default())
        };
        let with = |extra: &str| {
            format!(r#"{{"model":"base","messages":[{{"role":"user","content":"x"}}]{extra}}}"#)
        };
        assert_eq!(
            err(&with(r#","agents":["a"]"#)),
            ("invalid_value".into(), "agents".into())
        );
        let many: Vec<String> = (0..17).map(|i| format!("\"a{i}\"")).collect();
        assert_eq!(
            err(&with(&format!(
                r#","planner_mode":true,"agents":[{}]"#,
                many.join(",")
            ))),
            ("invalid_value".into(), "agents.16".into())
        );
        for bad in ["", " ", "ftp://x/y", "has space", "http://"] {
            assert_eq!(
                err(&with(&format!(
                    r#","planner_mode":true,"agents":["ok-id","{bad}"]"#
                ))),
                ("invalid_value".into(), "agents.1".into()),
                "{bad:?}"
            );
        }
        assert!(check_with(
            &with(r#","planner_mode":true,"agents":["http://127.0.0.1:9","weather.v2"]"#),
            Some("s")
        )
        .is_ok());
        for (extra, param) in [
            (
                r#","response_format":{"type":"json_object"}"#,
                "response_format",
            ),
            (r#","stop":"x""#, "stop"),
            (r#","enable_thinking":true"#, "reasoning_effort"),
        ] {
            assert_eq!(
                err(&with(&format!(r#","planner_mode":true{extra}"#))),
                ("unsupported_parameter".into(), param.into()),
                "{extra}"
            );
        }
        // The plan honours `tool_choice`; only one it cannot satisfy is a 400.
        let tools = r#","tools":[{"type":"function","function":{"name":"f"}}]"#;
        for choice in [
            r#""required""#,
            r#"{"type":"function","function":{"name":"f"}}"#,
            r#""none""#,
        ] {
            let body = with(&format!(
                r#","planner_mode":true{tools},"tool_choice":{choice}"#
            ));
            assert!(check_with(&body, Some("s")).is_ok(), "{choice}");
        }
        assert_eq!(
            err(&with(&format!(
                r#","planner_mode":true{tools},"tool_choice":{{"type":"function","function":{{"name":"g"}}}}"#
            ))),
            ("invalid_value".into(), "tool_choice".into())
        );
        // Tool results answer the session's paused plan: the planner checks them.
        let resume = r#"{"model":"base","planner_mode":true,"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"call_1","content":"r"}]}"#;
        assert!(check_with(resume, Some("s")).is_ok());
    }

    #[test]
    fn tool_round_trip_is_valid() {
        let body = r#"{"model":"base","messages":[
            {"role":"user","content":"weather?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"call_1","content":"sunny"}
        ],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}],
        "tool_choice":{"type":"function","function":{"name":"get_weather"}}}"#;
        check(body).unwrap();
    }

    #[test]
    fn strict_json_schema_format_is_planned() {
        let valid = check(r#"{"model":"base-mini","messages":[{"role":"user","content":"x"}],
            "response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,
            "schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}}}}"#).unwrap();
        assert_eq!(valid.format, FormatKind::JsonSchema);
    }
}
