//! Rules that both generation APIs need, so that chat completions and
//! responses reject the same mistakes with the same `code` and message.
//!
//! Every function takes the dot-path `param` (or prefix) under which the
//! caller's API spells the field, because the two APIs nest things
//! differently: a chat tool's schema is `tools.0.function.parameters`, a flat
//! responses tool's is `tools.0.parameters`. All failures are 400s with a
//! stable `code`:
//!
//! | code | meaning |
//! |---|---|
//! | `invalid_value` | a value of the right type that is out of range or not allowed |
//! | `invalid_type` | a value of the wrong JSON type (most come from parsing) |
//! | `missing_required_parameter` | a required field is absent or null |
//! | `unsupported_value` | a legal value this service cannot serve (e.g. `n: 2`) |
//! | `unsupported_parameter` | a legal parameter this service cannot serve at all |
//! | `invalid_function_parameters` | a tool's JSON Schema is invalid or breaks the strict rules |
//! | `invalid_json_schema` | a structured-output JSON Schema is invalid or breaks the strict rules |
//! | `context_length_exceeded` | input plus requested output cannot fit the model's window |
//!
//! API for the responses side (all return `Result<_, ApiError>`):
//! - the request's head: [`check_model`], [`check_messages_given`];
//! - bounds: [`check_range`], [`check_at_least`], [`check_thinking_budget`],
//!   [`check_openai_sampling`], [`check_stops`];
//! - (`metadata`, ≤ 16 string pairs, keys ≤ 64 chars, values ≤ 512, is
//!   checked while parsing: `api::bounds::metadata`);
//! - [`check_reasoning_effort`], and [`reasoning`]: whether an OpenAI-shaped
//!   request reasons, and under what budget;
//! - tools: [`check_function_tool`] (name, schema, strict rules) and
//!   [`check_tool_type`];
//! - formats: [`check_format`] over a [`FormatSpec`] borrowed from either wire shape;
//! - context: [`check_context_window`] with [`min_tokens_for_bytes`].

use crate::catalog::{Catalog, ModelSpec};
use crate::error::ApiError;
use crate::schema_cache::compiled_schema;
use serde_json::{Map, Value};

/// Largest `thinking_budget` (spec 8).
pub const MAX_THINKING_BUDGET: i64 = 16_384;
/// Longest function or schema name, as in the public API.
pub const MAX_NAME_CHARS: usize = 64;
/// The allowed `reasoning.effort` / `reasoning_effort` values (spec 2.6).
pub const REASONING_EFFORTS: [&str; 5] = ["none", "minimal", "low", "medium", "high"];

/// The early context check divides text bytes by this to get a number of
/// tokens the prompt has *at least*. No tokenizer in practical use averages
/// more than 8 bytes per token over a whole prompt (English prose is ~4, code
/// ~3, CJK ~1.5), so the check never rejects a prompt that would fit; it only
/// spares the worker the obviously hopeless ones. The worker does the exact
/// count and answers `context_length_exceeded` itself.
pub const MAX_BYTES_PER_TOKEN: usize = 8;

// ---- the request's head --------------------------------------------------------

/// `model`: required, and one of the catalogue's (else 404 `model_not_found`).
pub fn check_model(catalog: &Catalog, model: Option<&str>) -> Result<&'static ModelSpec, ApiError> {
    let id = model.ok_or_else(|| ApiError::missing_parameter("model"))?;
    catalog
        .find(id)
        .ok_or_else(|| ApiError::model_not_found(id))
}

/// `messages`: required, and at least one.
pub fn check_messages_given<T>(messages: Option<&Vec<T>>) -> Result<&[T], ApiError> {
    let messages = messages.ok_or_else(|| ApiError::missing_parameter("messages"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "'messages' must contain at least one message.",
        ));
    }
    Ok(messages)
}

// ---- bounds ------------------------------------------------------------------

/// `lo <= v <= hi`, else `invalid_value` naming the bounds.
pub fn check_range(param: &str, v: f64, lo: f64, hi: f64) -> Result<(), ApiError> {
    if (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(ApiError::invalid_value(
            param,
            format!("'{param}' must be between {lo} and {hi}, got {v}."),
        ))
    }
}

/// The OpenAI APIs' sampling ranges (chat completions and responses alike):
/// `temperature` 0..2, `top_p` 0..1, the penalties -2..2.
pub fn check_openai_sampling(
    temperature: Option<f64>,
    top_p: Option<f64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
) -> Result<(), ApiError> {
    for (param, value, lo, hi) in [
        ("temperature", temperature, 0.0, 2.0),
        ("top_p", top_p, 0.0, 1.0),
        ("presence_penalty", presence_penalty, -2.0, 2.0),
        ("frequency_penalty", frequency_penalty, -2.0, 2.0),
    ] {
        if let Some(v) = value {
            check_range(param, v, lo, hi)?;
        }
    }
    Ok(())
}

/// Stop sequences are not empty (their count and length are bounded while
/// parsing: `api::bounds`). `param_of` names the `i`th as the API spells it.
pub fn check_stops(stops: &[String], param_of: impl Fn(usize) -> String) -> Result<(), ApiError> {
    match stops.iter().position(String::is_empty) {
        Some(i) => Err(ApiError::invalid_value(
            param_of(i),
            "A stop sequence cannot be empty.",
        )),
        None => Ok(()),
    }
}

/// An integer of at least `min` that fits a `u32` (token counts).
pub fn check_at_least(param: &str, v: i64, min: i64) -> Result<u32, ApiError> {
    if v < min {
        return Err(ApiError::invalid_value(
            param,
            format!("'{param}' must be at least {min}, got {v}."),
        ));
    }
    u32::try_from(v).map_err(|_| {
        ApiError::invalid_value(
            param,
            format!("'{param}' is too large: {v} (at most {}).", u32::MAX),
        )
    })
}

/// `thinking_budget`: 0..=16384 on every model, so that a request stays valid
/// when only `model` changes (spec 9.3). Whether the budget *applies* is the
/// caller's decision (only `base` has a configurable budget).
pub fn check_thinking_budget(param: &str, v: i64) -> Result<u32, ApiError> {
    if !(0..=MAX_THINKING_BUDGET).contains(&v) {
        return Err(ApiError::invalid_value(
            param,
            format!("'{param}' must be between 0 and {MAX_THINKING_BUDGET}, got {v}."),
        ));
    }
    Ok(v as u32)
}

/// Whether an OpenAI-shaped request reasons, and its hard cap on reasoning
/// tokens (0: the model's default): its effort (`effort_param`, checked)
/// decides, `enable_thinking` when it has none. The `thinking_budget` is
/// checked on every model but applies only where the model's budget is
/// configurable; there a budget of 0 allows no reasoning at all (the
/// worker protocol reads a 0 budget as "the model's default").
pub fn reasoning(
    model: &ModelSpec,
    effort_param: &str,
    effort: Option<&str>,
    enable_thinking: Option<bool>,
    thinking_budget: Option<i64>,
) -> Result<(bool, u32), ApiError> {
    if let Some(e) = effort {
        check_reasoning_effort(effort_param, e)?;
    }
    let budget = thinking_budget
        .map(|b| check_thinking_budget("thinking_budget", b))
        .transpose()?;
    let on = match effort {
        Some("none") => false,
        Some(_) => true,
        None => enable_thinking.unwrap_or(false),
    };
    if !on || (model.reasoning_budget && budget == Some(0)) {
        return Ok((false, 0));
    }
    // Elsewhere 0: the model's default for the effort (the worker owns
    // that mapping).
    Ok((
        true,
        if model.reasoning_budget {
            budget.unwrap_or(0)
        } else {
            0
        },
    ))
}

/// `service_tier`: one of the public API's values (both endpoints accept
/// it and ignore it: replies say `default`), else `invalid_value`.
pub fn check_service_tier(tier: &str) -> Result<(), ApiError> {
    if ["auto", "default", "flex", "scale", "priority"].contains(&tier) {
        return Ok(());
    }
    Err(ApiError::invalid_value(
        "service_tier",
        format!("Invalid value for 'service_tier': '{tier}'. Supported values are: 'auto', 'default', 'flex', 'scale' and 'priority'."),
    ))
}

/// `reasoning.effort` / `reasoning_effort`: one of [`REASONING_EFFORTS`].
pub fn check_reasoning_effort(param: &str, v: &str) -> Result<(), ApiError> {
    if REASONING_EFFORTS.contains(&v) {
        Ok(())
    } else {
        Err(ApiError::invalid_value(
            param,
            format!(
                "Invalid value for '{param}': '{v}'. Supported values are: 'none', 'minimal', 'low', 'medium' and 'high'."
            ),
        ))
    }
}

// ---- tools -------------------------------------------------------------------

/// A tool's `type` must be `function` (spec 2.2): the caller executes calls,
/// and no hosted tools exist. `param` is e.g. `tools.0.type`.
pub fn check_tool_type(param: &str, kind: Option<&str>) -> Result<(), ApiError> {
    match kind {
        Some("function") => Ok(()),
        None => Err(ApiError::missing_parameter(param)),
        Some(other) => Err(ApiError::invalid_value(
            param,
            format!("Invalid value for '{param}': '{other}'. Only 'function' tools are supported."),
        )),
    }
}

/// A function tool as either API spells it, borrowed for checking.
#[derive(Debug, Clone, Copy)]
pub struct FunctionSpec<'a> {
    /// Prefix of the function's fields: `tools.0.function` (chat) or `tools.0` (flat).
    pub prefix: &'a str,
    pub name: Option<&'a str>,
    pub parameters: Option<&'a Value>,
    pub strict: bool,
}

/// Name, schema validity and, with `strict: true`, the strict-schema rules
/// of one function tool. Parameters are optional (a function without
/// arguments); when present they must be an object schema.
pub fn check_function_tool(f: &FunctionSpec<'_>) -> Result<(), ApiError> {
    let name_param = format!("{}.name", f.prefix);
    let name = f
        .name
        .ok_or_else(|| ApiError::missing_parameter(name_param.as_str()))?;
    check_name(&name_param, name)?;
    let Some(schema) = f.parameters.filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let param = format!("{}.parameters", f.prefix);
    let bad = |msg: String| {
        ApiError::new(400, "invalid_function_parameters", msg).with_param(param.as_str())
    };
    if !schema.is_object() {
        return Err(ApiError::invalid_type(
            param.as_str(),
            format!("'{param}' must be a JSON Schema object."),
        ));
    }
    check_schema_validity(schema).map_err(|e| {
        bad(format!(
            "Invalid schema for function '{name}': {}",
            e.message
        ))
        .with_param(e.param(&param))
    })?;
    if f.strict {
        check_strict_schema(schema).map_err(|e| {
            bad(format!(
                "Invalid schema for function '{name}' with 'strict': true: {e}"
            ))
        })?;
    }
    Ok(())
}

/// Function and schema names: `a-z A-Z 0-9 _ -`, 1 to 64 characters.
pub fn check_name(param: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_value(
            param,
            format!(
                "Invalid '{param}': '{}'. Use 1 to {MAX_NAME_CHARS} characters among a-z, A-Z, 0-9, '_' and '-'.",
                truncate(name, 80)
            ),
        ))
    }
}

// ---- structured output -------------------------------------------------------

/// A requested output format as either API spells it: chat's
/// `response_format` (`json_schema` nested under `json_schema`) or responses'
/// `text.format` (flat). `prefix` is where `type` lives (`response_format`,
/// `text.format`); `schema_prefix` is where `name`/`schema` live
/// (`response_format.json_schema`, `text.format`).
#[derive(Debug, Clone, Copy)]
pub struct FormatSpec<'a> {
    pub prefix: &'a str,
    pub schema_prefix: &'a str,
    pub kind: Option<&'a str>,
    /// `json_schema` only: whether the object holding `name`/`schema` is present
    /// (always true for the flat shape).
    pub has_schema_object: bool,
    pub name: Option<&'a str>,
    pub schema: Option<&'a Value>,
    pub strict: bool,
}

/// What the format asks the model for, once checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatKind {
    Text,
    JsonObject,
    JsonSchema,
}

/// `type` in `text|json_object|json_schema`; `json_schema` needs a valid
/// `name` and a valid JSON Schema object, and with `strict: true` the strict
/// rules hold.
pub fn check_format(f: &FormatSpec<'_>) -> Result<FormatKind, ApiError> {
    let type_param = format!("{}.type", f.prefix);
    let kind = match f.kind {
        None => return Err(ApiError::missing_parameter(type_param)),
        Some("text") => return Ok(FormatKind::Text),
        Some("json_object") => return Ok(FormatKind::JsonObject),
        Some("json_schema") => FormatKind::JsonSchema,
        Some(other) => {
            return Err(ApiError::invalid_value(
                type_param.as_str(),
                format!(
                    "Invalid value for '{type_param}': '{}'. Supported values are: 'text', 'json_object' and 'json_schema'.",
                    truncate(other, 80)
                ),
            ))
        }
    };
    if !f.has_schema_object {
        return Err(ApiError::missing_parameter(f.schema_prefix));
    }
    let name_param = format!("{}.name", f.schema_prefix);
    let name = f
        .name
        .ok_or_else(|| ApiError::missing_parameter(name_param.as_str()))?;
    check_name(&name_param, name)?;
    let schema_param = format!("{}.schema", f.schema_prefix);
    let schema = f
        .schema
        .filter(|v| !v.is_null())
        .ok_or_else(|| ApiError::missing_parameter(schema_param.as_str()))?;
    if !schema.is_object() {
        return Err(ApiError::invalid_type(
            schema_param.as_str(),
            format!("'{schema_param}' must be a JSON Schema object."),
        ));
    }
    let bad = |msg: String| {
        ApiError::new(400, "invalid_json_schema", msg).with_param(schema_param.as_str())
    };
    check_schema_validity(schema).map_err(|e| {
        bad(format!(
            "Invalid schema for response format '{name}': {}",
            e.message
        ))
        .with_param(e.param(&schema_param))
    })?;
    if f.strict {
        check_strict_schema(schema).map_err(|e| {
            bad(format!(
                "Invalid schema for response format '{name}' with 'strict': true: {e}"
            ))
        })?;
    }
    Ok(kind)
}

// ---- JSON Schema -------------------------------------------------------------

/// The schema is valid against its draft's meta-schema and compiles (which
/// also catches bad regular expressions and `$ref`s that do not resolve; no
/// remote reference is ever fetched: the crate is built without resolvers).
/// The error text says where, for a human; callers choose `param`.
///
/// Checking costs tens of microseconds per schema, and clients resend the
/// same tools and formats on every turn, so outcomes are remembered by the
/// schema's content (see [`crate::schema_cache`]).
///
/// A schema that certainly admits no value is refused too: a model held
/// to it could only fail the output check, a 500 a client would retry in
/// vain ([`super::satisfiable`]).
pub fn check_schema_validity(schema: &Value) -> Result<(), SchemaFault> {
    compiled_schema(schema).map_err(|message| SchemaFault { message, at: None })?;
    match super::satisfiable::unsatisfiable(schema) {
        None => Ok(()),
        Some(why) => Err(SchemaFault {
            message: format!("it admits no value: {why}"),
            at: Some(why.dot_path()),
        }),
    }
}

/// Why a schema was refused, for a human, and where in it when that is
/// known precisely (an impossible keyword: `properties.a.minItems`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFault {
    pub message: String,
    pub at: Option<String>,
}

impl SchemaFault {
    /// The `param` to report: the schema's own (`text.format.schema`),
    /// extended by the place in it when known.
    pub fn param(&self, schema_param: &str) -> String {
        match self.at.as_deref() {
            Some(at) if !at.is_empty() => format!("{schema_param}.{at}"),
            _ => schema_param.to_owned(),
        }
    }
}

/// The strict-mode rules of the public API, at every object level: an
/// object schema sets `additionalProperties: false` and lists every one of
/// its `properties` in `required`. Subschemas are followed through
/// `properties`, `items`, `prefixItems`, `anyOf`/`oneOf`/`allOf`, `$defs`,
/// `definitions`, `not`, `if`/`then`/`else` and `additionalProperties`.
/// The error names the failing location as a JSON pointer into the schema.
pub fn check_strict_schema(schema: &Value) -> Result<(), String> {
    let mut path = String::new();
    strict_at(schema, &mut path)
}

fn strict_at(schema: &Value, path: &mut String) -> Result<(), String> {
    let Value::Object(obj) = schema else {
        return Ok(()); // `true`/`false` schemas have no properties to close
    };
    let is_object = match obj.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => obj.contains_key("properties"),
    };
    if is_object {
        let at = if path.is_empty() { "/" } else { path.as_str() };
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err(format!(
                "'additionalProperties' is required to be supplied and to be false (at '{at}')."
            ));
        }
        if let Some(Value::Object(props)) = obj.get("properties") {
            let required: Vec<&str> = match obj.get("required") {
                Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if let Some(missing) = props.keys().find(|k| !required.contains(&k.as_str())) {
                return Err(format!(
                    "'required' must list every property; '{}' is missing (at '{at}').",
                    truncate(missing, 80)
                ));
            }
        }
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = obj.get(key) {
            each_child(children, key, path)?;
        }
    }
    for key in ["items", "not", "if", "then", "else", "additionalProperties"] {
        if let Some(child) = obj.get(key) {
            if let Value::Array(items) = child {
                // draft-04 tuple form of `items`
                each_item(items, key, path)?;
            } else {
                descend(child, key, path)?;
            }
        }
    }
    for key in ["prefixItems", "anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(items)) = obj.get(key) {
            each_item(items, key, path)?;
        }
    }
    Ok(())
}

fn each_child(children: &Map<String, Value>, key: &str, path: &mut String) -> Result<(), String> {
    for (name, child) in children {
        let len = path.len();
        path.push('/');
        path.push_str(key);
        path.push('/');
        path.push_str(&name.replace('~', "~0").replace('/', "~1"));
        strict_at(child, path)?;
        path.truncate(len);
    }
    Ok(())
}

fn each_item(items: &[Value], key: &str, path: &mut String) -> Result<(), String> {
    for (i, child) in items.iter().enumerate() {
        let len = path.len();
        path.push('/');
        path.push_str(key);
        path.push('/');
        path.push_str(&i.to_string());
        strict_at(child, path)?;
        path.truncate(len);
    }
    Ok(())
}

fn descend(child: &Value, key: &str, path: &mut String) -> Result<(), String> {
    let len = path.len();
    path.push('/');
    path.push_str(key);
    strict_at(child, path)?;
    path.truncate(len);
    Ok(())
}

// ---- context window ----------------------------------------------------------

/// The fewest tokens `bytes` of text can be (see [`MAX_BYTES_PER_TOKEN`]).
pub fn min_tokens_for_bytes(bytes: usize) -> u64 {
    (bytes / MAX_BYTES_PER_TOKEN) as u64
}

/// Rejects a request that cannot fit the model's window whatever the
/// tokenizer says: a requested output (`max_tokens`) that alone fills the
/// window (param `output_param`), or input that is certainly over once the
/// requested output is added (param `input_param`). Earlier messages are
/// never dropped to make a request fit (spec 8, rule 1).
pub fn check_context_window(
    model: &ModelSpec,
    input_bytes: usize,
    max_output: Option<u32>,
    input_param: &str,
    output_param: &str,
) -> Result<(), ApiError> {
    let window = u64::from(model.context_window);
    let output = u64::from(max_output.unwrap_or(0));
    if output >= window {
        return Err(ApiError::new(
            400,
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {window} tokens (input and output combined); '{output_param}' asks for {output} output tokens, which leaves no room for input."
            ),
        )
        .with_param(output_param));
    }
    let input = min_tokens_for_bytes(input_bytes);
    if input + output > window {
        return Err(ApiError::new(
            400,
            "context_length_exceeded",
            format!(
                "This model's maximum context length is {window} tokens. However, you requested at least {} tokens ({input} or more in the input, {output} for the output). Please reduce the length of the input or of the requested output.",
                input + output
            ),
        )
        .with_param(input_param));
    }
    Ok(())
}

/// Cuts user-supplied text quoted back in a message.
fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;
    use serde_json::json;

    fn strict_tool(schema: Value) -> Result<(), ApiError> {
        check_function_tool(&FunctionSpec {
            prefix: "tools.0.function",
            name: Some("get_weather"),
            parameters: Some(&schema),
            strict: true,
        })
    }

    #[test]
    fn strict_schema_must_close_every_object_level() {
        let ok = json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "when": {"type": "object", "properties": {"day": {"type": "string"}},
                         "required": ["day"], "additionalProperties": false}
            },
            "required": ["city", "when"],
            "additionalProperties": false
        });
        assert!(strict_tool(ok).is_ok());

        let open_nested = json!({
            "type": "object",
            "properties": {"when": {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]}},
            "required": ["when"],
            "additionalProperties": false
        });
        let e = strict_tool(open_nested).unwrap_err();
        assert_eq!(
            (e.status, e.code.as_ref(), e.param.as_deref()),
            (
                400,
                "invalid_function_parameters",
                Some("tools.0.function.parameters")
            )
        );
        assert!(e.message.contains("/properties/when"), "{}", e.message);

        let not_required = json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "required": ["a"],
            "additionalProperties": false
        });
        let e = strict_tool(not_required).unwrap_err();
        assert!(e.message.contains("'b'"), "{}", e.message);

        let in_array = json!({
            "type": "object",
            "properties": {"xs": {"type": "array", "items": {"type": "object", "properties": {"v": {"type": "number"}}}}},
            "required": ["xs"],
            "additionalProperties": false
        });
        let e = strict_tool(in_array).unwrap_err();
        assert!(e.message.contains("/properties/xs/items"), "{}", e.message);

        let in_defs = json!({
            "type": "object",
            "properties": {"n": {"$ref": "#/$defs/node"}},
            "required": ["n"],
            "additionalProperties": false,
            "$defs": {"node": {"type": "object", "properties": {"v": {"type": "string"}}, "additionalProperties": false}}
        });
        let e = strict_tool(in_defs).unwrap_err();
        assert!(e.message.contains("/$defs/node"), "{}", e.message);
    }

    #[test]
    fn non_strict_schema_may_stay_open() {
        let open = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        assert!(check_function_tool(&FunctionSpec {
            prefix: "tools.0",
            name: Some("f"),
            parameters: Some(&open),
            strict: false,
        })
        .is_ok());
    }

    #[test]
    fn invalid_schemas_are_caught_by_the_meta_schema_and_compilation() {
        for schema in [
            json!({"type": "objekt"}),
            json!({"type": "object", "properties": {"a": {"type": 5}}}),
            json!({"type": "object", "required": "a"}),
            json!({"type": "string", "pattern": "(unclosed"}),
            json!({"$ref": "#/$defs/missing"}),
            json!({"$ref": "https://example.com/remote.json"}),
        ] {
            let e = check_function_tool(&FunctionSpec {
                prefix: "tools.1",
                name: Some("f"),
                parameters: Some(&schema),
                strict: false,
            })
            .unwrap_err();
            assert_eq!(
                (e.code.as_ref(), e.param.as_deref()),
                ("invalid_function_parameters", Some("tools.1.parameters")),
                "{schema}"
            );
        }
        let e = check_function_tool(&FunctionSpec {
            prefix: "tools.1",
            name: Some("f"),
            parameters: Some(&json!("object")),
            strict: false,
        })
        .unwrap_err();
        assert_eq!(e.code, "invalid_type");
    }

    #[test]
    fn function_names_follow_the_public_pattern() {
        assert!(check_name("tools.0.function.name", "get_weather-2").is_ok());
        for bad in ["", "has space", "dots.not.allowed", &"x".repeat(65)] {
            let e = check_name("tools.0.function.name", bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("tools.0.function.name"));
        }
        let e = check_function_tool(&FunctionSpec {
            prefix: "tools.3",
            name: None,
            parameters: None,
            strict: false,
        })
        .unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("missing_required_parameter", Some("tools.3.name"))
        );
    }

    #[test]
    fn tool_type_must_be_function() {
        assert!(check_tool_type("tools.0.type", Some("function")).is_ok());
        let e = check_tool_type("tools.0.type", Some("web_search")).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("tools.0.type"))
        );
        assert_eq!(
            check_tool_type("tools.0.type", None).unwrap_err().code,
            "missing_required_parameter"
        );
    }

    fn format<'a>(
        kind: Option<&'a str>,
        name: Option<&'a str>,
        schema: Option<&'a Value>,
        strict: bool,
    ) -> FormatSpec<'a> {
        FormatSpec {
            prefix: "response_format",
            schema_prefix: "response_format.json_schema",
            kind,
            has_schema_object: true,
            name,
            schema,
            strict,
        }
    }

    #[test]
    fn formats() {
        assert_eq!(
            check_format(&format(Some("text"), None, None, false)),
            Ok(FormatKind::Text)
        );
        assert_eq!(
            check_format(&format(Some("json_object"), None, None, false)),
            Ok(FormatKind::JsonObject)
        );
        let e = check_format(&format(Some("xml"), None, None, false)).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("response_format.type"));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
        assert_eq!(
            check_format(&format(
                Some("json_schema"),
                Some("answer"),
                Some(&schema),
                true
            )),
            Ok(FormatKind::JsonSchema)
        );
        let e = check_format(&format(Some("json_schema"), None, Some(&schema), true)).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            (
                "missing_required_parameter",
                Some("response_format.json_schema.name")
            )
        );
        let e = check_format(&format(Some("json_schema"), Some("a"), None, false)).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("response_format.json_schema.schema")
        );
        let open = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert!(check_format(&format(Some("json_schema"), Some("a"), Some(&open), false)).is_ok());
        let e =
            check_format(&format(Some("json_schema"), Some("a"), Some(&open), true)).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            (
                "invalid_json_schema",
                Some("response_format.json_schema.schema")
            )
        );
        let mut missing_object = format(Some("json_schema"), None, None, false);
        missing_object.has_schema_object = false;
        assert_eq!(
            check_format(&missing_object).unwrap_err().param.as_deref(),
            Some("response_format.json_schema")
        );
    }

    #[test]
    fn bounds() {
        assert!(check_range("temperature", 2.0, 0.0, 2.0).is_ok());
        assert!(check_range("temperature", 2.01, 0.0, 2.0).is_err());
        assert_eq!(check_at_least("max_tokens", 1, 1), Ok(1));
        assert!(check_at_least("max_tokens", 0, 1).is_err());
        assert!(check_at_least("max_tokens", i64::from(u32::MAX) + 1, 1).is_err());
        assert_eq!(check_thinking_budget("thinking_budget", 16384), Ok(16384));
        assert!(check_thinking_budget("thinking_budget", -1).is_err());
        assert!(check_reasoning_effort("reasoning.effort", "minimal").is_ok());
        assert_eq!(
            check_reasoning_effort("reasoning.effort", "max")
                .unwrap_err()
                .param
                .as_deref(),
            Some("reasoning.effort")
        );
    }

    #[test]
    fn context_window_early_check() {
        let base = catalog::Catalog::default().find("base").unwrap();
        assert!(check_context_window(base, 1_000, Some(1_000), "messages", "max_tokens").is_ok());
        let e =
            check_context_window(base, 10, Some(196_608), "messages", "max_tokens").unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("context_length_exceeded", Some("max_tokens"))
        );
        // 196,608 tokens need at least 1,572,864 bytes at 8 bytes per token.
        assert!(check_context_window(base, 1_572_864, None, "messages", "max_tokens").is_ok());
        let e = check_context_window(base, 1_572_872, None, "messages", "max_tokens").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let ultra = catalog::Catalog::default().find("base-ultra").unwrap();
        assert!(check_context_window(ultra, 1_572_872, None, "input", "max_output_tokens").is_ok());
    }
}
