//! The generation sinks of replies to an HTTP client: a stream of encoded
//! frames (chat chunks, Anthropic Messages events), a folded body (chat,
//! Anthropic Messages), and Responses events (streamed, or folded into the
//! response object). Streams write through [`SseReply`].
//!
//! Every sink also watches the replica's drain ([`Cut`]): when the grace
//! period runs out it ends the generation like a client that left (the
//! worker call is dropped, the reservation billed for what was delivered),
//! and the route then ends the reply in band rather than at the socket.

use super::ending::end_stream;
use super::idempotent::{self, Claim};
use crate::api::responses::EncodedEvent;
use crate::error::ApiError;
use crate::generation::{End, Gone, Sink};
use crate::http::{ClientGone, Exchange, SseReply};
use crate::idempotency::Outcome;
use crate::lifecycle::Shutdown;
use crate::responses::ResponseSink;
use crate::sse;
use crate::translate::chat::{ChatAggregate, ChatStreamEncoder};
use crate::translate::messages::{self, stream::MessagesStreamEncoder, MessageAggregate};
use crate::translate::responses::ResponseEncoder;
use bytes::BytesMut;
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

impl From<ClientGone> for Gone {
    fn from(_: ClientGone) -> Self {
        Gone
    }
}

/// Whether the replica's drain cut this reply: its grace period ran out
/// while the generation was still going.
pub struct Cut {
    shutdown: Arc<Shutdown>,
    happened: bool,
    /// The worker's last event is in the reply: nothing is left to cut.
    finished: bool,
}

impl Cut {
    pub fn new(shutdown: Arc<Shutdown>) -> Self {
        Self {
            shutdown,
            happened: false,
            finished: false,
        }
    }

    /// Notes the worker's `Finished` event: a batch that carries it is
    /// delivered whole, never cut after.
    pub(super) fn observe(&mut self, event: &pb::GenerateEvent) {
        use pb::generate_event::Event;
        self.finished |= matches!(event.event, Some(Event::Finished(_)));
    }

    /// True once the drain cut the reply; the route then ends it in band.
    pub fn happened(&self) -> bool {
        self.happened
    }

    /// Checked after each delivery: a worker that always has the next
    /// event ready would otherwise never let the relay wait on [`Self::wait`].
    pub(super) fn now(&mut self) -> bool {
        self.happened |= !self.finished && self.shutdown.is_cutting();
        self.happened
    }

    async fn wait(&mut self) {
        self.shutdown.cutting().await;
        self.happened = true;
    }
}

/// The generation stops when the client leaves or the drain cuts it.
pub(super) async fn gone_or_cut(client_gone: impl std::future::Future<Output = ()>, cut: &mut Cut) {
    tokio::select! {
        _ = client_gone => {}
        _ = cut.wait() => {}
    }
}

/// A wire format's stream: worker events as its SSE frames.
pub trait StreamEncoder: Send {
    /// The reply folded alongside, when an `Idempotency-Key`'s record
    /// keeps it.
    type Folded: Fold;
    /// The frames that open the stream (they go out with the first event).
    fn start(&self, out: &mut BytesMut);
    fn event(&mut self, event: &pb::GenerateEvent, out: &mut BytesMut);
    /// A failure after the stream started, in band.
    fn error(out: &mut BytesMut, e: &ApiError);
    /// The status a failure is recorded with in this wire format.
    fn status(e: &ApiError) -> u16 {
        e.status
    }
    /// The reply's own failure (its output check), ended in band already.
    fn failure(&self) -> Option<&ApiError> {
        None
    }
    /// How long the worker may be quiet before [`Self::keep_alive`] is
    /// sent; `None`: never.
    const KEEP_ALIVE: Option<Duration> = None;
    fn keep_alive(_out: &mut BytesMut) {}
}

/// `chat.completion.chunk` frames; no keep-alive (the OpenAI SDKs read on
/// without one).
impl StreamEncoder for ChatStreamEncoder {
    type Folded = ChatAggregate;
    fn start(&self, out: &mut BytesMut) {
        ChatStreamEncoder::start(self, out)
    }
    fn event(&mut self, event: &pb::GenerateEvent, out: &mut BytesMut) {
        ChatStreamEncoder::event(self, event, out)
    }
    fn error(out: &mut BytesMut, e: &ApiError) {
        sse::error(out, e)
    }
    fn failure(&self) -> Option<&ApiError> {
        ChatStreamEncoder::failure(self)
    }
}

/// Anthropic's Messages events, a `ping` in each silence of [`PING_EVERY`].
impl StreamEncoder for MessagesStreamEncoder {
    type Folded = MessageAggregate;
    fn start(&self, out: &mut BytesMut) {
        MessagesStreamEncoder::start(self, out)
    }
    fn event(&mut self, event: &pb::GenerateEvent, out: &mut BytesMut) {
        MessagesStreamEncoder::event(self, event, out)
    }
    fn error(out: &mut BytesMut, e: &ApiError) {
        messages::stream::error(out, e)
    }
    /// Anthropic's statuses (an overload is 529).
    fn status(e: &ApiError) -> u16 {
        e.anthropic().status
    }
    const KEEP_ALIVE: Option<Duration> = Some(PING_EVERY);
    fn keep_alive(out: &mut BytesMut) {
        messages::stream::ping(out)
    }
}

/// A quiet worker's Anthropic stream gets a `ping` this often (Anthropic's
/// keep-alive event; clients skip it).
pub const PING_EVERY: Duration = Duration::from_secs(5);

/// A stream of one wire format's frames over SSE.
pub struct EncodedStream<'a, E: StreamEncoder> {
    pub reply: SseReply<'a>,
    pub encoder: E,
    /// The reply folded as well, when it is kept (an `Idempotency-Key`'s
    /// record: a retry gets it again). Its last batch (the finish) is held
    /// for the caller ([`Sink::holds_end`]), who writes it once the record
    /// is written.
    pub aggregate: Option<E::Folded>,
    pub cut: Cut,
}

/// `chat.completion.chunk` frames over SSE.
pub type ChatStream<'a> = EncodedStream<'a, ChatStreamEncoder>;
/// Anthropic Messages events over SSE.
pub type MessagesStream<'a> = EncodedStream<'a, MessagesStreamEncoder>;

impl<'a, E: StreamEncoder> EncodedStream<'a, E> {
    pub fn new(ex: &'a mut Exchange, encoder: E, shutdown: Arc<Shutdown>) -> Self {
        Self {
            reply: SseReply::new(ex, 512),
            encoder,
            aggregate: None,
            cut: Cut::new(shutdown),
        }
    }
}

impl<E: StreamEncoder> EncodedStream<'_, E> {
    /// Ends the reply to a generation that ended `end`, whatever the wire
    /// format. A drain cut is an in-band error the client can act on
    /// (retry elsewhere) rather than a cut connection, or, before the head
    /// went out, the response itself. A finished reply kept for its key is
    /// recorded (`keep` folds it into the stream a retry gets) before its
    /// last batch, held by the sink, goes out.
    pub async fn end(
        self,
        end: End,
        claim: &mut Option<Claim>,
        keep: impl FnOnce(E::Folded) -> Result<String, ApiError>,
    ) -> Result<(), ApiError> {
        let Self {
            mut reply,
            encoder,
            aggregate,
            cut,
        } = self;
        match end {
            End::NotStarted(e) => return Err(e),
            End::Gone if cut.happened() => {
                let e = ApiError::replica_shutdown();
                if !reply.started() {
                    return Err(e);
                }
                E::error(reply.buf(), &e);
                end_stream(reply, Some(E::status(&e))).await;
            }
            End::Finished(_) => {
                // A reply that failed its output check ended with an error
                // frame: nothing to keep.
                let failed = encoder.failure().map(E::status);
                if let (None, Some(aggregate)) = (failed, aggregate) {
                    let body = keep(aggregate)?;
                    idempotent::complete(claim, Outcome::Chat { body, stream: true }).await;
                }
                end_stream(reply, failed).await;
            }
            End::Gone => reply.left(),
            End::Failed(e) => reply.end_failed(E::status(&e)).await,
        }
        Ok(())
    }
}

impl<E: StreamEncoder> Sink for EncodedStream<'_, E> {
    /// The head goes out now; the opening frames wait for the first event,
    /// to go out in one write with it.
    async fn started(&mut self) -> Result<(), Gone> {
        self.encoder.start(self.reply.buf());
        Ok(self.reply.start().await?)
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.cut.observe(&event);
        self.encoder.event(&event, self.reply.buf());
        if let Some(aggregate) = &mut self.aggregate {
            aggregate.push(event);
        }
    }

    /// The batch goes out first: its tokens are counted as delivered.
    async fn deliver(&mut self) -> Result<(), Gone> {
        self.reply.write().await?;
        if self.cut.now() {
            return Err(Gone);
        }
        Ok(())
    }

    fn holds_end(&self) -> bool {
        true
    }

    async fn gone(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    fn cut_by_replica(&self) -> bool {
        self.cut.happened()
    }

    fn keep_alive_period(&self) -> Option<Duration> {
        E::KEEP_ALIVE
    }

    async fn keep_alive(&mut self) -> Result<(), Gone> {
        E::keep_alive(self.reply.buf());
        Ok(self.reply.write().await?)
    }

    async fn gone_while_starting(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    async fn fail(&mut self, e: &ApiError) {
        // What this batch already encoded precedes the failure; the status
        // line is long gone, so the failure travels in-band.
        let _ = self.reply.write().await;
        E::error(self.reply.buf(), e);
        let _ = self.reply.write().await;
    }
}

/// A reply folded from worker events into one body.
pub trait Fold: Default + Send {
    fn push(&mut self, event: pb::GenerateEvent);
}

impl Fold for ChatAggregate {
    fn push(&mut self, event: pb::GenerateEvent) {
        ChatAggregate::push(self, event)
    }
}

impl Fold for MessageAggregate {
    fn push(&mut self, event: pb::GenerateEvent) {
        MessageAggregate::push(self, event)
    }
}

/// One `chat.completion` body, folded from the whole generation.
pub type ChatBody<'a> = FoldedBody<'a, ChatAggregate>;

/// One body folded from the whole generation (a `chat.completion`, an
/// Anthropic `message`).
pub struct FoldedBody<'a, A> {
    ex: &'a mut Exchange,
    pub aggregate: A,
    pub cut: Cut,
}

impl<'a, A: Fold> FoldedBody<'a, A> {
    pub fn new(ex: &'a mut Exchange, shutdown: Arc<Shutdown>) -> Self {
        Self {
            ex,
            aggregate: A::default(),
            cut: Cut::new(shutdown),
        }
    }
}

impl<A: Fold> FoldedBody<'_, A> {
    /// Answers a generation that ended `end` with the one body `encode`
    /// makes of the fold, recorded for its key first. Nothing was sent
    /// before: a drain cut is a plain error response.
    pub async fn end(
        self,
        end: End,
        claim: &mut Option<Claim>,
        encode: impl FnOnce(A) -> Result<String, ApiError>,
    ) -> Result<(), ApiError> {
        let Self { ex, aggregate, cut } = self;
        match end {
            End::NotStarted(e) | End::Failed(e) => return Err(e),
            End::Gone if cut.happened() => return Err(ApiError::replica_shutdown()),
            End::Finished(_) => {
                let body = encode(aggregate)?;
                if claim.is_some() {
                    let outcome = Outcome::Chat {
                        body: body.clone(),
                        stream: false,
                    };
                    idempotent::complete(claim, outcome).await;
                }
                ex.send(200, "application/json", &[], body.into()).await;
            }
            End::Gone => ex.client_left(),
        }
        Ok(())
    }
}

impl<A: Fold> Sink for FoldedBody<'_, A> {
    fn answers_at_end(&self) -> bool {
        true
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.cut.observe(&event);
        self.aggregate.push(event);
    }

    /// Nothing reaches the client before the end: a cut body delivered
    /// nothing (the route answers with an error).
    async fn deliver(&mut self) -> Result<(), Gone> {
        if self.cut.now() {
            return Err(Gone);
        }
        Ok(())
    }

    async fn gone(&mut self) {
        gone_or_cut(self.ex.client_gone(), &mut self.cut).await
    }

    fn cut_by_replica(&self) -> bool {
        self.cut.happened()
    }

    async fn gone_while_starting(&mut self) {
        gone_or_cut(self.ex.client_gone(), &mut self.cut).await
    }

    /// Nothing was sent yet: the caller answers with the error's status.
    async fn fail(&mut self, _e: &ApiError) {}
}

/// Responses events: streamed over SSE, or (`stream: false`) only folded
/// into the encoder's response object (the reply then never starts: it
/// only watches the client).
pub struct ResponseEvents<'a> {
    pub reply: SseReply<'a>,
    pub encoder: ResponseEncoder,
    pub cut: Cut,
    stream: bool,
    frames: Vec<EncodedEvent>,
}

impl<'a> ResponseEvents<'a> {
    pub fn new(
        ex: &'a mut Exchange,
        encoder: ResponseEncoder,
        stream: bool,
        shutdown: Arc<Shutdown>,
    ) -> Self {
        Self {
            reply: SseReply::new(ex, if stream { 1024 } else { 0 }),
            encoder,
            cut: Cut::new(shutdown),
            stream,
            frames: Vec::new(),
        }
    }
}

impl ResponseSink for ResponseEvents<'_> {
    fn frames(&mut self) -> (&mut ResponseEncoder, &mut Vec<EncodedEvent>) {
        (&mut self.encoder, &mut self.frames)
    }

    /// Into the reply's buffer (or dropped when not streaming: the object
    /// holds the reply).
    fn take_frames(&mut self) {
        if self.stream {
            for f in self.frames.drain(..) {
                sse::event(self.reply.buf(), &f.name, &f.data);
            }
        } else {
            self.frames.clear();
        }
    }

    async fn release(&mut self) -> Result<(), Gone> {
        Ok(self.reply.write().await?)
    }
}

impl Sink for ResponseEvents<'_> {
    async fn started(&mut self) -> Result<(), Gone> {
        self.encoder.start(&mut self.frames);
        self.take_frames();
        if self.stream {
            self.reply.start().await?;
        }
        Ok(())
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.cut.observe(&event);
        self.encoder.event(event, &mut self.frames);
        self.take_frames();
    }

    /// The batch goes out first: the output it carries is delivered, so
    /// the final `response.incomplete` holds it too.
    async fn deliver(&mut self) -> Result<(), Gone> {
        self.reply.write().await?;
        if self.cut.now() {
            return Err(Gone);
        }
        Ok(())
    }

    /// The terminal event goes out once the caller stored the response.
    fn holds_end(&self) -> bool {
        true
    }

    async fn gone(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    fn cut_by_replica(&self) -> bool {
        self.cut.happened()
    }

    async fn gone_while_starting(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    async fn fail(&mut self, e: &ApiError) {
        let _ = self.reply.write().await;
        self.encoder.fail(e, &mut self.frames);
        self.take_frames();
        let _ = self.reply.write().await;
    }
}
