//! A misbehaving OpenAI-compatible engine on loopback, to put behind an
//! `upstream` worker (`--upstream-kind openai`). A tiny HTTP/1.1 server on
//! raw sockets (one request per connection, `connection: close`), so it can
//! do what a real engine does when it breaks: accept and never answer, send
//! the head and then nothing, go silent mid-stream, ignore `max_tokens`, or
//! send a line that never ends.
//!
//! `GET /v1/models` and `GET /health` always answer 200: the engine looks
//! healthy whatever its generations do. The behavior of chat completions is
//! switched at run time ([`FakeEngine::set`]); every stalling behavior also
//! stalls the worker's non-streamed probes, as a wedged engine would.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The model id the engine lists.
pub const MODEL: &str = "fake-model";

/// What chat completions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// Honours `max_tokens` (at most 5 tokens, `tok0 ` to `tok4 `), then
    /// finish, usage, `[DONE]`; a stop string `tokN` ends the reply before
    /// that token, named as vLLM names it (`stop_reason`).
    Normal,
    /// Reads the request and never answers.
    StallBeforeHead,
    /// Sends the 200 head of an event stream, then nothing.
    HeadThenNothing,
    /// Streams this many tokens, then goes silent (connection kept open).
    StallAfter(u32),
    /// Streams this many one-character tokens whatever `max_tokens` says.
    IgnoreMaxTokens(u32),
    /// `data: {...` and then bytes without a newline, until the reader
    /// hangs up.
    EndlessLine,
}

/// What the engine saw.
#[derive(Debug, Default)]
struct Seen {
    /// The body of the last streamed chat completion.
    last_streamed: Mutex<Option<Value>>,
    streamed: AtomicU64,
    probes: AtomicU64,
    /// Replies the reader hung up on before they ended.
    hung_up: AtomicU64,
    /// Bytes of endless lines written.
    endless_bytes: AtomicU64,
}

struct Shared {
    behavior: Mutex<Behavior>,
    seen: Seen,
}

/// A running fake engine; it stops when dropped.
pub struct FakeEngine {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl FakeEngine {
    /// Listens on a free loopback port, on a runtime of its own (the
    /// harness starts workers synchronously, and a worker waits for this
    /// engine's `/v1/models` before it is ready).
    pub fn start(behavior: Behavior) -> Result<FakeEngine> {
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").context("binding the fake engine")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let shared = Arc::new(Shared {
            behavior: Mutex::new(behavior),
            seen: Seen::default(),
        });
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("fake engine runtime")?;
        let state = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("fake-engine-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = accept_loop(listener, state) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime aborts every connection task.
            })?;
        Ok(FakeEngine {
            addr,
            shared,
            _shutdown: shutdown,
        })
    }

    /// `http://127.0.0.1:PORT`, for `--upstream-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set(&self, behavior: Behavior) {
        if let Ok(mut b) = self.shared.behavior.lock() {
            *b = behavior;
        }
    }

    /// Streamed chat completions received.
    pub fn streamed(&self) -> u64 {
        self.shared.seen.streamed.load(Ordering::Relaxed)
    }

    /// The body of the last streamed chat completion received: what the
    /// worker sent its engine.
    pub fn last_streamed_request(&self) -> Option<Value> {
        self.shared.seen.last_streamed.lock().ok()?.clone()
    }

    /// Non-streamed chat completions received (the worker's stall probes).
    pub fn probes(&self) -> u64 {
        self.shared.seen.probes.load(Ordering::Relaxed)
    }

    /// Replies the worker hung up on before they ended.
    pub fn hung_up(&self) -> u64 {
        self.shared.seen.hung_up.load(Ordering::Relaxed)
    }

    /// Bytes of endless lines written before the worker hung up.
    pub fn endless_bytes(&self) -> u64 {
        self.shared.seen.endless_bytes.load(Ordering::Relaxed)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((sock, _)) = listener.accept().await {
        let _ = sock.set_nodelay(true);
        tokio::spawn(serve(sock, Arc::clone(&shared)));
    }
}

/// One request: head and `content-length` body.
async fn read_request(sock: &mut TcpStream) -> Option<(String, String, Value)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())
                    .flatten()
            })
            .unwrap_or(0);
        if buf.len() < end + 4 + length {
            continue;
        }
        let mut words = head.split_whitespace();
        let method = words.next()?.to_owned();
        let path = words.next()?.to_owned();
        let body = serde_json::from_slice(&buf[end + 4..end + 4 + length]).unwrap_or(Value::Null);
        return Some((method, path, body));
    }
}

async fn serve(mut sock: TcpStream, shared: Arc<Shared>) {
    let Some((method, path, body)) = read_request(&mut sock).await else {
        return;
    };
    let behavior = shared
        .behavior
        .lock()
        .map(|b| *b)
        .unwrap_or(Behavior::Normal);
    match (method.as_str(), path.as_str()) {
        ("GET", "/v1/models") => {
            let models = json!({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 8192}]});
            let _ = write_json(&mut sock, &models).await;
        }
        ("GET", "/health") => {
            let _ = write_json(&mut sock, &json!({})).await;
        }
        ("POST", "/v1/chat/completions") => chat(sock, &shared, behavior, &body).await,
        _ => {
            let _ = sock
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
        }
    }
}

async fn write_json(sock: &mut TcpStream, value: &Value) -> std::io::Result<()> {
    let body = value.to_string();
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body.as_bytes()).await
}

const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

fn delta(text: &str) -> String {
    let chunk = json!({"object": "chat.completion.chunk", "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

fn ending(reason: &str, completion_tokens: u32) -> String {
    ending_stopped(reason, None, completion_tokens)
}

/// The finish (with the stop string that ended the reply, as vLLM names
/// it in `stop_reason`), usage and `[DONE]`.
fn ending_stopped(reason: &str, stop_reason: Option<&str>, completion_tokens: u32) -> String {
    let finish = json!({"object": "chat.completion.chunk", "model": MODEL,
        "choices": [{"index": 0, "delta": {}, "finish_reason": reason, "stop_reason": stop_reason}]});
    let usage = json!({"object": "chat.completion.chunk", "model": MODEL, "choices": [],
        "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens,
                  "total_tokens": 7 + completion_tokens}});
    format!("data: {finish}\n\ndata: {usage}\n\ndata: [DONE]\n\n")
}

/// Waits until the reader hangs up (a stalled engine holds its sockets).
async fn hold(sock: &mut TcpStream) {
    let mut sink = [0u8; 1024];
    while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
}

async fn chat(mut sock: TcpStream, shared: &Shared, behavior: Behavior, body: &Value) {
    let seen = &shared.seen;
    let streamed = body["stream"].as_bool().unwrap_or(false);
    if streamed {
        seen.streamed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = seen.last_streamed.lock() {
            *last = Some(body.clone());
        }
    } else {
        seen.probes.fetch_add(1, Ordering::Relaxed);
    }
    let max_tokens = body["max_tokens"]
        .as_u64()
        .or_else(|| body["max_completion_tokens"].as_u64())
        .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX));
    let stalls = matches!(
        behavior,
        Behavior::StallBeforeHead | Behavior::HeadThenNothing | Behavior::StallAfter(_)
    );
    if !streamed {
        // A wedged engine does not answer a one-token request either.
        if stalls {
            hold(&mut sock).await;
            return;
        }
        let reply = json!({"object": "chat.completion", "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}});
        let _ = write_json(&mut sock, &reply).await;
        return;
    }
    if behavior == Behavior::StallBeforeHead {
        hold(&mut sock).await;
        return;
    }
    if sock.write_all(SSE_HEAD).await.is_err() {
        return;
    }
    let outcome = match behavior {
        Behavior::Normal => {
            let stops: Vec<&str> = body["stop"]
                .as_array()
                .map(|s| s.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let stopped_at =
                (0..max_tokens.min(5)).find(|i| stops.contains(&format!("tok{i}").as_str()));
            let n = stopped_at.unwrap_or(max_tokens.min(5));
            let mut text: String = (0..n).map(|i| delta(&format!("tok{i} "))).collect();
            let reason = if stopped_at.is_some() || n == 5 {
                "stop"
            } else {
                "length"
            };
            let stop_reason = stopped_at.map(|i| format!("tok{i}"));
            text.push_str(&ending_stopped(reason, stop_reason.as_deref(), n));
            sock.write_all(text.as_bytes()).await
        }
        Behavior::StallBeforeHead | Behavior::HeadThenNothing => {
            hold(&mut sock).await;
            return;
        }
        Behavior::StallAfter(n) => {
            let text: String = (0..n).map(|i| delta(&format!("tok{i} "))).collect();
            if sock.write_all(text.as_bytes()).await.is_ok() {
                hold(&mut sock).await;
            }
            return;
        }
        Behavior::IgnoreMaxTokens(n) => ignore_max_tokens(&mut sock, n).await,
        Behavior::EndlessLine => endless_line(&mut sock, seen).await,
    };
    if outcome.is_err() {
        seen.hung_up.fetch_add(1, Ordering::Relaxed);
    }
}

/// `n` one-character tokens at a few thousand a second (an engine decoding
/// fast), so a reader that hangs up early is seen hanging up.
async fn ignore_max_tokens(sock: &mut TcpStream, n: u32) -> std::io::Result<()> {
    for i in 0..n {
        sock.write_all(delta("x").as_bytes()).await?;
        if i % 8 == 7 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    sock.write_all(ending("stop", n).as_bytes()).await
}

/// Up to 1 GiB on one line, in 64 KiB writes.
async fn endless_line(sock: &mut TcpStream, seen: &Seen) -> std::io::Result<()> {
    sock.write_all(br#"data: {"choices":[{"delta":{"content":""#)
        .await?;
    let block = vec![b'x'; 64 * 1024];
    for _ in 0..16 * 1024 {
        sock.write_all(&block).await?;
        seen.endless_bytes
            .fetch_add(block.len() as u64, Ordering::Relaxed);
    }
    Ok(())
}
