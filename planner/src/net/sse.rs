//! Server-sent events of an agent's streamed reply: the `data` of each
//! event, within the body's limits.

use super::client::BodyReader;
use super::NetError;

/// Server-sent events of a body: the `data` of each event.
pub struct SseReader {
    body: BodyReader,
    buf: Vec<u8>,
    done: bool,
}

impl SseReader {
    /// Reads `body` as server-sent events.
    pub fn new(body: BodyReader) -> Self {
        Self {
            body,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The next event's data (its `data:` lines joined); `None` at the end.
    pub async fn next(&mut self) -> Result<Option<String>, NetError> {
        loop {
            if let Some(event) = take_event(&mut self.buf) {
                if let Some(data) = event_data(&event) {
                    return Ok(Some(data));
                }
                continue;
            }
            if self.done {
                return Ok(None);
            }
            match self.body.chunk().await? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => {
                    self.done = true;
                    // A last event without its blank line still counts.
                    if !self.buf.is_empty() {
                        self.buf.extend_from_slice(b"\n\n");
                    }
                }
            }
        }
    }
}

/// Removes the first complete event (up to a blank line) from `buf`.
fn take_event(buf: &mut Vec<u8>) -> Option<String> {
    let normalized_end = |b: &[u8]| -> Option<(usize, usize)> {
        for i in 0..b.len() {
            if b[i..].starts_with(b"\n\n") {
                return Some((i, 2));
            }
            if b[i..].starts_with(b"\r\n\r\n") {
                return Some((i, 4));
            }
        }
        None
    };
    let (at, sep) = normalized_end(buf)?;
    let event: Vec<u8> = buf.drain(..at + sep).collect();
    Some(String::from_utf8_lossy(&event[..at]).into_owned())
}

/// The `data` of one event, or `None` for an event without data (a
/// comment or keep-alive).
fn event_data(event: &str) -> Option<String> {
    let mut data: Option<String> = None;
    for line in event.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_split_on_blank_lines_and_join_data_lines() {
        let mut buf =
            b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\r\n\r\npartial".to_vec();
        let e1 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e1), None);
        let e2 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e2).as_deref(), Some("{\"a\":1}"));
        let e3 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e3).as_deref(), Some("x\ny"));
        assert!(take_event(&mut buf).is_none());
        assert_eq!(buf, b"partial");
    }
}
