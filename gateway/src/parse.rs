//! JSON bodies into typed requests, with errors that name the field.
//!
//! Serde alone says *what* went wrong; `serde_path_to_error` adds *where*,
//! which becomes the envelope's `param` in dot notation (`messages.0.content`).

use crate::api::bounds;
use crate::error::ApiError;
use serde::de::DeserializeOwned;
use serde_path_to_error::{Path, Segment};

/// Parses a request body. Failures map to 400 with a stable `code`:
/// `invalid_json` (syntax, with line and column), `unknown_parameter`,
/// `missing_required_parameter`, `invalid_type` or `invalid_value`.
pub fn json_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let text = match std::str::from_utf8(body) {
        Ok(t) => t,
        Err(e) => {
            return Err(ApiError::invalid_json(format!(
                "The request body is not valid UTF-8 (invalid byte at offset {}); send JSON encoded as UTF-8.",
                e.valid_up_to()
            )))
        }
    };
    // A byte-order mark is legal UTF-8 but not JSON; some clients send one.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.bytes().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::invalid_json(
            "The request body is empty; send a JSON object.",
        ));
    }
    // Serde would also read a struct from a JSON array (by position); a
    // request body is an object, and saying so is clearer than any error
    // about element counts.
    let first = text.trim_start().as_bytes().first().copied();
    if first != Some(b'{')
        && matches!(
            first,
            Some(b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
        )
    {
        return Err(ApiError::invalid_type(
            "body",
            "The request body must be a JSON object.",
        ));
    }
    // Fast path: plain serde. Only a failing body pays for a second pass
    // that tracks the path of the culprit. Each pass has the request's own
    // budget of elements and schema bytes (`api::bounds`).
    if let Ok(value) = bounds::per_request(|| serde_json::from_str(text)) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_str(text);
    // Bounded recursion is serde_json's default (128 levels): deeply nested
    // input fails cleanly as a syntax error instead of exhausting the stack.
    let value =
        bounds::per_request(|| serde_path_to_error::deserialize(&mut de)).map_err(classify)?;
    de.end().map_err(|e| {
        ApiError::invalid_json(format!(
            "Invalid JSON body: trailing characters at line {} column {}.",
            e.line(),
            e.column()
        ))
    })?;
    Ok(value)
}

fn classify(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let msg = e.inner().to_string();
    // A bound of `api::bounds` found inside a value names the value.
    let coded = bounds::split_code(&msg);
    let path = dot_path(e.path(), coded.as_ref().map_or(0, |c| c.depth));
    let inner = e.into_inner();
    match inner.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            ApiError::invalid_json(format!(
                "Invalid JSON body at line {} column {}: {}",
                inner.line(),
                inner.column(),
                strip_position(&msg)
            ))
        }
        serde_json::error::Category::Io => {
            ApiError::invalid_json("The request body could not be read.")
        }
        serde_json::error::Category::Data => {
            if let Some(field) = between(&msg, "unknown field `", "`") {
                return ApiError::unknown_parameter(join(&path, field));
            }
            if let Some(field) = between(&msg, "missing field `", "`") {
                return ApiError::missing_parameter(join(&path, field));
            }
            if msg.starts_with("unknown variant") {
                // Internally tagged enums report the object; the culprit is its `type`.
                return ApiError::invalid_value(
                    join(&path, "type"),
                    format!(
                        "Invalid value for '{}': {}",
                        join(&path, "type"),
                        strip_position(&msg)
                    ),
                );
            }
            let param = if path.is_empty() {
                "body".to_string()
            } else {
                path
            };
            if let Some(c) = coded {
                return ApiError::new(
                    400,
                    c.code,
                    format!("Invalid value for '{param}': {}", strip_position(c.message)),
                )
                .with_param(param);
            }
            if msg.starts_with("invalid type") || msg.starts_with("data did not match") {
                ApiError::invalid_type(
                    param.clone(),
                    format!("Invalid type for '{param}': {}", strip_position(&msg)),
                )
            } else {
                ApiError::invalid_value(
                    param.clone(),
                    format!("Invalid value for '{param}': {}", strip_position(&msg)),
                )
            }
        }
    }
}

/// `messages[0].content` → `messages.0.content`, without its last `drop`
/// segments.
fn dot_path(path: &Path, drop: usize) -> String {
    let segments: Vec<&Segment> = path
        .iter()
        .filter(|s| !matches!(s, Segment::Unknown))
        .collect();
    let mut out = String::new();
    for seg in &segments[..segments.len().saturating_sub(drop)] {
        let piece = match seg {
            Segment::Seq { index } => index.to_string(),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => continue,
        };
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(&piece);
    }
    out
}

/// Appends `field` unless the path already ends with it (serde_path_to_error
/// includes the offending key for unknown fields and enum tags).
fn join(path: &str, field: &str) -> String {
    if path == field || path.ends_with(&format!(".{field}")) {
        path.to_string()
    } else if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(start)?;
    rest.find(end).map(|i| &rest[..i])
}

/// serde_json appends " at line L column C"; the message states it once.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ").map_or(msg, |i| &msg[..i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::bounds::{MAX_CONTENT_PARTS, MAX_MESSAGES};
    use crate::api::chat::ChatCompletionRequest;

    fn err(body: &str) -> ApiError {
        json_body::<ChatCompletionRequest>(body.as_bytes()).unwrap_err()
    }

    #[test]
    fn syntax_error_names_the_position() {
        let e = err("{\"model\": \"base\",\n \"messages\": [}");
        assert_eq!((e.status, e.code.as_ref()), (400, "invalid_json"));
        assert!(e.message.contains("line 2"), "{}", e.message);
    }

    #[test]
    fn empty_body_is_invalid_json() {
        assert_eq!(err("  ").code, "invalid_json");
    }

    #[test]
    fn unknown_top_level_field_is_named() {
        let e = err(r#"{"model":"base","messages":[],"max_token":3}"#);
        assert_eq!(e.code, "unknown_parameter");
        assert_eq!(e.param.as_deref(), Some("max_token"));
    }

    #[test]
    fn wrong_type_names_the_dot_path() {
        let e = err(r#"{"model":"base","messages":[{"role":"user","content":5}]}"#);
        assert_eq!(e.code, "invalid_type");
        assert_eq!(e.param.as_deref(), Some("messages.0.content"));
        let e = err(r#"{"model":"base","messages":[],"temperature":"hot"}"#);
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_type", Some("temperature"))
        );
    }

    #[test]
    fn unknown_part_type_points_at_type() {
        let e =
            err(r#"{"model":"base","messages":[{"role":"user","content":[{"type":"video"}]}]}"#);
        assert_eq!(e.code, "invalid_value");
        assert_eq!(e.param.as_deref(), Some("messages.0.content.0.type"));
    }

    #[test]
    fn deep_nesting_fails_cleanly() {
        let deep = format!(
            "{{\"model\":\"base\",\"metadata\":{}{}}}",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(err(&deep).status, 400);
    }

    #[test]
    fn invalid_utf8_is_invalid_json_with_offset() {
        let e = json_body::<ChatCompletionRequest>(b"{\"model\":\"ba\xffse\"}").unwrap_err();
        assert_eq!((e.status, e.code.as_ref()), (400, "invalid_json"));
        assert!(e.message.contains("offset 12"), "{}", e.message);
    }

    #[test]
    fn byte_order_mark_is_tolerated() {
        let r = json_body::<ChatCompletionRequest>("\u{feff}{\"model\":\"base\"}".as_bytes());
        assert_eq!(r.unwrap().model.as_deref(), Some("base"));
    }

    #[test]
    fn non_object_bodies_are_invalid_type() {
        for body in ["[]", "5", "\"x\"", "null"] {
            let e = err(body);
            assert_eq!((e.status, e.code.as_ref()), (400, "invalid_type"), "{body}");
            assert_eq!(e.param.as_deref(), Some("body"));
        }
    }

    /// A chat body with `n` messages of `message`.
    fn chat_with(n: usize, message: &str) -> String {
        let mut body = String::with_capacity(n * (message.len() + 1) + 40);
        body.push_str(r#"{"model":"base","messages":["#);
        for i in 0..n {
            if i > 0 {
                body.push(',');
            }
            body.push_str(message);
        }
        body.push_str("]}");
        body
    }

    #[test]
    fn message_count_is_bounded() {
        let m = r#"{"role":"user","content":"x"}"#;
        let ok = json_body::<ChatCompletionRequest>(chat_with(MAX_MESSAGES, m).as_bytes());
        assert_eq!(ok.unwrap().messages.map(|v| v.len()), Some(MAX_MESSAGES));
        let e = err(&chat_with(MAX_MESSAGES + 1, m));
        assert_eq!((e.status, e.code.as_ref()), (400, "invalid_value"));
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("4096"), "{}", e.message);
    }

    #[test]
    fn content_parts_per_message_are_bounded() {
        let parts = |n: usize| vec![r#"{"type":"text","text":"x"}"#; n].join(",");
        let body = |n| {
            format!(
                r#"{{"model":"base","messages":[{{"role":"user","content":"hi"}},{{"role":"user","content":[{}]}}]}}"#,
                parts(n)
            )
        };
        assert!(json_body::<ChatCompletionRequest>(body(MAX_CONTENT_PARTS).as_bytes()).is_ok());
        let e = err(&body(MAX_CONTENT_PARTS + 1));
        assert_eq!(e.code, "invalid_value");
        assert_eq!(e.param.as_deref(), Some("messages.1.content"));
    }

    #[test]
    fn input_items_and_their_parts_are_bounded() {
        use crate::api::responses::CreateResponseRequest;
        let resp = |input: String| {
            json_body::<CreateResponseRequest>(
                format!(r#"{{"model":"base","input":[{input}]}}"#).as_bytes(),
            )
        };
        let item = r#"{"role":"user","content":"x"}"#;
        assert!(resp(vec![item; MAX_MESSAGES].join(",")).is_ok());
        let e = resp(vec![item; MAX_MESSAGES + 1].join(",")).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("input"))
        );
        let part = r#"{"type":"input_text","text":"x"}"#;
        let many = format!(
            r#"{{"role":"user","content":[{}]}}"#,
            vec![part; MAX_CONTENT_PARTS + 1].join(",")
        );
        let e = resp(many).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("input.0.content"))
        );
    }

    /// The audit's body: 16 MiB of 570,000 empty messages. Before the bound
    /// it parsed in full (about a CPU-second) and failed only in validation;
    /// now parsing stops after the 4,097th message.
    #[test]
    fn a_flood_of_empty_messages_is_refused_cheaply() {
        let body = chat_with(570_000, r#"{"role":"user","content":""}"#);
        assert!(body.len() > 15 << 20, "{} bytes", body.len());
        let started = std::time::Instant::now();
        let e = err(&body);
        let took = started.elapsed();
        // What the old, unbounded parse of the same array costs, for the note.
        let array = &body[r#"{"model":"base","messages":"#.len()..body.len() - 1];
        let started = std::time::Instant::now();
        let all: Vec<crate::api::chat::ChatMessage> = serde_json::from_str(array).unwrap();
        let unbounded = started.elapsed();
        println!(
            "{} bytes, {} empty messages: refused in {took:?}; an unbounded parse takes {unbounded:?}",
            body.len(),
            all.len()
        );
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(took < std::time::Duration::from_millis(250), "{took:?}");
    }

    /// The audit's 614,400 empty content parts in 16 MB (600 messages of
    /// 1,024, each message within its own bound) were accepted after 0.34
    /// CPU-seconds: parts now count against the request's element budget.
    #[test]
    fn a_flood_of_empty_content_parts_is_refused_cheaply() {
        let part = r#"{"type":"text","text":""}"#;
        let message = format!(
            r#"{{"role":"user","content":[{}]}}"#,
            vec![part; MAX_CONTENT_PARTS].join(",")
        );
        let body = chat_with(600, &message);
        assert!(body.len() > 15 << 20, "{} bytes", body.len());
        let started = std::time::Instant::now();
        let e = err(&body);
        let took = started.elapsed();
        println!("614,400 empty content parts refused in {took:?}");
        assert_eq!((e.status, e.code.as_ref()), (400, "invalid_value"));
        // Three values a part: the budget runs out in the 22nd message.
        assert_eq!(
            e.param.as_deref(),
            Some("messages.21.content"),
            "{}",
            e.message
        );
        assert!(e.message.contains("65536 elements"), "{}", e.message);
        assert!(took < std::time::Duration::from_millis(250), "{took:?}");
        // The same on the Responses API.
        let part = r#"{"type":"input_text","text":""}"#;
        let item = format!(
            r#"{{"role":"user","content":[{}]}}"#,
            vec![part; MAX_CONTENT_PARTS].join(",")
        );
        let body = format!(
            r#"{{"model":"base","input":[{}]}}"#,
            vec![item.as_str(); 600].join(",")
        );
        let e =
            json_body::<crate::api::responses::CreateResponseRequest>(body.as_bytes()).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some("input.21.content"),
            "{}",
            e.message
        );
    }

    /// A content part is an internally tagged enum, which serde buffers
    /// whole before reading its `type`: a huge unknown field used to be
    /// copied value by value. It is now refused once over the budget.
    #[test]
    fn a_content_part_with_a_huge_field_is_refused() {
        let body = format!(
            r#"{{"model":"base","messages":[{{"role":"user","content":[{{"type":"text","text":"x","junk":[{}0]}}]}}]}}"#,
            "0,".repeat(2_000_000)
        );
        let e = err(&body);
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("messages.0.content"))
        );
        // Within the budget, unknown fields of a part are still tolerated.
        let ok = r#"{"model":"base","messages":[{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}]}"#;
        assert!(json_body::<ChatCompletionRequest>(ok.as_bytes()).is_ok());
        let e = err(
            r#"{"model":"base","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}"#,
        );
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_type", Some("messages.0.content.0"))
        );
        let e = err(r#"{"model":"base","messages":[{"role":"user","content":[{"text":"x"}]}]}"#);
        assert_eq!(e.param.as_deref(), Some("messages.0.content.0.type"));
    }

    /// The audit's tool parameters: 8.3M zeros in a 16 MiB body. Refused
    /// as `schema_too_large`, naming the schema, after 256 KiB of it.
    #[test]
    fn oversized_schemas_are_refused_with_their_param() {
        let zeros = format!(r#"{{"type":"object","x":[{}0]}}"#, "0,".repeat(8_300_000));
        let body = format!(
            r#"{{"model":"base","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{zeros}}}}}]}}"#
        );
        let started = std::time::Instant::now();
        let e = err(&body);
        println!(
            "16 MiB of tool parameters refused in {:?}",
            started.elapsed()
        );
        assert_eq!(
            (e.status, e.code.as_ref(), e.param.as_deref()),
            (400, "schema_too_large", Some("tools.0.function.parameters"))
        );
        // Two bytes a value: the element budget runs out first.
        assert!(e.message.contains("65536 elements"), "{}", e.message);
        use crate::api::responses::CreateResponseRequest;
        let resp = |extra: String| {
            json_body::<CreateResponseRequest>(
                format!(r#"{{"model":"base","input":"hi",{extra}}}"#).as_bytes(),
            )
            .unwrap_err()
        };
        let big = format!(r#"{{"description":"{}"}}"#, "d".repeat(300_000));
        for (extra, param) in [
            (
                format!(
                    r#""text":{{"format":{{"type":"json_schema","name":"a","schema":{big}}}}}"#
                ),
                "text.format.schema",
            ),
            (
                format!(
                    r#""response_format":{{"type":"json_schema","json_schema":{{"name":"a","schema":{big}}}}}"#
                ),
                "response_format.json_schema.schema",
            ),
            (
                format!(r#""tools":[{{"type":"function","name":"f","parameters":{big}}}]"#),
                "tools.0.parameters",
            ),
            (
                format!(
                    r#""tools":[{{"type":"function","function":{{"name":"f","parameters":{big}}}}}]"#
                ),
                "tools.0.function.parameters",
            ),
        ] {
            let e = resp(extra);
            assert_eq!(
                (e.code.as_ref(), e.param.as_deref()),
                ("schema_too_large", Some(param))
            );
        }
    }

    #[test]
    fn metadata_and_stop_strings_name_their_culprit() {
        let e = err(r#"{"model":"base","metadata":{"a":"b","c":5}}"#);
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_type", Some("metadata.c"))
        );
        let e = err(&format!(
            r#"{{"model":"base","metadata":{{"a":"{}"}}}}"#,
            "v".repeat(513)
        ));
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("metadata.a"))
        );
        let e = err(&format!(
            r#"{{"model":"base","metadata":{{"{}":"v"}}}}"#,
            "k".repeat(65)
        ));
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("metadata"))
        );
        let stops = vec!["x".repeat(4_000_000); 4];
        let e = err(&format!(
            r#"{{"model":"base","stop":["a","b",{}]}}"#,
            serde_json::to_string(&stops[0]).unwrap()
        ));
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("stop.2"))
        );
        assert!(
            e.message.contains("at most 256 characters"),
            "{}",
            e.message
        );
        let e = err(r#"{"model":"base","stop":["a","b","c","d","e"]}"#);
        assert_eq!(e.param.as_deref(), Some("stop"));
    }

    #[test]
    fn trailing_garbage_is_rejected() {
        let e = json_body::<ChatCompletionRequest>(br#"{"model":"base"} x"#).unwrap_err();
        assert_eq!(e.code, "invalid_json");
    }
}
