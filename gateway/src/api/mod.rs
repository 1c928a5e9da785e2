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

/// The length of a value's compact JSON encoding, counted without
/// building it (sizes of what a request would make the gateway copy).
pub fn encoded_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail; a value that cannot be encoded
    // counts what was written before it stopped.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    #[test]
    fn encoded_len_is_the_length_of_the_encoding() {
        let v = serde_json::json!({"a": [1, "é", null], "b": {"c": true}});
        assert_eq!(
            super::encoded_len(&v),
            serde_json::to_vec(&v).unwrap().len()
        );
    }
}
