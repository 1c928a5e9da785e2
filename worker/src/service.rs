//! The tonic `inference.v1.Worker` service: the engine-independent half of
//! a request (draining, admission, counters), then the engine streams.
//!
//! Three kinds of engine (see [`Engines`]): a whole-reply engine (`synthetic`)
//! gets a prompt the service tokenized with o200k, checked against the
//! public model's window and ran through the simulated prefix cache; a
//! sequence-level engine (`llama`) goes through the shared [`pipeline`],
//! where the engine's own tokenizer, template and window govern; a
//! message-level engine (`upstream`) counts the prompt with the engine's
//! tokenizer, is checked against its window the same way, and streams.

use crate::admission::{Admission, Slot};
use crate::counters::Counters;
use crate::drain::DrainFlag;
use crate::engine::chat::ChatEngine;
use crate::engine::sequence::SequenceEngine;
use crate::engine::{Engine, EventSink, Job, Outcome};
use crate::model::ModelProfile;
use crate::pipeline;
use crate::prefix_cache::PrefixCache;
use crate::status;
use crate::tokenizer::{self, Prompt};
use inference_proto::v1 as pb;
use std::sync::Arc;
use telemetry::TraceParent;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// Prompts with more text than this are tokenized off the async threads.
const BLOCKING_TOKENIZE_BYTES: usize = 64 * 1024;

/// Events buffered between the engine and the gRPC stream.
const STREAM_BUFFER: usize = 64;

/// A generation's events as the gRPC response stream. It notices a
/// gateway that drops the stream after its `Finished` event but before its
/// end: that is an h2 stream reset where trailers belong, which the gateway
/// promises never to cause (`Counters.reset_after_finish`).
pub struct EventStream {
    inner: ReceiverStream<Result<pb::GenerateEvent, Status>>,
    state: Arc<WorkerState>,
    finished: bool,
    ended: bool,
}

impl EventStream {
    fn new(rx: mpsc::Receiver<Result<pb::GenerateEvent, Status>>, state: Arc<WorkerState>) -> Self {
        Self {
            inner: ReceiverStream::new(rx),
            state,
            finished: false,
            ended: false,
        }
    }
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream")
            .field("finished", &self.finished)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl futures::Stream for EventStream {
    type Item = Result<pb::GenerateEvent, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let next = std::pin::Pin::new(&mut self.inner).poll_next(cx);
        match &next {
            std::task::Poll::Ready(Some(Ok(event))) => {
                if matches!(event.event, Some(pb::generate_event::Event::Finished(_))) {
                    self.finished = true;
                }
            }
            std::task::Poll::Ready(_) => self.ended = true,
            std::task::Poll::Pending => {}
        }
        next
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        if self.finished && !self.ended {
            self.state.counters.reset_after_finish();
        }
    }
}

/// Everything the service shares across requests.
pub struct WorkerState {
    pub model: ModelProfile,
    /// `synthetic`, ...
    pub engine_name: &'static str,
    pub description: String,
    pub engine: Engines,
    pub admission: Admission,
    pub cache: PrefixCache,
    pub counters: Counters,
    pub drain: DrainFlag,
}

/// The engine behind the service, by the seam it implements.
#[derive(Clone)]
pub enum Engines {
    /// Whole-reply (the SIMULATED `synthetic` engine and its test controls).
    Reply(Arc<dyn Engine>),
    /// Sequence-level: tokens in, tokens out, through the shared pipeline.
    Sequence(Arc<dyn SequenceEngine>),
    /// Message-level: an engine server with its own template and parsers.
    Chat(Arc<dyn ChatEngine>),
}

/// The gRPC service; cheap to clone.
#[derive(Clone)]
pub struct WorkerService {
    state: Arc<WorkerState>,
}

impl WorkerState {
    /// What `Info` and `/metrics` report. An engine that reports its own
    /// load (running and waiting inside the engine, its slots) is the
    /// truth, since it may serve other clients too and queue beyond the
    /// worker's admission; requests still in the worker's own queue come
    /// on top. Otherwise the admission's counts.
    pub fn load(&self) -> pb::Load {
        let admission = &self.admission;
        let own = pb::Load {
            running: admission.running(),
            queued: admission.queued(),
            capacity: admission.capacity(),
            kv_cache_usage: None,
        };
        match &self.engine {
            Engines::Reply(_) => pb::Load {
                kv_cache_usage: Some(self.cache.usage()),
                ..own
            },
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
}

impl WorkerService {
    pub fn new(state: Arc<WorkerState>) -> Self {
        Self { state }
    }

    fn reject(&self, status: Status) -> Status {
        self.state.counters.rejected();
        status
    }

    /// Tokenizes the prompt, off the runtime threads when it is large.
    async fn render(req: pb::GenerateRequest) -> Result<(pb::GenerateRequest, Prompt), Status> {
        let text_bytes: usize = req
            .messages
            .iter()
            .flat_map(|m| m.content.iter())
            .map(|p| match &p.part {
                Some(pb::content_part::Part::Text(t)) => t.len(),
                _ => 0,
            })
            .sum();
        if text_bytes < BLOCKING_TOKENIZE_BYTES {
            let prompt = tokenizer::render(&req);
            return Ok((req, prompt));
        }
        tokio::task::spawn_blocking(move || {
            let prompt = tokenizer::render(&req);
            (req, prompt)
        })
        .await
        .map_err(|e| status::engine_failure(format!("tokenizer task failed: {e}")))
    }

    /// Checks the prompt against the model; returns the completion limit.
    fn check(&self, req: &pb::GenerateRequest, prompt: &Prompt) -> Result<u32, Status> {
        let model = &self.state.model;
        if prompt.image_parts > 0 && !model.image_input {
            return Err(status::invalid_request(format!(
                "model `{}` does not accept image input",
                model.id
            )));
        }
        let max_tokens = req.sampling.as_ref().map_or(0, |s| s.max_tokens);
        pipeline::fit_window(model.context_window, prompt.len(), max_tokens)
    }

    /// Draining, tokenizing, the context check, admission, then the engine
    /// on a task of its own (under `span` until the generation ends).
    async fn start_generation(
        &self,
        request: pb::GenerateRequest,
        span: tracing::Span,
    ) -> Result<Response<EventStream>, Status> {
        let state = &self.state;
        span.record("request_id", tracing::field::display(&request.request_id));
        if state.drain.is_draining() {
            return Err(self.reject(status::draining()));
        }
        let engine = match &state.engine {
            Engines::Reply(engine) => Arc::clone(engine),
            Engines::Sequence(engine) => {
                return self.start_sequence(Arc::clone(engine), request, span).await
            }
            Engines::Chat(engine) => {
                return self.start_chat(Arc::clone(engine), request, span).await
            }
        };
        let (req, prompt) = Self::render(request).await?;
        let completion_limit = self.check(&req, &prompt).map_err(|s| self.reject(s))?;
        let slot = state.admission.admit().await.map_err(|o| {
            tracing::debug!(request_id = %req.request_id, "overloaded");
            self.reject(status::overloaded(o.running, o.queued))
        })?;
        let cached_prompt_tokens = state.cache.lookup_and_insert(&prompt.tokens);
        let prompt_tokens = prompt.len();
        let request_id = req.request_id.clone();
        let job = Job {
            request: req,
            prompt,
            cached_prompt_tokens,
            completion_limit,
            model: state.model.clone(),
        };
        let generation = engine.prepare(job).map_err(|s| self.reject(s))?;
        state.counters.started(prompt_tokens, cached_prompt_tokens);
        // At info, under the span that carries `trace_id` (RUST_LOG=info).
        tracing::info!(prompt_tokens, cached_prompt_tokens, "generate");

        Ok(self.spawn(slot, request_id, span, |out| generation.run(out)))
    }

    /// A sequence-level engine: the engine renders and tokenizes, its real
    /// window is checked, then admission, then the shared pipeline streams.
    async fn start_sequence(
        &self,
        engine: Arc<dyn SequenceEngine>,
        request: pb::GenerateRequest,
        span: tracing::Span,
    ) -> Result<Response<EventStream>, Status> {
        let state = &self.state;
        let request_id = request.request_id.clone();
        let mut prepared = pipeline::prepare(engine, request)
            .await
            .map_err(|s| self.reject(s))?;
        prepared.check_window().map_err(|s| self.reject(s))?;
        let slot = state.admission.admit().await.map_err(|o| {
            tracing::debug!(%request_id, "overloaded");
            self.reject(status::overloaded(o.running, o.queued))
        })?;
        let prompt_tokens = prepared.prompt_tokens();
        let running = prepared.start().await.map_err(|s| self.reject(s))?;
        state.counters.started(prompt_tokens, 0);
        tracing::info!(prompt_tokens, "generate");

        let st = Arc::clone(&self.state);
        Ok(self.spawn(slot, request_id, span, move |out| {
            running.run(out, move |cached| st.counters.cached(cached))
        }))
    }

    /// A message-level engine: its own count against its own window (the
    /// same check and status as the others), admission, then the request
    /// goes to the engine; a refusal before the first token is a plain
    /// status, so the gateway may retry elsewhere.
    async fn start_chat(
        &self,
        engine: Arc<dyn ChatEngine>,
        request: pb::GenerateRequest,
        span: tracing::Span,
    ) -> Result<Response<EventStream>, Status> {
        let state = &self.state;
        let request_id = request.request_id.clone();
        let prompt_tokens = engine
            .count_prompt(&request)
            .await
            .map_err(|s| self.reject(s))?;
        let max_tokens = request.sampling.as_ref().map_or(0, |s| s.max_tokens);
        let completion_limit = match prompt_tokens {
            Some(prompt) => Some(
                pipeline::fit_window(engine.context_window(), prompt, max_tokens)
                    .map_err(|s| self.reject(s))?,
            ),
            None => (max_tokens > 0).then_some(max_tokens),
        };
        let slot = state.admission.admit().await.map_err(|o| {
            tracing::debug!(%request_id, "overloaded");
            self.reject(status::overloaded(o.running, o.queued))
        })?;
        let st = Arc::clone(&self.state);
        let generation = engine
            .start(
                request,
                completion_limit,
                prompt_tokens,
                Box::new(move |cached| st.counters.cached(cached)),
            )
            .await
            .map_err(|s| self.reject(s))?;
        state.counters.started(prompt_tokens.unwrap_or(0), 0);
        tracing::info!(prompt_tokens, "generate");

        Ok(self.spawn(slot, request_id, span, |out| generation.run(out)))
    }

    /// Runs a started generation on a task of its own, under `span`; the
    /// admission slot is held until it ends, however it ends.
    fn spawn<F>(
        &self,
        slot: Slot,
        request_id: String,
        span: tracing::Span,
        run: impl FnOnce(EventSink) -> F,
    ) -> Response<EventStream>
    where
        F: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let generation = run(EventSink::new(tx));
        let state = Arc::clone(&self.state);
        tokio::spawn(
            async move {
                let _slot = slot;
                let outcome = generation.await;
                tracing::debug!(%request_id, ?outcome, "generation ended");
                state.counters.finished(outcome);
            }
            .instrument(span),
        );
        Response::new(EventStream::new(rx, Arc::clone(&self.state)))
    }

    fn context_window(&self) -> u32 {
        match &self.state.engine {
            Engines::Reply(_) => self.state.model.context_window,
            Engines::Sequence(engine) => engine.context_window(),
            Engines::Chat(engine) => engine.context_window(),
        }
    }
}

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    type GenerateStream = EventStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        // The gateway's trace context: recorded on this generation's span
        // (and its log lines), a remote parent when spans are exported.
        let trace = request
            .metadata()
            .get(telemetry::TRACEPARENT)
            .and_then(|v| TraceParent::parse(v.as_bytes()));
        let span = tracing::info_span!(
            "generate",
            otel.kind = "server",
            gen_ai.request.model = %self.state.model.id,
            request_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        if let Some(trace) = &trace {
            self.state.counters.traced(trace.trace_id);
            if !span.is_disabled() {
                telemetry::set_remote_parent(&span, trace);
                span.record("trace_id", tracing::field::display(trace.trace_id_hex()));
            }
        }
        self.start_generation(request.into_inner(), span.clone())
            .instrument(span)
            .await
    }

    async fn info(
        &self,
        _request: Request<pb::InfoRequest>,
    ) -> Result<Response<pb::InfoResponse>, Status> {
        let s = &self.state;
        Ok(Response::new(pb::InfoResponse {
            model: s.model.id.clone(),
            engine: s.engine_name.to_owned(),
            description: s.description.clone(),
            context_window: self.context_window(),
            capabilities: Some(s.model.capabilities()),
            load: Some(s.load()),
            draining: s.drain.is_draining(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            counters: Some(s.counters.snapshot()),
            last_trace_id: s.counters.last_trace_id(),
        }))
    }

    async fn count_tokens(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let prompt_tokens = match &self.state.engine {
            Engines::Reply(_) => Self::render(request.into_inner()).await?.1.len(),
            Engines::Sequence(engine) => {
                pipeline::prepare(Arc::clone(engine), request.into_inner())
                    .await?
                    .prompt_tokens()
            }
            Engines::Chat(engine) => engine
                .count_prompt(&request.into_inner())
                .await?
                .ok_or_else(|| Status::unimplemented("this worker's engine cannot count tokens"))?,
        };
        Ok(Response::new(pb::CountTokensResponse { prompt_tokens }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::synthetic::{SyntheticConfig, SyntheticEngine};
    use pb::worker_server::Worker;
    use tokio_stream::StreamExt;

    fn service(model: &str, window: Option<u32>, concurrency: u32, queue: u32) -> WorkerService {
        WorkerService::new(Arc::new(WorkerState {
            model: ModelProfile::new(model, window),
            engine_name: "synthetic",
            description: "SIMULATED".into(),
            engine: Engines::Reply(Arc::new(SyntheticEngine::new(SyntheticConfig::default()))),
            admission: Admission::new(concurrency, queue),
            cache: PrefixCache::new(4096),
            counters: Counters::default(),
            drain: DrainFlag::default(),
        }))
    }

    fn request(text: &str, max_tokens: u32) -> pb::GenerateRequest {
        pb::GenerateRequest {
            request_id: "t".into(),
            model: "base".into(),
            messages: vec![pb::Message {
                role: "user".into(),
                content: vec![pb::ContentPart {
                    part: Some(pb::content_part::Part::Text(text.into())),
                }],
                ..Default::default()
            }],
            sampling: Some(pb::Sampling {
                max_tokens,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    async fn finish(svc: &WorkerService, req: pb::GenerateRequest) -> pb::Finished {
        let mut stream = svc
            .generate(Request::new(req))
            .await
            .expect("generate")
            .into_inner();
        let mut last = None;
        while let Some(ev) = stream.next().await {
            last = ev.expect("event").event;
        }
        match last {
            Some(pb::generate_event::Event::Finished(f)) => f,
            other => panic!("last event {other:?}"),
        }
    }

    #[tokio::test]
    async fn rejects_prompts_over_the_context_window() {
        let svc = service("base", Some(100), 4, 4);
        let long = "word ".repeat(200);
        let err = svc
            .generate(Request::new(request(&long, 0)))
            .await
            .expect_err("too long");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(status::reason_of(&err), Some("CONTEXT_LENGTH_EXCEEDED"));

        // Fits alone but not with max_tokens.
        let err = svc
            .generate(Request::new(request("hello", 95)))
            .await
            .expect_err("prompt + max_tokens too long");
        assert_eq!(status::reason_of(&err), Some("CONTEXT_LENGTH_EXCEEDED"));
        assert!(
            err.message().contains("in the completion"),
            "{}",
            err.message()
        );

        // max_tokens 0 = the rest of the window.
        let f = finish(&svc, request("hello synthetic:reply_tokens=500", 0)).await;
        let u = f.usage.expect("usage");
        assert_eq!(u.prompt_tokens + u.completion_tokens, 100);
        assert_eq!(f.reason(), pb::finished::Reason::Length);
        assert_eq!(svc.state.counters.snapshot().rejected, 2);
    }

    #[tokio::test]
    async fn images_only_on_base() {
        let mut req = request("see", 10);
        req.messages[0].content.push(pb::ContentPart {
            part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                url: "data:image/png;base64,AAAA".into(),
                detail: "low".into(),
            })),
        });
        let err = service("base-mini", None, 1, 1)
            .generate(Request::new(req.clone()))
            .await
            .expect_err("no images on base-mini");
        assert_eq!(status::reason_of(&err), Some("INVALID_REQUEST"));
        let f = finish(&service("base", None, 1, 1), req).await;
        assert_eq!(f.usage.expect("usage").image_tokens, 85);
    }

    #[tokio::test]
    async fn repeated_prefix_reports_cached_tokens() {
        let svc = service("base", None, 4, 4);
        let long = "the same long system context ".repeat(60);
        let first = finish(&svc, request(&long, 10)).await.usage.expect("usage");
        assert_eq!(first.cached_prompt_tokens, 0);
        let second = finish(&svc, request(&long, 10)).await.usage.expect("usage");
        assert!(second.cached_prompt_tokens >= 64);
        assert!(second.cached_prompt_tokens <= second.prompt_tokens);
        assert_eq!(second.cached_prompt_tokens % 64, 0);
    }

    #[tokio::test]
    async fn overload_and_draining_are_refused_with_reasons() {
        let svc = service("base", None, 1, 0);
        let mut hung = svc
            .generate(Request::new(request("synthetic:hang", 10)))
            .await
            .expect("first runs")
            .into_inner();
        let err = svc
            .generate(Request::new(request("hi", 10)))
            .await
            .expect_err("overloaded");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(status::reason_of(&err), Some("OVERLOADED"));

        // Dropping the hung stream cancels it and frees the slot.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(20), hung.next())
                .await
                .is_err()
        );
        drop(hung);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while svc.state.counters.snapshot().cancelled == 0 {
            assert!(tokio::time::Instant::now() < deadline, "not cancelled");
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        assert!(svc.state.admission.is_idle());

        svc.state.drain.start();
        let err = svc
            .generate(Request::new(request("hi", 10)))
            .await
            .expect_err("draining");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert_eq!(status::reason_of(&err), Some("DRAINING"));
        let info = svc
            .info(Request::new(pb::InfoRequest {}))
            .await
            .expect("info")
            .into_inner();
        assert!(info.draining);
        assert_eq!(info.counters.expect("counters").rejected, 2);
    }

    #[tokio::test]
    async fn count_tokens_matches_generate_usage() {
        let svc = service("base", None, 4, 4);
        let req = request("How many tokens is this?", 5);
        let counted = svc
            .count_tokens(Request::new(req.clone()))
            .await
            .expect("count")
            .into_inner()
            .prompt_tokens;
        let f = finish(&svc, req).await;
        assert_eq!(counted, f.usage.expect("usage").prompt_tokens);
    }
}
