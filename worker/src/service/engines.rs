//! The engine behind the service, whatever seam it implements, seen through
//! the three steps of the service's one start path: count the prompt with
//! the engine's own tokenizer, fit it in the engine's window, then (once
//! admitted) start the generation.

use crate::cache_report::{Source, UPSTREAM_TTL};
use crate::pipeline;
use crate::seam::chat::{ChatEngine, OnCached};
use crate::seam::sequence::{SequenceEngine, StepTimings};
use crate::seam::Started;
use inference_proto::v1 as pb;
use std::sync::Arc;
use tonic::Status;

/// The engine behind the service, by the seam it implements.
#[derive(Clone)]
pub enum Engines {
    /// Sequence-level: tokens in, tokens out, through the shared pipeline
    /// (llama, and the SIMULATED `synthetic` engine).
    Sequence(Arc<dyn SequenceEngine>),
    /// Message-level: an engine server with its own template and parsers.
    Chat(Arc<dyn ChatEngine>),
}

/// A request whose prompt its engine has counted, not yet admitted.
pub enum Counted {
    Sequence(pipeline::Prepared),
    Chat {
        engine: Arc<dyn ChatEngine>,
        request: pb::GenerateRequest,
        /// `None` when the engine cannot count.
        prompt_tokens: Option<u32>,
        completion_limit: Option<u32>,
    },
}

impl Engines {
    /// The load to report, given the admission's own counts. An engine
    /// that reports its own load (running and waiting inside the engine,
    /// its slots) is the truth, since it may serve other clients too and
    /// queue beyond the worker's admission; requests still in the worker's
    /// own queue come on top.
    pub fn load(&self, own: pb::Load) -> pb::Load {
        match self {
            Engines::Sequence(engine) => pb::Load {
                kv_cache_usage: engine.kv_cache_usage(),
                ..own
            },
            Engines::Chat(engine) => match engine.load() {
                Some(l) => pb::Load {
                    running: l.running,
                    queued: l.waiting.saturating_add(own.queued),
                    capacity: l.capacity.unwrap_or(own.capacity),
                    kv_cache_usage: l.kv_cache_usage,
                },
                None => own,
            },
        }
    }

    /// How the worker's cache report knows what this engine holds:
    /// exactly from a sequence engine's slots; otherwise from what the
    /// worker sent it (an upstream server shared with others forgets
    /// sooner).
    pub fn cache_source(&self) -> Source {
        match self {
            Engines::Sequence(engine) if engine.has_slots() => Source::Exact,
            Engines::Sequence(_) => Source::Estimated { ttl: None },
            Engines::Chat(engine) if engine.has_slots() => Source::Exact,
            Engines::Chat(_) => Source::Estimated {
                ttl: Some(UPSTREAM_TTL),
            },
        }
    }

    /// Where the engine's decode loop spent its time, when it says.
    pub fn step_timings(&self) -> Option<StepTimings> {
        match self {
            Engines::Sequence(engine) => engine.step_timings(),
            Engines::Chat(_) => None,
        }
    }

    /// Whether it continues a moved generation (`Capabilities.resume`):
    /// every sequence engine does (the pipeline owns the output format).
    pub fn resumes(&self) -> bool {
        match self {
            Engines::Sequence(_) => true,
            Engines::Chat(engine) => engine.resumes(),
        }
    }

    /// Whether it continues any moved generation (`Capabilities.resume_any`):
    /// a sequence engine's pipeline resumes constrained output and think
    /// sections; an engine server continues a text answer only.
    pub fn resumes_any(&self) -> bool {
        matches!(self, Engines::Sequence(_))
    }

    /// Tokens one request may hold (prompt plus completion).
    pub fn context_window(&self) -> u32 {
        match self {
            Engines::Sequence(engine) => engine.context_window(),
            Engines::Chat(engine) => engine.context_window(),
        }
    }

    /// Counts the request's prompt with the engine's own tokenizer (and
    /// template); a request the engine cannot take at all fails here.
    pub async fn count(&self, request: pb::GenerateRequest) -> Result<Counted, Status> {
        Ok(match self {
            Engines::Sequence(engine) => {
                Counted::Sequence(pipeline::prepare(Arc::clone(engine), request).await?)
            }
            Engines::Chat(engine) if request.resume.is_some() && !engine.resumes() => {
                return Err(crate::status::invalid_request(
                    "this worker's engine cannot continue a moved generation",
                ))
            }
            Engines::Chat(engine) => Counted::Chat {
                prompt_tokens: engine.count_prompt(&request).await?,
                engine: Arc::clone(engine),
                request,
                completion_limit: None,
            },
        })
    }
}

impl Counted {
    /// The prompt's token count; `None` when the engine cannot count.
    pub fn prompt_tokens(&self) -> Option<u32> {
        match self {
            Counted::Sequence(prepared) => Some(prepared.prompt_tokens()),
            Counted::Chat { prompt_tokens, .. } => *prompt_tokens,
        }
    }

    /// The context-window check every engine shares
    /// ([`pipeline::fit_window`], on the engine's own count and window);
    /// sets the completion limit.
    pub fn fit(&mut self) -> Result<(), Status> {
        match self {
            Counted::Sequence(prepared) => prepared.check_window()?,
            Counted::Chat {
                engine,
                request,
                prompt_tokens,
                completion_limit,
            } => {
                let max_tokens = max_tokens(request);
                *completion_limit = match prompt_tokens {
                    Some(prompt) => Some(pipeline::fit_window(
                        engine.context_window(),
                        *prompt,
                        max_tokens,
                    )?),
                    // The engine's own 400 then catches an overflow.
                    None => (max_tokens > 0).then_some(max_tokens),
                };
            }
        }
        Ok(())
    }

    /// Starts the generation (after admission). A refusal here is still a
    /// plain status, before the stream opens, so the gateway may retry
    /// elsewhere. `on_cached` hears the count of prompt tokens the engine
    /// reused from its cache (and the slot it took), once it is known.
    pub async fn start(
        self,
        prompt_blocks: &Arc<[u64]>,
        on_cached: OnCached,
    ) -> Result<Box<dyn Started>, Status> {
        match self {
            Counted::Sequence(prepared) => Ok(Box::new(prepared.start(on_cached).await?)),
            Counted::Chat {
                engine,
                request,
                prompt_tokens,
                completion_limit,
            } => {
                engine
                    .start(
                        request,
                        prompt_blocks,
                        completion_limit,
                        prompt_tokens,
                        on_cached,
                    )
                    .await
            }
        }
    }
}

fn max_tokens(request: &pb::GenerateRequest) -> u32 {
    request.sampling.as_ref().map_or(0, |s| s.max_tokens)
}
