//! Hand-written A2A agents on loopback, for planner tests. Each is a tiny
//! HTTP/1.1 server on raw sockets (one request per connection), so it can
//! misbehave in ways a framework would not allow: accept and never
//! answer, send SSE headers and then nothing, serve a broken card.
//!
//! Every agent serves its card (v1.0 at `/.well-known/agent-card.json`;
//! the v0.3 one at `/.well-known/agent.json` only) and JSON-RPC at `/rpc`,
//! and records the methods it was called with and the tasks it was asked
//! to cancel.

use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How an agent behaves.
#[derive(Debug, Clone, PartialEq)]
pub enum Behavior {
    /// v1.0; completes after `delay` with a text part and a data part.
    Good { delay: Duration },
    /// v1.0, streaming: a WORKING task at once, the answer after `delay`.
    /// Records `CancelTask`.
    Slow { delay: Duration },
    /// v1.0: the task is `TASK_STATE_REJECTED`.
    Rejecting,
    /// v1.0: completed, but the answer refuses in plain text.
    Refusing,
    /// v1.0: reads the request and never answers.
    Silent,
    /// v1.0, streaming: SSE headers, then nothing.
    SseThenNothing,
    /// v1.0: HTTP 500 on every call.
    ServerError,
    /// v0.3 only: `agent.json`, `message/send`, lower-case states.
    V03Only,
    /// A card that is not JSON.
    MalformedCard,
    /// v1.0: a reply of `bytes` bytes (for the planner's body cap).
    Huge { bytes: usize },
}

impl Behavior {
    /// A good agent that answers at once.
    pub fn good() -> Self {
        Behavior::Good {
            delay: Duration::ZERO,
        }
    }
}

/// What an agent saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// JSON-RPC methods, in order.
    pub methods: Vec<String>,
    /// Task ids of `CancelTask` / `tasks/cancel` calls.
    pub cancels: Vec<String>,
    /// `A2A-Version` headers of RPC calls.
    pub versions: Vec<String>,
    /// Text parts of the messages received.
    pub texts: Vec<String>,
    /// `Authorization` headers of RPC calls.
    pub auth: Vec<String>,
    /// `Authorization` headers of card fetches (`None`: the fetch had none).
    pub card_auth: Vec<Option<String>>,
}

/// How an agent deviates from the plain one its behaviour describes.
#[derive(Debug, Clone, Default)]
pub struct AgentOptions {
    /// The JSON-RPC URL its card names, instead of its own `/rpc`.
    pub card_endpoint: Option<String>,
    /// The host its card names for its own `/rpc` (default `127.0.0.1`;
    /// `localhost` for an agent reached by name).
    pub card_host: Option<String>,
    /// An `Authorization` value every request must carry (else HTTP 401,
    /// card included).
    pub require_auth: Option<String>,
}

/// A running test agent; it stops when dropped.
pub struct TestAgent {
    pub name: String,
    addr: String,
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestAgent {
    /// Starts an agent named `name` (its card's name: the plan's target id
    /// when the request names it by URL) on a free loopback port.
    pub async fn start(name: &str, description: &str, behavior: Behavior) -> TestAgent {
        Self::start_with(name, description, behavior, AgentOptions::default()).await
    }

    /// [`TestAgent::start`] with [`AgentOptions`].
    pub async fn start_with(
        name: &str,
        description: &str,
        behavior: Behavior,
        options: AgentOptions,
    ) -> TestAgent {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let agent = Arc::new(AgentSpec {
            name: name.to_owned(),
            description: description.to_owned(),
            addr: addr.clone(),
            behavior,
            seen: seen.clone(),
            options,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let agent = agent.clone();
                tokio::spawn(async move {
                    let _ = agent.serve(socket).await;
                });
            }
        });
        TestAgent {
            name: name.to_owned(),
            addr,
            seen,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`: the address a request's `agents` names.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn methods(&self) -> Vec<String> {
        self.seen
            .lock()
            .map(|s| s.methods.clone())
            .unwrap_or_default()
    }

    pub fn cancels(&self) -> Vec<String> {
        self.seen
            .lock()
            .map(|s| s.cancels.clone())
            .unwrap_or_default()
    }

    pub fn versions(&self) -> Vec<String> {
        self.seen
            .lock()
            .map(|s| s.versions.clone())
            .unwrap_or_default()
    }

    pub fn auth(&self) -> Vec<String> {
        self.seen.lock().map(|s| s.auth.clone()).unwrap_or_default()
    }

    /// The `Authorization` header of each card fetch, in order.
    pub fn card_auth(&self) -> Vec<Option<String>> {
        self.seen
            .lock()
            .map(|s| s.card_auth.clone())
            .unwrap_or_default()
    }

    pub fn texts(&self) -> Vec<String> {
        self.seen
            .lock()
            .map(|s| s.texts.clone())
            .unwrap_or_default()
    }
}

struct AgentSpec {
    name: String,
    description: String,
    addr: String,
    behavior: Behavior,
    seen: Arc<Mutex<Seen>>,
    options: AgentOptions,
}

/// One parsed request.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

async fn read_request(socket: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_owned();
    let path = first.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Some(Request {
        method,
        path,
        headers,
        body,
    }))
}

async fn respond(
    socket: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Status",
    };
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(text.as_bytes()).await?;
    socket.shutdown().await
}

/// Holds a connection open until the client goes away.
async fn hold(socket: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    while let Ok(n) = socket.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

impl AgentSpec {
    fn streaming(&self) -> bool {
        matches!(
            self.behavior,
            Behavior::Slow { .. } | Behavior::SseThenNothing
        )
    }

    fn rpc_url(&self) -> String {
        self.options
            .card_endpoint
            .clone()
            .unwrap_or_else(|| match &self.options.card_host {
                Some(host) => {
                    let port = self.addr.rsplit(':').next().unwrap_or_default();
                    format!("http://{host}:{port}/rpc")
                }
                None => format!("http://{}/rpc", self.addr),
            })
    }

    fn card_v1(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "version": "1.0.0",
            "supportedInterfaces": [{
                "url": self.rpc_url(),
                "protocolBinding": "JSONRPC",
                "protocolVersion": "1.0"
            }],
            "capabilities": {"streaming": self.streaming()},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain", "application/json"],
            "skills": [{"id": "main", "name": self.name, "description": self.description, "tags": ["test"]}]
        })
    }

    fn card_v03(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "version": "0.3.0",
            "protocolVersion": "0.3.0",
            "url": self.rpc_url(),
            "preferredTransport": "JSONRPC",
            "capabilities": {"streaming": false},
            "defaultInputModes": ["text/plain"],
            "defaultOutputModes": ["text/plain"],
            "skills": [{"id": "main", "name": self.name, "description": self.description, "tags": ["test"]}]
        })
    }

    async fn serve(&self, mut socket: TcpStream) -> std::io::Result<()> {
        let Some(req) = read_request(&mut socket).await? else {
            return Ok(());
        };
        let auth = req
            .headers
            .iter()
            .find(|(k, _)| k == "authorization")
            .map(|(_, v)| v.clone());
        if req.method == "GET" {
            if let Ok(mut seen) = self.seen.lock() {
                seen.card_auth.push(auth.clone());
            }
        }
        if let Some(required) = &self.options.require_auth {
            if auth.as_ref() != Some(required) {
                if req.method == "POST" {
                    if let Ok(mut seen) = self.seen.lock() {
                        seen.methods.push("(unauthorized)".into());
                    }
                }
                return respond(&mut socket, 401, "text/plain", "unauthorized").await;
            }
        }
        match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/.well-known/agent-card.json") => match self.behavior {
                Behavior::MalformedCard => {
                    respond(&mut socket, 200, "application/json", "{\"name\": 5, oops").await
                }
                Behavior::V03Only => respond(&mut socket, 404, "text/plain", "not found").await,
                _ => {
                    respond(
                        &mut socket,
                        200,
                        "application/json",
                        &self.card_v1().to_string(),
                    )
                    .await
                }
            },
            ("GET", "/.well-known/agent.json") => match self.behavior {
                Behavior::V03Only => {
                    respond(
                        &mut socket,
                        200,
                        "application/json",
                        &self.card_v03().to_string(),
                    )
                    .await
                }
                _ => respond(&mut socket, 404, "text/plain", "not found").await,
            },
            ("POST", "/rpc") => self.rpc(&mut socket, req).await,
            _ => respond(&mut socket, 404, "text/plain", "not found").await,
        }
    }

    async fn rpc(&self, socket: &mut TcpStream, req: Request) -> std::io::Result<()> {
        let call: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let method = call["method"].as_str().unwrap_or("").to_owned();
        let id = call["id"].clone();
        let text: String = call["params"]["message"]["parts"]
            .as_array()
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        if let Ok(mut seen) = self.seen.lock() {
            seen.methods.push(method.clone());
            if let Some((_, v)) = req.headers.iter().find(|(k, _)| k == "a2a-version") {
                seen.versions.push(v.clone());
            }
            if let Some((_, v)) = req.headers.iter().find(|(k, _)| k == "authorization") {
                seen.auth.push(v.clone());
            }
            if method == "CancelTask" || method == "tasks/cancel" {
                seen.cancels
                    .push(call["params"]["id"].as_str().unwrap_or("").to_owned());
            }
            if !text.is_empty() {
                seen.texts.push(text.clone());
            }
        }
        let reply =
            |result: Value| json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        if method == "CancelTask" || method == "tasks/cancel" {
            let task = call["params"]["id"].as_str().unwrap_or("").to_owned();
            let body =
                reply(json!({"task": {"id": task, "status": {"state": "TASK_STATE_CANCELED"}}}));
            return respond(socket, 200, "application/json", &body).await;
        }
        let task_id = format!("{}-task-{}", self.name, crate::random_hex(6));
        let answer = format!("{} says: done ({} chars asked)", self.name, text.len());
        match &self.behavior {
            Behavior::Good { delay } => {
                tokio::time::sleep(*delay).await;
                let body = reply(json!({"task": {
                    "id": task_id, "contextId": format!("ctx-{}", self.name),
                    "status": {"state": "TASK_STATE_COMPLETED"},
                    "artifacts": [{"artifactId": "a1", "parts": [
                        {"text": answer},
                        {"data": {"agent": self.name, "value": 42}, "mediaType": "application/json"}
                    ]}]
                }}));
                respond(socket, 200, "application/json", &body).await
            }
            Behavior::Slow { delay } => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                socket.write_all(head.as_bytes()).await?;
                let working = reply(
                    json!({"task": {"id": task_id, "contextId": "ctx-slow", "status": {"state": "TASK_STATE_WORKING"}}}),
                );
                socket
                    .write_all(format!("data: {working}\n\n").as_bytes())
                    .await?;
                socket.flush().await?;
                tokio::time::sleep(*delay).await;
                let artifact = reply(
                    json!({"artifactUpdate": {"taskId": task_id, "contextId": "ctx-slow", "artifact": {"artifactId": "a", "parts": [{"text": answer}]}}}),
                );
                let done = reply(
                    json!({"statusUpdate": {"taskId": task_id, "contextId": "ctx-slow", "status": {"state": "TASK_STATE_COMPLETED"}}}),
                );
                socket
                    .write_all(format!("data: {artifact}\n\ndata: {done}\n\n").as_bytes())
                    .await?;
                socket.shutdown().await
            }
            Behavior::Rejecting => {
                let body = reply(json!({"task": {"id": task_id, "status": {
                    "state": "TASK_STATE_REJECTED",
                    "message": {"role": "ROLE_AGENT", "messageId": "m", "parts": [{"text": "This agent does not take such tasks."}]}
                }}}));
                respond(socket, 200, "application/json", &body).await
            }
            Behavior::Refusing => {
                let body = reply(
                    json!({"task": {"id": task_id, "status": {"state": "TASK_STATE_COMPLETED"},
                    "artifacts": [{"artifactId": "a", "parts": [{"text": "I'm sorry, but I can't help with that request."}]}]}}),
                );
                respond(socket, 200, "application/json", &body).await
            }
            Behavior::Silent => {
                hold(socket).await;
                Ok(())
            }
            Behavior::SseThenNothing => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                socket.write_all(head.as_bytes()).await?;
                socket.flush().await?;
                hold(socket).await;
                Ok(())
            }
            Behavior::ServerError => respond(socket, 500, "text/plain", "boom").await,
            Behavior::V03Only => {
                if method != "message/send" {
                    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "Method not found"}}).to_string();
                    return respond(socket, 200, "application/json", &body).await;
                }
                let body = reply(
                    json!({"kind": "task", "id": task_id, "contextId": "ctx-v03",
                    "status": {"state": "completed"},
                    "artifacts": [{"artifactId": "a", "parts": [{"kind": "text", "text": answer}]}]}),
                );
                respond(socket, 200, "application/json", &body).await
            }
            Behavior::MalformedCard => respond(socket, 500, "text/plain", "no").await,
            Behavior::Huge { bytes } => {
                let body = reply(
                    json!({"task": {"id": task_id, "status": {"state": "TASK_STATE_COMPLETED"},
                    "artifacts": [{"artifactId": "a", "parts": [{"text": "x".repeat(*bytes)}]}]}}),
                );
                respond(socket, 200, "application/json", &body).await
            }
        }
    }
}
