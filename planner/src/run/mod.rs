//! Planner mode: chat completions with `planner_mode: true` and an
//! `x-session-id`. The planner asks the request's model for a plan (JSON
//! constrained by a per-request schema), runs its steps — A2A agents from
//! the directory or the request's `agents`, the caller's function tools,
//! model calls — in parallel where they are independent, works around
//! agents that are slow (hedges), refuse or stay silent (alternates,
//! re-plans, deadlines), pauses for the caller's tools and resumes by
//! session, and always ends with a synthesis that answers.
//!
//! A request's life, one file per phase: [`Planner::begin`] (`pause`:
//! the session's lock, 409 on concurrent use; resume or new plan; 400
//! for tool results that answer nothing pending) → [`Planner::run`],
//! below, which reads in order: resolve agents (`resolve`, over
//! `directory`) → plan (`planning`: a call under the request's
//! `grammar`, checked by the guard in `plan`, one repair, else the
//! default plan that asks the agents) → execute (`execute`, each step in
//! `step`) → re-plan failed work (`planning`) → pause (`pause`, stored
//! by `session`) or synthesize (`synthesis`). The run's memory is
//! `state`. Every model call goes through the generation driver
//! (`model`). Agents are reached through `a2a` over `net` (address
//! policy, deadlines, size caps). Agent output is quoted data in every
//! prompt (`text`), never instructions.

mod execute;
pub mod grammar;
mod input;
mod pause;
pub mod plan;
mod planning;
mod resolve;
mod state;
mod step;
mod synthesis;

pub use input::{RunInput, ToolResult, Turn};
pub use pause::{Begun, RunStateBox, SessionError, SessionLock, Start};

use crate::agents::Directory;
use crate::config::PlannerConfig;
use crate::metrics::METRICS;
use crate::net::{AddressPolicy, AgentHttp, NetLimits};
use crate::ports::{DirectoryStore, ModelCalls, SessionStore};
use execute::Executed;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

/// What the planner tells its client while it works.
#[derive(Debug, Clone)]
pub enum Event {
    /// A `thought` entry: the plan, re-plan reasons, budget notes.
    Thought(String),
    /// A `tool_thought` entry ([`ToolThought`]): one per attempt of a step.
    ToolThought(ToolThought),
    /// An `executable_data` entry: an agent's structured output.
    Data(Value),
    /// A piece of the answer's text (streamed synthesis).
    Answer(String),
}

/// One attempt of a step (or an agent that could not be used), as the
/// client's `tool_thought` entry reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolThought {
    /// The plan's step id; none for an agent that failed before planning.
    pub step: Option<String>,
    /// `agent`, `function` or `llm`.
    pub kind: &'static str,
    /// The agent id or address, the tool's name, or `model`.
    pub target: String,
    /// A bounded label (docs/request-contract.md lists them).
    pub outcome: &'static str,
    pub latency_ms: u64,
    /// What happened, for a person; never a network detail of an agent
    /// ("agent unreachable").
    pub detail: String,
}

/// Why a run failed.
#[derive(Debug)]
pub enum RunError<E> {
    /// The run's first model call could not run at all (nothing was done).
    Model(E),
    /// A pause could not be stored.
    Session(SessionError),
}

/// How a run ended.
#[derive(Debug, Clone)]
pub enum Ending {
    Answer(Answer),
    /// The plan waits for the caller's function tools.
    Pause(Vec<PendingCall>),
}

/// The run's answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub text: String,
    /// Cut at its output cap (`finish_reason: "length"`).
    pub at_length: bool,
}

impl Answer {
    /// The answer's `finish_reason`.
    pub fn finish_reason(&self) -> &'static str {
        if self.at_length {
            "length"
        } else {
            "stop"
        }
    }
}

/// A call of a caller's function tool the plan waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    pub call_id: String,
    pub step_id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// The planner: configuration, the agents' HTTP client, the directory and
/// the session store. One per process.
pub struct Planner {
    pub config: PlannerConfig,
    http: Arc<AgentHttp>,
    pub directory: Directory,
    sessions: Arc<dyn SessionStore>,
}

impl Planner {
    /// The planner of one process. `tls` is the agents' client TLS (the
    /// host's trusted roots); `stored_agents` the directory entries kept
    /// beside the config's, if any.
    pub fn new(
        config: &PlannerConfig,
        tls: rustls::ClientConfig,
        sessions: Arc<dyn SessionStore>,
        stored_agents: Option<Arc<dyn DirectoryStore>>,
    ) -> anyhow::Result<Self> {
        let policy = AddressPolicy::new(
            config.allow_private_addresses,
            config.allow_link_local,
            &config.allowed_networks,
        )?;
        let http = Arc::new(AgentHttp::new(
            policy,
            tls,
            Duration::from_millis(config.connect_timeout_ms),
        ));
        let card_limits = NetLimits {
            first_byte: Duration::from_millis(config.first_byte_timeout_ms),
            idle: Duration::from_millis(config.idle_timeout_ms),
            max_body: config.max_card_bytes,
        };
        let directory = Directory::new(
            config.agents.clone(),
            stored_agents,
            Duration::from_secs(config.card_ttl_seconds),
            http.clone(),
            card_limits,
            config.allow_request_urls,
        );
        Ok(Self {
            config: config.clone(),
            http,
            directory,
            sessions,
        })
    }

    /// The network limits of an agent call.
    fn limits(&self) -> NetLimits {
        NetLimits {
            first_byte: Duration::from_millis(self.config.first_byte_timeout_ms),
            idle: Duration::from_millis(self.config.idle_timeout_ms),
            max_body: self.config.max_response_bytes,
        }
    }

    /// Runs (or resumes) a plan to its pause or its answer. Fails only when
    /// a new run's first model call cannot run at all (a limit or budget
    /// refuses it, no worker has capacity: 429, 402, 503), when nothing
    /// was done yet, or when a pause cannot be stored.
    pub async fn run<M: ModelCalls>(
        &self,
        calls: &M,
        session_key: String,
        start: Start,
        events: &UnboundedSender<Event>,
    ) -> Result<Ending, RunError<M::Error>> {
        let run_deadline = Instant::now() + Duration::from_millis(self.config.run_timeout_ms);
        let emit = |e: Event| {
            let _ = events.send(e);
        };
        let mut state = match start {
            Start::New(input) => {
                // A new user message starts a new plan: the old one goes.
                self.forget_pause(&session_key).await;
                let mut state = self.resolve_agents(input, &emit).await;
                state.plan = self
                    .make_plan(calls, &mut state, run_deadline, true, &emit)
                    .await
                    .map_err(RunError::Model)?;
                METRICS.planner_plans.with_label_values(&["new"]).inc();
                state
            }
            Start::Resume { state, results } => self.resume(*state, results, &emit),
        };
        loop {
            match self.execute(calls, &mut state, run_deadline, &emit).await {
                Executed::Paused => {
                    let pending = self
                        .pause(&session_key, &state, &emit)
                        .await
                        .map_err(RunError::Session)?;
                    return Ok(Ending::Pause(pending));
                }
                Executed::Budget(note) => {
                    emit(Event::Thought(note));
                    break;
                }
                Executed::Finished { failed } => {
                    if !self
                        .replan(calls, &mut state, run_deadline, &failed, &emit)
                        .await
                    {
                        break;
                    }
                }
            }
        }
        state.note_undone();
        self.forget_pause(&session_key).await;
        METRICS.planner_plans.with_label_values(&["answered"]).inc();
        Ok(Ending::Answer(self.synthesize(calls, &state, events).await))
    }
}
