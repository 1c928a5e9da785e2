//! From a `GenerateRequest` to what a sequence engine needs: chat messages
//! flattened to text (tool calls and results included), the output
//! constraint, the tool-call mode, the reasoning budget and sampling.
//!
//! Tools on a model without a native tool-call format: the tools are listed
//! in a system message; with `tool_choice` `required` or a named function
//! the output is constrained (while decoding) to a JSON call
//! `{"name": <one of the tools>, "arguments": <its parameters schema>}`, or
//! an array of them when `parallel_tool_calls` is set. With `auto` the reply
//! is unconstrained: a reply that starts as such a call of a listed tool is
//! parsed as one (see [`super::tool_calls::CallDetector`]), anything else
//! is text. `none` hides the tools.
//!
//! Image parts reach an engine that accepts them as
//! [`IMAGE_PLACEHOLDER`]s in the text with the images beside it; others
//! refuse them.
//!
//! Constraints are JSON Schemas for llguidance, in compact JSON; objects
//! that do not mention `additionalProperties` are closed (see
//! [`close_objects`]).

use crate::seam::sequence::{ChatMessage, Constraint, Image, SamplingParams, IMAGE_PLACEHOLDER};
use crate::status;
use inference_proto::v1 as pb;
use serde_json::{json, Value};
use tonic::Status;

/// How tool calls come out of this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolMode {
    /// Text reply.
    Off,
    /// Tools are listed; a reply that starts as a call of one is parsed
    /// into calls, anything else is text.
    Auto,
    /// The output is constrained to tool-call JSON and parsed into calls.
    Constrained,
}

/// Opens the tool listing in the system message.
pub const TOOLS_HEADER: &str = "You can call these functions:\n";
/// Between a listed tool's description and its parameters' schema.
pub const TOOL_PARAMETERS: &str = "\n  parameters (JSON Schema): ";
/// Ends the listing when a call is due now (`required`, a named choice).
pub const CALL_NOW: &str =
    "Call a function now: reply with JSON {\"name\": <function>, \"arguments\": <object>}.";
/// Ends the listing when the model may call (`auto`).
pub const CALL_IF_NEEDED: &str =
    "To call one, reply with JSON {\"name\": <function>, \"arguments\": <object>}.";
/// Follows [`CALL_IF_NEEDED`] when several calls may be made at once.
pub const CALL_SEVERAL: &str = " To call several at once, reply with a JSON array of them.";

/// Everything the pipeline decides from the request before rendering.
#[derive(Debug, Clone)]
pub struct RequestPlan {
    pub messages: Vec<ChatMessage>,
    pub constraint: Option<Constraint>,
    pub tools: ToolMode,
    /// The tools listed (what [`ToolMode::Auto`] accepts a call of).
    pub tool_names: Vec<String>,
    /// Tokens the think section may take; `None` = no reasoning.
    pub reasoning_budget: Option<u32>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub max_tokens: u32,
    /// Several calls may be made at once (an array of them).
    pub parallel_tool_calls: bool,
}

/// Compact JSON from the constraint: a small model would otherwise spend
/// its budget on whitespace; unknown keywords are ignored, not refused.
fn guidance_options() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
        "lenient": true,
        "coerce_one_of": true
    })
}

/// Objects that list their properties and say nothing about others get
/// `additionalProperties: false` in the constraint: the output stays valid
/// against the caller's schema, and a small model cannot wander off into
/// invented keys until `max_tokens` (seen with SmolLM2).
pub fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if map.contains_key("properties") && !map.contains_key("additionalProperties") {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (key, value) in map.iter_mut() {
                match key.as_str() {
                    "properties" | "$defs" | "definitions" | "patternProperties" => {
                        if let Value::Object(children) = value {
                            children.values_mut().for_each(close_objects);
                        }
                    }
                    "items" | "additionalProperties" | "not" => close_objects(value),
                    "anyOf" | "allOf" | "oneOf" | "prefixItems" => {
                        if let Value::Array(children) = value {
                            children.iter_mut().for_each(close_objects);
                        }
                    }
                    _ => {}
                }
            }
        }
        Value::Array(_) | Value::Bool(_) | Value::Null | Value::Number(_) | Value::String(_) => {}
    }
}

fn with_options(mut schema: Value) -> Value {
    close_objects(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.insert("x-guidance".into(), guidance_options());
        schema
    } else {
        // A boolean schema (`true`): any JSON value.
        json!({"x-guidance": guidance_options()})
    }
}

/// The reasoning budget for an effort, when `budget_tokens` is 0 (the same
/// table as the synthetic engine's).
pub fn effort_budget(effort: &str) -> u32 {
    match effort {
        "minimal" => 64,
        "low" => 256,
        "high" => 4096,
        _ => 1024,
    }
}

/// Plans a request for an engine; `images`: whether it takes image parts.
pub fn plan(req: &pb::GenerateRequest, images: bool) -> Result<RequestPlan, Status> {
    let sampling = req.sampling.clone().unwrap_or_default();
    let (tools, tool_schema) = tool_plan(req)?;
    let constraint = match tool_schema {
        Some(schema) => Some(Constraint::JsonSchema(with_options(schema))),
        None => response_format(req.response_format.as_ref())?,
    };
    let mut messages = flatten(req, images)?;
    let tool_names = if tools == ToolMode::Off {
        Vec::new()
    } else {
        req.tools.iter().map(|t| t.name.clone()).collect()
    };
    if tools != ToolMode::Off {
        let listing = tool_listing(req, tools == ToolMode::Constrained);
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                first.content = format!("{}\n\n{listing}", first.content);
            }
            _ => messages.insert(
                0,
                ChatMessage {
                    role: "system".into(),
                    content: listing,
                    ..ChatMessage::default()
                },
            ),
        }
    }
    let reasoning_budget = req.reasoning.as_ref().filter(|r| r.enabled).map(|r| {
        if r.budget_tokens > 0 {
            r.budget_tokens
        } else {
            effort_budget(&r.effort)
        }
    });
    Ok(RequestPlan {
        messages,
        constraint,
        tools,
        tool_names,
        reasoning_budget,
        sampling: SamplingParams {
            temperature: sampling.temperature.map(|t| t as f32),
            top_p: sampling.top_p.map(|p| p as f32),
            top_k: sampling.top_k.filter(|k| *k > 0),
            seed: sampling.seed,
            repeat_penalty: sampling.repeat_penalty.map(|p| p as f32),
        },
        stop: sampling.stop,
        max_tokens: sampling.max_tokens,
        parallel_tool_calls: req.parallel_tool_calls,
    })
}

fn tool_plan(req: &pb::GenerateRequest) -> Result<(ToolMode, Option<Value>), Status> {
    use pb::tool_choice::Mode;
    if req.tools.is_empty() {
        return Ok((ToolMode::Off, None));
    }
    let choice = req.tool_choice.clone().unwrap_or_default();
    let chosen: Vec<&pb::FunctionTool> = match choice.mode() {
        Mode::Required => req.tools.iter().collect(),
        Mode::Named => {
            let tool = req
                .tools
                .iter()
                .find(|t| t.name == choice.function_name)
                .ok_or_else(|| {
                    status::invalid_request(format!(
                        "tool_choice names `{}`, which is not among the tools",
                        choice.function_name
                    ))
                })?;
            vec![tool]
        }
        Mode::Auto | Mode::Unspecified => return Ok((ToolMode::Auto, None)),
        Mode::None => return Ok((ToolMode::Off, None)),
    };
    let mut calls = Vec::with_capacity(chosen.len());
    for tool in chosen {
        let params = if tool.parameters_json.trim().is_empty() {
            json!({"type": "object"})
        } else {
            serde_json::from_str::<Value>(&tool.parameters_json).map_err(|e| {
                status::invalid_request(format!(
                    "tool `{}` has invalid parameters JSON: {e}",
                    tool.name
                ))
            })?
        };
        calls.push(json!({
            "type": "object",
            "properties": {"name": {"enum": [tool.name]}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": false
        }));
    }
    let call = if calls.len() == 1 {
        calls.remove(0)
    } else {
        json!({"anyOf": calls})
    };
    let schema = if req.parallel_tool_calls {
        json!({"type": "array", "items": call, "minItems": 1})
    } else {
        call
    };
    Ok((ToolMode::Constrained, Some(schema)))
}

fn response_format(format: Option<&pb::ResponseFormat>) -> Result<Option<Constraint>, Status> {
    use pb::response_format::Kind;
    let Some(format) = format else {
        return Ok(None);
    };
    match format.kind() {
        Kind::Unspecified | Kind::Text => Ok(None),
        Kind::JsonObject => Ok(Some(Constraint::JsonSchema(with_options(
            json!({"type": "object"}),
        )))),
        Kind::JsonSchema => {
            let schema: Value = serde_json::from_str(&format.schema_json).map_err(|e| {
                status::invalid_request(format!("response_format schema is not JSON: {e}"))
            })?;
            Ok(Some(Constraint::JsonSchema(with_options(schema))))
        }
    }
}

fn tool_listing(req: &pb::GenerateRequest, constrained: bool) -> String {
    let mut s = String::from(TOOLS_HEADER);
    for t in &req.tools {
        let params = if t.parameters_json.is_empty() {
            "{}"
        } else {
            t.parameters_json.as_str()
        };
        s.push_str(&format!(
            "- {}: {}{TOOL_PARAMETERS}{params}\n",
            t.name, t.description
        ));
    }
    if constrained {
        s.push_str(CALL_NOW);
    } else {
        s.push_str(CALL_IF_NEEDED);
        if req.parallel_tool_calls {
            s.push_str(CALL_SEVERAL);
        }
    }
    s
}

/// Messages as plain text; image parts as placeholders beside their
/// images when the engine takes them (`images`), else refused.
fn flatten(req: &pb::GenerateRequest, images: bool) -> Result<Vec<ChatMessage>, Status> {
    let mut out = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let mut content = String::new();
        let mut parts = Vec::new();
        for (j, part) in m.content.iter().enumerate() {
            match &part.part {
                // (a placeholder in the text would stand for no image)
                Some(pb::content_part::Part::Text(t)) => {
                    content.extend(t.chars().filter(|c| *c != IMAGE_PLACEHOLDER));
                }
                Some(pb::content_part::Part::ImageUrl(image)) if images => {
                    content.push(IMAGE_PLACEHOLDER);
                    parts.push(Image {
                        url: image.url.clone(),
                        detail: image.detail.clone(),
                    });
                }
                Some(pb::content_part::Part::ImageUrl(_)) => {
                    return Err(status::invalid_request(format!(
                        "messages[{i}].content[{j}] is an image part, but model `{}` is served \
                         by a text-only model: remove the image or use a model with image input",
                        req.model
                    )));
                }
                None => {}
            }
        }
        for call in &m.tool_calls {
            if !content.is_empty() {
                content.push('\n');
            }
            let args: Value = serde_json::from_str(&call.arguments)
                .unwrap_or(Value::String(call.arguments.clone()));
            content.push_str(&json!({"name": call.name, "arguments": args}).to_string());
        }
        let role = match m.role.as_str() {
            "developer" => "system",
            other => other,
        };
        out.push(ChatMessage {
            role: role.to_owned(),
            content,
            images: parts,
            tool_call_id: m.tool_call_id.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> pb::Message {
        pb::Message {
            role: "user".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }
    }

    fn tool(name: &str) -> pb::FunctionTool {
        pb::FunctionTool {
            name: name.into(),
            description: "d".into(),
            parameters_json: r#"{"type":"object","properties":{"x":{"type":"integer"}}}"#.into(),
            strict: true,
        }
    }

    #[test]
    fn required_tools_constrain_to_a_call_of_one_of_them() {
        let req = pb::GenerateRequest {
            messages: vec![user("hi")],
            tools: vec![tool("a"), tool("b")],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Required as i32,
                function_name: String::new(),
            }),
            ..Default::default()
        };
        let p = plan(&req, false).expect("plan");
        assert_eq!(p.tools, ToolMode::Constrained);
        let Some(Constraint::JsonSchema(s)) = p.constraint else {
            panic!("no constraint")
        };
        assert_eq!(s["anyOf"][1]["properties"]["name"]["enum"][0], "b");
        // The engine writes a call in the properties' order, and a moved
        // generation's calls are written again name first (`resume.rs`).
        let text = s.to_string();
        let (name, arguments) = (text.find("\"name\""), text.find("\"arguments\""));
        assert!(name.is_some() && name < arguments, "{text}");
        assert_eq!(p.messages[0].role, "system");
        assert!(p.messages[0].content.contains("- a: d"));
    }

    #[test]
    fn auto_lists_tools_but_does_not_constrain() {
        let req = pb::GenerateRequest {
            messages: vec![user("hi")],
            tools: vec![tool("a")],
            ..Default::default()
        };
        let p = plan(&req, false).expect("plan");
        assert_eq!(p.tools, ToolMode::Auto);
        assert_eq!(p.tool_names, ["a"]);
        assert!(p.constraint.is_none());
        assert_eq!(p.messages.len(), 2);
        assert!(p.messages[0].content.ends_with(CALL_SEVERAL) == req.parallel_tool_calls);
    }

    #[test]
    fn image_parts_are_refused_by_name() {
        let mut m = user("look");
        m.content.push(pb::ContentPart {
            part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                url: "data:image/png;base64,AAAA".into(),
                detail: "low".into(),
            })),
        });
        let req = pb::GenerateRequest {
            model: "base".into(),
            messages: vec![m],
            ..Default::default()
        };
        let err = plan(&req, false).expect_err("image refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("messages[0].content[1]"),
            "{}",
            err.message()
        );
        // An engine that takes images gets them beside a placeholder.
        let p = plan(&req, true).expect("plan");
        assert_eq!(p.messages[0].content, format!("look{IMAGE_PLACEHOLDER}"));
        assert_eq!(p.messages[0].images[0].detail, "low");
    }

    #[test]
    fn objects_without_a_word_on_other_keys_are_closed() {
        let s = with_options(json!({
            "type": "object",
            "properties": {"a": {"type": "object", "properties": {"b": {}}}},
            "$defs": {"open": {"properties": {}, "additionalProperties": true}}
        }));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["$defs"]["open"]["additionalProperties"], true);
        assert!(s["x-guidance"].is_object());
    }

    #[test]
    fn an_unknown_named_tool_is_invalid() {
        let req = pb::GenerateRequest {
            messages: vec![user("hi")],
            tools: vec![tool("a")],
            tool_choice: Some(pb::ToolChoice {
                mode: pb::tool_choice::Mode::Named as i32,
                function_name: "zzz".into(),
            }),
            ..Default::default()
        };
        assert!(plan(&req, false).is_err());
    }
}
