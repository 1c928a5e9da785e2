//! The `synthetic` engine: SIMULATED output for tests, benchmarks and load.
//!
//! Nothing here is a language model. It is a scripted sequence-level
//! engine ([`SequenceEngine`]): the shared [`crate::pipeline`] flattens the
//! request, the simulator renders it with a trivial template and tokenizes
//! it with o200k ([`tokenizer`]), and each sequence it starts streams the
//! tokens of a reply planned in full before the first one ([`script`]),
//! deterministically from the prompt and `sampling.seed`. Stop strings,
//! the length cut, the reasoning split, tool-call parsing, coalescing and
//! usage are the pipeline's, as for every sequence engine.
//!
//! Pacing: `--ttft-ms` before the prefill is reported (not for the answer
//! after a think section, whose prefix is cached), plus the prompt tokens
//! not in its prefix cache at `--prefill-tokens-per-second` (0 = free), then
//! `--tokens-per-second` (0 = as fast as the stream takes them; a
//! `synthetic:slow_ms=N` control overrides it). Paced sequences decode in
//! lockstep, as the sequences of a continuously batched GPU engine do: one
//! decode step gives every running sequence its next token at once. Steps
//! fall on one grid per process (multiples of the token interval since the
//! engine started) and each token goes out at the first step at or after
//! its own schedule, so the tokens of all streams due in a step leave
//! together. The pipeline sends one event per token, or up to
//! `--coalesce-tokens` when unpaced tokens come faster than the stream
//! takes them.
//!
//! Its prefix cache is simulated ([`prefix_cache`]): the prefill reports
//! the longest remembered 64-token-block prefix; it has no fixed slots
//! (`has_slots` false), so the worker's cache report estimates from the
//! prompts it sent.
//!
//! The test controls ([`controls`]) shape the stream as well as the reply:
//! `fail_after` ends the sequence with an error after N tokens, `hang`
//! sends nothing until the sequence is dropped, `trailers_ms` holds the
//! sequence open after its end (the pipeline ends the gRPC stream only when
//! the engine lets go of the sequence).

pub mod args;
pub mod controls;
pub mod conversation;
pub mod prefix_cache;
pub mod rng;
pub mod schema_gen;
pub mod script;
pub mod tokenizer;

use crate::model::ModelProfile;
use crate::seam::sequence::{
    ChatMessage, Image, SeqEnd, SeqEvent, Sequence, SequenceEngine, SequenceStream, TokenId,
};
use crate::seam::tokens::saturate;
use crate::status;
use controls::Controls;
use prefix_cache::PrefixCache;
use script::ReplyScript;
use std::time::Duration;
use tokenizer::Token;
use tokio::sync::mpsc;
use tonic::Status;

/// What `Info.description` says of this engine.
pub const DESCRIPTION: &str = "SIMULATED output from the synthetic engine: deterministic \
    English-like text, tool calls and JSON for tests, benchmarks and load. Not a language model.";

/// Prompts longer than this are planned off the async threads.
const BLOCKING_PLAN_TOKENS: usize = 16 * 1024;

/// Pacing of the synthetic engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyntheticConfig {
    pub ttft: Duration,
    /// Prefill pace of uncached prompt tokens; 0 = no prefill time.
    pub prefill_tokens_per_second: f64,
    /// 0 = no pacing.
    pub tokens_per_second: f64,
    /// Tokens the pipeline may merge into one event when they come faster
    /// than the stream takes them. 0 or 1 = one token per event.
    pub coalesce_tokens: u32,
    /// Chaos: every sequence fails after this many tokens, as
    /// `synthetic:fail_after=N` would (a worker with a broken device).
    pub fail_after_tokens: Option<u32>,
    /// Chaos: every sequence goes silent after this many tokens, until it
    /// is dropped (an engine stuck on its device).
    pub stall_after_tokens: Option<u32>,
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

impl SyntheticEngine {
    pub fn new(config: SyntheticConfig, model: ModelProfile) -> Self {
        Self {
            cache: PrefixCache::new(config.prefix_cache_blocks),
            config,
            model,
            epoch: tokio::time::Instant::now(),
        }
    }

    /// The time to prefill `tokens` uncached prompt tokens.
    fn prefill_time(&self, tokens: u64) -> Duration {
        let pace = self.config.prefill_tokens_per_second;
        if pace > 0.0 {
            Duration::from_secs_f64(tokens as f64 / pace)
        } else {
            Duration::ZERO
        }
    }

    /// The time between tokens for a plan: its `slow_ms`, else the pace.
    fn interval(&self, plan: &ReplyScript) -> Duration {
        match plan.controls.slow_ms {
            Some(ms) => Duration::from_millis(ms),
            None if self.config.tokens_per_second > 0.0 => {
                Duration::from_secs_f64(1.0 / self.config.tokens_per_second)
            }
            None => Duration::ZERO,
        }
    }
}

#[async_trait::async_trait]
impl SequenceEngine for SyntheticEngine {
    fn name(&self) -> &'static str {
        "synthetic"
    }

    fn description(&self) -> String {
        DESCRIPTION.to_owned()
    }

    fn context_window(&self) -> u32 {
        self.model.context_window
    }

    fn render(&self, messages: &[ChatMessage]) -> Result<String, Status> {
        Ok(tokenizer::render(messages))
    }

    /// Share of the simulated prefix cache in use.
    fn kv_cache_usage(&self) -> Option<f64> {
        Some(self.cache.usage())
    }

    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, Status> {
        Ok(tokenizer::tokenize(text))
    }

    /// Images only where the public model takes them.
    fn accepts_images(&self) -> bool {
        self.model.image_input
    }

    fn image_tokens(&self, image: &Image) -> u32 {
        tokenizer::image_tokens(&image.detail)
    }

    fn max_tokens_per_event(&self) -> Option<u32> {
        Some(self.config.coalesce_tokens.max(1))
    }

    async fn start(&self, sequence: Sequence) -> Result<SequenceStream, Status> {
        let cached_tokens = self.cache.lookup_and_insert(&sequence.prompt);
        let uncached = (sequence.prompt.len() as u64).saturating_sub(u64::from(cached_tokens));
        let mut plan = if sequence.prompt.len() < BLOCKING_PLAN_TOKENS {
            plan_continued(&sequence)?
        } else {
            tokio::task::spawn_blocking(move || plan_continued(&sequence))
                .await
                .map_err(|e| status::engine_failure(format!("reply script task failed: {e}")))??
        };
        if plan.controls.fail_after.is_none() {
            plan.controls.fail_after = self.config.fail_after_tokens;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let run = Run {
            stall_after: self.config.stall_after_tokens,
            ttft: if plan.after_think {
                Duration::ZERO
            } else {
                self.config.ttft + self.prefill_time(uncached)
            },
            interval: self.interval(&plan),
            epoch: self.epoch,
        };
        let script = Script::new(plan, cached_tokens);
        if run.is_immediate(&script) {
            // Nothing to wait for: every event is queued now, with no task
            // of its own (and no wake-up per token).
            for event in script {
                if tx.send(event.result).is_err() {
                    break;
                }
            }
        } else {
            tokio::spawn(run.stream(script, tx));
        }
        Ok(rx)
    }
}

/// The plan of a sequence. A continued one (`resumed` output) is the same
/// reply its prompt plans, past the output already generated: a moved
/// generation reads as if it had never moved.
fn plan_continued(sequence: &Sequence) -> Result<ReplyScript, Status> {
    if sequence.resumed.is_empty() {
        return script::write(sequence);
    }
    let resumed = tokenizer::decode(&sequence.resumed);
    let whole = Sequence {
        max_tokens: sequence
            .max_tokens
            .saturating_add(saturate(sequence.resumed.len())),
        resumed: Vec::new(),
        ..sequence.clone()
    };
    let mut plan = script::write(&whole)?;
    plan.tokens = skip_output(std::mem::take(&mut plan.tokens), resumed.len());
    if plan.tokens.len() > sequence.max_tokens as usize {
        plan.tokens.truncate(sequence.max_tokens as usize);
        plan.end = SeqEnd::MaxTokens;
    }
    Ok(plan)
}

/// The tokens after the first `bytes` bytes of output (a token across
/// that point keeps its part after it).
fn skip_output(tokens: Vec<Token>, bytes: usize) -> Vec<Token> {
    let mut at = 0usize;
    let mut rest = Vec::with_capacity(tokens.len());
    for mut token in tokens {
        let end = at + token.bytes.len();
        if end > bytes {
            if at < bytes {
                token.bytes.drain(..bytes - at);
            }
            rest.push(token);
        }
        at = end;
    }
    rest
}

type Tx = mpsc::UnboundedSender<Result<SeqEvent, Status>>;

/// One event of a planned sequence, with the index of the token it is.
struct Scripted {
    /// Of a token: its place in the reply, for pacing.
    token: Option<u32>,
    result: Result<SeqEvent, Status>,
}

/// The events of a plan in order: the prefill, the tokens, then the end
/// (or the failure a control asks for).
struct Script {
    controls: Controls,
    thinking: bool,
    end: SeqEnd,
    total: u32,
    tokens: std::iter::Enumerate<std::vec::IntoIter<Token>>,
    prefilled: Option<u32>,
    done: bool,
}

impl Script {
    fn new(plan: ReplyScript, cached_tokens: u32) -> Self {
        Self {
            total: saturate(plan.tokens.len()),
            controls: plan.controls,
            thinking: plan.thinking,
            end: plan.end,
            tokens: plan.tokens.into_iter().enumerate(),
            prefilled: Some(cached_tokens),
            done: false,
        }
    }

    fn failure(&mut self, tokens: u32) -> Scripted {
        self.done = true;
        let message =
            format!("synthetic engine failure after {tokens} tokens (synthetic:fail_after)");
        let status = if self.controls.fail_unavailable {
            Status::unavailable(message)
        } else {
            status::engine_failure(message)
        };
        Scripted {
            token: None,
            result: Err(status),
        }
    }
}

impl Iterator for Script {
    type Item = Scripted;

    fn next(&mut self) -> Option<Scripted> {
        if self.done {
            return None;
        }
        if let Some(cached_tokens) = self.prefilled.take() {
            let event = SeqEvent::Prefilled {
                cached_tokens,
                slot: None,
            };
            return Some(Scripted {
                token: None,
                result: Ok(event),
            });
        }
        let fail_after = self.controls.fail_after;
        match self.tokens.next() {
            Some((i, token)) => {
                let i = i as u32;
                if fail_after.is_some_and(|n| i >= n) {
                    return Some(self.failure(i));
                }
                let event = SeqEvent::Token {
                    id: token.id,
                    bytes: token.bytes,
                };
                Some(Scripted {
                    token: Some(i),
                    result: Ok(event),
                })
            }
            // A reply shorter than `fail_after` still fails, at its end.
            None if fail_after.is_some() && !self.thinking => Some(self.failure(self.total)),
            None => {
                self.done = true;
                Some(Scripted {
                    token: None,
                    result: Ok(SeqEvent::Finished(self.end)),
                })
            }
        }
    }
}

/// How one sequence is paced.
struct Run {
    /// Silent after this many tokens (`--stall-after-tokens`).
    stall_after: Option<u32>,
    ttft: Duration,
    /// Between tokens; zero = unpaced.
    interval: Duration,
    epoch: tokio::time::Instant,
}

impl Run {
    /// Whether the script streams without any wait: no time to first
    /// token, no pacing, nothing held open.
    fn is_immediate(&self, script: &Script) -> bool {
        let c = &script.controls;
        self.ttft.is_zero()
            && self.interval.is_zero()
            && !c.hang
            && c.trailers_ms.is_none()
            && self.stall_after.is_none()
    }

    /// Streams a script until its end, or until the sequence is dropped.
    async fn stream(self, script: Script, tx: Tx) {
        let controls = script.controls.clone();
        if controls.hang {
            tx.closed().await;
            return;
        }
        if !self.ttft.is_zero() && !sleep_until(&tx, tokio::time::Instant::now() + self.ttft).await
        {
            return;
        }
        let start = tokio::time::Instant::now();
        for event in script {
            if event
                .token
                .zip(self.stall_after)
                .is_some_and(|(i, n)| i >= n)
            {
                tx.closed().await;
                return;
            }
            match event.token {
                Some(i) if self.interval.is_zero() && i % 16 == 15 => {
                    tokio::task::yield_now().await;
                }
                Some(_) if self.interval.is_zero() => {}
                Some(i) if i > 0 => {
                    let due = on_step_grid(start + self.interval * i, self.epoch, self.interval);
                    if !sleep_until(&tx, due).await {
                        return;
                    }
                }
                _ => {}
            }
            let finished = matches!(event.result, Ok(SeqEvent::Finished(_)));
            if tx.send(event.result).is_err() {
                return;
            }
            if finished {
                if let Some(ms) = controls.trailers_ms {
                    // Late trailers: the sequence is let go only after this pause.
                    let at = tokio::time::Instant::now() + Duration::from_millis(ms);
                    let _ = sleep_until(&tx, at).await;
                }
            }
        }
    }
}

/// Sleeps until `at`; false when the sequence was dropped first.
async fn sleep_until(tx: &Tx, at: tokio::time::Instant) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(at) => true,
        _ = tx.closed() => false,
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_continued_sequence_streams_what_follows_the_resumed_output() {
        let sequence = |resumed: &str, max_tokens| Sequence {
            prompt: tokenizer::tokenize(&tokenizer::render(&[ChatMessage {
                role: "user".into(),
                content: "Tell me about the sea.".into(),
                ..ChatMessage::default()
            }])),
            sampling: Default::default(),
            max_tokens,
            constraint: None,
            cache_key: String::new(),
            resumed: tokenizer::tokenize(resumed),
        };
        let text = |plan: &ReplyScript| -> String {
            let bytes: Vec<u8> = plan.tokens.iter().flat_map(|t| t.bytes.clone()).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        let whole = plan_continued(&sequence("", 200)).expect("plan");
        let reply = text(&whole);
        // Cut inside a token, as a worker that held back part of one.
        let cut = reply
            .char_indices()
            .nth(reply.chars().count() / 2 + 1)
            .map_or(0, |(i, _)| i);
        let rest = plan_continued(&sequence(&reply[..cut], 200)).expect("plan");
        assert_eq!(text(&rest), reply[cut..]);
        assert_eq!(rest.end, whole.end);
        let short = plan_continued(&sequence(&reply[..cut], 2)).expect("plan");
        assert_eq!(short.tokens.len(), 2);
        assert_eq!(short.end, SeqEnd::MaxTokens);
    }
}
