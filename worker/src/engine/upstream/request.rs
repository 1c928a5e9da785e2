//! `GenerateRequest` → the engine's chat request, per [`Kind`] (the table
//! in [`super::kind`]).
//!
//! Two tool modes. Native: tools, `tool_choice` and `parallel_tool_calls`
//! travel as chat fields and the engine's own template and tool parser do
//! the rest. Enforced (`required` or a named function on a kind that
//! enforces): the engine gets no tools; the pipeline's plan lists them in a
//! system message and asks for a JSON schema of the call through
//! `response_format`, and the reply is parsed into tool calls by the
//! pipeline's [`ToolCallParser`](crate::pipeline::tool_calls::ToolCallParser),
//! as the in-process engine does.

use super::kind::{Continuation, Kind, MaxTokensField, ReasoningField};
use super::wire::{self, ChatRequest, StreamOptions};
use crate::pipeline::request::{self as plan, ToolMode};
use crate::seam::sequence::Constraint;
use crate::status;
use inference_proto::v1 as pb;
use serde_json::{json, Value};
use tonic::Status;

/// The chat request, and whether its content is a tool call to parse.
#[derive(Debug, Clone)]
pub struct Built {
    pub body: ChatRequest,
    pub enforced_tools: bool,
}

/// Whether this request's tool choice is enforced by the worker.
pub fn enforces_tools(req: &pb::GenerateRequest, enforce: bool) -> bool {
    use pb::tool_choice::Mode;
    let mode = req.tool_choice.as_ref().map_or(Mode::Auto, |c| c.mode());
    enforce && !req.tools.is_empty() && matches!(mode, Mode::Required | Mode::Named)
}

/// The messages as the engine gets them (also what `/tokenize` counts).
pub fn messages(
    kind: Kind,
    req: &pb::GenerateRequest,
    enforced_tools: bool,
) -> Result<Vec<wire::Message>, Status> {
    if enforced_tools {
        // Flattened, with the tool listing: the engine sees no tools.
        let p = plan::plan(req, false)?;
        return Ok(p
            .messages
            .into_iter()
            .map(|m| wire::Message {
                role: m.role,
                content: Value::String(m.content),
                ..Default::default()
            })
            .collect());
    }
    req.messages
        .iter()
        .map(|m| message(kind, m))
        .collect::<Result<_, _>>()
}

fn message(kind: Kind, m: &pb::Message) -> Result<wire::Message, Status> {
    let has_image = m
        .content
        .iter()
        .any(|p| matches!(p.part, Some(pb::content_part::Part::ImageUrl(_))));
    let content = if has_image {
        Value::Array(
            m.content
                .iter()
                .filter_map(|p| match &p.part {
                    Some(pb::content_part::Part::Text(t)) => {
                        Some(json!({"type": "text", "text": t}))
                    }
                    Some(pb::content_part::Part::ImageUrl(i)) => Some(json!({
                        "type": "image_url",
                        "image_url": {"url": i.url, "detail": i.detail}
                    })),
                    None => None,
                })
                .collect(),
        )
    } else {
        let mut text = String::new();
        for p in &m.content {
            if let Some(pb::content_part::Part::Text(t)) = &p.part {
                text.push_str(t);
            }
        }
        Value::String(text)
    };
    // Open-model chat templates know system, user, assistant and tool.
    let role = match (kind, m.role.as_str()) {
        (Kind::Openai, r) => r.to_owned(),
        (_, "developer") => "system".to_owned(),
        (_, r) => r.to_owned(),
    };
    Ok(wire::Message {
        role,
        content,
        name: m.name.clone(),
        tool_call_id: m.tool_call_id.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| wire::ToolCall {
                id: c.id.clone(),
                kind: "function",
                function: wire::FunctionCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
            .collect(),
    })
}

/// The tools as chat fields (also what `/tokenize` renders).
pub fn tools(req: &pb::GenerateRequest) -> Result<Vec<wire::Tool>, Status> {
    req.tools
        .iter()
        .map(|t| {
            let parameters = if t.parameters_json.trim().is_empty() {
                json!({"type": "object", "properties": {}})
            } else {
                serde_json::from_str(&t.parameters_json).map_err(|e| {
                    status::invalid_request(format!(
                        "tool `{}` has invalid parameters JSON: {e}",
                        t.name
                    ))
                })?
            };
            Ok(wire::Tool {
                kind: "function",
                function: wire::ToolFunction {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters,
                    strict: t.strict,
                },
            })
        })
        .collect()
}

fn tool_choice(choice: Option<&pb::ToolChoice>) -> Option<Value> {
    use pb::tool_choice::Mode;
    let choice = choice?;
    Some(match choice.mode() {
        Mode::Unspecified => return None,
        Mode::Auto => json!("auto"),
        Mode::None => json!("none"),
        Mode::Required => json!("required"),
        Mode::Named => json!({"type": "function", "function": {"name": choice.function_name}}),
    })
}

/// A JSON schema as `response_format`, with the pipeline's closed objects
/// (valid against the caller's schema; a small model cannot wander into
/// invented keys).
fn schema_format(name: &str, mut schema: Value, strict: bool) -> Value {
    plan::close_objects(&mut schema);
    let name = if name.is_empty() { "output" } else { name };
    json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}})
}

fn response_format(format: Option<&pb::ResponseFormat>) -> Result<Option<Value>, Status> {
    use pb::response_format::Kind as F;
    let Some(format) = format else {
        return Ok(None);
    };
    Ok(match format.kind() {
        F::Unspecified | F::Text => None,
        F::JsonObject => Some(json!({"type": "json_object"})),
        F::JsonSchema => {
            let schema: Value = serde_json::from_str(&format.schema_json).map_err(|e| {
                status::invalid_request(format!("response_format schema is not JSON: {e}"))
            })?;
            Some(schema_format(&format.schema_name, schema, format.strict))
        }
    })
}

/// A moved generation (`resume`): its delivered text becomes the final
/// assistant message, which the engine continues. Only a text answer can
/// move here: the engine's own parsers cannot be put mid-way through a
/// tool call or a think section.
fn continue_text(kind: Kind, resume: &pb::Resume, body: &mut ChatRequest) -> Result<(), Status> {
    let Some(how) = kind.continues_final_message() else {
        return Err(status::invalid_request(
            "this upstream engine cannot continue a moved generation",
        ));
    };
    if resume.text.is_empty() || !resume.tool_calls.is_empty() {
        return Err(status::invalid_request(
            "an upstream engine continues a moved text answer only",
        ));
    }
    body.messages.push(wire::Message {
        role: "assistant".into(),
        content: Value::String(resume.text.clone()),
        ..Default::default()
    });
    if how == Continuation::Flag {
        body.continue_final_message = Some(true);
        body.add_generation_prompt = Some(false);
    }
    Ok(())
}

/// The whole chat request. `model` is the engine's model id,
/// `completion_limit` the token budget (`None`: the engine's default).
pub fn build(
    kind: Kind,
    model: &str,
    req: &pb::GenerateRequest,
    completion_limit: Option<u32>,
    enforce_tools: bool,
) -> Result<Built, Status> {
    let enforced_tools = enforces_tools(req, enforce_tools);
    let sampling = req.sampling.clone().unwrap_or_default();
    let mut body = ChatRequest {
        model: model.to_owned(),
        messages: messages(kind, req, enforced_tools)?,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k.filter(|k| *k > 0 && kind.takes_top_k()),
        seed: sampling.seed,
        presence_penalty: sampling.presence_penalty,
        frequency_penalty: sampling.frequency_penalty,
        stop: sampling.stop,
        ..Default::default()
    };
    match kind.max_tokens_field() {
        MaxTokensField::MaxTokens => body.max_tokens = completion_limit,
        MaxTokensField::MaxCompletionTokens => body.max_completion_tokens = completion_limit,
    }
    if enforced_tools {
        let p = plan::plan(req, false)?;
        debug_assert_eq!(p.tools, ToolMode::Constrained);
        if let Some(Constraint::JsonSchema(mut schema)) = p.constraint {
            // The pipeline's llguidance options mean nothing to an engine.
            if let Value::Object(map) = &mut schema {
                map.remove("x-guidance");
            }
            body.response_format = Some(schema_format("tool_call", schema, true));
        }
    } else {
        body.tools = tools(req)?;
        if !body.tools.is_empty() {
            body.tool_choice = tool_choice(req.tool_choice.as_ref());
            body.parallel_tool_calls = Some(req.parallel_tool_calls);
        }
        body.response_format = response_format(req.response_format.as_ref())?;
    }
    if let Some(r) = &req.reasoning {
        match kind.reasoning() {
            ReasoningField::TemplateKwargs { budget } => {
                body.chat_template_kwargs = Some(json!({"enable_thinking": r.enabled}));
                if budget && r.enabled {
                    body.thinking_token_budget = Some(if r.budget_tokens > 0 {
                        r.budget_tokens
                    } else {
                        plan::effort_budget(&r.effort)
                    });
                }
            }
            ReasoningField::Effort if r.enabled && !r.effort.is_empty() => {
                // OpenAI has no `minimal` on every model; `low` is the floor.
                let effort = if r.effort == "minimal" {
                    "low"
                } else {
                    r.effort.as_str()
                };
                body.reasoning_effort = Some(effort.to_owned());
            }
            ReasoningField::Effort => {}
        }
    }
    if kind.aborts_by_request_id() && !req.request_id.is_empty() {
        body.rid = Some(req.request_id.clone());
    }
    if let Some(resume) = &req.resume {
        continue_text(kind, resume, &mut body)?;
    }
    Ok(Built {
        body,
        enforced_tools,
    })
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

    fn request() -> pb::GenerateRequest {
        pb::GenerateRequest {
            request_id: "req-1".into(),
            messages: vec![
                pb::Message {
                    role: "developer".into(),
                    ..user("be brief")
                },
                user("hi"),
            ],
            sampling: Some(pb::Sampling {
                temperature: Some(0.0),
                max_tokens: 7,
                stop: vec!["\n".into()],
                seed: Some(3),
                top_k: Some(40),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn tool_request(mode: pb::tool_choice::Mode) -> pb::GenerateRequest {
        pb::GenerateRequest {
            tools: vec![pb::FunctionTool {
                name: "get_weather".into(),
                description: "weather".into(),
                parameters_json: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#
                    .into(),
                strict: true,
            }],
            tool_choice: Some(pb::ToolChoice {
                mode: mode as i32,
                function_name: String::new(),
            }),
            ..request()
        }
    }

    fn json_of(b: &Built) -> Value {
        serde_json::to_value(&b.body).expect("serializes")
    }

    #[test]
    fn a_moved_text_answer_is_continued_as_the_final_assistant_message() {
        let mut req = request();
        req.resume = Some(pb::Resume {
            text: "Once upon".into(),
            completion_tokens: 2,
            ..Default::default()
        });
        let vllm = json_of(&build(Kind::Vllm, "m", &req, Some(5), false).expect("builds"));
        let last = &vllm["messages"][2];
        assert_eq!(
            (last["role"].as_str(), last["content"].as_str()),
            (Some("assistant"), Some("Once upon"))
        );
        assert_eq!(vllm["continue_final_message"], true);
        assert_eq!(vllm["add_generation_prompt"], false);
        let llama = json_of(&build(Kind::LlamaServer, "m", &req, Some(5), false).expect("builds"));
        assert_eq!(llama["messages"][2]["content"], "Once upon");
        assert!(
            llama.get("continue_final_message").is_none(),
            "a prefill by itself"
        );
        assert!(build(Kind::Openai, "m", &req, Some(5), false).is_err());
        req.resume = Some(pb::Resume {
            tool_calls: vec![pb::ToolCall::default()],
            ..Default::default()
        });
        assert!(
            build(Kind::Vllm, "m", &req, Some(5), false).is_err(),
            "a half-made tool call stays with the engine that made it"
        );
        assert!(Kind::Openai.continues_final_message().is_none());
    }

    #[test]
    fn sampling_and_messages_travel_as_chat_fields() {
        let b = build(Kind::Vllm, "m", &request(), Some(7), false).expect("build");
        let v = json_of(&b);
        assert_eq!(v["model"], "m");
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["max_tokens"], 7);
        assert!(v.get("max_completion_tokens").is_none());
        assert_eq!(v["temperature"], 0.0);
        assert_eq!(v["seed"], 3);
        assert_eq!(v["stop"][0], "\n");
        assert_eq!(v["top_k"], 40);
        assert_eq!(v["messages"][0]["role"], "system");
        assert_eq!(v["messages"][1]["content"], "hi");
        assert!(v.get("rid").is_none());
        assert!(v.get("guided_json").is_none());
    }

    #[test]
    fn openai_takes_max_completion_tokens_and_developer_stays() {
        let v = json_of(&build(Kind::Openai, "m", &request(), Some(7), false).expect("build"));
        assert_eq!(v["max_completion_tokens"], 7);
        assert!(v.get("max_tokens").is_none());
        assert!(v.get("top_k").is_none(), "not in OpenAI's API");
        assert_eq!(v["messages"][0]["role"], "developer");
    }

    #[test]
    fn sglang_gets_a_request_id_to_abort() {
        let v = json_of(&build(Kind::Sglang, "m", &request(), None, false).expect("build"));
        assert_eq!(v["rid"], "req-1");
        assert!(v.get("max_tokens").is_none());
    }

    #[test]
    fn native_tools_are_chat_fields() {
        let req = tool_request(pb::tool_choice::Mode::Required);
        let b = build(Kind::Vllm, "m", &req, None, false).expect("build");
        assert!(!b.enforced_tools);
        let v = json_of(&b);
        assert_eq!(v["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(v["tools"][0]["function"]["strict"], true);
        assert_eq!(v["tool_choice"], "required");
        assert_eq!(v["parallel_tool_calls"], false);
    }

    #[test]
    fn enforced_tools_become_a_schema_of_the_call() {
        let req = tool_request(pb::tool_choice::Mode::Required);
        let b = build(Kind::LlamaServer, "m", &req, Some(50), true).expect("build");
        assert!(b.enforced_tools);
        let v = json_of(&b);
        assert!(v.get("tools").is_none());
        let schema = &v["response_format"]["json_schema"]["schema"];
        assert_eq!(schema["properties"]["name"]["enum"][0], "get_weather");
        assert_eq!(
            schema["properties"]["arguments"]["additionalProperties"],
            false
        );
        assert!(schema.get("x-guidance").is_none());
        let system = v["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(system.contains("get_weather"), "{system}");
        // auto stays native even where required is enforced
        let auto = tool_request(pb::tool_choice::Mode::Auto);
        assert!(
            !build(Kind::LlamaServer, "m", &auto, None, true)
                .expect("build")
                .enforced_tools
        );
    }

    #[test]
    fn response_formats_and_reasoning() {
        let mut req = request();
        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonSchema as i32,
            schema_name: "person".into(),
            schema_json: r#"{"type":"object","properties":{"a":{"type":"string"}}}"#.into(),
            strict: false,
        });
        req.reasoning = Some(pb::Reasoning {
            enabled: true,
            budget_tokens: 0,
            effort: "low".into(),
        });
        let v = json_of(&build(Kind::Vllm, "m", &req, None, false).expect("build"));
        assert_eq!(v["response_format"]["type"], "json_schema");
        assert_eq!(v["response_format"]["json_schema"]["name"], "person");
        assert_eq!(v["chat_template_kwargs"]["enable_thinking"], true);
        assert_eq!(v["thinking_token_budget"], 256);
        let v = json_of(&build(Kind::LlamaServer, "m", &req, None, false).expect("build"));
        assert!(v.get("thinking_token_budget").is_none());
        let v = json_of(&build(Kind::Openai, "m", &req, None, false).expect("build"));
        assert_eq!(v["reasoning_effort"], "low");
        assert!(v.get("chat_template_kwargs").is_none());

        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonSchema as i32,
            schema_json: "{not json".into(),
            ..Default::default()
        });
        let err = build(Kind::Vllm, "m", &req, None, false).expect_err("bad schema");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn images_travel_as_content_parts() {
        let mut m = user("look");
        m.content.push(pb::ContentPart {
            part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                url: "data:image/png;base64,AAAA".into(),
                detail: "low".into(),
            })),
        });
        let req = pb::GenerateRequest {
            messages: vec![m],
            ..Default::default()
        };
        let v = json_of(&build(Kind::Vllm, "m", &req, None, false).expect("build"));
        assert_eq!(v["messages"][0]["content"][1]["type"], "image_url");
        assert_eq!(v["messages"][0]["content"][0]["text"], "look");
    }
}
