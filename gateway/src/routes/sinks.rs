//! Encoders of replies to an HTTP client: a chat stream, a chat body, and
//! Responses events (streamed, or folded into the response object).

use super::{Encoder, Gone};
use crate::api::responses::EncodedEvent;
use crate::error::ApiError;
use crate::http::exchange::Exchange;
use crate::metrics::METRICS;
use crate::translate::chat::{ChatAggregate, ChatStreamEncoder};
use crate::translate::responses::ResponseEncoder;
use crate::translate::sse_error;
use bytes::BytesMut;
use inference_proto::v1 as pb;

/// Counts an open stream (the `open_streams` gauge) while it lives.
struct OpenStream;

impl OpenStream {
    fn new() -> Self {
        METRICS.open_streams.inc();
        OpenStream
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        METRICS.open_streams.dec();
    }
}

/// A reply to a client: its exchange and the bytes encoded since the last
/// write (nothing is written before `start`: a body reply only watches
/// the client).
struct Reply<'a> {
    ex: &'a mut Exchange,
    out: BytesMut,
    open: Option<OpenStream>,
}

impl<'a> Reply<'a> {
    fn new(ex: &'a mut Exchange, capacity: usize) -> Self {
        Self {
            ex,
            out: BytesMut::with_capacity(capacity),
            open: None,
        }
    }

    /// Sends an SSE response head. The opening frames already in `out` go
    /// out in the same write as the first event: one write fewer per
    /// stream than sending them on their own.
    async fn start_sse(&mut self) -> Result<(), Gone> {
        self.ex.start_sse().await.map_err(|_| Gone)?;
        self.open = Some(OpenStream::new());
        Ok(())
    }

    /// Writes what is buffered. A failed write means the client is gone.
    async fn write(&mut self) -> Result<(), Gone> {
        if self.out.is_empty() {
            return Ok(());
        }
        let chunk = self.out.split().freeze();
        self.ex.write_chunk(chunk).await.map_err(|_| Gone)
    }

    async fn gone(&mut self) {
        self.ex.client_gone().await
    }
}

/// `chat.completion.chunk` frames over SSE.
pub struct ChatStream<'a> {
    reply: Reply<'a>,
    pub encoder: ChatStreamEncoder,
}

impl<'a> ChatStream<'a> {
    pub fn new(ex: &'a mut Exchange, encoder: ChatStreamEncoder) -> Self {
        Self {
            reply: Reply::new(ex, 256),
            encoder,
        }
    }
}

impl Encoder for ChatStream<'_> {
    async fn started(&mut self) -> Result<(), Gone> {
        self.encoder.start(&mut self.reply.out);
        self.reply.start_sse().await
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.encoder.event(&event, &mut self.reply.out);
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        self.reply.write().await
    }

    async fn gone(&mut self) {
        self.reply.gone().await
    }

    async fn fail(&mut self, e: &ApiError) {
        // What this batch already encoded precedes the failure; the status
        // line is long gone, so the failure travels in-band.
        let _ = self.reply.write().await;
        sse_error(&mut self.reply.out, e);
        let _ = self.reply.write().await;
    }
}

/// One `chat.completion` body, folded from the whole generation.
pub struct ChatBody<'a> {
    reply: Reply<'a>,
    pub aggregate: ChatAggregate,
}

impl<'a> ChatBody<'a> {
    pub fn new(ex: &'a mut Exchange) -> Self {
        Self {
            reply: Reply::new(ex, 0),
            aggregate: ChatAggregate::default(),
        }
    }
}

impl Encoder for ChatBody<'_> {
    fn event(&mut self, event: pb::GenerateEvent) {
        self.aggregate.push(event);
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        Ok(())
    }

    async fn gone(&mut self) {
        self.reply.gone().await
    }

    /// Nothing was sent yet: the caller answers with the error's status.
    async fn fail(&mut self, _e: &ApiError) {}
}

/// Responses events: streamed over SSE, or (`stream: false`) only folded
/// into the encoder's response object.
pub struct ResponseEvents<'a> {
    reply: Reply<'a>,
    pub encoder: ResponseEncoder,
    stream: bool,
    frames: Vec<EncodedEvent>,
}

impl<'a> ResponseEvents<'a> {
    pub fn new(ex: &'a mut Exchange, encoder: ResponseEncoder, stream: bool) -> Self {
        Self {
            reply: Reply::new(ex, if stream { 1024 } else { 0 }),
            encoder,
            stream,
            frames: Vec::new(),
        }
    }

    /// Moves encoded frames to the output (or drops them when not
    /// streaming: the object holds the reply).
    fn take_frames(&mut self) {
        if self.stream {
            for f in self.frames.drain(..) {
                f.write_sse(&mut self.reply.out);
            }
        } else {
            self.frames.clear();
        }
    }
}

impl Encoder for ResponseEvents<'_> {
    async fn started(&mut self) -> Result<(), Gone> {
        self.encoder.start(&mut self.frames);
        self.take_frames();
        if self.stream {
            self.reply.start_sse().await?;
        }
        Ok(())
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.encoder.event(event, &mut self.frames);
        self.take_frames();
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        self.reply.write().await
    }

    async fn gone(&mut self) {
        self.reply.gone().await
    }

    async fn fail(&mut self, e: &ApiError) {
        let _ = self.reply.write().await;
        self.encoder.fail(e, &mut self.frames);
        self.take_frames();
        let _ = self.reply.write().await;
    }
}
