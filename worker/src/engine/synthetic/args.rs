//! The synthetic engine's flags and its loading.

use super::{SyntheticConfig, SyntheticEngine, DESCRIPTION};
use crate::engine::{Loaded, Serving};
use crate::model::ModelProfile;
use crate::sampling_defaults::SamplingDefaults;
use crate::seam::sequence::SequenceEngine;
use std::sync::Arc;
use std::time::Duration;

/// `worker serve` flags of the SIMULATED engine.
#[derive(clap::Args, Debug)]
pub struct SyntheticArgs {
    /// Delay before the first event of a reply, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub ttft_ms: u64,
    /// Output pace; 0 = as fast as possible.
    #[arg(long, default_value_t = 0.0)]
    pub tokens_per_second: f64,
    /// Synthetic: prefill pace of prompt tokens not in its prefix cache,
    /// added to --ttft-ms; 0 = prefill takes no time.
    #[arg(long, default_value_t = 0.0)]
    pub prefill_tokens_per_second: f64,
    /// synthetic: merge up to N tokens into one event when they come
    /// faster than the stream takes them (unpaced): fewer, larger deltas
    /// for load tests. 1 = one token per event.
    #[arg(long, default_value_t = 1)]
    pub coalesce_tokens: u32,
    /// The synthetic engine's simulated prefix cache: its capacity in
    /// 64-token blocks.
    #[arg(long, default_value_t = 65_536)]
    pub prefix_cache_blocks: usize,
    /// Chaos testing: every generation fails (INTERNAL, ENGINE_FAILURE)
    /// after N completion tokens, like a worker with a broken device.
    #[arg(long)]
    pub fail_after_tokens: Option<u32>,
    /// Chaos testing: every generation stops sending after N completion
    /// tokens and waits until it is dropped, like an engine stuck on its
    /// device while the worker's link stays up.
    #[arg(long)]
    pub stall_after_tokens: Option<u32>,
}

impl SyntheticArgs {
    /// The engine for `serving`'s model (an added id needs its window),
    /// its tokenizer warmed up; `--max-concurrency` sequences at once.
    pub fn load(&self, serving: &Serving<'_>) -> anyhow::Result<Loaded<Arc<dyn SequenceEngine>>> {
        let model = ModelProfile::for_serving(serving.model, serving.context_window)?;
        let engine = SyntheticEngine::new(
            SyntheticConfig {
                ttft: Duration::from_millis(self.ttft_ms),
                prefill_tokens_per_second: self.prefill_tokens_per_second.max(0.0),
                tokens_per_second: self.tokens_per_second.max(0.0),
                coalesce_tokens: self.coalesce_tokens,
                fail_after_tokens: self.fail_after_tokens,
                stall_after_tokens: self.stall_after_tokens,
                prefix_cache_blocks: self.prefix_cache_blocks,
            },
            model.clone(),
        );
        // Load the BPE before taking traffic, so the first request is not slow.
        let _ = super::tokenizer::count("warm up");
        Ok(Loaded {
            engine: Arc::new(engine),
            name: "synthetic",
            description: DESCRIPTION.to_owned(),
            model,
            capacity: serving.max_concurrency,
            cache_slots: serving.max_concurrency,
            // Its simulated prefix cache has no slots: a prefix serves
            // every sequence that shares it.
            concurrent_reuse: true,
            ready: None,
            model_sampling: SamplingDefaults::default(),
        })
    }
}
