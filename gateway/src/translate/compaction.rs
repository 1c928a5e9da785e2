//! Compaction (`POST /v1/responses/compact`): what the model is asked, and
//! how a summary reads in a later prompt. The item's content format is
//! `api::compaction`'s.

/// The system instructions of a compaction pass when the request gives
/// none (the Codex CLI sends its own).
pub const DEFAULT_INSTRUCTIONS: &str = "You compact conversations. Write a summary of the \
conversation so far that lets it continue without the earlier messages: the user's goals and \
constraints, decisions made, facts and results established (file names, commands, values), \
and what remains to be done. Be concise; write only the summary.";

/// The last user turn of a compaction pass: the conversation is the
/// context, this is the ask.
pub const ASK: &str =
    "Summarise the conversation above for a handoff, as your instructions say. Reply with the summary only.";

/// The most tokens a summary may take.
pub const MAX_SUMMARY_TOKENS: i64 = 1024;

/// How a summary reads in a later prompt.
pub fn as_message_text(summary: &str) -> String {
    format!("Summary of the earlier conversation:\n{summary}")
}
