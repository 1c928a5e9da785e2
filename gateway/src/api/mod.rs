//! Public wire types, one module per endpoint family. These match the public
//! API byte for byte and stay apart from the worker protocol and from the
//! gateway's internal types.

pub mod bounds;
pub mod chat;
pub mod compaction;
pub mod event_log;
pub mod messages;
pub mod models;
pub mod responses;
