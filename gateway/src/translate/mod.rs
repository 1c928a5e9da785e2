//! Translation between the public wire types and the worker protocol, one
//! module per API family, plus the small pieces both share.

pub mod chat;
pub mod planner;
pub mod responses;

use bytes::{BufMut, BytesMut};
use inference_proto::v1 as pb;
use serde::Serialize;

/// The public `finish_reason` for a worker's finish.
pub fn finish_reason(reason: i32) -> &'static str {
    match pb::finished::Reason::try_from(reason) {
        Ok(pb::finished::Reason::Length) => "length",
        Ok(pb::finished::Reason::ToolCalls) => "tool_calls",
        _ => "stop",
    }
}

/// Appends one `data: {json}\n\n` frame.
pub fn sse_data<T: Serialize>(out: &mut BytesMut, value: &T) {
    out.extend_from_slice(b"data: ");
    // Serializing our own wire structs into memory cannot fail.
    let _ = serde_json::to_writer((&mut *out).writer(), value);
    out.extend_from_slice(b"\n\n");
}

/// Appends the in-band failure of a chat stream that already started:
/// `data: {"error":{message,type,param,code,status}}`.
pub fn sse_error(out: &mut BytesMut, error: &crate::error::ApiError) {
    #[derive(Serialize)]
    struct ErrorFrame<'a> {
        error: crate::error::WireError<'a>,
    }
    sse_data(
        out,
        &ErrorFrame {
            error: error.wire(),
        },
    );
}

/// Appends one `event: <type>\ndata: {json}\n\n` frame (Responses streams).
pub fn sse_event<T: Serialize>(out: &mut BytesMut, event: &str, value: &T) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\n");
    sse_data(out, value);
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `prefix` + 24 random alphanumerics: ids such as `chatcmpl-…`, `resp_…`.
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    for _ in 0..24 {
        id.push(ALPHABET[rng.random_range(0..ALPHABET.len())] as char);
    }
    id
}
