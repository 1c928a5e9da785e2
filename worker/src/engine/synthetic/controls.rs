//! Test controls of the SIMULATED engine, read from the last user message.
//!
//! - `synthetic:reply_tokens=N`: the text reply is exactly N tokens (still
//!   capped by `max_tokens`, which then finishes `length`).
//! - `synthetic:fail_after=N`: after N completion tokens the stream ends with
//!   an INTERNAL status and reason `ENGINE_FAILURE` (N = 0: before any token).
//! - `synthetic:fail_unavailable`: with `fail_after`, the failure is an
//!   UNAVAILABLE status (a worker losing its device), which the gateway
//!   maps to 503 before the first token.
//! - `synthetic:trailers_ms=N`: hold the stream open N milliseconds after
//!   `Finished` before ending it (late trailers), so a test can see whether
//!   the gateway reads a finished call to its end or resets it.
//! - `synthetic:hang`: send nothing and wait until the stream is dropped.
//! - `synthetic:slow_ms=N`: N milliseconds between tokens (overrides
//!   `--tokens-per-second`).
//! - `synthetic:echo`: the reply is the last user message's text, verbatim.
//! - `synthetic:echo_messages`: the reply lists every message the worker
//!   received, one line each: `role: text`, with `[image]` for image parts,
//!   `name(arguments)` for tool calls and `(tool_call_id)` on tool results.
//!   For asserting what the gateway sent (history, `previous_response_id`).
//! - `synthetic:json_replies=<json> <json> ...` (in any user message): when a
//!   JSON format is requested, reply with the k-th value, k being the number
//!   of assistant messages after that user message (see
//!   `synthetic::scripted_json_reply`); for tests of multi-call callers
//!   such as the planner.
//! - `synthetic:ignore_format`: answer in plain words even when a JSON
//!   format was requested, as an engine whose constrained decoding failed
//!   would; for testing the gateway's output check.
//! - `synthetic:tool_path=<path>` (up to the next whitespace): a tool
//!   call's string arguments whose name ends in `path` (`path`,
//!   `file_path`) name `<path>`, and its optional arguments are left out
//!   (a generated `offset` or `limit` would read none of a real file), so
//!   an agent under test (Claude Code, Codex) really reads that file.

/// The controls found in a message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Controls {
    pub reply_tokens: Option<u32>,
    pub fail_after: Option<u32>,
    pub fail_unavailable: bool,
    pub trailers_ms: Option<u64>,
    pub hang: bool,
    pub slow_ms: Option<u64>,
    pub echo: bool,
    pub echo_messages: bool,
    pub ignore_format: bool,
    pub tool_path: Option<String>,
}

impl Controls {
    /// Scans text for `synthetic:` directives.
    pub fn parse(text: &str) -> Self {
        let mut c = Controls::default();
        if !text.contains("synthetic:") {
            return c;
        }
        for (at, _) in text.match_indices("synthetic:") {
            let rest = &text[at + "synthetic:".len()..];
            let directive: &str = rest
                .split(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == '='))
                .next()
                .unwrap_or("");
            match directive.split_once('=') {
                Some(("reply_tokens", n)) => c.reply_tokens = n.parse().ok(),
                Some(("fail_after", n)) => c.fail_after = n.parse().ok(),
                Some(("slow_ms", n)) => c.slow_ms = n.parse().ok(),
                Some(("trailers_ms", n)) => c.trailers_ms = n.parse().ok(),
                None if directive == "fail_unavailable" => c.fail_unavailable = true,
                None if directive == "hang" => c.hang = true,
                None if directive == "echo" => c.echo = true,
                None if directive == "echo_messages" => c.echo_messages = true,
                None if directive == "ignore_format" => c.ignore_format = true,
                _ => {}
            }
            // A path holds characters the directives above stop at.
            if let Some(path) = rest.strip_prefix("tool_path=") {
                let path = path.split(char::is_whitespace).next().unwrap_or("");
                c.tool_path = (!path.is_empty()).then(|| path.to_owned());
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_directive() {
        let c = Controls::parse(
            "hi synthetic:reply_tokens=12, then synthetic:fail_after=3 synthetic:slow_ms=5 \
             (synthetic:hang) synthetic:echo.",
        );
        assert_eq!(
            c,
            Controls {
                reply_tokens: Some(12),
                fail_after: Some(3),
                fail_unavailable: false,
                trailers_ms: None,
                hang: true,
                slow_ms: Some(5),
                echo: true,
                echo_messages: false,
                ignore_format: false,
                tool_path: None,
            }
        );
        assert!(Controls::parse("synthetic:ignore_format").ignore_format);
        assert_eq!(
            Controls::parse("read it synthetic:tool_path=/tmp/x y/a.txt now").tool_path,
            Some("/tmp/x".to_owned())
        );
        let c = Controls::parse("synthetic:fail_unavailable synthetic:trailers_ms=400");
        assert!(c.fail_unavailable);
        assert_eq!(c.trailers_ms, Some(400));
        assert_eq!(Controls::parse("plain text"), Controls::default());
        let c = Controls::parse("synthetic:echo_messages");
        assert!(c.echo_messages && !c.echo);
        assert_eq!(
            Controls::parse("synthetic:reply_tokens=x").reply_tokens,
            None
        );
    }
}
