//! The plan call's constraint, built per request so that every output it
//! admits is a valid plan, and bounded so that every plan call ends with a
//! complete object:
//!
//! - steps are identified by position: the i-th step's `id` is the
//!   constant `i` and its `depends_on` may only name earlier positions, so
//!   unknown, self and circular dependencies cannot be written;
//! - targets are constants of the run's actual agents and the caller's
//!   tools (one branch per target), so an unknown target cannot be written;
//! - text fields are printable ASCII without quotes or backslashes (nothing
//!   to escape: one byte, so at most one token, per character) with a
//!   `maxLength`; arrays have a `maxItems`; the worker writes the JSON
//!   without free whitespace;
//! - `tool_choice` shapes the first step: `required` makes it a function
//!   step, a named function makes it that function (and no other function
//!   may be called); `none` leaves the tools out altogether.
//!
//! [`PlanGrammar::max_tokens`] is the length in bytes of the longest
//! output the schema admits, an upper bound of its tokens (every token is
//! at least one byte): the plan call's output cap. The number of steps is
//! reduced until that bound fits the configured `max_plan_tokens`.

use super::plan::{Targets, ToolDemand, MAX_PLAN_STEPS, MODEL_TARGET};
use serde_json::{json, Map, Value};

/// Characters of the plan's `thought`. Small models fill text fields to
/// their limit (SmolLM2 repeats itself), so the limits are short.
pub const THOUGHT_CHARS: usize = 40;
/// Characters of a step's `instruction` (the step also gets the request).
pub const INSTRUCTION_CHARS: usize = 60;
/// Characters of the reason a named agent is not consulted.
pub const REASON_CHARS: usize = 60;
/// Alternates of one agent step.
pub const MAX_ALTERNATES: usize = 2;
/// Printable ASCII less `"` and `\`: nothing in it needs escaping.
pub const TEXT_PATTERN: &str = r"^[ !#-\[\]-~]*$";
/// A string in a tool's arguments without a `maxLength` gets this one in
/// the constraint (the caller's own schema still judges the arguments).
const ARGUMENT_CHARS: u64 = 64;
/// An array in a tool's arguments without a `maxItems` gets this one.
const ARGUMENT_ITEMS: u64 = 8;
/// What a part of a schema without a bound (a free-form object, a
/// number's digits) is counted as.
const UNBOUNDED_BYTES: usize = 256;
/// Bytes a JSON string's character may take when it is not limited to
/// [`TEXT_PATTERN`] (`\uXXXX`).
const ESCAPED_CHAR_BYTES: usize = 6;
/// The end-of-sequence token after the object, and a margin.
const END_TOKENS: usize = 4;

/// The schema of one plan call and the output cap that holds it.
#[derive(Debug, Clone)]
pub struct PlanGrammar {
    pub schema: Value,
    /// Most steps the schema admits.
    pub steps: usize,
    /// Output tokens of the longest plan the schema admits.
    pub max_tokens: u32,
}

impl PlanGrammar {
    /// The grammar for `targets`, with as many steps (up to one per target
    /// and one model step, at most [`MAX_PLAN_STEPS`]) as fit `budget`
    /// tokens; never fewer than one step, even when one step's bound is
    /// over the budget (then the bound, not the budget, is the cap).
    pub fn new(targets: &Targets, budget: u32) -> PlanGrammar {
        let wanted =
            (targets.agents.len() + targets.offered_tools().count() + 1).clamp(1, MAX_PLAN_STEPS);
        let mut steps = wanted;
        loop {
            let schema = schema(targets, steps);
            let max_tokens = output_cap(&schema);
            if max_tokens <= budget || steps == 1 {
                return PlanGrammar {
                    schema,
                    steps,
                    max_tokens,
                };
            }
            steps -= 1;
        }
    }
}

/// The output cap of a call constrained by `schema`: its longest output
/// and the end of the sequence.
pub fn output_cap(schema: &Value) -> u32 {
    u32::try_from(longest_output(schema) + END_TOKENS).unwrap_or(u32::MAX)
}

/// A text field of at most `max` characters (`min` at least).
fn text(min: usize, max: usize) -> Value {
    json!({"type": "string", "minLength": min, "maxLength": max, "pattern": TEXT_PATTERN})
}

/// The plan's schema with `steps` positions.
fn schema(targets: &Targets, steps: usize) -> Value {
    let positions: Vec<Value> = (0..steps).map(|i| position(targets, i)).collect();
    let mut properties = Map::new();
    properties.insert("thought".into(), text(0, THOUGHT_CHARS));
    properties.insert(
        "steps".into(),
        json!({"type": "array", "minItems": 1, "maxItems": steps,
               "prefixItems": positions, "items": false}),
    );
    let named: Vec<&str> = targets
        .agents
        .iter()
        .filter(|a| a.named)
        .map(|a| a.id.as_str())
        .collect();
    if !named.is_empty() {
        properties.insert(
            "skip".into(),
            json!({"type": "array", "maxItems": named.len(), "items": {
                "type": "object",
                "properties": {"agent": {"enum": named}, "why": text(1, REASON_CHARS)},
                "required": ["agent", "why"],
                "additionalProperties": false
            }}),
        );
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": ["thought", "steps"],
        "additionalProperties": false
    })
}

/// The schema of the step at 0-based position `i`: one branch per target.
fn position(targets: &Targets, i: usize) -> Value {
    let id = i + 1;
    let depends_on = if i == 0 {
        json!({"type": "array", "maxItems": 0})
    } else {
        let earlier: Vec<usize> = (1..id).collect();
        json!({"type": "array", "items": {"enum": earlier}, "maxItems": i})
    };
    // Property order is the order the model writes in: what and whom
    // first, then the instruction, the arguments, what it waits for.
    let step = |kind: &str, target: &str, arguments: Option<Value>, alternates: Option<Value>| {
        let mut properties = Map::new();
        properties.insert("id".into(), json!({"const": id}));
        properties.insert("kind".into(), json!({"const": kind}));
        properties.insert("target".into(), json!({"const": target}));
        properties.insert("instruction".into(), text(0, INSTRUCTION_CHARS));
        let mut required = vec!["id", "kind", "target", "instruction"];
        if let Some(a) = arguments {
            properties.insert("arguments".into(), a);
            required.push("arguments");
        }
        properties.insert("depends_on".into(), depends_on.clone());
        required.push("depends_on");
        if let Some(a) = alternates {
            properties.insert("alternates".into(), a);
        }
        json!({"type": "object", "properties": properties, "required": required,
               "additionalProperties": false})
    };
    let first_must_call = i == 0 && !matches!(targets.demand, ToolDemand::Auto);
    let mut branches = Vec::new();
    if !first_must_call {
        for a in &targets.agents {
            let others: Vec<&str> = targets
                .agents
                .iter()
                .filter(|o| o.id != a.id)
                .map(|o| o.id.as_str())
                .collect();
            let alternates = (!others.is_empty()).then(|| {
                json!({"type": "array", "items": {"enum": others},
                       "maxItems": MAX_ALTERNATES.min(others.len())})
            });
            branches.push(step("agent", &a.id, None, alternates));
        }
    }
    for t in targets.offered_tools() {
        branches.push(step(
            "function",
            &t.name,
            Some(bounded_arguments(&t.parameters)),
            None,
        ));
    }
    // With agents to ask, an `llm` step works on earlier steps' results:
    // the model alone is the synthesis's job, and a small model offered
    // free-standing model steps writes several, each to its token cap.
    // Without agents a first `llm` step is how a plan declines the tools.
    if i > 0 && !targets.agents.is_empty() {
        let mut llm = step("llm", MODEL_TARGET, None, None);
        llm["properties"]["depends_on"]["minItems"] = json!(1);
        branches.push(llm);
    } else if branches.is_empty() || (!first_must_call && targets.agents.is_empty()) {
        branches.push(step("llm", MODEL_TARGET, None, None));
    }
    json!({"anyOf": branches})
}

/// A tool's parameters as the plan's constraint: strings and arrays
/// without a bound get one ([`ARGUMENT_CHARS`], [`ARGUMENT_ITEMS`]), so a
/// small model cannot write one forever. Schemas with references are
/// constrained to an object here (their references would resolve against
/// the plan's root) and checked against the tool's schema by the guard.
pub fn bounded_arguments(parameters: &Value) -> Value {
    if has_refs(parameters) {
        return json!({"type": "object"});
    }
    let mut schema = parameters.clone();
    bound(&mut schema);
    schema
}

fn bound(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    let literal = map.contains_key("enum") || map.contains_key("const");
    let types: Vec<String> = types_of(map).into_iter().map(str::to_owned).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    if !literal && has("string") && !map.contains_key("maxLength") {
        let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0);
        map.insert("maxLength".into(), json!(min.max(ARGUMENT_CHARS)));
    }
    if !literal && has("array") && !map.contains_key("maxItems") {
        let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        map.insert("maxItems".into(), json!(min.max(ARGUMENT_ITEMS)));
    }
    for (key, value) in map.iter_mut() {
        match key.as_str() {
            "properties" => {
                if let Value::Object(children) = value {
                    children.values_mut().for_each(bound);
                }
            }
            "items" | "additionalProperties" => bound(value),
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(children) = value {
                    children.iter_mut().for_each(bound);
                }
            }
            _ => {}
        }
    }
}

/// The types a schema object admits (from `type`, or implied by keywords).
fn types_of(map: &Map<String, Value>) -> Vec<&str> {
    match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ if map.contains_key("properties") => vec!["object"],
        _ if map.contains_key("items") || map.contains_key("prefixItems") => vec!["array"],
        _ => Vec::new(),
    }
}

/// Whether a schema uses `$ref` (or defines `$defs`/`definitions`).
pub fn has_refs(schema: &Value) -> bool {
    match schema {
        Value::Object(o) => o
            .iter()
            .any(|(k, v)| k == "$ref" || k == "$defs" || k == "definitions" || has_refs(v)),
        Value::Array(a) => a.iter().any(has_refs),
        _ => false,
    }
}

/// Bytes of the longest JSON an instance of `schema` can take as the
/// worker writes it (separators `", "` and `": "`, no other whitespace).
/// Parts without a bound count [`UNBOUNDED_BYTES`].
pub fn longest_output(schema: &Value) -> usize {
    let map = match schema {
        Value::Object(m) => m,
        Value::Bool(false) => return 0,
        _ => return UNBOUNDED_BYTES,
    };
    if let Some(c) = map.get("const") {
        return literal_len(c);
    }
    if let Some(Value::Array(options)) = map.get("enum") {
        return options.iter().map(literal_len).max().unwrap_or(0);
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = map.get(key) {
            return branches.iter().map(longest_output).max().unwrap_or(0);
        }
    }
    let types = types_of(map);
    if types.is_empty() {
        return UNBOUNDED_BYTES;
    }
    types
        .iter()
        .map(|t| match *t {
            "string" => string_len(map),
            "integer" => integer_len(map),
            "number" => UNBOUNDED_BYTES.min(32),
            "boolean" => 5,
            "null" => 4,
            "array" => array_len(map),
            "object" => object_len(map),
            _ => UNBOUNDED_BYTES,
        })
        .max()
        .unwrap_or(UNBOUNDED_BYTES)
}

fn literal_len(v: &Value) -> usize {
    // serde_json writes no whitespace; the worker's separators add a space.
    let compact = v.to_string().len();
    match v {
        Value::Array(a) => compact + a.len().saturating_sub(1),
        Value::Object(o) => compact + o.len().saturating_sub(1) + o.len(),
        _ => compact,
    }
}

fn string_len(map: &Map<String, Value>) -> usize {
    let Some(max) = map.get("maxLength").and_then(Value::as_u64) else {
        return UNBOUNDED_BYTES;
    };
    let per_char = if map.get("pattern").and_then(Value::as_str) == Some(TEXT_PATTERN) {
        1
    } else {
        ESCAPED_CHAR_BYTES
    };
    2 + usize::try_from(max).unwrap_or(usize::MAX / 8) * per_char
}

fn integer_len(map: &Map<String, Value>) -> usize {
    let digits = |k: &str| {
        map.get(k)
            .and_then(Value::as_f64)
            .map(|v| format!("{}", v.trunc() as i64).len())
    };
    match (digits("minimum"), digits("maximum")) {
        (Some(a), Some(b)) => a.max(b),
        // An unbounded integer: as many digits as an i64.
        _ => 20,
    }
}

fn array_len(map: &Map<String, Value>) -> usize {
    let prefix: &[Value] = map
        .get("prefixItems")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let items = map.get("items");
    let max = map
        .get("maxItems")
        .and_then(Value::as_u64)
        .map(|m| m as usize);
    let count = match (max, items) {
        (Some(m), _) => m,
        (None, Some(Value::Bool(false))) => prefix.len(),
        (None, None) if !prefix.is_empty() => return UNBOUNDED_BYTES,
        (None, _) => return UNBOUNDED_BYTES,
    };
    let item = items.map_or(UNBOUNDED_BYTES, longest_output);
    let mut total = 2;
    for k in 0..count {
        total += match prefix.get(k) {
            Some(p) => longest_output(p),
            None => item,
        };
    }
    total + 2 * count.saturating_sub(1)
}

fn object_len(map: &Map<String, Value>) -> usize {
    let empty = Map::new();
    let props = map
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut total = 2;
    for (name, schema) in props {
        // `"name": value`
        total += name.len() + 4 + longest_output(schema);
    }
    total += 2 * props.len().saturating_sub(1);
    let closed = matches!(map.get("additionalProperties"), Some(Value::Bool(false)));
    // The worker closes objects that list properties (see its
    // `close_objects`); an object without properties is free-form.
    if !closed && props.is_empty() {
        total += UNBOUNDED_BYTES;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::plan::tests::agent;
    use crate::run::plan::ToolTarget;

    fn tool(name: &str) -> ToolTarget {
        ToolTarget {
            name: name.into(),
            description: String::new(),
            parameters: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}),
        }
    }

    fn targets(agents: usize, tools: usize, demand: ToolDemand) -> Targets {
        Targets {
            agents: (0..agents)
                .map(|i| agent(&format!("agent{i}"), i == 0))
                .collect(),
            tools: (0..tools).map(|i| tool(&format!("tool{i}"))).collect(),
            demand,
        }
    }

    /// Every instance of the longest shape, written with the worker's
    /// separators, is within the bound.
    #[test]
    fn the_bound_holds_the_longest_plan() {
        let t = targets(2, 1, ToolDemand::Auto);
        let g = PlanGrammar::new(&t, 100_000);
        assert_eq!(g.steps, 4, "one per target and a model step");
        let long = "x".repeat(INSTRUCTION_CHARS);
        let step = |id: usize, deps: Vec<usize>| {
            json!({"id": id, "kind": "agent", "target": "agent1", "instruction": long,
                   "depends_on": deps, "alternates": ["agent0"]})
        };
        let plan = json!({"thought": "y".repeat(THOUGHT_CHARS), "steps": [
            step(1, vec![]), step(2, vec![1]), step(3, vec![1, 2]), step(4, vec![1, 2, 3])
        ], "skip": [{"agent": "agent0", "why": "z".repeat(REASON_CHARS)}]});
        assert!(jsonschema::is_valid(&g.schema, &plan), "{plan}");
        let written = plan
            .to_string()
            .replace("\",\"", "\", \"")
            .replace("\":", "\": ");
        assert!(
            written.len() <= g.max_tokens as usize,
            "{} > {}",
            written.len(),
            g.max_tokens
        );
    }

    #[test]
    fn positions_admit_only_earlier_dependencies_and_offered_targets() {
        let t = targets(2, 1, ToolDemand::Auto);
        let g = PlanGrammar::new(&t, 100_000);
        let ok = json!({"thought": "", "steps": [
            {"id": 1, "kind": "agent", "target": "agent0", "instruction": "a", "depends_on": []},
            {"id": 2, "kind": "llm", "target": "model", "instruction": "b", "depends_on": [1]}
        ]});
        assert!(jsonschema::is_valid(&g.schema, &ok));
        for bad in [
            // Itself.
            json!([{"id": 1, "kind": "llm", "target": "model", "instruction": "", "depends_on": [1]}]),
            // A later step.
            json!([{"id": 1, "kind": "llm", "target": "model", "instruction": "", "depends_on": [2]},
                   {"id": 2, "kind": "llm", "target": "model", "instruction": "", "depends_on": []}]),
            // An unknown target.
            json!([{"id": 1, "kind": "agent", "target": "evil", "instruction": "", "depends_on": []}]),
            // A wrong id.
            json!([{"id": 3, "kind": "llm", "target": "model", "instruction": "", "depends_on": []}]),
            // Text to escape.
            json!([{"id": 1, "kind": "llm", "target": "model", "instruction": "a\"b", "depends_on": []}]),
            // Empty.
            json!([]),
        ] {
            let plan = json!({"thought": "", "steps": bad});
            assert!(!jsonschema::is_valid(&g.schema, &plan), "{plan}");
        }
    }

    #[test]
    fn with_agents_model_steps_work_on_earlier_results() {
        let llm = |id: usize, deps: Vec<usize>| json!({"id": id, "kind": "llm", "target": "model", "instruction": "", "depends_on": deps});
        let ask = json!({"id": 1, "kind": "agent", "target": "agent0", "instruction": "", "depends_on": []});
        let g = PlanGrammar::new(&targets(1, 1, ToolDemand::Auto), 100_000);
        for (steps, valid) in [
            (json!([llm(1, vec![])]), false),
            (json!([ask.clone(), llm(2, vec![])]), false),
            (json!([ask.clone(), llm(2, vec![1])]), true),
        ] {
            let plan = json!({"thought": "", "steps": steps});
            assert_eq!(jsonschema::is_valid(&g.schema, &plan), valid, "{plan}");
        }
        // Without agents, a first model step declines the tools.
        let g = PlanGrammar::new(&targets(0, 1, ToolDemand::Auto), 100_000);
        let plan = json!({"thought": "", "steps": [llm(1, vec![])]});
        assert!(jsonschema::is_valid(&g.schema, &plan), "{plan}");
    }

    #[test]
    fn tool_choice_shapes_the_first_step() {
        let required = PlanGrammar::new(&targets(1, 2, ToolDemand::Required), 100_000);
        let first = &required.schema["properties"]["steps"]["prefixItems"][0]["anyOf"];
        let kinds: Vec<&Value> = first
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["properties"]["kind"]["const"])
            .collect();
        assert_eq!(kinds, vec!["function", "function"]);
        let named = Targets {
            demand: ToolDemand::Named("tool1".into()),
            ..targets(1, 2, ToolDemand::Auto)
        };
        let g = PlanGrammar::new(&named, 100_000);
        let text = g.schema.to_string();
        assert!(
            text.contains("\"tool1\"") && !text.contains("\"tool0\""),
            "{text}"
        );
        let second = &g.schema["properties"]["steps"]["prefixItems"][1]["anyOf"];
        assert_eq!(second.as_array().unwrap().len(), 3, "agent, tool1, model");
    }

    #[test]
    fn the_budget_shrinks_the_plan_not_the_bound() {
        let t = targets(4, 3, ToolDemand::Auto);
        let roomy = PlanGrammar::new(&t, 100_000);
        assert_eq!(roomy.steps, MAX_PLAN_STEPS);
        let tight = PlanGrammar::new(&t, roomy.max_tokens / 2);
        assert!(tight.steps < roomy.steps);
        assert!(tight.max_tokens <= roomy.max_tokens / 2);
        let tiny = PlanGrammar::new(&t, 1);
        assert_eq!(tiny.steps, 1);
        assert!(tiny.max_tokens > 1, "the bound, not the budget");
    }

    #[test]
    fn tool_arguments_get_bounds_and_references_are_not_embedded() {
        let b = bounded_arguments(&json!({"type": "object", "properties": {
            "q": {"type": "string", "minLength": 100},
            "tags": {"type": "array", "items": {"type": "string"}},
            "unit": {"type": "string", "enum": ["c", "f"]}
        }}));
        assert_eq!(b["properties"]["q"]["maxLength"], 100);
        assert_eq!(b["properties"]["tags"]["maxItems"], ARGUMENT_ITEMS);
        assert_eq!(
            b["properties"]["tags"]["items"]["maxLength"],
            ARGUMENT_CHARS
        );
        assert!(b["properties"]["unit"].get("maxLength").is_none());
        let refs = json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
                          "$defs": {"P": {"type": "integer"}}});
        assert_eq!(bounded_arguments(&refs), json!({"type": "object"}));
    }
}
