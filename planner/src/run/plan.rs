//! Plans: the steps a run executes, what a plan may target, and the guard
//! that checks what the model wrote. The plan call's grammar (`grammar`)
//! admits only valid plans; an upstream engine may enforce less of it, so
//! nothing a model writes is trusted: the guard checks it (size, ids by
//! position, known targets, a kind that fits the target, arguments valid
//! against the tool's schema, dependencies on earlier steps only, what
//! `tool_choice` asks) before anything runs, and counts its rejections.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// Most steps in one plan.
pub const MAX_PLAN_STEPS: usize = 8;
/// The target of `llm` steps: the request's own model.
pub const MODEL_TARGET: &str = "model";

/// What a step runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// An A2A agent.
    Agent,
    /// One of the caller's function tools: the plan pauses for its result.
    Function,
    /// A model call (the request's model).
    Llm,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Agent => "agent",
            StepKind::Function => "function",
            StepKind::Llm => "llm",
        }
    }
}

/// One validated step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub id: String,
    pub kind: StepKind,
    /// An agent id, a tool name, or [`MODEL_TARGET`].
    pub target: String,
    pub instruction: String,
    /// For function steps: the call's arguments (valid against the tool).
    #[serde(default)]
    pub arguments: Option<Value>,
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// Agents to try when the target refuses, fails or is slow.
    #[serde(default)]
    pub alternates: Vec<String>,
}

/// A validated plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub summary: String,
    pub steps: Vec<Step>,
}

impl Plan {
    /// No steps: the synthesis answers from the conversation alone.
    pub fn direct(reason: &str) -> Plan {
        Plan {
            summary: format!("Answer directly ({reason})."),
            steps: Vec::new(),
        }
    }

    /// One line per step: `id → target (kind)`.
    pub fn outline(&self) -> String {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                let deps = if s.depends_on.is_empty() {
                    String::new()
                } else {
                    format!(" after {}", s.depends_on.join(", "))
                };
                format!("{} → {} ({}){deps}", s.id, s.target, s.kind.as_str())
            })
            .collect();
        steps.join("; ")
    }
}

/// An agent a plan may target.
#[derive(Debug, Clone)]
pub struct AgentTarget {
    pub id: String,
    /// Name, description and skills, for the planner's prompt.
    pub summary: String,
    /// Named in the request's `agents` (else found in the directory): a
    /// plan consults it unless it says why not.
    pub named: bool,
}

/// A caller's function tool a plan may target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolTarget {
    pub name: String,
    pub description: String,
    /// The tool's parameters schema (`{"type":"object"}` when none).
    pub parameters: Value,
}

/// What the request's `tool_choice` asks of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolDemand {
    /// The plan decides (`auto`, or no `tool_choice`).
    #[default]
    Auto,
    /// At least one step calls one of the caller's tools.
    Required,
    /// That function is called, and no other.
    Named(String),
}

/// Everything a plan may target.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub agents: Vec<AgentTarget>,
    pub tools: Vec<ToolTarget>,
    pub demand: ToolDemand,
}

/// A plan that passed the guard, with what the guard changed.
#[derive(Debug, Clone)]
pub struct Guarded {
    pub plan: Plan,
    /// Named agents the plan left out and said why: `(agent, why)`.
    pub skipped: Vec<(String, String)>,
    /// Named agents the plan left out without a reason, added as steps.
    pub added: Vec<String>,
}

/// The instruction of a step the planner writes itself.
pub const ASK_THE_REQUEST: &str = "Answer the user's request.";

impl Targets {
    /// The tools a plan may call: all of them, or the one `tool_choice` names.
    pub fn offered_tools(&self) -> impl Iterator<Item = &ToolTarget> {
        self.tools.iter().filter(|t| match &self.demand {
            ToolDemand::Named(n) => &t.name == n,
            _ => true,
        })
    }

    /// The plan when the model's fails: each named agent and up to
    /// `discovered` directory matches get the user's request, in parallel
    /// (with no agent, no step: the synthesis answers directly).
    pub fn default_plan(&self, discovered: usize, reason: &str) -> Plan {
        let named = self.agents.iter().filter(|a| a.named);
        let found = self.agents.iter().filter(|a| !a.named).take(discovered);
        let steps: Vec<Step> = named
            .chain(found)
            .enumerate()
            .map(|(i, a)| agent_step(i + 1, &a.id, ASK_THE_REQUEST))
            .collect();
        let summary = if steps.is_empty() {
            format!("Answer directly ({reason}).")
        } else {
            format!("Ask the agents the request ({reason}).")
        };
        Plan { summary, steps }
    }

    /// The guard: checks a model's plan text (the grammar makes a bad
    /// plan impossible; an upstream engine may not enforce all of it).
    /// `Err` lists every problem found, for the repair prompt. A named
    /// agent the plan neither uses nor skips with a reason is added as a
    /// step that asks it the request.
    pub fn validate(&self, text: &str) -> Result<Guarded, Vec<String>> {
        let raw: RawPlan = serde_json::from_str(text.trim()).map_err(|e| {
            vec![format!(
                "the plan is not valid JSON of the plan's shape: {e}"
            )]
        })?;
        let mut problems = Vec::new();
        if raw.steps.is_empty() {
            problems.push("the plan has no steps".to_owned());
        }
        if raw.steps.len() > MAX_PLAN_STEPS {
            problems.push(format!(
                "the plan has {} steps; at most {MAX_PLAN_STEPS} are allowed",
                raw.steps.len()
            ));
        }
        let agents: BTreeSet<&str> = self.agents.iter().map(|a| a.id.as_str()).collect();
        let tools: BTreeMap<&str, &ToolTarget> =
            self.offered_tools().map(|t| (t.name.as_str(), t)).collect();
        let mut steps = Vec::new();
        for (i, s) in raw.steps.into_iter().enumerate() {
            let position = i + 1;
            let at = format!("step {position}");
            if let Some(id) = &s.id {
                if id.as_u64() != Some(position as u64) {
                    problems.push(format!("{at}: its id must be {position}, not {id}"));
                }
            }
            let kind = match s.kind.as_str() {
                "agent" => StepKind::Agent,
                "function" => StepKind::Function,
                "llm" => StepKind::Llm,
                other => {
                    problems.push(format!(
                        "{at}: unknown kind '{other}' (agent, function or llm)"
                    ));
                    continue;
                }
            };
            let known = match kind {
                StepKind::Agent => agents.contains(s.target.as_str()),
                StepKind::Function => tools.contains_key(s.target.as_str()),
                StepKind::Llm => s.target == MODEL_TARGET || s.target.is_empty(),
            };
            if !known {
                problems.push(format!(
                    "{at}: '{}' is not a known {} target",
                    s.target,
                    kind.as_str()
                ));
            }
            let mut arguments = None;
            if kind == StepKind::Function {
                if let Some(tool) = tools.get(s.target.as_str()) {
                    let args = s.arguments.clone().unwrap_or_else(|| json!({}));
                    if let Err(e) = check_arguments(tool, &args) {
                        problems.push(format!("{at}: {e}"));
                    }
                    arguments = Some(args);
                }
            }
            let mut depends_on = Vec::new();
            for d in &s.depends_on {
                match d.as_u64() {
                    Some(d) if d >= 1 && (d as usize) < position => {
                        let id = step_id(d as usize);
                        if !depends_on.contains(&id) {
                            depends_on.push(id);
                        }
                    }
                    _ => problems.push(format!(
                        "{at}: depends_on {d} does not name an earlier step (1 to {})",
                        position - 1
                    )),
                }
            }
            let mut alternates = Vec::new();
            for a in s.alternates {
                if kind != StepKind::Agent {
                    problems.push(format!("{at}: only agent steps have alternates"));
                    break;
                }
                if !agents.contains(a.as_str()) {
                    problems.push(format!("{at}: the alternate '{a}' is not a known agent"));
                } else if a != s.target && !alternates.contains(&a) {
                    alternates.push(a);
                }
            }
            steps.push(Step {
                id: step_id(position),
                kind,
                target: if kind == StepKind::Llm {
                    MODEL_TARGET.into()
                } else {
                    s.target
                },
                instruction: clip_chars(&s.instruction, MAX_INSTRUCTION_CHARS),
                arguments,
                depends_on,
                alternates,
            });
        }
        match &self.demand {
            ToolDemand::Auto => {}
            ToolDemand::Required => {
                if !steps.iter().any(|s| s.kind == StepKind::Function) {
                    problems.push(
                        "tool_choice is 'required': the plan must call one of the caller's tools"
                            .into(),
                    );
                }
            }
            ToolDemand::Named(name) => {
                if !steps
                    .iter()
                    .any(|s| &s.target == name && s.kind == StepKind::Function)
                {
                    problems.push(format!("tool_choice names '{name}': the plan must call it"));
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // Named agents: consulted, unless skipped with a reason.
        let mut skipped = Vec::new();
        let mut added = Vec::new();
        for a in self.agents.iter().filter(|a| a.named) {
            if steps
                .iter()
                .any(|s| s.target == a.id || s.alternates.contains(&a.id))
            {
                continue;
            }
            let why = raw
                .skip
                .iter()
                .find(|k| k.agent == a.id && !k.why.trim().is_empty())
                .map(|k| clip_chars(k.why.trim(), MAX_INSTRUCTION_CHARS));
            match why {
                Some(why) => skipped.push((a.id.clone(), why)),
                None => {
                    steps.push(agent_step(steps.len() + 1, &a.id, ASK_THE_REQUEST));
                    added.push(a.id.clone());
                }
            }
        }
        Ok(Guarded {
            plan: Plan {
                summary: clip_chars(&raw.thought, MAX_INSTRUCTION_CHARS),
                steps,
            },
            skipped,
            added,
        })
    }
}

/// Most characters kept of a model's text field (the grammar's limit;
/// an engine that ignores it gets its text cut, not refused).
const MAX_INSTRUCTION_CHARS: usize = 500;

/// The id of the step at 1-based `position`.
pub fn step_id(position: usize) -> String {
    format!("s{position}")
}

fn agent_step(position: usize, agent: &str, instruction: &str) -> Step {
    Step {
        id: step_id(position),
        kind: StepKind::Agent,
        target: agent.to_owned(),
        instruction: instruction.to_owned(),
        arguments: None,
        depends_on: Vec::new(),
        alternates: Vec::new(),
    }
}

/// Checks a function step's arguments against the tool's own schema.
pub fn check_arguments(tool: &ToolTarget, args: &Value) -> Result<(), String> {
    match jsonschema::validator_for(&tool.parameters) {
        Ok(v) => match v.iter_errors(args).next() {
            Some(e) => Err(format!(
                "the arguments do not match the schema of '{}': {e}",
                tool.name
            )),
            None => Ok(()),
        },
        Err(e) => Err(format!("the schema of '{}' cannot be used: {e}", tool.name)),
    }
}

fn clip_chars(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// A plan as the model wrote it, before the guard.
#[derive(Deserialize)]
struct RawPlan {
    #[serde(default, alias = "summary")]
    thought: String,
    steps: Vec<RawStep>,
    #[serde(default)]
    skip: Vec<RawSkip>,
}

#[derive(Deserialize)]
struct RawStep {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    instruction: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    depends_on: Vec<Value>,
    #[serde(default)]
    alternates: Vec<String>,
}

#[derive(Deserialize)]
struct RawSkip {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    why: String,
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A target agent for planner tests (grammar.rs uses it too).
    pub(crate) fn agent(id: &str, named: bool) -> AgentTarget {
        AgentTarget {
            id: id.into(),
            summary: String::new(),
            named,
        }
    }

    fn targets() -> Targets {
        Targets {
            agents: vec![agent("weather", false), agent("news", false)],
            tools: vec![ToolTarget {
                name: "get_time".into(),
                description: String::new(),
                parameters: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": false}),
            }],
            demand: ToolDemand::Auto,
        }
    }

    fn check(plan: Value) -> Result<Guarded, Vec<String>> {
        targets().validate(&plan.to_string())
    }

    #[test]
    fn a_good_plan_passes_with_ids_by_position() {
        let g = check(json!({"thought": "t", "steps": [
            {"id": 1, "kind": "agent", "target": "weather", "instruction": "x", "depends_on": [], "alternates": ["news", "weather"]},
            {"id": 2, "kind": "function", "target": "get_time", "instruction": "y", "arguments": {"tz": "UTC"}, "depends_on": [1]},
            {"id": 3, "kind": "llm", "target": "model", "instruction": "z", "depends_on": [1, 2, 2]}
        ]}))
        .unwrap();
        let p = g.plan;
        assert_eq!(p.summary, "t");
        let ids: Vec<&str> = p.steps.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["s1", "s2", "s3"]);
        // The target itself is not its own alternate; duplicates go.
        assert_eq!(p.steps[0].alternates, vec!["news"]);
        assert_eq!(p.steps[1].arguments, Some(json!({"tz": "UTC"})));
        assert_eq!(p.steps[2].depends_on, vec!["s1", "s2"]);
        // Older plans (a `summary`, no ids) read the same.
        let old = check(json!({"summary": "s", "steps": [
            {"kind": "llm", "target": "model", "instruction": "", "depends_on": []}
        ]}))
        .unwrap();
        assert_eq!(old.plan.summary, "s");
    }

    #[test]
    fn dependencies_must_name_earlier_steps() {
        let e = check(json!({"thought": "", "steps": [
            {"id": 1, "kind": "llm", "target": "model", "instruction": "", "depends_on": [1]},
            {"id": 2, "kind": "llm", "target": "model", "instruction": "", "depends_on": [3]},
            {"id": 3, "kind": "llm", "target": "model", "instruction": "", "depends_on": ["s1"]}
        ]}))
        .unwrap_err();
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(e.iter().all(|p| p.contains("earlier step")), "{e:?}");
    }

    #[test]
    fn unknown_targets_ids_and_kinds_are_refused() {
        let e = check(json!({"thought": "", "steps": [
            {"id": 1, "kind": "agent", "target": "http://169.254.169.254/", "instruction": "", "depends_on": []},
            {"id": 7, "kind": "function", "target": "rm_rf", "instruction": "", "depends_on": []},
            {"id": 3, "kind": "shell", "target": "x", "instruction": "", "depends_on": []},
            {"id": 4, "kind": "agent", "target": "news", "instruction": "", "depends_on": [], "alternates": ["ghost"]}
        ]}))
        .unwrap_err();
        let all = e.join("\n");
        for want in [
            "not a known agent target",
            "id must be 2",
            "not a known function target",
            "unknown kind 'shell'",
            "alternate 'ghost'",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
    }

    #[test]
    fn function_arguments_must_match_the_tool_schema() {
        let e = check(json!({"thought": "", "steps": [
            {"id": 1, "kind": "function", "target": "get_time", "instruction": "", "arguments": {"tz": 5}, "depends_on": []}
        ]}))
        .unwrap_err();
        assert!(e[0].contains("do not match the schema"), "{e:?}");
        let e = check(json!({"thought": "", "steps": [
            {"id": 1, "kind": "function", "target": "get_time", "instruction": "", "depends_on": []}
        ]}))
        .unwrap_err();
        assert!(e[0].contains("do not match the schema"), "{e:?}");
    }

    #[test]
    fn size_and_shape_limits() {
        let steps: Vec<Value> = (0..9)
            .map(|_| json!({"kind": "llm", "target": "model", "instruction": "", "depends_on": []}))
            .collect();
        let e = check(json!({"thought": "", "steps": steps})).unwrap_err();
        assert!(e[0].contains("at most 8"), "{e:?}");
        assert!(check(json!({"thought": "", "steps": []})).is_err());
        assert!(targets().validate("not json").is_err());
        assert!(targets().validate("{\"steps\": 3}").is_err());
    }

    #[test]
    fn tool_choice_is_held_by_the_guard() {
        let llm_only = json!({"thought": "", "steps": [
            {"id": 1, "kind": "llm", "target": "model", "instruction": "", "depends_on": []}
        ]})
        .to_string();
        let call = json!({"thought": "", "steps": [
            {"id": 1, "kind": "function", "target": "get_time", "instruction": "", "arguments": {"tz": "UTC"}, "depends_on": []}
        ]})
        .to_string();
        let required = Targets {
            demand: ToolDemand::Required,
            ..targets()
        };
        assert!(required.validate(&llm_only).unwrap_err()[0].contains("required"));
        assert!(required.validate(&call).is_ok());
        let named = Targets {
            demand: ToolDemand::Named("get_time".into()),
            ..targets()
        };
        assert!(named.validate(&llm_only).is_err());
        assert!(named.validate(&call).is_ok());
        let other = Targets {
            demand: ToolDemand::Named("other".into()),
            ..targets()
        };
        assert!(other.validate(&call).unwrap_err()[0].contains("not a known function"));
    }

    #[test]
    fn named_agents_are_consulted_unless_skipped_with_a_reason() {
        let t = Targets {
            agents: vec![
                agent("weather", true),
                agent("news", true),
                agent("found", false),
            ],
            tools: Vec::new(),
            demand: ToolDemand::Auto,
        };
        let plan = json!({"thought": "", "steps": [
            {"id": 1, "kind": "llm", "target": "model", "instruction": "", "depends_on": []}
        ], "skip": [{"agent": "news", "why": "not about news"}, {"agent": "weather", "why": " "}]});
        let g = t.validate(&plan.to_string()).unwrap();
        assert_eq!(
            g.skipped,
            vec![("news".to_owned(), "not about news".to_owned())]
        );
        assert_eq!(g.added, vec!["weather"]);
        let last = g.plan.steps.last().unwrap();
        assert_eq!((last.id.as_str(), last.target.as_str()), ("s2", "weather"));
        assert_eq!(last.instruction, ASK_THE_REQUEST);
    }

    #[test]
    fn the_default_plan_asks_named_agents_and_the_best_matches() {
        let t = Targets {
            agents: vec![
                agent("named", true),
                agent("best", false),
                agent("second", false),
                agent("third", false),
            ],
            tools: Vec::new(),
            demand: ToolDemand::Auto,
        };
        let p = t.default_plan(2, "the model could not plan");
        let targets: Vec<&str> = p.steps.iter().map(|s| s.target.as_str()).collect();
        assert_eq!(targets, ["named", "best", "second"]);
        assert!(
            p.steps.iter().all(|s| s.depends_on.is_empty()),
            "in parallel"
        );
        assert!(Targets::default().default_plan(2, "x").steps.is_empty());
        assert!(Plan::direct("x").steps.is_empty());
    }
}
