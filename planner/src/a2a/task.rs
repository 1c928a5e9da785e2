//! Folding a call's results (one reply, or stream events) into an answer
//! or a failure: task states across versions, parts, refusals in words.

use super::{wire, AgentAnswer, AgentFailure, Part};
use serde_json::Value;
use std::sync::{Arc, Mutex};

/// The task an in-flight call created, for cancelling it.
#[derive(Debug, Default, Clone)]
pub struct TaskSlot(Arc<Mutex<Option<String>>>);

impl TaskSlot {
    pub(super) fn set(&self, id: &str) {
        if let Ok(mut slot) = self.0.lock() {
            if slot.is_none() && !id.is_empty() {
                *slot = Some(id.to_owned());
            }
        }
    }

    pub fn get(&self) -> Option<String> {
        self.0.lock().ok().and_then(|s| s.clone())
    }
}

/// A task's state, across versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    Completed,
    Failed,
    Canceled,
    Rejected,
    InputRequired,
    AuthRequired,
    Unknown,
}

impl TaskState {
    pub fn parse(s: &str) -> TaskState {
        let s = s.trim().to_ascii_lowercase();
        let s = s
            .strip_prefix("task_state_")
            .unwrap_or(&s)
            .replace('_', "-");
        match s.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "input-required" => TaskState::InputRequired,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Unknown,
        }
    }

    /// Terminal or interrupted: the call is over.
    pub(super) fn ends(self) -> bool {
        !matches!(
            self,
            TaskState::Submitted | TaskState::Working | TaskState::Unknown
        )
    }
}

/// Folds a call's results (one reply, or stream events) into an outcome.
#[derive(Debug, Default)]
pub(super) struct Accumulator {
    pub(super) task_id: Option<String>,
    context_id: Option<String>,
    state: Option<TaskState>,
    /// The status message's text (a refusal or failure reason).
    status_text: String,
    artifacts: Vec<Part>,
    /// A direct message reply ends the call.
    message: Option<Vec<Part>>,
}

impl Accumulator {
    pub(super) fn push(&mut self, result: Value, slot: &TaskSlot) -> Result<(), AgentFailure> {
        let r: wire::RpcResult = serde_json::from_value(result)
            .map_err(|e| AgentFailure::Malformed(format!("result: {e}")))?;
        // v1.0 wraps (`task`, `message`, `statusUpdate`, `artifactUpdate`);
        // v0.3 tags the object itself with `kind`.
        if let Some(task) = r.task {
            self.task(task, slot);
        } else if let Some(m) = r.message {
            self.message_reply(m);
        } else if let Some(u) = r.status_update {
            self.status_update(u, slot);
        } else if let Some(u) = r.artifact_update {
            self.artifact_update(u, slot);
        } else {
            match r.kind.as_deref() {
                Some("task") => self.task(r.flat_task(), slot),
                Some("message") => self.message_reply(r.flat_message()),
                Some("status-update") => self.status_update(r.flat_status_update(), slot),
                Some("artifact-update") => self.artifact_update(r.flat_artifact_update(), slot),
                _ => return Err(AgentFailure::Malformed("an unknown result".into())),
            }
        }
        Ok(())
    }

    fn task(&mut self, t: wire::Task, slot: &TaskSlot) {
        if let Some(id) = &t.id {
            slot.set(id);
            self.task_id = Some(id.clone());
        }
        if t.context_id.is_some() {
            self.context_id = t.context_id;
        }
        for a in t.artifacts {
            self.artifacts
                .extend(a.parts.into_iter().filter_map(wire::Part::into_part));
        }
        if let Some(s) = t.status {
            self.status(s);
        }
    }

    fn status(&mut self, s: wire::Status) {
        self.state = Some(TaskState::parse(&s.state.unwrap_or_default()));
        if let Some(m) = s.message {
            let text = parts_text(&m.parts);
            if !text.is_empty() {
                self.status_text = text;
            }
            // A completed task may answer in its status message.
            if self.state == Some(TaskState::Completed) {
                self.artifacts
                    .extend(m.parts.into_iter().filter_map(wire::Part::into_part));
            }
        }
    }

    fn message_reply(&mut self, m: wire::Message) {
        if m.context_id.is_some() {
            self.context_id = m.context_id;
        }
        self.message = Some(
            m.parts
                .into_iter()
                .filter_map(wire::Part::into_part)
                .collect(),
        );
    }

    fn status_update(&mut self, u: wire::StatusUpdate, slot: &TaskSlot) {
        if let Some(id) = &u.task_id {
            slot.set(id);
            self.task_id.get_or_insert(id.clone());
        }
        if u.context_id.is_some() {
            self.context_id = u.context_id;
        }
        if let Some(s) = u.status {
            self.status(s);
        }
    }

    fn artifact_update(&mut self, u: wire::ArtifactUpdate, slot: &TaskSlot) {
        if let Some(id) = &u.task_id {
            slot.set(id);
            self.task_id.get_or_insert(id.clone());
        }
        if let Some(a) = u.artifact {
            self.artifacts
                .extend(a.parts.into_iter().filter_map(wire::Part::into_part));
        }
    }

    pub(super) fn ended(&self) -> bool {
        self.message.is_some() || self.state.is_some_and(TaskState::ends)
    }

    pub(super) fn finish(self) -> Result<AgentAnswer, AgentFailure> {
        let parts = match (self.message, self.state) {
            (Some(parts), _) => parts,
            (None, Some(TaskState::Completed)) => self.artifacts,
            (None, Some(TaskState::Rejected)) => {
                return Err(AgentFailure::Rejected(self.status_text))
            }
            (None, Some(TaskState::Failed)) => return Err(AgentFailure::Failed(self.status_text)),
            (None, Some(TaskState::Canceled)) => return Err(AgentFailure::Canceled),
            (None, Some(TaskState::AuthRequired)) => {
                return Err(AgentFailure::AuthRequired(self.status_text))
            }
            (None, Some(TaskState::InputRequired)) => {
                return Err(AgentFailure::InputRequired(self.status_text))
            }
            (None, _) => {
                return Err(AgentFailure::Malformed(
                    "the reply ended before the task finished".into(),
                ))
            }
        };
        let answer = AgentAnswer {
            parts,
            context_id: self.context_id,
            task_id: self.task_id,
        };
        if answer.parts.is_empty() {
            return Err(AgentFailure::Malformed("the agent returned nothing".into()));
        }
        let text = answer.text();
        let only_text = answer.parts.iter().all(|p| matches!(p, Part::Text { .. }));
        if only_text && looks_like_refusal(&text) {
            return Err(AgentFailure::RefusedText(text));
        }
        Ok(answer)
    }
}

fn parts_text(parts: &[wire::Part]) -> String {
    let texts: Vec<&str> = parts.iter().filter_map(|p| p.text.as_deref()).collect();
    texts.join("\n")
}

/// Whether a short plain-text answer is a refusal ("I can't help with
/// that"): agents often refuse in words inside a completed task.
pub fn looks_like_refusal(text: &str) -> bool {
    let t = text.trim().to_lowercase().replace('’', "'");
    if t.is_empty() || t.len() > 400 {
        return false;
    }
    const OPENINGS: [&str; 12] = [
        "i can't",
        "i cannot",
        "i can not",
        "i'm unable",
        "i am unable",
        "i won't",
        "i will not",
        "i'm not able",
        "i am not able",
        "sorry, i can",
        "i'm sorry, but i can",
        "i must decline",
    ];
    const PHRASES: [&str; 6] = [
        "can't help with",
        "cannot help with",
        "unable to help",
        "not able to help",
        "cannot assist",
        "can't assist",
    ];
    OPENINGS.iter().any(|o| t.starts_with(o)) || PHRASES.iter().any(|p| t.contains(p))
}
