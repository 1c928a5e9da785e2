//! The Anthropic Messages stream as a generation [`Sink`]: the events of
//! `translate::messages::stream` over SSE, a `ping` in every silence of
//! [`PING_EVERY`], the drain's [`Cut`] watched as every HTTP sink does.

use super::sinks::{gone_or_cut, Cut};
use crate::error::ApiError;
use crate::generation::{Gone, Sink};
use crate::http::{Exchange, SseReply};
use crate::lifecycle::Shutdown;
use crate::translate::messages::stream::{self, MessagesStreamEncoder};
use crate::translate::messages::MessageAggregate;
use inference_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

/// A silence of the worker this long after the stream started gets a
/// `ping` (Anthropic's keep-alive event; clients skip it).
pub const PING_EVERY: Duration = Duration::from_secs(5);

pub struct MessagesStream<'a> {
    pub reply: SseReply<'a>,
    pub encoder: MessagesStreamEncoder,
    /// The reply folded as well, when an `Idempotency-Key`'s record keeps
    /// it (the last batch waits for the caller: [`Sink::holds_end`]).
    pub aggregate: Option<MessageAggregate>,
    pub cut: Cut,
}

impl<'a> MessagesStream<'a> {
    pub fn new(
        ex: &'a mut Exchange,
        encoder: MessagesStreamEncoder,
        shutdown: Arc<Shutdown>,
    ) -> Self {
        Self {
            reply: SseReply::new(ex, 512),
            encoder,
            aggregate: None,
            cut: Cut::new(shutdown),
        }
    }
}

impl Sink for MessagesStream<'_> {
    /// The head goes out now; `message_start` and its ping wait for the
    /// first event, to go out in one write with it.
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

    /// While the worker is quiet: a ping each [`PING_EVERY`], until the
    /// client leaves or the drain cuts the reply. The relay drops this
    /// future when the worker's next event comes; a ping is one small
    /// chunk, written whole in the poll that starts it unless the client
    /// stopped reading for a whole period (whose stream the write timeout
    /// ends).
    async fn gone(&mut self) {
        loop {
            let ping = tokio::select! {
                _ = gone_or_cut(self.reply.client_gone(), &mut self.cut) => false,
                _ = tokio::time::sleep(PING_EVERY) => true,
            };
            if !ping {
                return;
            }
            stream::ping(self.reply.buf());
            if self.reply.write().await.is_err() {
                return;
            }
        }
    }

    async fn gone_while_starting(&mut self) {
        gone_or_cut(self.reply.client_gone(), &mut self.cut).await
    }

    /// What this batch encoded precedes the failure, an `error` event.
    async fn fail(&mut self, e: &ApiError) {
        let _ = self.reply.write().await;
        stream::error(self.reply.buf(), e);
        let _ = self.reply.write().await;
    }
}
