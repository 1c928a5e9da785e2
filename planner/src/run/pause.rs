//! Pausing for the caller's tools and resuming by session: a request
//! takes its session's lock ([`Planner::begin`]: 409 when another request
//! holds it); trailing `tool` messages resume the session's paused plan,
//! each answering one of its pending calls (400 otherwise); a run that
//! waits for the caller's function tools stores its state
//! ([`Planner::pause`]) and the next request resumes it
//! ([`Planner::resume`]).

use super::input::{RunInput, ToolResult};
use super::state::{Gathered, Record, RunState};
use super::{Event, PendingCall, Planner, ToolThought};
use crate::metrics::METRICS;
use crate::ports::{SessionStore, StoreUnavailable};
use crate::text::clip;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Why a request could not take or use its session.
#[derive(Debug)]
pub enum SessionError {
    /// The session store failed or could not be reached.
    Store(StoreUnavailable),
    /// Another request holds the session's lock, for at most this long
    /// unless its holder renews it.
    Busy { retry_after: Duration },
    /// The trailing `tool` message at `index` answers no pending call of
    /// the session's paused plan.
    NotPending { index: usize, call_id: String },
    /// The paused plan went away while its results were being checked
    /// (not reached: a result answers a pending call of a stored plan).
    Vanished,
    /// A paused plan's state could not be encoded for the store.
    Encode(serde_json::Error),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Store(e) => write!(f, "session store: {e}"),
            SessionError::Busy { .. } => f.write_str("the session is busy"),
            SessionError::NotPending { index, call_id } => write!(
                f,
                "messages.{index}: no pending tool call with id '{call_id}'"
            ),
            SessionError::Vanished => f.write_str("the paused plan disappeared"),
            SessionError::Encode(e) => write!(f, "plan state: {e}"),
        }
    }
}

impl std::error::Error for SessionError {}

impl From<StoreUnavailable> for SessionError {
    fn from(e: StoreUnavailable) -> Self {
        SessionError::Store(e)
    }
}

/// How a request starts: a new plan, or a paused one resumed.
pub enum Start {
    New(RunInput),
    Resume {
        state: Box<RunStateBox>,
        /// `(call id, result text)` of the caller's tool messages.
        results: Vec<(String, String)>,
    },
}

/// A stored run, opaque outside the planner.
pub struct RunStateBox(pub(super) RunState);

/// How long a session's lock lasts unless renewed: what a lock left by a
/// replica that died, or could not unlock while Redis was away (it
/// survives a restart on AOF), keeps the session busy for at most.
const LOCK_LEASE: Duration = Duration::from_secs(15);

/// How often the holder renews its lock: a few renewals fit in a lease,
/// so one late or failed renewal does not free a session still in use.
const LOCK_RENEW_EVERY: Duration = Duration::from_secs(5);

/// The session's lock, held for the request and renewed while it runs;
/// released when dropped.
pub struct SessionLock {
    sessions: Arc<dyn SessionStore>,
    key: String,
    token: String,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl SessionLock {
    /// The session's store key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Releases the session now (before the reply's last byte, so the
    /// caller's next request finds it free).
    pub async fn release(mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        let token = std::mem::take(&mut self.token);
        if let Err(e) = self.sessions.unlock(&self.key, &token).await {
            tracing::warn!("planner session unlock failed, retrying: {e}");
            unlock_eventually(self.sessions.clone(), self.key.clone(), token);
        }
    }
}

/// Releases a lock whose release (or acquisition) got no answer: the
/// command may land late, so the unlock is retried until the store answers
/// or the lease has run out anyway. The session is then free as soon as
/// the store is back, not a whole lease later.
fn unlock_eventually(sessions: Arc<dyn SessionStore>, key: String, token: String) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let give_up = tokio::time::Instant::now() + LOCK_LEASE;
        let mut pause = Duration::from_millis(100);
        while tokio::time::Instant::now() < give_up {
            if sessions.unlock(&key, &token).await.is_ok() {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    });
}

impl Drop for SessionLock {
    fn drop(&mut self) {
        if let Some(renewer) = self.renewer.take() {
            renewer.abort();
        }
        if self.token.is_empty() {
            return;
        }
        unlock_eventually(
            self.sessions.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        );
    }
}

/// A request's hold on its session, and how it starts.
pub struct Begun {
    pub lock: SessionLock,
    pub start: Start,
}

/// Renews the lock every [`LOCK_RENEW_EVERY`] until aborted (the lock's
/// release or drop) or until the lock is no longer this holder's.
fn renew_while_held(
    sessions: Arc<dyn SessionStore>,
    key: String,
    token: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(LOCK_RENEW_EVERY).await;
            match sessions.renew(&key, &token, LOCK_LEASE).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!("a planner session's lock lapsed while its request ran");
                    return;
                }
                // The store is away: try again; the lease bounds the rest.
                Err(e) => tracing::warn!("planner session lock renewal failed: {e}"),
            }
        }
    })
}

impl Planner {
    /// Takes the session (`key`: the host's store key for it, scoped to
    /// the tenant) and decides how the request starts: the request's
    /// trailing `tool` messages (`results`) resume the session's paused
    /// plan (each must answer a pending call: 400 naming
    /// `messages.N.tool_call_id` otherwise); without any a new plan
    /// starts. A session busy with another request is a 409.
    pub async fn begin(
        &self,
        key: String,
        results: Vec<ToolResult>,
        input: impl FnOnce() -> RunInput,
    ) -> Result<Begun, SessionError> {
        let token = crate::ids::new_id("lock_");
        let locked = match self.sessions.lock(&key, &token, LOCK_LEASE).await {
            Ok(locked) => locked,
            Err(e) => {
                // The lock may still land after the timeout: take it back.
                unlock_eventually(self.sessions.clone(), key, token);
                return Err(e.into());
            }
        };
        if !locked {
            let retry_after = self
                .sessions
                .lock_left(&key)
                .await
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(1));
            return Err(SessionError::Busy { retry_after });
        }
        let lock = SessionLock {
            sessions: self.sessions.clone(),
            key: key.clone(),
            renewer: Some(renew_while_held(
                self.sessions.clone(),
                key.clone(),
                token.clone(),
            )),
            token,
        };
        if results.is_empty() {
            return Ok(Begun {
                lock,
                start: Start::New(input()),
            });
        }
        let stored = match self.sessions.load(&key).await {
            Ok(s) => s,
            Err(e) => {
                lock.release().await;
                return Err(e.into());
            }
        };
        let state: Option<RunState> = stored.and_then(|s| serde_json::from_str(&s).ok());
        let pending: Vec<&str> = state
            .as_ref()
            .map(|s| s.pending.iter().map(|p| p.call_id.as_str()).collect())
            .unwrap_or_default();
        if let Some(r) = results
            .iter()
            .find(|r| !pending.contains(&r.call_id.as_str()))
        {
            let (index, call_id) = (r.index, r.call_id.clone());
            lock.release().await;
            return Err(SessionError::NotPending { index, call_id });
        }
        let results = results.into_iter().map(|r| (r.call_id, r.text)).collect();
        // Every result answered a pending call, so there is a state.
        let Some(state) = state else {
            lock.release().await;
            return Err(SessionError::Vanished);
        };
        Ok(Begun {
            lock,
            start: Start::Resume {
                state: Box::new(RunStateBox(state)),
                results,
            },
        })
    }

    /// The paused run, with the caller's tool results recorded: each
    /// answered call is a completed step, each unanswered one a failed
    /// step that could not be done.
    pub(super) fn resume(
        &self,
        state: RunStateBox,
        results: Vec<(String, String)>,
        emit: &(dyn Fn(Event) + Send + Sync),
    ) -> RunState {
        METRICS.planner_resumes.inc();
        let mut state = state.0;
        let answered: BTreeMap<String, String> = results.into_iter().collect();
        let pending = std::mem::take(&mut state.pending);
        for p in pending {
            match answered.get(&p.call_id) {
                Some(text) => {
                    state.records.insert(
                        p.step_id.clone(),
                        Record::Done {
                            output: text.clone(),
                        },
                    );
                    state.gathered.push(Gathered {
                        step: p.step_id.clone(),
                        source: p.name.clone(),
                        text: clip(text, self.config.max_step_output_bytes),
                    });
                    emit(Event::ToolThought(ToolThought {
                        step: Some(p.step_id),
                        kind: "function",
                        target: p.name,
                        outcome: "completed",
                        latency_ms: 0,
                        detail: clip(text, 200),
                    }));
                }
                None => {
                    let reason = "the caller sent no result".to_owned();
                    state.records.insert(
                        p.step_id.clone(),
                        Record::Failed {
                            reason: reason.clone(),
                        },
                    );
                    state
                        .not_done
                        .push(format!("{} ({}): {reason}", p.step_id, p.name));
                }
            }
        }
        emit(Event::Thought(format!(
            "Resumed the paused plan with {} tool result(s).",
            answered.len()
        )));
        state
    }

    /// Stores the run until the caller sends its tools' results; returns
    /// the calls it waits for.
    pub(super) async fn pause(
        &self,
        session_key: &str,
        state: &RunState,
        emit: &(dyn Fn(Event) + Send + Sync),
    ) -> Result<Vec<PendingCall>, SessionError> {
        METRICS.planner_pauses.inc();
        let text = serde_json::to_string(state).map_err(SessionError::Encode)?;
        self.sessions
            .save(
                session_key,
                &text,
                Duration::from_secs(self.config.session_ttl_seconds),
            )
            .await?;
        emit(Event::Thought(format!(
            "Paused for {} call(s) of the caller's tools; send their results on this session to resume.",
            state.pending.len()
        )));
        Ok(state.pending.clone())
    }

    /// Forgets the session's paused plan (a new user message starts a new
    /// plan; an answered run needs none). Best effort: a stale state only
    /// answers tool results nobody sends.
    pub(super) async fn forget_pause(&self, session_key: &str) {
        let _ = self.sessions.clear(session_key).await;
    }
}
