//! The generation sinks of replies to an HTTP client: a chat stream, a chat
//! body, and Responses events (streamed, or folded into the response
//! object). Streams write through [`SseReply`].

use crate::api::responses::EncodedEvent;
use crate::error::ApiError;
use crate::generation::{Gone, Sink};
use crate::http::{ClientGone, Exchange, SseReply};
use crate::sse;
use crate::translate::chat::{ChatAggregate, ChatStreamEncoder};
use crate::translate::responses::ResponseEncoder;
use inference_proto::v1 as pb;

impl From<ClientGone> for Gone {
    fn from(_: ClientGone) -> Self {
        Gone
    }
}

/// `chat.completion.chunk` frames over SSE.
pub struct ChatStream<'a> {
    pub reply: SseReply<'a>,
    pub encoder: ChatStreamEncoder,
    /// The reply folded as well, when it is kept (an `Idempotency-Key`'s
    /// record: a retry gets it again). Its last batch (the finish and
    /// `[DONE]`) then stays buffered for the caller to write once the
    /// record is written, so a client that retries as soon as it has read
    /// `[DONE]` finds the outcome.
    pub aggregate: Option<ChatAggregate>,
}

impl<'a> ChatStream<'a> {
    pub fn new(ex: &'a mut Exchange, encoder: ChatStreamEncoder) -> Self {
        Self {
            reply: SseReply::new(ex, 256),
            encoder,
            aggregate: None,
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
        self.encoder.event(&event, self.reply.buf());
        if let Some(aggregate) = &mut self.aggregate {
            aggregate.push(event);
        }
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        if self
            .aggregate
            .as_ref()
            .is_some_and(ChatAggregate::is_finished)
        {
            return Ok(());
        }
        Ok(self.reply.write().await?)
    }

    async fn gone(&mut self) {
        self.reply.client_gone().await
    }

    async fn gone_while_starting(&mut self) {
        self.reply.client_gone().await
    }

    async fn fail(&mut self, e: &ApiError) {
        // What this batch already encoded precedes the failure; the status
        // line is long gone, so the failure travels in-band.
        let _ = self.reply.write().await;
        sse::error(self.reply.buf(), e);
        let _ = self.reply.write().await;
    }
}

/// One `chat.completion` body, folded from the whole generation.
pub struct ChatBody<'a> {
    ex: &'a mut Exchange,
    pub aggregate: ChatAggregate,
}

impl<'a> ChatBody<'a> {
    pub fn new(ex: &'a mut Exchange) -> Self {
        Self {
            ex,
            aggregate: ChatAggregate::default(),
        }
    }
}

impl Sink for ChatBody<'_> {
    fn event(&mut self, event: pb::GenerateEvent) {
        self.aggregate.push(event);
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        Ok(())
    }

    async fn gone(&mut self) {
        self.ex.client_gone().await
    }

    async fn gone_while_starting(&mut self) {
        self.ex.client_gone().await
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
    stream: bool,
    frames: Vec<EncodedEvent>,
    /// The last batch (the terminal event) stays buffered for the caller
    /// to write: set when an `Idempotency-Key`'s record is written first.
    pub hold_final: bool,
}

impl<'a> ResponseEvents<'a> {
    pub fn new(ex: &'a mut Exchange, encoder: ResponseEncoder, stream: bool) -> Self {
        Self {
            reply: SseReply::new(ex, if stream { 1024 } else { 0 }),
            encoder,
            stream,
            frames: Vec::new(),
            hold_final: false,
        }
    }

    /// Moves encoded frames to the output (or drops them when not
    /// streaming: the object holds the reply).
    fn take_frames(&mut self) {
        if self.stream {
            for f in self.frames.drain(..) {
                sse::event(self.reply.buf(), &f.name, &f.data);
            }
        } else {
            self.frames.clear();
        }
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
        self.encoder.event(event, &mut self.frames);
        self.take_frames();
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        if self.hold_final && self.encoder.is_done() {
            return Ok(());
        }
        Ok(self.reply.write().await?)
    }

    async fn gone(&mut self) {
        self.reply.client_gone().await
    }

    async fn gone_while_starting(&mut self) {
        self.reply.client_gone().await
    }

    async fn fail(&mut self, e: &ApiError) {
        let _ = self.reply.write().await;
        self.encoder.fail(e, &mut self.frames);
        self.take_frames();
        let _ = self.reply.write().await;
    }
}
