//! The conversation the simulator reads from a prompt: the text of
//! [`super::tokenizer::decode`] split back into messages (as the template
//! wrote them), the tools the pipeline listed in the system message
//! (`pipeline::request`'s listing), and where in its turn the reply starts
//! (opening a think section, after one, or plain).

use super::tokenizer::{END, SEP, START};
use crate::pipeline::request::{CALL_NOW, CALL_SEVERAL, TOOLS_HEADER, TOOL_PARAMETERS};
use crate::pipeline::{THINK_CLOSE, THINK_OPEN};
use crate::seam::sequence::IMAGE_PLACEHOLDER;
use serde_json::Value;

/// One message as the simulator reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    pub role: String,
    /// The call a tool result answers.
    pub tool_call_id: String,
    /// The text, images as [`IMAGE_PLACEHOLDER`], without the tool calls.
    pub text: String,
    /// Tool calls of an assistant turn: (name, arguments JSON).
    pub calls: Vec<(String, String)>,
}

impl Message {
    /// The text without its images.
    pub fn plain_text(&self) -> String {
        self.text.replace(IMAGE_PLACEHOLDER, "")
    }
}

/// A tool listed in the prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its parameters' JSON Schema, when it has a readable one.
    pub parameters: Option<Value>,
}

/// Where the reply starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A plain reply.
    Answer,
    /// The prompt opens a think section: the reply is reasoning.
    Think,
    /// The think section is closed: the answer after reasoning.
    AfterThink,
}

/// What the simulator knows of a request, from its prompt alone.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    /// The listing says a call is due now (`required` or a named choice,
    /// under a constraint).
    pub call_now: bool,
    /// The listing allows several calls in one reply.
    pub parallel: bool,
    pub phase: Phase,
}

impl Conversation {
    /// Reads a rendered prompt.
    pub fn parse(text: &str) -> Self {
        let mut messages = Vec::new();
        let mut rest = text;
        let mut tail = "";
        while let Some(at) = rest.find(START) {
            let after = &rest[at + START.len()..];
            let Some(sep) = after.find(SEP) else { break };
            let header = &after[..sep];
            let body = &after[sep + SEP.len()..];
            match body.find(END) {
                Some(end) => {
                    messages.push(message(header, &body[..end]));
                    rest = &body[end + END.len()..];
                }
                None => {
                    tail = body;
                    break;
                }
            }
        }
        let phase = match tail.strip_prefix(THINK_OPEN) {
            Some(t) if t.contains(THINK_CLOSE) => Phase::AfterThink,
            Some(_) => Phase::Think,
            None => Phase::Answer,
        };
        let mut conv = Conversation {
            messages,
            tools: Vec::new(),
            call_now: false,
            parallel: false,
            phase,
        };
        conv.read_listing();
        conv
    }

    /// Takes the pipeline's tool listing out of the first system message
    /// (dropping the message when the listing was all of it).
    fn read_listing(&mut self) {
        let Some(first) = self.messages.first_mut().filter(|m| m.role == "system") else {
            return;
        };
        let Some(at) = first.text.find(TOOLS_HEADER) else {
            return;
        };
        let listing = first.text[at + TOOLS_HEADER.len()..].to_owned();
        first.text.truncate(at);
        let own = first.text.trim_end().len();
        first.text.truncate(own);
        if first.text.is_empty() {
            self.messages.remove(0);
        }
        let mut rest = listing.as_str();
        while let Some(entry) = rest.strip_prefix("- ") {
            let Some(colon) = entry.find(": ") else { break };
            let name = entry[..colon].to_owned();
            let Some(params_at) = entry.find(TOOL_PARAMETERS) else {
                break;
            };
            let params = &entry[params_at + TOOL_PARAMETERS.len()..];
            let mut values = serde_json::Deserializer::from_str(params).into_iter::<Value>();
            let parameters = values.next().and_then(Result::ok);
            let used = values.byte_offset();
            self.tools.push(Tool { name, parameters });
            let after = &params[used..];
            rest = match after.find('\n') {
                Some(nl) => &after[nl + 1..],
                None => "",
            };
        }
        self.call_now = rest.starts_with(CALL_NOW);
        self.parallel = rest.contains(CALL_SEVERAL.trim());
    }

    /// The text of the last `user` message, without images.
    pub fn last_user_text(&self) -> String {
        self.messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map(Message::plain_text)
            .unwrap_or_default()
    }
}

/// A message from its role line and content.
fn message(header: &str, content: &str) -> Message {
    let (role, tool_call_id) = match header.split_once(" (") {
        Some((role, id)) => (role, id.strip_suffix(')').unwrap_or(id)),
        None => (header, ""),
    };
    let mut m = Message {
        role: role.to_owned(),
        tool_call_id: tool_call_id.to_owned(),
        ..Message::default()
    };
    if role != "assistant" {
        m.text = content.to_owned();
        return m;
    }
    // The pipeline writes an assistant's calls as JSON lines after its text.
    let mut text: Vec<&str> = Vec::new();
    for line in content.split('\n') {
        match call(line) {
            Some(c) => m.calls.push(c),
            None => text.push(line),
        }
    }
    m.text = text.join("\n");
    m
}

/// `{"name": ..., "arguments": ...}` as (name, arguments JSON).
fn call(line: &str) -> Option<(String, String)> {
    if !line.starts_with('{') {
        return None;
    }
    let v: Value = serde_json::from_str(line).ok()?;
    let obj = v.as_object().filter(|o| o.len() == 2)?;
    let name = obj.get("name")?.as_str()?.to_owned();
    let args = match obj.get("arguments")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some((name, args))
}

#[cfg(test)]
mod tests {
    use super::super::tokenizer::render;
    use super::*;
    use crate::pipeline::request::plan;
    use inference_proto::v1 as pb;

    fn msg(role: &str, text: &str) -> pb::Message {
        pb::Message {
            role: role.into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }
    }

    /// The prompt the pipeline would have the simulator render.
    fn conversation(req: &pb::GenerateRequest) -> Conversation {
        let p = plan(req, true).expect("plan");
        Conversation::parse(&render(&p.messages))
    }

    fn tool(name: &str) -> pb::FunctionTool {
        pb::FunctionTool {
            name: name.into(),
            description: "does: things\n  on two lines".into(),
            parameters_json: r#"{"type": "object",
                "properties": {"x": {"type": "integer"}}}"#
                .into(),
            strict: false,
        }
    }

    #[test]
    fn messages_calls_and_results_read_back() {
        let mut call = msg("assistant", "let me look");
        call.tool_calls.push(pb::ToolCall {
            id: "call_1".into(),
            name: "get_time".into(),
            arguments: r#"{"tz":"UTC"}"#.into(),
        });
        let mut result = msg("tool", "12:00");
        result.tool_call_id = "call_1".into();
        let req = pb::GenerateRequest {
            messages: vec![msg("system", "be brief"), msg("user", "hi"), call, result],
            ..Default::default()
        };
        let c = conversation(&req);
        assert_eq!(c.phase, Phase::Answer);
        assert!(c.tools.is_empty());
        let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(c.messages[2].text, "let me look");
        assert_eq!(
            c.messages[2].calls,
            [("get_time".to_owned(), r#"{"tz":"UTC"}"#.to_owned())]
        );
        assert_eq!(c.messages[3].tool_call_id, "call_1");
        assert_eq!(c.last_user_text(), "hi");
    }

    #[test]
    fn the_tool_listing_gives_the_tools_and_how_to_call() {
        let mut req = pb::GenerateRequest {
            messages: vec![msg("system", "be brief"), msg("user", "hi")],
            tools: vec![tool("a"), tool("b")],
            parallel_tool_calls: true,
            ..Default::default()
        };
        let c = conversation(&req);
        let names: Vec<&str> = c.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            c.tools[1]
                .parameters
                .as_ref()
                .map(|p| p["properties"]["x"]["type"].clone()),
            Some(Value::from("integer"))
        );
        assert!(c.parallel && !c.call_now);
        assert_eq!(c.messages[0].text, "be brief", "the listing is taken out");

        req.messages.remove(0);
        req.parallel_tool_calls = false;
        req.tool_choice = Some(pb::ToolChoice {
            mode: pb::tool_choice::Mode::Required as i32,
            function_name: String::new(),
        });
        let c = conversation(&req);
        assert!(c.call_now && !c.parallel);
        assert_eq!(c.messages.len(), 1, "the listing's own system message goes");
    }

    #[test]
    fn the_think_section_sets_the_phase() {
        let text = render(&[]);
        assert_eq!(
            Conversation::parse(&format!("{text}{THINK_OPEN}")).phase,
            Phase::Think
        );
        assert_eq!(
            Conversation::parse(&format!("{text}{THINK_OPEN}hmm\n{THINK_CLOSE}\n\n")).phase,
            Phase::AfterThink
        );
    }
}
