//! A request and its reply on a Pingora session: the [`Exchange`] (reading
//! the body, sending JSON and errors) and the one writer of streamed
//! replies ([`SseReply`]; their frames are `crate::sse`'s). The listener that creates
//! exchanges and routes them is `listener/`, above `routes/`.

pub mod exchange;
mod reply;

pub use exchange::Exchange;
pub use reply::{ClientGone, Quiet, SseReply};
