//! [`WebSocket`]: a WebSocket (RFC 6455) on an upgraded Pingora session,
//! the transport of Responses over WebSocket.
//!
//! Pingora does the HTTP side: after a `101 Switching Protocols` head the
//! session's body reads and writes carry the connection's raw bytes (its
//! body reader turns close-delimited, its writer passes bytes through and
//! flushes each write). The WebSocket side is tungstenite's protocol layer,
//! used sans-IO: bytes read from the connection are handed to it through an
//! in-memory [`Pipe`], and the frames it produces (messages, pongs, the
//! close handshake) are taken from the pipe and written to the session.
//! Every write is one Pingora call, with its write timeout; reads of a
//! plain-TCP connection go to its socket directly ([`Socket`]: Pingora's
//! reads would keep a 64 KiB buffer per connection), over TLS through the
//! session. Nothing here spawns or splits the connection.
//!
//! Reading is cancel-safe ([`WebSocket::recv`] may be raced against a
//! worker's stream, as `SseReply::client_gone` is): its only await is one
//! read, which loses nothing when dropped, and tungstenite consumes what
//! was read synchronously. Writing is not, so nothing writes inside
//! such a race: replies that reading produced (pongs, an error event for a
//! message that arrived mid-response) wait in the pipe for the next
//! [`WebSocket::flush`].

use super::exchange::Exchange;
use super::ClientGone;
use crate::error::ApiError;
use crate::metrics::{GaugeGuard, METRICS};
use bytes::{Bytes, BytesMut};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocketConfig, WebSocketContext};
use tungstenite::{Error as WsError, Message};

/// How long a closing connection waits for the peer's close frame before
/// it drops the connection anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Why a WebSocket ends (the close code sent, when one is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// 1000: the purpose is fulfilled (an idle connection timed out).
    Normal,
    /// 1001: the server is going away (draining on SIGTERM).
    GoingAway,
    /// 1002: the peer broke the protocol.
    Protocol,
    /// 1007: a text message that is not UTF-8.
    InvalidData,
    /// 1008: the connection's rights are gone (its key revoked, its
    /// organisation blocked).
    Policy,
    /// 1009: a message over the size bound.
    TooBig,
}

impl Close {
    fn frame(self, reason: &str) -> CloseFrame {
        let code = match self {
            Close::Normal => CloseCode::Normal,
            Close::GoingAway => CloseCode::Away,
            Close::Protocol => CloseCode::Protocol,
            Close::InvalidData => CloseCode::Invalid,
            Close::Policy => CloseCode::Policy,
            Close::TooBig => CloseCode::Size,
        };
        CloseFrame {
            code,
            reason: reason.to_owned().into(),
        }
    }
}

/// What the client sent, one message (or one ending) at a time.
#[derive(Debug)]
pub enum Incoming {
    /// A text message, whole (fragments reassembled).
    Text(String),
    /// A binary message (this transport speaks JSON text only).
    Binary,
    /// A ping or a pong: the peer is alive. A ping's pong is queued.
    Control,
    /// The client sent a close frame (its reply is queued) or closed the
    /// connection, or reading failed.
    Gone,
    /// The client broke the protocol; the connection must close with this.
    Broken(Close),
}

/// The checked opening handshake of a WebSocket upgrade (RFC 6455 4.2.1).
#[derive(Debug)]
pub struct Handshake {
    accept: String,
}

impl Handshake {
    /// Whether the request asks to upgrade to a WebSocket (`Upgrade:
    /// websocket`); such a request is answered by the upgrade or a 4xx.
    pub fn requested(ex: &Exchange) -> bool {
        ex.header("upgrade")
            .is_some_and(|v| has_token(v, "websocket"))
    }

    /// Checks the upgrade request: HTTP/1.1 GET with `Connection: Upgrade`,
    /// `Upgrade: websocket`, `Sec-WebSocket-Version: 13` (426 with the
    /// version we speak otherwise) and a `Sec-WebSocket-Key`.
    pub fn check(ex: &mut Exchange) -> Result<Handshake, ApiError> {
        let bad = |message: &str| ApiError::new(400, "invalid_websocket_handshake", message);
        if ex.session.req_header().version != http::Version::HTTP_11 || ex.session.is_http2() {
            return Err(bad("A WebSocket upgrade needs HTTP/1.1."));
        }
        if !ex
            .header("connection")
            .is_some_and(|v| has_token(v, "upgrade"))
        {
            return Err(bad("A WebSocket upgrade needs 'Connection: Upgrade'."));
        }
        if !Self::requested(ex) {
            return Err(bad("A WebSocket upgrade needs 'Upgrade: websocket'."));
        }
        if ex.header("sec-websocket-version").map(<[u8]>::trim_ascii) != Some(b"13") {
            ex.extra_headers
                .push(("sec-websocket-version", "13".to_owned()));
            return Err(ApiError::new(
                426,
                "unsupported_websocket_version",
                "This server speaks WebSocket version 13 ('Sec-WebSocket-Version: 13').",
            ));
        }
        let key = ex
            .header("sec-websocket-key")
            .map(<[u8]>::trim_ascii)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| bad("A WebSocket upgrade needs a 'Sec-WebSocket-Key'."))?;
        Ok(Handshake {
            accept: tungstenite::handshake::derive_accept_key(key),
        })
    }
}

/// Whether a comma-separated header value holds `token` (case-insensitive).
fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Bytes between the session and tungstenite: what was read and not yet
/// parsed, and frames produced and not yet written.
#[derive(Debug, Default)]
struct Pipe {
    input: BytesMut,
    output: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.input.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.input.len());
        buf[..n].copy_from_slice(&self.input.split_to(n));
        if self.input.is_empty() {
            // All parsed: the read buffer goes until the next bytes come.
            self.input = BytesMut::new();
        }
        Ok(n)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The most bytes one read of the client's socket takes.
const READ_CHUNK: usize = 16 * 1024;

/// An upgraded plain-TCP connection's socket, read directly through a
/// duplicate of its descriptor (the same socket, registered apart from
/// Pingora's). Pingora's body reads reserve a 64 KiB buffer that the
/// session keeps for the connection's life, and most of it was resident
/// (an idle connection held about 117 KiB): here a read takes a buffer
/// only while bytes are there ([`Pipe`] lets it go once they are parsed).
/// Writes stay Pingora's. Not over TLS, whose bytes only Pingora's stream
/// decrypts. A client sends nothing before the `101` (RFC 6455 4.1), so
/// Pingora holds nothing read past the upgrade request.
struct Socket(AsyncFd<OwnedFd>);

impl Socket {
    fn of(ex: &Exchange) -> Option<Socket> {
        let tls = ex.session.digest().is_none_or(|d| d.ssl_digest.is_some());
        if tls {
            return None;
        }
        let fd = ex.session.stream()?.id();
        // SAFETY: `fd` is the session's open socket; F_DUPFD_CLOEXEC
        // returns a new descriptor (or -1) and touches nothing else.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return None;
        }
        // SAFETY: `copy` is a descriptor this process just opened and
        // nothing else owns.
        let copy = unsafe { OwnedFd::from_raw_fd(copy) };
        // SAFETY: an `OwnedFd` stays open, and is the same descriptor,
        // until the `AsyncFd` owning it drops.
        unsafe { AsyncFd::register_with_interest(copy, Interest::READABLE) }
            .ok()
            .map(Socket)
    }

    /// Reads what the client sent into `into`: the count, 0 at its end.
    /// Cancel-safe: only the wait awaits, and it reads nothing.
    async fn read(&self, into: &mut BytesMut) -> io::Result<usize> {
        loop {
            let mut ready = self.0.readable().await?;
            into.reserve(READ_CHUNK);
            let spare = into.spare_capacity_mut();
            let read = ready.try_io(|socket| {
                // SAFETY: `spare` is writable memory of `spare.len()` bytes
                // that `into` owns; recv writes at most that many.
                let n = unsafe {
                    libc::recv(
                        socket.as_raw_fd(),
                        spare.as_mut_ptr().cast(),
                        spare.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(n)) => {
                    // SAFETY: recv initialized the first `n` spare bytes.
                    unsafe { into.set_len(into.len() + n) };
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                // Not readable after all: wait again.
                Err(_would_block) => {}
            }
        }
    }
}

/// A WebSocket on an upgraded exchange (server role).
pub struct WebSocket<'a> {
    ex: &'a mut Exchange,
    ws: WebSocketContext,
    pipe: Pipe,
    /// The client's socket, read directly (plain TCP; see [`Socket`]).
    socket: Option<Socket>,
    /// The close code this side sent, once it did.
    closed: Option<Close>,
    /// How the client broke the protocol, once it did.
    broken: Option<Close>,
    /// The `gateway_websocket_connections` gauge, counted while it lives.
    _open: GaugeGuard,
}

impl<'a> WebSocket<'a> {
    /// Sends `101 Switching Protocols` and speaks WebSocket from then on;
    /// a message (whole, or one frame) over `max_message_bytes` ends the
    /// connection with 1009. `Err` means the client is gone.
    pub async fn accept(
        ex: &'a mut Exchange,
        handshake: Handshake,
        max_message_bytes: usize,
    ) -> Result<WebSocket<'a>, ClientGone> {
        let headers = [
            ("upgrade", "websocket".to_owned()),
            ("connection", "Upgrade".to_owned()),
            ("sec-websocket-accept", handshake.accept),
        ];
        if ex.write_switching_protocols(&headers).await.is_err() {
            ex.client_left();
            return Err(ClientGone);
        }
        // Pingora times body reads out after 60 s; a connection waits for
        // its client as long as the route's own timers (pings, the idle
        // timeout) allow.
        ex.session.set_read_timeout(None);
        // Small buffers (a connection idles most of its life; the read
        // buffer grows to the message when one is large), no write batching
        // inside tungstenite (the pipe is memory; batching is ours).
        let config = WebSocketConfig::default()
            .read_buffer_size(4096)
            .write_buffer_size(0)
            .max_message_size(Some(max_message_bytes))
            .max_frame_size(Some(max_message_bytes));
        let socket = Socket::of(ex);
        Ok(WebSocket {
            ex,
            ws: WebSocketContext::new(Role::Server, Some(config)),
            pipe: Pipe::default(),
            socket,
            closed: None,
            broken: None,
            _open: GaugeGuard::new(&METRICS.websocket_connections),
        })
    }

    /// The exchange the connection was upgraded from (request id, trace).
    pub fn exchange(&self) -> &Exchange {
        self.ex
    }

    /// The next message or ending. Cancel-safe: see the module's notes.
    pub async fn recv(&mut self) -> Incoming {
        loop {
            match self.ws.read(&mut self.pipe) {
                Ok(Message::Text(text)) => return Incoming::Text(text.as_str().to_owned()),
                Ok(Message::Binary(_)) => return Incoming::Binary,
                Ok(Message::Ping(_) | Message::Pong(_)) => {
                    // Moves a queued pong into the pipe for the next flush.
                    let _ = self.ws.flush(&mut self.pipe);
                    return Incoming::Control;
                }
                // The peer's close frame: tungstenite queued the reply.
                Ok(Message::Close(_)) => {
                    let _ = self.ws.flush(&mut self.pipe);
                    return Incoming::Gone;
                }
                Ok(Message::Frame(_)) => {}
                Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    let read = match &self.socket {
                        Some(socket) => socket.read(&mut self.pipe.input).await.ok(),
                        None => match self.ex.session.read_request_body().await {
                            Ok(Some(bytes)) => {
                                self.pipe.input.extend_from_slice(&bytes);
                                Some(bytes.len())
                            }
                            Ok(None) => Some(0),
                            Err(_) => None,
                        },
                    };
                    if !matches!(read, Some(n) if n > 0) {
                        return Incoming::Gone;
                    }
                }
                Err(WsError::Capacity(_)) => return self.break_with(Close::TooBig),
                Err(WsError::Utf8(_)) => return self.break_with(Close::InvalidData),
                Err(WsError::Protocol(_)) => return self.break_with(Close::Protocol),
                Err(_) => return Incoming::Gone,
            }
        }
    }

    fn break_with(&mut self, code: Close) -> Incoming {
        self.broken = Some(code);
        Incoming::Broken(code)
    }

    /// How the client broke the protocol, if it did (the close code due).
    pub fn broken(&self) -> Option<Close> {
        self.broken
    }

    /// Queues a text message (sent by the next [`Self::flush`]).
    pub fn queue_text(&mut self, text: String) {
        // Into memory; fails only once closed, when nothing more is sent.
        let _ = self.ws.write(&mut self.pipe, Message::Text(text.into()));
    }

    /// Queues a ping.
    pub fn queue_ping(&mut self) {
        let _ = self.ws.write(&mut self.pipe, Message::Ping(Bytes::new()));
    }

    /// Whether anything waits to be written.
    pub fn has_pending(&self) -> bool {
        !self.pipe.output.is_empty()
    }

    /// The bytes waiting to be written.
    pub fn pending_bytes(&self) -> usize {
        self.pipe.output.len()
    }

    /// Writes everything queued, in one write bounded by the session's
    /// write timeout: a client that stops reading is gone after it, so a
    /// slow reader never makes the gateway buffer more than one batch.
    pub async fn flush(&mut self) -> Result<(), ClientGone> {
        let _ = self.ws.flush(&mut self.pipe);
        if self.pipe.output.is_empty() {
            return Ok(());
        }
        let out = Bytes::from(std::mem::take(&mut self.pipe.output));
        self.ex
            .session
            .write_response_body(out, false)
            .await
            .map_err(|_| ClientGone)
    }

    /// Closes with `code`: the close frame goes out after whatever is
    /// queued, then the peer's close is awaited briefly (the close
    /// handshake; RFC 6455 wants the server to close TCP first, which the
    /// listener does once this returns).
    pub async fn close(&mut self, code: Close, reason: &str) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(code);
        let _ = self.ws.close(&mut self.pipe, Some(code.frame(reason)));
        if self.flush().await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            loop {
                if matches!(self.recv().await, Incoming::Gone | Incoming::Broken(_)) {
                    return;
                }
            }
        })
        .await;
    }

    /// Writes what the peer's close left queued (the close reply) without
    /// waiting for anything.
    pub async fn finish(&mut self) {
        let _ = self.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_tokens() {
        assert!(has_token(b"keep-alive, Upgrade", "upgrade"));
        assert!(has_token(b"WebSocket", "websocket"));
        assert!(!has_token(b"websockets", "websocket"));
        assert!(!has_token(b"", "upgrade"));
    }

    #[test]
    fn the_pipe_would_block_when_empty() {
        let mut pipe = Pipe::default();
        let mut buf = [0u8; 4];
        assert_eq!(
            pipe.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        pipe.input.extend_from_slice(b"abcdef");
        assert_eq!(pipe.read(&mut buf).unwrap(), 4);
        assert_eq!(&buf, b"abcd");
        assert_eq!(pipe.read(&mut buf).unwrap(), 2);
        pipe.write_all(b"xy").unwrap();
        assert_eq!(pipe.output, b"xy");
    }

    /// Frames a client would send (masked: a client-role context writes
    /// them), through the server's protocol layer as `recv` drives it: a
    /// fragmented text message reassembled, a ping answered with a pong, a
    /// close answered.
    #[test]
    fn the_protocol_layer_over_the_pipe() {
        use tungstenite::protocol::frame::coding::{Data, OpCode};
        use tungstenite::protocol::frame::Frame;
        let mut client = WebSocketContext::new(Role::Client, None);
        let mut wire = Pipe::default();
        for message in [
            Message::Frame(Frame::message(
                Bytes::from_static(b"{\"type\":"),
                OpCode::Data(Data::Text),
                false,
            )),
            Message::Ping(Bytes::from_static(b"hi")),
            Message::Frame(Frame::message(
                Bytes::from_static(b"\"x\"}"),
                OpCode::Data(Data::Continue),
                true,
            )),
        ] {
            client.write(&mut wire, message).unwrap();
        }
        client.close(&mut wire, None).unwrap();

        let mut ws = WebSocketContext::new(Role::Server, None);
        let mut pipe = Pipe::default();
        pipe.input.extend_from_slice(&wire.output);
        // The ping between the fragments comes first, and is answered.
        assert!(matches!(ws.read(&mut pipe).unwrap(), Message::Ping(_)));
        ws.flush(&mut pipe).unwrap();
        assert_eq!(
            &pipe.output[..4],
            &[0x8a, 2, b'h', b'i'],
            "an unmasked pong"
        );
        match ws.read(&mut pipe).unwrap() {
            Message::Text(t) => assert_eq!(t.as_str(), "{\"type\":\"x\"}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(ws.read(&mut pipe).unwrap(), Message::Close(None)));
    }
}
