//! The `upstream` engine: the worker in front of an OpenAI-compatible
//! engine server (vLLM, SGLang, llama.cpp's `llama-server`, or any other),
//! usually in the same pod. The gateway keeps everything it owns (keys,
//! limits, validation, the Responses store, routing on real load); the
//! engine keeps its template, tokenizer, scheduler and parsers.
//!
//! - Each `Generate` is one streaming `POST /v1/chat/completions` on a
//!   pooled keep-alive HTTP/1.1 connection ([`client`]), fields mapped per
//!   [`kind::Kind`] ([`request`], the table in [`kind::FIELD_TABLE`]).
//! - Before generating: the prompt's real count from the engine's tokenizer
//!   ([`UpstreamEngine::count_prompt`]) against its real window, so an
//!   overflow is the same `context_length_exceeded` as in-process.
//! - The reply's deltas become proto events ([`relay`]); the engine's
//!   refusals become worker statuses ([`client::refusal`]).
//! - Dropping the stream drops the response body: hyper closes that
//!   connection and the engine stops (SGLang also gets `/abort_request`).
//! - Readiness and load come from the engine ([`load`]), and from how its
//!   generations go ([`liveness`]).
//! - The engine is not trusted to behave: nothing within the first-byte
//!   timeout, or silence past the idle timeout, fails the generation with
//!   DEADLINE_EXCEEDED and marks the engine stalled; a reply past
//!   `max_tokens` ends with `length` ([`relay::Relay::with_limit`]); an SSE
//!   event past its byte bound fails the generation ([`relay::SseDecoder`]).

pub mod args;
pub mod client;
pub mod kind;
pub mod liveness;
pub mod load;
pub mod relay;
pub mod request;
pub mod slots;
pub mod wire;

use crate::pipeline::coalesce::Coalescer;
use crate::seam::chat::{ChatEngine, EngineLoad, OnCached};
use crate::seam::{CacheHit, Cancelled, EventSink, Outcome, Started};
use crate::status;
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use inference_proto::v1 as pb;
use kind::{Counting, Kind};
use liveness::Liveness;
use relay::{Payload, Relay, SseDecoder};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::Status;

/// Time allowed for a tokenize round trip (a long prompt takes a while).
const COUNT_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed for discovery calls at start-up.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach and drive the engine.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// `http://127.0.0.1:8000`.
    pub url: String,
    pub kind: Kind,
    /// The engine's model id; default: the first of its `/v1/models`.
    pub model: Option<String>,
    /// Overrides (or, for `openai`, supplies) the context window.
    pub context_window: Option<u32>,
    /// Overrides the kind's default tool enforcement.
    pub enforce_tools: Option<bool>,
    /// Sent as `Authorization: Bearer` (an engine started with `--api-key`).
    pub api_key: Option<String>,
    /// How long to wait for the engine to come up (a large model loads for
    /// minutes).
    pub startup_timeout: Duration,
    /// The health and metrics scrape interval.
    pub scrape_interval: Duration,
    /// From sending a request to the reply's first SSE event (a long
    /// prompt's prefill comes first).
    pub first_byte_timeout: Duration,
    /// The longest silence between SSE events once the reply streams.
    pub idle_timeout: Duration,
    /// Bound on one SSE event of a reply, in bytes.
    pub max_event_bytes: usize,
    /// llama-server: the worker chooses each request's slot
    /// ([`slots`]); off when other clients share the engine.
    pub pin_slots: bool,
    /// vLLM, SGLang: each request's tier goes to the engine's own
    /// priority scheduling.
    pub pass_priority: bool,
}

impl UpstreamConfig {
    /// The defaults of the worker's flags for what is not said.
    pub fn new(url: &str, kind: Kind) -> Self {
        Self {
            url: url.to_owned(),
            kind,
            model: None,
            context_window: None,
            enforce_tools: None,
            api_key: None,
            startup_timeout: Duration::from_secs(600),
            scrape_interval: Duration::from_millis(250),
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_event_bytes: relay::DEFAULT_MAX_EVENT_BYTES,
            pin_slots: true,
            pass_priority: false,
        }
    }
}

/// Prefill of a long prompt on a busy GPU takes tens of seconds before the
/// first token; a minute is a wedged engine.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(60);
/// Decoding engines send a token every few tens of milliseconds; a chunked
/// prefill of another request pauses them for seconds, not fifteen.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15);

/// What the relay allows the engine, per generation.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    first_byte: Duration,
    idle: Duration,
    max_event_bytes: usize,
}

/// The engine handle shared by all requests.
pub struct UpstreamEngine {
    http: client::Http,
    kind: Kind,
    model: String,
    window: u32,
    capacity: Option<u32>,
    enforce_tools: bool,
    /// Each request's tier goes to the engine ([`Kind::priority`]).
    pass_priority: bool,
    load: Arc<load::LoadCell>,
    /// A load older than this is not reported.
    load_max_age: Duration,
    /// Cleared when the engine turns out to have no tokenizer endpoint.
    can_count: AtomicBool,
    liveness: Arc<Liveness>,
    bounds: Bounds,
    /// llama-server: the slots the worker places requests in.
    pins: Option<Arc<slots::SlotPins>>,
}

impl UpstreamEngine {
    /// Waits for the engine to answer, then learns its model id, context
    /// window and slots.
    pub async fn connect(cfg: &UpstreamConfig) -> anyhow::Result<Self> {
        let http = client::Http::new(&cfg.url, cfg.api_key.as_deref())?;
        let deadline = tokio::time::Instant::now() + cfg.startup_timeout;
        let models: wire::Models = loop {
            match http
                .json(
                    http::Method::GET,
                    "/v1/models",
                    Bytes::new(),
                    DISCOVERY_TIMEOUT,
                )
                .await
            {
                Ok(m) => break m,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    tracing::info!(error = %e.message(), "waiting for the upstream engine");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => anyhow::bail!(
                    "the upstream engine at {} did not answer GET /v1/models within {:?}: {}",
                    cfg.url,
                    cfg.startup_timeout,
                    e.message()
                ),
            }
        };
        let card = match &cfg.model {
            Some(id) => models.data.iter().find(|m| &m.id == id).cloned(),
            None => models.data.first().cloned(),
        };
        let model = cfg
            .model
            .clone()
            .or_else(|| card.as_ref().map(|c| c.id.clone()))
            .ok_or_else(|| {
                anyhow::anyhow!("the upstream engine lists no model; pass --upstream-model")
            })?;
        let (props_window, capacity) = if cfg.kind == Kind::LlamaServer {
            let props: wire::Props = http
                .json(http::Method::GET, "/props", Bytes::new(), DISCOVERY_TIMEOUT)
                .await
                .map_err(|e| anyhow::anyhow!("llama-server GET /props: {}", e.message()))?;
            (
                props.default_generation_settings.and_then(|g| g.n_ctx),
                props.total_slots,
            )
        } else {
            (None, None)
        };
        let window = cfg
            .context_window
            .or(props_window)
            .or_else(|| card.as_ref().and_then(|c| c.max_model_len))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the upstream engine does not say its context window; pass \
                     --upstream-context-window"
                )
            })?;
        Ok(Self {
            http,
            kind: cfg.kind,
            model,
            window,
            capacity,
            enforce_tools: cfg
                .enforce_tools
                .unwrap_or_else(|| cfg.kind.enforces_tools_by_default()),
            pass_priority: cfg.pass_priority,
            load: Arc::default(),
            load_max_age: cfg.scrape_interval * 4 + Duration::from_secs(1),
            can_count: AtomicBool::new(cfg.kind.counting() != Counting::None),
            liveness: Arc::default(),
            bounds: Bounds {
                first_byte: cfg.first_byte_timeout.max(Duration::from_millis(1)),
                idle: cfg.idle_timeout.max(Duration::from_millis(1)),
                max_event_bytes: cfg.max_event_bytes,
            },
            pins: match (cfg.kind, capacity) {
                (Kind::LlamaServer, Some(n)) if cfg.pin_slots => Some(slots::SlotPins::new(n)),
                _ => None,
            },
        })
    }

    /// Starts the health and load scrape, and the probe of a stalled
    /// engine; the receiver follows readiness.
    pub fn spawn_scraper(&self, interval: Duration) -> watch::Receiver<bool> {
        tokio::spawn(load::scrape(
            self.http.clone(),
            self.kind,
            self.capacity,
            Arc::clone(&self.load),
            Arc::clone(&self.liveness),
            interval,
        ));
        tokio::spawn(liveness::probe(
            self.http.clone(),
            self.kind,
            self.model.clone(),
            Arc::clone(&self.liveness),
            interval.max(Duration::from_millis(250)),
            self.bounds.first_byte,
        ));
        self.liveness.subscribe()
    }

    /// Sequences the engine runs at once, when it says (llama-server slots).
    pub fn capacity(&self) -> Option<u32> {
        self.capacity
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    async fn count(
        &self,
        messages: &[wire::Message],
        tools: &[wire::Tool],
    ) -> Result<Option<u32>, Status> {
        let tokenize = match self.kind.counting() {
            Counting::None => return Ok(None),
            Counting::ChatTokenize => to_json(&wire::ChatTokenize {
                model: &self.model,
                messages,
                tools,
                add_generation_prompt: true,
            })?,
            Counting::TemplateThenTokenize => {
                let body = to_json(&wire::ApplyTemplate { messages, tools })?;
                let Some(applied) = self.post::<wire::Applied>("/apply-template", body).await?
                else {
                    return Ok(None);
                };
                to_json(&wire::TextTokenize {
                    content: &applied.prompt,
                    add_special: true,
                    parse_special: true,
                })?
            }
        };
        let tokenized = self.post::<wire::Tokenized>("/tokenize", tokenize).await?;
        Ok(tokenized.map(|t| t.token_count()))
    }

    /// A counting call; `None` when the engine has no such endpoint after
    /// all (a build without it): the worker counts no more, and the
    /// engine's own 400 still guards the window.
    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: Bytes,
    ) -> Result<Option<T>, Status> {
        let (code, bytes) = self
            .http
            .call(http::Method::POST, path, body, COUNT_TIMEOUT)
            .await?;
        if code == http::StatusCode::NOT_FOUND {
            tracing::warn!(
                path,
                "the upstream engine has no tokenizer endpoint; not counting"
            );
            self.can_count.store(false, Ordering::Relaxed);
            return Ok(None);
        }
        if !code.is_success() {
            return Err(client::refusal(code, &bytes, None));
        }
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| status::engine_failure(format!("upstream {path}: unreadable reply: {e}")))
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Bytes, Status> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| status::engine_failure(format!("encoding the upstream request: {e}")))
}

#[async_trait::async_trait]
impl ChatEngine for UpstreamEngine {
    fn name(&self) -> &'static str {
        "upstream"
    }

    fn description(&self) -> String {
        format!(
            "{} ({} at {}, {} tokens{})",
            self.model,
            self.kind.as_str(),
            self.http.base(),
            self.window,
            if self.enforce_tools {
                ", tool choices enforced by the worker"
            } else {
                ""
            }
        )
    }

    fn context_window(&self) -> u32 {
        self.window
    }

    fn load(&self) -> Option<EngineLoad> {
        self.load.get(self.load_max_age)
    }

    async fn count_prompt(&self, req: &pb::GenerateRequest) -> Result<Option<u32>, Status> {
        if !self.can_count.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let enforced = request::enforces_tools(req, self.enforce_tools);
        let messages = request::messages(self.kind, req, enforced)?;
        // Enforced tool choices list the tools in a message instead.
        let tools = if enforced {
            Vec::new()
        } else {
            request::tools(req)?
        };
        self.count(&messages, &tools).await
    }

    fn has_slots(&self) -> bool {
        self.pins.is_some()
    }

    fn resumes(&self) -> bool {
        self.kind.continues_final_message().is_some()
    }

    async fn start(
        &self,
        req: pb::GenerateRequest,
        prompt_blocks: &Arc<[u64]>,
        completion_limit: Option<u32>,
        prompt_tokens: Option<u32>,
        mut on_cached: OnCached,
    ) -> Result<Box<dyn Started>, Status> {
        // A moved generation: what was delivered counts against the limit.
        let delivered = req.resume.as_ref().map_or(0, |r| r.completion_tokens);
        let completion_limit = completion_limit.map(|l| l.saturating_sub(delivered).max(1));
        let mut built = request::build(
            self.kind,
            &self.model,
            &req,
            completion_limit,
            self.enforce_tools,
        )?;
        let mut pin = self.pins.as_ref().map(|p| p.pin(prompt_blocks));
        built.body.id_slot = pin.as_ref().map(slots::Pin::slot);
        if self.pass_priority {
            built.body.priority = self.kind.priority(req.service_tier());
        }
        let body = to_json(&built.body)?;
        let first_byte = Instant::now() + self.bounds.first_byte;
        let resp = match tokio::time::timeout_at(
            first_byte,
            self.http
                .send(http::Method::POST, "/v1/chat/completions", body),
        )
        .await
        {
            Ok(sent) => sent?,
            Err(_) => {
                self.liveness.timed_out();
                return Err(status::engine_timeout(format!(
                    "the upstream engine sent no reply within the first-byte timeout ({:?})",
                    self.bounds.first_byte
                )));
            }
        };
        if !resp.status().is_success() {
            let code = resp.status();
            let bytes = http_body_util::Limited::new(resp.into_body(), 64 * 1024)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let known = prompt_tokens.map(|prompt| client::Known {
                window: self.window,
                prompt,
                max_tokens: req.sampling.as_ref().map_or(0, |s| s.max_tokens),
            });
            return Err(client::refusal(code, &bytes, known));
        }
        // The engine took it: the slot now holds this prompt (reported now,
        // as the in-process engine reports its slot at prefill).
        if let Some(pin) = pin.as_mut() {
            pin.accepted();
            on_cached(CacheHit {
                cached_tokens: 0,
                slot: Some(pin.slot()),
            });
        }
        let abort =
            (self.kind.aborts_by_request_id() && !req.request_id.is_empty()).then(|| AbortOnDrop {
                http: self.http.clone(),
                rid: req.request_id.clone(),
                armed: true,
            });
        Ok(Box::new(UpstreamGeneration {
            body: resp.into_body(),
            relay: Relay::new(&req.request_id, built.enforced_tools)
                .with_stops(
                    req.sampling
                        .as_ref()
                        .map(|s| s.stop.clone())
                        .unwrap_or_default(),
                )
                .with_limit(completion_limit)
                .resuming(delivered),
            batch: req.batch_events,
            prompt_tokens,
            on_cached,
            pin,
            abort,
            first_byte,
            bounds: self.bounds,
            liveness: Arc::clone(&self.liveness),
        }))
    }
}

/// SGLang: a request left behind by a closed connection is aborted by id.
struct AbortOnDrop {
    http: client::Http,
    rid: String,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let http = self.http.clone();
        let body = Bytes::from(serde_json::json!({"rid": self.rid}).to_string());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = http
                    .call(
                        http::Method::POST,
                        "/abort_request",
                        body,
                        Duration::from_secs(5),
                    )
                    .await;
            });
        }
    }
}

/// One accepted request, its reply still streaming.
struct UpstreamGeneration {
    body: Incoming,
    relay: Relay,
    batch: bool,
    prompt_tokens: Option<u32>,
    on_cached: OnCached,
    /// The slot the request runs in, released when the reply ends.
    pin: Option<slots::Pin>,
    abort: Option<AbortOnDrop>,
    /// When the first SSE event is due (the request was sent before).
    first_byte: Instant,
    bounds: Bounds,
    liveness: Arc<Liveness>,
}

/// How the read loop ended.
enum End {
    Done,
    Cancelled,
    Failed(Status),
}

impl UpstreamGeneration {
    /// Reads the engine's stream to its end, relaying events.
    async fn stream(&mut self, out: &EventSink) -> End {
        let mut sse = SseDecoder::new(self.bounds.max_event_bytes);
        let mut coalescer = Coalescer::default();
        // Due: the first event, then each next one. Bytes that complete no
        // event (an endless line, comments) do not count as an answer.
        let silence = tokio::time::sleep_until(self.first_byte);
        tokio::pin!(silence);
        let mut answered = false;
        loop {
            let frame = tokio::select! {
                biased;
                _ = out.closed() => return End::Cancelled,
                f = self.body.frame() => f,
                _ = &mut silence => return End::Failed(self.timed_out(answered)),
            };
            let data = match frame {
                // Ended after its finish reason, without `[DONE]`.
                None if self.relay.finished() => {
                    return match flush(out, &mut coalescer).await {
                        Ok(()) => End::Done,
                        Err(Cancelled) => End::Cancelled,
                    }
                }
                None => {
                    return End::Failed(status::engine_failure(
                        "the upstream engine closed the stream before finishing",
                    ))
                }
                Some(Err(e)) => {
                    return End::Failed(status::engine_failure(format!(
                        "reading the upstream stream: {e}"
                    )))
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue, // trailers
                },
            };
            let payloads = match sse.push(&data) {
                Ok(p) => p,
                Err(s) => return End::Failed(s),
            };
            if !payloads.is_empty() {
                if !answered {
                    answered = true;
                    self.liveness.answered();
                    if let Some(pin) = self.pin.as_mut() {
                        pin.answered();
                    }
                }
                silence.as_mut().reset(Instant::now() + self.bounds.idle);
            }
            for payload in payloads {
                let text = match payload {
                    Payload::Done => {
                        return match flush(out, &mut coalescer).await {
                            Ok(()) => End::Done,
                            Err(Cancelled) => End::Cancelled,
                        }
                    }
                    Payload::Data(text) => text,
                };
                let chunk = match serde_json::from_str::<wire::Chunk>(&text) {
                    Ok(c) => c,
                    Err(e) => {
                        return End::Failed(status::engine_failure(format!(
                            "the upstream engine sent an unreadable chunk: {e}"
                        )))
                    }
                };
                let events = match self.relay.chunk(chunk) {
                    Ok(ev) => ev,
                    Err(s) => return End::Failed(s),
                };
                out.generated_at_least(self.relay.completion_tokens());
                for ev in events {
                    if let Some(ready) = coalescer.push(ev) {
                        if out.send(ready).await.is_err() {
                            return End::Cancelled;
                        }
                    }
                }
                if self.relay.cut() {
                    // Past `max_tokens`: the reply ends here; the engine's
                    // stream is dropped with `self`.
                    tracing::warn!(
                        "the upstream engine went past max_tokens; the reply was cut there"
                    );
                    return match flush(out, &mut coalescer).await {
                        Ok(()) => End::Done,
                        Err(Cancelled) => End::Cancelled,
                    };
                }
            }
            // What arrived together went out together; a caller that
            // relays deltas gets them now.
            if !self.batch && flush(out, &mut coalescer).await.is_err() {
                return End::Cancelled;
            }
        }
    }
}

impl UpstreamGeneration {
    /// The engine said nothing in time: the generation fails, and the
    /// engine counts as stalled until it answers again.
    fn timed_out(&self, answered: bool) -> Status {
        self.liveness.timed_out();
        status::engine_timeout(if answered {
            format!(
                "the upstream engine went silent mid-stream for the idle timeout ({:?})",
                self.bounds.idle
            )
        } else {
            format!(
                "the upstream engine sent no event within the first-byte timeout ({:?})",
                self.bounds.first_byte
            )
        })
    }
}

async fn flush(out: &EventSink, coalescer: &mut Coalescer) -> Result<(), Cancelled> {
    match coalescer.take() {
        Some(ev) => out.send(ev).await,
        None => Ok(()),
    }
}

#[async_trait::async_trait]
impl Started for UpstreamGeneration {
    async fn run(mut self: Box<Self>, out: EventSink) -> Outcome {
        let end = self.stream(&out).await;
        let tokens = self.relay.completion_tokens();
        match end {
            // Dropping `self` closes the connection (and aborts on SGLang).
            End::Cancelled => Outcome::Cancelled { tokens },
            End::Failed(s) => out.finish_failed(s, tokens).await,
            End::Done => {
                // A reply cut at the limit leaves the engine generating:
                // SGLang still needs its abort.
                let cut = self.relay.cut();
                if let Some(a) = self.abort.as_mut().filter(|_| !cut) {
                    a.armed = false;
                }
                if let Some(cached) = self.relay.cached_tokens() {
                    (self.on_cached)(CacheHit {
                        cached_tokens: cached,
                        slot: None,
                    });
                }
                let finished = self.relay.finish(self.prompt_tokens);
                out.finish(finished, tokens).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The engine against a fake upstream: a loopback socket that answers
    //! each request with a canned HTTP/1.1 reply.
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// Serves `replies` (path prefix → raw HTTP response) until dropped;
    /// each request's path and body are sent on the returned channel.
    async fn fake(
        replies: Vec<(&'static str, String)>,
    ) -> (String, mpsc::UnboundedReceiver<(String, String)>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let replies = replies.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let Ok(n) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).into_owned();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(str::to_owned)
                            })
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() < head_end + 4 + length {
                            continue;
                        }
                        let path = text
                            .split_whitespace()
                            .nth(1)
                            .unwrap_or_default()
                            .to_owned();
                        let body = text[head_end + 4..].to_owned();
                        buf.clear();
                        let reply = replies
                            .iter()
                            .find(|(p, _)| path.starts_with(p))
                            .map(|(_, r)| r.clone())
                            .unwrap_or_else(|| {
                                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into()
                            });
                        let _ = tx.send((path, body));
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}"), rx)
    }

    fn json_reply(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    fn sse_reply(frames: &[&str]) -> String {
        let body: String = frames.iter().map(|f| format!("data: {f}\n\n")).collect();
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    /// Discovery of a llama-server with model `m`, 512 tokens, two slots.
    fn llama_server_models() -> (&'static str, String) {
        (
            "/v1/models",
            json_reply("200 OK", r#"{"data":[{"id":"m"}]}"#),
        )
    }

    fn llama_server_props() -> (&'static str, String) {
        (
            "/props",
            json_reply(
                "200 OK",
                r#"{"default_generation_settings":{"n_ctx":512},"total_slots":2}"#,
            ),
        )
    }

    fn config(url: &str, kind: Kind) -> UpstreamConfig {
        UpstreamConfig {
            startup_timeout: Duration::from_secs(2),
            scrape_interval: Duration::from_millis(50),
            ..UpstreamConfig::new(url, kind)
        }
    }

    fn request(max_tokens: u32) -> pb::GenerateRequest {
        pb::GenerateRequest {
            request_id: "req-9".into(),
            messages: vec![pb::Message {
                role: "user".into(),
                content: vec![pb::ContentPart {
                    part: Some(pb::content_part::Part::Text("hi".into())),
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

    async fn collect(
        engine: &UpstreamEngine,
        req: pb::GenerateRequest,
    ) -> Result<Vec<Result<pb::generate_event::Event, Status>>, Status> {
        let generation = engine
            .start(
                req,
                &Arc::from(Vec::new()),
                Some(16),
                Some(9),
                Box::new(|_| {}),
            )
            .await?;
        let (tx, mut rx) = mpsc::channel(64);
        generation.run(EventSink::new(tx)).await;
        let mut out = Vec::new();
        while let Some(ev) = rx.recv().await {
            out.push(ev.map(|e| e.event.expect("event")));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn a_vllm_stream_relays_and_counts_with_the_engine() {
        let (url, mut seen) = fake(vec![
            ("/v1/models", json_reply("200 OK", r#"{"data":[{"id":"m","max_model_len":4096}]}"#)),
            ("/tokenize", json_reply("200 OK", r#"{"count":9,"max_model_len":4096,"tokens":[1,2,3,4,5,6,7,8,9]}"#)),
            (
                "/v1/chat/completions",
                sse_reply(&[
                    r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
                    r#"{"choices":[{"delta":{"reasoning":"hm"}}]}"#,
                    r#"{"choices":[{"delta":{"content":"Hello"}}]}"#,
                    r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
                    r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
                    "[DONE]",
                ]),
            ),
        ])
        .await;
        let engine = UpstreamEngine::connect(&config(&url, Kind::Vllm))
            .await
            .expect("connect");
        assert_eq!((engine.context_window(), engine.model()), (4096, "m"));
        assert_eq!(
            engine.count_prompt(&request(0)).await.expect("count"),
            Some(9)
        );
        let events = collect(&engine, request(0)).await.expect("start");
        let finished = match events.last() {
            Some(Ok(pb::generate_event::Event::Finished(f))) => *f,
            other => panic!("{other:?}"),
        };
        assert_eq!(finished.reason(), pb::finished::Reason::Stop);
        let u = finished.usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens),
            (9, 4, 2)
        );
        assert!(events
            .iter()
            .any(|e| matches!(e, Ok(pb::generate_event::Event::Text(t)) if t.text == "Hello")));
        assert!(events
            .iter()
            .any(|e| matches!(e, Ok(pb::generate_event::Event::Reasoning(t)) if t.text == "hm")));
        // What the engine was sent.
        let mut chat = None;
        while let Ok((path, body)) = seen.try_recv() {
            if path == "/v1/chat/completions" {
                chat = Some(body);
            }
        }
        let chat: serde_json::Value =
            serde_json::from_str(&chat.expect("a chat request")).expect("json");
        assert_eq!(chat["model"], "m");
        assert_eq!(chat["stream"], true);
        assert_eq!(chat["max_tokens"], 16);
    }

    #[tokio::test]
    async fn llama_server_requests_name_their_slot_and_report_it() {
        let (url, mut seen) = fake(vec![
            llama_server_models(),
            llama_server_props(),
            (
                "/v1/chat/completions",
                sse_reply(&[
                    r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
                    r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
                    "[DONE]",
                ]),
            ),
        ])
        .await;
        let engine = UpstreamEngine::connect(&config(&url, Kind::LlamaServer))
            .await
            .expect("connect");
        assert!(engine.has_slots());
        let (a, b): (Arc<[u64]>, Arc<[u64]>) = (vec![1, 2].into(), vec![7].into());
        let mut slots = Vec::new();
        for blocks in [&a, &b, &a] {
            let heard = Arc::new(std::sync::Mutex::new(None));
            let h = Arc::clone(&heard);
            let generation = engine
                .start(
                    request(8),
                    blocks,
                    Some(8),
                    None,
                    Box::new(move |hit: CacheHit| {
                        if hit.slot.is_some() {
                            *h.lock().expect("lock") = hit.slot;
                        }
                    }),
                )
                .await
                .expect("start");
            let (tx, mut rx) = mpsc::channel(64);
            generation.run(EventSink::new(tx)).await;
            while rx.recv().await.is_some() {}
            let heard = *heard.lock().expect("lock");
            let body = loop {
                let (path, body) = seen.recv().await.expect("a request");
                if path == "/v1/chat/completions" {
                    break body;
                }
            };
            let sent: serde_json::Value = serde_json::from_str(&body).expect("json");
            assert_eq!(sent["id_slot"].as_u64().map(|s| s as u32), heard);
            slots.push(heard.expect("a slot"));
        }
        // Two prompts in two slots; the first comes back to its own.
        assert_ne!(slots[0], slots[1]);
        assert_eq!(slots[0], slots[2]);
    }

    #[tokio::test]
    async fn the_count_renders_tools_unless_the_worker_enforces_them() {
        let (url, mut seen) = fake(vec![
            llama_server_models(),
            llama_server_props(),
            (
                "/apply-template",
                json_reply("200 OK", r#"{"prompt":"<p>"}"#),
            ),
            ("/tokenize", json_reply("200 OK", r#"{"tokens":[1,2,3]}"#)),
        ])
        .await;
        let engine = UpstreamEngine::connect(&config(&url, Kind::LlamaServer))
            .await
            .expect("connect");
        assert_eq!((engine.context_window(), engine.capacity()), (512, Some(2)));
        let mut req = request(0);
        req.tools = vec![pb::FunctionTool {
            name: "f".into(),
            ..Default::default()
        }];
        for (mode, rendered) in [
            (pb::tool_choice::Mode::Auto, true),
            (pb::tool_choice::Mode::Required, false),
        ] {
            req.tool_choice = Some(pb::ToolChoice {
                mode: mode as i32,
                function_name: String::new(),
            });
            assert_eq!(engine.count_prompt(&req).await.expect("count"), Some(3));
            let mut template = None;
            while let Ok((path, body)) = seen.try_recv() {
                if path == "/apply-template" {
                    template = Some(body);
                }
            }
            let body: serde_json::Value =
                serde_json::from_str(&template.expect("apply-template")).expect("json");
            assert_eq!(body.get("tools").is_some(), rendered, "{mode:?}: {body}");
        }
    }

    #[tokio::test]
    async fn refusals_before_the_stream_are_statuses() {
        for (reply, reason) in [
            (
                json_reply("503 Service Unavailable", r#"{"error":{"message":"busy"}}"#),
                "OVERLOADED",
            ),
            (json_reply("429 Too Many Requests", "{}"), "OVERLOADED"),
            (
                json_reply(
                    "400 Bad Request",
                    r#"{"error":{"message":"This model's maximum context length is 4096 tokens."}}"#,
                ),
                "CONTEXT_LENGTH_EXCEEDED",
            ),
            (
                json_reply("500 Internal Server Error", "oops"),
                "ENGINE_FAILURE",
            ),
        ] {
            let (url, _seen) = fake(vec![
                (
                    "/v1/models",
                    json_reply("200 OK", r#"{"data":[{"id":"m","max_model_len":4096}]}"#),
                ),
                ("/v1/chat/completions", reply),
            ])
            .await;
            let engine = UpstreamEngine::connect(&config(&url, Kind::Openai))
                .await
                .expect("connect");
            let err = collect(&engine, request(8)).await.expect_err("refused");
            assert_eq!(status::reason_of(&err), Some(reason), "{err:?}");
        }
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_end_fails_the_generation() {
        let (url, _seen) = fake(vec![
            (
                "/v1/models",
                json_reply("200 OK", r#"{"data":[{"id":"m","max_model_len":4096}]}"#),
            ),
            (
                "/v1/chat/completions",
                sse_reply(&[r#"{"choices":[{"delta":{"content":"Hel"}}]}"#]),
            ),
        ])
        .await;
        let engine = UpstreamEngine::connect(&config(&url, Kind::Openai))
            .await
            .expect("connect");
        let events = collect(&engine, request(8)).await.expect("start");
        let err = events
            .last()
            .and_then(|e| e.as_ref().err())
            .expect("a failure");
        assert_eq!(status::reason_of(err), Some("ENGINE_FAILURE"));
    }

    const MODELS: &str = r#"{"data":[{"id":"m","max_model_len":4096}]}"#;

    /// An engine whose chat replies are `reply` (raw, possibly unfinished:
    /// the fake then waits, holding the connection open).
    async fn engine_replying(reply: String, bounds: Bounds) -> UpstreamEngine {
        let (url, _seen) = fake(vec![
            ("/v1/models", json_reply("200 OK", MODELS)),
            ("/v1/chat/completions", reply),
        ])
        .await;
        let cfg = UpstreamConfig {
            first_byte_timeout: bounds.first_byte,
            idle_timeout: bounds.idle,
            max_event_bytes: bounds.max_event_bytes,
            ..config(&url, Kind::Openai)
        };
        UpstreamEngine::connect(&cfg).await.expect("connect")
    }

    fn short_bounds() -> Bounds {
        Bounds {
            first_byte: Duration::from_millis(300),
            idle: Duration::from_millis(200),
            max_event_bytes: 4096,
        }
    }

    /// A 200 head of an event stream whose body never ends, then `frames`.
    fn open_sse(frames: &[&str]) -> String {
        let body: String = frames.iter().map(|f| format!("data: {f}\n\n")).collect();
        format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000000\r\n\r\n{body}"
        )
    }

    fn last_error(events: &[Result<pb::generate_event::Event, Status>]) -> &Status {
        events
            .last()
            .and_then(|e| e.as_ref().err())
            .unwrap_or_else(|| panic!("a failure last: {events:?}"))
    }

    #[tokio::test]
    async fn an_engine_silent_before_its_head_times_out_and_is_stalled() {
        let engine = engine_replying(String::new(), short_bounds()).await;
        let started = std::time::Instant::now();
        let err = collect(&engine, request(8)).await.expect_err("timed out");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
        assert_eq!(status::reason_of(&err), Some("ENGINE_FAILURE"));
        assert!(engine.liveness.is_stalled() && !engine.liveness.is_ready());
    }

    #[tokio::test]
    async fn a_head_without_events_times_out_at_the_first_byte_deadline() {
        let engine = engine_replying(open_sse(&[]), short_bounds()).await;
        let events = collect(&engine, request(8)).await.expect("head arrived");
        let err = last_error(&events);
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
        assert!(err.message().contains("first-byte"), "{}", err.message());
        assert!(engine.liveness.is_stalled());
    }

    #[tokio::test]
    async fn silence_mid_stream_times_out_and_an_answer_clears_the_stall() {
        let engine = engine_replying(
            open_sse(&[r#"{"choices":[{"delta":{"content":"Hel"}}]}"#]),
            short_bounds(),
        )
        .await;
        let events = collect(&engine, request(8)).await.expect("start");
        assert!(matches!(&events[0], Ok(pb::generate_event::Event::Text(t)) if t.text == "Hel"));
        let err = last_error(&events);
        assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
        assert!(err.message().contains("idle"), "{}", err.message());
        assert!(engine.liveness.is_stalled());
        // The next request's first event is an answer (until that reply
        // goes silent in turn).
        let generation = engine
            .start(
                request(8),
                &Arc::from(Vec::new()),
                Some(16),
                None,
                Box::new(|_| {}),
            )
            .await
            .expect("start");
        let (tx, mut rx) = mpsc::channel(64);
        let run = tokio::spawn(generation.run(EventSink::new(tx)));
        assert!(matches!(rx.recv().await, Some(Ok(_))));
        assert!(!engine.liveness.is_stalled() && engine.liveness.is_ready());
        let _ = run.await;
        assert!(engine.liveness.is_stalled());
    }

    #[tokio::test]
    async fn an_engine_ignoring_max_tokens_is_cut_at_the_limit() {
        // `collect` passes a completion limit of 16.
        let frames: Vec<String> = (0..2000)
            .map(|_| r#"{"choices":[{"delta":{"content":"t"}}]}"#.to_owned())
            .collect();
        let frames: Vec<&str> = frames.iter().map(String::as_str).collect();
        let engine = engine_replying(open_sse(&frames), short_bounds()).await;
        let events = collect(&engine, request(16)).await.expect("start");
        let text: String = events
            .iter()
            .filter_map(|e| match e {
                Ok(pb::generate_event::Event::Text(t)) => Some(t.text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(text.len(), 16, "{text}");
        let finished = match events.last() {
            Some(Ok(pb::generate_event::Event::Finished(f))) => *f,
            other => panic!("{other:?}"),
        };
        assert_eq!(finished.reason(), pb::finished::Reason::Length);
        assert_eq!(finished.usage.expect("usage").completion_tokens, 16);
    }

    #[tokio::test]
    async fn an_endless_line_fails_the_generation() {
        let line = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000000\r\n\r\ndata: {}",
            "x".repeat(8192)
        );
        let engine = engine_replying(line, short_bounds()).await;
        let events = collect(&engine, request(8)).await.expect("start");
        let err = last_error(&events);
        assert_eq!(err.code(), tonic::Code::Internal);
        assert_eq!(status::reason_of(err), Some("ENGINE_FAILURE"));
        assert!(
            err.message().contains("over 4096 bytes"),
            "{}",
            err.message()
        );
        // A server-side failure, not a stall.
        assert!(!engine.liveness.is_stalled());
    }

    #[tokio::test]
    async fn load_and_readiness_come_from_the_engine() {
        let (url, _seen) = fake(vec![
            (
                "/v1/models",
                json_reply("200 OK", r#"{"data":[{"id":"m","max_model_len":4096}]}"#),
            ),
            ("/health", json_reply("200 OK", "{}")),
            (
                "/metrics",
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{}",
                    "vllm:num_requests_running{m=\"m\"} 3\nvllm:num_requests_waiting{m=\"m\"} 5\n"
                        .len(),
                    "vllm:num_requests_running{m=\"m\"} 3\nvllm:num_requests_waiting{m=\"m\"} 5\n"
                ),
            ),
        ])
        .await;
        let engine = UpstreamEngine::connect(&config(&url, Kind::Vllm))
            .await
            .expect("connect");
        let ready = engine.spawn_scraper(Duration::from_millis(20));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while engine.load().is_none() {
            assert!(tokio::time::Instant::now() < deadline, "no load scraped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let load = engine.load().expect("load");
        assert_eq!((load.running, load.waiting), (3, 5));
        assert!(*ready.borrow());
    }
}
