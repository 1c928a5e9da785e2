//! The shared pipeline: from a `GenerateRequest` to a [`SequenceEngine`]
//! sequence, and from its token stream to `inference.v1` events. The same
//! for every sequence-level engine:
//!
//! - [`request`]: messages flattened to text, tools listed, the output
//!   constraint (JSON object / schema / tool call), the reasoning budget;
//! - the engine renders (its own chat template) and tokenizes; the context
//!   window check uses its real window and token count;
//! - per token: [`utf8`] (bytes to whole characters), [`stop`] (stop strings
//!   across token boundaries), the length cut, [`tool_calls`] (the
//!   constrained JSON into proto tool-call deltas; with `tool_choice` auto,
//!   a reply that starts as a call), [`coalesce`] (what came faster than
//!   the stream took it, up to the engine's
//!   [`max_tokens_per_event`](SequenceEngine::max_tokens_per_event));
//! - image parts, for an engine that takes them: placeholders in the text,
//!   rendered by the engine, their cost reported as `image_tokens`;
//! - the end: an engine failure still sends what was produced before it;
//!   after its `Finished` event the stream ends when the engine lets go of
//!   the sequence (its trailers come then);
//! - reasoning on a model without native thinking: the prompt opens a
//!   `<think>` section; the first sequence runs until the model writes
//!   `</think>`, ends its turn, or spends the budget; its tokens stream as
//!   reasoning. A second sequence then continues the same prompt with the
//!   section closed (its prefix reused from the engine's cache) and gives the
//!   answer, under the output constraint. Both count as completion tokens;
//!   the first as `reasoning_tokens`.

pub mod coalesce;
pub mod request;
pub mod resume;
pub mod stop;
pub mod tool_calls;
pub mod utf8;

use crate::seam::chat::OnCached;
use crate::seam::sequence::{
    ChatMessage, SeqEnd, SeqEvent, Sequence, SequenceEngine, SequenceStream, TokenId,
};
use crate::seam::tokens::saturate;
use crate::seam::{CacheHit, Cancelled, EventSink, Outcome, Started};
use crate::status;
use coalesce::Coalescer;
use inference_proto::v1 as pb;
use pb::finished::Reason;
use pb::generate_event::Event;
use request::{RequestPlan, ToolMode};
use resume::Resume;
use std::sync::Arc;
use stop::StopScanner;
use tonic::Status;
use tool_calls::{CallDetector, Detected, ToolCallParser};
use utf8::Utf8Stream;

/// Opens the think section on models without native thinking tags.
pub const THINK_OPEN: &str = "<think>\n";
/// Ends it (written by the model, or by the pipeline when the budget is spent).
pub const THINK_CLOSE: &str = "</think>";

/// Prompts up to this many bytes of message text are rendered and
/// tokenized on the request's own task.
const INLINE_PROMPT_BYTES: usize = 2048;

/// How long a batched reply (`batch_events`) holds its output before
/// sending what it has. Its first output goes out at once (the gateway
/// times the first token by it), later output once per period: the
/// gateway then knows what was generated if its client leaves mid-way
/// (billed and stored up to there), at one event a second.
const BATCH_FLUSH_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// A request rendered and tokenized by its engine, not yet started.
pub struct Prepared {
    engine: Arc<dyn SequenceEngine>,
    request_id: String,
    cache_key: String,
    batch: bool,
    plan: RequestPlan,
    prompt_text: String,
    prompt: Vec<TokenId>,
    /// Of the prompt, image parts.
    image_tokens: u32,
    completion_limit: u32,
    /// What a moved generation already delivered.
    resume: Option<Resume>,
}

/// Plans, renders and tokenizes a request (a long prompt off the async
/// threads: it takes milliseconds).
pub async fn prepare(
    engine: Arc<dyn SequenceEngine>,
    req: pb::GenerateRequest,
) -> Result<Prepared, Status> {
    let plan = request::plan(&req, engine.accepts_images())?;
    let image_tokens = plan
        .messages
        .iter()
        .flat_map(|m| &m.images)
        .map(|i| engine.image_tokens(i))
        .fold(0u32, u32::saturating_add);
    let think = plan.reasoning_budget.is_some();
    let render = move |eng: &dyn SequenceEngine, messages: &[ChatMessage]| {
        let mut text = eng.render(messages)?;
        if think {
            text.push_str(THINK_OPEN);
        }
        let tokens = eng.tokenize(&text)?;
        Ok::<_, Status>((text, tokens))
    };
    let text_bytes: usize = plan.messages.iter().map(|m| m.content.len()).sum();
    let (prompt_text, prompt) = if text_bytes <= INLINE_PROMPT_BYTES {
        // A short prompt tokenizes in microseconds: less than the hop to
        // the blocking pool costs.
        render(engine.as_ref(), &plan.messages)?
    } else {
        let eng = Arc::clone(&engine);
        let messages = plan.messages.clone();
        tokio::task::spawn_blocking(move || render(eng.as_ref(), &messages))
            .await
            .map_err(|e| status::engine_failure(format!("tokenizer task failed: {e}")))??
    };
    Ok(Prepared {
        engine,
        request_id: req.request_id,
        cache_key: req.cache_key,
        batch: req.batch_events,
        plan,
        prompt_text,
        prompt,
        image_tokens,
        completion_limit: 0,
        resume: req.resume.map(Resume::from_proto),
    })
}

/// The context-window check every engine shares: a prompt that does not
/// fit with `max_tokens` (0 = unset) is `context_length_exceeded`;
/// otherwise the completion limit, `max_tokens` or the rest of the window.
pub fn fit_window(window: u32, prompt: u32, max_tokens: u32) -> Result<u32, Status> {
    let over = prompt >= window
        || (max_tokens > 0 && u64::from(prompt) + u64::from(max_tokens) > u64::from(window));
    if over {
        return Err(status::context_length_exceeded(window, prompt, max_tokens));
    }
    Ok(if max_tokens > 0 {
        max_tokens
    } else {
        window - prompt
    })
}

impl Prepared {
    /// `prompt_tokens`: the model's own count.
    pub fn prompt_tokens(&self) -> u32 {
        saturate(self.prompt.len())
    }

    /// The engine's real window governs: a prompt that does not fit with
    /// `max_tokens` fails now; with `max_tokens` unset the rest of the window
    /// is the ceiling.
    pub fn check_window(&mut self) -> Result<(), Status> {
        self.completion_limit = fit_window(
            self.engine.context_window(),
            self.prompt_tokens(),
            self.plan.max_tokens,
        )?;
        Ok(())
    }

    /// Starts the first sequence (a bad schema fails here, before the
    /// stream opens). `on_cached` hears the count of reused prompt tokens
    /// after prefill. A moved generation starts where its delivered output
    /// ends: in the think section, or in the answer.
    pub async fn start(self, on_cached: OnCached) -> Result<Running, Status> {
        let resume = self.resume.clone().unwrap_or_default();
        let remaining = self
            .completion_limit
            .saturating_sub(resume.completion_tokens);
        let budget = self
            .plan
            .reasoning_budget
            .map(|b| b.min(self.completion_limit));
        let think_left = budget.map(|b| b.saturating_sub(resume.reasoning_tokens).min(remaining));
        let thinking = think_left.is_some_and(|left| left > 0) && !resume.in_answer();
        let (prompt, resumed, max_tokens, constraint) = if thinking {
            let resumed = self.continuation(&self.prompt_text, &self.prompt, &resume.reasoning)?;
            (self.prompt.clone(), resumed, think_left.unwrap_or(0), None)
        } else {
            let output = resume.answer_output(self.plan.tools, self.plan.parallel_tool_calls);
            let after_think;
            let (prompt_text, prompt) = match budget {
                Some(_) => {
                    after_think = answer_prompt(&self.prompt_text, &resume.reasoning);
                    let tokens = self.engine.tokenize(&after_think)?;
                    (after_think.as_str(), tokens)
                }
                None => (self.prompt_text.as_str(), self.prompt.clone()),
            };
            let resumed = self.continuation(prompt_text, &prompt, &output)?;
            (prompt, resumed, remaining, self.plan.constraint.clone())
        };
        let stream = if max_tokens == 0 {
            // The failed worker had generated all it could: the reply ends
            // here, cut at its length.
            None
        } else {
            Some(
                self.engine
                    .start(Sequence {
                        prompt,
                        sampling: self.plan.sampling,
                        max_tokens,
                        constraint,
                        cache_key: self.cache_key.clone(),
                        resumed,
                    })
                    .await?,
            )
        };
        Ok(Running {
            prepared: self,
            resume,
            thinking,
            stream,
            phase_max: max_tokens,
            on_cached,
        })
    }

    /// The tokens of `output` as they follow `prompt` (rendered from
    /// `prompt_text`): the whole is tokenized so the seam tokenizes as the
    /// model would have, and the prompt's own tokens must come out the same.
    fn continuation(
        &self,
        prompt_text: &str,
        prompt: &[TokenId],
        output: &str,
    ) -> Result<Vec<TokenId>, Status> {
        if output.is_empty() {
            return Ok(Vec::new());
        }
        let whole = self.engine.tokenize(&format!("{prompt_text}{output}"))?;
        match whole.strip_prefix(prompt) {
            Some(rest) => Ok(rest.to_vec()),
            None => Err(status::invalid_request(
                "the delivered output cannot continue this prompt: its tokens merge across the seam",
            )),
        }
    }
}

/// The prompt of the answer after a think section: the same prompt with
/// the section closed.
fn answer_prompt(prompt_text: &str, reasoning: &str) -> String {
    format!("{prompt_text}{}\n{THINK_CLOSE}\n\n", reasoning.trim_end())
}

/// A started request, ready to stream.
pub struct Running {
    prepared: Prepared,
    /// What a moved generation already delivered (empty otherwise).
    resume: Resume,
    /// The first sequence is the think section.
    thinking: bool,
    /// `None`: nothing is left to generate (a moved generation at its limit).
    stream: Option<SequenceStream>,
    phase_max: u32,
    on_cached: OnCached,
}

/// What a phase's output turns into.
enum Mode {
    Reasoning(StopScanner),
    Text(StopScanner),
    Tools(ToolCallParser),
    /// Text or calls, not known yet (`tool_choice` auto).
    Detect(CallDetector, StopScanner, ToolCallParser),
}

/// How a phase ended.
enum PhaseEnd {
    /// End of generation, or a stop string (its index in the request's
    /// list).
    Stop(Option<u32>),
    Length,
    Cancelled,
    Failed(Status),
}

/// Streams events out, merged by a [`Coalescer`].
struct Emitter<'a> {
    out: &'a EventSink,
    coalescer: Coalescer,
    batch: bool,
    /// The engine's cap on tokens per event.
    per_event: Option<u32>,
    /// Tokens in the events not yet sent.
    pending_tokens: u32,
    /// Tokens generated since the last output event sent: the next one
    /// accounts for them (`GenerateEvent.output_tokens`).
    unreported_tokens: u32,
    /// When a batched reply last sent output (`None`: not yet).
    last_flush: Option<std::time::Instant>,
    /// The engine ended the last phase itself (`Finished`).
    engine_finished: bool,
    completion_tokens: u32,
    cached: Option<u32>,
    /// Told the reused prompt tokens once, at the first prefill.
    on_cached: OnCached,
    reasoning_text: String,
}

impl<'a> Emitter<'a> {
    async fn send(&mut self, event: Event) -> Result<(), Cancelled> {
        if let Some(ready) = self.coalescer.push(event) {
            self.send_counted(ready).await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), Cancelled> {
        self.pending_tokens = 0;
        match self.coalescer.take() {
            Some(ev) => {
                self.last_flush = Some(std::time::Instant::now());
                self.send_counted(ev).await
            }
            None => Ok(()),
        }
    }

    async fn send_counted(&mut self, event: Event) -> Result<(), Cancelled> {
        let tokens = std::mem::take(&mut self.unreported_tokens);
        self.out.send_counted(event, tokens).await
    }

    /// Whether the pending output goes out after this token: a streamed
    /// reply sends what the engine produced faster than the stream took it
    /// (up to the engine's cap per event); a batched one its first output,
    /// then once per [`BATCH_FLUSH_PERIOD`].
    fn flush_due(&self, stream: &SequenceStream) -> bool {
        if self.batch {
            return !self.coalescer.is_empty()
                && self
                    .last_flush
                    .is_none_or(|at| at.elapsed() >= BATCH_FLUSH_PERIOD);
        }
        let full = self.per_event.is_some_and(|n| self.pending_tokens >= n);
        full || stream.is_empty()
    }

    /// Emits text in the phase's mode; the stop string found, if one was.
    async fn emit(&mut self, mode: &mut Mode, text: &str) -> Result<Option<u32>, Cancelled> {
        let held;
        let text = match mode {
            Mode::Detect(detector, ..) => match detector.push(text) {
                Detected::Undecided => return Ok(None),
                decided => {
                    held = detector.take();
                    decide(mode, decided);
                    held.as_str()
                }
            },
            _ => text,
        };
        let reasoning = mode_is_reasoning(mode);
        match mode {
            Mode::Reasoning(scan) | Mode::Text(scan) => {
                let s = scan.push(text);
                self.emit_plain(reasoning, s.text).await?;
                Ok(s.stopped)
            }
            Mode::Tools(parser) => {
                for d in parser.push(text) {
                    self.send(Event::ToolCall(d)).await?;
                }
                Ok(None)
            }
            Mode::Detect(..) => Ok(None),
        }
    }

    async fn emit_plain(&mut self, reasoning: bool, text: String) -> Result<(), Cancelled> {
        if text.is_empty() {
            return Ok(());
        }
        if reasoning {
            self.reasoning_text.push_str(&text);
            self.send(Event::Reasoning(pb::ReasoningDelta { text }))
                .await
        } else {
            self.send(Event::Text(pb::TextDelta { text })).await
        }
    }

    /// The end of a phase without a stop string: release held text.
    async fn release(&mut self, mode: &mut Mode, utf8: &mut Utf8Stream) -> Result<(), Cancelled> {
        let rest = utf8.finish();
        if !rest.is_empty() {
            self.emit(mode, &rest).await?;
        }
        if let Mode::Detect(detector, ..) = mode {
            // Ended before it could be a call: text.
            let held = detector.take();
            decide(mode, Detected::Text);
            self.emit(mode, &held).await?;
        }
        let reasoning = mode_is_reasoning(mode);
        if let Mode::Reasoning(scan) | Mode::Text(scan) = mode {
            let held = scan.flush();
            self.emit_plain(reasoning, held).await?;
        }
        Ok(())
    }

    /// Runs one sequence to its end.
    async fn phase(&mut self, stream: &mut SequenceStream, mode: &mut Mode, max: u32) -> PhaseEnd {
        let mut utf8 = Utf8Stream::default();
        let mut tokens = 0u32;
        self.engine_finished = false;
        loop {
            let event = tokio::select! {
                biased;
                _ = self.out.closed() => return PhaseEnd::Cancelled,
                ev = stream.recv() => ev,
            };
            let step = match event {
                None => Err(status::engine_failure("the engine dropped the sequence")),
                Some(Err(s)) => Err(s),
                Some(Ok(ev)) => Ok(ev),
            };
            let ev = match step {
                Ok(ev) => ev,
                Err(s) => {
                    // What was produced before the failure still goes out.
                    if self.flush().await.is_err() {
                        return PhaseEnd::Cancelled;
                    }
                    return PhaseEnd::Failed(s);
                }
            };
            // (how it ended, whether held text is released: not after a
            // stop string, whose scanner already dropped what followed it)
            let end = match ev {
                SeqEvent::Prefilled {
                    cached_tokens,
                    slot,
                } => {
                    if self.cached.is_none() {
                        self.cached = Some(cached_tokens);
                        (self.on_cached)(CacheHit {
                            cached_tokens,
                            slot,
                        });
                    }
                    None
                }
                SeqEvent::Token { bytes, .. } => {
                    self.out.generated(1);
                    tokens += 1;
                    self.completion_tokens += 1;
                    self.pending_tokens += 1;
                    self.unreported_tokens += 1;
                    let text = utf8.push(&bytes);
                    match self.emit(mode, &text).await {
                        Err(Cancelled) => return PhaseEnd::Cancelled,
                        Ok(Some(stop)) => return PhaseEnd::Stop(Some(stop)),
                        Ok(None) if tokens >= max => Some(PhaseEnd::Length),
                        Ok(None) => None,
                    }
                }
                SeqEvent::Finished(end) => {
                    self.engine_finished = true;
                    Some(match end {
                        SeqEnd::EndOfGeneration => PhaseEnd::Stop(None),
                        SeqEnd::MaxTokens => PhaseEnd::Length,
                    })
                }
            };
            if let Some(end) = end {
                if self.release(mode, &mut utf8).await.is_err() {
                    return PhaseEnd::Cancelled;
                }
                return end;
            }
            if self.flush_due(stream) && self.flush().await.is_err() {
                return PhaseEnd::Cancelled;
            }
        }
    }
}

fn mode_is_reasoning(mode: &Mode) -> bool {
    matches!(mode, Mode::Reasoning(_))
}

/// A detecting mode, once decided: text or calls.
fn decide(mode: &mut Mode, detected: Detected) {
    let Mode::Detect(_, scan, parser) = mode else {
        return;
    };
    let next = match detected {
        Detected::Call => Mode::Tools(std::mem::replace(parser, ToolCallParser::new(""))),
        Detected::Text | Detected::Undecided => Mode::Text(std::mem::take(scan)),
    };
    *mode = next;
}

#[async_trait::async_trait]
impl Started for Running {
    /// Streams the generation; the `Outcome` is for the worker's counters.
    async fn run(self: Box<Self>, out: EventSink) -> Outcome {
        let Running {
            prepared: p,
            resume,
            thinking,
            stream,
            phase_max,
            on_cached,
        } = *self;
        let mut em = Emitter {
            out: &out,
            coalescer: Coalescer::default(),
            batch: p.batch,
            per_event: p.engine.max_tokens_per_event(),
            pending_tokens: 0,
            unreported_tokens: 0,
            last_flush: None,
            engine_finished: false,
            completion_tokens: resume.completion_tokens,
            cached: None,
            on_cached,
            reasoning_text: resume.reasoning.clone(),
        };
        let mut reasoning_tokens = resume.reasoning_tokens;
        let Some(mut stream) = stream else {
            return finish(&mut em, (Reason::Length, None), reasoning_tokens, &p).await;
        };
        if thinking {
            let mut mode = Mode::Reasoning(StopScanner::new(&[THINK_CLOSE.to_owned()]));
            let end = em.phase(&mut stream, &mut mode, phase_max).await;
            drop(stream);
            reasoning_tokens = em.completion_tokens;
            match end {
                PhaseEnd::Cancelled => {
                    return Outcome::Cancelled {
                        tokens: em.completion_tokens,
                    }
                }
                PhaseEnd::Failed(s) => return out.finish_failed(s, em.completion_tokens).await,
                PhaseEnd::Length if reasoning_tokens >= p.completion_limit => {
                    return finish(&mut em, (Reason::Length, None), reasoning_tokens, &p).await;
                }
                PhaseEnd::Stop(_) | PhaseEnd::Length => {}
            }
            let text = answer_prompt(&p.prompt_text, &em.reasoning_text);
            let engine = Arc::clone(&p.engine);
            let tokens = match tokio::task::spawn_blocking(move || engine.tokenize(&text)).await {
                Ok(Ok(t)) => t,
                Ok(Err(s)) => return out.finish_failed(s, em.completion_tokens).await,
                Err(e) => {
                    let s = status::engine_failure(format!("tokenizer task failed: {e}"));
                    return out.finish_failed(s, em.completion_tokens).await;
                }
            };
            let window = p.engine.context_window();
            let room = window.saturating_sub(saturate(tokens.len()));
            let max = p
                .completion_limit
                .saturating_sub(reasoning_tokens)
                .min(room);
            if max == 0 {
                return finish(&mut em, (Reason::Length, None), reasoning_tokens, &p).await;
            }
            let started = p
                .engine
                .start(Sequence {
                    prompt: tokens,
                    sampling: p.plan.sampling,
                    max_tokens: max,
                    constraint: p.plan.constraint.clone(),
                    cache_key: p.cache_key.clone(),
                    resumed: Vec::new(),
                })
                .await;
            stream = match started {
                Ok(s) => s,
                Err(s) => return out.finish_failed(s, em.completion_tokens).await,
            };
            return answer(
                &mut em,
                stream,
                max,
                reasoning_tokens,
                &p,
                &Resume::default(),
            )
            .await;
        }
        answer(&mut em, stream, phase_max, reasoning_tokens, &p, &resume).await
    }
}

/// The answer's sequence to its end. A moved generation's answer goes on
/// in the mode its delivered output decided (text, or calls with their
/// parser past the delivered ones).
async fn answer(
    em: &mut Emitter<'_>,
    mut stream: SequenceStream,
    max: u32,
    reasoning_tokens: u32,
    p: &Prepared,
    resume: &Resume,
) -> Outcome {
    let (tools, parallel) = (p.plan.tools, p.plan.parallel_tool_calls);
    let mut mode = match tools {
        _ if !resume.tool_calls.is_empty() => {
            Mode::Tools(resume.parser(&p.request_id, tools, parallel))
        }
        ToolMode::Auto if !resume.text.is_empty() => Mode::Text(StopScanner::new(&p.plan.stop)),
        ToolMode::Constrained => Mode::Tools(ToolCallParser::new(&p.request_id)),
        ToolMode::Auto => Mode::Detect(
            CallDetector::new(&p.plan.tool_names),
            StopScanner::new(&p.plan.stop),
            ToolCallParser::new(&p.request_id),
        ),
        ToolMode::Off => Mode::Text(StopScanner::new(&p.plan.stop)),
    };
    let end = em.phase(&mut stream, &mut mode, max).await;
    // The engine's slot is freed now, unless it ended the sequence itself:
    // then the stream ends when it lets go (see `linger`).
    let rest = if em.engine_finished {
        Some(stream)
    } else {
        drop(stream);
        None
    };
    let (reason, stop) = match end {
        PhaseEnd::Cancelled => {
            return Outcome::Cancelled {
                tokens: em.completion_tokens,
            }
        }
        PhaseEnd::Failed(s) => return em.out.finish_failed(s, em.completion_tokens).await,
        PhaseEnd::Length => (Reason::Length, None),
        PhaseEnd::Stop(stop) => match &mode {
            Mode::Tools(parser) if parser.calls() > 0 => (Reason::ToolCalls, None),
            _ => (Reason::Stop, stop),
        },
    };
    let outcome = finish(em, (reason, stop), reasoning_tokens, p).await;
    if let (Outcome::Completed { .. }, Some(stream)) = (outcome, rest) {
        linger(em.out, stream).await;
    }
    outcome
}

/// After the last event: waits until the engine lets go of the sequence
/// (or the gateway leaves), so the stream's trailers come when the engine
/// is done with it.
async fn linger(out: &EventSink, mut stream: SequenceStream) {
    loop {
        tokio::select! {
            _ = out.closed() => return,
            ev = stream.recv() => if ev.is_none() { return },
        }
    }
}

/// The last event: how the reply ended (with the stop string that ended
/// it, if one did) and its usage.
async fn finish(
    em: &mut Emitter<'_>,
    (reason, stop_index): (Reason, Option<u32>),
    reasoning_tokens: u32,
    p: &Prepared,
) -> Outcome {
    let tokens = em.completion_tokens;
    if em.flush().await.is_err() {
        return Outcome::Cancelled { tokens };
    }
    let finished = pb::Finished {
        reason: reason as i32,
        stop_index,
        usage: Some(pb::Usage {
            prompt_tokens: p.prompt_tokens(),
            // A moved generation's engine may hold some of its resumed
            // output too: only the prompt's part is a prompt token.
            cached_prompt_tokens: em.cached.unwrap_or(0).min(p.prompt_tokens()),
            completion_tokens: tokens,
            reasoning_tokens,
            image_tokens: p.image_tokens,
        }),
    };
    em.out.finish(finished, tokens).await
}

#[cfg(test)]
mod tests;
