//! A client of the Agent2Agent protocol (A2A), JSON-RPC binding: v1.0
//! (`SendMessage`, `SendStreamingMessage`, `GetTask`, `CancelTask`, header
//! `A2A-Version: 1.0`, card at `/.well-known/agent-card.json`), falling
//! back to v0.3 (`message/send`, `message/stream`, `tasks/get`,
//! `tasks/cancel`, lower-case states, `kind`-tagged parts, card also at
//! `/.well-known/agent.json`) when the card says so.
//!
//! Wire shapes (`wire`) are parsed leniently, since both versions share
//! most field names, and turned into the planner's own types: an
//! [`AgentCard`], and an [`AgentAnswer`] or an [`AgentFailure`] per call.
//! Agent output is data: nothing here interprets it beyond its A2A shape.

use super::net::{AgentHttp, NetError, NetLimits};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The protocol version an agent speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "1.0")]
    V1,
    #[serde(rename = "0.3")]
    V03,
}

/// What the planner knows of an agent from its card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub skills: Vec<Skill>,
    /// The JSON-RPC endpoint.
    pub endpoint: String,
    pub protocol: Protocol,
    pub streaming: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
}

/// Where an agent's card is: the address itself when it names a `.json`
/// file, else the v1.0 well-known path, then (v0.3 and older) `agent.json`.
pub fn card_urls(address: &str) -> Vec<String> {
    let trimmed = address.trim_end_matches('/');
    if trimmed.ends_with(".json") {
        return vec![trimmed.to_owned()];
    }
    vec![
        format!("{trimmed}/.well-known/agent-card.json"),
        format!("{trimmed}/.well-known/agent.json"),
    ]
}

/// Why an agent's card could not be had.
#[derive(Debug, Clone, PartialEq)]
pub enum CardError {
    Net { url: String, error: NetError },
    Http { url: String, status: u16 },
    Invalid { url: String, why: InvalidCard },
}

/// Why a fetched card cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum InvalidCard {
    /// The address gave no card URL to try.
    NoCardUrl,
    /// Not an agent card's JSON (the parser's message).
    NotACard(String),
    NoName,
    NoJsonRpcInterface,
    BadCardUrl,
    /// The interface URL is neither http(s) nor relative to the card.
    NotHttpUrl(String),
}

impl std::fmt::Display for InvalidCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidCard::NoCardUrl => f.write_str("no card URL"),
            InvalidCard::NotACard(e) => write!(f, "not an agent card: {e}"),
            InvalidCard::NoName => f.write_str("the card has no name"),
            InvalidCard::NoJsonRpcInterface => {
                f.write_str("the card declares no JSON-RPC interface of A2A 1.0 or 0.3")
            }
            InvalidCard::BadCardUrl => f.write_str("bad card URL"),
            InvalidCard::NotHttpUrl(url) => {
                write!(f, "the card's interface URL '{url}' is not an http(s) URL")
            }
        }
    }
}

impl CardError {
    /// What the caller of a request may see: network failures say only
    /// "agent unreachable" (connection refused, timed out, TLS errors
    /// would let a tenant probe hosts and ports); a refusal of the URL
    /// itself by the policy reveals nothing about the network.
    pub fn public(&self) -> String {
        match self {
            CardError::Net {
                url,
                error: e @ (NetError::Denied(_) | NetError::BadUrl(_)),
            } => format!("card {url}: {e}"),
            CardError::Net { .. } => "agent unreachable".into(),
            CardError::Http { url, status } => format!("card {url}: HTTP {status}"),
            CardError::Invalid { url, why } => format!("card {url}: {why}"),
        }
    }

    /// A bounded label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CardError::Net { error, .. } => error.reason(),
            CardError::Http { .. } => "http_status",
            CardError::Invalid { .. } => "invalid_card",
        }
    }
}

/// The whole detail, for the operator (logs, `gateway agents probe`).
impl std::fmt::Display for CardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CardError::Net { url, error } => write!(f, "card {url}: {error}"),
            CardError::Http { url, status } => write!(f, "card {url}: HTTP {status}"),
            CardError::Invalid { url, why } => write!(f, "card {url}: {why}"),
        }
    }
}

/// Fetches and parses an agent's card.
pub async fn fetch_card(
    http: &AgentHttp,
    address: &str,
    headers: &[(String, String)],
    limits: NetLimits,
) -> Result<AgentCard, CardError> {
    let mut last = CardError::Invalid {
        url: address.to_owned(),
        why: InvalidCard::NoCardUrl,
    };
    for url in card_urls(address) {
        let net = |error: NetError| CardError::Net {
            url: url.clone(),
            error,
        };
        let response = http
            .send(http::Method::GET, &url, headers, None, limits)
            .await
            .map_err(net)?;
        if response.status == 404 {
            last = CardError::Http {
                url: url.clone(),
                status: 404,
            };
            continue;
        }
        if !(200..300).contains(&response.status) {
            return Err(CardError::Http {
                url: url.clone(),
                status: response.status,
            });
        }
        let body = response.body.all().await.map_err(net)?;
        return parse_card(&body, &url).map_err(|why| CardError::Invalid { url, why });
    }
    Err(last)
}

/// Parses a card (v1.0 `supportedInterfaces`, or v0.3 top-level `url`).
pub fn parse_card(body: &[u8], card_url: &str) -> Result<AgentCard, InvalidCard> {
    let card: wire::Card =
        serde_json::from_slice(body).map_err(|e| InvalidCard::NotACard(e.to_string()))?;
    let name = card.name.trim().to_owned();
    if name.is_empty() {
        return Err(InvalidCard::NoName);
    }
    let jsonrpc = |binding: &Option<String>| {
        binding
            .as_deref()
            .is_none_or(|b| b.eq_ignore_ascii_case("JSONRPC"))
    };
    let version_of = |v: &str| {
        if v.starts_with("1.") || v == "1" {
            Some(Protocol::V1)
        } else if v.starts_with("0.3") || v.starts_with("0.2") {
            Some(Protocol::V03)
        } else {
            None
        }
    };
    let mut endpoint = None;
    // v1.0: the first JSON-RPC interface of a version we speak, 1.0 first.
    let interfaces: Vec<&wire::Interface> = card
        .supported_interfaces
        .iter()
        .chain(card.additional_interfaces.iter())
        .collect();
    for want in [Protocol::V1, Protocol::V03] {
        if endpoint.is_some() {
            break;
        }
        for i in &interfaces {
            let binding = i.protocol_binding.clone().or_else(|| i.transport.clone());
            let version = i
                .protocol_version
                .as_deref()
                .or(card.protocol_version.as_deref())
                .and_then(version_of);
            if jsonrpc(&binding) && version == Some(want) && !i.url.is_empty() {
                endpoint = Some((i.url.clone(), want));
                break;
            }
        }
    }
    // v0.3: a top-level url, JSON-RPC unless another transport is preferred.
    if endpoint.is_none() {
        if let Some(url) = card.url.as_deref().filter(|u| !u.is_empty()) {
            let version = card
                .protocol_version
                .as_deref()
                .map_or(Some(Protocol::V03), version_of);
            match version {
                Some(v) if jsonrpc(&card.preferred_transport) => {
                    endpoint = Some((url.to_owned(), v))
                }
                _ => {}
            }
        }
    }
    let (url, protocol) = endpoint.ok_or(InvalidCard::NoJsonRpcInterface)?;
    let endpoint = resolve_url(card_url, &url)?;
    Ok(AgentCard {
        name,
        description: card.description.unwrap_or_default(),
        skills: card
            .skills
            .into_iter()
            .map(|s| Skill {
                name: s.name.unwrap_or_default(),
                description: s.description.unwrap_or_default(),
                tags: s.tags,
            })
            .collect(),
        endpoint,
        protocol,
        streaming: card.capabilities.and_then(|c| c.streaming).unwrap_or(false),
    })
}

/// An endpoint URL, absolute or relative to the card's URL.
fn resolve_url(card_url: &str, url: &str) -> Result<String, InvalidCard> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(url.to_owned());
    }
    let uri: http::Uri = card_url.parse().map_err(|_| InvalidCard::BadCardUrl)?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(InvalidCard::BadCardUrl);
    };
    if url.starts_with('/') {
        Ok(format!("{scheme}://{authority}{url}"))
    } else {
        Err(InvalidCard::NotHttpUrl(url.to_owned()))
    }
}

/// `scheme://authority` of a URL, to compare origins.
pub fn origin(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
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
        let cut = |s: &str| super::text::clip(s, 200);
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

/// The task an in-flight call created, for cancelling it.
#[derive(Debug, Default, Clone)]
pub struct TaskSlot(Arc<Mutex<Option<String>>>);

impl TaskSlot {
    fn set(&self, id: &str) {
        if let Ok(mut slot) = self.0.lock() {
            if slot.is_none() && !id.is_empty() {
                *slot = Some(id.to_owned());
            }
        }
    }

    pub fn get(&self) -> Option<String> {
        self.0.lock().ok().and_then(|s| s.clone())
    }
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
        let mut events = response.body.events();
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
) -> Result<super::net::Response, AgentFailure> {
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
fn message(protocol: Protocol, r: &Request) -> Value {
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

/// A task's state, across versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    Completed,
    Failed,
    Canceled,
    Rejected,
    InputRequired,
    AuthRequired,
    Unknown,
}

impl TaskState {
    pub fn parse(s: &str) -> TaskState {
        let s = s.trim().to_ascii_lowercase();
        let s = s
            .strip_prefix("task_state_")
            .unwrap_or(&s)
            .replace('_', "-");
        match s.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "input-required" => TaskState::InputRequired,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Unknown,
        }
    }

    /// Terminal or interrupted: the call is over.
    fn ends(self) -> bool {
        !matches!(
            self,
            TaskState::Submitted | TaskState::Working | TaskState::Unknown
        )
    }
}

/// Folds a call's results (one reply, or stream events) into an outcome.
#[derive(Debug, Default)]
struct Accumulator {
    task_id: Option<String>,
    context_id: Option<String>,
    state: Option<TaskState>,
    /// The status message's text (a refusal or failure reason).
    status_text: String,
    artifacts: Vec<Part>,
    /// A direct message reply ends the call.
    message: Option<Vec<Part>>,
}

impl Accumulator {
    fn push(&mut self, result: Value, slot: &TaskSlot) -> Result<(), AgentFailure> {
        let r: wire::RpcResult = serde_json::from_value(result)
            .map_err(|e| AgentFailure::Malformed(format!("result: {e}")))?;
        // v1.0 wraps (`task`, `message`, `statusUpdate`, `artifactUpdate`);
        // v0.3 tags the object itself with `kind`.
        if let Some(task) = r.task {
            self.task(task, slot);
        } else if let Some(m) = r.message {
            self.message_reply(m);
        } else if let Some(u) = r.status_update {
            self.status_update(u, slot);
        } else if let Some(u) = r.artifact_update {
            self.artifact_update(u, slot);
        } else {
            match r.kind.as_deref() {
                Some("task") => self.task(r.flat_task(), slot),
                Some("message") => self.message_reply(r.flat_message()),
                Some("status-update") => self.status_update(r.flat_status_update(), slot),
                Some("artifact-update") => self.artifact_update(r.flat_artifact_update(), slot),
                _ => return Err(AgentFailure::Malformed("an unknown result".into())),
            }
        }
        Ok(())
    }

    fn task(&mut self, t: wire::Task, slot: &TaskSlot) {
        if let Some(id) = &t.id {
            slot.set(id);
            self.task_id = Some(id.clone());
        }
        if t.context_id.is_some() {
            self.context_id = t.context_id;
        }
        for a in t.artifacts {
            self.artifacts
                .extend(a.parts.into_iter().filter_map(wire::Part::into_part));
        }
        if let Some(s) = t.status {
            self.status(s);
        }
    }

    fn status(&mut self, s: wire::Status) {
        self.state = Some(TaskState::parse(&s.state.unwrap_or_default()));
        if let Some(m) = s.message {
            let text = parts_text(&m.parts);
            if !text.is_empty() {
                self.status_text = text;
            }
            // A completed task may answer in its status message.
            if self.state == Some(TaskState::Completed) {
                self.artifacts
                    .extend(m.parts.into_iter().filter_map(wire::Part::into_part));
            }
        }
    }

    fn message_reply(&mut self, m: wire::Message) {
        if m.context_id.is_some() {
            self.context_id = m.context_id;
        }
        self.message = Some(
            m.parts
                .into_iter()
                .filter_map(wire::Part::into_part)
                .collect(),
        );
    }

    fn status_update(&mut self, u: wire::StatusUpdate, slot: &TaskSlot) {
        if let Some(id) = &u.task_id {
            slot.set(id);
            self.task_id.get_or_insert(id.clone());
        }
        if u.context_id.is_some() {
            self.context_id = u.context_id;
        }
        if let Some(s) = u.status {
            self.status(s);
        }
    }

    fn artifact_update(&mut self, u: wire::ArtifactUpdate, slot: &TaskSlot) {
        if let Some(id) = &u.task_id {
            slot.set(id);
            self.task_id.get_or_insert(id.clone());
        }
        if let Some(a) = u.artifact {
            self.artifacts
                .extend(a.parts.into_iter().filter_map(wire::Part::into_part));
        }
    }

    fn ended(&self) -> bool {
        self.message.is_some() || self.state.is_some_and(TaskState::ends)
    }

    fn finish(self) -> Result<AgentAnswer, AgentFailure> {
        let parts = match (self.message, self.state) {
            (Some(parts), _) => parts,
            (None, Some(TaskState::Completed)) => self.artifacts,
            (None, Some(TaskState::Rejected)) => {
                return Err(AgentFailure::Rejected(self.status_text))
            }
            (None, Some(TaskState::Failed)) => return Err(AgentFailure::Failed(self.status_text)),
            (None, Some(TaskState::Canceled)) => return Err(AgentFailure::Canceled),
            (None, Some(TaskState::AuthRequired)) => {
                return Err(AgentFailure::AuthRequired(self.status_text))
            }
            (None, Some(TaskState::InputRequired)) => {
                return Err(AgentFailure::InputRequired(self.status_text))
            }
            (None, _) => {
                return Err(AgentFailure::Malformed(
                    "the reply ended before the task finished".into(),
                ))
            }
        };
        let answer = AgentAnswer {
            parts,
            context_id: self.context_id,
            task_id: self.task_id,
        };
        if answer.parts.is_empty() {
            return Err(AgentFailure::Malformed("the agent returned nothing".into()));
        }
        let text = answer.text();
        let only_text = answer.parts.iter().all(|p| matches!(p, Part::Text { .. }));
        if only_text && looks_like_refusal(&text) {
            return Err(AgentFailure::RefusedText(text));
        }
        Ok(answer)
    }
}

fn parts_text(parts: &[wire::Part]) -> String {
    let texts: Vec<&str> = parts.iter().filter_map(|p| p.text.as_deref()).collect();
    texts.join("\n")
}

/// Whether a short plain-text answer is a refusal ("I can't help with
/// that"): agents often refuse in words inside a completed task.
pub fn looks_like_refusal(text: &str) -> bool {
    let t = text.trim().to_lowercase().replace('’', "'");
    if t.is_empty() || t.len() > 400 {
        return false;
    }
    const OPENINGS: [&str; 12] = [
        "i can't",
        "i cannot",
        "i can not",
        "i'm unable",
        "i am unable",
        "i won't",
        "i will not",
        "i'm not able",
        "i am not able",
        "sorry, i can",
        "i'm sorry, but i can",
        "i must decline",
    ];
    const PHRASES: [&str; 6] = [
        "can't help with",
        "cannot help with",
        "unable to help",
        "not able to help",
        "cannot assist",
        "can't assist",
    ];
    OPENINGS.iter().any(|o| t.starts_with(o)) || PHRASES.iter().any(|p| t.contains(p))
}

/// The JSON shapes of both versions, as lenient serde types.
mod wire {
    use super::{AgentFailure, Part as OutPart};
    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    #[derive(Serialize)]
    pub struct RpcRequest<'a> {
        pub jsonrpc: &'static str,
        pub id: String,
        pub method: &'a str,
        pub params: Value,
    }

    #[derive(Deserialize)]
    pub struct RpcReply {
        #[serde(default)]
        pub result: Option<Value>,
        #[serde(default)]
        pub error: Option<RpcError>,
    }

    #[derive(Deserialize)]
    pub struct RpcError {
        #[serde(default)]
        pub code: i64,
        #[serde(default)]
        pub message: String,
    }

    impl RpcReply {
        pub fn into_result(self) -> Result<Value, AgentFailure> {
            match (self.result, self.error) {
                (_, Some(e)) => Err(AgentFailure::RpcError(e.code, e.message)),
                (Some(r), None) => Ok(r),
                (None, None) => Err(AgentFailure::Malformed(
                    "a JSON-RPC reply without result or error".into(),
                )),
            }
        }
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct Card {
        pub name: String,
        pub description: Option<String>,
        pub supported_interfaces: Vec<Interface>,
        pub additional_interfaces: Vec<Interface>,
        pub url: Option<String>,
        pub protocol_version: Option<String>,
        pub preferred_transport: Option<String>,
        pub capabilities: Option<Capabilities>,
        pub skills: Vec<CardSkill>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct Interface {
        pub url: String,
        pub protocol_binding: Option<String>,
        /// v0.3's name for the binding.
        pub transport: Option<String>,
        pub protocol_version: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Capabilities {
        pub streaming: Option<bool>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct CardSkill {
        pub name: Option<String>,
        pub description: Option<String>,
        pub tags: Vec<String>,
    }

    /// A result: v1.0's one-key wrappers, or v0.3's `kind`-tagged object
    /// (whose fields are then read from `rest`).
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct RpcResult {
        pub task: Option<Task>,
        pub message: Option<Message>,
        pub status_update: Option<StatusUpdate>,
        pub artifact_update: Option<ArtifactUpdate>,
        pub kind: Option<String>,
        #[serde(flatten)]
        pub rest: serde_json::Map<String, Value>,
    }

    impl RpcResult {
        fn rest<T: for<'de> Deserialize<'de> + Default>(&self) -> T {
            serde_json::from_value(Value::Object(self.rest.clone())).unwrap_or_default()
        }
        pub fn flat_task(&self) -> Task {
            self.rest()
        }
        pub fn flat_message(&self) -> Message {
            self.rest()
        }
        pub fn flat_status_update(&self) -> StatusUpdate {
            self.rest()
        }
        pub fn flat_artifact_update(&self) -> ArtifactUpdate {
            self.rest()
        }
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct Task {
        pub id: Option<String>,
        pub context_id: Option<String>,
        pub status: Option<Status>,
        pub artifacts: Vec<Artifact>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Status {
        pub state: Option<String>,
        pub message: Option<Message>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct Message {
        pub context_id: Option<String>,
        pub parts: Vec<Part>,
    }

    #[derive(Deserialize, Default)]
    #[serde(default)]
    pub struct Artifact {
        pub parts: Vec<Part>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct StatusUpdate {
        pub task_id: Option<String>,
        pub context_id: Option<String>,
        pub status: Option<Status>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct ArtifactUpdate {
        pub task_id: Option<String>,
        pub artifact: Option<Artifact>,
    }

    /// A part of either version: v1.0 `{text}` / `{data, mediaType}` /
    /// `{url|raw, filename, mediaType}`; v0.3 `{kind, text|data|file}`.
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct Part {
        pub text: Option<String>,
        pub data: Option<Value>,
        pub url: Option<String>,
        pub raw: Option<String>,
        pub filename: Option<String>,
        pub media_type: Option<String>,
        pub file: Option<File>,
    }

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    pub struct File {
        pub uri: Option<String>,
        pub bytes: Option<String>,
        pub name: Option<String>,
        pub mime_type: Option<String>,
    }

    /// Largest inline file content kept (base64 characters).
    const MAX_RAW: usize = 64 * 1024;

    impl Part {
        pub fn into_part(self) -> Option<OutPart> {
            if let Some(text) = self.text {
                return Some(OutPart::Text { text });
            }
            if let Some(data) = self.data {
                return Some(OutPart::Data {
                    data,
                    media_type: self.media_type,
                });
            }
            if let Some(f) = self.file {
                return Some(OutPart::File {
                    url: f.uri,
                    raw: f.bytes.filter(|b| b.len() <= MAX_RAW),
                    filename: f.name,
                    media_type: f.mime_type,
                });
            }
            if self.url.is_some() || self.raw.is_some() {
                return Some(OutPart::File {
                    url: self.url,
                    raw: self.raw.filter(|b| b.len() <= MAX_RAW),
                    filename: self.filename,
                    media_type: self.media_type,
                });
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
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
