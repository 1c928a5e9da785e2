//! The `llama` engine's flags and its loading. Built without the `llama`
//! feature too: the flags stay the same, and `--engine llama` then says
//! the build lacks it.

use crate::engine::llama_gpu::GpuLayers;
use crate::engine::{Loaded, Serving};
use crate::seam::sequence::SequenceEngine;
use std::sync::Arc;

/// `worker serve` flags of the in-process llama.cpp engine.
#[derive(clap::Args, Debug)]
pub struct LlamaArgs {
    /// llama: the GGUF model file.
    #[arg(long)]
    pub model_file: Option<std::path::PathBuf>,
    /// llama: a display name for the weights (default: the file name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// llama: context window of each sequence in tokens (default: the
    /// model's training context).
    #[arg(long, default_value_t = 0)]
    pub n_ctx: u32,
    /// llama: sequences decoded together (slots); the running capacity.
    #[arg(long, default_value_t = 4)]
    pub parallel: u32,
    /// llama: CPU threads (default: the available cores).
    #[arg(long)]
    pub threads: Option<i32>,
    /// llama: model layers offloaded to the GPU in a GPU (`cuda`) build:
    /// `all` (the default) or a count; 0 keeps the model on the CPU. A GPU
    /// build that finds no GPU runs on the CPU and says so at warn level.
    #[arg(long, default_value_t = GpuLayers::All, value_name = "all|N")]
    pub n_gpu_layers: GpuLayers,
}

impl LlamaArgs {
    /// Loads the GGUF file and starts the engine thread (blocking, before
    /// serving); `--parallel` sequences at once.
    #[cfg(feature = "llama")]
    pub fn load(&self, serving: &Serving<'_>) -> anyhow::Result<Loaded<Arc<dyn SequenceEngine>>> {
        use crate::engine::llama::{LlamaConfig, LlamaEngine};
        use crate::model::ModelProfile;
        let Some(file) = self.model_file.clone() else {
            anyhow::bail!("--engine llama needs --model-file PATH (a GGUF file)");
        };
        let threads = self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(2, |n| i32::try_from(n.get()).unwrap_or(2))
        });
        let engine = LlamaEngine::load(&LlamaConfig {
            model_file: file.clone(),
            n_ctx: self.n_ctx,
            parallel: self.parallel,
            threads,
            gpu_layers: self.n_gpu_layers,
        })?;
        let mut model = ModelProfile::new(serving.model, Some(engine.context_window()));
        // A text-only model; the think section honours a budget.
        model.image_input = false;
        model.reasoning_budget = true;
        let name = self.model_name.clone().unwrap_or_else(|| {
            file.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
        let description = format!("{name}: {}", engine.description());
        let model_sampling = engine.model_sampling();
        Ok(Loaded {
            engine: Arc::new(engine),
            name: "llama",
            description,
            model,
            capacity: self.parallel.max(1),
            cache_slots: self.parallel.max(1),
            // A busy slot's prefix is copied into a free one.
            concurrent_reuse: true,
            ready: None,
            model_sampling,
        })
    }

    /// This build has no llama.cpp.
    #[cfg(not(feature = "llama"))]
    pub fn load(&self, _: &Serving<'_>) -> anyhow::Result<Loaded<Arc<dyn SequenceEngine>>> {
        anyhow::bail!("this worker was built without the `llama` feature")
    }
}
