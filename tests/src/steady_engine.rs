//! A fast, well-behaved OpenAI-compatible engine on loopback: keep-alive
//! HTTP/1.1, a fixed six-token reply, streamed (`stream: true`, an SSE body
//! in chunked encoding, one event per token, usage when asked) or in one
//! body. It is the engine every front stands before in `hotbench`, so what
//! the fronts cost is measured on the same replies; it answers in a few
//! microseconds and never misbehaves (that is `fake_engine.rs`).

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The model id the engine lists.
pub const MODEL: &str = "steady";

/// The reply's tokens.
const TOKENS: [&str; 6] = ["The", " sky", " is", " blue", " today", "."];

/// A running engine; it stops when dropped.
pub struct SteadyEngine {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SteadyEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SteadyEngine {
    pub async fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let _ = socket.set_nodelay(true);
                tokio::spawn(serve(socket));
            }
        });
        Ok(Self { addr, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// One connection's requests, in order, until the peer closes it.
async fn serve(mut socket: TcpStream) {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let Ok(Some((head_end, method, path, length))) = read_head(&mut socket, &mut buf).await
        else {
            return;
        };
        while buf.len() < head_end + length {
            let mut chunk = [0u8; 8192];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = &buf[head_end..head_end + length];
        let reply = respond(&method, &path, body);
        buf.drain(..head_end + length);
        if socket.write_all(&reply).await.is_err() {
            return;
        }
    }
}

/// Reads up to the end of a request head: (its length, method, path,
/// content length); `None` when the peer closed cleanly.
async fn read_head(
    socket: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<(usize, String, String, usize)>> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).context("head")?;
            let mut lines = head.split("\r\n");
            let mut first = lines.next().unwrap_or_default().split(' ');
            let method = first.next().unwrap_or_default().to_owned();
            let path = first.next().unwrap_or_default().to_owned();
            let length = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            return Ok(Some((end + 4, method, path, length)));
        }
        let mut chunk = [0u8; 8192];
        match socket.read(&mut chunk).await? {
            0 => return Ok(None),
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn respond(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    match (method, path) {
        ("POST", "/v1/chat/completions") => {
            let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            if request["stream"] == true {
                streamed(request["stream_options"]["include_usage"] == true)
            } else {
                whole("application/json", &completion().to_string())
            }
        }
        ("GET", "/v1/models") => whole(
            "application/json",
            &json!({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "hotbench"}]})
                .to_string(),
        ),
        ("GET", "/health") => whole("application/json", "{\"status\":\"ok\"}"),
        _ => b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_vec(),
    }
}

fn whole(content_type: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn usage() -> Value {
    json!({"prompt_tokens": 12, "completion_tokens": TOKENS.len(), "total_tokens": 12 + TOKENS.len()})
}

fn completion() -> Value {
    json!({
        "id": "chatcmpl-steady",
        "object": "chat.completion",
        "created": 1_764_000_000,
        "model": MODEL,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": TOKENS.concat()},
            "finish_reason": "stop",
        }],
        "usage": usage(),
    })
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-steady",
        "object": "chat.completion.chunk",
        "created": 1_764_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    })
}

/// The whole event stream at once, one chunk of the chunked encoding per
/// event, as an engine flushes them.
fn streamed(include_usage: bool) -> Vec<u8> {
    let mut events: Vec<String> = Vec::new();
    events.push(chunk(json!({"role": "assistant", "content": ""}), None).to_string());
    for t in TOKENS {
        events.push(chunk(json!({"content": t}), None).to_string());
    }
    events.push(chunk(json!({}), Some("stop")).to_string());
    if include_usage {
        let mut last = chunk(json!({}), None);
        last["choices"] = json!([]);
        last["usage"] = usage();
        events.push(last.to_string());
    }
    events.push("[DONE]".into());
    let mut out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for e in events {
        let event = format!("data: {e}\n\n");
        out.extend_from_slice(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes());
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}
