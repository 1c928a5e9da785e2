//! [`SseReply`]: the one writer of every streamed reply (chat chunks,
//! Responses events, a background run followed, a planner run).

use super::exchange::Exchange;
use crate::metrics::{GaugeGuard, METRICS};
use bytes::BytesMut;
use futures::{Stream, StreamExt};
use std::ops::ControlFlow;
use std::time::Duration;
use tokio::time::{Instant, Interval};

/// The client went away (a write failed, or it closed its connection).
#[derive(Debug)]
pub struct ClientGone;

/// What a pumped stream hands its encoder.
pub enum Pumped<T> {
    /// The next item.
    Item(T),
    /// The stream was silent for a keep-alive period: encode a keep-alive
    /// (after whatever must open the stream).
    KeepAlive,
}

/// What ended a wait on a quiet stream.
enum Quiet {
    /// The stream was silent for a keep-alive period.
    KeepAlive,
    /// The client went away.
    Gone,
}

/// A `text/event-stream` reply to a client: the response head, frames
/// buffered in [`Self::buf`] and sent one write per [`Self::write`],
/// keep-alive comments in silences, the client watched for a disconnect,
/// and the request's status however the stream ends (its in-band
/// failure's, or 499 for a client that left).
pub struct SseReply<'a> {
    ex: &'a mut Exchange,
    out: BytesMut,
    /// The `open_streams` gauge, counted while the stream is open.
    open: Option<GaugeGuard>,
    keepalive: Option<Interval>,
}

impl<'a> SseReply<'a> {
    /// A reply that sends nothing until it is started or written to.
    pub fn new(ex: &'a mut Exchange, capacity: usize) -> Self {
        Self {
            ex,
            out: BytesMut::with_capacity(capacity),
            open: None,
            keepalive: None,
        }
    }

    /// Sends a keep-alive comment after every `period` without a write
    /// (see [`Self::quiet`]).
    pub fn with_keepalive(mut self, period: Duration) -> Self {
        self.keepalive = Some(tokio::time::interval_at(Instant::now() + period, period));
        self
    }

    /// Frames to send with the next write.
    pub fn buf(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// Whether the response head was sent.
    pub fn started(&self) -> bool {
        self.open.is_some()
    }

    /// Sends the response head: 200, chunked `text/event-stream`. Frames
    /// already buffered go out with the next write, in one write with what
    /// follows them.
    pub async fn start(&mut self) -> Result<(), ClientGone> {
        if self.started() {
            return Ok(());
        }
        // Without an explicit chunked encoding Pingora would delimit the body
        // by closing the connection, losing keep-alive.
        let headers = [
            ("transfer-encoding", "chunked".to_owned()),
            ("cache-control", "no-cache".to_owned()),
        ];
        self.ex
            .write_head(200, "text/event-stream", &headers)
            .await
            .map_err(|_| ClientGone)?;
        self.open = Some(GaugeGuard::new(&METRICS.open_streams));
        Ok(())
    }

    /// Writes (and flushes) what is buffered, starting the stream first if
    /// needed; nothing buffered, nothing sent. A failed write means the
    /// client is gone.
    pub async fn write(&mut self) -> Result<(), ClientGone> {
        if self.out.is_empty() {
            return Ok(());
        }
        if !self.started() {
            // Boxed: the head's write is once per stream, this write once
            // per batch, and an open stream's state keeps room for both.
            let head = Box::pin(self.start());
            head.await?;
        }
        // Keep-alives only fill silences.
        if let Some(ticker) = &mut self.keepalive {
            ticker.reset();
        }
        let chunk = self.out.split().freeze();
        self.ex.write_chunk(chunk).await.map_err(|_| ClientGone)
    }

    /// Resolves when the client closes its connection. Only call once the
    /// request body has been read.
    pub async fn client_gone(&mut self) {
        self.ex.client_gone().await
    }

    /// Relays `items` until they end: `frame` encodes each one (and each
    /// silence of a keep-alive period, [`Pumped::KeepAlive`]) into the
    /// buffer, which is then written. `frame` may stop the pump with a
    /// value instead (nothing of that item is written). Fails when the
    /// client goes away; the caller then calls [`Self::left`].
    pub async fn pump<T, B>(
        &mut self,
        items: impl Stream<Item = T>,
        mut frame: impl FnMut(Pumped<T>, &mut BytesMut) -> ControlFlow<B>,
    ) -> Result<Option<B>, ClientGone> {
        let mut items = std::pin::pin!(items);
        loop {
            let next = tokio::select! {
                biased;
                item = items.next() => match item {
                    Some(item) => Pumped::Item(item),
                    None => return Ok(None),
                },
                quiet = self.quiet() => match quiet {
                    Quiet::KeepAlive => Pumped::KeepAlive,
                    Quiet::Gone => return Err(ClientGone),
                },
            };
            if let ControlFlow::Break(stop) = frame(next, &mut self.out) {
                return Ok(Some(stop));
            }
            self.write().await?;
        }
    }

    /// Resolves when the stream has been silent for a keep-alive period
    /// (never without [`Self::with_keepalive`]) or the client goes away.
    async fn quiet(&mut self) -> Quiet {
        let Self { ex, keepalive, .. } = self;
        let tick = async {
            match keepalive {
                Some(ticker) => {
                    ticker.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = tick => Quiet::KeepAlive,
            _ = ex.client_gone() => Quiet::Gone,
        }
    }

    /// Ends a stream that went as sent (the terminating chunk).
    pub async fn end(self) {
        self.ex.end_stream().await;
    }

    /// Ends a stream that carried an in-band failure: the request is
    /// recorded with the failure's status (the response's was 200).
    pub async fn end_failed(self, status: u16) {
        self.ex.status = status;
        self.ex.end_stream().await;
    }

    /// The client went away: nothing more is written, and the request is
    /// recorded as 499.
    pub fn left(self) {
        self.ex.client_left();
    }
}
