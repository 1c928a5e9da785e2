//! Bounds on the arrays a request body may hold, checked while the body is
//! parsed (serde helpers for the wire types): a body built to cost parsing
//! time is refused after `limit` elements, not after all of them.

/// Most messages (chat `messages`) or input items (responses `input`) in a
/// request. Long agent sessions (the Codex CLI resends its whole history)
/// reach hundreds of items; 4,096 leaves an order of magnitude of room,
/// and any more, even empty, is a body built to cost parsing time.
pub const MAX_MESSAGES: usize = 4096;

/// Most content parts in one message or input item: a message of text and
/// images needs a handful; 1,024 is far beyond any real use.
pub const MAX_CONTENT_PARTS: usize = 1024;

/// Reads a JSON array into a `Vec`, failing as soon as it holds more than
/// `limit` elements: the rest of the body is never parsed, so a huge array
/// of tiny elements is refused for the cost of `limit` of them. The error
/// is a data error, so `parse::json_body` reports it as `invalid_value` with the
/// array's path as `param`.
pub fn bounded_seq<'de, A, T>(mut seq: A, limit: usize, what: &str) -> Result<Vec<T>, A::Error>
where
    A: serde::de::SeqAccess<'de>,
    T: serde::Deserialize<'de>,
{
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(limit).min(64));
    while let Some(item) = seq.next_element()? {
        if out.len() == limit {
            return Err(serde::de::Error::custom(format!(
                "more than {limit} {what}; send at most {limit}"
            )));
        }
        out.push(item);
    }
    Ok(out)
}
