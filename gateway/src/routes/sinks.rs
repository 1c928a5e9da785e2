//! The generation sinks of replies to an HTTP client: a chat stream, a
//! folded body (chat, Anthropic Messages), and Responses events (streamed,
//! or folded into the response object); the Anthropic Messages stream is
//! `sinks_messages.rs`. Streams write through [`SseReply`].
//!
//! Every sink also watches the replica's drain ([`Cut`]): when the grace
//! period runs out it ends the generation like a client that left (the
//! worker call is dropped, the reservation billed for what was delivered),
//! and the route then ends the reply in band rather than at the socket.

use crate::api::responses::EncodedEvent;
use crate::error::ApiError;
use crate::generation::{Gone, Sink};
use crate::http::{ClientGone, Exchange, SseReply};
use crate::lifecycle::Shutdown;
use crate::responses::ResponseSink;
use crate::sse;
use crate::translate::chat::{ChatAggregate, ChatStreamEncoder};
use crate::translate::messages::MessageAggregate;
use crate::translate::responses::ResponseEncoder;
use inference_proto::v1 as pb;
use std::sync::Arc;

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

/// `chat.completion.chunk` frames over SSE.
pub struct ChatStream<'a> {
    pub reply: SseReply<'a>,
    pub encoder: ChatStreamEncoder,
    /// The reply folded as well, when it is kept (an `Idempotency-Key`'s
    /// record: a retry gets it again). Its last batch (the finish and
    /// `[DONE]`) is held for the caller ([`Sink::holds_end`]), who writes it
    /// once the record is written.
    pub aggregate: Option<ChatAggregate>,
    pub cut: Cut,
}

impl<'a> ChatStream<'a> {
    pub fn new(ex: &'a mut Exchange, encoder: ChatStreamEncoder, shutdown: Arc<Shutdown>) -> Self {
        Self {
            reply: SseReply::new(ex, 256),
            encoder,
            aggregate: None,
            cut: Cut::new(shutdown),
        }
    }
}

impl Sink for ChatStream<'_> {
    /// The head goes out now; the opening frame waits for the first event,
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

    async fn gone_while_starting(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    async fn fail(&mut self, e: &ApiError) {
        // What this batch already encoded precedes the failure; the status
        // line is long gone, so the failure travels in-band.
        let _ = self.reply.write().await;
        sse::error(self.reply.buf(), e);
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

impl<A: Fold> Sink for FoldedBody<'_, A> {
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

    fn cut(&self) -> bool {
        self.cut.happened()
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
