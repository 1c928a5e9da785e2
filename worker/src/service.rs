//! The tonic `inference.v1.Worker` service: the engine-independent half of
//! a request, on one path for every engine ([`start_generation`]):
//! draining, the prompt counted by the engine and fitted to its window
//! ([`engines`]), admission, counters, then the engine streams on a task of
//! its own.
//!
//! [`start_generation`]: WorkerService::start_generation

mod engines;

pub use engines::Engines;

use crate::admission::{Admission, Slot};
use crate::cache_report::CacheReport;
use crate::counters::Counters;
use crate::drain::DrainFlag;
use crate::model::ModelProfile;
use crate::running::{self, Running};
use crate::sampling_defaults::SamplingDefaults;
use crate::seam::{CacheHit, EventSink, Outcome, Started};
use crate::status;
use inference_proto::v1 as pb;
use std::sync::Arc;
use telemetry::TraceParent;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

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
    pub counters: Counters,
    pub drain: DrainFlag,
    /// What the engine holds in its prefix cache (`Info.prefix_cache`).
    pub cache_report: CacheReport,
    /// Sampling for the fields a request leaves unset.
    pub sampling_defaults: SamplingDefaults,
    /// Generations running now, by request id (`Cancel`).
    pub running: Arc<Running>,
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
        self.engine.load(own)
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

    /// Draining, the prompt counted by the engine and fitted to its
    /// window, admission, then the engine on a task of its own (under
    /// `span` until the generation ends). Every refusal is counted.
    async fn start_generation(
        &self,
        mut request: pb::GenerateRequest,
        span: tracing::Span,
    ) -> Result<Response<EventStream>, Status> {
        let state = &self.state;
        state.sampling_defaults.apply(&mut request);
        let request_id = request.request_id.clone();
        span.record("request_id", tracing::field::display(&request_id));
        if state.drain.is_draining() {
            return Err(self.reject(status::draining()));
        }
        // Before anything costs in proportion to them (engines of every kind).
        let stops = request.sampling.as_ref().map_or(&[][..], |s| &s.stop[..]);
        crate::pipeline::stop::check(stops).map_err(|s| self.reject(s))?;
        // Hashed before the engine takes the request, for the cache report.
        let prompt_blocks: Arc<[u64]> = inference_proto::prefix::prompt_blocks(&request).into();
        let mut counted = state
            .engine
            .count(request)
            .await
            .map_err(|s| self.reject(s))?;
        counted.fit().map_err(|s| self.reject(s))?;
        let slot = state.admission.admit().await.map_err(|o| {
            tracing::debug!(%request_id, "overloaded");
            self.reject(status::overloaded(o.running, o.queued))
        })?;
        let prompt_tokens = counted.prompt_tokens().unwrap_or(0);
        let st = Arc::clone(&self.state);
        let blocks = Arc::clone(&prompt_blocks);
        let started = counted
            .start(
                &prompt_blocks,
                Box::new(move |hit: CacheHit| {
                    st.counters.cached(hit.cached_tokens);
                    if let Some(slot) = hit.slot {
                        st.cache_report.placed(Arc::clone(&blocks), slot);
                    }
                }),
            )
            .await
            .map_err(|s| self.reject(s))?;
        if !state.cache_report.is_exact() {
            state.cache_report.sent(prompt_blocks);
        }
        state.counters.started(prompt_tokens, 0);
        // At info, under the span that carries `trace_id` (RUST_LOG=info).
        tracing::info!(prompt_tokens, "generate");
        Ok(self.spawn(slot, request_id, span, started))
    }

    /// Runs a started generation on a task of its own, under `span`; the
    /// admission slot is held until it ends, however it ends.
    fn spawn(
        &self,
        slot: Slot,
        request_id: String,
        span: tracing::Span,
        started: Box<dyn Started>,
    ) -> Response<EventStream> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let state = Arc::clone(&self.state);
        let mut registered = state.running.register(&request_id);
        tokio::spawn(
            async move {
                let _slot = slot;
                let stop = tx.clone();
                let sink = EventSink::new(tx);
                let generated = sink.generated_count();
                let outcome = tokio::select! {
                    outcome = started.run(sink) => outcome,
                    // `Cancel`: the generation is dropped (stopping the
                    // engine's sequence), then its count is told.
                    Ok(reply) = &mut registered.stop => {
                        let tokens = running::tokens(&generated);
                        let _ = reply.send(tokens);
                        Outcome::Cancelled { tokens }
                    }
                    // The drain's grace period ended first: the generation
                    // is dropped (stopping the engine's sequence) and the
                    // stream ends saying why.
                    () = state.drain.grace_over() => {
                        let _ = tokio::time::timeout(
                            DRAINED_SEND_WAIT,
                            stop.send(Err(status::drained())),
                        )
                        .await;
                        Outcome::Failed { tokens: 0 }
                    }
                };
                drop(registered);
                tracing::debug!(%request_id, ?outcome, "generation ended");
                state.counters.finished(outcome);
            }
            .instrument(span),
        );
        Response::new(EventStream::new(rx, Arc::clone(&self.state)))
    }
}

/// How long a generation stopped by the end of a drain waits to hand its
/// last status to a gateway that is not reading (then the stream just ends).
const DRAINED_SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

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
            context_window: s.engine.context_window(),
            capabilities: Some(pb::Capabilities {
                resume: s.engine.resumes(),
                resume_any: s.engine.resumes_any(),
                ..s.model.capabilities()
            }),
            load: Some(s.load()),
            draining: s.drain.is_draining(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            counters: Some(s.counters.snapshot()),
            last_trace_id: s.counters.last_trace_id(),
            prefix_cache: Some(s.cache_report.snapshot()),
            sampling_defaults: Some(s.sampling_defaults.to_proto()),
        }))
    }

    async fn count_tokens(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<pb::CountTokensResponse>, Status> {
        let prompt_tokens = self
            .state
            .engine
            .count(request.into_inner())
            .await?
            .prompt_tokens()
            .ok_or_else(|| Status::unimplemented("this worker's engine cannot count tokens"))?;
        Ok(Response::new(pb::CountTokensResponse { prompt_tokens }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let request_id = request.into_inner().request_id;
        let found = self.state.running.cancel(&request_id).await;
        tracing::debug!(%request_id, ?found, "cancelled by the gateway");
        Ok(Response::new(pb::CancelResponse {
            found: found.is_some(),
            generated_tokens: found.unwrap_or(0),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache_report::Source;
    use crate::engine::synthetic::{SyntheticConfig, SyntheticEngine};
    use pb::worker_server::Worker;
    use tokio_stream::StreamExt;

    fn service(model: &str, window: Option<u32>, concurrency: u32, queue: u32) -> WorkerService {
        WorkerService::new(Arc::new(WorkerState {
            model: ModelProfile::new(model, window),
            engine_name: "synthetic",
            description: "SIMULATED".into(),
            engine: Engines::Sequence(Arc::new(SyntheticEngine::new(
                SyntheticConfig {
                    prefix_cache_blocks: 4096,
                    ..SyntheticConfig::default()
                },
                ModelProfile::new(model, window),
            ))),
            admission: Admission::new(concurrency, queue),
            counters: Counters::default(),
            drain: DrainFlag::default(),
            cache_report: CacheReport::new(Source::Estimated { ttl: None }, concurrency, true),
            sampling_defaults: SamplingDefaults::default(),
            running: Arc::default(),
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

    /// Whatever gateway sent them, stop strings over the protocol's bounds
    /// (the audit's were 4,000,000 characters) are refused up front.
    #[tokio::test]
    async fn over_long_stop_strings_are_refused() {
        let svc = service("base", None, 1, 1);
        let mut req = request("hello", 10);
        if let Some(s) = req.sampling.as_mut() {
            s.stop = vec!["q".repeat(4_000_000), "x".into()];
        }
        let err = svc
            .generate(Request::new(req))
            .await
            .expect_err("a 4 MB stop string");
        assert_eq!(status::reason_of(&err), Some("INVALID_REQUEST"));
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(svc.state.counters.snapshot().rejected, 1);
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
        // The same prompt again: all but its last token, as llama.cpp.
        assert!(second.prompt_tokens > 64);
        assert_eq!(second.cached_prompt_tokens, second.prompt_tokens - 1);
        // Another question after the same context: whole 64-token blocks.
        let other = format!("{long} and then something else entirely");
        let third = finish(&svc, request(&other, 10))
            .await
            .usage
            .expect("usage");
        assert!(third.cached_prompt_tokens >= 64);
        assert!(third.cached_prompt_tokens < third.prompt_tokens);
        assert_eq!(third.cached_prompt_tokens % 64, 0);
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
