//! The first phase of a new run: the request's `agents` (directory ids or
//! URLs) and the directory's best matches for the request become the
//! run's agents; those that cannot be used are said in `thought` and
//! `tool_thought` (with "agent unreachable" for network failures, see
//! `a2a::CardError::public`).

use super::input::RunInput;
use super::plan::Plan;
use super::state::RunState;
use super::ToolThought;
use super::{Event, Planner};
use crate::metrics::METRICS;
use crate::text::clip;
use std::collections::BTreeMap;

impl Planner {
    /// A new run's state: its input and its resolved agents, no plan yet.
    pub(super) async fn resolve_agents(
        &self,
        input: RunInput,
        emit: &(dyn Fn(Event) + Send + Sync),
    ) -> RunState {
        let query = format!("{}\n{}", input.last_user, input.agents.join(" "));
        let (agents, unusable) = self
            .directory
            .resolve(&input.agents, &query, self.config.max_discovered)
            .await;
        for u in unusable {
            let outcome = u.why.outcome();
            let reason = u.why.public();
            emit(Event::Thought(format!(
                "Agent {} cannot be used: {}.",
                u.address,
                clip(&reason, 200)
            )));
            emit(Event::ToolThought(ToolThought {
                step: None,
                kind: "agent",
                target: u.address,
                outcome,
                latency_ms: 0,
                detail: clip(&reason, 300),
            }));
            METRICS
                .planner_steps
                .with_label_values(&["agent", outcome])
                .inc();
        }
        if !agents.is_empty() {
            let names: Vec<String> = agents
                .iter()
                .map(|a| format!("{} ({})", a.id, a.card.name))
                .collect();
            emit(Event::Thought(format!("Agents: {}.", names.join(", "))));
        }
        RunState {
            conversation: input.conversation,
            last_user: input.last_user,
            tools: input.tools,
            agents,
            excluded: Vec::new(),
            plan: Plan::direct("no plan yet"),
            records: BTreeMap::new(),
            replans: 0,
            steps_run: 0,
            transcript: Vec::new(),
            gathered: Vec::new(),
            not_done: Vec::new(),
            pending: Vec::new(),
            contexts: BTreeMap::new(),
            max_tokens: input.max_tokens,
            demand: input.demand,
        }
    }
}
