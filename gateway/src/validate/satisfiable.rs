//! Schemas that admit no JSON value at all. A model constrained by one can
//! only fail (the output check's 500, which a client retries in vain), so
//! the request is refused up front with a 400 instead. Only contradictions
//! that are certain without solving the schema are reported; anything
//! subtler is left to the worker.
//!
//! The walk follows what every value must satisfy: `allOf`, local `$ref`s,
//! required properties, the items of an array that must have some, and
//! `anyOf`/`oneOf` when no branch is possible. A `$ref` that comes back to
//! a schema it is already inside, one property or item deeper, asks for an
//! infinitely deep value: no finite one satisfies it.

use serde_json::{Map, Value};

/// Deepest level followed: real schemas nest far less (the public API
/// allows 10 levels), and this bounds the walk of a hostile one.
const MAX_DEPTH: usize = 32;

/// Most subschemas looked at: `$ref`s can make a small schema a large
/// (even exponential) walk, and beyond this the walk gives up (it then
/// reports nothing, as for anything it is not certain of).
const MAX_STEPS: usize = 10_000;

/// A lower bound on a count (`minItems`, `minLength`, `minProperties`)
/// that no reply can reach: a reply is bounded by the model's window,
/// far below 2^32 characters.
const MAX_COUNT: f64 = u32::MAX as f64;

/// Where a schema admits no value, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsatisfiable {
    /// A JSON pointer into the schema: the subschema, then the keyword
    /// that makes it impossible (`/properties/a/minItems`).
    pub pointer: String,
    pub why: String,
}

impl Unsatisfiable {
    /// The pointer as a dot path below the schema's own `param`
    /// (`properties.a.minItems`), empty at the root.
    pub fn dot_path(&self) -> String {
        self.pointer
            .split('/')
            .skip(1)
            .map(|s| s.replace("~1", "/").replace("~0", "~"))
            .collect::<Vec<_>>()
            .join(".")
    }
}

impl std::fmt::Display for Unsatisfiable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() {
            "/"
        } else {
            &self.pointer
        };
        write!(f, "{} (at '{at}')", self.why)
    }
}

/// Why `schema` admits no value, if it certainly admits none.
pub fn unsatisfiable(schema: &Value) -> Option<Unsatisfiable> {
    let mut walk = Walk {
        root: schema,
        path: String::new(),
        refs: Vec::new(),
        nesting: 0,
        steps: MAX_STEPS,
    };
    walk.at(schema, 0)
}

struct Walk<'a> {
    root: &'a Value,
    /// The JSON pointer of the subschema being looked at.
    path: String,
    /// The `$ref` targets being followed, with the value nesting at which
    /// each was entered.
    refs: Vec<(&'a str, usize)>,
    /// How many properties or items deep the value being described is.
    nesting: usize,
    /// Subschemas left to look at ([`MAX_STEPS`]).
    steps: usize,
}

impl<'a> Walk<'a> {
    fn found(&self, keyword: &str, why: impl Into<String>) -> Option<Unsatisfiable> {
        let mut pointer = self.path.clone();
        if !keyword.is_empty() {
            pointer.push('/');
            pointer.push_str(keyword);
        }
        Some(Unsatisfiable {
            pointer,
            why: why.into(),
        })
    }

    fn at(&mut self, schema: &'a Value, depth: usize) -> Option<Unsatisfiable> {
        let obj = match schema {
            Value::Bool(false) => return self.found("", "the schema `false` admits no value"),
            Value::Object(o) => o,
            _ => return None,
        };
        if depth > MAX_DEPTH || self.steps == 0 {
            return None;
        }
        self.steps -= 1;
        if let Some(why) = self.contradiction(obj) {
            return Some(why);
        }
        if types(self.root, schema, 0, &mut self.steps) == 0 {
            let keyword = if obj.contains_key("allOf") {
                "allOf"
            } else {
                "$ref"
            };
            return self.found(
                keyword,
                "the types its subschemas allow have none in common",
            );
        }
        if let Some(why) = self.reference(obj, depth) {
            return Some(why);
        }
        // Subschemas every value must satisfy.
        if let Some(Value::Array(all)) = obj.get("allOf") {
            for (i, s) in all.iter().enumerate() {
                if let Some(why) = self.child(s, &format!("allOf/{i}"), depth, false) {
                    return Some(why);
                }
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(any)) = obj.get(key) {
                let impossible = any
                    .iter()
                    .enumerate()
                    .all(|(i, s)| self.child(s, &format!("{key}/{i}"), depth, false).is_some());
                if impossible {
                    return self.found(key, format!("no branch of '{key}' admits a value"));
                }
            }
        }
        if only(obj, &["object"]) {
            if let (Some(Value::Array(required)), Some(Value::Object(props))) =
                (obj.get("required"), obj.get("properties"))
            {
                for name in required.iter().filter_map(Value::as_str) {
                    if let Some(s) = props.get(name) {
                        let key =
                            format!("properties/{}", name.replace('~', "~0").replace('/', "~1"));
                        if let Some(why) = self.child(s, &key, depth, true) {
                            return Some(why);
                        }
                    }
                }
            }
        }
        if only(obj, &["array"]) && number(obj, "minItems").is_some_and(|n| n >= 1.0) {
            if let Some(items @ (Value::Object(_) | Value::Bool(_))) = obj.get("items") {
                if let Some(why) = self.child(items, "items", depth, true) {
                    return Some(why);
                }
            }
        }
        None
    }

    /// A contradiction within one schema object's own keywords.
    fn contradiction(&self, obj: &Map<String, Value>) -> Option<Unsatisfiable> {
        match obj.get("not") {
            Some(Value::Bool(true)) => {
                return self.found("not", "'not': true excludes every value")
            }
            Some(Value::Object(o)) if o.is_empty() => {
                return self.found("not", "'not': {} excludes every value")
            }
            _ => {}
        }
        if obj
            .get("enum")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            return self.found("enum", "'enum' is empty");
        }
        if obj
            .get("type")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            return self.found("type", "'type' lists no type");
        }
        // Bounds constrain only values of their own type: a contradiction
        // matters only when the schema allows no other type.
        let lo = number(obj, "minimum");
        let hi = number(obj, "maximum");
        let xlo = number(obj, "exclusiveMinimum");
        let xhi = number(obj, "exclusiveMaximum");
        let empty_range = match (lo, hi, xlo, xhi) {
            (Some(l), Some(h), _, _) if l > h => Some("minimum"),
            (_, Some(h), Some(x), _) if x >= h => Some("exclusiveMinimum"),
            (Some(l), _, _, Some(x)) if l >= x => Some("minimum"),
            (_, _, Some(a), Some(b)) if a >= b => Some("exclusiveMinimum"),
            _ => None,
        };
        if let Some(keyword) = empty_range.filter(|_| only(obj, &["number", "integer"])) {
            return self.found(keyword, "its numeric bounds leave no number");
        }
        for (lo, hi, ty) in [
            ("minLength", "maxLength", "string"),
            ("minItems", "maxItems", "array"),
            ("minProperties", "maxProperties", "object"),
        ] {
            if !only(obj, &[ty]) {
                continue;
            }
            let least = number(obj, lo);
            if least.is_some_and(|l| l > MAX_COUNT) {
                return self.found(lo, format!("'{lo}' asks for more than any reply can hold"));
            }
            if let (Some(l), Some(h)) = (least, number(obj, hi)) {
                if l > h {
                    return self.found(lo, format!("'{lo}' is above '{hi}'"));
                }
            }
        }
        None
    }

    /// A local `$ref`: its target applies here too. One that comes back
    /// to a target it is inside, deeper in the value, can never end.
    fn reference(&mut self, obj: &'a Map<String, Value>, depth: usize) -> Option<Unsatisfiable> {
        let target = obj.get("$ref").and_then(Value::as_str)?;
        if let Some(&(_, nesting)) = self.refs.iter().find(|(t, _)| *t == target) {
            if nesting < self.nesting {
                return self.found(
                    "$ref",
                    format!("'$ref': '{target}' requires a value inside itself, without end"),
                );
            }
            // Back at the same depth: no new constraint.
            return None;
        }
        let schema = resolve(self.root, target)?;
        self.refs.push((target, self.nesting));
        let why = self.at(schema, depth + 1).map(|inner| Unsatisfiable {
            // Named where the reference is; the reason says where it led.
            pointer: format!("{}/$ref", self.path),
            why: inner.to_string(),
        });
        self.refs.pop();
        why
    }

    fn child(
        &mut self,
        schema: &'a Value,
        key: &str,
        depth: usize,
        deeper: bool,
    ) -> Option<Unsatisfiable> {
        let len = self.path.len();
        self.path.push('/');
        self.path.push_str(key);
        self.nesting += usize::from(deeper);
        let why = self.at(schema, depth + 1);
        self.nesting -= usize::from(deeper);
        self.path.truncate(len);
        why
    }
}

/// A local reference (`#`, `#/$defs/x`); anything else is not followed.
fn resolve<'a>(root: &'a Value, target: &str) -> Option<&'a Value> {
    root.pointer(target.strip_prefix('#')?)
}

// The JSON types as bits; `number` is integers and the rest.
const NULL: u8 = 1;
const BOOLEAN: u8 = 2;
const OBJECT: u8 = 4;
const ARRAY: u8 = 8;
const STRING: u8 = 16;
const INTEGER: u8 = 32;
const FRACTION: u8 = 64;
const ANY: u8 = 127;

fn type_bits(name: &str) -> u8 {
    match name {
        "null" => NULL,
        "boolean" => BOOLEAN,
        "object" => OBJECT,
        "array" => ARRAY,
        "string" => STRING,
        "integer" => INTEGER,
        "number" => INTEGER | FRACTION,
        _ => 0,
    }
}

/// The JSON types `schema` allows through its `type`, its `allOf` and its
/// local `$ref`, as bits (`ANY` where it cannot tell).
/// (`false` is left to the walk, which names it.) Each subschema looked
/// at spends one of `steps`.
fn types(root: &Value, schema: &Value, depth: usize, steps: &mut usize) -> u8 {
    let Value::Object(obj) = schema else {
        return ANY;
    };
    if depth > MAX_DEPTH || *steps == 0 {
        return ANY;
    }
    *steps -= 1;
    let mut allowed = match obj.get("type") {
        Some(Value::String(t)) => type_bits(t),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .fold(0, |bits, t| bits | type_bits(t)),
        _ => ANY,
    };
    if let Some(Value::Array(all)) = obj.get("allOf") {
        for s in all {
            allowed &= types(root, s, depth + 1, steps);
        }
    }
    if let Some(target) = obj.get("$ref").and_then(Value::as_str) {
        if let Some(s) = resolve(root, target) {
            allowed &= types(root, s, depth + 1, steps);
        }
    }
    allowed
}

fn number(obj: &Map<String, Value>, key: &str) -> Option<f64> {
    obj.get(key).and_then(Value::as_f64)
}

/// Whether `type` is given and allows only types among `types`.
fn only(obj: &Map<String, Value>, types: &[&str]) -> bool {
    match obj.get("type") {
        Some(Value::String(t)) => types.contains(&t.as_str()),
        Some(Value::Array(ts)) => {
            !ts.is_empty()
                && ts
                    .iter()
                    .all(|t| t.as_str().is_some_and(|t| types.contains(&t)))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pointer(schema: &Value) -> String {
        unsatisfiable(schema)
            .unwrap_or_else(|| panic!("{schema}"))
            .pointer
    }

    #[test]
    fn certain_contradictions_are_found() {
        for (schema, at) in [
            (json!({"not": {}}), "/not"),
            (json!({"type": "string", "enum": []}), "/enum"),
            (
                json!({"type": "integer", "minimum": 5, "maximum": 1}),
                "/minimum",
            ),
            (
                json!({"type": "number", "exclusiveMinimum": 3, "maximum": 3}),
                "/exclusiveMinimum",
            ),
            (
                json!({"type": "string", "minLength": 5, "maxLength": 2}),
                "/minLength",
            ),
            (
                json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
                "/properties/a",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 1, "items": {"not": true}}}, "required": ["a"]}),
                "/properties/a/items/not",
            ),
            (
                json!({"allOf": [{"type": "string"}, {"enum": []}]}),
                "/allOf/1/enum",
            ),
            (json!({"anyOf": [false, {"not": {}}]}), "/anyOf"),
        ] {
            assert_eq!(pointer(&schema), at, "{schema}");
        }
    }

    #[test]
    fn a_count_no_reply_can_hold_is_found() {
        let schema: Value =
            serde_json::from_str(r#"{"type":"array","minItems":18446744073709551616}"#).unwrap();
        let why = unsatisfiable(&schema).unwrap();
        assert_eq!(
            (why.pointer.as_str(), why.dot_path()),
            ("/minItems", "minItems".into())
        );
        let nested = json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 1e12}}, "required": ["s"]});
        assert_eq!(
            unsatisfiable(&nested).unwrap().dot_path(),
            "properties.s.minLength"
        );
        // A large count that a reply can still hold is left alone.
        assert_eq!(
            unsatisfiable(&json!({"type": "array", "minItems": 100000})),
            None
        );
    }

    #[test]
    fn a_required_self_reference_is_found() {
        let schema = json!({"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]});
        let why = unsatisfiable(&schema).unwrap();
        assert_eq!(why.dot_path(), "properties.a.$ref", "{why}");
        let defs = json!({
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}},
            "$ref": "#/$defs/node"
        });
        assert!(unsatisfiable(&defs).is_some());
        // A linked list that may end is fine; so is an optional self-reference.
        for schema in [
            json!({"type":"object","properties":{"a":{"$ref":"#"}}}),
            json!({"type":"object","properties":{"a":{"anyOf":[{"type":"null"},{"$ref":"#"}]}},"required":["a"]}),
            json!({"type":"array","items":{"$ref":"#"}}),
            json!({"$ref": "#"}),
            json!({"allOf": [{"$ref": "#"}]}),
        ] {
            assert_eq!(unsatisfiable(&schema), None, "{schema}");
        }
    }

    #[test]
    fn types_with_nothing_in_common_are_found() {
        let schema = json!({"allOf": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(pointer(&schema), "/allOf");
        let nested = json!({"type": "object", "properties": {"v": {"type": "number", "allOf": [{"type": ["string", "null"]}]}}, "required": ["v"]});
        assert_eq!(pointer(&nested), "/properties/v/allOf");
        // `integer` is a `number`.
        let fine = json!({"allOf": [{"type": "number"}, {"type": ["integer", "string"]}]});
        assert_eq!(unsatisfiable(&fine), None);
    }

    #[test]
    fn satisfiable_schemas_pass() {
        for schema in [
            json!({}),
            json!(true),
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}),
            // Bounds of another type than the one allowed do not matter.
            json!({"type": ["string", "number"], "minimum": 5, "maximum": 1}),
            json!({"minLength": 5, "maxLength": 2}),
            json!({"minItems": 1e30}),
            // An optional property may be impossible.
            json!({"type": "object", "properties": {"a": false}}),
            // An empty array satisfies impossible items.
            json!({"type": "array", "items": false}),
            json!({"anyOf": [false, {"type": "string"}]}),
            json!({"type": "integer", "minimum": 1, "maximum": 1}),
            json!({"$ref": "#/$defs/missing"}),
        ] {
            assert_eq!(unsatisfiable(&schema), None, "{schema}");
        }
    }

    #[test]
    fn references_that_multiply_the_walk_are_bounded() {
        // 30 definitions, each naming the next twice: 2^30 paths.
        let mut defs = serde_json::Map::new();
        for i in 0..30 {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            defs.insert(format!("d{i}"), json!({"allOf": [next.clone(), next]}));
        }
        defs.insert("d30".into(), json!({"type": "string"}));
        let schema = json!({"$defs": defs, "$ref": "#/$defs/d0"});
        let started = std::time::Instant::now();
        assert_eq!(unsatisfiable(&schema), None);
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    #[test]
    fn false_in_all_of_is_named_where_it_is() {
        let schema = json!({"allOf": [{"type": "string"}, false]});
        assert_eq!(pointer(&schema), "/allOf/1", "{schema}");
    }
}
