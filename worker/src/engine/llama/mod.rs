//! The `llama` engine: llama.cpp in process (`llama-cpp-2`, built from
//! vendored source) on a GGUF model.
//!
//! - The tokenizer and chat template come from the GGUF file: the Jinja
//!   template in its metadata ([`super::chat_template`]); llama.cpp's
//!   built-in matcher if that does not render, ChatML if neither does.
//! - `LlamaContext` is not `Send`: one engine thread owns the context and
//!   runs the decode loop, fed by a channel; each sequence streams its
//!   events back on its own channel.
//! - Continuous batching: one batch per step holds the next token of every
//!   generating sequence plus prompt chunks of newly admitted ones, so a new
//!   request joins without waiting. `--parallel` sequence slots (llama.cpp
//!   sequence ids), each with `--n-ctx` tokens of KV cache of its own;
//!   requests beyond that wait in the worker's admission queue.
//! - Prefix reuse: each slot keeps the tokens whose KV cells it holds; a new
//!   sequence takes the free slot with the longest common prefix, drops the
//!   rest of that slot's cells and prefills only the new tail. The reused
//!   count is `cached_prompt_tokens`. A prefix shorter than
//!   `MIN_REUSE_TOKENS` (the template's opening, a shared word) is not worth
//!   a slot's contents: such a sequence takes the least recently used free
//!   slot, so the slots keep the prefixes most likely to come back. A
//!   longer prefix held by a *busy* slot (a hot system prompt whose other
//!   requests are running) is copied into the free slot (one copy of that
//!   slot's KV stream, milliseconds, against seconds of prefill), so
//!   concurrent sequences share a prefix as a paged engine's would.
//! - Sampling: temperature (0 = greedy), top_k, top_p, seed (`dist(seed)`); an
//!   output constraint is an llguidance sampler first in the chain, so a
//!   token the schema forbids is never sampled.
//! - A dropped stream is seen at the next step: the slot is freed.
//!
//! This file loads the model and serves the engine's seam; `decode.rs` is
//! the engine thread's loop: slots, admission, steps and sampling.

mod decode;

use super::chat_template::ChatTemplate;
use super::llama_gpu::{GpuLayers, Placement};
use crate::sampling_defaults::SamplingDefaults;
use crate::seam::sequence::{
    ChatMessage, Constraint, SamplingParams, SeqEvent, Sequence, SequenceEngine, SequenceStream,
    StepTimings, StepTotals, TokenId,
};
use crate::status;
use decode::DecodeLoop;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc;
use tonic::Status;

/// Tokens per decode step (prompt chunks plus one per generating sequence).
const BATCH_TOKENS: u32 = 512;

/// How to load and run the model.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    pub model_file: PathBuf,
    /// Context window of one sequence; 0 = the model's training context.
    pub n_ctx: u32,
    /// Sequences decoded together (slots).
    pub parallel: u32,
    /// CPU threads for decoding.
    pub threads: i32,
    /// Layers offloaded to the GPU (`--n-gpu-layers`; a GPU build only).
    pub gpu_layers: GpuLayers,
}

/// llama.cpp's process-wide backend, initialized once.
fn backend() -> Result<&'static LlamaBackend, anyhow::Error> {
    static BACKEND: OnceLock<LlamaBackend> = OnceLock::new();
    if let Some(b) = BACKEND.get() {
        return Ok(b);
    }
    let mut b = LlamaBackend::init()?;
    // llama.cpp logs every tensor at load; keep stderr for our own logs.
    b.void_logs();
    // Which CPU kernels this build has (AVX2, AVX512, ...): how an operator
    // checks that the worker was built for the node it runs on.
    // SAFETY: llama.cpp returns a pointer to its own static, NUL-terminated
    // buffer, valid for the life of the process; it is copied at once.
    let system = unsafe { std::ffi::CStr::from_ptr(llama_cpp_sys_2::llama_print_system_info()) };
    tracing::info!(system = %system.to_string_lossy().trim(), "llama.cpp backend ready");
    Ok(BACKEND.get_or_init(|| b))
}

/// The GPUs llama.cpp's backends found, as "name (description)"; none in
/// a CPU build, or in a GPU build without a device or driver.
fn gpu_devices() -> Vec<String> {
    use llama_cpp_2::{list_llama_ggml_backend_devices, LlamaBackendDeviceType};
    list_llama_ggml_backend_devices()
        .into_iter()
        .filter(|d| {
            matches!(
                d.device_type,
                LlamaBackendDeviceType::Gpu | LlamaBackendDeviceType::IntegratedGpu
            )
        })
        .map(|d| format!("{} ({})", d.name, d.description))
        .collect()
}

/// A sequence handed to the engine thread.
struct Job {
    prompt: Vec<LlamaToken>,
    sampling: SamplingParams,
    max_tokens: u32,
    matcher: Option<Matcher>,
    tx: mpsc::UnboundedSender<Result<SeqEvent, Status>>,
}

/// The engine handle (cheap to share); the context lives on its thread.
pub struct LlamaEngine {
    model: Arc<LlamaModel>,
    /// The model's own Jinja template.
    jinja: Option<ChatTemplate>,
    /// llama.cpp's built-in template of the same family.
    template: Option<LlamaChatTemplate>,
    factory: ParserFactory,
    jobs: mpsc::UnboundedSender<Job>,
    /// KV cells holding tokens (running or kept for reuse), of `kv_capacity`.
    kv_cells: Arc<AtomicU32>,
    kv_capacity: u32,
    window: u32,
    description: String,
    clock: Arc<StepClock>,
}

/// The decode loop's time, by kind of step ([`StepTimings`]): written by
/// the engine thread, read by the metrics scrape.
#[derive(Debug, Default)]
struct StepClock {
    /// Index 0: generated tokens only; 1: with prompt tokens.
    steps: [AtomicU64; 2],
    decode_ns: [AtomicU64; 2],
    sample_ns: [AtomicU64; 2],
}

impl StepClock {
    fn record(&self, prefill: bool, decode: std::time::Duration, sample: std::time::Duration) {
        let i = usize::from(prefill);
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.steps[i].fetch_add(1, Ordering::Relaxed);
        self.decode_ns[i].fetch_add(ns(decode), Ordering::Relaxed);
        self.sample_ns[i].fetch_add(ns(sample), Ordering::Relaxed);
    }

    fn totals(&self, i: usize) -> StepTotals {
        StepTotals {
            steps: self.steps[i].load(Ordering::Relaxed),
            decode_ns: self.decode_ns[i].load(Ordering::Relaxed),
            sample_ns: self.sample_ns[i].load(Ordering::Relaxed),
        }
    }
}

impl LlamaEngine {
    /// Loads the model and starts the engine thread (blocking: call it at
    /// startup, before serving).
    pub fn load(config: &LlamaConfig) -> anyhow::Result<Self> {
        let backend = backend()?;
        Placement::decide(cfg!(feature = "cuda"), gpu_devices(), config.gpu_layers).log();
        let params = match config.gpu_layers {
            // llama.cpp's default is every layer.
            GpuLayers::All => LlamaModelParams::default(),
            GpuLayers::Count(n) => LlamaModelParams::default().with_n_gpu_layers(n),
        };
        let model = LlamaModel::load_from_file(backend, &config.model_file, &params)
            .map_err(|e| anyhow::anyhow!("loading {}: {e}", config.model_file.display()))?;
        let model = Arc::new(model);
        let template = model.chat_template(None).ok();
        let jinja = jinja_template(&model);
        let tok_env = LlamaSampler::llguidance_tok_env(&model);
        let mut factory = ParserFactory::new_simple(&tok_env)?;
        factory.quiet();

        let parallel = config.parallel.max(1);
        let per_seq = if config.n_ctx == 0 {
            model.n_ctx_train()
        } else {
            config.n_ctx
        };
        let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let thread_model = Arc::clone(&model);
        let kv_cells = Arc::new(AtomicU32::new(0));
        let thread_kv_cells = Arc::clone(&kv_cells);
        let clock = Arc::new(StepClock::default());
        let thread_clock = Arc::clone(&clock);
        let threads = config.threads.max(1);
        std::thread::Builder::new()
            .name("llama-engine".into())
            .spawn(move || {
                let params = LlamaContextParams::default()
                    .with_n_ctx(NonZeroU32::new(per_seq.saturating_mul(parallel)))
                    .with_n_batch(BATCH_TOKENS)
                    .with_n_ubatch(BATCH_TOKENS)
                    .with_n_seq_max(parallel)
                    // One KV stream per sequence: each slot always has its
                    // whole window, whatever the others hold.
                    .with_kv_unified(false)
                    .with_n_threads(threads)
                    .with_n_threads_batch(threads);
                let ctx = match thread_model.new_context(backend, params) {
                    Ok(ctx) => ctx,
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow::anyhow!("creating the context: {e}")));
                        return;
                    }
                };
                let window = ctx.n_ctx() / parallel;
                let _ = ready_tx.send(Ok(window));
                let decode = std::panic::AssertUnwindSafe(|| {
                    DecodeLoop::new(
                        &thread_model,
                        ctx,
                        parallel,
                        window,
                        thread_kv_cells,
                        thread_clock,
                    )
                    .run(jobs_rx)
                });
                if std::panic::catch_unwind(decode).is_err() {
                    // A worker without its engine must not stay in a pool
                    // answering ENGINE_FAILURE: exit, to be restarted.
                    tracing::error!("the llama engine thread panicked; exiting");
                    std::process::exit(70);
                }
            })?;
        let window = ready_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("the engine thread ended during startup"))??;
        let file = config
            .model_file
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let description = format!(
            "llama.cpp in process: {file} ({} parameters), {parallel} slots of {window} tokens, \
             {threads} threads",
            model.n_params()
        );
        Ok(Self {
            model,
            jinja,
            template,
            factory,
            jobs: jobs_tx,
            kv_cells,
            kv_capacity: window.saturating_mul(parallel),
            window,
            description,
            clock,
        })
    }

    /// Whether tokenizing `prompt` adds BOS: not when the template printed it.
    fn adds_bos(&self, prompt: &str) -> bool {
        let printed = self
            .jinja
            .as_ref()
            .is_some_and(|j| j.starts_with_bos(prompt));
        self.model.vocab().should_add_bos() && !printed
    }

    fn matcher(&self, constraint: &Constraint) -> Result<Matcher, Status> {
        let Constraint::JsonSchema(schema) = constraint;
        let grammar = TopLevelGrammar::from_json_schema(schema.clone());
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| status::invalid_request(format!("unsupported JSON schema: {e}")))?;
        Ok(Matcher::new(Ok(parser)))
    }
}

impl LlamaEngine {
    /// The sampling the GGUF's metadata recommends (`general.sampling.temp`,
    /// `general.sampling.top_p`, the keys llama.cpp's converter writes from a
    /// model's generation config), when it carries them.
    pub fn model_sampling(&self) -> SamplingDefaults {
        let number = |key: &str| {
            self.model
                .meta_val_str(key)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite())
        };
        SamplingDefaults {
            temperature: number("general.sampling.temp"),
            top_p: number("general.sampling.top_p"),
            repeat_penalty: number("general.sampling.penalty_repeat"),
        }
    }
}

/// The GGUF's `tokenizer.chat_template`, compiled (`None` if absent or not
/// valid Jinja: the built-in matcher takes over).
fn jinja_template(model: &LlamaModel) -> Option<ChatTemplate> {
    let source = model.meta_val_str("tokenizer.chat_template").ok()?;
    let vocab = model.vocab();
    let text = |t| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
    match ChatTemplate::new(&source, &text(vocab.bos()), &text(vocab.eos())) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "the model's chat template does not compile; using llama.cpp's built-in one");
            None
        }
    }
}

/// ChatML, for models whose template llama.cpp does not know.
fn chatml(messages: &[ChatMessage]) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str(&format!(
            "<|im_start|>{}\n{}<|im_end|>\n",
            m.role, m.content
        ));
    }
    s.push_str("<|im_start|>assistant\n");
    s
}

#[async_trait::async_trait]
impl SequenceEngine for LlamaEngine {
    fn name(&self) -> &'static str {
        "llama"
    }

    fn description(&self) -> String {
        self.description.clone()
    }

    fn context_window(&self) -> u32 {
        self.window
    }

    fn kv_cache_usage(&self) -> Option<f64> {
        let cells = self.kv_cells.load(Ordering::Relaxed);
        Some(f64::from(cells) / f64::from(self.kv_capacity.max(1)))
    }

    /// Each sequence takes one of `--parallel` slots and says which.
    fn has_slots(&self) -> bool {
        true
    }

    fn step_timings(&self) -> Option<StepTimings> {
        Some(StepTimings {
            generate: self.clock.totals(0),
            prefill: self.clock.totals(1),
        })
    }

    fn render(&self, messages: &[ChatMessage]) -> Result<String, Status> {
        if let Some(jinja) = &self.jinja {
            match jinja.render(messages) {
                Ok(text) => return Ok(text),
                // A template may refuse a conversation (a role it lacks):
                // the built-in family template is the next best.
                Err(e) => tracing::debug!(error = %e, "the model's chat template failed"),
            }
        }
        let Some(template) = &self.template else {
            return Ok(chatml(messages));
        };
        let chat = messages
            .iter()
            .map(|m| LlamaChatMessage::new(m.role.clone(), m.content.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| status::invalid_request(format!("message text: {e}")))?;
        match self.model.apply_chat_template(template, &chat, true) {
            Ok(text) => Ok(text),
            Err(e) => {
                tracing::debug!(error = %e, "chat template failed; using ChatML");
                Ok(chatml(messages))
            }
        }
    }

    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, Status> {
        let vocab = self.model.vocab();
        Ok(vocab
            .tokenize(text.as_bytes(), self.adds_bos(text), true)
            .into_iter()
            .map(|t| t.0 as TokenId)
            .collect())
    }

    async fn start(&self, sequence: Sequence) -> Result<SequenceStream, Status> {
        // Compiling a schema takes about a millisecond: inline.
        let mut matcher = sequence
            .constraint
            .as_ref()
            .map(|c| self.matcher(c))
            .transpose()?;
        // A continued sequence: the constraint has matched the output
        // already generated, which follows the prompt in the context.
        if let (Some(m), false) = (matcher.as_mut(), sequence.resumed.is_empty()) {
            m.consume_tokens(&sequence.resumed).map_err(|e| {
                status::invalid_request(format!(
                    "the delivered output does not match its constraint: {e}"
                ))
            })?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let job = Job {
            prompt: sequence
                .prompt
                .iter()
                .chain(&sequence.resumed)
                .map(|t| LlamaToken(*t as i32))
                .collect(),
            sampling: sequence.sampling,
            max_tokens: sequence.max_tokens,
            matcher,
            tx,
        };
        self.jobs
            .send(job)
            .map_err(|_| status::engine_failure("the llama engine thread is gone"))?;
        Ok(rx)
    }
}
