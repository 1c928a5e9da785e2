//! `[websocket]`: the timers and caps of Responses WebSocket connections.

use serde::Deserialize;

/// `[websocket]`: the timers of a Responses WebSocket connection. Its
/// message size bound is `max_body_bytes` and each write's bound is
/// `write_timeout_seconds`, as for any request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSocketConfig {
    /// A connection with no response running and nothing sent either way
    /// for this long gets a ping; a ping unanswered for as long again ends
    /// the connection (a peer that vanished without closing).
    #[serde(default = "default_ws_ping_interval")]
    pub ping_interval_seconds: u64,
    /// A connection on which no `response.create` arrived (and none ran)
    /// for this long is closed (1000, "idle timeout"): pings keep a dead
    /// peer from holding it, this keeps an idle live one from doing so.
    #[serde(default = "default_ws_idle_timeout")]
    pub idle_timeout_seconds: u64,
    /// The longest a connection lives: past it, once no response is
    /// running, it is closed (1001, "connection lifetime reached") and the
    /// client reconnects, as it does on OpenAI's 60-minute limit. Bounds
    /// how long one connection pins its replica and its connection-local
    /// state.
    #[serde(default = "default_ws_max_connection")]
    pub max_connection_seconds: u64,
    /// The most connections one key holds open on this replica at once (an
    /// upgrade past it: 429 `too_many_connections`); 0: no cap. Each costs
    /// memory for as long as it is open, whatever its plan's rate limits.
    #[serde(default = "default_ws_max_connections_per_key")]
    pub max_connections_per_key: u32,
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            ping_interval_seconds: default_ws_ping_interval(),
            idle_timeout_seconds: default_ws_idle_timeout(),
            max_connection_seconds: default_ws_max_connection(),
            max_connections_per_key: default_ws_max_connections_per_key(),
        }
    }
}

fn default_ws_ping_interval() -> u64 {
    30
}
fn default_ws_idle_timeout() -> u64 {
    900
}
fn default_ws_max_connection() -> u64 {
    3600
}
fn default_ws_max_connections_per_key() -> u32 {
    64
}
