//! The `synthetic` engine: SIMULATED output for tests, benchmarks and load.
//!
//! Nothing here is a language model. The reply is planned in full before the
//! first event (cheap: no per-token tokenizing), deterministically from the
//! rendered prompt and `sampling.seed`, then streamed at the configured pace:
//! `--ttft-ms` before the first event, then `--tokens-per-second` (0 = as
//! fast as the stream takes them).
//!
//! What it says:
//! - Reasoning (when enabled) comes first: min(budget, 20..=60) tokens, where
//!   the budget is `budget_tokens` or the effort's default (minimal 64, low
//!   256, medium 1024, high 4096; unset 1024). The budget is a hard cap.
//! - Tools: `NONE` never calls. `NAMED` calls that function. `REQUIRED` calls
//!   the tools the last user message mentions, else the first tool. `AUTO`
//!   calls the tools the last user message mentions by name (as a whole
//!   word), unless the last message is a `tool` result: then it answers in
//!   text quoting that result. More than one call only when
//!   `parallel_tool_calls` is set (in order of first mention); otherwise the
//!   first mentioned. Arguments are generated from the tool's JSON Schema.
//! - Structured output: `JSON_OBJECT` gives a small object; `JSON_SCHEMA` an
//!   instance of the schema.
//! - Otherwise text: 16..=48 words (or `synthetic:reply_tokens=N`), or the
//!   test controls in [`controls`].
//!
//! Paced generations decode in lockstep, as the sequences of a continuously
//! batched GPU engine do: one decode step gives every running sequence its
//! next token at once. Steps fall on one grid per process (multiples of the
//! token interval since the engine started) and each token goes out at the
//! first step at or after its own schedule, so the tokens of all streams
//! due in a step leave together.
//!
//! Each streamed piece is one token (words are single o200k tokens; JSON and
//! quoted text are split with the real BPE). `max_tokens` (reasoning
//! included) cuts the script and finishes `LENGTH`; a stop string ends the text
//! just before it and finishes `STOP`.

pub mod controls;
pub mod prefix_cache;
pub mod rng;
pub mod schema_gen;
pub mod tokenizer;

use crate::model::ModelProfile;
use crate::pipeline;
use crate::seam::chat::OnCached;
use crate::seam::tokens::fnv1a;
use crate::seam::{CacheHit, EventSink, Outcome, Started};
use crate::status;
use controls::Controls;
use inference_proto::v1 as pb;
use pb::finished::Reason;
use pb::generate_event::Event;
use prefix_cache::PrefixCache;
use rng::{Rng, WORDS};
use std::time::Duration;
use tokenizer::{Piece, Prompt};
use tonic::Status;

/// Prompts with more text than this are tokenized off the async threads.
const BLOCKING_TOKENIZE_BYTES: usize = 64 * 1024;

/// Pacing of the synthetic engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyntheticConfig {
    pub ttft: Duration,
    /// 0 = no pacing.
    pub tokens_per_second: f64,
    /// When unpaced, merge up to this many consecutive tokens of the same
    /// kind into one event (fewer, larger deltas for load tests). 0 or 1 =
    /// one token per event.
    pub coalesce_tokens: u32,
    /// Chaos: every generation fails after this many completion tokens,
    /// as `synthetic:fail_after=N` would (a worker with a broken device).
    pub fail_after_tokens: Option<u32>,
    /// Capacity of the simulated prefix cache, in 64-token blocks.
    pub prefix_cache_blocks: usize,
}

/// The SIMULATED engine.
#[derive(Debug)]
pub struct SyntheticEngine {
    config: SyntheticConfig,
    /// The public model it plays: its window and whether it takes images.
    model: ModelProfile,
    cache: PrefixCache,
    /// Origin of the decode-step grid.
    epoch: tokio::time::Instant,
}

/// Everything the simulator plans a reply from.
#[derive(Debug)]
pub struct Job {
    pub request: pb::GenerateRequest,
    pub prompt: Prompt,
    /// Prompt tokens found in the simulated prefix cache.
    pub cached_prompt_tokens: u32,
    /// Completion tokens allowed (reasoning included): `max_tokens`, or the
    /// rest of the context window when it is 0.
    pub completion_limit: u32,
}

/// A request tokenized by the simulator, not yet started.
#[derive(Debug)]
pub struct Tokenized {
    request: pb::GenerateRequest,
    prompt: Prompt,
}

impl Tokenized {
    /// `prompt_tokens` as reported in usage (images included).
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt.len()
    }
}

impl SyntheticEngine {
    pub fn new(config: SyntheticConfig, model: ModelProfile) -> Self {
        Self {
            cache: PrefixCache::new(config.prefix_cache_blocks),
            config,
            model,
            epoch: tokio::time::Instant::now(),
        }
    }

    /// The public model's window.
    pub fn context_window(&self) -> u32 {
        self.model.context_window
    }

    /// Share of the simulated prefix cache in use, 0..=1.
    pub fn kv_cache_usage(&self) -> f64 {
        self.cache.usage()
    }

    /// Renders the prompt and tokenizes it with o200k (images by their
    /// token rule), off the runtime threads when it is large.
    pub async fn tokenize(&self, request: pb::GenerateRequest) -> Result<Tokenized, Status> {
        let text_bytes: usize = request
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .map(|p| match &p.part {
                Some(pb::content_part::Part::Text(t)) => t.len(),
                _ => 0,
            })
            .sum();
        if text_bytes < BLOCKING_TOKENIZE_BYTES {
            let prompt = tokenizer::render(&request);
            return Ok(Tokenized { request, prompt });
        }
        tokio::task::spawn_blocking(move || {
            let prompt = tokenizer::render(&request);
            Tokenized { request, prompt }
        })
        .await
        .map_err(|e| status::engine_failure(format!("tokenizer task failed: {e}")))
    }

    /// Refuses images on a model without image input, then the window
    /// check every engine shares; returns the completion limit.
    pub fn fit(&self, tokenized: &Tokenized) -> Result<u32, Status> {
        if tokenized.prompt.image_parts > 0 && !self.model.image_input {
            return Err(status::invalid_request(format!(
                "model `{}` does not accept image input",
                self.model.id
            )));
        }
        let max_tokens = tokenized
            .request
            .sampling
            .as_ref()
            .map_or(0, |s| s.max_tokens);
        pipeline::fit_window(
            self.model.context_window,
            tokenized.prompt.len(),
            max_tokens,
        )
    }

    /// Looks the prompt up in the simulated prefix cache and plans the
    /// whole reply; a request it cannot serve fails here.
    pub fn start(
        &self,
        tokenized: Tokenized,
        completion_limit: u32,
        mut on_cached: OnCached,
    ) -> Result<Box<dyn Started>, Status> {
        let cached_prompt_tokens = self.cache.lookup_and_insert(&tokenized.prompt.tokens);
        let job = Job {
            request: tokenized.request,
            prompt: tokenized.prompt,
            cached_prompt_tokens,
            completion_limit,
        };
        let started = self.prepare(job)?;
        on_cached(CacheHit {
            cached_tokens: cached_prompt_tokens,
            slot: None,
        });
        Ok(started)
    }
}

/// The first decode step at or after `due`: steps are `interval` apart,
/// counted from `epoch`.
fn on_step_grid(
    due: tokio::time::Instant,
    epoch: tokio::time::Instant,
    interval: Duration,
) -> tokio::time::Instant {
    let step = interval.as_nanos().max(1);
    let since = due.saturating_duration_since(epoch).as_nanos();
    let steps = since.div_ceil(step);
    let offset = u64::try_from(steps * step).unwrap_or(u64::MAX);
    epoch + Duration::from_nanos(offset)
}

impl SyntheticEngine {
    fn prepare(&self, job: Job) -> Result<Box<dyn Started>, Status> {
        let mut script = script(&job)?;
        if script.controls.fail_after.is_none() {
            script.controls.fail_after = self.config.fail_after_tokens;
        }
        let interval = match script.controls.slow_ms {
            Some(ms) => Duration::from_millis(ms),
            None if self.config.tokens_per_second > 0.0 => {
                Duration::from_secs_f64(1.0 / self.config.tokens_per_second)
            }
            None => Duration::ZERO,
        };
        if job.request.batch_events {
            // Nobody watches the deltas: as few events as the reply's kinds
            // allow, each sent when its last token would have been.
            script.steps = coalesce(std::mem::take(&mut script.steps), u32::MAX);
        } else if interval.is_zero() && self.config.coalesce_tokens > 1 {
            script.steps = coalesce(
                std::mem::take(&mut script.steps),
                self.config.coalesce_tokens,
            );
        }
        Ok(Box::new(SyntheticGeneration {
            script,
            ttft: self.config.ttft,
            epoch: self.epoch,
            interval,
            batched: job.request.batch_events,
        }))
    }
}

/// One event of the script and the completion tokens it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub event: Event,
    pub tokens: u32,
    pub reasoning: bool,
}

/// A whole reply, decided before streaming.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub steps: Vec<Step>,
    pub finished: pb::Finished,
    pub controls: Controls,
}

struct SyntheticGeneration {
    script: Script,
    ttft: Duration,
    epoch: tokio::time::Instant,
    interval: Duration,
    /// Steps were merged for a batching caller (`batch_events`).
    batched: bool,
}

#[async_trait::async_trait]
impl Started for SyntheticGeneration {
    async fn run(self: Box<Self>, out: EventSink) -> Outcome {
        let Script {
            steps,
            finished,
            controls,
        } = self.script;
        if controls.hang {
            out.closed().await;
            return Outcome::Cancelled { tokens: 0 };
        }
        if out.sleep(self.ttft).await.is_err() {
            return Outcome::Cancelled { tokens: 0 };
        }
        let mut emitted = 0u32;
        let start = tokio::time::Instant::now();
        for (i, step) in steps.into_iter().enumerate() {
            if controls.fail_after.is_some_and(|n| emitted >= n) {
                return fail(&out, emitted, controls.fail_unavailable).await;
            }
            // Paced: a step goes out when its last token would have been
            // generated (one token per step, unless merged for batching).
            let slot = if self.batched {
                (emitted + step.tokens).saturating_sub(1)
            } else {
                i as u32
            };
            let paced = if self.interval.is_zero() {
                if i % 16 == 15 {
                    tokio::task::yield_now().await;
                }
                Ok(())
            } else if slot > 0 {
                let due = start + self.interval * slot;
                out.sleep_until(on_step_grid(due, self.epoch, self.interval))
                    .await
            } else {
                Ok(())
            };
            if paced.is_err() || out.send(step.event).await.is_err() {
                return Outcome::Cancelled { tokens: emitted };
            }
            emitted += step.tokens;
        }
        if controls.fail_after.is_some() {
            return fail(&out, emitted, controls.fail_unavailable).await;
        }
        let outcome = out.finish(finished, emitted).await;
        if let (Outcome::Completed { .. }, Some(ms)) = (outcome, controls.trailers_ms) {
            // Late trailers: the stream ends only after this pause (or when
            // the gateway drops it).
            let _ = out.sleep(Duration::from_millis(ms)).await;
        }
        outcome
    }
}

async fn fail(out: &EventSink, emitted: u32, unavailable: bool) -> Outcome {
    let message = format!("synthetic engine failure after {emitted} tokens (synthetic:fail_after)");
    let status = if unavailable {
        Status::unavailable(message)
    } else {
        status::engine_failure(message)
    };
    out.finish_failed(status, emitted).await
}

/// Merges runs of same-kind steps (text, reasoning, or argument fragments
/// of one tool call) into events of up to `max_tokens` tokens. A tool call's
/// first delta (id and name) stays its own event.
fn coalesce(steps: Vec<Step>, max_tokens: u32) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len() / max_tokens as usize + 2);
    for step in steps {
        if let Some(last) = out.last_mut() {
            if last.tokens + step.tokens <= max_tokens {
                let merged = match (&mut last.event, &step.event) {
                    (Event::Text(a), Event::Text(b)) => {
                        a.text.push_str(&b.text);
                        true
                    }
                    (Event::Reasoning(a), Event::Reasoning(b)) => {
                        a.text.push_str(&b.text);
                        true
                    }
                    (Event::ToolCall(a), Event::ToolCall(b))
                        if a.index == b.index && a.id.is_empty() && b.id.is_empty() =>
                    {
                        a.arguments_fragment.push_str(&b.arguments_fragment);
                        true
                    }
                    _ => false,
                };
                if merged {
                    last.tokens += step.tokens;
                    continue;
                }
            }
        }
        out.push(step);
    }
    out
}

/// Plans the whole reply for a job.
pub fn script(job: &Job) -> Result<Script, Status> {
    let req = &job.request;
    let last_user = last_user_text(&req.messages);
    let controls = Controls::parse(&last_user);
    let sampling_seed = req.sampling.as_ref().and_then(|s| s.seed).unwrap_or(0);
    let mut rng = Rng::new(prompt_hash(&job.prompt.tokens) ^ sampling_seed.rotate_left(17));

    let mut steps = Vec::new();
    let reasoning = reasoning_length(req.reasoning.as_ref(), &mut rng);
    for piece in word_pieces(&mut rng, reasoning as usize) {
        steps.push(Step {
            event: Event::Reasoning(pb::ReasoningDelta { text: piece }),
            tokens: 1,
            reasoning: true,
        });
    }

    let calls = choose_tools(req, &last_user)?;
    let mut reason = Reason::Stop;
    if !calls.is_empty() {
        reason = Reason::ToolCalls;
        let id_seed = fnv1a(req.request_id.as_bytes()) ^ rng.next_u64();
        for (index, tool) in calls.iter().enumerate() {
            let mut id_rng = Rng::new(id_seed.wrapping_add(index as u64));
            let args = tool_arguments(tool, &mut rng)?;
            steps.push(Step {
                event: Event::ToolCall(pb::ToolCallDelta {
                    index: index as u32,
                    id: format!("call_{}", id_rng.alnum(24)),
                    name: tool.name.clone(),
                    arguments_fragment: String::new(),
                }),
                tokens: 1,
                reasoning: false,
            });
            for p in tokenizer::pieces(&args) {
                steps.push(Step {
                    event: Event::ToolCall(pb::ToolCallDelta {
                        index: index as u32,
                        id: String::new(),
                        name: String::new(),
                        arguments_fragment: p.text,
                    }),
                    tokens: p.tokens,
                    reasoning: false,
                });
            }
        }
    } else {
        let text = reply_text(job, &controls, &last_user, &mut rng)?;
        let stops: Vec<&str> = req
            .sampling
            .as_ref()
            .map(|s| {
                s.stop
                    .iter()
                    .map(String::as_str)
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let (text, stopped) = cut_at_stop(text, &stops);
        if stopped {
            reason = Reason::Stop;
        }
        for p in text {
            steps.push(Step {
                event: Event::Text(pb::TextDelta { text: p.text }),
                tokens: p.tokens,
                reasoning: false,
            });
        }
    }

    // `max_tokens` (or the rest of the window) caps everything generated.
    let mut used = 0u32;
    let mut keep = steps.len();
    for (i, s) in steps.iter().enumerate() {
        if used.saturating_add(s.tokens) > job.completion_limit {
            keep = i;
            reason = Reason::Length;
            break;
        }
        used += s.tokens;
    }
    steps.truncate(keep);

    let reasoning_tokens = steps.iter().filter(|s| s.reasoning).map(|s| s.tokens).sum();
    let finished = pb::Finished {
        reason: reason as i32,
        usage: Some(pb::Usage {
            prompt_tokens: job.prompt.len(),
            cached_prompt_tokens: job.cached_prompt_tokens,
            completion_tokens: used,
            reasoning_tokens,
            image_tokens: job.prompt.image_tokens,
        }),
    };
    Ok(Script {
        steps,
        finished,
        controls,
    })
}

/// The text of the last `user` message (text parts joined).
fn last_user_text(messages: &[pb::Message]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map(message_text)
        .unwrap_or_default()
}

fn message_text(m: &pb::Message) -> String {
    let mut s = String::new();
    for part in &m.content {
        if let Some(pb::content_part::Part::Text(t)) = &part.part {
            s.push_str(t);
        }
    }
    s
}

/// Every message, one line each (`synthetic:echo_messages`).
fn transcript(messages: &[pb::Message]) -> String {
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
        for part in &m.content {
            match &part.part {
                Some(pb::content_part::Part::Text(t)) => {
                    out.push(' ');
                    out.push_str(t);
                }
                Some(pb::content_part::Part::ImageUrl(_)) => out.push_str(" [image]"),
                None => {}
            }
        }
        for c in &m.tool_calls {
            out.push_str(&format!(" {}({})", c.name, c.arguments));
        }
    }
    out
}

/// Hash of the rendered prompt: the reply depends on all of it.
fn prompt_hash(tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for t in tokens {
        h ^= u64::from(*t);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Reasoning tokens to generate: 0 unless enabled, else min(budget, 20..=60).
fn reasoning_length(r: Option<&pb::Reasoning>, rng: &mut Rng) -> u32 {
    let Some(r) = r.filter(|r| r.enabled) else {
        return 0;
    };
    let budget = if r.budget_tokens > 0 {
        r.budget_tokens
    } else {
        match r.effort.as_str() {
            "minimal" => 64,
            "low" => 256,
            "high" => 4096,
            _ => 1024,
        }
    };
    (rng.range(20, 60) as u32).min(budget)
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

fn words_as_pieces(words: Vec<String>) -> Vec<Piece> {
    words
        .into_iter()
        .map(|text| Piece { text, tokens: 1 })
        .collect()
}

/// The text reply (plain words, echo, a tool-result answer, or JSON).
fn reply_text(
    job: &Job,
    controls: &Controls,
    last_user: &str,
    rng: &mut Rng,
) -> Result<Vec<Piece>, Status> {
    let req = &job.request;
    let format = req.response_format.as_ref();
    let kind = format
        .map(|f| f.kind())
        .unwrap_or(pb::response_format::Kind::Unspecified);
    // `synthetic:ignore_format` plays an engine whose constrained decoding
    // failed: it answers in plain words whatever format was asked for.
    let kind = if controls.ignore_format {
        pb::response_format::Kind::Unspecified
    } else {
        kind
    };
    let json_kind = matches!(
        kind,
        pb::response_format::Kind::JsonObject | pb::response_format::Kind::JsonSchema
    );
    if json_kind {
        if let Some(reply) = scripted_json_reply(&req.messages) {
            return Ok(tokenizer::pieces(&reply));
        }
    }
    match kind {
        pb::response_format::Kind::JsonObject => {
            let v = schema_gen::generic_object(rng);
            return Ok(tokenizer::pieces(&v.to_string()));
        }
        pb::response_format::Kind::JsonSchema => {
            let schema_json = format.map(|f| f.schema_json.as_str()).unwrap_or("");
            let v = if schema_json.trim().is_empty() {
                schema_gen::generic_object(rng)
            } else {
                let schema: serde_json::Value = serde_json::from_str(schema_json).map_err(|e| {
                    status::invalid_request(format!("response_format schema is not JSON: {e}"))
                })?;
                schema_gen::generate(&schema, rng)
            };
            return Ok(tokenizer::pieces(&v.to_string()));
        }
        _ => {}
    }
    if controls.echo_messages {
        return Ok(tokenizer::pieces(&transcript(&req.messages)));
    }
    if controls.echo {
        return Ok(tokenizer::pieces(last_user));
    }
    let mut pieces;
    if let Some(results) = trailing_tool_results(&req.messages) {
        let mut snippet: String = results.chars().take(200).collect();
        if snippet.len() < results.len() {
            snippet.push('…');
        }
        pieces = tokenizer::pieces(&format!("The tool returned: {snippet}."));
        let n = rng.range(8, 24) as usize;
        let mut words = word_pieces(rng, n);
        if let Some(first) = words.first_mut() {
            first.insert(0, ' ');
        }
        pieces.extend(words_as_pieces(words));
    } else {
        let n = rng.range(16, 48) as usize;
        pieces = words_as_pieces(word_pieces(rng, n));
    }
    if let Some(n) = controls.reply_tokens {
        let n = n as usize;
        let mut total: usize = 0;
        let mut kept = Vec::new();
        for p in pieces {
            if total + p.tokens as usize > n {
                break;
            }
            total += p.tokens as usize;
            kept.push(p);
        }
        if total < n {
            let mut words = word_pieces(rng, n - total);
            if total > 0 {
                if let Some(first) = words.first_mut() {
                    if !first.starts_with(' ') {
                        first.insert(0, ' ');
                    }
                }
            }
            kept.extend(words_as_pieces(words));
        }
        pieces = kept;
    }
    Ok(pieces)
}

/// `synthetic:json_replies=<json> <json> ...` in a user message: scripted
/// replies for calls with a JSON format, for tests of callers that make
/// several such calls in one conversation (a planner: plan, repair,
/// re-plan). The k-th value answers the call whose messages hold k
/// assistant messages after the last user message with the directive (the
/// last value answers all later calls). The values are sent as they are,
/// valid or not against the schema, so a caller's validation can be tested.
fn scripted_json_reply(messages: &[pb::Message]) -> Option<String> {
    const DIRECTIVE: &str = "synthetic:json_replies=";
    let (at, text) = messages
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, m)| m.role == "user")
        .map(|(i, m)| (i, message_text(m)))
        .find(|(_, t)| t.contains(DIRECTIVE))?;
    let start = text.find(DIRECTIVE)? + DIRECTIVE.len();
    let values: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text[start..])
        .into_iter::<serde_json::Value>()
        .map_while(Result::ok)
        .collect();
    let k = messages[at + 1..]
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    values
        .get(k)
        .or_else(|| values.last())
        .map(serde_json::Value::to_string)
}

/// The text of the `tool` messages that end the conversation, if it ends so.
fn trailing_tool_results(messages: &[pb::Message]) -> Option<String> {
    let tail: Vec<&pb::Message> = messages
        .iter()
        .rev()
        .take_while(|m| m.role == "tool")
        .collect();
    if tail.is_empty() {
        return None;
    }
    let texts: Vec<String> = tail.iter().rev().map(|m| message_text(m)).collect();
    Some(texts.join("; "))
}

/// Ends the text just before the earliest stop string.
fn cut_at_stop(pieces: Vec<Piece>, stops: &[&str]) -> (Vec<Piece>, bool) {
    if stops.is_empty() {
        return (pieces, false);
    }
    let text: String = pieces.iter().map(|p| p.text.as_str()).collect();
    let Some(at) = stops.iter().filter_map(|s| text.find(s)).min() else {
        return (pieces, false);
    };
    let mut out = Vec::new();
    let mut offset = 0;
    for p in pieces {
        if offset >= at {
            break;
        }
        let end = offset + p.text.len();
        if end <= at {
            out.push(p);
        } else {
            let head = p.text[..at - offset].to_owned();
            if !head.is_empty() {
                out.push(Piece {
                    text: head,
                    tokens: 1,
                });
            }
        }
        offset = end;
    }
    (out, true)
}

/// The tools to call this turn (empty: answer in text).
fn choose_tools<'a>(
    req: &'a pb::GenerateRequest,
    last_user: &str,
) -> Result<Vec<&'a pb::FunctionTool>, Status> {
    use pb::tool_choice::Mode;
    let choice = req.tool_choice.clone().unwrap_or_default();
    let mode = choice.mode();
    if mode == Mode::None {
        return Ok(Vec::new());
    }
    if mode == Mode::Named {
        return req
            .tools
            .iter()
            .find(|t| t.name == choice.function_name)
            .map(|t| vec![t])
            .ok_or_else(|| {
                status::invalid_request(format!(
                    "tool_choice names `{}`, which is not among the tools",
                    choice.function_name
                ))
            });
    }
    if req.tools.is_empty() {
        return if mode == Mode::Required {
            Err(status::invalid_request(
                "tool_choice is `required` but no tools were given",
            ))
        } else {
            Ok(Vec::new())
        };
    }
    let mut mentioned: Vec<(usize, &pb::FunctionTool)> = req
        .tools
        .iter()
        .filter_map(|t| first_mention(last_user, &t.name).map(|at| (at, t)))
        .collect();
    mentioned.sort_by_key(|(at, _)| *at);
    let mut calls: Vec<&pb::FunctionTool> = mentioned.into_iter().map(|(_, t)| t).collect();
    match mode {
        Mode::Required => {
            if calls.is_empty() {
                calls = req.tools.first().into_iter().collect();
            }
        }
        _ => {
            if req.messages.last().is_some_and(|m| m.role == "tool") {
                return Ok(Vec::new());
            }
        }
    }
    if !req.parallel_tool_calls {
        calls.truncate(1);
    }
    Ok(calls)
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

/// JSON text of generated arguments for a tool.
fn tool_arguments(tool: &pb::FunctionTool, rng: &mut Rng) -> Result<String, Status> {
    if tool.parameters_json.trim().is_empty() {
        return Ok("{}".to_owned());
    }
    let schema: serde_json::Value = serde_json::from_str(&tool.parameters_json).map_err(|e| {
        status::invalid_request(format!(
            "parameters of tool `{}` are not JSON: {e}",
            tool.name
        ))
    })?;
    Ok(schema_gen::generate(&schema, rng).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn tokens_go_out_at_the_next_decode_step() {
        let epoch = tokio::time::Instant::now();
        let ms = Duration::from_millis;
        // On a step: unchanged. Between steps: the next one.
        assert_eq!(on_step_grid(epoch + ms(40), epoch, ms(20)), epoch + ms(40));
        assert_eq!(on_step_grid(epoch + ms(41), epoch, ms(20)), epoch + ms(60));
        assert_eq!(on_step_grid(epoch + ms(59), epoch, ms(20)), epoch + ms(60));
        // Two streams that started apart share their steps.
        let (a, b) = (epoch + ms(3), epoch + ms(17));
        assert_eq!(
            on_step_grid(a + ms(20), epoch, ms(20)),
            on_step_grid(b + ms(20), epoch, ms(20))
        );
    }

    fn text(t: &str) -> pb::ContentPart {
        pb::ContentPart {
            part: Some(pb::content_part::Part::Text(t.into())),
        }
    }

    fn msg(role: &str, t: &str) -> pb::Message {
        pb::Message {
            role: role.into(),
            content: vec![text(t)],
            ..Default::default()
        }
    }

    fn request(user: &str) -> pb::GenerateRequest {
        pb::GenerateRequest {
            request_id: "req-1".into(),
            model: "base".into(),
            messages: vec![msg("system", "be brief"), msg("user", user)],
            sampling: Some(pb::Sampling::default()),
            ..Default::default()
        }
    }

    fn job(req: pb::GenerateRequest, limit: u32) -> Job {
        let prompt = tokenizer::render(&req);
        Job {
            request: req,
            prompt,
            cached_prompt_tokens: 0,
            completion_limit: limit,
        }
    }

    fn texts(p: &Script) -> String {
        p.steps
            .iter()
            .filter_map(|s| match &s.event {
                Event::Text(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn reasoning_text(p: &Script) -> String {
        p.steps
            .iter()
            .filter_map(|s| match &s.event {
                Event::Reasoning(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn usage(p: &Script) -> pb::Usage {
        p.finished.usage.unwrap_or_default()
    }

    fn calls(p: &Script) -> Vec<(String, String, String)> {
        let mut out: Vec<(String, String, String)> = Vec::new();
        for s in &p.steps {
            if let Event::ToolCall(d) = &s.event {
                if !d.id.is_empty() {
                    assert_eq!(
                        d.index as usize,
                        out.len(),
                        "first delta per index in order"
                    );
                    out.push((d.id.clone(), d.name.clone(), String::new()));
                } else {
                    assert!(d.name.is_empty(), "only the first delta carries the name");
                    out[d.index as usize].2.push_str(&d.arguments_fragment);
                }
            }
        }
        out
    }

    fn weather_tools() -> Vec<pb::FunctionTool> {
        vec![
            pb::FunctionTool {
                name: "get_weather".into(),
                parameters_json: json!({
                    "type": "object",
                    "properties": {
                        "city": {"type": "string"},
                        "unit": {"type": "string", "enum": ["c", "f"]},
                        "days": {"type": "integer", "minimum": 1, "maximum": 7}
                    },
                    "required": ["city", "unit"],
                    "additionalProperties": false
                })
                .to_string(),
                strict: true,
                ..Default::default()
            },
            pb::FunctionTool {
                name: "get_time".into(),
                parameters_json: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}).to_string(),
                ..Default::default()
            },
        ]
    }

    #[test]
    fn deterministic_given_prompt_and_seed() {
        let a = script(&job(request("tell me a story"), 1000)).expect("script");
        let b = script(&job(request("tell me a story"), 1000)).expect("script");
        assert_eq!(a, b);
        let c = script(&job(request("tell me another story"), 1000)).expect("script");
        assert_ne!(texts(&a), texts(&c));
        let mut seeded = request("tell me a story");
        seeded.sampling = Some(pb::Sampling {
            seed: Some(7),
            ..Default::default()
        });
        assert_ne!(
            texts(&a),
            texts(&script(&job(seeded, 1000)).expect("script"))
        );
        let n = usage(&a).completion_tokens;
        assert!((16..=48).contains(&n), "default length {n}");
        assert_eq!(a.finished.reason(), Reason::Stop);
        assert_eq!(usage(&a).reasoning_tokens, 0);
    }

    #[test]
    fn reply_tokens_is_exact_and_max_tokens_cuts_with_length() {
        let p = script(&job(request("hi synthetic:reply_tokens=100"), 10_000)).expect("script");
        assert_eq!(usage(&p).completion_tokens, 100);
        assert_eq!(p.steps.len(), 100);
        assert_eq!(p.finished.reason(), Reason::Stop);
        // The text is really 100 o200k tokens.
        let count = tokenizer::count(&texts(&p));
        assert!((95..=105).contains(&count), "bpe count {count}");

        let p = script(&job(request("hi synthetic:reply_tokens=100"), 7)).expect("script");
        assert_eq!(usage(&p).completion_tokens, 7);
        assert_eq!(p.finished.reason(), Reason::Length);
    }

    #[test]
    fn stop_string_ends_the_text_before_it() {
        let full = script(&job(request("hi synthetic:reply_tokens=30"), 1000)).expect("script");
        let full_text = texts(&full);
        // Pick a word from the middle as the stop string.
        let stop = full_text.split(' ').nth(10).expect("word").to_owned();
        let stop = format!(" {stop}");
        let mut req = request("hi synthetic:reply_tokens=30");
        req.sampling = Some(pb::Sampling {
            stop: vec![stop.clone()],
            ..Default::default()
        });
        let p = script(&job(req, 1000)).expect("script");
        let at = full_text.find(&stop).expect("stop occurs");
        assert_eq!(texts(&p), &full_text[..at]);
        assert_eq!(p.finished.reason(), Reason::Stop);
        assert!(usage(&p).completion_tokens < 30);
    }

    #[test]
    fn echo_replies_with_the_last_user_message() {
        let p = script(&job(request("synthetic:echo naïve 日本 text"), 1000)).expect("script");
        assert_eq!(texts(&p), "synthetic:echo naïve 日本 text");
        assert_eq!(
            usage(&p).completion_tokens,
            tokenizer::count("synthetic:echo naïve 日本 text")
        );
    }

    #[test]
    fn echo_messages_lists_what_the_worker_received() {
        let mut req = request("first synthetic:echo_messages");
        req.messages.push(pb::Message {
            role: "assistant".into(),
            tool_calls: vec![pb::ToolCall {
                id: "call_1".into(),
                name: "get_time".into(),
                arguments: "{\"tz\":\"UTC\"}".into(),
            }],
            ..Default::default()
        });
        let mut result = msg("tool", "12:00");
        result.tool_call_id = "call_1".into();
        req.messages.push(result);
        let p = script(&job(req, 1000)).expect("script");
        assert_eq!(
            texts(&p),
            "system: be brief\nuser: first synthetic:echo_messages\n\
             assistant: get_time({\"tz\":\"UTC\"})\ntool (call_1): 12:00"
        );
    }

    #[test]
    fn reasoning_is_capped_by_budget_and_counted() {
        let mut req = request("think");
        req.reasoning = Some(pb::Reasoning {
            enabled: true,
            budget_tokens: 5,
            effort: String::new(),
        });
        let p = script(&job(req.clone(), 1000)).expect("script");
        let u = usage(&p);
        assert_eq!(u.reasoning_tokens, 5);
        assert!(u.completion_tokens > 5);
        assert!(matches!(p.steps[0].event, Event::Reasoning(_)));
        assert!(!reasoning_text(&p).is_empty());

        req.reasoning = Some(pb::Reasoning {
            enabled: true,
            budget_tokens: 0,
            effort: "high".into(),
        });
        let u = usage(&script(&job(req.clone(), 1000)).expect("script"));
        assert!((20..=60).contains(&u.reasoning_tokens));

        // max_tokens counts reasoning too.
        let p = script(&job(req, 3)).expect("script");
        assert_eq!(usage(&p).reasoning_tokens, 3);
        assert_eq!(usage(&p).completion_tokens, 3);
        assert_eq!(p.finished.reason(), Reason::Length);
    }

    #[test]
    fn tool_choice_modes() {
        use pb::tool_choice::Mode;
        let with = |user: &str, mode: Mode, name: &str, parallel: bool| {
            let mut req = request(user);
            req.tools = weather_tools();
            req.tool_choice = Some(pb::ToolChoice {
                mode: mode as i32,
                function_name: name.into(),
            });
            req.parallel_tool_calls = parallel;
            script(&job(req, 10_000)).expect("script")
        };
        // AUTO: no mention -> text; mention -> call.
        let p = with("hello there", Mode::Auto, "", true);
        assert!(calls(&p).is_empty());
        assert_eq!(p.finished.reason(), Reason::Stop);
        let p = with("use get_weather please", Mode::Auto, "", true);
        assert_eq!(calls(&p).len(), 1);
        assert_eq!(calls(&p)[0].1, "get_weather");
        assert_eq!(p.finished.reason(), Reason::ToolCalls);
        // A longer identifier is not a mention.
        assert!(calls(&with("get_weather_v2", Mode::Auto, "", true)).is_empty());
        // Parallel: both mentioned tools in mention order; not parallel: first.
        let p = with("get_time then get_weather", Mode::Auto, "", true);
        let names: Vec<String> = calls(&p).into_iter().map(|c| c.1).collect();
        assert_eq!(names, ["get_time", "get_weather"]);
        assert_eq!(
            calls(&with("get_time then get_weather", Mode::Auto, "", false)).len(),
            1
        );
        // NONE never calls; REQUIRED calls the first tool; NAMED calls it.
        assert!(calls(&with("get_weather", Mode::None, "", true)).is_empty());
        assert_eq!(
            calls(&with("hello", Mode::Required, "", true))[0].1,
            "get_weather"
        );
        assert_eq!(
            calls(&with("hello", Mode::Named, "get_time", true))[0].1,
            "get_time"
        );
        let mut req = request("x");
        req.tools = weather_tools();
        req.tool_choice = Some(pb::ToolChoice {
            mode: Mode::Named as i32,
            function_name: "nope".into(),
        });
        assert!(script(&job(req, 100)).is_err());
    }

    #[test]
    fn tool_arguments_validate_and_ids_have_the_right_shape() {
        let tools = weather_tools();
        let validator = jsonschema::validator_for(
            &serde_json::from_str::<Value>(&tools[0].parameters_json).expect("json"),
        )
        .expect("schema");
        for i in 0..30 {
            let mut req = request(&format!("call get_weather for city {i}"));
            req.tools = tools.clone();
            let p = script(&job(req, 10_000)).expect("script");
            let c = calls(&p);
            assert_eq!(c.len(), 1);
            let (id, _, args) = &c[0];
            assert!(id.starts_with("call_") && id.len() == 29, "{id}");
            assert!(id[5..].chars().all(|ch| ch.is_ascii_alphanumeric()));
            let v: Value = serde_json::from_str(args).expect("arguments are JSON");
            assert!(validator.is_valid(&v), "{v}");
            let fragments = p
                .steps
                .iter()
                .filter(|s| matches!(&s.event, Event::ToolCall(d) if d.id.is_empty()))
                .count();
            assert!(fragments > 1, "streamed in several fragments");
        }
    }

    #[test]
    fn coalescing_keeps_the_content_and_the_token_counts() {
        let mut req = request("get_weather synthetic:reply_tokens=40");
        req.reasoning = Some(pb::Reasoning {
            enabled: true,
            budget_tokens: 10,
            effort: String::new(),
        });
        let p = script(&job(req.clone(), 10_000)).expect("script");
        let merged = coalesce(p.steps.clone(), 8);
        assert!(merged.len() < p.steps.len());
        assert!(merged.iter().all(|s| s.tokens <= 8));
        let sum = |steps: &[Step]| steps.iter().map(|s| s.tokens).sum::<u32>();
        assert_eq!(sum(&merged), sum(&p.steps));
        let with = Script {
            steps: merged,
            ..p.clone()
        };
        assert_eq!(texts(&with), texts(&p));
        assert_eq!(reasoning_text(&with), reasoning_text(&p));

        req.tools = weather_tools();
        let p = script(&job(req, 10_000)).expect("script");
        let with = Script {
            steps: coalesce(p.steps.clone(), 8),
            ..p.clone()
        };
        assert_eq!(calls(&with), calls(&p));
    }

    #[test]
    fn after_a_tool_result_auto_answers_in_text_quoting_it() {
        let mut req = request("what is the weather? use get_weather");
        req.tools = weather_tools();
        req.messages.push(pb::Message {
            role: "assistant".into(),
            tool_calls: vec![pb::ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: "{}".into(),
            }],
            ..Default::default()
        });
        let mut result = msg("tool", "{\"temp\": 21}");
        result.tool_call_id = "call_1".into();
        req.messages.push(result);
        let p = script(&job(req, 10_000)).expect("script");
        assert!(calls(&p).is_empty());
        assert!(texts(&p).contains("{\"temp\": 21}"), "{}", texts(&p));
        assert_eq!(p.finished.reason(), Reason::Stop);
    }

    #[test]
    fn scripted_json_replies_answer_each_json_call_in_turn() {
        let user = msg(
            "user",
            r#"plan it synthetic:json_replies={"n":0} {"n":1} [2] then words"#,
        );
        let at = |extra: Vec<pb::Message>| {
            let mut m = vec![msg("system", "s"), user.clone()];
            m.extend(extra);
            scripted_json_reply(&m)
        };
        assert_eq!(at(vec![]).as_deref(), Some(r#"{"n":0}"#));
        assert_eq!(
            at(vec![msg("assistant", "x"), msg("user", "again")]).as_deref(),
            Some(r#"{"n":1}"#)
        );
        let many = vec![
            msg("assistant", "a"),
            msg("user", "b"),
            msg("assistant", "c"),
            msg("user", "d"),
            msg("assistant", "e"),
            msg("user", "f"),
        ];
        assert_eq!(at(many).as_deref(), Some("[2]"));
        assert_eq!(scripted_json_reply(&[msg("user", "no directive")]), None);
    }

    #[test]
    fn structured_output_validates() {
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name", "age"],
            "additionalProperties": false
        });
        let mut req = request("give me a person");
        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonSchema as i32,
            schema_name: "person".into(),
            schema_json: schema.to_string(),
            strict: true,
        });
        let p = script(&job(req.clone(), 10_000)).expect("script");
        let v: Value = serde_json::from_str(&texts(&p)).expect("json");
        assert!(jsonschema::is_valid(&schema, &v));
        assert!(p.steps.len() > 3);

        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonObject as i32,
            ..Default::default()
        });
        let p = script(&job(req.clone(), 10_000)).expect("script");
        let v: Value = serde_json::from_str(&texts(&p)).expect("json");
        assert!(v.is_object());
        // Cut by max_tokens: LENGTH.
        let p = script(&job(req, 3)).expect("script");
        assert_eq!(p.finished.reason(), Reason::Length);
    }
}
