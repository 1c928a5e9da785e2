//! A deadline on the public listener's TLS handshakes. Pingora gives a
//! handshake 60 s (fixed in its listening service), so a client that opens
//! connections and never finishes them holds a socket and a task each for
//! a minute. Before each handshake (Pingora's pre-TLS hook) a watchdog is
//! started on a duplicate of the connection's socket; the connection
//! reaching the HTTP layer ([`HandshakeDeadline::reached_http`], called
//! first thing for each of its requests) stops it; otherwise, after
//! `[tls] handshake_timeout_seconds`, it shuts the socket down, which ends
//! the handshake at once (logged at debug, like every failed handshake).
//!
//! Connections are known by their peer address: unique among open
//! connections of one listener. The duplicate keeps the socket open until
//! its watchdog ends, so a failed handshake's socket closes at most one
//! timeout late.

use async_trait::async_trait;
use pingora_core::listeners::PreTlsProcess;
use pingora_core::protocols::l4::stream::Stream as L4Stream;
use pingora_core::protocols::GetSocketDigest;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

pub struct HandshakeDeadline {
    timeout: Duration,
    /// Connections whose handshake is under way, by peer address.
    pending: Mutex<HashMap<SocketAddr, Arc<Notify>>>,
}

impl HandshakeDeadline {
    pub fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            timeout,
            pending: Mutex::new(HashMap::new()),
        })
    }

    /// The connection from `peer` finished its handshake: its watchdog
    /// stops. Cheap when it is not pending (every later request).
    pub fn reached_http(&self, peer: Option<&SocketAddr>) {
        let Some(peer) = peer else { return };
        let done = self.pending().remove(peer);
        if let Some(done) = done {
            done.notify_one();
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Notify>>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the watchdog of one connection's handshake.
    fn watch(self: &Arc<Self>, peer: SocketAddr, socket: OwnedFd) {
        let done = Arc::new(Notify::new());
        self.pending().insert(peer, done.clone());
        let this = self.clone();
        tokio::spawn(async move {
            let finished = tokio::time::timeout(this.timeout, done.notified())
                .await
                .is_ok();
            if !finished {
                {
                    let mut pending = this.pending();
                    if pending.get(&peer).is_some_and(|d| Arc::ptr_eq(d, &done)) {
                        pending.remove(&peer);
                    }
                }
                // SAFETY: `socket` is our own duplicate, open until dropped
                // below; shutting it down ends the connection it shares with
                // Pingora's descriptor, never another one.
                unsafe { libc::shutdown(socket.as_raw_fd(), libc::SHUT_RDWR) };
                tracing::debug!(%peer, timeout = ?this.timeout, "tls: handshake not finished in time; connection closed");
            }
            drop(socket);
        });
    }
}

/// The pre-TLS hook: the watchdog of each new connection.
pub struct Hook(pub Arc<HandshakeDeadline>);

#[async_trait]
impl PreTlsProcess for Hook {
    async fn process(&self, stream: &mut L4Stream) -> pingora_core::Result<()> {
        let peer = stream
            .get_socket_digest()
            .and_then(|d| d.peer_addr().and_then(|a| a.as_inet()).copied());
        let Some(peer) = peer else { return Ok(()) };
        // SAFETY: `dup` of a descriptor the stream holds open; the result
        // is owned (closed on drop) by the watchdog alone.
        let copy = unsafe { libc::dup(stream.as_raw_fd()) };
        if copy < 0 {
            // Out of descriptors: Pingora's own 60 s still bounds it.
            return Ok(());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(copy) };
        self.0.watch(peer, socket);
        Ok(())
    }
}
