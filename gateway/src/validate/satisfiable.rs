//! Schemas that admit no JSON value at all. A model constrained by one can
//! only fail (the output check's 500, which a client retries in vain), so
//! the request is refused up front with a 400 instead. Only contradictions
//! that are certain without solving the schema are reported; anything
//! subtler is left to the worker.

use serde_json::{Map, Value};

/// Deepest level followed: real schemas nest far less (the public API
/// allows 10 levels), and this bounds the walk of a hostile one.
const MAX_DEPTH: usize = 32;

/// Why `schema` admits no value (a JSON pointer into it and the
/// contradiction), if it certainly admits none.
pub fn unsatisfiable(schema: &Value) -> Option<String> {
    let mut path = String::new();
    at(schema, &mut path, 0)
}

fn at(schema: &Value, path: &mut String, depth: usize) -> Option<String> {
    let here = |why: &str, path: &str| {
        let at = if path.is_empty() { "/" } else { path };
        Some(format!("{why} (at '{at}')"))
    };
    let obj = match schema {
        Value::Bool(false) => return here("the schema `false` admits no value", path),
        Value::Object(o) => o,
        _ => return None,
    };
    if depth > MAX_DEPTH {
        return None;
    }
    match obj.get("not") {
        Some(Value::Bool(true)) => return here("'not': true excludes every value", path),
        Some(Value::Object(o)) if o.is_empty() => {
            return here("'not': {} excludes every value", path)
        }
        _ => {}
    }
    if obj
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        return here("'enum' is empty", path);
    }
    if obj
        .get("type")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        return here("'type' lists no type", path);
    }
    // Bounds constrain only values of their own type: a contradiction
    // matters only when the schema allows no other type.
    let numeric = only(obj, &["number", "integer"]);
    let lo = number(obj, "minimum");
    let hi = number(obj, "maximum");
    let xlo = number(obj, "exclusiveMinimum");
    let xhi = number(obj, "exclusiveMaximum");
    let empty_range = match (lo, hi, xlo, xhi) {
        (Some(l), Some(h), _, _) if l > h => true,
        (_, Some(h), Some(x), _) if x >= h => true,
        (Some(l), _, _, Some(x)) if l >= x => true,
        (_, _, Some(a), Some(b)) if a >= b => true,
        _ => false,
    };
    if numeric && empty_range {
        return here("its numeric bounds leave no number", path);
    }
    for (lo, hi, ty) in [
        ("minLength", "maxLength", "string"),
        ("minItems", "maxItems", "array"),
        ("minProperties", "maxProperties", "object"),
    ] {
        if let (Some(l), Some(h)) = (number(obj, lo), number(obj, hi)) {
            if l > h && only(obj, &[ty]) {
                return here(&format!("'{lo}' is above '{hi}'"), path);
            }
        }
    }
    // Subschemas every value must satisfy.
    if let Some(Value::Array(all)) = obj.get("allOf") {
        for (i, s) in all.iter().enumerate() {
            if let Some(why) = child(s, path, &format!("allOf/{i}"), depth) {
                return Some(why);
            }
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(any)) = obj.get(key) {
            let mut reasons = Vec::new();
            for (i, s) in any.iter().enumerate() {
                match child(s, path, &format!("{key}/{i}"), depth) {
                    Some(why) => reasons.push(why),
                    None => break,
                }
            }
            if reasons.len() == any.len() {
                let at = if path.is_empty() { "/" } else { path.as_str() };
                return Some(format!("no branch of '{key}' admits a value (at '{at}')"));
            }
        }
    }
    if only(obj, &["object"]) {
        if let (Some(Value::Array(required)), Some(Value::Object(props))) =
            (obj.get("required"), obj.get("properties"))
        {
            for name in required.iter().filter_map(Value::as_str) {
                if let Some(s) = props.get(name) {
                    let key = format!("properties/{}", name.replace('~', "~0").replace('/', "~1"));
                    if let Some(why) = child(s, path, &key, depth) {
                        return Some(why);
                    }
                }
            }
        }
    }
    if only(obj, &["array"]) && number(obj, "minItems").is_some_and(|n| n >= 1.0) {
        if let Some(items @ (Value::Object(_) | Value::Bool(_))) = obj.get("items") {
            if let Some(why) = child(items, path, "items", depth) {
                return Some(why);
            }
        }
    }
    None
}

fn child(schema: &Value, path: &mut String, key: &str, depth: usize) -> Option<String> {
    let len = path.len();
    path.push('/');
    path.push_str(key);
    let why = at(schema, path, depth + 1);
    path.truncate(len);
    why
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

    #[test]
    fn certain_contradictions_are_found() {
        for (schema, at) in [
            (json!({"not": {}}), "'/'"),
            (json!({"type": "string", "enum": []}), "'/'"),
            (
                json!({"type": "integer", "minimum": 5, "maximum": 1}),
                "'/'",
            ),
            (
                json!({"type": "number", "exclusiveMinimum": 3, "maximum": 3}),
                "'/'",
            ),
            (
                json!({"type": "string", "minLength": 5, "maxLength": 2}),
                "'/'",
            ),
            (
                json!({"type": "object", "properties": {"a": false}, "required": ["a"]}),
                "'/properties/a'",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 1, "items": {"not": true}}}, "required": ["a"]}),
                "'/properties/a/items'",
            ),
            (
                json!({"allOf": [{"type": "string"}, {"enum": []}]}),
                "'/allOf/1'",
            ),
            (json!({"anyOf": [false, {"not": {}}]}), "'/'"),
        ] {
            let why = unsatisfiable(&schema).unwrap_or_else(|| panic!("{schema}"));
            assert!(why.contains(at), "{schema}: {why}");
        }
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
            // An optional property may be impossible.
            json!({"type": "object", "properties": {"a": false}}),
            // An empty array satisfies impossible items.
            json!({"type": "array", "items": false}),
            json!({"anyOf": [false, {"type": "string"}]}),
            json!({"type": "integer", "minimum": 1, "maximum": 1}),
        ] {
            assert_eq!(unsatisfiable(&schema), None, "{schema}");
        }
    }
}
