//! A chat request -> what a planner run starts from: the conversation as
//! text turns (tool calls and results rendered as text, tool results
//! quoted as data), the trailing tool messages that resume a paused plan,
//! the caller's function tools, and what `tool_choice` asks of the plan.

use crate::api::chat::{ChatCompletionRequest, ChatMessage, ContentPart, MessageContent};
use planner::run::plan::{ToolDemand, ToolTarget};
use planner::text::quote;
use planner::{RunInput, ToolResult, Turn};
use serde_json::Value;

/// A new run's input. `max_tokens`: the answer's output cap (0: the
/// model's window).
pub fn run_input(req: &ChatCompletionRequest, max_tokens: u32) -> RunInput {
    let (conversation, last_user) = conversation(req.messages.as_deref().unwrap_or_default());
    let tools_offered = !matches!(&req.tool_choice, Some(Value::String(c)) if c == "none");
    RunInput {
        conversation,
        last_user,
        tools: if tools_offered {
            tools(req)
        } else {
            Vec::new()
        },
        agents: req.agents.clone().unwrap_or_default(),
        demand: demand(req.tool_choice.as_ref()),
        max_tokens,
    }
}

/// The request's trailing `tool` messages, in order: the results a paused
/// plan waits for (none: the request starts a new plan).
pub fn tool_results(messages: &[ChatMessage]) -> Vec<ToolResult> {
    let first = messages
        .iter()
        .rposition(|m| m.role.as_deref() != Some("tool"))
        .map_or(0, |last_other| last_other + 1);
    messages
        .iter()
        .enumerate()
        .skip(first)
        .map(|(index, m)| ToolResult {
            index,
            call_id: m.tool_call_id.clone().unwrap_or_default(),
            text: content_text(m.content.as_ref()),
        })
        .collect()
}

/// The conversation of a chat request (tool calls and results as text),
/// and its last user message's text.
fn conversation(messages: &[ChatMessage]) -> (Vec<Turn>, String) {
    let mut turns = Vec::new();
    let mut last_user = String::new();
    for m in messages {
        let role = m.role.as_deref().unwrap_or("user");
        let mut text = content_text(m.content.as_ref());
        for c in m.tool_calls.iter().flatten() {
            text.push_str(&format!(
                "\n[called {}({})]",
                c.function.name, c.function.arguments
            ));
        }
        let (role, text) = match role {
            "system" | "developer" => ("system", text),
            "assistant" => ("assistant", text),
            "tool" => (
                "user",
                format!(
                    "Tool result ({}):\n{}",
                    m.tool_call_id.as_deref().unwrap_or(""),
                    quote("tool", &text)
                ),
            ),
            _ => {
                last_user = text.clone();
                ("user", text)
            }
        };
        turns.push(Turn::new(role, text));
    }
    (turns, last_user)
}

/// The text of a message's content.
fn content_text(content: Option<&MessageContent>) -> String {
    match content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            let texts: Vec<String> = parts
                .iter()
                .filter_map(|p| match p {
                    ContentPart::Text { text } => Some(text.clone()),
                    ContentPart::Refusal { refusal } => Some(refusal.clone()),
                    _ => None,
                })
                .collect();
            texts.join("\n")
        }
    }
}

/// The caller's function tools, as plan targets.
fn tools(req: &ChatCompletionRequest) -> Vec<ToolTarget> {
    req.tools
        .iter()
        .flatten()
        .filter_map(|t| t.function.as_ref())
        .map(|f| ToolTarget {
            name: f.name.clone().unwrap_or_default(),
            description: f.description.clone().unwrap_or_default(),
            parameters: f
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object"})),
        })
        .collect()
}

/// What `tool_choice` asks of the plan (validation has checked it: a
/// named function is among `tools`; `none` leaves the tools out).
fn demand(choice: Option<&Value>) -> ToolDemand {
    match choice {
        Some(Value::String(c)) if c == "required" => ToolDemand::Required,
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map_or(ToolDemand::Auto, |n| ToolDemand::Named(n.to_owned())),
        _ => ToolDemand::Auto,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conversation_turns_render_tools_as_text() {
        let messages: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "21C"}
        ]))
        .unwrap();
        let (turns, last) = conversation(&messages);
        assert_eq!(last, "weather?");
        assert_eq!(turns[2].text, "\n[called f({})]");
        assert_eq!(turns[3].role, "user");
        assert!(turns[3].text.contains("21C"));
        let results = tool_results(&messages);
        assert_eq!(
            results,
            vec![ToolResult {
                index: 3,
                call_id: "c1".into(),
                text: "21C".into()
            }]
        );
        assert!(tool_results(&messages[..3]).is_empty());
    }
}
