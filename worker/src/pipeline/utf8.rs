//! Incremental UTF-8 decoding of token bytes: a token may end inside a
//! multi-byte character, so bytes wait until the character is whole.

/// Turns a stream of byte chunks into valid UTF-8 text.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Appends bytes; returns the text that is complete so far.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: `valid_up_to` bytes are valid UTF-8.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Incomplete character at the end: wait for more.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Invalid bytes: replace them and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// The end of the stream: whatever is left, lossily.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_split_across_tokens_come_out_whole() {
        let text = "é🎉x";
        let bytes = text.as_bytes();
        let mut d = Utf8Stream::default();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&d.push(&[*b]));
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
        // The emoji's first three bytes yield nothing.
        let mut d = Utf8Stream::default();
        assert_eq!(d.push(&"🎉".as_bytes()[..3]), "");
        assert_eq!(d.push(&"🎉".as_bytes()[3..]), "🎉");
    }

    #[test]
    fn invalid_bytes_are_replaced_not_fatal() {
        let mut d = Utf8Stream::default();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xe2, 0x82]), "");
        assert_eq!(d.finish(), "\u{fffd}");
    }
}
