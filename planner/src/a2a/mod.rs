//! A client of the Agent2Agent protocol (A2A), JSON-RPC binding: v1.0
//! (`SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, header
//! `A2A-Version: 1.0`, card at `/.well-known/agent-card.json`), falling
//! back to v0.3 (`message/send`, `message/stream`, `tasks/get`,
//! `tasks/cancel`, lower-case states, `kind`-tagged parts, card also at
//! `/.well-known/agent.json`) when the card says so.
//!
//! Wire shapes (`wire`) are parsed leniently, since both versions share
//! most field names, and turned into the planner's own types: an
//! [`AgentCard`] (`card`), and an [`AgentAnswer`] or an [`AgentFailure`]
//! per call (`rpc` sends, `task` folds what comes back). Agent output is
//! data: nothing here interprets it beyond its A2A shape.

mod card;
mod rpc;
mod task;
mod wire;

pub use card::{card_urls, fetch_card, parse_card, AgentCard, CardError, InvalidCard, Skill};
pub use rpc::{cancel_task, send, CancelOnDrop, Endpoint, Request};
pub use task::{looks_like_refusal, TaskSlot, TaskState};

use crate::net::NetError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version an agent speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "1.0")]
    V1,
    #[serde(rename = "0.3")]
    V03,
}

/// A part of an agent's output, normalised across versions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text {
        text: String,
    },
    Data {
        data: Value,
        #[serde(skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
    File {
        #[serde(skip_serializing_if = "Option::is_none")]
        url: Option<String>,
        /// Base64 content (dropped above 64 KiB).
        #[serde(skip_serializing_if = "Option::is_none")]
        raw: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        filename: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        media_type: Option<String>,
    },
}

/// A finished agent call: its text and structured parts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentAnswer {
    pub parts: Vec<Part>,
    pub context_id: Option<String>,
    pub task_id: Option<String>,
}

impl AgentAnswer {
    /// The text parts, joined.
    pub fn text(&self) -> String {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        texts.join("\n")
    }
}

/// Why an agent call gave no usable answer.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentFailure {
    /// `TASK_STATE_REJECTED`: an explicit refusal.
    Rejected(String),
    Failed(String),
    Canceled,
    AuthRequired(String),
    InputRequired(String),
    /// Completed, but the answer is a refusal in plain text.
    RefusedText(String),
    /// A JSON-RPC error object.
    RpcError(i64, String),
    /// A non-2xx HTTP status.
    Http(u16),
    /// The reply is not A2A.
    Malformed(String),
    /// Connected, but nothing (or nothing more) came in time.
    Silent(String),
    /// The step's total deadline passed.
    Timeout,
    /// Connecting or reading failed; `reason` is a bounded label, the
    /// detail is for the logs only.
    Unreachable {
        reason: &'static str,
        detail: String,
    },
    Denied(String),
    TooLarge(usize),
}

impl AgentFailure {
    /// The outcome label of `tool_thought` and the metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            AgentFailure::Rejected(_) => "rejected",
            AgentFailure::Failed(_) => "failed",
            AgentFailure::Canceled => "canceled",
            AgentFailure::AuthRequired(_) => "auth_required",
            AgentFailure::InputRequired(_) => "input_required",
            AgentFailure::RefusedText(_) => "refused",
            AgentFailure::RpcError(..) => "error",
            AgentFailure::Http(_) => "http_error",
            AgentFailure::Malformed(_) => "malformed",
            AgentFailure::Silent(_) => "silent",
            AgentFailure::Timeout => "timeout",
            AgentFailure::Unreachable { .. } => "unreachable",
            AgentFailure::Denied(_) => "denied",
            AgentFailure::TooLarge(_) => "too_large",
        }
    }

    /// One line saying what happened (agent text cut short).
    pub fn detail(&self) -> String {
        let cut = |s: &str| crate::text::clip(s, 200);
        match self {
            AgentFailure::Rejected(m) => format!("the agent rejected the task: {}", cut(m)),
            AgentFailure::Failed(m) => format!("the task failed: {}", cut(m)),
            AgentFailure::Canceled => "the task was canceled by the agent".into(),
            AgentFailure::AuthRequired(m) => {
                format!("the agent requires authorization: {}", cut(m))
            }
            AgentFailure::InputRequired(m) => format!("the agent asked for input: {}", cut(m)),
            AgentFailure::RefusedText(m) => format!("the agent refused: {}", cut(m)),
            AgentFailure::RpcError(c, m) => format!("JSON-RPC error {c}: {}", cut(m)),
            AgentFailure::Http(s) => format!("the agent answered HTTP {s}"),
            AgentFailure::Malformed(m) => format!("not an A2A reply: {}", cut(m)),
            AgentFailure::Silent(m) => format!("the agent went silent: {m}"),
            AgentFailure::Timeout => "the step's deadline passed".into(),
            // Never the network's detail: it would let a tenant probe
            // ports (refused vs timed out vs TLS); see `log_detail`.
            AgentFailure::Unreachable { .. } => "agent unreachable".into(),
            AgentFailure::Denied(m) => format!("not allowed: {}", cut(m)),
            AgentFailure::TooLarge(n) => format!("the reply exceeds {n} bytes"),
        }
    }
}

impl AgentFailure {
    /// A bounded reason for the metrics: the network's reason of an
    /// unreachable agent, "policy" for a refusal by the address policy,
    /// else "none".
    pub fn reason(&self) -> &'static str {
        match self {
            AgentFailure::Unreachable { reason, .. } => reason,
            AgentFailure::Denied(_) => "policy",
            _ => "none",
        }
    }

    /// The detail the logs keep (may name hosts and OS errors; never a
    /// header value).
    pub fn log_detail(&self) -> String {
        match self {
            AgentFailure::Unreachable { reason, detail } => format!("{reason}: {detail}"),
            other => other.detail(),
        }
    }
}

impl From<NetError> for AgentFailure {
    fn from(e: NetError) -> Self {
        let reason = e.reason();
        match e {
            NetError::Denied(m) => AgentFailure::Denied(m),
            NetError::BadUrl(m) => AgentFailure::Denied(format!("not an http(s) URL: {m}")),
            // A name resolving only to forbidden addresses says "unreachable"
            // like any other: it would otherwise reveal internal DNS names.
            NetError::DeniedResolved(detail)
            | NetError::Connect { detail, .. }
            | NetError::Broken(detail) => AgentFailure::Unreachable { reason, detail },
            NetError::FirstByte => AgentFailure::Silent("no response head in time".into()),
            NetError::Idle => AgentFailure::Silent("nothing more in time".into()),
            NetError::TooLarge(n) => AgentFailure::TooLarge(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rpc::message;
    use super::task::Accumulator;
    use super::*;
    use serde_json::json;

    #[test]
    fn v1_card_picks_the_jsonrpc_interface() {
        let card = json!({
            "name": "Weather", "description": "Forecasts", "version": "1.0.0",
            "supportedInterfaces": [
                {"url": "https://a.example/grpc", "protocolBinding": "GRPC", "protocolVersion": "1.0"},
                {"url": "https://a.example/rpc", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
            ],
            "capabilities": {"streaming": true},
            "defaultInputModes": ["text/plain"], "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "f", "name": "forecast", "description": "daily forecast", "tags": ["weather"]}]
        });
        let c = parse_card(
            card.to_string().as_bytes(),
            "https://a.example/.well-known/agent-card.json",
        )
        .unwrap();
        assert_eq!(c.endpoint, "https://a.example/rpc");
        assert_eq!(c.protocol, Protocol::V1);
        assert!(c.streaming);
        assert_eq!(c.skills[0].tags, vec!["weather"]);
    }

    #[test]
    fn v03_card_uses_its_top_level_url_and_relative_urls_resolve() {
        let card =
            json!({"name": "Old", "description": "d", "url": "/rpc", "protocolVersion": "0.3.0"});
        let c = parse_card(
            card.to_string().as_bytes(),
            "http://127.0.0.1:9/.well-known/agent.json",
        )
        .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:9/rpc");
        assert_eq!(c.protocol, Protocol::V03);
        assert!(!c.streaming);
    }

    #[test]
    fn malformed_cards_are_refused() {
        for bad in [
            "not json",
            "[]",
            r#"{"name": ""}"#,
            r#"{"name": "x", "description": "no interface"}"#,
            r#"{"name": "x", "url": "https://a/rpc", "preferredTransport": "GRPC"}"#,
            r#"{"name": "x", "supportedInterfaces": [{"url": "https://a", "protocolBinding": "JSONRPC", "protocolVersion": "2.0"}]}"#,
            r#"{"name": "x", "url": "ftp://a/rpc", "protocolVersion": "0.3.0"}"#,
        ] {
            assert!(
                parse_card(bad.as_bytes(), "https://a/card.json").is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn card_urls_try_v1_then_v03_or_take_a_json_address_as_is() {
        assert_eq!(
            card_urls("http://h:1/"),
            vec![
                "http://h:1/.well-known/agent-card.json".to_string(),
                "http://h:1/.well-known/agent.json".to_string()
            ]
        );
        assert_eq!(
            card_urls("https://h/x/card.json"),
            vec!["https://h/x/card.json".to_string()]
        );
    }

    #[test]
    fn card_urls_extend_the_path_and_keep_the_query_a_query() {
        assert_eq!(
            card_urls("http://bob:pw@h:1/base/?token=t1"),
            vec![
                "http://bob:pw@h:1/base/.well-known/agent-card.json?token=t1".to_string(),
                "http://bob:pw@h:1/base/.well-known/agent.json?token=t1".to_string()
            ]
        );
        assert_eq!(
            card_urls("https://h/x/card.json?v=2"),
            vec!["https://h/x/card.json?v=2".to_string()]
        );
    }

    fn fold(results: &[Value]) -> Result<AgentAnswer, AgentFailure> {
        let mut acc = Accumulator::default();
        let slot = TaskSlot::default();
        for r in results {
            acc.push(r.clone(), &slot)?;
        }
        acc.finish()
    }

    #[test]
    fn v1_completed_task_with_text_and_data_parts() {
        let a = fold(&[json!({"task": {"id": "t1", "contextId": "c1",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": [{"text": "sunny"}, {"data": {"t": 21}, "mediaType": "application/json"}]}]}})])
        .unwrap();
        assert_eq!(a.text(), "sunny");
        assert_eq!(a.context_id.as_deref(), Some("c1"));
        assert!(matches!(&a.parts[1], Part::Data { data, .. } if data["t"] == 21));
    }

    #[test]
    fn v1_stream_events_fold_and_record_the_task_id() {
        let mut acc = Accumulator::default();
        let slot = TaskSlot::default();
        acc.push(
            json!({"task": {"id": "t9", "status": {"state": "TASK_STATE_WORKING"}}}),
            &slot,
        )
        .unwrap();
        assert_eq!(slot.get().as_deref(), Some("t9"));
        assert!(!acc.ended());
        acc.push(json!({"artifactUpdate": {"taskId": "t9", "contextId": "c", "artifact": {"parts": [{"text": "done"}]}}}), &slot).unwrap();
        acc.push(json!({"statusUpdate": {"taskId": "t9", "contextId": "c", "status": {"state": "TASK_STATE_COMPLETED"}}}), &slot).unwrap();
        assert!(acc.ended());
        assert_eq!(acc.finish().unwrap().text(), "done");
    }

    #[test]
    fn v03_kind_tagged_results_and_lowercase_states() {
        let a = fold(&[json!({"kind": "task", "id": "t", "contextId": "c",
            "status": {"state": "completed"},
            "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": "hi"}, {"kind": "file", "file": {"uri": "https://x/f.png", "mimeType": "image/png", "name": "f.png"}}]}]})])
        .unwrap();
        assert_eq!(a.text(), "hi");
        assert!(matches!(&a.parts[1], Part::File { url: Some(u), .. } if u == "https://x/f.png"));
        let m = fold(&[json!({"kind": "message", "messageId": "m", "role": "agent", "parts": [{"kind": "text", "text": "direct"}]})]).unwrap();
        assert_eq!(m.text(), "direct");
    }

    #[test]
    fn refusals_failures_and_interruptions_are_failures() {
        let state = |s: &str, text: &str| {
            fold(&[
                json!({"task": {"id": "t", "status": {"state": s, "message": {"role": "ROLE_AGENT", "parts": [{"text": text}]}}}}),
            ])
        };
        assert!(
            matches!(state("TASK_STATE_REJECTED", "no"), Err(AgentFailure::Rejected(m)) if m == "no")
        );
        assert!(matches!(
            state("TASK_STATE_FAILED", "boom"),
            Err(AgentFailure::Failed(_))
        ));
        assert!(matches!(
            state("TASK_STATE_AUTH_REQUIRED", "login"),
            Err(AgentFailure::AuthRequired(_))
        ));
        assert!(matches!(
            state("input-required", "which city?"),
            Err(AgentFailure::InputRequired(_))
        ));
        assert!(matches!(state("canceled", ""), Err(AgentFailure::Canceled)));
        let refusal = fold(&[
            json!({"task": {"id": "t", "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": [{"text": "I'm sorry, but I can't help with that request."}]}]}}),
        ]);
        assert!(
            matches!(refusal, Err(AgentFailure::RefusedText(_))),
            "{refusal:?}"
        );
        assert!(matches!(
            fold(&[json!({"weird": 1})]),
            Err(AgentFailure::Malformed(_))
        ));
        assert!(matches!(
            fold(&[json!({"task": {"id": "t", "status": {"state": "TASK_STATE_WORKING"}}})]),
            Err(AgentFailure::Malformed(_))
        ));
    }

    #[test]
    fn rpc_errors_surface_code_and_message() {
        let r: wire::RpcReply = serde_json::from_str(
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"nope"}}"#,
        )
        .unwrap();
        assert_eq!(
            r.into_result().unwrap_err(),
            AgentFailure::RpcError(-32001, "nope".into())
        );
    }

    #[test]
    fn refusal_detection_is_for_short_refusing_text_only() {
        assert!(looks_like_refusal("I can't do that."));
        assert!(looks_like_refusal("Sorry, I cannot assist with this."));
        assert!(!looks_like_refusal(
            "The forecast: sunny, 21 °C. I can't wait!"
        ));
        assert!(!looks_like_refusal(""));
        assert!(!looks_like_refusal(&"x".repeat(500)));
    }

    #[test]
    fn outgoing_messages_follow_each_version() {
        let r = Request {
            text: "hi".into(),
            data: Some(json!({"a": 1})),
            context_id: Some("c".into()),
        };
        let v1 = message(Protocol::V1, &r);
        assert_eq!(v1["role"], "ROLE_USER");
        assert_eq!(v1["parts"][0]["text"], "hi");
        assert_eq!(v1["parts"][1]["data"]["a"], 1);
        assert_eq!(v1["contextId"], "c");
        let v03 = message(Protocol::V03, &r);
        assert_eq!(v03["role"], "user");
        assert_eq!(v03["kind"], "message");
        assert_eq!(v03["parts"][0]["kind"], "text");
    }
}
