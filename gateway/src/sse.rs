//! Server-sent event framing: every frame of a `text/event-stream` body the
//! gateway writes is framed here. Bytes only: the stream's head, writes and
//! end are `http::SseReply`'s.

use crate::error::{ApiError, WireError};
use bytes::{BufMut, BytesMut};
use serde::Serialize;

/// Appends one `data: {json}\n\n` frame.
pub fn data<T: Serialize>(out: &mut BytesMut, value: &T) {
    out.extend_from_slice(b"data: ");
    // Serializing our own wire structs into memory cannot fail.
    let _ = serde_json::to_writer((&mut *out).writer(), value);
    out.extend_from_slice(b"\n\n");
}

/// Appends the `data: [DONE]` frame that ends a chat stream.
pub fn done(out: &mut BytesMut) {
    out.extend_from_slice(b"data: [DONE]\n\n");
}

/// Appends the in-band failure of a chat stream that already started:
/// `data: {"error":{message,type,param,code,status}}`.
pub fn error(out: &mut BytesMut, error: &ApiError) {
    #[derive(Serialize)]
    struct ErrorFrame<'a> {
        error: WireError<'a>,
    }
    data(
        out,
        &ErrorFrame {
            error: error.wire(),
        },
    );
}

/// Appends one named event, `event: <name>\ndata: <json>\n\n` (Responses
/// streams), whose payload is already encoded.
pub fn event(out: &mut BytesMut, name: &str, json: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Appends a comment that keeps idle proxies from closing a quiet stream.
pub fn keepalive(out: &mut BytesMut) {
    out.extend_from_slice(b": keep-alive\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_byte_exact() {
        let mut out = BytesMut::new();
        data(&mut out, &serde_json::json!({"a": 1}));
        event(&mut out, "response.created", "{\"b\":2}");
        keepalive(&mut out);
        error(&mut out, &ApiError::upstream("gone"));
        done(&mut out);
        let text = std::str::from_utf8(&out).unwrap();
        let frames: Vec<&str> = text.split_inclusive("\n\n").collect();
        assert_eq!(frames[0], "data: {\"a\":1}\n\n");
        assert_eq!(frames[1], "event: response.created\ndata: {\"b\":2}\n\n");
        assert_eq!(frames[2], ": keep-alive\n\n");
        assert!(frames[3].starts_with("data: {\"error\":{"), "{}", frames[3]);
        assert_eq!(frames[4], "data: [DONE]\n\n");
    }
}
