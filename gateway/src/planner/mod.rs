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

pub mod a2a;
pub mod admin;
pub mod directory;
mod execute;
pub mod grammar;
mod input;
pub mod model;
pub mod net;
mod pause;
pub mod plan;
mod planning;
pub mod reply;
mod resolve;
pub mod session;
mod state;
mod step;
mod synthesis;
mod text;

pub use input::{RunInput, Turn};
pub use pause::{Begun, RunStateBox, SessionLock, Start};

use crate::api::chat::ToolThought;
use crate::config::PlannerConfig;
use crate::error::ApiError;
use crate::metrics::METRICS;
use crate::redis::RedisHandle;
use directory::Directory;
use execute::Executed;
use model::ModelCalls;
use net::{AddressPolicy, AgentHttp, NetLimits};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use session::SessionStore;
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
    pub fn from_config(
        config: &PlannerConfig,
        redis: Option<Arc<RedisHandle>>,
    ) -> anyhow::Result<Self> {
        let policy = AddressPolicy::new(
            config.allow_private_addresses,
            config.allow_link_local,
            &config.allowed_networks,
        )?;
        let http = Arc::new(AgentHttp::new(
            policy,
            Duration::from_millis(config.connect_timeout_ms),
        )?);
        let card_limits = NetLimits {
            first_byte: Duration::from_millis(config.first_byte_timeout_ms),
            idle: Duration::from_millis(config.idle_timeout_ms),
            max_body: config.max_card_bytes,
        };
        let directory = Directory::new(
            config.agents.clone(),
            redis.clone(),
            Duration::from_secs(config.card_ttl_seconds),
            http.clone(),
            card_limits,
            config.allow_request_urls,
        );
        let sessions: Arc<dyn SessionStore> = match redis {
            Some(r) => Arc::new(session::RedisSessions::new(r)),
            None => Arc::new(session::MemorySessions::default()),
        };
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
    pub async fn run(
        &self,
        calls: &ModelCalls<'_>,
        session_key: String,
        start: Start,
        events: &UnboundedSender<Event>,
    ) -> Result<Ending, ApiError> {
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
                    .await?;
                METRICS.planner_plans.with_label_values(&["new"]).inc();
                state
            }
            Start::Resume { state, results } => self.resume(*state, results, &emit),
        };
        loop {
            match self.execute(calls, &mut state, run_deadline, &emit).await {
                Executed::Paused => {
                    let pending = self.pause(&session_key, &state, &emit).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The typed entry is the JSON the planner wrote by hand before, byte
    /// for byte (field order included).
    #[test]
    fn tool_thought_entries_keep_their_wire_bytes() {
        let cases = [
            (
                ToolThought {
                    step: None,
                    kind: "agent",
                    target: "http://a:1".into(),
                    outcome: "no_card",
                    latency_ms: 0,
                    detail: "agent unreachable".into(),
                },
                json!({
                    "step": null, "kind": "agent", "target": "http://a:1",
                    "outcome": "no_card", "latency_ms": 0, "detail": "agent unreachable",
                }),
            ),
            (
                ToolThought {
                    step: Some("2".into()),
                    kind: "llm",
                    target: "model".into(),
                    outcome: "timeout",
                    latency_ms: 300_000,
                    detail: "abandoned at the run's deadline".into(),
                },
                json!({
                    "step": "2", "kind": "llm", "target": "model",
                    "outcome": "timeout", "latency_ms": 300_000_u64,
                    "detail": "abandoned at the run's deadline",
                }),
            ),
        ];
        for (typed, by_hand) in cases {
            assert_eq!(serde_json::to_string(&typed).unwrap(), by_hand.to_string());
        }
    }
}
