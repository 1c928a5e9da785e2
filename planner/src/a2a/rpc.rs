//! Calling an agent: JSON-RPC requests in the card's version
//! (`SendMessage`/`message/send`, streaming, `GetTask`, `CancelTask`), the
//! task a call created, and its cancellation when the call is dropped.

use super::task::{Accumulator, TaskSlot};
use super::{wire, AgentAnswer, AgentFailure, Protocol};
use crate::net::{AgentHttp, NetLimits, SseReader};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// How to reach one agent.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    pub protocol: Protocol,
    pub streaming: bool,
    /// Headers of every call (the directory's auth header).
    pub headers: Vec<(String, String)>,
    /// Set when the endpoint may not be called (a directory card naming a
    /// host outside its entry's origins): every call fails with this,
    /// before any traffic.
    pub refused: Option<String>,
}

/// Sends `CancelTask` for the call's task when dropped unfinished: a hedge
/// that lost, a step past its deadline, a client that went away.
pub struct CancelOnDrop {
    pub http: Arc<AgentHttp>,
    pub endpoint: Endpoint,
    pub slot: TaskSlot,
    pub limits: NetLimits,
    pub armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Some(task) = self.slot.get() else {
            return;
        };
        let http = self.http.clone();
        let endpoint = self.endpoint.clone();
        let limits = self.limits;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    cancel_task(&http, &endpoint, &task, limits),
                )
                .await;
            });
        }
    }
}

/// What to send to an agent.
#[derive(Debug, Clone)]
pub struct Request {
    pub text: String,
    /// Structured input (a data part).
    pub data: Option<Value>,
    /// The agent's conversation to continue.
    pub context_id: Option<String>,
}

/// Sends a message and waits for its outcome (streaming when the card
/// says the agent streams; polling `GetTask` when a non-streaming reply
/// leaves the task running). The caller bounds the total time.
pub async fn send(
    http: &AgentHttp,
    endpoint: &Endpoint,
    request: &Request,
    slot: &TaskSlot,
    limits: NetLimits,
) -> Result<AgentAnswer, AgentFailure> {
    let method = match (endpoint.protocol, endpoint.streaming) {
        (Protocol::V1, true) => "SendStreamingMessage",
        (Protocol::V1, false) => "SendMessage",
        (Protocol::V03, true) => "message/stream",
        (Protocol::V03, false) => "message/send",
    };
    let params = serde_json::json!({ "message": message(endpoint.protocol, request) });
    let response = rpc(http, endpoint, method, params, limits).await?;
    let mut acc = Accumulator::default();
    if response.content_type.starts_with("text/event-stream") {
        let mut events = SseReader::new(response.body);
        while let Some(data) = events.next().await? {
            let reply: wire::RpcReply = serde_json::from_str(&data)
                .map_err(|e| AgentFailure::Malformed(format!("stream event: {e}")))?;
            let result = reply.into_result()?;
            acc.push(result, slot)?;
            if acc.ended() {
                break;
            }
        }
    } else {
        let body = response.body.all().await?;
        let reply: wire::RpcReply = serde_json::from_slice(&body)
            .map_err(|e| AgentFailure::Malformed(format!("reply: {e}")))?;
        acc.push(reply.into_result()?, slot)?;
        // A blocking send may still leave the task running: poll it.
        let mut wait = Duration::from_millis(100);
        while !acc.ended() {
            let Some(task) = acc.task_id.clone() else {
                break;
            };
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
            let method = match endpoint.protocol {
                Protocol::V1 => "GetTask",
                Protocol::V03 => "tasks/get",
            };
            let response = rpc(
                http,
                endpoint,
                method,
                serde_json::json!({ "id": task }),
                limits,
            )
            .await?;
            let body = response.body.all().await?;
            let reply: wire::RpcReply = serde_json::from_slice(&body)
                .map_err(|e| AgentFailure::Malformed(format!("GetTask reply: {e}")))?;
            acc.push(reply.into_result()?, slot)?;
        }
    }
    acc.finish()
}

/// `CancelTask` (`tasks/cancel` on v0.3). Errors are ignored by callers:
/// the task may have ended meanwhile.
pub async fn cancel_task(
    http: &AgentHttp,
    endpoint: &Endpoint,
    task_id: &str,
    limits: NetLimits,
) -> Result<(), AgentFailure> {
    let method = match endpoint.protocol {
        Protocol::V1 => "CancelTask",
        Protocol::V03 => "tasks/cancel",
    };
    let response = rpc(
        http,
        endpoint,
        method,
        serde_json::json!({ "id": task_id }),
        limits,
    )
    .await?;
    let _ = response.body.all().await;
    Ok(())
}

/// One JSON-RPC request; a non-2xx status is a failure.
async fn rpc(
    http: &AgentHttp,
    endpoint: &Endpoint,
    method: &str,
    params: Value,
    limits: NetLimits,
) -> Result<crate::net::Response, AgentFailure> {
    if let Some(why) = &endpoint.refused {
        return Err(AgentFailure::Denied(why.clone()));
    }
    let body = serde_json::to_vec(&wire::RpcRequest {
        jsonrpc: "2.0",
        id: crate::ids::new_id("rpc-"),
        method,
        params,
    })
    .map_err(|e| AgentFailure::Malformed(e.to_string()))?;
    let mut headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        (
            "accept".to_owned(),
            "application/json, text/event-stream".to_owned(),
        ),
    ];
    if endpoint.protocol == Protocol::V1 {
        headers.push(("a2a-version".to_owned(), "1.0".to_owned()));
    }
    headers.extend(endpoint.headers.iter().cloned());
    let response = http
        .send(
            http::Method::POST,
            &endpoint.url,
            &headers,
            Some(body),
            limits,
        )
        .await?;
    if !(200..300).contains(&response.status) {
        return Err(AgentFailure::Http(response.status));
    }
    Ok(response)
}

/// The outgoing message in the agent's version.
pub(super) fn message(protocol: Protocol, r: &Request) -> Value {
    let id = crate::ids::new_id("msg-");
    match protocol {
        Protocol::V1 => {
            let mut parts = vec![serde_json::json!({ "text": r.text })];
            if let Some(d) = &r.data {
                parts.push(serde_json::json!({ "data": d, "mediaType": "application/json" }));
            }
            let mut m = serde_json::json!({ "messageId": id, "role": "ROLE_USER", "parts": parts });
            if let Some(c) = &r.context_id {
                m["contextId"] = Value::String(c.clone());
            }
            m
        }
        Protocol::V03 => {
            let mut parts = vec![serde_json::json!({ "kind": "text", "text": r.text })];
            if let Some(d) = &r.data {
                parts.push(serde_json::json!({ "kind": "data", "data": d }));
            }
            let mut m = serde_json::json!({
                "kind": "message", "messageId": id, "role": "user", "parts": parts
            });
            if let Some(c) = &r.context_id {
                m["contextId"] = Value::String(c.clone());
            }
            m
        }
    }
}
