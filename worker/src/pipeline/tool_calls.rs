//! Tool calls parsed from the model's output while it streams.
//!
//! The format is the one the tool-call constraint enforces (see
//! [`super::request`]): one JSON object `{"name": ..., "arguments": {...}}`,
//! or a JSON array of them for parallel calls. Each call becomes proto
//! `ToolCallDelta`s: the first carries `id` and `name` (once), later ones
//! only fragments of the arguments' JSON text, as the tokens arrive.

use crate::seam::tokens::fnv1a;
use inference_proto::v1 as pb;

/// Incremental parser of the tool-call JSON.
#[derive(Debug)]
pub struct ToolCallParser {
    id_seed: String,
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// The depth of the call object being read.
    call_depth: Option<u32>,
    /// The string being read at the call's depth (a key or the name).
    string: String,
    last_string: Option<String>,
    /// The key whose value is being read.
    key: Option<String>,
    name: Option<String>,
    /// Inside the `arguments` value.
    in_args: bool,
    /// Arguments text not yet sent (before the header went out).
    args_buffer: String,
    args_seen: bool,
    args_started: bool,
    header_sent: bool,
    index: u32,
}

impl ToolCallParser {
    /// `id_seed` makes call ids unique per request (the request id).
    pub fn new(id_seed: &str) -> Self {
        Self {
            id_seed: id_seed.to_owned(),
            depth: 0,
            in_string: false,
            escaped: false,
            call_depth: None,
            string: String::new(),
            last_string: None,
            key: None,
            name: None,
            in_args: false,
            args_buffer: String::new(),
            args_seen: false,
            args_started: false,
            header_sent: false,
            index: 0,
        }
    }

    /// Calls completed or begun so far.
    pub fn calls(&self) -> u32 {
        self.index + u32::from(self.call_depth.is_some())
    }

    /// Feeds output text; returns the deltas it completes.
    pub fn push(&mut self, text: &str) -> Vec<pb::ToolCallDelta> {
        let mut out = Vec::new();
        let mut fragment = String::new();
        for c in text.chars() {
            self.step(c, &mut fragment, &mut out);
        }
        self.flush_fragment(&mut fragment, &mut out);
        out
    }

    fn step(&mut self, c: char, fragment: &mut String, out: &mut Vec<pb::ToolCallDelta>) {
        let Some(call_depth) = self.call_depth else {
            // Between calls: only structure matters.
            if !self.in_string && c == '{' {
                self.depth += 1;
                self.call_depth = Some(self.depth);
            } else if !self.in_string && c == '[' {
                self.depth += 1;
            } else if !self.in_string && (c == ']' || c == '}') {
                self.depth = self.depth.saturating_sub(1);
            }
            return;
        };
        if self.in_args {
            // Whitespace before the value is not part of the arguments.
            if !self.args_started {
                if c.is_whitespace() {
                    return;
                }
                self.args_started = true;
            }
            let ends = !self.in_string && self.depth == call_depth && (c == ',' || c == '}');
            if !ends {
                self.track_nesting(c);
                fragment.push(c);
                return;
            }
            self.in_args = false;
            self.key = None;
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
                self.string.push(c);
            } else if c == '\\' {
                self.escaped = true;
                self.string.push(c);
            } else if c == '"' {
                self.in_string = false;
                let s = unescape(&self.string);
                self.string.clear();
                if self.depth == call_depth && self.key.as_deref() == Some("name") {
                    self.name = Some(s);
                    self.key = None;
                    self.send_header(fragment, out);
                } else {
                    self.last_string = Some(s);
                }
            } else {
                self.string.push(c);
            }
            return;
        }
        match c {
            '"' => self.in_string = true,
            ':' if self.depth == call_depth => {
                self.key = self.last_string.take();
                if self.key.as_deref() == Some("arguments") {
                    self.in_args = true;
                    self.args_seen = true;
                    self.args_started = false;
                }
            }
            ',' if self.depth == call_depth => self.key = None,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth < call_depth {
                    self.end_call(fragment, out);
                }
            }
            _ => {}
        }
    }

    /// Nesting inside the arguments value (strings included, verbatim).
    fn track_nesting(&mut self, c: char) {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
            }
            return;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => self.depth = self.depth.saturating_sub(1),
            _ => {}
        }
    }

    fn call_id(&self) -> String {
        let h = fnv1a(format!("{}/{}", self.id_seed, self.index).as_bytes());
        format!("call_{h:016x}")
    }

    fn send_header(&mut self, fragment: &mut String, out: &mut Vec<pb::ToolCallDelta>) {
        if self.header_sent {
            return;
        }
        self.header_sent = true;
        out.push(pb::ToolCallDelta {
            index: self.index,
            id: self.call_id(),
            name: self.name.clone().unwrap_or_default(),
            arguments_fragment: String::new(),
        });
        // Arguments that came before the name.
        let early = std::mem::take(&mut self.args_buffer);
        fragment.insert_str(0, &early);
    }

    fn flush_fragment(&mut self, fragment: &mut String, out: &mut Vec<pb::ToolCallDelta>) {
        if fragment.is_empty() {
            return;
        }
        if !self.header_sent {
            self.args_buffer.push_str(fragment);
            fragment.clear();
            return;
        }
        out.push(pb::ToolCallDelta {
            index: self.index,
            arguments_fragment: std::mem::take(fragment),
            ..Default::default()
        });
    }

    fn end_call(&mut self, fragment: &mut String, out: &mut Vec<pb::ToolCallDelta>) {
        self.send_header(fragment, out);
        if !self.args_seen {
            fragment.push_str("{}");
        }
        self.flush_fragment(fragment, out);
        self.index += 1;
        self.call_depth = None;
        self.name = None;
        self.key = None;
        self.last_string = None;
        self.in_args = false;
        self.args_seen = false;
        self.header_sent = false;
    }
}

/// What a reply that may call tools (`tool_choice` auto) is, from its
/// start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detected {
    /// Not known yet: hold the text.
    Undecided,
    /// Text: release what was held as text.
    Text,
    /// A call of a listed tool: parse what was held as calls.
    Call,
}

/// Decides whether a reply is a tool call, the way the listing asks a model
/// to write one: a reply that starts (after whitespace, optionally inside a
/// `[`) with `{"name": "<a listed tool>"` is one; anything else is text,
/// released as soon as it cannot be a call any more.
#[derive(Debug)]
pub struct CallDetector {
    names: Vec<String>,
    held: String,
}

/// Held at most while undecided (a name longer than this is no tool's).
const MAX_HELD: usize = 512;

impl CallDetector {
    pub fn new(names: &[String]) -> Self {
        Self {
            names: names.to_vec(),
            held: String::new(),
        }
    }

    /// Adds text; once decided, [`CallDetector::take`] gives what was held.
    pub fn push(&mut self, text: &str) -> Detected {
        self.held.push_str(text);
        let d = self.classify();
        if d == Detected::Undecided && self.held.len() > MAX_HELD {
            return Detected::Text;
        }
        d
    }

    /// The text held so far.
    pub fn take(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    fn classify(&self) -> Detected {
        use Detected::{Call, Text, Undecided};
        // Each step: the rest after a token of the pattern, `None` when the
        // text ended before it (undecided), `Some(Err)` when it differs.
        fn token<'a>(s: &'a str, t: &str) -> Result<&'a str, Detected> {
            let s = s.trim_start();
            if s.is_empty() || (s.len() < t.len() && t.starts_with(s)) {
                return Err(Undecided);
            }
            s.strip_prefix(t).ok_or(Text)
        }
        let s = self.held.as_str();
        let s = match token(s, "[") {
            Ok(rest) => rest,
            Err(Undecided) => return Undecided,
            Err(_) => s,
        };
        let steps = ["{", "\"name\"", ":", "\""];
        let mut s = s;
        for t in steps {
            s = match token(s, t) {
                Ok(rest) => rest,
                Err(d) => return d,
            };
        }
        match s.find(['"', '\\']) {
            None => Undecided,
            Some(end) if s[end..].starts_with('"') && self.names.iter().any(|n| *n == s[..end]) => {
                Call
            }
            Some(_) => Text,
        }
    }
}

/// A JSON string body (between the quotes) to its value.
fn unescape(body: &str) -> String {
    serde_json::from_str::<String>(&format!("\"{body}\"")).unwrap_or_else(|_| body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in chunks of `n` chars; returns (id, name, args) per call.
    fn parse(text: &str, n: usize) -> Vec<(String, String, String)> {
        let mut p = ToolCallParser::new("req");
        let chars: Vec<char> = text.chars().collect();
        let mut deltas = Vec::new();
        for chunk in chars.chunks(n) {
            deltas.extend(p.push(&chunk.iter().collect::<String>()));
        }
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for d in deltas {
            if !d.id.is_empty() {
                assert_eq!(d.index as usize, calls.len(), "one header per call");
                calls.push((d.id, d.name, d.arguments_fragment));
            } else {
                assert!(d.name.is_empty());
                let call = calls.get_mut(d.index as usize).expect("header first");
                call.2.push_str(&d.arguments_fragment);
            }
        }
        calls
    }

    #[test]
    fn one_call_streams_id_and_name_once_then_arguments() {
        let text = r#"{"name": "get_weather", "arguments": {"city": "Paris, \"FR\"", "days": [1, {"x": 2}]}}"#;
        for n in [1, 2, 3, 7, 1000] {
            let calls = parse(text, n);
            assert_eq!(calls.len(), 1, "chunk {n}");
            assert!(calls[0].0.starts_with("call_"));
            assert_eq!(calls[0].1, "get_weather");
            let args: serde_json::Value = serde_json::from_str(&calls[0].2).expect("json args");
            assert_eq!(args["city"], "Paris, \"FR\"");
            assert_eq!(args["days"][1]["x"], 2);
        }
    }

    #[test]
    fn parallel_calls_in_an_array_get_their_own_index_and_id() {
        let text = r#"[{"name":"a","arguments":{}},{"name":"b\u0021","arguments":{"k":"}"}}]"#;
        let calls = parse(text, 4);
        assert_eq!(calls.len(), 2);
        assert_eq!((calls[0].1.as_str(), calls[0].2.as_str()), ("a", "{}"));
        assert_eq!(
            (calls[1].1.as_str(), calls[1].2.as_str()),
            ("b!", r#"{"k":"}"}"#)
        );
        assert_ne!(calls[0].0, calls[1].0);
    }

    fn detect(text: &str, n: usize) -> (Detected, String) {
        let mut d = CallDetector::new(&["get_weather".to_owned(), "a".to_owned()]);
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(n) {
            let r = d.push(&chunk.iter().collect::<String>());
            if r != Detected::Undecided {
                return (r, d.take());
            }
        }
        (Detected::Undecided, d.take())
    }

    #[test]
    fn a_reply_that_starts_as_a_call_of_a_listed_tool_is_one() {
        for n in [1, 3, 100] {
            let call = r#" {"name": "get_weather", "arguments": {}}"#;
            assert_eq!(detect(call, n).0, Detected::Call, "chunk {n}");
            let parallel = r#"[{"name":"a","arguments":{}}, {"name":"get_weather"}]"#;
            assert_eq!(detect(parallel, n).0, Detected::Call, "chunk {n}");
            for text in [
                "Hello there",
                r#"{"name": "Alice", "age": 3}"#,
                r#"{"answer": 1}"#,
                "[1, 2]",
                r#"{"name": "get_weather_v2"}"#,
            ] {
                let (d, held) = detect(text, n);
                assert_eq!(d, Detected::Text, "{text} chunk {n}");
                assert!(text.starts_with(&held), "held a prefix: {held}");
            }
        }
        assert_eq!(detect(r#"{"na"#, 1).0, Detected::Undecided);
        // Decided text is released as soon as it cannot be a call.
        assert_eq!(detect("Hi", 1), (Detected::Text, "H".to_owned()));
    }

    #[test]
    fn arguments_before_the_name_wait_for_it() {
        let calls = parse(r#"{"arguments": {"q": 1}, "name": "search"}"#, 3);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].1, "search");
        assert_eq!(calls[0].2, r#"{"q": 1}"#);
    }
}
