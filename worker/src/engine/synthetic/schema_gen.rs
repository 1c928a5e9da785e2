//! Generates a JSON instance of a JSON Schema: the synthetic engine's
//! stand-in for constrained decoding, used for tool arguments and for
//! `json_schema` structured output.
//!
//! Supported: `type` (one or a list), `enum`, `const`, objects (`properties`,
//! `required`, optional properties chosen deterministically, `minProperties`,
//! `additionalProperties: false` respected by never inventing keys), arrays
//! (`items`, `prefixItems`, `minItems`, `maxItems`, `uniqueItems`), strings
//! (`minLength`, `maxLength`, common `format`s), numbers and integers
//! (`minimum`, `maximum`, both kinds of exclusive bounds, `multipleOf`),
//! booleans, null, `anyOf`/`oneOf`, `allOf` (merged) and local `$ref`s
//! (`#/$defs/...`, `#/definitions/...`), as Pydantic emits. `pattern` is not
//! interpreted.
//!
//! Alternatives are covered, deterministically: an `anyOf`/`oneOf` takes
//! its first non-null branch, except in the i-th element of an array, which
//! takes the i-th (modulo their number); and an array whose elements have
//! such alternatives gets one element per branch (within its bounds). So a
//! planner's plan schema (one branch per agent, tool and the model, per
//! step) yields a plan that uses every target it offers.

use super::rng::Rng;
use serde_json::{Map, Number, Value};

/// Deepest nesting followed before answering with the smallest instance.
const MAX_DEPTH: usize = 12;

/// Cap on `minLength`/`minItems` honoured, so an absurd schema cannot make
/// the worker allocate without bound (the gateway's check then reports it).
const MAX_GENERATED: u64 = 100_000;

/// Generates an instance of `schema` (whose `$ref`s resolve against itself).
pub fn generate(schema: &Value, rng: &mut Rng) -> Value {
    Generator {
        root: schema,
        rng,
        element: None,
    }
    .value(schema, 0)
}

/// A JSON object for `json_object` output: a short answer and a few details.
pub fn generic_object(rng: &mut Rng) -> Value {
    let mut m = Map::new();
    let n = rng.range(4, 10) as usize;
    m.insert("answer".into(), Value::String(rng.words(n)));
    m.insert("confidence".into(), float(rng.range(50, 99) as f64 / 100.0));
    let items: Vec<Value> = (0..rng.range(1, 3))
        .map(|_| Value::String(rng.word().to_owned()))
        .collect();
    m.insert("items".into(), Value::Array(items));
    Value::Object(m)
}

struct Generator<'a, 'r> {
    root: &'a Value,
    rng: &'r mut Rng,
    /// The index of the array element being generated, while its own
    /// alternatives are chosen (not inside its properties).
    element: Option<usize>,
}

impl Generator<'_, '_> {
    fn value(&mut self, schema: &Value, depth: usize) -> Value {
        let obj = match schema {
            Value::Object(o) => o,
            Value::Bool(false) => return Value::Null,
            _ => return Value::String(self.rng.word().to_owned()),
        };
        if depth > MAX_DEPTH {
            return smallest(obj);
        }
        if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
            if let Some(target) = resolve_ref(self.root, r) {
                // Sibling keywords next to `$ref` (2019-09+) are merged in.
                let mut merged = match target {
                    Value::Object(t) => t.clone(),
                    _ => Map::new(),
                };
                for (k, v) in obj {
                    if k != "$ref" {
                        merged.insert(k.clone(), v.clone());
                    }
                }
                return self.value(&Value::Object(merged), depth + 1);
            }
        }
        if let Some(c) = obj.get("const") {
            return c.clone();
        }
        if let Some(Value::Array(options)) = obj.get("enum") {
            if !options.is_empty() {
                return options[self.rng.below(options.len())].clone();
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = obj.get(key) {
                let live: Vec<&Value> = branches
                    .iter()
                    .filter(|b| !is_null_schema(self.root, b))
                    .collect();
                let pick = match self.element.take() {
                    Some(i) if !live.is_empty() => Some(live[i % live.len()]),
                    _ => live.first().copied(),
                }
                .or(branches.first());
                if let Some(branch) = pick {
                    let mut merged = obj.clone();
                    merged.remove(key);
                    if let Value::Object(b) = deref(self.root, branch) {
                        merge_into(&mut merged, b);
                    }
                    return self.value(&Value::Object(merged), depth + 1);
                }
            }
        }
        if let Some(Value::Array(parts)) = obj.get("allOf") {
            let mut merged = obj.clone();
            merged.remove("allOf");
            for p in parts {
                if let Value::Object(po) = deref(self.root, p) {
                    merge_into(&mut merged, po);
                }
            }
            return self.value(&Value::Object(merged), depth + 1);
        }
        match schema_type(obj) {
            "object" => self.object(obj, depth),
            "array" => self.array(obj, depth),
            "string" => Value::String(string(self.rng, obj)),
            "integer" => integer(self.rng, obj),
            "number" => number(self.rng, obj),
            "boolean" => Value::Bool(self.rng.chance(50)),
            "null" => Value::Null,
            _ => Value::String(self.rng.word().to_owned()),
        }
    }

    fn object(&mut self, obj: &Map<String, Value>, depth: usize) -> Value {
        self.element = None;
        let empty = Map::new();
        let props = obj
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let min_props = obj
            .get("minProperties")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        let max_props = obj
            .get("maxProperties")
            .and_then(Value::as_u64)
            .map(|m| m as usize);
        let mut out = Map::new();
        for (name, schema) in props {
            let is_required = required.contains(&name.as_str());
            let room = max_props.is_none_or(|m| out.len() < m);
            let wanted = is_required
                || (room && (out.len() < min_props || (depth < 4 && self.rng.chance(60))));
            if wanted {
                let v = self.value(schema, depth + 1);
                out.insert(name.clone(), v);
            }
        }
        // Required names without a declared schema: any value will do.
        for name in &required {
            if !out.contains_key(*name) {
                out.insert(
                    (*name).to_owned(),
                    Value::String(self.rng.word().to_owned()),
                );
            }
        }
        // No declared properties and extra keys allowed: invent a few.
        let closed = matches!(obj.get("additionalProperties"), Some(Value::Bool(false)));
        if props.is_empty() && !closed {
            let extra = obj.get("additionalProperties").filter(|v| v.is_object());
            let n = min_props.max(if depth == 0 && extra.is_none() { 2 } else { 0 });
            let keys = ["answer", "detail", "note", "topic", "summary", "value"];
            for i in 0..n {
                let key = keys
                    .get(i)
                    .map(|k| (*k).to_owned())
                    .unwrap_or_else(|| format!("field_{i}"));
                let v = match extra {
                    Some(s) => self.value(s, depth + 1),
                    None => Value::String(self.rng.words(3)),
                };
                out.insert(key, v);
            }
        }
        Value::Object(out)
    }

    fn array(&mut self, obj: &Map<String, Value>, depth: usize) -> Value {
        let min = obj
            .get("minItems")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            .min(MAX_GENERATED);
        let max = obj.get("maxItems").and_then(Value::as_u64);
        let unique = obj.get("uniqueItems").and_then(Value::as_bool) == Some(true);
        let prefix: &[Value] = obj
            .get("prefixItems")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let items = obj.get("items");
        let mut want = if depth >= 6 {
            min
        } else {
            self.rng.range(1, 3).max(min)
        };
        // One element per alternative of the elements, so each is covered.
        let alternatives = prefix
            .iter()
            .chain(items)
            .map(|s| self.alternatives(s))
            .max()
            .unwrap_or(0);
        if depth < 6 {
            want = want.max(alternatives as u64);
        }
        if let Some(max) = max {
            want = want.min(max);
        }
        if items == Some(&Value::Bool(false)) || (items.is_none() && !prefix.is_empty()) {
            want = want
                .min(prefix.len() as u64)
                .max(min.min(prefix.len() as u64));
        }
        let mut out: Vec<Value> = Vec::new();
        let mut attempts = 0;
        while (out.len() as u64) < want && attempts < want * 8 + 8 {
            attempts += 1;
            let i = out.len();
            self.element = Some(i);
            let v = match (prefix.get(i), items) {
                (Some(s), _) => self.value(s, depth + 1),
                (None, Some(s)) => self.value(s, depth + 1),
                (None, None) => Value::String(self.rng.word().to_owned()),
            };
            self.element = None;
            if unique && out.contains(&v) {
                continue;
            }
            out.push(v);
        }
        Value::Array(out)
    }
}

impl Generator<'_, '_> {
    /// How many non-null `anyOf`/`oneOf` branches a schema offers.
    fn alternatives(&self, schema: &Value) -> usize {
        let schema = deref(self.root, schema);
        ["anyOf", "oneOf"]
            .iter()
            .filter_map(|k| schema.get(*k).and_then(Value::as_array))
            .map(|b| b.iter().filter(|s| !is_null_schema(self.root, s)).count())
            .max()
            .unwrap_or(0)
    }
}

/// The instance type a schema asks for (first non-null of a type list, or
/// inferred from the keywords present).
fn schema_type(obj: &Map<String, Value>) -> &str {
    match obj.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .or_else(|| ts.iter().filter_map(Value::as_str).next())
            .unwrap_or("string"),
        _ => {
            if obj.contains_key("properties")
                || obj.contains_key("required")
                || obj.contains_key("additionalProperties")
            {
                "object"
            } else if obj.contains_key("items") || obj.contains_key("prefixItems") {
                "array"
            } else if obj.contains_key("minimum") || obj.contains_key("maximum") {
                "number"
            } else {
                "string"
            }
        }
    }
}

/// The smallest instance of a schema, for the depth limit.
fn smallest(obj: &Map<String, Value>) -> Value {
    if let Some(c) = obj.get("const") {
        return c.clone();
    }
    if let Some(Value::Array(o)) = obj.get("enum") {
        if let Some(v) = o.first() {
            return v.clone();
        }
    }
    match schema_type(obj) {
        "object" => Value::Object(Map::new()),
        "array" => Value::Array(Vec::new()),
        "integer" | "number" => Value::from(0),
        "boolean" => Value::Bool(false),
        "null" => Value::Null,
        _ => Value::String(String::new()),
    }
}

fn string(rng: &mut Rng, obj: &Map<String, Value>) -> String {
    let min = obj
        .get("minLength")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .min(MAX_GENERATED) as usize;
    let max = obj
        .get("maxLength")
        .and_then(Value::as_u64)
        .map(|m| m as usize);
    let mut s = match obj.get("format").and_then(Value::as_str) {
        Some("date") => format!("2024-{:02}-{:02}", rng.range(1, 12), rng.range(1, 28)),
        Some("date-time") => format!(
            "2024-{:02}-{:02}T{:02}:{:02}:00Z",
            rng.range(1, 12),
            rng.range(1, 28),
            rng.range(0, 23),
            rng.range(0, 59)
        ),
        Some("time") => format!("{:02}:{:02}:00Z", rng.range(0, 23), rng.range(0, 59)),
        Some("email") => format!("{}@example.com", rng.word()),
        Some("uri") | Some("url") | Some("iri") => format!("https://example.com/{}", rng.word()),
        Some("hostname") => format!("{}.example.com", rng.word()),
        Some("ipv4") => format!("192.0.2.{}", rng.range(1, 254)),
        Some("ipv6") => "2001:db8::1".to_owned(),
        Some("uuid") => {
            let hex = |rng: &mut Rng, n: usize| -> String {
                (0..n)
                    .map(|_| char::from(b"0123456789abcdef"[rng.below(16)]))
                    .collect()
            };
            format!(
                "{}-{}-4{}-a{}-{}",
                hex(rng, 8),
                hex(rng, 4),
                hex(rng, 3),
                hex(rng, 3),
                hex(rng, 12)
            )
        }
        _ => {
            let n = rng.range(1, 4) as usize;
            rng.words(n)
        }
    };
    while s.chars().count() < min {
        s.push(' ');
        s.push_str(rng.word());
    }
    if let Some(max) = max {
        if s.chars().count() > max {
            s = s.chars().take(max).collect();
        }
    }
    // Padding may overshoot `min` only when `max` is absent, so both hold.
    while s.chars().count() < min {
        s.push('x');
    }
    s
}

/// Lower and upper bounds (inclusive) from `minimum`/`maximum` and both the
/// draft-4 (boolean) and draft-6+ (numeric) forms of the exclusive bounds.
fn bounds(obj: &Map<String, Value>, step: f64) -> (Option<f64>, Option<f64>) {
    let num = |k: &str| obj.get(k).and_then(Value::as_f64);
    let flag = |k: &str| obj.get(k).and_then(Value::as_bool) == Some(true);
    let mut lo = num("minimum");
    let mut hi = num("maximum");
    if flag("exclusiveMinimum") {
        lo = lo.map(|v| v + step);
    }
    if flag("exclusiveMaximum") {
        hi = hi.map(|v| v - step);
    }
    if let Some(x) = num("exclusiveMinimum") {
        lo = Some(lo.map_or(x + step, |l| l.max(x + step)));
    }
    if let Some(x) = num("exclusiveMaximum") {
        hi = Some(hi.map_or(x - step, |h| h.min(x - step)));
    }
    (lo, hi)
}

/// The default range when a bound is missing: 100 wide, starting at 0 when
/// that fits.
fn default_range(lo: Option<f64>, hi: Option<f64>) -> (f64, f64) {
    match (lo, hi) {
        (Some(l), Some(h)) => (l, h.max(l)),
        (Some(l), None) => (l, l + 100.0),
        (None, Some(h)) => ((h - 100.0).max(0.0f64.min(h)), h),
        (None, None) => (0.0, 100.0),
    }
}

fn integer(rng: &mut Rng, obj: &Map<String, Value>) -> Value {
    let (lo, hi) = bounds(obj, 1.0);
    let (lo, hi) = default_range(lo.map(f64::ceil), hi.map(f64::floor));
    // i128 so extreme bounds cannot overflow; `as` saturates at the i64 ends.
    let (lo, hi) = (i128::from(lo as i64), i128::from(hi as i64));
    let multiple = obj
        .get("multipleOf")
        .and_then(Value::as_f64)
        .filter(|m| *m >= 1.0 && m.fract() == 0.0)
        .map(|m| i128::from(m as i64));
    let pick = |rng: &mut Rng, first: i128, last: i128| -> i128 {
        if last <= first {
            return first;
        }
        let span = u64::try_from(last - first).unwrap_or(u64::MAX);
        first + i128::from(rng.range(0, span))
    };
    let v = match multiple {
        Some(m) => {
            let first = lo.div_euclid(m) + i128::from(lo.rem_euclid(m) != 0);
            let last = hi.div_euclid(m);
            pick(rng, first, last) * m
        }
        None => pick(rng, lo, hi),
    };
    i64::try_from(v).map_or(Value::from(lo as i64), Value::from)
}

fn number(rng: &mut Rng, obj: &Map<String, Value>) -> Value {
    if let Some(m) = obj.get("multipleOf").and_then(Value::as_f64) {
        if m > 0.0 {
            let (lo, hi) = bounds(obj, m);
            let (lo, hi) = default_range(lo, hi);
            let first = (lo / m).ceil() as i64;
            let last = (hi / m).floor() as i64;
            let k = first + rng.range(0, (last - first).max(0) as u64) as i64;
            let v = k as f64 * m;
            // Integral multiples print as integers, which validate exactly.
            return if v.fract() == 0.0 && v.abs() < 9e15 {
                Value::from(v as i64)
            } else {
                float(v)
            };
        }
    }
    let (lo, hi) = bounds(obj, 0.01);
    let (lo, hi) = default_range(lo, hi);
    let steps = ((hi - lo) * 100.0).floor().max(0.0) as u64;
    let v = lo + rng.range(0, steps) as f64 / 100.0;
    float(v.clamp(lo, hi))
}

fn float(v: f64) -> Value {
    Number::from_f64(v).map_or(Value::from(0), Value::Number)
}

fn resolve_ref<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    let pointer = r.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

fn deref<'a>(root: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => resolve_ref(root, r).unwrap_or(v),
        None => v,
    }
}

fn is_null_schema(root: &Value, v: &Value) -> bool {
    let v = deref(root, v);
    v.get("type").and_then(Value::as_str) == Some("null")
        || v.get("const").is_some_and(Value::is_null)
}

/// Merges schema keywords; `properties` and `required` are unioned.
fn merge_into(into: &mut Map<String, Value>, from: &Map<String, Value>) {
    for (k, v) in from {
        match (k.as_str(), into.get_mut(k), v) {
            ("properties", Some(Value::Object(a)), Value::Object(b)) => {
                for (pk, pv) in b {
                    a.insert(pk.clone(), pv.clone());
                }
            }
            ("required", Some(Value::Array(a)), Value::Array(b)) => {
                for r in b {
                    if !a.contains(r) {
                        a.push(r.clone());
                    }
                }
            }
            _ => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn assert_valid(schema: &Value, seeds: u64) {
        let validator = jsonschema::validator_for(schema).expect("test schema compiles");
        for seed in 0..seeds {
            let v = generate(schema, &mut Rng::new(seed));
            let errors: Vec<String> = validator.iter_errors(&v).map(|e| e.to_string()).collect();
            assert!(
                errors.is_empty(),
                "seed {seed}: {v} fails {schema}: {errors:?}"
            );
        }
    }

    #[test]
    fn weather_tool_arguments_validate() {
        assert_valid(
            &json!({
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                    "detailed": {"type": "boolean"}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            }),
            50,
        );
    }

    #[test]
    fn nested_arrays_bounds_and_formats_validate() {
        assert_valid(
            &json!({
                "type": "object",
                "properties": {
                    "items": {
                        "type": "array", "minItems": 2, "maxItems": 4, "uniqueItems": true,
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "minLength": 12, "maxLength": 20},
                                "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 5.5},
                                "qty": {"type": "integer", "multipleOf": 5, "minimum": 7, "maximum": 40},
                                "tags": {"type": "array", "items": {"type": "string", "format": "email"}}
                            },
                            "required": ["name", "price", "qty"],
                            "additionalProperties": false
                        }
                    },
                    "when": {"type": "string", "format": "date-time"},
                    "id": {"type": "string", "format": "uuid"},
                    "ratio": {"type": ["number", "null"], "minimum": -1, "maximum": 1},
                    "score": {"type": "number", "multipleOf": 0.5, "minimum": 1}
                },
                "required": ["items", "when", "id", "ratio", "score"],
                "additionalProperties": false
            }),
            50,
        );
    }

    #[test]
    fn pydantic_refs_optionals_and_all_of_validate() {
        assert_valid(
            &json!({
                "$defs": {
                    "Step": {
                        "properties": {
                            "explanation": {"title": "Explanation", "type": "string"},
                            "output": {"title": "Output", "type": "string"}
                        },
                        "required": ["explanation", "output"],
                        "title": "Step", "type": "object", "additionalProperties": false
                    },
                    "Kind": {"enum": ["a", "b"], "title": "Kind", "type": "string"}
                },
                "properties": {
                    "steps": {"items": {"$ref": "#/$defs/Step"}, "title": "Steps", "type": "array"},
                    "final_answer": {"title": "Final Answer", "type": "string"},
                    "kind": {"$ref": "#/$defs/Kind"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
                    "both": {"allOf": [
                        {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
                        {"properties": {"y": {"const": 3}}, "required": ["y"]}
                    ]},
                    "one": {"oneOf": [{"type": "null"}, {"type": "integer", "exclusiveMaximum": 0}]}
                },
                "required": ["steps", "final_answer", "kind", "note", "both", "one"],
                "title": "MathReasoning", "type": "object", "additionalProperties": false
            }),
            50,
        );
    }

    #[test]
    fn open_objects_and_recursive_refs_terminate_and_validate() {
        assert_valid(&json!({"type": "object"}), 10);
        assert_valid(&json!({}), 10);
        assert_valid(
            &json!({
                "$defs": {"Node": {"type": "object", "properties": {
                    "v": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
                }, "required": ["v", "children"]}},
                "$ref": "#/$defs/Node"
            }),
            20,
        );
    }

    #[test]
    fn extreme_integer_bounds_do_not_overflow() {
        assert_valid(
            &json!({"type": "integer", "minimum": -9.3e18, "maximum": 9.3e18}),
            20,
        );
        assert_valid(&json!({"type": "integer", "exclusiveMaximum": -5}), 10);
        assert_valid(
            &json!({"type": "integer", "multipleOf": 7, "minimum": -20}),
            10,
        );
    }

    /// A plan schema (one branch per target, per position) yields a plan
    /// that uses each target, whatever the seed.
    #[test]
    fn array_elements_cover_the_alternatives() {
        let branch = |t: &str| {
            json!({"type": "object", "properties": {"target": {"const": t}},
                   "required": ["target"], "additionalProperties": false})
        };
        let position = json!({"anyOf": [branch("a"), branch("b"), branch("model")]});
        let schema = json!({"type": "object", "properties": {"steps": {
            "type": "array", "minItems": 1, "maxItems": 3,
            "prefixItems": [position.clone(), position.clone(), position], "items": false
        }}, "required": ["steps"]});
        for seed in 0..10 {
            let v = generate(&schema, &mut Rng::new(seed));
            let targets: Vec<&str> = v["steps"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|s| s["target"].as_str())
                .collect();
            assert_eq!(targets, ["a", "b", "model"], "seed {seed}");
        }
        assert_valid(&schema, 10);
        // Outside an array: the first non-null branch.
        let optional = json!({"anyOf": [{"type": "null"}, {"const": 1}]});
        assert_eq!(generate(&optional, &mut Rng::new(1)), json!(1));
    }

    #[test]
    fn same_seed_same_instance() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "number"}}});
        assert_eq!(
            generate(&schema, &mut Rng::new(9)),
            generate(&schema, &mut Rng::new(9))
        );
        let obj = generic_object(&mut Rng::new(3));
        assert!(obj.get("answer").is_some_and(Value::is_string));
    }
}
