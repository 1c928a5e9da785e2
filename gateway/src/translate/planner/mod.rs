//! Planner mode's translations: a chat request -> a run's input
//! (`input`), a run's events and ending -> the chat wire format
//! (`reply`), and here planner model calls -> worker protocol. The planner's calls (plan,
//! repair, re-plan, tool arguments, `llm` steps, synthesis) are
//! generations of the request's model with text messages, no tools
//! (`tool_choice` "none", as chat translates it), and, for plans and
//! arguments, a JSON Schema the reply must follow, sampled greedily.

mod input;
pub mod reply;

pub use input::{run_input, tool_results};

use super::chat::tool_choice;
use inference_proto::v1 as pb;
use serde_json::Value;

/// One planner model call, as the worker request needs it.
pub struct PlannerCall<'a> {
    pub request_id: &'a str,
    pub model: &'a str,
    /// `(role, text)` of each message, in order.
    pub messages: Vec<(&'a str, &'a str)>,
    /// A JSON Schema the reply must follow.
    pub schema: Option<&'a Value>,
    /// 0 = up to the window.
    pub max_tokens: u32,
    /// The planner's session: its calls share a prompt cache key, so
    /// they stick to one worker.
    pub session_id: &'a str,
    /// The reply streams to a client (token-sized events).
    pub streamed: bool,
}

/// The name a planner call's schema goes by.
const SCHEMA_NAME: &str = "plan";

/// Builds the worker request of a planner model call.
pub fn to_worker(call: &PlannerCall<'_>) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: call.request_id.to_owned(),
        model: call.model.to_owned(),
        messages: call
            .messages
            .iter()
            .map(|(role, text)| text_message(role, text))
            .collect(),
        tools: Vec::new(),
        tool_choice: Some(tool_choice(Some(&Value::from("none")))),
        parallel_tool_calls: false,
        sampling: Some(pb::Sampling {
            // Greedy under a schema: the plan is data, not prose.
            temperature: call.schema.map(|_| 0.0),
            max_tokens: call.max_tokens,
            ..Default::default()
        }),
        response_format: call.schema.map(|s| pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonSchema as i32,
            schema_name: SCHEMA_NAME.into(),
            schema_json: s.to_string(),
            // Not strict: plan schemas have optional fields, which an
            // upstream engine's strict mode refuses.
            strict: false,
        }),
        reasoning: Some(pb::Reasoning {
            enabled: false,
            budget_tokens: 0,
            effort: String::new(),
        }),
        cache_key: format!("session:{}", call.session_id),
        batch_events: !call.streamed,
        resume: None,
        // The generation driver sets the tier it serves the request at.
        service_tier: 0,
    }
}

fn text_message(role: &str, text: &str) -> pb::Message {
    pb::Message {
        role: role.to_owned(),
        content: vec![pb::ContentPart {
            part: Some(pb::content_part::Part::Text(text.to_owned())),
        }],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_call_is_greedy_json_without_tools() {
        let schema = json!({"type": "object"});
        let call = PlannerCall {
            request_id: "r-m0",
            model: "base-mini",
            messages: vec![("system", "plan"), ("user", "hi")],
            schema: Some(&schema),
            max_tokens: 64,
            session_id: "s1",
            streamed: false,
        };
        let req = to_worker(&call);
        assert_eq!(req.messages.len(), 2);
        assert_eq!(req.messages[1].role, "user");
        assert_eq!(
            req.tool_choice.map(|c| c.mode),
            Some(pb::tool_choice::Mode::None as i32)
        );
        assert!(req.tools.is_empty() && !req.parallel_tool_calls);
        let sampling = req.sampling.unwrap_or_default();
        assert_eq!((sampling.temperature, sampling.max_tokens), (Some(0.0), 64));
        let format = req.response_format.unwrap_or_default();
        assert_eq!(format.schema_json, schema.to_string());
        assert!(!format.strict);
        assert_eq!(req.cache_key, "session:s1");
        assert!(req.batch_events);
    }

    #[test]
    fn a_streamed_prose_call_has_no_format_and_default_sampling() {
        let call = PlannerCall {
            request_id: "r-m1",
            model: "base-mini",
            messages: vec![("user", "answer")],
            schema: None,
            max_tokens: 0,
            session_id: "s1",
            streamed: true,
        };
        let req = to_worker(&call);
        assert!(req.response_format.is_none());
        assert_eq!(req.sampling.unwrap_or_default().temperature, None);
        assert!(!req.batch_events);
    }
}
