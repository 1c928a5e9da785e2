//! Responses over WebSocket: `GET /v1/responses` upgraded (Open Responses'
//! WebSocket transport, what the Codex CLI speaks with
//! `supports_websockets = true`).
//!
//! The connection, in order:
//! 1. Before the upgrade, as for any request: the key (401 in the JSON
//!    envelope), the opening handshake (400, or 426 for another WebSocket
//!    version), and a draining replica refuses (503).
//! 2. `101`, then messages. Each text message is a client event:
//!    `{"type": "response.create", ...the create body...}` starts a
//!    response (`generate: false` only prepares one: created and completed
//!    with no output, a warm-up to chain from); `response.processed` (a
//!    Codex acknowledgement) is taken and ignored. Anything else (bad JSON,
//!    another `type`, an invalid body, a binary message) gets the error
//!    event and the connection stays open.
//! 3. A response runs the Responses path of `POST /v1/responses`
//!    (`crate::responses`: check, conversation, admission, translation,
//!    store, the one generation driver and its one ending), and its events
//!    go out as the event stream's, one JSON text message each
//!    ([`WsEvents`]). Responses run
//!    one after another: a `response.create` while one runs gets a 409
//!    error event. A request refused before its response started gets the
//!    error event with the status and code `POST` would answer.
//! 4. The connection is the conversation's home: every response on it has
//!    one prefix-affinity key (`x-session-id`, else the connection's own),
//!    so its turns meet the engine holding their prefix; the latest
//!    response's conversation is kept here, so `previous_response_id`
//!    naming it works with `store: false` (never written to the store);
//!    any other id is looked up in the store (`previous_response_not_found`
//!    when it has none).
//! 5. It ends when the client closes (a response running is cancelled on
//!    its worker), on a protocol breach (1002/1007, or 1009 for a message
//!    over `max_body_bytes`), after `[websocket] idle_timeout_seconds`
//!    without a request (1000), when a ping goes unanswered, at
//!    `max_connection_seconds` (1001, "connection lifetime reached", never
//!    during a response), or when the replica drains (1001, after the
//!    response running ends; one still running when the grace period runs
//!    out ends `incomplete` in band first, as an HTTP stream does).

mod event;
mod rights;

use super::ending::error_event;
use super::sinks::{gone_or_cut, Cut};
use crate::accounts::Account;
use crate::api::responses::{EncodedEvent, InputItem, ResponseObject, ResponseStatus, StreamEvent};
use crate::app::App;
use crate::error::ApiError;
use crate::generation::{Gone, Sink};
use crate::http::websocket::{Close, Handshake, Incoming};
use crate::http::{Exchange, WebSocket};
use crate::ids::new_id;
use crate::responses::{self, Ended, NoKey, Request, ResponseSink, Started};
use crate::translate::responses::{frame, output_as_input, ResponseEncoder};
use event::{binary_refused, ClientEvent};
use inference_proto::v1 as pb;
use rights::{ends_connection, HeldConversation, Rights};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The metrics route of each response on a connection: the same as
/// `POST /v1/responses`' (the connection itself is `responses.websocket`).
const ROUTE: &str = "responses.create";

/// `GET /v1/responses` with `Upgrade: websocket`, the key already checked.
pub async fn serve(app: &App, ex: &mut Exchange, account: Arc<Account>) -> Result<(), ApiError> {
    let handshake = Handshake::check(ex)?;
    if app.shutdown.is_draining() {
        return Err(ApiError::overloaded(
            "This gateway replica is shutting down; open the connection again.",
        ));
    }
    // The key's place under its connection cap (429), before the upgrade.
    let rights = Rights::open(app, ex, account)?;
    let affinity = match ex.session_id() {
        Some(session) => session.to_owned(),
        None => new_id("ws_"),
    };
    let held = HeldConversation::new(&rights.account().principal.org);
    let Ok(ws) = WebSocket::accept(ex, handshake, app.config.max_body_bytes).await else {
        return Ok(());
    };
    let mut conn = Connection {
        app,
        rights,
        ws,
        affinity,
        last: None,
        held,
        ending: None,
    };
    conn.run().await;
    Ok(())
}

/// The conversation of the latest response on the connection: what a
/// `previous_response_id` naming it continues (its context, input and
/// output as input items). Connection-local; never stored.
struct Chain {
    id: String,
    items: Vec<InputItem>,
}

/// How a response's request ended, when it did not run to its end.
enum Refused {
    /// Before its response started: the error event, as `POST` would answer.
    Error(ApiError),
    /// The client went away (the generation, if any, was cancelled).
    Gone,
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Error(e)
    }
}

/// One upgraded connection.
struct Connection<'c, 'x> {
    app: &'c App,
    /// The key, authorized again for each response.
    rights: Rights,
    ws: WebSocket<'x>,
    /// The prefix-affinity key of every response on the connection.
    affinity: String,
    /// The latest response's conversation.
    last: Option<Chain>,
    /// `last` on the operator's gauges.
    held: HeldConversation,
    /// Set when a turn found the key's rights gone: the close reason of
    /// the 1008 that follows its error event.
    ending: Option<&'static str>,
}

impl Connection<'_, '_> {
    /// Serves messages until the connection ends.
    async fn run(&mut self) {
        let app = self.app;
        let ping_every = Duration::from_secs(app.config.websocket.ping_interval_seconds);
        let idle_timeout = Duration::from_secs(app.config.websocket.idle_timeout_seconds);
        let closes_at = tokio::time::Instant::now()
            + Duration::from_secs(app.config.websocket.max_connection_seconds);
        // The last request (or the end of the last response), for the idle
        // timeout; the last sign of the peer, for pings.
        let mut last_request = tokio::time::Instant::now();
        let mut last_heard = tokio::time::Instant::now();
        let mut ping_sent: Option<tokio::time::Instant> = None;
        // When to check the key again after a change to the accounts.
        let mut recheck_at: Option<tokio::time::Instant> = None;
        loop {
            let ping_at = ping_sent.unwrap_or(last_heard) + ping_every;
            let incoming = tokio::select! {
                biased;
                _ = app.shutdown.draining() => {
                    self.ws.close(Close::GoingAway, "server shutting down").await;
                    return;
                }
                _ = tokio::time::sleep_until(last_request + idle_timeout) => {
                    self.ws.close(Close::Normal, "idle timeout").await;
                    return;
                }
                // Responses run inside `message`, so this never cuts one.
                _ = tokio::time::sleep_until(closes_at) => {
                    self.ws.close(Close::GoingAway, "connection lifetime reached").await;
                    return;
                }
                _ = tokio::time::sleep_until(ping_at) => {
                    if ping_sent.is_some() {
                        // A peer that answers no ping is gone (no close
                        // handshake with it).
                        return;
                    }
                    ping_sent = Some(tokio::time::Instant::now());
                    self.ws.queue_ping();
                    if self.ws.flush().await.is_err() {
                        return;
                    }
                    continue;
                }
                delay = self.rights.changed() => {
                    let at = tokio::time::Instant::now() + delay;
                    recheck_at = Some(recheck_at.map_or(at, |r| r.min(at)));
                    continue;
                }
                _ = tokio::time::sleep_until(recheck_at.unwrap_or(closes_at)), if recheck_at.is_some() => {
                    recheck_at = None;
                    if let Err(e) = self.rights.current(&app.accounts).await {
                        if let Some(reason) = ends_connection(&e) {
                            self.ws.close(Close::Policy, reason).await;
                            return;
                        }
                    }
                    continue;
                }
                incoming = self.ws.recv() => incoming,
            };
            last_heard = tokio::time::Instant::now();
            ping_sent = None;
            match incoming {
                Incoming::Control => {}
                Incoming::Text(text) => {
                    // A turn's state (the request path, the generation,
                    // about 14 KiB) is boxed for the turn alone: an idle
                    // connection holds only this loop's.
                    let turn = Box::pin(self.message(&text));
                    if turn.await.is_err() {
                        // The client left mid-response: its close frame
                        // gets its reply; a breach, its close code.
                        match self.ws.broken() {
                            Some(code) => self.ws.close(code, close_reason(code)).await,
                            None => self.ws.finish().await,
                        }
                        return;
                    }
                    if let Some(reason) = self.ending {
                        // The turn's error event goes out first.
                        self.ws.close(Close::Policy, reason).await;
                        return;
                    }
                    last_request = tokio::time::Instant::now();
                    last_heard = last_request;
                }
                Incoming::Binary => self.ws.queue_text(error_event(&binary_refused(), None)),
                Incoming::Gone => {
                    // Sends the reply to the client's close frame.
                    self.ws.finish().await;
                    return;
                }
                Incoming::Broken(code) => {
                    if code == Close::TooBig {
                        let limit = ApiError::payload_too_large(app.config.max_body_bytes);
                        self.ws.queue_text(error_event(&limit, None));
                    }
                    self.ws.close(code, close_reason(code)).await;
                    return;
                }
            }
            if self.ws.flush().await.is_err() {
                return;
            }
        }
    }

    /// One client message; `Err` when the client went away meanwhile.
    async fn message(&mut self, text: &str) -> Result<(), Gone> {
        match ClientEvent::parse(text) {
            Err(e) => {
                self.ws.queue_text(error_event(&e, None));
                Ok(())
            }
            Ok(ClientEvent::Processed) => Ok(()),
            Ok(ClientEvent::Create { body, generate }) => self.respond(&body, generate).await,
        }
    }

    /// One `response.create`: a request of its own for limits, metrics and
    /// the request span.
    async fn respond(&mut self, body: &str, generate: bool) -> Result<(), Gone> {
        let started = Instant::now();
        let request_id = new_id("req_");
        let span = tracing::info_span!(
            target: "gateway::request",
            "request",
            otel.kind = "server",
            http.route = ROUTE,
            network.protocol.name = "websocket",
            http.response.status_code = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            request_id = %request_id,
        );
        let mut model: &'static str = "-";
        let outcome = self
            .response(body, generate, &request_id, started, &mut model)
            .instrument(span.clone())
            .await;
        let (status, result) = match outcome {
            Ok(status) => (status, Ok(())),
            Err(Refused::Error(e)) => {
                if e.status >= 500 {
                    tracing::warn!(%request_id, status = e.status, code = %e.code, "request failed: {}", e.message);
                }
                self.ws.queue_text(error_event(&e, None));
                (e.status, Ok(()))
            }
            Err(Refused::Gone) => (crate::http::exchange::CLIENT_CLOSED_REQUEST, Err(Gone)),
        };
        if !span.is_disabled() {
            span.record("gen_ai.request.model", model);
            span.record("http.response.status_code", status);
        }
        crate::metrics::record_request(ROUTE, model, status, started);
        result
    }

    /// Runs one response to its end; its status as recorded (200, or the
    /// status of the failure it ended with in band).
    async fn response(
        &mut self,
        body: &str,
        generate: bool,
        request_id: &str,
        started: Instant,
        model: &mut &'static str,
    ) -> Result<u16, Refused> {
        let app = self.app;
        let svc = app.responses();
        // 0. The key and its organisation as they are now (401, 402, 403,
        // as the route's check answers); a key no longer valid or an
        // organisation blocked also ends the connection.
        let account = match self.rights.current(&app.accounts).await {
            Ok(account) => account,
            Err(e) => {
                self.ending = ends_connection(&e);
                return Err(ApiError::from(e).into());
            }
        };
        // 1. Parse and validate as `POST` does; `background` has no meaning
        // here (every response streams on the connection).
        let checked = responses::check(&svc, &account, body.as_bytes(), model)?;
        if checked.valid.background {
            return Err(ApiError::unsupported_value(
                "background",
                "'background' is not used over WebSocket: each response streams on the connection.",
            )
            .into());
        }
        // 2. The conversation: the connection's latest response, else the store.
        let known = checked.req.previous_response_id.as_ref().and_then(|prev| {
            self.last
                .as_ref()
                .filter(|c| &c.id == prev)
                .map(|c| c.items.clone())
        });
        let prepared = responses::prepare(&svc, &account.principal, checked, known).await?;
        // 3. Admit under the plan's limits, per response: a warm-up too
        // (it is a request, and it stores its input), with an output
        // allowance of one token since it generates none.
        let max_output = if generate {
            prepared.valid.max_output_tokens
        } else {
            1
        };
        let reservation = responses::admit(&svc, &account, &prepared, request_id, max_output)
            .await
            .map_err(ApiError::from)?;
        if !generate {
            let (created, completed, context) =
                responses::warm_up(&svc, &account, prepared, reservation).await?;
            self.warmed_up(created, completed, context);
            return Ok(200);
        }
        // 4. Translate (the connection's affinity key); store when asked.
        let request = Request {
            request_id,
            session: Some(self.affinity.as_str()),
            trace: self.ws.exchange().trace,
            timed_from: Some(started),
        };
        let Started {
            encoder,
            context,
            run,
        } = responses::start(&svc, &account, prepared, reservation, request).await?;
        // 5. Generate through the one driver, events to the connection; a
        // stored response's terminal event goes out once the store holds
        // its end (the connection's loop flushes it).
        let mut events = WsEvents {
            ws: &mut self.ws,
            encoder,
            frames: Vec::new(),
            cut: Cut::new(app.shutdown.clone()),
        };
        let ended = run.drive(&svc, &mut events, &mut NoKey).await;
        let encoder = events.encoder;
        let status = match ended {
            Ended::NotStarted(e) => return Err(e.into()),
            Ended::Gone => return Err(Refused::Gone),
            Ended::Finished => encoder.failure().map_or(200, |e| e.status),
            Ended::Failed(e) => e.status,
            // `response.incomplete` went out last; the drain closes the
            // connection next.
            Ended::Cut => 200,
        };
        let mut items = context;
        items.extend(encoder.object.output.iter().map(output_as_input));
        self.keep(encoder.object.id.clone(), items);
        Ok(status)
    }

    /// `generate: false` answered: the response created and completed with
    /// no output and no worker call ([`responses::warm_up`]), so a later
    /// request can chain from its id (Codex warms a connection up with one).
    fn warmed_up(
        &mut self,
        created: ResponseObject,
        completed: ResponseObject,
        context: Vec<InputItem>,
    ) {
        let mut in_progress = created.clone();
        in_progress.status = ResponseStatus::InProgress;
        for (seq, event) in [
            StreamEvent::Created { response: &created },
            StreamEvent::InProgress {
                response: &in_progress,
            },
            StreamEvent::Completed {
                response: &completed,
            },
        ]
        .into_iter()
        .enumerate()
        {
            self.ws.queue_text(frame(event, seq as u64).data);
        }
        self.keep(completed.id, context);
    }

    /// Keeps `id`'s conversation as the connection's latest.
    fn keep(&mut self, id: String, items: Vec<InputItem>) {
        self.held.hold(items.len());
        self.last = Some(Chain { id, items });
    }
}

fn close_reason(code: Close) -> &'static str {
    match code {
        Close::Normal => "",
        Close::GoingAway => "server shutting down",
        Close::Protocol => "protocol error",
        Close::InvalidData => "a text message that is not UTF-8",
        Close::TooBig => "message too big",
        Close::Policy => "policy violation",
    }
}

/// Responses events as WebSocket text messages: the event stream's events,
/// one message each, delivered one write per batch. The drain's [`Cut`] is
/// watched as every HTTP sink does: when the grace period runs out the
/// response ends `incomplete` in band, stored as its client saw it.
struct WsEvents<'w, 'x> {
    ws: &'w mut WebSocket<'x>,
    encoder: ResponseEncoder,
    frames: Vec<EncodedEvent>,
    cut: Cut,
}

impl ResponseSink for WsEvents<'_, '_> {
    fn frames(&mut self) -> (&mut ResponseEncoder, &mut Vec<EncodedEvent>) {
        (&mut self.encoder, &mut self.frames)
    }

    /// Queued on the socket, one text message each.
    fn take_frames(&mut self) {
        for f in self.frames.drain(..) {
            self.ws.queue_text(f.data);
        }
    }

    /// The held end stays queued: the connection's loop flushes it after
    /// the response (and notices a client gone meanwhile).
    async fn release(&mut self) -> Result<(), Gone> {
        Ok(())
    }
}

impl Sink for WsEvents<'_, '_> {
    /// `response.created` and `response.in_progress` go out with the
    /// first delivery.
    async fn started(&mut self) -> Result<(), Gone> {
        self.encoder.start(&mut self.frames);
        self.take_frames();
        Ok(())
    }

    fn event(&mut self, event: pb::GenerateEvent) {
        self.cut.observe(&event);
        self.encoder.event(event, &mut self.frames);
        self.take_frames();
    }

    async fn deliver(&mut self) -> Result<(), Gone> {
        self.ws.flush().await?;
        if self.cut.now() {
            return Err(Gone);
        }
        Ok(())
    }

    /// The terminal event stays queued until the caller stored the response.
    fn holds_end(&self) -> bool {
        true
    }

    async fn gone(&mut self) {
        gone_or_cut(busy(self.ws), &mut self.cut).await
    }

    fn cut_by_replica(&self) -> bool {
        self.cut.happened()
    }

    async fn gone_while_starting(&mut self) {
        gone_or_cut(busy(self.ws), &mut self.cut).await
    }

    async fn fail(&mut self, e: &ApiError) {
        self.encoder.fail(e, &mut self.frames);
        self.take_frames();
        let _ = self.ws.flush().await;
    }
}

/// The most bytes of replies (pongs, error events) that wait for a
/// running response's next delivery: a few hundred error events, far
/// more than a client that reads its replies needs.
const MAX_PENDING_REPLIES: usize = 16 * 1024;

/// Reads the client while a response runs, until it goes away: pings are
/// answered (with the next delivery), and a message gets its error event
/// (a `response.create` a 409: one response at a time).
///
/// Replies can only go out with the response's next delivery (nothing
/// writes while this races the worker), so a response queued or quiet
/// would let them pile up. Past [`MAX_PENDING_REPLIES`] reading stops
/// until that delivery: the client's further messages wait in its socket
/// (TCP backpressure) rather than in this process, and none is dropped or
/// the connection closed. A client gone meanwhile is noticed at that
/// delivery, or at the response's deadline.
async fn busy(ws: &mut WebSocket<'_>) {
    loop {
        if ws.pending_bytes() >= MAX_PENDING_REPLIES {
            return std::future::pending().await;
        }
        let refused = match ws.recv().await {
            Incoming::Control => continue,
            Incoming::Gone | Incoming::Broken(_) => return,
            Incoming::Binary => binary_refused(),
            Incoming::Text(text) => match ClientEvent::parse(&text) {
                Ok(ClientEvent::Processed) => continue,
                Ok(ClientEvent::Create { .. }) => ApiError::conflict(
                    "response_already_in_flight",
                    "A response is already running on this connection; send the next \
                     'response.create' after its terminal event.",
                ),
                Err(e) => e,
            },
        };
        ws.queue_text(error_event(&refused, None));
    }
}
