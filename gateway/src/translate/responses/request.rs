//! The request side: a checked create body and its conversation (the
//! stored chain plus this request's input) into a `GenerateRequest`.

use crate::api::responses::{
    ContentPart, CreateResponseRequest, InputItem, ItemContent, OutputItem,
};
use crate::output_check::OutputFormat;
use crate::translate::chat::tool_choice;
use crate::validate::responses::ValidResponseRequest;
use inference_proto::v1 as pb;
use serde_json::Value;

/// Builds the worker request. `conversation` is the full input: the stored
/// chain's items (inputs and outputs) followed by this request's items, with
/// item references already resolved.
pub fn to_worker(
    req: &CreateResponseRequest,
    valid: &ValidResponseRequest,
    conversation: &[InputItem],
    request_id: &str,
) -> pb::GenerateRequest {
    let mut messages: Vec<pb::Message> = Vec::with_capacity(conversation.len() + 1);
    if let Some(i) = &req.instructions {
        messages.push(message("system", vec![text_part(i.clone())]));
    }
    // Reasoning of an earlier turn rides on the assistant message after it.
    let mut pending_reasoning = String::new();
    for item in conversation {
        match item.kind.as_deref().unwrap_or("message") {
            "message" => {
                let role = item.role.as_deref().unwrap_or("user");
                let mut m = message(role, content_parts(item.content.as_ref()));
                if role == "assistant" {
                    m.reasoning = std::mem::take(&mut pending_reasoning);
                }
                messages.push(m);
            }
            "function_call" => {
                let call = pb::ToolCall {
                    id: item.call_id.clone().unwrap_or_default(),
                    name: item.name.clone().unwrap_or_default(),
                    arguments: item.arguments.clone().unwrap_or_default(),
                };
                // Consecutive calls belong to one assistant turn.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" && !last.tool_calls.is_empty() => {
                        last.tool_calls.push(call)
                    }
                    _ => {
                        let mut m = message("assistant", Vec::new());
                        m.tool_calls.push(call);
                        m.reasoning = std::mem::take(&mut pending_reasoning);
                        messages.push(m);
                    }
                }
            }
            "function_call_output" => {
                let output = match &item.output {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                let mut m = message("tool", vec![text_part(output)]);
                m.tool_call_id = item.call_id.clone().unwrap_or_default();
                messages.push(m);
            }
            "reasoning" => {
                for s in item.summary.as_deref().unwrap_or_default() {
                    pending_reasoning.push_str(&s.text);
                }
            }
            // Validation let only a summary this gateway sealed through.
            "compaction" => {
                if let Some(summary) = item
                    .encrypted_content
                    .as_deref()
                    .and_then(crate::api::compaction::open)
                {
                    let text = crate::translate::compaction::as_message_text(&summary);
                    messages.push(message("user", vec![text_part(text)]));
                }
            }
            _ => {}
        }
    }
    pb::GenerateRequest {
        request_id: request_id.to_owned(),
        model: valid.model.id.to_owned(),
        messages,
        tools: valid
            .tools
            .iter()
            .map(|t| pb::FunctionTool {
                name: t.name.clone(),
                description: t.description.clone().unwrap_or_default(),
                parameters_json: t
                    .parameters
                    .as_ref()
                    .map(Value::to_string)
                    .unwrap_or_default(),
                strict: t.strict,
            })
            .collect(),
        tool_choice: Some(tool_choice(req.tool_choice.as_ref())),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        sampling: Some(pb::Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            max_tokens: valid.max_output_tokens,
            stop: Vec::new(),
            seed: req.seed.map(|s| s as u64),
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            // The worker's model default; no public field sets it.
            repeat_penalty: None,
            top_k: None,
        }),
        response_format: match &valid.format {
            OutputFormat::Text => None,
            OutputFormat::JsonObject => Some(pb::ResponseFormat {
                kind: pb::response_format::Kind::JsonObject as i32,
                ..Default::default()
            }),
            OutputFormat::JsonSchema(schema) => Some(pb::ResponseFormat {
                kind: pb::response_format::Kind::JsonSchema as i32,
                schema_name: valid.text["format"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                schema_json: schema.to_string(),
                strict: valid.text["format"]["strict"].as_bool().unwrap_or(false),
            }),
        },
        reasoning: Some(pb::Reasoning {
            enabled: valid.reasoning,
            budget_tokens: valid.reasoning_budget,
            effort: valid
                .effort
                .clone()
                .filter(|e| e != "none")
                .unwrap_or_default(),
        }),
        cache_key: req.prompt_cache_key.clone().unwrap_or_default(),
        // Token-sized events only where a client sees them: a stream now,
        // or a background run's event log (replayable later).
        batch_events: !valid.stream && !valid.background,
        resume: None,
        // The generation driver sets the tier it serves the request at.
        service_tier: 0,
    }
}

fn message(role: &str, content: Vec<pb::ContentPart>) -> pb::Message {
    pb::Message {
        role: role.to_owned(),
        content,
        ..Default::default()
    }
}

fn text_part(text: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text)),
    }
}

fn content_parts(content: Option<&ItemContent>) -> Vec<pb::ContentPart> {
    match content {
        None => Vec::new(),
        Some(ItemContent::Text(t)) => vec![text_part(t.clone())],
        Some(ItemContent::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                    Some(text_part(text.clone()))
                }
                ContentPart::Refusal { refusal } => Some(text_part(refusal.clone())),
                // Validation refuses image, file and audio parts.
                _ => None,
            })
            .collect(),
    }
}

/// An output item turned back into an input item, for chaining.
pub fn output_as_input(item: &OutputItem) -> InputItem {
    match item {
        OutputItem::Message {
            id, role, content, ..
        } => InputItem {
            kind: Some("message".into()),
            id: Some(id.clone()),
            role: Some(role.clone()),
            content: Some(ItemContent::Parts(
                content
                    .iter()
                    .map(|c| ContentPart::OutputText {
                        text: c.text.clone(),
                        annotations: Vec::new(),
                    })
                    .collect(),
            )),
            status: Some("completed".into()),
            ..Default::default()
        },
        OutputItem::FunctionCall {
            id,
            call_id,
            name,
            arguments,
            status,
        } => InputItem {
            kind: Some("function_call".into()),
            id: Some(id.clone()),
            call_id: Some(call_id.clone()),
            name: Some(name.clone()),
            arguments: Some(arguments.clone()),
            status: Some(status.clone()),
            ..Default::default()
        },
        OutputItem::Reasoning { id, summary, .. } => InputItem {
            kind: Some("reasoning".into()),
            id: Some(id.clone()),
            summary: Some(summary.clone()),
            ..Default::default()
        },
    }
}
