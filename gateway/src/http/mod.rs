//! A request and its reply on a Pingora session: the [`Exchange`] (reading
//! the body, sending JSON and errors), the one writer of streamed
//! replies ([`SseReply`]; their frames are `crate::sse`'s), and the
//! WebSocket an upgraded exchange becomes ([`WebSocket`]). The listener that creates
//! exchanges and routes them is `listener/`, above `routes/`.

pub mod exchange;
mod reply;
pub mod websocket;

pub use exchange::{Dialect, Exchange};
pub use reply::{ClientGone, Pumped, SseReply};
pub use websocket::WebSocket;
