//! Anthropic Messages <-> worker protocol.
//!
//! [`to_worker`] builds the `GenerateRequest` (the same one a chat request
//! builds: system prompt, turns, tool calls and results, reasoning);
//! [`MessageAggregate`] folds worker events into one `message`;
//! [`stream::MessagesStreamEncoder`] turns them into Anthropic's events.
//!
//! Thinking blocks get a `signature`: `igw1.` and the SHA-256 of their text,
//! base64. It is opaque to clients and not checked when sent back (the
//! gateway keeps no state to check it against; the text goes back to the
//! model as the earlier turn's reasoning either way).

pub mod stream;

use crate::api::messages::{
    Block, Content, ContentBlock, Message, MessagesRequest, ToolResultContent, Usage,
};
use crate::validate::messages::ValidMessagesRequest;
use base64::Engine as _;
use inference_proto::v1 as pb;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Builds the worker request from a validated Messages request.
pub fn to_worker(
    req: &MessagesRequest,
    valid: &ValidMessagesRequest,
    request_id: &str,
) -> pb::GenerateRequest {
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        messages.push(message("system", parts(system)));
    }
    for m in req.messages.as_deref().unwrap_or_default() {
        let role = m.role.as_deref().unwrap_or("user");
        let Some(content) = &m.content else { continue };
        match role {
            "assistant" => messages.push(assistant(content)),
            // Tool results answer the calls before them: each is a tool
            // message, then the rest of the turn as a user message.
            "user" => {
                if let Content::Blocks(blocks) = content {
                    messages.extend(blocks.iter().filter_map(tool_result));
                }
                let rest = parts(content);
                if !rest.is_empty() || !has_tool_results(content) {
                    messages.push(message("user", rest));
                }
            }
            _ => messages.push(message("system", parts(content))),
        }
    }
    let tools = req
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|t| pb::FunctionTool {
            name: t.name.clone().unwrap_or_default(),
            description: t.description.clone().unwrap_or_default(),
            parameters_json: t
                .input_schema
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default(),
            strict: t.strict.unwrap_or(false),
        })
        .collect();
    let choice = req.tool_choice.as_ref();
    pb::GenerateRequest {
        request_id: request_id.to_owned(),
        model: valid.model.id.to_owned(),
        messages,
        tools,
        tool_choice: Some(tool_choice(
            choice.and_then(|c| c.kind.as_deref()),
            choice.and_then(|c| c.name.as_deref()),
        )),
        parallel_tool_calls: !choice
            .and_then(|c| c.disable_parallel_tool_use)
            .unwrap_or(false),
        sampling: Some(pb::Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            max_tokens: valid.max_tokens,
            stop: valid.stop.clone(),
            seed: None,
            presence_penalty: None,
            frequency_penalty: None,
            repeat_penalty: None,
            top_k: valid.top_k,
        }),
        response_format: None,
        reasoning: Some(pb::Reasoning {
            enabled: valid.reasoning,
            budget_tokens: valid.reasoning_budget,
            effort: (if valid.reasoning { valid.effort } else { "" }).to_owned(),
        }),
        cache_key: String::new(),
        // A body is relayed whole: no need for token-sized frames.
        batch_events: !valid.stream,
        resume: None,
        // The generation driver sets the tier it serves the request at.
        service_tier: 0,
    }
}

fn message(role: &str, content: Vec<pb::ContentPart>) -> pb::Message {
    pb::Message {
        role: role.to_owned(),
        content,
        ..Default::default()
    }
}

fn text_part(text: &str) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text.to_owned())),
    }
}

/// The text and image parts of a content (other blocks travel apart).
fn parts(content: &Content) -> Vec<pb::ContentPart> {
    match content {
        Content::Text(t) => vec![text_part(t)],
        Content::Blocks(blocks) => blocks.iter().filter_map(part).collect(),
    }
}

fn part(block: &Block) -> Option<pb::ContentPart> {
    match block {
        Block::Text { text } => Some(text_part(text)),
        Block::Image { source } => source.url().map(|url| pb::ContentPart {
            part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                url,
                detail: "auto".into(),
            })),
        }),
        _ => None,
    }
}

fn has_tool_results(content: &Content) -> bool {
    matches!(content, Content::Blocks(b) if b.iter().any(|b| matches!(b, Block::ToolResult { .. })))
}

/// A `tool_result` block as the tool message answering its call; an error
/// result says so, since the worker protocol has no flag for it.
fn tool_result(block: &Block) -> Option<pb::Message> {
    let Block::ToolResult {
        tool_use_id,
        content,
        is_error,
    } = block
    else {
        return None;
    };
    let mut content: Vec<pb::ContentPart> = match content {
        None => Vec::new(),
        Some(ToolResultContent::Text(t)) => vec![text_part(t)],
        Some(ToolResultContent::Blocks(b)) => b.iter().filter_map(part).collect(),
    };
    if *is_error == Some(true) {
        content.insert(0, text_part("Error: "));
    }
    Some(pb::Message {
        role: "tool".into(),
        content,
        tool_call_id: tool_use_id.clone(),
        ..Default::default()
    })
}

/// An assistant turn: its text, its tool calls, its reasoning (thinking
/// blocks; redacted ones carry nothing the model can read).
fn assistant(content: &Content) -> pb::Message {
    let mut m = message("assistant", parts(content));
    if let Content::Blocks(blocks) = content {
        for b in blocks {
            match b {
                Block::ToolUse { id, name, input } => m.tool_calls.push(pb::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: input.to_string(),
                }),
                Block::Thinking { thinking, .. } => m.reasoning.push_str(thinking),
                _ => {}
            }
        }
    }
    m
}

/// `tool_choice.type` (and `name`) as the worker's choice.
fn tool_choice(kind: Option<&str>, name: Option<&str>) -> pb::ToolChoice {
    use pb::tool_choice::Mode;
    let mode = match kind {
        Some("any") => Mode::Required,
        Some("tool") => Mode::Named,
        Some("none") => Mode::None,
        _ => Mode::Auto,
    };
    pb::ToolChoice {
        mode: mode as i32,
        function_name: name
            .filter(|_| mode == Mode::Named)
            .unwrap_or_default()
            .to_owned(),
    }
}

/// The `toolu_…` id of a worker's tool call (`call_…`): the same string
/// whether the reply is streamed or not.
pub fn tool_use_id(worker_id: &str) -> String {
    if worker_id.starts_with("toolu_") {
        return worker_id.to_owned();
    }
    let rest = worker_id.strip_prefix("call_").unwrap_or(worker_id);
    format!("toolu_{rest}")
}

/// The signature of a thinking block's text (see the module's docs).
pub fn signature(hash: Sha256) -> String {
    let digest = hash.finalize();
    format!(
        "igw1.{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// `stop_reason` and `stop_sequence` for a worker's finish: a stop string
/// the worker names (by its index in the request's `stop_sequences`) makes
/// it `stop_sequence`, with that string.
pub fn stop_of<'s>(f: &pb::Finished, stops: &'s [String]) -> (&'static str, Option<&'s str>) {
    use pb::finished::Reason;
    match Reason::try_from(f.reason) {
        Ok(Reason::Length) => ("max_tokens", None),
        Ok(Reason::ToolCalls) => ("tool_use", None),
        _ => match f.stop_index.and_then(|i| stops.get(i as usize)) {
            Some(stop) => ("stop_sequence", Some(stop)),
            None => ("end_turn", None),
        },
    }
}

/// Worker usage in Anthropic's shape: `input_tokens` excludes what the
/// engine read from its cache (`cache_read_input_tokens`), so the prompt
/// billed is their sum.
pub fn usage(u: &pb::Usage) -> Usage {
    Usage {
        input_tokens: u.prompt_tokens.saturating_sub(u.cached_prompt_tokens),
        output_tokens: u.completion_tokens,
        cache_read_input_tokens: u.cached_prompt_tokens,
        cache_creation_input_tokens: 0,
    }
}

/// A tool call's arguments as the block's `input`: a JSON object (an
/// unfinished one, cut by `max_tokens`, is `{}`).
fn input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::Object(Default::default()),
    }
}

/// One tool call as the worker sent it.
#[derive(Debug, Default, Clone)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

/// Folds a worker stream into one `message`.
#[derive(Debug, Default)]
pub struct MessageAggregate {
    thinking: String,
    text: String,
    calls: Vec<Call>,
    finished: Option<pb::Finished>,
}

impl MessageAggregate {
    pub fn push(&mut self, event: pb::GenerateEvent) {
        use pb::generate_event::Event;
        match event.event {
            Some(Event::Text(t)) => self.text.push_str(&t.text),
            Some(Event::Reasoning(r)) => self.thinking.push_str(&r.text),
            Some(Event::ToolCall(d)) => {
                let i = d.index as usize;
                if i >= self.calls.len() {
                    self.calls.resize_with(i + 1, Call::default);
                }
                let call = &mut self.calls[i];
                if !d.id.is_empty() {
                    call.id = d.id;
                }
                if !d.name.is_empty() {
                    call.name = d.name;
                }
                call.arguments.push_str(&d.arguments_fragment);
            }
            Some(Event::Finished(f)) => self.finished = Some(f),
            None => {}
        }
    }

    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// The worker events that say the same in one delta each: what a
    /// replayed stream (an `Idempotency-Key`'s record) is encoded from.
    pub fn folded_events(&self) -> Vec<pb::GenerateEvent> {
        use pb::generate_event::Event;
        let mut events = Vec::new();
        let mut push = |e| {
            events.push(pb::GenerateEvent {
                event: Some(e),
                output_tokens: 0,
            })
        };
        if !self.thinking.is_empty() {
            push(Event::Reasoning(pb::ReasoningDelta {
                text: self.thinking.clone(),
            }));
        }
        if !self.text.is_empty() {
            push(Event::Text(pb::TextDelta {
                text: self.text.clone(),
            }));
        }
        for (i, c) in self.calls.iter().enumerate() {
            push(Event::ToolCall(pb::ToolCallDelta {
                index: i as u32,
                id: c.id.clone(),
                name: c.name.clone(),
                arguments_fragment: c.arguments.clone(),
            }));
        }
        push(Event::Finished(self.finished.unwrap_or_default()));
        events
    }

    /// The reply: thinking, text, then the tool calls, as their blocks.
    pub fn into_message(self, id: String, valid: &ValidMessagesRequest) -> Message {
        let finished = self.finished.unwrap_or_default();
        let mut content = Vec::new();
        if valid.reasoning && !self.thinking.is_empty() {
            let mut hash = Sha256::new();
            hash.update(self.thinking.as_bytes());
            content.push(ContentBlock::Thinking {
                thinking: if valid.omit_thinking {
                    String::new()
                } else {
                    self.thinking
                },
                signature: signature(hash),
            });
        }
        if !self.text.is_empty() || self.calls.is_empty() {
            content.push(ContentBlock::Text { text: self.text });
        }
        for c in self.calls {
            content.push(ContentBlock::ToolUse {
                id: tool_use_id(&c.id),
                name: c.name,
                input: input(&c.arguments),
            });
        }
        let (stop_reason, stop_sequence) = stop_of(&finished, &valid.stop);
        Message {
            id,
            kind: "message",
            role: "assistant",
            model: valid.model.id.to_owned(),
            content,
            stop_reason: Some(stop_reason),
            stop_sequence: stop_sequence.map(str::to_owned),
            usage: usage(&finished.usage.unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests;
