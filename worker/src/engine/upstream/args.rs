//! The upstream engine's flags and its loading: connect to the engine
//! server, learn its window and slots, and start scraping its health and
//! load.

use super::kind::Kind;
use super::{UpstreamConfig, UpstreamEngine};
use crate::engine::{Loaded, Serving};
use crate::model::ModelProfile;
use crate::sampling_defaults::SamplingDefaults;
use crate::seam::chat::ChatEngine;
use std::sync::Arc;
use std::time::Duration;

/// `worker serve` flags of the upstream engine.
#[derive(clap::Args, Debug)]
pub struct UpstreamArgs {
    /// upstream: the engine's base URL (`http://127.0.0.1:8000`).
    #[arg(long)]
    pub upstream_url: Option<String>,
    /// upstream: which engine serves there (field mapping, tokenizer,
    /// metrics).
    #[arg(long, value_enum, default_value = "vllm")]
    pub upstream_kind: Kind,
    /// upstream: the engine's model id (default: the first it lists).
    #[arg(long)]
    pub upstream_model: Option<String>,
    /// upstream: enforce `tool_choice` required/named with a JSON schema of
    /// the call (default: on for llama-server, off for the others).
    #[arg(long)]
    pub upstream_enforce_tools: Option<bool>,
    /// upstream: the engine's API key, if it was started with one.
    #[arg(long, env = "UPSTREAM_API_KEY", hide_env_values = true)]
    pub upstream_api_key: Option<String>,
    /// upstream: how long to wait for the engine at start-up.
    #[arg(long, default_value_t = 600)]
    pub upstream_startup_timeout_seconds: u64,
    /// upstream: health and load scrape interval, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub upstream_scrape_ms: u64,
    /// upstream: longest wait from sending a request to the engine's first
    /// SSE event (prefill of a long prompt included), in milliseconds.
    /// Past it the generation fails with DEADLINE_EXCEEDED (gateway: 504)
    /// and the worker reports NOT_SERVING until the engine answers again.
    #[arg(long, default_value_t = 60_000)]
    pub upstream_first_byte_timeout_ms: u64,
    /// upstream: longest silence between the engine's SSE events once the
    /// reply streams, in milliseconds; past it, as the first-byte timeout.
    #[arg(long, default_value_t = 15_000)]
    pub upstream_idle_timeout_ms: u64,
    /// upstream: largest SSE event accepted from the engine, in bytes; a
    /// longer one (a line without its newline) fails the generation with
    /// ENGINE_FAILURE instead of growing the worker's memory.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub upstream_max_event_bytes: usize,
    /// upstream llama-server: leave the choice of slot to the engine
    /// instead of naming one per request (`id_slot`). Use it when other
    /// clients share the engine: the worker's cache report is then an
    /// estimate from what it sent.
    #[arg(long)]
    pub upstream_no_slot_pinning: bool,
    /// upstream vLLM or SGLang: tell the engine each request's service
    /// tier in its `priority` field (`docs/upstream-engines.md`). Only for
    /// an engine started with priority scheduling: vLLM refuses a
    /// `priority` under its default first-come policy.
    #[arg(long)]
    pub upstream_priority: bool,
}

impl UpstreamArgs {
    /// Connects to the engine (waiting for it up to the start-up timeout)
    /// and starts its health and load scraper; `--max-concurrency`
    /// requests in flight to it.
    pub async fn load(&self, serving: &Serving<'_>) -> anyhow::Result<Loaded<Arc<dyn ChatEngine>>> {
        let Some(url) = self.upstream_url.clone() else {
            anyhow::bail!("--engine upstream needs --upstream-url http://HOST:PORT");
        };
        let kind = self.upstream_kind;
        let scrape = Duration::from_millis(self.upstream_scrape_ms.max(10));
        let engine = UpstreamEngine::connect(&UpstreamConfig {
            url,
            kind,
            model: self.upstream_model.clone(),
            context_window: serving.context_window,
            enforce_tools: self.upstream_enforce_tools,
            api_key: self.upstream_api_key.clone(),
            startup_timeout: Duration::from_secs(self.upstream_startup_timeout_seconds),
            scrape_interval: scrape,
            first_byte_timeout: Duration::from_millis(self.upstream_first_byte_timeout_ms),
            idle_timeout: Duration::from_millis(self.upstream_idle_timeout_ms),
            max_event_bytes: self.upstream_max_event_bytes,
            pin_slots: !self.upstream_no_slot_pinning,
            pass_priority: self.upstream_priority,
        })
        .await?;
        let ready = engine.spawn_scraper(scrape);
        let mut model = ModelProfile::new(serving.model, Some(engine.context_window()));
        model.reasoning_budget = kind.reasoning_budget();
        // llama-server says its slots (`/props`); others: what we send at once.
        let cache_slots = engine.capacity().unwrap_or(serving.max_concurrency);
        Ok(Loaded {
            description: engine.description(),
            engine: Arc::new(engine),
            name: "upstream",
            model,
            capacity: serving.max_concurrency,
            cache_slots,
            concurrent_reuse: kind.concurrent_reuse(),
            ready: Some(ready),
            model_sampling: SamplingDefaults::default(),
        })
    }
}
