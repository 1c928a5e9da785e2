//! What the simulator says: a whole reply planned from the prompt before
//! its first token, deterministically from the prompt and
//! `sampling.seed`, as o200k tokens.
//!
//! - A prompt that opens a think section (reasoning enabled) gets
//!   reasoning: 20..=60 words, cut by the sequence's `max_tokens` (the
//!   pipeline's reasoning budget), then the end of the turn; the pipeline
//!   closes the section and starts the answer.
//! - Under a tool-call constraint (`required` or a named choice) the reply
//!   is the call JSON: the offered tools the last user message mentions (in
//!   order of mention), else the first offered; one unless the constraint
//!   is an array (parallel calls). Arguments are instances of each tool's
//!   schema.
//! - Under another constraint (`json_object`, `json_schema`) the reply is a
//!   small object or an instance of the schema, unless a test control says
//!   otherwise (`json_replies`, `ignore_format`).
//! - With tools listed and no constraint (`auto`), a reply to a last user
//!   message that names tools (whole word) is the call JSON, the way the
//!   listing asks a model to write it (an array of calls when the listing
//!   allows several); the pipeline detects and parses it. Not after a tool
//!   result, which the reply quotes in text.
//! - Otherwise text: 16..=48 words (or `synthetic:reply_tokens=N`), or the
//!   test controls in [`super::controls`].

use super::controls::Controls;
use super::conversation::{Conversation, Message, Phase, Tool};
use super::rng::{Rng, WORDS};
use super::schema_gen;
use super::tokenizer::{self, Token};
use crate::seam::sequence::{Constraint, SeqEnd, Sequence, IMAGE_PLACEHOLDER};
use crate::status;
use serde_json::Value;
use tonic::Status;

/// A reply decided before streaming.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplyScript {
    /// At most the sequence's `max_tokens`.
    pub tokens: Vec<Token>,
    /// How the sequence ends after them.
    pub end: SeqEnd,
    pub controls: Controls,
    /// Reasoning in a think section (the answer follows in a sequence of
    /// its own).
    pub thinking: bool,
    /// The answer after a think section: its prompt prefix is the
    /// reasoning's, already in the cache (no time to first token).
    pub after_think: bool,
}

/// Writes the reply to a sequence.
pub fn write(sequence: &Sequence) -> Result<ReplyScript, Status> {
    let conv = Conversation::parse(&tokenizer::decode(&sequence.prompt));
    let last_user = conv.last_user_text();
    let controls = Controls::parse(&last_user);
    let seed = sequence.sampling.seed.unwrap_or(0);
    let mut rng = Rng::new(prompt_hash(&sequence.prompt) ^ seed.rotate_left(17));
    let mut tokens = match conv.phase {
        Phase::Think => {
            let n = rng.range(20, 60) as usize;
            word_tokens(&mut rng, n)
        }
        Phase::Answer | Phase::AfterThink => {
            reply(&conv, sequence, &controls, &last_user, &mut rng)?
        }
    };
    let max = sequence.max_tokens as usize;
    let end = if tokens.len() > max {
        tokens.truncate(max);
        SeqEnd::MaxTokens
    } else {
        SeqEnd::EndOfGeneration
    };
    Ok(ReplyScript {
        tokens,
        end,
        controls,
        thinking: conv.phase == Phase::Think,
        after_think: conv.phase == Phase::AfterThink,
    })
}

fn reply(
    conv: &Conversation,
    sequence: &Sequence,
    controls: &Controls,
    last_user: &str,
    rng: &mut Rng,
) -> Result<Vec<Token>, Status> {
    if let Some(Constraint::JsonSchema(schema)) = &sequence.constraint {
        let schema = without_guidance(schema);
        if conv.call_now {
            if let Some((calls, array)) = constrained_calls(&schema, last_user) {
                return calls_text(&calls, array, controls, rng).map(|t| tokenizer::tokens(&t));
            }
        }
        // `ignore_format` plays an engine whose constrained decoding failed:
        // plain words whatever format was asked for.
        if !controls.ignore_format {
            if let Some(reply) = scripted_json_reply(&conv.messages) {
                return Ok(tokenizer::tokens(&reply));
            }
            let v = if schema == serde_json::json!({"type": "object"}) {
                schema_gen::generic_object(rng)
            } else {
                schema_gen::generate(&schema, rng)
            };
            return Ok(tokenizer::tokens(&v.to_string()));
        }
    } else if !conv.tools.is_empty() && conv.messages.last().is_none_or(|m| m.role != "tool") {
        let tools: Vec<&Tool> = conv.tools.iter().collect();
        let mut calls: Vec<(&str, Option<&Value>)> = mentioned(&tools, last_user, |t| &t.name)
            .into_iter()
            .map(|t| (t.name.as_str(), t.parameters.as_ref()))
            .collect();
        if !conv.parallel {
            calls.truncate(1);
        }
        if !calls.is_empty() {
            let array = calls.len() > 1;
            return calls_text(&calls, array, controls, rng).map(|t| tokenizer::tokens(&t));
        }
    }
    Ok(text_reply(conv, controls, last_user, rng))
}

/// The constraint without the pipeline's decoding options.
fn without_guidance(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.remove("x-guidance");
    }
    schema
}

/// The calls to make under a tool-call constraint (`{"name": {"enum":
/// [..]}, "arguments": ...}`, one, any of several, or an array of them):
/// (name, arguments schema) each, and whether the constraint is the array
/// (written as one even for one call). `None` when the constraint is not
/// of calls.
#[allow(clippy::type_complexity)]
fn constrained_calls<'a>(
    schema: &'a Value,
    last_user: &str,
) -> Option<(Vec<(&'a str, Option<&'a Value>)>, bool)> {
    let (item, parallel) = match schema.get("type").and_then(Value::as_str) {
        Some("array") => (schema.get("items")?, true),
        _ => (schema, false),
    };
    let branches: Vec<&Value> = match item.get("anyOf").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![item],
    };
    let offered: Vec<(&str, Option<&Value>)> = branches
        .iter()
        .map(|b| {
            let props = b.get("properties")?;
            let name = props.get("name")?.get("enum")?.get(0)?.as_str()?;
            Some((name, props.get("arguments")))
        })
        .collect::<Option<_>>()?;
    let first = *offered.first()?;
    let mut calls = mentioned(&offered, last_user, |c| c.0);
    if calls.is_empty() {
        calls.push(first);
    }
    if !parallel {
        calls.truncate(1);
    }
    Some((calls, parallel))
}

/// The items whose name the text mentions (as a whole word), in order of
/// first mention.
fn mentioned<T: Copy>(items: &[T], text: &str, name: impl Fn(&T) -> &str) -> Vec<T> {
    let mut found: Vec<(usize, T)> = items
        .iter()
        .filter_map(|t| first_mention(text, name(t)).map(|at| (at, *t)))
        .collect();
    found.sort_by_key(|(at, _)| *at);
    found.into_iter().map(|(_, t)| t).collect()
}

/// The reply of tool calls, as the listing asks a model to write it and
/// the call constraint makes one write it (`", "` and `": "` separators,
/// the name first): one call object, or an array of them. A moved
/// generation's delivered calls are written again the same way
/// (`pipeline/resume.rs`), so the continuation picks up byte for byte.
fn calls_text(
    calls: &[(&str, Option<&Value>)],
    array: bool,
    controls: &Controls,
    rng: &mut Rng,
) -> Result<String, Status> {
    let mut out = Vec::with_capacity(calls.len());
    for (name, params) in calls {
        let mut args = match params {
            Some(schema) => schema_gen::generate(schema, rng),
            None => Value::Object(serde_json::Map::new()),
        };
        if let (Some(path), Value::Object(map)) = (&controls.tool_path, &mut args) {
            // The call reads that file as a model asked to would: whole.
            // Optional arguments are left out, since generated ones mean
            // nothing for a real file (Claude Code's Read took a random
            // `offset` past the file's end and returned none of its text).
            let required = params
                .and_then(|p| p.get("required"))
                .and_then(Value::as_array);
            map.retain(|key, _| {
                key.ends_with("path")
                    || required.is_some_and(|r| r.iter().any(|k| k.as_str() == Some(key.as_str())))
            });
            for (key, value) in map.iter_mut() {
                if key.ends_with("path") && value.is_string() {
                    *value = Value::String(path.clone());
                }
            }
        }
        let call = serde_json::json!({"name": name, "arguments": args});
        out.push(
            spaced_json(&call)
                .map_err(|e| status::engine_failure(format!("simulated call of `{name}`: {e}")))?,
        );
    }
    Ok(if array {
        format!("[{}]", out.join(", "))
    } else {
        out.join(", ")
    })
}

/// `value` as JSON with `", "` between items and `": "` after keys.
fn spaced_json(value: &Value) -> Result<String, serde_json::Error> {
    use serde::Serialize;
    use std::io::{self, Write};
    fn separate<W: ?Sized + Write>(w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_array_value<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> io::Result<()> {
            separate(w, first)
        }
        fn begin_object_key<W: ?Sized + Write>(
            &mut self,
            w: &mut W,
            first: bool,
        ) -> io::Result<()> {
            separate(w, first)
        }
        fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    value.serialize(&mut serde_json::Serializer::with_formatter(
        &mut out, Spaced,
    ))?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The text reply (plain words, echo, a tool-result answer).
fn text_reply(
    conv: &Conversation,
    controls: &Controls,
    last_user: &str,
    rng: &mut Rng,
) -> Vec<Token> {
    if controls.echo_messages {
        return tokenizer::tokens(&transcript(&conv.messages));
    }
    if controls.echo {
        return tokenizer::tokens(last_user);
    }
    let mut tokens;
    if let Some(results) = trailing_tool_results(&conv.messages) {
        let mut snippet: String = results.chars().take(200).collect();
        if snippet.len() < results.len() {
            snippet.push('…');
        }
        tokens = tokenizer::tokens(&format!("The tool returned: {snippet}."));
        let n = rng.range(8, 24) as usize;
        let mut words = word_pieces(rng, n);
        if let Some(first) = words.first_mut() {
            first.insert(0, ' ');
        }
        tokens.extend(words.iter().map(|w| tokenizer::token(w)));
    } else {
        let n = rng.range(16, 48) as usize;
        tokens = word_tokens(rng, n);
    }
    if let Some(n) = controls.reply_tokens {
        let n = n as usize;
        tokens.truncate(n);
        if tokens.len() < n {
            let mut words = word_pieces(rng, n - tokens.len());
            if !tokens.is_empty() {
                if let Some(first) = words.first_mut() {
                    if !first.starts_with(' ') {
                        first.insert(0, ' ');
                    }
                }
            }
            tokens.extend(words.iter().map(|w| tokenizer::token(w)));
        }
    }
    tokens
}

/// `synthetic:json_replies=<json> <json> ...` in a user message: scripted
/// replies for calls with a JSON format, for tests of callers that make
/// several such calls in one conversation (a planner: plan, repair,
/// re-plan). The k-th value answers the call whose messages hold k
/// assistant messages after the last user message with the directive (the
/// last value answers all later calls). The values are sent as they are,
/// valid or not against the schema, so a caller's validation can be tested.
fn scripted_json_reply(messages: &[Message]) -> Option<String> {
    const DIRECTIVE: &str = "synthetic:json_replies=";
    let (at, text) = messages
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, m)| m.role == "user")
        .map(|(i, m)| (i, m.plain_text()))
        .find(|(_, t)| t.contains(DIRECTIVE))?;
    let start = text.find(DIRECTIVE)? + DIRECTIVE.len();
    let values: Vec<Value> = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<Value>()
        .map_while(Result::ok)
        .collect();
    let k = messages[at + 1..]
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    values
        .get(k)
        .or_else(|| values.last())
        .map(Value::to_string)
}

/// Every message, one line each (`synthetic:echo_messages`).
fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&m.role);
        if !m.tool_call_id.is_empty() {
            out.push_str(&format!(" ({})", m.tool_call_id));
        }
        out.push(':');
        if !m.text.is_empty() {
            out.push(' ');
            out.push_str(&m.text.replace(IMAGE_PLACEHOLDER, " [image]"));
        }
        for (name, args) in &m.calls {
            out.push_str(&format!(" {name}({args})"));
        }
    }
    out
}

/// The text of the `tool` messages that end the conversation, if it ends so.
fn trailing_tool_results(messages: &[Message]) -> Option<String> {
    let tail: Vec<&Message> = messages
        .iter()
        .rev()
        .take_while(|m| m.role == "tool")
        .collect();
    if tail.is_empty() {
        return None;
    }
    let texts: Vec<String> = tail.iter().rev().map(|m| m.plain_text()).collect();
    Some(texts.join("; "))
}

/// Hash of the prompt: the reply depends on all of it.
fn prompt_hash(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        h ^= u64::from(*t);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `n` single-token word pieces (the first without its leading space).
fn word_pieces(rng: &mut Rng, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    let mut since_period = 0;
    for i in 0..n {
        let piece = if since_period >= 8 && i + 1 < n && rng.chance(25) {
            since_period = 0;
            ".".to_owned()
        } else {
            since_period += 1;
            let w = WORDS[rng.below(WORDS.len())];
            if i == 0 {
                w.trim_start().to_owned()
            } else {
                w.to_owned()
            }
        };
        out.push(piece);
    }
    out
}

/// `n` words, one token each.
fn word_tokens(rng: &mut Rng, n: usize) -> Vec<Token> {
    word_pieces(rng, n)
        .iter()
        .map(|w| tokenizer::token(w))
        .collect()
}

/// Byte offset of the first whole-word occurrence of `name` in `text`.
fn first_mention(text: &str, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(name).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + name.len()..].chars().next();
        !before.is_some_and(is_word) && !after.is_some_and(is_word)
    })
}

#[cfg(test)]
mod tests;
