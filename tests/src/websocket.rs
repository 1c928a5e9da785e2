//! A client of Responses over WebSocket (`GET /v1/responses` upgraded), on
//! tokio-tungstenite: what the Codex CLI's transport does, for the tests.

use anyhow::{bail, Context, Result};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
pub use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
pub use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long one wait for a message may take before a test fails.
pub const WAIT: Duration = Duration::from_secs(15);

/// `ws://HOST:PORT/v1/responses` for a gateway's `http://HOST:PORT/v1`.
pub fn url(base_url: &str) -> String {
    format!("{}/responses", base_url.replacen("http", "ws", 1))
}

/// An open connection.
pub struct WsClient {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// Opens a connection with `Authorization: Bearer key` (none without a
/// key) and `headers`; a refused upgrade is `WsError::Http` with the
/// gateway's response.
pub async fn connect_with(
    base_url: &str,
    key: Option<&str>,
    headers: &[(&'static str, &str)],
) -> std::result::Result<WsClient, WsError> {
    let (ws, _) = tokio_tungstenite::connect_async(request(base_url, key, headers)?).await?;
    Ok(WsClient { ws })
}

/// [`connect`] over a socket whose receive buffer is fixed at `bytes` (no
/// autotuning): a client that stops reading stalls the server's writes
/// after a few megabytes rather than tens.
pub async fn connect_small_buffer(base_url: &str, key: &str, bytes: u32) -> Result<WsClient> {
    let addr = base_url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .context("a base URL with a host")?;
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(bytes)?;
    let stream = socket.connect(addr.parse()?).await?;
    let (ws, _) = tokio_tungstenite::client_async(
        request(base_url, Some(key), &[])?,
        MaybeTlsStream::Plain(stream),
    )
    .await?;
    Ok(WsClient { ws })
}

/// The upgrade request: the URL (`wss://` for an `https://` base URL),
/// `Authorization` when a key is given, and `headers`; for a client over a
/// stream of its own (`tokio_tungstenite::client_async`).
pub fn request(
    base_url: &str,
    key: Option<&str>,
    headers: &[(&'static str, &str)],
) -> std::result::Result<tokio_tungstenite::tungstenite::handshake::client::Request, WsError> {
    let mut request = url(base_url).into_client_request()?;
    if let Some(key) = key {
        request.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {key}")).expect("a header value"),
        );
    }
    for (name, value) in headers {
        request
            .headers_mut()
            .insert(*name, HeaderValue::from_str(value).expect("a header value"));
    }
    Ok(request)
}

/// Opens a connection with `key`, as the Codex CLI does (its beta header).
pub async fn connect(base_url: &str, key: &str) -> Result<WsClient> {
    connect_with(
        base_url,
        Some(key),
        &[("openai-beta", "responses_websockets=2026-02-06")],
    )
    .await
    .context("the WebSocket upgrade")
}

/// What a connection received next.
#[derive(Debug)]
pub enum Received {
    /// A text message, as JSON.
    Json(Value),
    /// A close frame (code and reason), or the connection ended without one
    /// (`None`).
    Closed(Option<(CloseCode, String)>),
    /// A ping from the server.
    Ping,
}

impl WsClient {
    /// Sends `value` as one text message.
    pub async fn send_json(&mut self, value: &Value) -> Result<()> {
        self.send_text(&value.to_string()).await
    }

    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.ws.send(Message::text(text)).await?;
        Ok(())
    }

    /// The next text message, close or ping (pongs skipped) within [`WAIT`].
    pub async fn next(&mut self) -> Result<Received> {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .context("no message in time")?;
            return Ok(match message {
                None => Received::Closed(None),
                Some(Err(WsError::ConnectionClosed | WsError::AlreadyClosed)) => {
                    Received::Closed(None)
                }
                Some(Err(WsError::Protocol(_) | WsError::Io(_))) => Received::Closed(None),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(Message::Text(t))) => Received::Json(
                    serde_json::from_str(t.as_str())
                        .with_context(|| format!("a JSON message: {t}"))?,
                ),
                Some(Ok(Message::Close(frame))) => {
                    Received::Closed(frame.map(|f| (f.code, f.reason.as_str().to_owned())))
                }
                Some(Ok(Message::Ping(_))) => Received::Ping,
                Some(Ok(Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Binary(b))) => bail!("a binary message: {b:?}"),
            });
        }
    }

    /// The next text message (pings skipped); fails on a close.
    pub async fn next_json(&mut self) -> Result<Value> {
        loop {
            match self.next().await? {
                Received::Json(v) => return Ok(v),
                Received::Ping => continue,
                Received::Closed(c) => bail!("the connection closed: {c:?}"),
            }
        }
    }

    /// Sends `{"type": "response.create", ...body}` and reads the reply:
    /// its events up to the terminal one, or the one error event.
    pub async fn create(&mut self, body: &Value) -> Result<Vec<Value>> {
        let mut event = body.clone();
        event["type"] = "response.create".into();
        self.send_json(&event).await?;
        self.reply().await
    }

    /// The events of one response up to its terminal event, or a lone
    /// error event.
    pub async fn reply(&mut self) -> Result<Vec<Value>> {
        let mut events = Vec::new();
        loop {
            let event = self.next_json().await?;
            let kind = event["type"].as_str().unwrap_or_default().to_owned();
            events.push(event);
            if kind == "error" && events.len() == 1 {
                return Ok(events);
            }
            if matches!(
                kind.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            ) {
                return Ok(events);
            }
        }
    }

    /// Waits for the server's close frame (text messages before it are
    /// returned too).
    pub async fn closed(&mut self) -> Result<(Vec<Value>, Option<(CloseCode, String)>)> {
        let mut before = Vec::new();
        loop {
            match self.next().await? {
                Received::Json(v) => before.push(v),
                Received::Ping => {}
                Received::Closed(c) => return Ok((before, c)),
            }
        }
    }
}
