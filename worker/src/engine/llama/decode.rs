//! The engine thread's decode loop: the slots and the tokens whose KV
//! cells they hold, admission with prefix reuse, one batch per step, and
//! each sequence's sampler.

use super::{Job, StepClock, BATCH_TOKENS};
use crate::seam::sequence::{SamplingParams, SeqEnd, SeqEvent, TokenId};
use crate::status;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llguidance::Matcher;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::Status;

/// A sequence being decoded in a slot.
struct Active {
    tx: mpsc::UnboundedSender<Result<SeqEvent, Status>>,
    sampler: LlamaSampler,
    /// Prompt tokens not yet decoded.
    pending: VecDeque<LlamaToken>,
    cached: u32,
    /// The slot's id, reported with the prefill (the worker's cache report).
    slot: u32,
    generated: u32,
    max_tokens: u32,
    /// Sampled and streamed, to be decoded in the next step.
    next: Option<LlamaToken>,
    /// Batch index of this sequence's logits in the current step.
    logits_at: Option<i32>,
    prefilled: bool,
}

/// One llama.cpp sequence id and the tokens whose KV cells it holds.
struct Slot {
    id: i32,
    history: Vec<LlamaToken>,
    /// When a sequence last took the slot (admissions so far).
    last_used: u64,
    active: Option<Active>,
}

pub(super) struct DecodeLoop<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    slots: Vec<Slot>,
    queue: VecDeque<Job>,
    window: u32,
    /// Sequences admitted so far: the clock of `Slot::last_used`.
    admitted: u64,
    batch: LlamaBatch<'static>,
    /// Published after every step for the load report.
    kv_cells: Arc<AtomicU32>,
    clock: Arc<StepClock>,
}

/// Tokens the repetition penalty looks back over (llama.cpp's default).
const PENALTY_LAST_N: i32 = 64;

fn sampler(sampling: &SamplingParams, matcher: Option<Matcher>, n_vocab: i32) -> LlamaSampler {
    let mut chain = Vec::with_capacity(5);
    if let Some(m) = matcher {
        chain.push(LlamaSampler::from(m));
    }
    if let Some(p) = sampling.repeat_penalty.filter(|p| *p > 0.0 && *p != 1.0) {
        chain.push(LlamaSampler::penalties(
            n_vocab,
            PENALTY_LAST_N,
            p,
            0.0,
            0.0,
        ));
    }
    // The API's default temperature is 1.
    let temperature = sampling.temperature.unwrap_or(1.0);
    if temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        // llama.cpp's own order: top-k, then top-p, then temperature.
        if let Some(k) = sampling.top_k {
            chain.push(LlamaSampler::top_k(i32::try_from(k).unwrap_or(i32::MAX)));
        }
        if let Some(p) = sampling.top_p.filter(|p| *p > 0.0 && *p < 1.0) {
            chain.push(LlamaSampler::top_p(p, 1));
        }
        chain.push(LlamaSampler::temp(temperature));
        let seed = match sampling.seed {
            Some(s) => (s ^ (s >> 32)) as u32,
            None => rand_seed(),
        };
        chain.push(LlamaSampler::dist(seed));
    }
    LlamaSampler::chain_simple(chain)
}

/// A seed for requests without one (llama.cpp's own default is fixed).
fn rand_seed() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32))
        .unwrap_or(0);
    nanos.wrapping_mul(0x9e37_79b9)
}

/// The shortest shared prefix a sequence takes a slot for; below it, the
/// least recently used free slot (see the module notes).
const MIN_REUSE_TOKENS: usize = 32;

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl<'m> DecodeLoop<'m> {
    pub(super) fn new(
        model: &'m LlamaModel,
        ctx: LlamaContext<'m>,
        parallel: u32,
        window: u32,
        kv_cells: Arc<AtomicU32>,
        clock: Arc<StepClock>,
    ) -> Self {
        let slots = (0..parallel as i32)
            .map(|id| Slot {
                id,
                history: Vec::new(),
                last_used: 0,
                active: None,
            })
            .collect();
        Self {
            model,
            ctx,
            slots,
            queue: VecDeque::new(),
            window,
            admitted: 0,
            batch: LlamaBatch::new(BATCH_TOKENS as usize, 1),
            kv_cells,
            clock,
        }
    }

    fn busy(&self) -> bool {
        !self.queue.is_empty() || self.slots.iter().any(|s| s.active.is_some())
    }

    pub(super) fn run(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        loop {
            if !self.busy() {
                match jobs.blocking_recv() {
                    Some(job) => self.queue.push_back(job),
                    None => return,
                }
            }
            while let Ok(job) = jobs.try_recv() {
                self.queue.push_back(job);
            }
            self.drop_cancelled();
            self.admit();
            self.step();
            let cells: usize = self.slots.iter().map(|s| s.history.len()).sum();
            self.kv_cells
                .store(u32::try_from(cells).unwrap_or(u32::MAX), Ordering::Relaxed);
        }
    }

    /// Frees the slots whose stream was dropped (their cells stay cached).
    fn drop_cancelled(&mut self) {
        for slot in &mut self.slots {
            if slot.active.as_ref().is_some_and(|a| a.tx.is_closed()) {
                slot.active = None;
            }
        }
        self.queue.retain(|j| !j.tx.is_closed());
    }

    /// Moves queued jobs into free slots, reusing the longest cached prefix.
    fn admit(&mut self) {
        while let Some(job) = self.queue.front() {
            let best = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.active.is_none())
                .map(|(i, s)| {
                    let lcp = common_prefix(&s.history, &job.prompt);
                    let worth = if lcp >= MIN_REUSE_TOKENS { lcp } else { 0 };
                    (i, lcp, worth, s.last_used)
                })
                .max_by_key(|&(_, _, worth, last_used)| (worth, std::cmp::Reverse(last_used)));
            let Some((i, mut lcp, _, _)) = best else {
                return;
            };
            let Some(job) = self.queue.pop_front() else {
                return;
            };
            if job.prompt.is_empty() {
                let _ = job.tx.send(Err(status::invalid_request("empty prompt")));
                continue;
            }
            if let Some((source, shared)) = self.busy_prefix(&job.prompt, lcp) {
                let (src, dst) = (self.slots[source].id, self.slots[i].id);
                if self.ctx.copy_kv_cache_seq(src, dst, None, None).is_ok() {
                    let copied = self.slots[source].history[..shared].to_vec();
                    self.slots[i].history = copied;
                    lcp = shared;
                }
            }
            // At least one prompt token is decoded, for its logits.
            let mut reuse = lcp.min(job.prompt.len() - 1);
            let slot = &mut self.slots[i];
            let seq = slot.id as u32;
            let removed = self
                .ctx
                .clear_kv_cache_seq(Some(seq), Some(reuse as u32), None)
                .unwrap_or(false);
            if !removed {
                let _ = self.ctx.clear_kv_cache_seq(Some(seq), None, None);
                reuse = 0;
            }
            slot.history.truncate(reuse);
            self.admitted += 1;
            slot.last_used = self.admitted;
            slot.active = Some(Active {
                tx: job.tx,
                sampler: sampler(&job.sampling, job.matcher, self.model.n_vocab()),
                pending: job.prompt[reuse..].iter().copied().collect(),
                cached: reuse as u32,
                slot: seq,
                generated: 0,
                max_tokens: job.max_tokens,
                next: None,
                logits_at: None,
                prefilled: false,
            });
        }
    }

    /// The busy slot sharing the longest prefix with `prompt`, when that
    /// beats the free slot's own `free_lcp` by enough to pay for a copy.
    fn busy_prefix(&self, prompt: &[LlamaToken], free_lcp: usize) -> Option<(usize, usize)> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_some())
            .map(|(i, s)| (i, common_prefix(&s.history, prompt)))
            .filter(|&(_, lcp)| lcp >= free_lcp + MIN_REUSE_TOKENS)
            .max_by_key(|&(_, lcp)| lcp)
    }

    /// One decode step over every active slot, then sampling.
    fn step(&mut self) {
        self.batch.clear();
        let mut room = BATCH_TOKENS as usize;
        let mut in_batch: Vec<usize> = Vec::new();
        // Generating sequences first: one token each keeps them moving.
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            a.logits_at = None;
            if let Some(tok) = a.next.take() {
                let pos = slot.history.len() as i32;
                if self.batch.add(tok, pos, &[slot.id], true).is_err() {
                    a.next = Some(tok);
                    continue;
                }
                a.logits_at = Some(self.batch.n_tokens() - 1);
                slot.history.push(tok);
                room -= 1;
                in_batch.push(i);
            }
        }
        let generated_only = self.batch.n_tokens();
        // Then prompt chunks, as much as the batch holds.
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if a.pending.is_empty() || room == 0 {
                continue;
            }
            let n = a.pending.len().min(room);
            for k in 0..n {
                let Some(tok) = a.pending.pop_front() else {
                    break;
                };
                let last = k + 1 == n && a.pending.is_empty();
                let pos = slot.history.len() as i32;
                if self.batch.add(tok, pos, &[slot.id], last).is_err() {
                    a.pending.push_front(tok);
                    break;
                }
                slot.history.push(tok);
                room -= 1;
                if last {
                    a.logits_at = Some(self.batch.n_tokens() - 1);
                }
            }
            in_batch.push(i);
        }
        if self.batch.n_tokens() == 0 {
            return;
        }
        let prefill = self.batch.n_tokens() > generated_only;
        let started = std::time::Instant::now();
        let decoded = self.ctx.decode(&mut self.batch);
        let decode_time = started.elapsed();
        if let Err(e) = decoded {
            tracing::error!(error = %e, "llama decode failed");
            for i in in_batch {
                let slot = &mut self.slots[i];
                if let Some(a) = slot.active.take() {
                    let _ =
                        a.tx.send(Err(status::engine_failure(format!("decode failed: {e}"))));
                }
                let _ = self
                    .ctx
                    .clear_kv_cache_seq(Some(slot.id as u32), None, None);
                slot.history.clear();
            }
            return;
        }
        for slot in &mut self.slots {
            let done = match slot.active.as_mut() {
                Some(a) => match a.logits_at {
                    Some(at) => sample_one(
                        self.model,
                        &self.ctx,
                        a,
                        at,
                        slot.history.len(),
                        self.window,
                    ),
                    None => false,
                },
                None => false,
            };
            if done {
                slot.active = None;
            }
        }
        let sample_time = started.elapsed().saturating_sub(decode_time);
        self.clock.record(prefill, decode_time, sample_time);
    }
}

/// Samples a sequence's next token and streams it; true when it ended.
fn sample_one(
    model: &LlamaModel,
    ctx: &LlamaContext<'_>,
    a: &mut Active,
    at: i32,
    decoded: usize,
    window: u32,
) -> bool {
    if !a.prefilled {
        a.prefilled = true;
        let _ = a.tx.send(Ok(SeqEvent::Prefilled {
            cached_tokens: a.cached,
            slot: Some(a.slot),
        }));
    }
    let tok = a.sampler.sample(ctx, at);
    let vocab = model.vocab();
    if vocab.is_eog(tok) {
        let _ = a.tx.send(Ok(SeqEvent::Finished(SeqEnd::EndOfGeneration)));
        return true;
    }
    a.generated += 1;
    let bytes = vocab.token_to_piece(tok, false, None);
    if a.tx
        .send(Ok(SeqEvent::Token {
            id: tok.0 as TokenId,
            bytes,
        }))
        .is_err()
    {
        return true;
    }
    // The token just sampled still needs a cell to be decoded.
    if a.generated >= a.max_tokens || decoded + 1 >= window as usize {
        let _ = a.tx.send(Ok(SeqEvent::Finished(SeqEnd::MaxTokens)));
        return true;
    }
    a.next = Some(tok);
    false
}
