//! Translation between the public wire types and the worker protocol, one
//! module per API family, plus the small pieces both share. Their SSE
//! frames are framed by `crate::sse`.

pub mod chat;
pub mod compaction;
pub mod messages;
pub mod planner;
pub mod replay;
pub mod responses;

use inference_proto::v1 as pb;

/// The public `finish_reason` for a worker's finish.
pub fn finish_reason(reason: i32) -> &'static str {
    match pb::finished::Reason::try_from(reason) {
        Ok(pb::finished::Reason::Length) => "length",
        Ok(pb::finished::Reason::ToolCalls) => "tool_calls",
        _ => "stop",
    }
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
