//! What a new run starts from: the caller's conversation as text turns
//! (tool calls and results rendered as text, tool results quoted), its
//! tools, its agents and what `tool_choice` asks.

use super::plan::{ToolDemand, ToolTarget};
use super::text::quote;
use crate::api::chat::{ChatMessage, ContentPart, MessageContent};
use serde::{Deserialize, Serialize};

/// One message of a conversation, as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub role: String,
    pub text: String,
}

impl Turn {
    pub fn new(role: &str, text: impl Into<String>) -> Self {
        Self {
            role: role.to_owned(),
            text: text.into(),
        }
    }
}

/// What a new run starts from.
#[derive(Debug, Clone)]
pub struct RunInput {
    pub conversation: Vec<Turn>,
    /// The last user message's text.
    pub last_user: String,
    pub tools: Vec<ToolTarget>,
    /// The request's `agents`.
    pub agents: Vec<String>,
    /// What the request's `tool_choice` asks of the first plan.
    pub demand: ToolDemand,
    /// The answer's output cap (0: the model's window).
    pub max_tokens: u32,
}

impl RunInput {
    /// The conversation of a chat request (tool calls and results as text).
    pub fn from_messages(messages: &[ChatMessage]) -> (Vec<Turn>, String) {
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
}

/// The text of a message's content.
pub fn content_text(content: Option<&MessageContent>) -> String {
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
        let (turns, last) = RunInput::from_messages(&messages);
        assert_eq!(last, "weather?");
        assert_eq!(turns[2].text, "\n[called f({})]");
        assert_eq!(turns[3].role, "user");
        assert!(turns[3].text.contains("21C"));
    }
}
