//! Plans: the JSON Schema a plan call is constrained by (per request: the
//! targets are an enum of the resolved agents and the caller's function
//! tools, a function step's `arguments` follow that tool's own schema),
//! and the validation of what the model wrote. Nothing a model writes is
//! trusted: the plan is checked (size, unique ids, known targets, a kind
//! that fits the target, arguments valid against the tool's schema,
//! dependencies that exist and form no cycle) before anything runs.

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
    /// The fallback: one `llm` step answering the request directly.
    pub fn single_llm(reason: &str) -> Plan {
        Plan {
            summary: format!("Answer directly ({reason})."),
            steps: vec![Step {
                id: "answer".into(),
                kind: StepKind::Llm,
                target: MODEL_TARGET.into(),
                instruction: "Answer the request directly.".into(),
                arguments: None,
                depends_on: Vec::new(),
                alternates: Vec::new(),
            }],
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
}

/// A caller's function tool a plan may target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolTarget {
    pub name: String,
    pub description: String,
    /// The tool's parameters schema (`{"type":"object"}` when none).
    pub parameters: Value,
}

/// Everything a plan may target.
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub agents: Vec<AgentTarget>,
    pub tools: Vec<ToolTarget>,
}

impl Targets {
    /// The JSON Schema of a plan for these targets.
    pub fn schema(&self) -> Value {
        let id = json!({"type": "string", "minLength": 1, "maxLength": 64});
        let ids = json!({"type": "array", "items": {"type": "string"}, "maxItems": MAX_PLAN_STEPS});
        let mut branches = Vec::new();
        if !self.agents.is_empty() {
            let names: Vec<&str> = self.agents.iter().map(|a| a.id.as_str()).collect();
            branches.push(json!({
                "type": "object",
                "properties": {
                    "id": id, "kind": {"const": "agent"}, "target": {"enum": names},
                    "instruction": {"type": "string"}, "depends_on": ids,
                    "alternates": {"type": "array", "items": {"enum": names}, "maxItems": 3}
                },
                "required": ["id", "kind", "target", "instruction", "depends_on"],
                "additionalProperties": false
            }));
        }
        for t in &self.tools {
            // A schema with references cannot be embedded (they would
            // resolve against the plan's root): its arguments are then
            // constrained to an object here and checked in `validate`.
            let arguments = if has_refs(&t.parameters) {
                json!({"type": "object"})
            } else {
                t.parameters.clone()
            };
            branches.push(json!({
                "type": "object",
                "properties": {
                    "id": id, "kind": {"const": "function"}, "target": {"const": t.name},
                    "instruction": {"type": "string"}, "arguments": arguments,
                    "depends_on": ids
                },
                "required": ["id", "kind", "target", "instruction", "arguments", "depends_on"],
                "additionalProperties": false
            }));
        }
        branches.push(json!({
            "type": "object",
            "properties": {
                "id": id, "kind": {"const": "llm"}, "target": {"const": MODEL_TARGET},
                "instruction": {"type": "string"}, "depends_on": ids
            },
            "required": ["id", "kind", "target", "instruction", "depends_on"],
            "additionalProperties": false
        }));
        json!({
            "type": "object",
            "properties": {
                "summary": {"type": "string"},
                "steps": {
                    "type": "array", "minItems": 1, "maxItems": MAX_PLAN_STEPS,
                    "items": {"anyOf": branches}
                }
            },
            "required": ["summary", "steps"],
            "additionalProperties": false
        })
    }

    /// Validates a model's plan text. `Err` lists every problem found, for
    /// the repair prompt.
    pub fn validate(&self, text: &str) -> Result<Plan, Vec<String>> {
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
            self.tools.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut ids = BTreeSet::new();
        let mut steps = Vec::new();
        for (i, s) in raw.steps.into_iter().enumerate() {
            let at = format!("steps[{i}]");
            let id = s.id.trim().to_owned();
            if id.is_empty() || id.len() > 64 {
                problems.push(format!("{at}: 'id' must be 1 to 64 characters"));
            } else if !ids.insert(id.clone()) {
                problems.push(format!("{at}: the id '{id}' is used twice"));
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
                    match jsonschema::validator_for(&tool.parameters) {
                        Ok(v) => {
                            if let Some(e) = v.iter_errors(&args).next() {
                                problems.push(format!(
                                    "{at}: the arguments do not match the schema of '{}': {e}",
                                    tool.name
                                ));
                            }
                        }
                        Err(e) => problems.push(format!(
                            "{at}: the schema of '{}' cannot be used: {e}",
                            tool.name
                        )),
                    }
                    arguments = Some(args);
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
                id,
                kind,
                target: if kind == StepKind::Llm {
                    MODEL_TARGET.into()
                } else {
                    s.target
                },
                instruction: s.instruction,
                arguments,
                depends_on: s.depends_on,
                alternates,
            });
        }
        for s in &steps {
            for d in &s.depends_on {
                if d == &s.id {
                    problems.push(format!("step '{}' depends on itself", s.id));
                } else if !ids.contains(d) {
                    problems.push(format!("step '{}' depends on an unknown step '{d}'", s.id));
                }
            }
        }
        if problems.is_empty() {
            if let Some(cycle) = find_cycle(&steps) {
                problems.push(format!(
                    "the steps depend on each other in a cycle: {cycle}"
                ));
            }
        }
        if problems.is_empty() {
            Ok(Plan {
                summary: raw.summary,
                steps,
            })
        } else {
            Err(problems)
        }
    }
}

/// Whether a schema uses `$ref` (or defines `$defs`/`definitions`).
fn has_refs(schema: &Value) -> bool {
    match schema {
        Value::Object(o) => o
            .iter()
            .any(|(k, v)| k == "$ref" || k == "$defs" || k == "definitions" || has_refs(v)),
        Value::Array(a) => a.iter().any(has_refs),
        _ => false,
    }
}

/// A plan as the model wrote it, before validation.
#[derive(Deserialize)]
struct RawPlan {
    #[serde(default)]
    summary: String,
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
struct RawStep {
    #[serde(default)]
    id: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    target: String,
    #[serde(default)]
    instruction: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    alternates: Vec<String>,
}

/// A dependency cycle (`a → b → a`), if the steps have one.
fn find_cycle(steps: &[Step]) -> Option<String> {
    let index: BTreeMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    // 0 = unvisited, 1 = on the path, 2 = done.
    let mut mark = vec![0u8; steps.len()];
    fn visit(
        i: usize,
        steps: &[Step],
        index: &BTreeMap<&str, usize>,
        mark: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        mark[i] = 1;
        path.push(i);
        for d in &steps[i].depends_on {
            let Some(&j) = index.get(d.as_str()) else {
                continue;
            };
            if mark[j] == 1 {
                let start = path.iter().position(|&p| p == j).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(j);
                return Some(cycle);
            }
            if mark[j] == 0 {
                if let Some(c) = visit(j, steps, index, mark, path) {
                    return Some(c);
                }
            }
        }
        path.pop();
        mark[i] = 2;
        None
    }
    for i in 0..steps.len() {
        if mark[i] == 0 {
            let mut path = Vec::new();
            if let Some(c) = visit(i, steps, &index, &mut mark, &mut path) {
                let names: Vec<&str> = c.iter().map(|&k| steps[k].id.as_str()).collect();
                return Some(names.join(" → "));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            agents: vec![
                AgentTarget {
                    id: "weather".into(),
                    summary: String::new(),
                },
                AgentTarget {
                    id: "news".into(),
                    summary: String::new(),
                },
            ],
            tools: vec![ToolTarget {
                name: "get_time".into(),
                description: String::new(),
                parameters: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"], "additionalProperties": false}),
            }],
        }
    }

    fn check(plan: Value) -> Result<Plan, Vec<String>> {
        targets().validate(&plan.to_string())
    }

    #[test]
    fn a_good_plan_validates() {
        let p = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "agent", "target": "weather", "instruction": "x", "depends_on": [], "alternates": ["news", "weather"]},
            {"id": "b", "kind": "function", "target": "get_time", "instruction": "y", "arguments": {"tz": "UTC"}, "depends_on": ["a"]},
            {"id": "c", "kind": "llm", "target": "model", "instruction": "z", "depends_on": ["a", "b"]}
        ]}))
        .unwrap();
        assert_eq!(p.steps.len(), 3);
        // The target itself is not its own alternate.
        assert_eq!(p.steps[0].alternates, vec!["news"]);
        assert_eq!(p.steps[1].arguments, Some(json!({"tz": "UTC"})));
        // The schema constrains what the model may write and accepts the plan.
        let schema = targets().schema();
        let plan = json!({"summary": "s", "steps": [
            {"id": "a", "kind": "agent", "target": "weather", "instruction": "x", "depends_on": []},
            {"id": "b", "kind": "function", "target": "get_time", "instruction": "y", "arguments": {"tz": "UTC"}, "depends_on": ["a"]}
        ]});
        assert!(jsonschema::is_valid(&schema, &plan));
        let bad = json!({"summary": "s", "steps": [{"id": "a", "kind": "agent", "target": "evil", "instruction": "x", "depends_on": []}]});
        assert!(!jsonschema::is_valid(&schema, &bad));
    }

    #[test]
    fn cycles_are_refused() {
        let e = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "llm", "target": "model", "instruction": "", "depends_on": ["c"]},
            {"id": "b", "kind": "llm", "target": "model", "instruction": "", "depends_on": ["a"]},
            {"id": "c", "kind": "llm", "target": "model", "instruction": "", "depends_on": ["b"]}
        ]}))
        .unwrap_err();
        assert!(e.iter().any(|p| p.contains("cycle")), "{e:?}");
        let e = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "llm", "target": "model", "instruction": "", "depends_on": ["a"]}
        ]}))
        .unwrap_err();
        assert!(e.iter().any(|p| p.contains("itself")), "{e:?}");
    }

    #[test]
    fn unknown_targets_ids_and_kinds_are_refused() {
        let e = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "agent", "target": "http://169.254.169.254/", "instruction": "", "depends_on": []},
            {"id": "a", "kind": "function", "target": "rm_rf", "instruction": "", "depends_on": ["zz"]},
            {"id": "c", "kind": "shell", "target": "x", "instruction": "", "depends_on": []},
            {"id": "d", "kind": "agent", "target": "news", "instruction": "", "depends_on": [], "alternates": ["ghost"]}
        ]}))
        .unwrap_err();
        let all = e.join("\n");
        for want in [
            "not a known agent target",
            "used twice",
            "not a known function target",
            "unknown step 'zz'",
            "unknown kind 'shell'",
            "alternate 'ghost'",
        ] {
            assert!(all.contains(want), "{want}: {all}");
        }
    }

    #[test]
    fn function_arguments_must_match_the_tool_schema() {
        let e = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "function", "target": "get_time", "instruction": "", "arguments": {"tz": 5}, "depends_on": []}
        ]}))
        .unwrap_err();
        assert!(e[0].contains("do not match the schema"), "{e:?}");
        let e = check(json!({"summary": "s", "steps": [
            {"id": "a", "kind": "function", "target": "get_time", "instruction": "", "depends_on": []}
        ]}))
        .unwrap_err();
        assert!(e[0].contains("do not match the schema"), "{e:?}");
    }

    #[test]
    fn size_and_shape_limits() {
        let steps: Vec<Value> = (0..9)
            .map(|i| json!({"id": format!("s{i}"), "kind": "llm", "target": "model", "instruction": "", "depends_on": []}))
            .collect();
        let e = check(json!({"summary": "s", "steps": steps})).unwrap_err();
        assert!(e[0].contains("at most 8"), "{e:?}");
        assert!(check(json!({"summary": "s", "steps": []})).is_err());
        assert!(targets().validate("not json").is_err());
        assert!(targets().validate("{\"steps\": 3}").is_err());
    }

    #[test]
    fn tool_schemas_with_references_are_checked_but_not_embedded() {
        let t = Targets {
            agents: Vec::new(),
            tools: vec![ToolTarget {
                name: "f".into(),
                description: String::new(),
                parameters: json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                    "required": ["p"], "$defs": {"P": {"type": "integer"}}}),
            }],
        };
        let schema = t.schema();
        assert_eq!(
            schema["properties"]["steps"]["items"]["anyOf"][0]["properties"]["arguments"],
            json!({"type": "object"})
        );
        let step = |args: Value| {
            json!({"summary": "s", "steps": [{"id": "a", "kind": "function", "target": "f", "instruction": "", "arguments": args, "depends_on": []}]}).to_string()
        };
        assert!(t.validate(&step(json!({"p": 3}))).is_ok());
        assert!(t.validate(&step(json!({"p": "x"}))).is_err());
    }

    #[test]
    fn schema_without_agents_or_tools_offers_llm_steps_only() {
        let s = Targets::default().schema();
        assert_eq!(
            s["properties"]["steps"]["items"]["anyOf"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(Plan::single_llm("x").steps[0].kind, StepKind::Llm);
    }
}
