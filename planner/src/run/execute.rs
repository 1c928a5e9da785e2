//! The execute phase: one pass over the current plan. Ready steps start
//! in parallel (`step`), steps after a failed or skipped one are skipped,
//! function steps are collected for a pause, and the run's budgets (steps,
//! tokens, wall clock) stop what has not started. Each attempt of a step
//! becomes a `tool_thought` entry.

use super::plan::{Step, StepKind};
use super::state::{Gathered, Record, RunState};
use super::step::{self, AgentRoute, Attempt, StepEnv, StepResult};
use super::ToolThought;
use super::{Event, PendingCall, Planner};
use crate::a2a;
use crate::metrics::METRICS;
use crate::ports::ModelCalls;
use crate::text::clip;
use futures::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::Instant;

/// How an execution pass ended.
pub(super) enum Executed {
    /// Function steps wait for the caller.
    Paused,
    /// A budget ended execution early.
    Budget(String),
    /// Nothing more can run.
    Finished { failed: Vec<FailedStep> },
}

/// A step that failed in a pass, for the re-plan.
pub(super) struct FailedStep {
    pub step: String,
    pub reason: String,
    /// Agents that refused or failed (excluded from re-plans).
    pub agents: Vec<String>,
}

/// The `tool_thought` entry of a step that got no attempt.
fn unattempted(step: &Step, outcome: &'static str, latency_ms: u64, detail: String) -> Event {
    Event::ToolThought(ToolThought {
        step: Some(step.id.clone()),
        kind: step.kind.as_str(),
        target: step.target.clone(),
        outcome,
        latency_ms,
        detail,
    })
}

impl Planner {
    /// Runs the current plan's steps until nothing more can start: ready
    /// steps in parallel, function steps collected for a pause.
    pub(super) async fn execute<M: ModelCalls>(
        &self,
        calls: &M,
        state: &mut RunState,
        run_deadline: Instant,
        emit: &(dyn Fn(Event) + Send + Sync),
    ) -> Executed {
        let note = |text: String| emit(Event::Thought(text));
        let env = StepEnv {
            http: self.http.clone(),
            limits: self.limits(),
            step_timeout: Duration::from_millis(self.config.step_timeout_ms),
            hedge_after: Duration::from_millis(self.config.hedge_after_ms),
            run_deadline,
            calls,
            // A step writes no more than the answer may.
            max_tokens: match state.max_tokens {
                0 => self.config.max_step_tokens,
                answer => self.config.max_step_tokens.min(answer),
            },
            note: &note,
        };
        let mut running = FuturesUnordered::new();
        let mut started: Vec<String> = Vec::new();
        let mut budget_note: Option<String> = None;
        let mut failed: Vec<FailedStep> = Vec::new();
        loop {
            skip_blocked(state, &started, emit);
            // Start what is ready.
            let ready: Vec<Step> = state
                .plan
                .steps
                .iter()
                .filter(|s| !state.records.contains_key(&s.id) && !started.contains(&s.id))
                .filter(|s| {
                    s.depends_on
                        .iter()
                        .all(|d| matches!(state.record(d), Some(Record::Done { .. })))
                })
                .cloned()
                .collect();
            for s in ready {
                if let Some(what) = self.spent_budget(calls, state, run_deadline) {
                    let reason = format!("not started: {what} is spent");
                    budget_note.get_or_insert_with(|| {
                        format!("Budget: {what} is spent; remaining steps are not run.")
                    });
                    emit(unattempted(&s, "skipped", 0, reason.clone()));
                    state
                        .records
                        .insert(s.id.clone(), Record::Skipped { reason });
                    continue;
                }
                state.steps_run += 1;
                if s.kind == StepKind::Function {
                    await_caller(state, &s, emit);
                    continue;
                }
                let text = state.step_input(&s, self.config.max_step_output_bytes);
                let routes = if s.kind == StepKind::Agent {
                    self.routes(state, &s).await
                } else {
                    Vec::new()
                };
                started.push(s.id.clone());
                let env = &env;
                running.push(async move {
                    let result = match s.kind {
                        StepKind::Agent => step::agent_step(env, &s, text, routes).await,
                        _ => step::llm_step(env, &s, text).await,
                    };
                    (s, result)
                });
            }
            if running.is_empty() {
                break;
            }
            let next = tokio::select! {
                next = running.next() => next,
                _ = tokio::time::sleep_until(run_deadline) => None,
            };
            let Some((step, result)) = next else {
                // The run's deadline: abandon (and cancel) what still runs.
                drop(running);
                self.abandon(state, &started, emit);
                return Executed::Budget(format!(
                    "Budget: the run's wall clock ({} ms) ended; answering from what was gathered.",
                    self.config.run_timeout_ms
                ));
            };
            if let Some(f) = self.record_result(state, &step, result, emit) {
                failed.push(f);
            }
        }
        if !state.pending.is_empty() {
            return Executed::Paused;
        }
        match budget_note {
            Some(n) => Executed::Budget(n),
            None => Executed::Finished { failed },
        }
    }

    /// Which of the run's budgets is spent, if any: steps, tokens, or the
    /// wall clock.
    fn spent_budget<M: ModelCalls>(
        &self,
        calls: &M,
        state: &RunState,
        run_deadline: Instant,
    ) -> Option<String> {
        if state.steps_run >= self.config.max_steps {
            Some(format!("the run's step budget ({})", self.config.max_steps))
        } else if calls.tokens_used() >= self.config.max_run_tokens {
            Some(format!(
                "the run's token budget ({})",
                self.config.max_run_tokens
            ))
        } else if Instant::now() >= run_deadline {
            Some("the run's wall clock".to_owned())
        } else {
            None
        }
    }

    /// The steps still running at the run's deadline: failed, each said
    /// in `tool_thought`.
    fn abandon(
        &self,
        state: &mut RunState,
        started: &[String],
        emit: &(dyn Fn(Event) + Send + Sync),
    ) {
        for id in started {
            if state.records.contains_key(id) {
                continue;
            }
            if let Some(s) = state.plan.steps.iter().find(|s| &s.id == id) {
                emit(unattempted(
                    s,
                    "timeout",
                    self.config.run_timeout_ms,
                    "abandoned at the run's deadline".into(),
                ));
                METRICS
                    .planner_steps
                    .with_label_values(&[s.kind.as_str(), "timeout"])
                    .inc();
            }
            state.records.insert(
                id.clone(),
                Record::Failed {
                    reason: "abandoned at the run's deadline".into(),
                },
            );
        }
    }

    /// The agents a step may use: its target, then its alternates, less
    /// those excluded by earlier failures.
    async fn routes(&self, state: &RunState, step: &Step) -> Vec<AgentRoute> {
        let mut routes = Vec::new();
        for id in std::iter::once(&step.target).chain(step.alternates.iter()) {
            if state.excluded.contains(id) {
                continue;
            }
            if let Some(agent) = state.agents.iter().find(|a| &a.id == id) {
                routes.push(AgentRoute {
                    id: id.clone(),
                    endpoint: self.directory.endpoint(agent).await,
                    context_id: state.contexts.get(id).cloned(),
                });
            }
        }
        routes
    }

    /// Records a finished step: its attempts in `tool_thought`, an agent's
    /// structured parts in `executable_data`, its output for the steps
    /// after it and the synthesis. Returns the failure, if it failed.
    fn record_result(
        &self,
        state: &mut RunState,
        step: &Step,
        result: StepResult,
        emit: &(dyn Fn(Event) + Send + Sync),
    ) -> Option<FailedStep> {
        let thought = |a: &Attempt| {
            Event::ToolThought(ToolThought {
                step: Some(step.id.clone()),
                kind: step.kind.as_str(),
                target: a.target.clone(),
                outcome: a.outcome,
                latency_ms: a.latency_ms,
                detail: a.detail.clone(),
            })
        };
        match result {
            StepResult::Done {
                by,
                text,
                parts,
                context_id,
                attempts,
            } => {
                for a in &attempts {
                    emit(thought(a));
                }
                METRICS
                    .planner_steps
                    .with_label_values(&[step.kind.as_str(), "completed"])
                    .inc();
                if let Some(c) = context_id {
                    state.contexts.insert(by.clone(), c);
                }
                for p in &parts {
                    let mut v = serde_json::to_value(p).unwrap_or(Value::Null);
                    if let Value::Object(o) = &mut v {
                        o.insert("step".into(), json!(step.id));
                        o.insert("agent".into(), json!(by));
                    }
                    emit(Event::Data(v));
                }
                let mut output = text;
                for p in &parts {
                    if let a2a::Part::Data { data, .. } = p {
                        output.push_str(&format!("\n{data}"));
                    }
                }
                let output = clip(&output, self.config.max_step_output_bytes);
                state.gathered.push(Gathered {
                    step: step.id.clone(),
                    source: by,
                    text: output.clone(),
                });
                state
                    .records
                    .insert(step.id.clone(), Record::Done { output });
                None
            }
            StepResult::Failed {
                reason,
                attempts,
                failed_agents,
            } => {
                for a in &attempts {
                    emit(thought(a));
                }
                let outcome = attempts.last().map_or("failed", |a| a.outcome);
                METRICS
                    .planner_steps
                    .with_label_values(&[step.kind.as_str(), outcome])
                    .inc();
                state.records.insert(
                    step.id.clone(),
                    Record::Failed {
                        reason: reason.clone(),
                    },
                );
                Some(FailedStep {
                    step: step.id.clone(),
                    reason,
                    agents: failed_agents,
                })
            }
        }
    }
}

/// Skips the steps that depend on a failed or skipped step (and, in turn,
/// those that depend on them).
fn skip_blocked(state: &mut RunState, started: &[String], emit: &(dyn Fn(Event) + Send + Sync)) {
    loop {
        let mut changed = false;
        for s in &state.plan.steps {
            if state.records.contains_key(&s.id) || started.contains(&s.id) {
                continue;
            }
            let blocked = s.depends_on.iter().find(|d| {
                matches!(
                    state.record(d),
                    Some(Record::Failed { .. } | Record::Skipped { .. })
                )
            });
            if let Some(d) = blocked {
                let reason = format!("depends on '{d}', which did not complete");
                emit(unattempted(s, "skipped", 0, reason.clone()));
                METRICS
                    .planner_steps
                    .with_label_values(&[s.kind.as_str(), "skipped"])
                    .inc();
                state
                    .records
                    .insert(s.id.clone(), Record::Skipped { reason });
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
}

/// A function step: a call of the caller's tool, which the run pauses for.
fn await_caller(state: &mut RunState, step: &Step, emit: &(dyn Fn(Event) + Send + Sync)) {
    let call_id = crate::ids::new_id("call_");
    let arguments = step
        .arguments
        .as_ref()
        .map(Value::to_string)
        .unwrap_or_else(|| "{}".into());
    emit(unattempted(
        step,
        "awaiting_caller",
        0,
        format!("call {call_id}"),
    ));
    METRICS
        .planner_steps
        .with_label_values(&["function", "paused"])
        .inc();
    state.pending.push(PendingCall {
        call_id: call_id.clone(),
        step_id: step.id.clone(),
        name: step.target.clone(),
        arguments,
    });
    state
        .records
        .insert(step.id.clone(), Record::Awaiting { call_id });
}
