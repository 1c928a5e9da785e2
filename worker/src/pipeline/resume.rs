//! A generation moved here from a worker that failed after its client had
//! received part of the reply (`GenerateRequest.resume`): what was
//! delivered, and the model's raw output it stands for, so the engine
//! continues that output instead of starting a new reply.
//!
//! The raw output of a text answer is its text. A tool call's is the JSON
//! the calls were parsed from, written again the way the pipeline asks the
//! model to write it (compact, `": "` and `", "` separators, `name` before
//! `arguments`: the order of the call constraint's properties, and of the
//! listing's example for a call the model chose itself). An array when the
//! constraint asks for one (parallel calls) or the model wrote several.
//! Only what the parser delivered is in it, so the tail the failed worker
//! held back is generated again.

use super::request::ToolMode;
use super::tool_calls::ToolCallParser;
use inference_proto::v1 as pb;

/// What the client already received of the generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    pub reasoning: String,
    pub text: String,
    pub tool_calls: Vec<pb::ToolCall>,
    pub completion_tokens: u32,
    pub reasoning_tokens: u32,
}

impl Resume {
    pub fn from_proto(resume: pb::Resume) -> Self {
        Self {
            reasoning: resume.reasoning,
            text: resume.text,
            tool_calls: resume.tool_calls,
            completion_tokens: resume.completion_tokens,
            reasoning_tokens: resume.reasoning_tokens,
        }
    }

    /// Whether the answer had begun (after a think section, if any).
    pub fn in_answer(&self) -> bool {
        !self.text.is_empty() || !self.tool_calls.is_empty()
    }

    /// The model's output of the answer so far, as its next token follows it.
    pub fn answer_output(&self, tools: ToolMode, parallel: bool) -> String {
        if self.tool_calls.is_empty() {
            return self.text.clone();
        }
        let constrained = tools == ToolMode::Constrained;
        let array = if constrained {
            parallel
        } else {
            self.tool_calls.len() > 1
        };
        let last = self.tool_calls.len() - 1;
        let mut out = String::from(if array { "[" } else { "" });
        for (i, call) in self.tool_calls.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let name = serde_json::Value::String(call.name.clone()).to_string();
            out.push_str(&format!(
                "{{\"name\": {name}, \"arguments\": {}",
                call.arguments
            ));
            if i < last {
                out.push('}');
            }
        }
        out
    }

    /// A tool-call parser in the state after the delivered calls: their
    /// deltas are not sent again, and the next call gets the next index.
    pub fn parser(&self, id_seed: &str, tools: ToolMode, parallel: bool) -> ToolCallParser {
        let mut parser = ToolCallParser::new(id_seed);
        if !self.tool_calls.is_empty() {
            let _already_delivered = parser.push(&self.answer_output(tools, parallel));
        }
        parser
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: &str) -> pb::ToolCall {
        pb::ToolCall {
            id: String::new(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn text_continues_as_itself() {
        let r = Resume {
            text: "Hello, wor".into(),
            ..Resume::default()
        };
        assert!(r.in_answer());
        assert_eq!(r.answer_output(ToolMode::Off, false), "Hello, wor");
    }

    #[test]
    fn a_half_streamed_call_continues_its_arguments_and_keeps_its_index() {
        let r = Resume {
            tool_calls: vec![
                call("get_weather", r#"{"city": "Paris"}"#),
                call("get_time", r#"{"zone": "Eu"#),
            ],
            ..Resume::default()
        };
        let out = r.answer_output(ToolMode::Auto, true);
        assert_eq!(
            out,
            r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {"zone": "Eu"#
        );
        let mut parser = r.parser("req", ToolMode::Auto, true);
        let next = parser.push(r#"rope/Paris"}}]"#);
        assert!(!next.is_empty());
        assert!(
            next.iter().all(|d| d.index == 1 && d.id.is_empty()),
            "the second call goes on, its header not sent again: {next:?}"
        );
        let args: String = next.iter().map(|d| d.arguments_fragment.as_str()).collect();
        assert_eq!(args, r#"rope/Paris"}"#);
    }

    #[test]
    fn a_constrained_call_cut_mid_arguments_continues_them() {
        let r = Resume {
            tool_calls: vec![call(
                "plan_trip",
                r#"{"city": "Oslo", "stops": ["harbour", "ope"#,
            )],
            ..Resume::default()
        };
        assert_eq!(
            r.answer_output(ToolMode::Constrained, false),
            r#"{"name": "plan_trip", "arguments": {"city": "Oslo", "stops": ["harbour", "ope"#
        );
        assert_eq!(
            r.answer_output(ToolMode::Constrained, true),
            r#"[{"name": "plan_trip", "arguments": {"city": "Oslo", "stops": ["harbour", "ope"#,
            "parallel calls: the constraint's array"
        );
        let mut parser = r.parser("req", ToolMode::Constrained, false);
        let next = parser.push(r#"ra house"]}}"#);
        assert!(
            next.iter().all(|d| d.index == 0 && d.id.is_empty()),
            "{next:?}"
        );
        let args: String = next.iter().map(|d| d.arguments_fragment.as_str()).collect();
        assert_eq!(args, r#"ra house"]}"#);
        assert_eq!(parser.calls(), 1);
    }
}
