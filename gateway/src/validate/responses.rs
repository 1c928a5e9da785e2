//! Rules for `POST /v1/responses` (spec 2.6 and 7), each reported with a
//! dot-path `param` and a stable `code`.

use super::common::{
    self, check_format as check_format_spec, check_function_tool, check_tool_type, FormatKind,
    FormatSpec, FunctionSpec,
};
use crate::api::responses::{ContentPart, CreateResponseRequest, Input, InputItem, ItemContent};
use crate::catalog::{Catalog, ModelSpec};
use crate::error::ApiError;
use crate::output_check::OutputFormat;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// What validation learned that later stages need.
#[derive(Debug, Clone)]
pub struct ValidResponseRequest {
    pub model: &'static ModelSpec,
    pub stream: bool,
    pub background: bool,
    pub store: bool,
    /// 0 = no limit beyond the context window.
    pub max_output_tokens: u32,
    pub reasoning: bool,
    pub reasoning_budget: u32,
    pub effort: Option<String>,
    pub format: OutputFormat,
    /// `text` as echoed on the response object (`{format:{type:…}}`).
    pub text: Value,
    /// Function tools in the flat shape, as echoed on the response object.
    pub tools: Vec<FlatTool>,
    pub metadata: BTreeMap<String, String>,
    /// The request's input as items (a string input becomes one user message).
    pub items: Vec<InputItem>,
}

/// A function tool, whichever shape it arrived in.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: bool,
}

impl FlatTool {
    pub fn wire(&self) -> Value {
        let mut v = json!({"type":"function","name":self.name,"strict":self.strict,
            "parameters": self.parameters.clone().unwrap_or(Value::Null)});
        if let Some(d) = &self.description {
            v["description"] = Value::String(d.clone());
        }
        v
    }
}

pub fn validate(
    catalog: &Catalog,
    req: &CreateResponseRequest,
) -> Result<ValidResponseRequest, ApiError> {
    let model = common::check_model(catalog, req.model.as_deref())?;
    let input = req
        .input
        .as_ref()
        .ok_or_else(|| ApiError::missing_parameter("input"))?;
    let background = req.background.unwrap_or(false);
    let store = req.store.unwrap_or(true);
    if background && !store {
        return Err(ApiError::invalid_value(
            "background",
            "Background responses must be stored: 'background': true requires 'store' to be true.",
        ));
    }
    let items = match input {
        Input::Text(t) => vec![InputItem {
            kind: Some("message".into()),
            role: Some("user".into()),
            content: Some(ItemContent::Text(t.clone())),
            ..Default::default()
        }],
        Input::Items(items) => {
            for (i, item) in items.iter().enumerate() {
                check_item(item, i)?;
            }
            items.clone()
        }
    };
    if items.is_empty() && req.previous_response_id.is_none() {
        return Err(ApiError::invalid_value(
            "input",
            "'input' must contain at least one item.",
        ));
    }
    common::check_openai_sampling(
        req.temperature,
        req.top_p,
        req.presence_penalty,
        req.frequency_penalty,
    )?;
    let max_output_tokens = match req.max_output_tokens {
        None => 0,
        Some(v) if v < 1 => {
            return Err(ApiError::invalid_value(
                "max_output_tokens",
                format!("'max_output_tokens' must be at least 1, got {v}."),
            ))
        }
        Some(v) => u32::try_from(v).map_err(|_| {
            ApiError::invalid_value("max_output_tokens", "'max_output_tokens' is too large.")
        })?,
    };
    if let Some(n) = req.top_logprobs {
        if n != 0 {
            return Err(ApiError::invalid_value(
                "top_logprobs",
                "'top_logprobs' is not supported; omit it or send 0.",
            ));
        }
    }
    if let Some(n) = req.max_tool_calls {
        if n < 0 {
            return Err(ApiError::invalid_value(
                "max_tool_calls",
                "'max_tool_calls' must be at least 0.",
            ));
        }
    }
    match req.truncation.as_deref() {
        None | Some("disabled") => {}
        // The spec: an over-length request is rejected, earlier items are
        // never dropped to make it fit.
        Some("auto") => {
            return Err(ApiError::unsupported_value(
                "truncation",
                "'truncation': 'auto' is not supported: input is never truncated to fit the \
                 context window; an over-length request is refused. Send 'disabled' or omit it.",
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid_value(
                "truncation",
                "'truncation' must be 'auto' or 'disabled'.",
            ))
        }
    }
    // Checked as on chat completions (schemathesis found any string accepted here).
    if let Some(tier) = req.service_tier.as_deref() {
        common::check_service_tier(tier)?;
    }
    // A retention hint the workers' prefix cache has its own policy for:
    // checked, then ignored (schemathesis found any string accepted).
    if let Some(r) = req.prompt_cache_retention.as_deref() {
        if !matches!(r, "in_memory" | "24h") {
            return Err(ApiError::invalid_value(
                "prompt_cache_retention",
                format!("Invalid value for 'prompt_cache_retention': '{r}'. Supported values are: 'in_memory' and '24h'."),
            ));
        }
    }
    check_include(req.include.as_deref().unwrap_or_default())?;
    check_stream_options(req.stream_options.as_ref(), req.stream.unwrap_or(false))?;
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return Err(ApiError::invalid_value(
            "prompt",
            "Stored prompt templates are not supported; send 'input' and 'instructions'.",
        ));
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(ApiError::invalid_value(
            "conversation",
            "Conversations are not supported; chain responses with 'previous_response_id'.",
        ));
    }

    // Reasoning: `reasoning.effort` first, `enable_thinking` when it is absent.
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let (reasoning, reasoning_budget) = common::reasoning(
        model,
        "reasoning.effort",
        effort.as_deref(),
        req.enable_thinking,
        req.thinking_budget,
    )?;
    if let Some(s) = req.reasoning.as_ref().and_then(|r| r.summary.as_deref()) {
        if !matches!(s, "auto" | "concise" | "detailed" | "none") {
            return Err(ApiError::invalid_value(
                "reasoning.summary",
                "'reasoning.summary' must be auto, concise, detailed or none.",
            ));
        }
    }
    let tools = check_tools(req)?;
    let (format, text) = check_format(req)?;
    // Checked while parsing (`api::bounds::metadata`).
    let metadata = req.metadata.clone().unwrap_or_default();
    // Input that cannot fit the window whatever the tokenizer (spec 8).
    // Items of `previous_response_id` are counted by the worker.
    common::check_context_window(
        model,
        input_text_bytes(&items, req.instructions.as_deref()),
        (max_output_tokens > 0).then_some(max_output_tokens),
        "input",
        "max_output_tokens",
    )?;

    Ok(ValidResponseRequest {
        model,
        stream: req.stream.unwrap_or(false),
        background,
        store,
        max_output_tokens,
        reasoning,
        reasoning_budget,
        effort,
        format,
        text,
        tools,
        metadata,
        items,
    })
}

/// Text bytes of the instructions and input items (the early context check).
fn input_text_bytes(items: &[InputItem], instructions: Option<&str>) -> usize {
    let own = items.iter().map(item_text_bytes).sum::<usize>();
    own + instructions.map_or(0, str::len)
}

/// The bytes of text the model reads of one item: its content, a call's
/// name and arguments, a call's output, a reasoning summary, and the
/// summary a compaction item seals (base64, so three bytes in four).
pub fn item_text_bytes(item: &InputItem) -> usize {
    let content = match &item.content {
        None => 0,
        Some(ItemContent::Text(t)) => t.len(),
        Some(ItemContent::Parts(parts)) => parts
            .iter()
            .map(|p| match p {
                ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                    text.len()
                }
                ContentPart::Refusal { refusal } => refusal.len(),
                _ => 0,
            })
            .sum(),
    };
    let output = match &item.output {
        None => 0,
        Some(Value::String(s)) => s.len(),
        // Sent to the model as its JSON text.
        Some(other) => crate::api::encoded_len(other),
    };
    let summary = item
        .summary
        .iter()
        .flatten()
        .map(|s| s.text.len())
        .sum::<usize>();
    let sealed = match item.kind.as_deref() {
        Some("compaction") => item.encrypted_content.as_deref().map_or(0, str::len) * 3 / 4,
        _ => 0,
    };
    content
        + output
        + summary
        + sealed
        + item.arguments.as_deref().map_or(0, str::len)
        + item.name.as_deref().map_or(0, str::len)
}

fn check_item(item: &InputItem, i: usize) -> Result<(), ApiError> {
    let kind = item.kind.as_deref().unwrap_or("message");
    let need = |field: &str, present: bool| {
        if present {
            Ok(())
        } else {
            Err(ApiError::missing_parameter(format!("input.{i}.{field}")))
        }
    };
    match kind {
        "message" => {
            let role = item
                .role
                .as_deref()
                .ok_or_else(|| ApiError::missing_parameter(format!("input.{i}.role")))?;
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return Err(ApiError::invalid_value(
                    format!("input.{i}.role"),
                    format!("Invalid role '{role}'; expected user, assistant, system or developer."),
                ));
            }
            let content = item
                .content
                .as_ref()
                .ok_or_else(|| ApiError::missing_parameter(format!("input.{i}.content")))?;
            if let ItemContent::Parts(parts) = content {
                for (j, part) in parts.iter().enumerate() {
                    let what = match part {
                        ContentPart::InputImage {} => "Image input",
                        ContentPart::InputFile {} => "File input",
                        ContentPart::InputAudio {} => "Audio input",
                        _ => continue,
                    };
                    return Err(ApiError::invalid_value(
                        format!("input.{i}.content.{j}"),
                        format!("{what} is not supported on the responses API; send text parts (images are accepted on chat completions with model 'base')."),
                    ));
                }
            }
            Ok(())
        }
        "function_call" => {
            need("call_id", item.call_id.is_some())?;
            need("name", item.name.is_some())?;
            need("arguments", item.arguments.is_some())
        }
        "function_call_output" => {
            need("call_id", item.call_id.is_some())?;
            need("output", item.output.is_some())
        }
        "item_reference" => need("id", item.id.is_some()),
        "reasoning" => Ok(()),
        "compaction" => {
            let content = item.encrypted_content.as_deref().ok_or_else(|| {
                ApiError::missing_parameter(format!("input.{i}.encrypted_content"))
            })?;
            match crate::api::compaction::open(content) {
                Some(_) => Ok(()),
                None => Err(ApiError::invalid_value(
                    format!("input.{i}.encrypted_content"),
                    "This compaction item was not written by this service; send the items POST /v1/responses/compact returned here.",
                )),
            }
        }
        other => Err(ApiError::invalid_value(
            format!("input.{i}.type"),
            format!("Unsupported input item type '{other}'; expected message, function_call, function_call_output, item_reference, reasoning or compaction."),
        )),
    }
}

/// `include` values that cannot change a reply here: they add data to
/// output items this service never produces (hosted tools, input images).
/// `reasoning.encrypted_content` is accepted, not refused: the Codex CLI
/// sends it on every request with reasoning and `store: false`, and
/// refusing it would break Codex. Reasoning is returned in clear summary
/// items, which never carry `encrypted_content` (nothing is encrypted);
/// docs/request-contract.md says so.
const INCLUDE_NO_EFFECT: [&str; 7] = [
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
];

/// Every `include` entry is a value the API defines; one that would change
/// the reply but cannot be honoured (log probabilities) is refused.
fn check_include(include: &[String]) -> Result<(), ApiError> {
    for (i, value) in include.iter().enumerate() {
        let param = format!("include.{i}");
        if value == "message.output_text.logprobs" {
            return Err(ApiError::unsupported_value(
                param,
                "'include': 'message.output_text.logprobs' is not supported.",
            ));
        }
        if !INCLUDE_NO_EFFECT.contains(&value.as_str()) {
            return Err(ApiError::invalid_value(
                param,
                format!("'include' has an unknown value '{value}'."),
            ));
        }
    }
    Ok(())
}

/// `stream_options`, checked as chat completions check theirs: an object
/// whose `include_obfuscation` (the Responses API's one option) and
/// `include_usage` (chat's; usage is always on `response.completed`) are
/// booleans, sent only with `stream: true`. Neither changes the reply.
fn check_stream_options(options: Option<&Value>, stream: bool) -> Result<(), ApiError> {
    let fields = match options {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(fields)) => fields,
        Some(_) => {
            return Err(ApiError::invalid_type(
                "stream_options",
                "Invalid type for 'stream_options': expected an object.",
            ))
        }
    };
    for key in ["include_obfuscation", "include_usage"] {
        if fields
            .get(key)
            .is_some_and(|v| !matches!(v, Value::Null | Value::Bool(_)))
        {
            let param = format!("stream_options.{key}");
            return Err(ApiError::invalid_type(
                param.clone(),
                format!("Invalid type for '{param}': expected a boolean."),
            ));
        }
    }
    if !stream {
        return Err(ApiError::invalid_value(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true.",
        ));
    }
    Ok(())
}

fn check_tools(req: &CreateResponseRequest) -> Result<Vec<FlatTool>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in req.tools.as_deref().unwrap_or_default().iter().enumerate() {
        check_tool_type(&format!("tools.{i}.type"), t.kind.as_deref())?;
        let (prefix, name, description, parameters, strict) = match &t.function {
            Some(f) => (
                format!("tools.{i}.function"),
                f.name.clone(),
                f.description.clone(),
                f.parameters.clone(),
                f.strict.unwrap_or(false),
            ),
            None => (
                format!("tools.{i}"),
                t.name.clone(),
                t.description.clone(),
                t.parameters.clone(),
                t.strict.unwrap_or(false),
            ),
        };
        check_function_tool(&FunctionSpec {
            prefix: &prefix,
            name: name.as_deref(),
            parameters: parameters.as_ref(),
            strict,
        })?;
        let name = name.ok_or_else(|| ApiError::missing_parameter(format!("{prefix}.name")))?;
        // The flat shape requires `parameters` (spec 2.6); the nested chat
        // shape keeps it optional (spec 2.2).
        if t.function.is_none() && parameters.is_none() {
            return Err(ApiError::missing_parameter(format!("{prefix}.parameters")));
        }
        out.push(FlatTool {
            name,
            description,
            parameters,
            strict,
        });
    }
    if let Some(choice) = &req.tool_choice {
        match choice {
            Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {}
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o
                    .get("name")
                    .or_else(|| o.get("function").and_then(|f| f.get("name")))
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::missing_parameter("tool_choice.name"))?;
                if !out.iter().any(|t| t.name == name) {
                    return Err(ApiError::invalid_value(
                        "tool_choice.name",
                        format!("'tool_choice' names '{name}', which is not among 'tools'."),
                    ));
                }
            }
            _ => return Err(ApiError::invalid_value(
                "tool_choice",
                "'tool_choice' must be auto, none, required or {\"type\":\"function\",\"name\":…}.",
            )),
        }
    }
    Ok(out)
}

/// `text.format` wins over `response_format`. Returns the format to check
/// output against and the `text` object to echo.
fn check_format(req: &CreateResponseRequest) -> Result<(OutputFormat, Value), ApiError> {
    let verbosity = req.text.as_ref().and_then(|t| t.verbosity.clone());
    if let Some(v) = &verbosity {
        if !matches!(v.as_str(), "low" | "medium" | "high") {
            return Err(ApiError::invalid_value(
                "text.verbosity",
                "'text.verbosity' must be low, medium or high.",
            ));
        }
    }
    let (format, prefix, nested) = match (
        req.text.as_ref().and_then(|t| t.format.as_ref()),
        &req.response_format,
    ) {
        (Some(f), _) => (Some(f), "text.format", false),
        (None, Some(f)) => (Some(f), "response_format", true),
        (None, None) => (None, "text.format", false),
    };
    let mut echo = json!({"format": {"type": "text"}});
    let out = match format {
        None => OutputFormat::Text,
        Some(f) => {
            let (spec, spec_prefix) = if nested {
                (f.json_schema.as_deref(), format!("{prefix}.json_schema"))
            } else {
                (Some(f), prefix.to_string())
            };
            let kind = check_format_spec(&FormatSpec {
                prefix,
                schema_prefix: &spec_prefix,
                kind: f.kind.as_deref(),
                has_schema_object: spec.is_some(),
                name: spec.and_then(|s| s.name.as_deref()),
                schema: spec.and_then(|s| s.schema.as_ref()),
                strict: spec.and_then(|s| s.strict).unwrap_or(false),
            })?;
            match (kind, spec) {
                (FormatKind::Text, _) => OutputFormat::Text,
                (FormatKind::JsonObject, _) => {
                    echo["format"] = json!({"type": "json_object"});
                    OutputFormat::JsonObject
                }
                (FormatKind::JsonSchema, Some(spec)) => {
                    let schema = spec.schema.clone().unwrap_or_else(|| json!({}));
                    echo["format"] = json!({
                        "type": "json_schema",
                        "name": spec.name,
                        "schema": schema,
                        "strict": spec.strict.unwrap_or(false),
                    });
                    if let Some(d) = &spec.description {
                        echo["format"]["description"] = Value::String(d.clone());
                    }
                    OutputFormat::JsonSchema(schema)
                }
                (FormatKind::JsonSchema, None) => OutputFormat::JsonObject,
            }
        }
    };
    if let Some(v) = verbosity {
        echo["verbosity"] = Value::String(v);
    }
    Ok((out, echo))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::json_body;

    fn check(body: &str) -> Result<ValidResponseRequest, ApiError> {
        validate(
            &crate::catalog::Catalog::default(),
            &json_body::<CreateResponseRequest>(body.as_bytes())?,
        )
    }

    #[test]
    fn minimal_string_input_is_one_user_message() {
        let valid = check(r#"{"model":"base","input":"hi"}"#).unwrap();
        assert_eq!(valid.items.len(), 1);
        assert_eq!(valid.items[0].role.as_deref(), Some("user"));
        assert!(valid.store && !valid.background && !valid.stream && !valid.reasoning);
    }

    /// One case per rule: (body, status, code, param).
    #[test]
    fn validation_table() {
        let cases: &[(&str, u16, &str, &str)] = &[
            (
                r#"{"model":"base","input":"x","max_output_token":5}"#,
                400,
                "unknown_parameter",
                "max_output_token",
            ),
            (
                r#"{"model":"nope","input":"x"}"#,
                404,
                "model_not_found",
                "model",
            ),
            (
                r#"{"input":"x"}"#,
                400,
                "missing_required_parameter",
                "model",
            ),
            (
                r#"{"model":"base"}"#,
                400,
                "missing_required_parameter",
                "input",
            ),
            (
                r#"{"model":"base","input":"x","background":true,"store":false}"#,
                400,
                "invalid_value",
                "background",
            ),
            (
                r#"{"model":"base","input":"x","reasoning":{"effort":"extreme"}}"#,
                400,
                "invalid_value",
                "reasoning.effort",
            ),
            (
                r#"{"model":"base","input":"x","tools":[{"type":"web_search"}]}"#,
                400,
                "invalid_value",
                "tools.0.type",
            ),
            (
                r#"{"model":"base","input":"x","tools":[{"type":"function","name":"a","parameters":{}},{"type":"namespace"}]}"#,
                400,
                "invalid_value",
                "tools.1.type",
            ),
            (
                r#"{"model":"base","input":"x","tools":[{"type":"function"}]}"#,
                400,
                "missing_required_parameter",
                "tools.0.name",
            ),
            (
                r#"{"model":"base","input":"x","tools":[{"type":"function","function":{"description":"d"}}]}"#,
                400,
                "missing_required_parameter",
                "tools.0.function.name",
            ),
            (
                r#"{"model":"base","input":"x","tools":[{"type":"function","name":"f","strict":true,"parameters":{"type":"object","properties":{"a":{"type":"string"}}}}]}"#,
                400,
                "invalid_function_parameters",
                "tools.0.parameters",
            ),
            (
                r#"{"model":"base","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"https://x/y.png"}]}]}"#,
                400,
                "invalid_value",
                "input.0.content.1",
            ),
            (
                r#"{"model":"base","input":[{"role":"user","content":[{"type":"video"}]}]}"#,
                400,
                "invalid_value",
                "input.0.content.0.type",
            ),
            (
                r#"{"model":"base","input":"x","text":{"format":{"type":"yaml"}}}"#,
                400,
                "invalid_value",
                "text.format.type",
            ),
            (
                r#"{"model":"base","input":"x","text":{"format":{"type":"json_schema","schema":{"type":"object"}}}}"#,
                400,
                "missing_required_parameter",
                "text.format.name",
            ),
            (
                r#"{"model":"base","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{"type":7}}}}"#,
                400,
                "invalid_json_schema",
                "text.format.schema",
            ),
            (
                r#"{"model":"base","input":"x","response_format":{"type":"json_schema","json_schema":{"schema":{}}}}"#,
                400,
                "missing_required_parameter",
                "response_format.json_schema.name",
            ),
            (
                r#"{"model":"base","input":"x","temperature":2.1}"#,
                400,
                "invalid_value",
                "temperature",
            ),
            (
                r#"{"model":"base","input":"x","top_p":1.5}"#,
                400,
                "invalid_value",
                "top_p",
            ),
            (
                r#"{"model":"base","input":"x","max_output_tokens":0}"#,
                400,
                "invalid_value",
                "max_output_tokens",
            ),
            (
                r#"{"model":"base","input":"x","thinking_budget":20000}"#,
                400,
                "invalid_value",
                "thinking_budget",
            ),
            (
                r#"{"model":"base","input":"x","thinking_budget":-1}"#,
                400,
                "invalid_value",
                "thinking_budget",
            ),
            (
                r#"{"model":"base","input":"x","metadata":{"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6","g":"7","h":"8","i":"9","j":"10","k":"11","l":"12","m":"13","n":"14","o":"15","p":"16","q":"17"}}"#,
                400,
                "invalid_value",
                "metadata",
            ),
            (
                r#"{"model":"base","input":"x","metadata":{"k":5}}"#,
                400,
                "invalid_type",
                "metadata.k",
            ),
            (
                r#"{"model":"base","input":[{"type":"function_call_output","output":"1"}]}"#,
                400,
                "missing_required_parameter",
                "input.0.call_id",
            ),
            (
                r#"{"model":"base","input":[{"type":"function_call","call_id":"c","arguments":"{}"}]}"#,
                400,
                "missing_required_parameter",
                "input.0.name",
            ),
            (
                r#"{"model":"base","input":[{"type":"item_reference"}]}"#,
                400,
                "missing_required_parameter",
                "input.0.id",
            ),
            (
                r#"{"model":"base","input":[{"type":"computer_call"}]}"#,
                400,
                "invalid_value",
                "input.0.type",
            ),
            (
                r#"{"model":"base","input":[{"role":"tool","content":"x"}]}"#,
                400,
                "invalid_value",
                "input.0.role",
            ),
            (
                r#"{"model":"base","input":"x","tool_choice":{"type":"function","name":"ghost"}}"#,
                400,
                "invalid_value",
                "tool_choice.name",
            ),
            (
                r#"{"model":"base","input":"x","temperature":"warm"}"#,
                400,
                "invalid_type",
                "temperature",
            ),
            (
                r#"{"model":"base","input":"x","presence_penalty":2.5}"#,
                400,
                "invalid_value",
                "presence_penalty",
            ),
            (
                r#"{"model":"base","input":"x","frequency_penalty":-3}"#,
                400,
                "invalid_value",
                "frequency_penalty",
            ),
            (
                r#"{"model":"base","input":"x","top_logprobs":5}"#,
                400,
                "invalid_value",
                "top_logprobs",
            ),
            (
                r#"{"model":"base","input":"x","truncation":"middle"}"#,
                400,
                "invalid_value",
                "truncation",
            ),
        ];
        for (body, status, code, param) in cases {
            let e = check(body).expect_err(body);
            assert_eq!(
                (e.status, e.code.as_ref(), e.param.as_deref()),
                (*status, *code, Some(*param)),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn text_format_wins_over_response_format() {
        let valid = check(
            r#"{"model":"base","input":"x","text":{"format":{"type":"json_object"}},"response_format":{"type":"yaml"}}"#,
        )
        .unwrap();
        assert_eq!(valid.format, OutputFormat::JsonObject);
        assert_eq!(valid.text["format"]["type"], "json_object");
    }

    #[test]
    fn reasoning_effort_and_enable_thinking() {
        let p = check(
            r#"{"model":"base","input":"x","reasoning":{"effort":"none"},"enable_thinking":true}"#,
        )
        .unwrap();
        assert!(!p.reasoning);
        let p = check(r#"{"model":"base-mini","input":"x","reasoning":{"effort":"low"}}"#).unwrap();
        assert!(p.reasoning);
        // The effort travels by name; the worker maps it to a budget, as for chat.
        assert_eq!(p.reasoning_budget, 0);
        assert_eq!(p.effort.as_deref(), Some("low"));
        let p =
            check(r#"{"model":"base","input":"x","enable_thinking":true,"thinking_budget":50}"#)
                .unwrap();
        assert!(p.reasoning);
        assert_eq!(p.reasoning_budget, 50);
        let p = check(
            r#"{"model":"base","input":"x","reasoning":{"effort":"high"},"thinking_budget":0}"#,
        )
        .unwrap();
        assert!(!p.reasoning, "a zero budget on base allows no reasoning");
        let p = check(
            r#"{"model":"base-ultra","input":"x","enable_thinking":true,"thinking_budget":0}"#,
        )
        .unwrap();
        assert!(p.reasoning, "ignored where the budget is fixed");
    }

    #[test]
    fn nested_and_flat_tools_agree() {
        let flat = check(r#"{"model":"base","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]}"#).unwrap();
        let nested = check(r#"{"model":"base","input":"x","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}"#).unwrap();
        assert_eq!(flat.tools, nested.tools);
        assert_eq!(flat.tools[0].wire()["type"], "function");
    }
}
