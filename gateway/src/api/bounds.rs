//! Bounds on what a request body may hold, checked while the body is
//! parsed (serde helpers for the wire types): a body built to cost parsing
//! time or memory is refused after `limit` elements, not after all of
//! them, and a value over its bound is never built whole.
//!
//! Two kinds of bound:
//! - per array or value: messages, content parts, tools, stop strings,
//!   `metadata` pairs, the size of one JSON Schema;
//! - per request, shared by every field of one body ([`per_request`]):
//!   the elements it holds (messages, items, parts, list entries and every
//!   value inside free-form JSON) and the size of all its JSON Schemas.
//!
//! A bound's error is a data error, so `parse::json_body` reports it as
//! `invalid_value` (or the code [`coded`] names) with the path of the field
//! as `param`. Free-form JSON stops at the first value over its bound: the
//! rest of the body is never read.

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;

/// Most messages (chat `messages`) or input items (responses `input`) in a
/// request. Long agent sessions (the Codex CLI resends its whole history)
/// reach hundreds of items; 4,096 leaves an order of magnitude of room,
/// and any more, even empty, is a body built to cost parsing time.
pub const MAX_MESSAGES: usize = 4096;

/// Most content parts in one message or input item: a message of text and
/// images needs a handful; 1,024 is far beyond any real use.
pub const MAX_CONTENT_PARTS: usize = 1024;

/// Most tools in one request: the public API's own limit (128 functions),
/// so no client written for it sends more.
pub const MAX_TOOLS: usize = 128;

/// Most elements in one request, all fields together: messages, input
/// items, content parts, tools, tool calls, list entries, and every value
/// inside free-form JSON (schemas, `tool_choice`, a part's fields...). A
/// 4,096-message session with a few parts each and a hundred tools holds
/// about 30,000; past 65,536 a body is a flood of tiny elements, each of
/// which costs tens of bytes once built (a 16 MiB body holds millions).
pub const MAX_ELEMENTS: usize = 65_536;

/// Largest JSON Schema (a tool's `parameters`, a `json_schema` format's
/// `schema`), measured as its compact JSON text. The public API's own
/// limits for strict schemas (5,000 properties, 120,000 characters of
/// names and enum values) fit in well under 256 KiB; real tool schemas
/// are a few KB.
pub const MAX_SCHEMA_BYTES: usize = 256 << 10;

/// Largest total of all JSON Schemas of one request: one schema at the
/// bound plus a hundred tools of 2.5 KB.
pub const MAX_REQUEST_SCHEMA_BYTES: usize = 512 << 10;

/// Most stop strings (spec 2.4: up to 4).
pub const MAX_STOPS: usize = 4;

/// Longest stop string, in characters. The public API documents none;
/// Amazon Bedrock's runtime allows up to 1,000. Real stop strings are
/// template markers and delimiters of a few to a few dozen characters.
pub const MAX_STOP_CHARS: usize = 256;

/// `metadata` limits: pairs, key length, value length (in characters), as
/// the public API has them.
pub const MAX_METADATA_PAIRS: usize = 16;
pub const MAX_METADATA_KEY_CHARS: usize = 64;
pub const MAX_METADATA_VALUE_CHARS: usize = 512;

/// The code of a schema over [`MAX_SCHEMA_BYTES`] or over what is left of
/// the request's [`MAX_REQUEST_SCHEMA_BYTES`] or [`MAX_ELEMENTS`].
pub const SCHEMA_TOO_LARGE: &str = "schema_too_large";

/// Codes a bound's error may carry.
const CODES: [&str; 2] = [SCHEMA_TOO_LARGE, "invalid_value"];

/// Marks the code at the start of an error message ([`coded`]); a control
/// character, which no message of serde's or serde_json's starts with.
const CODE_MARK: char = '\u{1}';

/// A data error whose 400 carries `code` (one of [`CODES`]), raised
/// `depth` levels inside the field it is about: the path of the error
/// (where it was raised) loses that many segments to name the field.
fn coded<E: de::Error>(code: &'static str, depth: usize, message: impl fmt::Display) -> E {
    E::custom(format_args!(
        "{CODE_MARK}{code}{CODE_MARK}{depth}{CODE_MARK}{message}"
    ))
}

/// An error built by [`coded`]: its code, how many trailing segments of its
/// path to drop, and its message.
pub struct Coded<'a> {
    pub code: &'static str,
    pub depth: usize,
    pub message: &'a str,
}

/// The parts of an error message built by [`coded`].
pub fn split_code(message: &str) -> Option<Coded<'_>> {
    let rest = message.strip_prefix(CODE_MARK)?;
    let (code, rest) = rest.split_once(CODE_MARK)?;
    let (depth, message) = rest.split_once(CODE_MARK)?;
    Some(Coded {
        code: CODES.into_iter().find(|c| *c == code)?,
        depth: depth.parse().ok()?,
        message,
    })
}

// ---- the request's budget ------------------------------------------------------

/// What is left of one request's shared bounds.
#[derive(Debug, Clone, Copy)]
struct Budget {
    elements: usize,
    schema_bytes: usize,
}

thread_local! {
    /// The budget of the body being parsed on this thread (parsing is
    /// synchronous, so one body at a time); `None` outside [`per_request`],
    /// where only the per-value bounds apply (data read back from the store).
    static BUDGET: Cell<Option<Budget>> = const { Cell::new(None) };
}

/// Runs `parse` with a fresh request budget ([`MAX_ELEMENTS`],
/// [`MAX_REQUEST_SCHEMA_BYTES`]) shared by every field it reads.
pub fn per_request<T>(parse: impl FnOnce() -> T) -> T {
    struct Restore(Option<Budget>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BUDGET.set(self.0);
        }
    }
    let _restore = Restore(BUDGET.replace(Some(Budget {
        elements: MAX_ELEMENTS,
        schema_bytes: MAX_REQUEST_SCHEMA_BYTES,
    })));
    parse()
}

/// Elements left in the request's budget (unbounded outside one).
fn elements_left() -> usize {
    BUDGET.get().map_or(usize::MAX, |b| b.elements)
}

/// Schema bytes left in the request's budget (unbounded outside one).
fn schema_bytes_left() -> usize {
    BUDGET.get().map_or(usize::MAX, |b| b.schema_bytes)
}

/// Takes what a field used from the request's budget.
fn spend(elements: usize, schema_bytes: usize) {
    if let Some(mut b) = BUDGET.get() {
        b.elements = b.elements.saturating_sub(elements);
        b.schema_bytes = b.schema_bytes.saturating_sub(schema_bytes);
        BUDGET.set(Some(b));
    }
}

fn too_many_elements() -> String {
    format!(
        "the request holds more than {MAX_ELEMENTS} elements (messages, input items, content parts, tools, list entries and values of JSON fields); send fewer"
    )
}

// ---- arrays --------------------------------------------------------------------

/// Reads a JSON array into a `Vec`, failing as soon as it holds more than
/// `limit` elements or the request's [`MAX_ELEMENTS`]: the rest of the body
/// is never parsed, so a huge array of tiny elements is refused for the
/// cost of `limit` of them. The error names the array.
pub fn bounded_seq<'de, A, T>(mut seq: A, limit: usize, what: &str) -> Result<Vec<T>, A::Error>
where
    A: de::SeqAccess<'de>,
    T: Deserialize<'de>,
{
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(limit).min(64));
    while let Some(item) = seq.next_element()? {
        if out.len() == limit {
            return Err(de::Error::custom(format!(
                "more than {limit} {what}; send at most {limit}"
            )));
        }
        if elements_left() == 0 {
            return Err(de::Error::custom(too_many_elements()));
        }
        spend(1, 0);
        out.push(item);
    }
    Ok(out)
}

/// [`bounded_seq`] for elements that serde would buffer whole before
/// reading them (internally tagged enums: content parts): each is read as
/// bounded JSON first ([`MAX_ELEMENTS`] counts its values), then typed, so
/// a part with a huge unknown field is refused instead of copied. A type
/// error names the element (`messages.0.content.1.type`); running out of
/// the budget names the array.
pub fn bounded_tagged_seq<'de, A, T>(
    mut seq: A,
    limit: usize,
    what: &str,
) -> Result<Vec<T>, A::Error>
where
    A: de::SeqAccess<'de>,
    T: DeserializeOwned,
{
    struct Element<T>(std::marker::PhantomData<T>);
    impl<'de, T: DeserializeOwned> DeserializeSeed<'de> for Element<T> {
        type Value = Option<T>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
            match build(d, usize::MAX)? {
                Built::Value(value, b) => {
                    spend(b.elements, 0);
                    T::deserialize(value).map(Some).map_err(de::Error::custom)
                }
                // Named as the array: one level above the element.
                Built::Over(_, depth) => {
                    Err(coded("invalid_value", depth + 1, too_many_elements()))
                }
            }
        }
    }
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(limit).min(64));
    while let Some(item) = seq.next_element_seed(Element::<T>(std::marker::PhantomData))? {
        if out.len() == limit {
            return Err(de::Error::custom(format!(
                "more than {limit} {what}; send at most {limit}"
            )));
        }
        if let Some(item) = item {
            out.push(item);
        }
    }
    Ok(out)
}

/// `Option<Vec<T>>` of at most `limit` elements (null is `None`).
fn optional_seq<'de, D, T>(
    d: D,
    limit: usize,
    what: &'static str,
) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T> {
        limit: usize,
        what: &'static str,
        out: std::marker::PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<Vec<T>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an array of at most {} {}", self.limit, self.what)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            bounded_seq(seq, self.limit, self.what).map(Some)
        }
    }
    d.deserialize_any(V {
        limit,
        what,
        out: std::marker::PhantomData,
    })
}

/// `tools`: at most [`MAX_TOOLS`].
pub fn tools<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    optional_seq(d, MAX_TOOLS, "tools")
}

/// `messages` (and input items): at most [`MAX_MESSAGES`].
pub fn messages<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    optional_seq(d, MAX_MESSAGES, "messages")
}

/// Any other list (tool calls, `include`, `agents`...): bounded by the
/// request's [`MAX_ELEMENTS`] only; validation checks its own limits.
pub fn list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    optional_seq(d, usize::MAX, "entries")
}

// ---- free-form JSON and schemas ------------------------------------------------

/// A free-form JSON field (`tool_choice`, `prediction`, an item's
/// `output`...): built while its values are counted against the request's
/// [`MAX_ELEMENTS`], so millions of tiny values are refused at the first
/// one over the budget, never built whole. Null is `None`.
pub fn json<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match build(d, usize::MAX)? {
        Built::Value(value, b) => {
            spend(b.elements, 0);
            Ok(Some(value).filter(|v| !v.is_null()))
        }
        Built::Over(_, depth) => Err(coded("invalid_value", depth, too_many_elements())),
    }
}

/// A JSON Schema field: at most [`MAX_SCHEMA_BYTES`] of compact JSON, and
/// within what is left of the request's [`MAX_REQUEST_SCHEMA_BYTES`] and
/// [`MAX_ELEMENTS`]; else [`SCHEMA_TOO_LARGE`] at the first value over the
/// bound. Null is `None`.
pub fn schema<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    let request_left = schema_bytes_left();
    let (over, depth) = match build(d, MAX_SCHEMA_BYTES.min(request_left))? {
        Built::Value(value, b) => {
            spend(b.elements, b.bytes);
            return Ok(Some(value).filter(|v| !v.is_null()));
        }
        Built::Over(over, depth) => (over, depth),
    };
    Err(match over {
        Over::Elements => coded(
            SCHEMA_TOO_LARGE,
            depth,
            format_args!("this JSON Schema takes the request past its bound: {}.", too_many_elements()),
        ),
        Over::Bytes if request_left < MAX_SCHEMA_BYTES => coded(
            SCHEMA_TOO_LARGE,
            depth,
            format_args!(
                "the JSON Schemas of one request (tool parameters and response formats) may take at most {MAX_REQUEST_SCHEMA_BYTES} bytes together, written as compact JSON; this one takes them past it."
            ),
        ),
        Over::Bytes => coded(
            SCHEMA_TOO_LARGE,
            depth,
            format_args!(
                "a JSON Schema may take at most {MAX_SCHEMA_BYTES} bytes, written as compact JSON."
            ),
        ),
    })
}

/// A JSON value read by a [`Builder`].
enum Built {
    /// Within its bounds, with what it used.
    Value(Value, Builder),
    /// Over a bound, found this many levels inside the value.
    Over(Over, usize),
}

/// Reads one JSON value with a [`Builder`] of `max_bytes` and the
/// elements left in the request's budget.
fn build<'de, D: Deserializer<'de>>(d: D, max_bytes: usize) -> Result<Built, D::Error> {
    let mut b = Builder::new(max_bytes, elements_left());
    let read = Node(&mut b).deserialize(d);
    match (read, b.over) {
        (Ok(value), None) => Ok(Built::Value(value, b)),
        // A scalar at the top, or the stop of a container below.
        (Ok(_), Some(over)) => Ok(Built::Over(over, 0)),
        (Err(_), Some(over)) => Ok(Built::Over(over, b.abort_depth)),
        (Err(e), None) => Err(e),
    }
}

/// Which bound a [`Builder`] passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Elements,
    Bytes,
}

/// Builds one JSON value while measuring it: its values (elements) and its
/// length as compact JSON (strings counted by their decoded bytes). The
/// container holding the first value over a bound stops reading with an
/// error ([`Builder::abort`]), so nothing after it is read or built.
struct Builder {
    bytes: usize,
    max_bytes: usize,
    elements: usize,
    max_elements: usize,
    over: Option<Over>,
    /// Containers entered, and how deep the one that stopped was.
    depth: usize,
    abort_depth: usize,
}

impl Builder {
    fn new(max_bytes: usize, max_elements: usize) -> Self {
        Self {
            bytes: 0,
            max_bytes,
            elements: 0,
            max_elements,
            over: None,
            depth: 0,
            abort_depth: 0,
        }
    }

    /// Stops the container being read (at the current depth): its caller
    /// ([`build`]) turns this into the bound's error.
    fn abort<E: de::Error>(&mut self) -> E {
        self.abort_depth = self.depth;
        E::custom("over a bound")
    }

    /// One value of `bytes` bytes; false once over a bound.
    fn value(&mut self, bytes: usize) -> bool {
        self.elements += 1;
        if self.elements > self.max_elements {
            self.over.get_or_insert(Over::Elements);
        }
        self.text(bytes)
    }

    /// `bytes` of JSON text that is not a value (keys, separators).
    fn text(&mut self, bytes: usize) -> bool {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.max_bytes {
            self.over.get_or_insert(Over::Bytes);
        }
        self.over.is_none()
    }
}

/// One value of a [`Builder`]'s JSON (a seed, so it can be skipped).
struct Node<'b>(&'b mut Builder);

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.over.is_some() {
            // Skipping allocates nothing.
            IgnoredAny::deserialize(d)?;
            return Ok(Value::Null);
        }
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        self.0.value(if v { 4 } else { 5 });
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        self.0.value(written_len(v));
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        self.0.value(written_len(v));
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        self.0.value(float_len(v));
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        // Measured before it is copied.
        Ok(if self.0.value(v.len() + 2) {
            Value::String(v.to_owned())
        } else {
            Value::Null
        })
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(if self.0.value(v.len() + 2) {
            Value::String(v)
        } else {
            Value::Null
        })
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        self.0.value(4);
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        self.0.value(4);
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Node(self.0).deserialize(d)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let b = self.0;
        if !b.value(2) {
            return Err(b.abort());
        }
        b.depth += 1;
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Node(&mut *b))? {
            if !out.is_empty() {
                b.text(1);
            }
            if b.over.is_some() {
                b.depth -= 1;
                return Err(b.abort());
            }
            out.push(v);
        }
        b.depth -= 1;
        Ok(Value::Array(out))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let b = self.0;
        if !b.value(2) {
            return Err(b.abort());
        }
        b.depth += 1;
        let mut out = Map::new();
        let mut n = 0usize;
        while let Some(key) = map.next_key_seed(Key(&mut *b))? {
            if n > 0 {
                b.text(1);
            }
            n += 1;
            if b.over.is_none() {
                let v = map.next_value_seed(Node(&mut *b))?;
                if b.over.is_none() {
                    out.insert(key, v);
                    continue;
                }
            }
            b.depth -= 1;
            return Err(b.abort());
        }
        b.depth -= 1;
        Ok(Value::Object(out))
    }
}

/// An object key of a [`Builder`]'s JSON: `"key":` counted before it is
/// copied.
struct Key<'b>(&'b mut Builder);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, v: &str) -> Result<String, E> {
        Ok(if self.0.text(v.len() + 3) {
            v.to_owned()
        } else {
            String::new()
        })
    }
    fn visit_string<E>(self, v: String) -> Result<String, E> {
        Ok(if self.0.text(v.len() + 3) {
            v
        } else {
            String::new()
        })
    }
}

/// Length of a float as serde_json writes it, near enough: the shorter of
/// `1.5` / `3.0` and `1.5e+300` / `1e-7`.
fn float_len(v: f64) -> usize {
    let plain = written_len(v);
    let plain = if v.is_finite() && v.fract() == 0.0 {
        plain + 2
    } else {
        plain
    };
    let exp = format!("{v:e}");
    let exp = exp.len() + usize::from(!exp.contains("e-"));
    plain.min(exp)
}

/// Length of `v` as written, without allocating.
fn written_len(v: impl fmt::Display) -> usize {
    struct Count(usize);
    impl fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = fmt::write(&mut c, format_args!("{v}"));
    c.0
}

// ---- strings ---------------------------------------------------------------------

/// Whether `s` has more than `max` characters (without counting a string
/// that is too long in bytes alone).
pub fn longer_than(s: &str, max: usize) -> bool {
    s.len() > max && (s.len() > max.saturating_mul(4) || s.chars().count() > max)
}

/// A string of at most `max` characters, refused before it is copied.
pub struct BoundedString {
    pub max: usize,
    /// What the string is, for the messages ("stop string").
    pub what: &'static str,
}

impl<'de> DeserializeSeed<'de> for BoundedString {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for BoundedString {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a {} of at most {} characters", self.what, self.max)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        if longer_than(v, self.max) {
            return Err(E::custom(format_args!(
                "a {} may have at most {} characters; this one has {}",
                self.what,
                self.max,
                v.chars().count()
            )));
        }
        Ok(v.to_owned())
    }
}

// ---- metadata --------------------------------------------------------------------

/// `metadata`: at most [`MAX_METADATA_PAIRS`] string pairs, keys up to
/// [`MAX_METADATA_KEY_CHARS`] characters, values up to
/// [`MAX_METADATA_VALUE_CHARS`]. Checked pair by pair while parsing, so a
/// huge or non-string value is refused before it is built. Null is `None`.
pub fn metadata<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct V;
    impl<'de> Visitor<'de> for V {
        type Value = Option<BTreeMap<String, String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(
                f,
                "an object of at most {MAX_METADATA_PAIRS} string keys and string values"
            )
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key_seed(MetadataKey)? {
                let Some(key) = key else {
                    return Err(de::Error::custom(format_args!(
                        "'metadata' keys may have at most {MAX_METADATA_KEY_CHARS} characters"
                    )));
                };
                if out.len() == MAX_METADATA_PAIRS && !out.contains_key(&key) {
                    return Err(de::Error::custom(format_args!(
                        "'metadata' takes at most {MAX_METADATA_PAIRS} pairs"
                    )));
                }
                let value = map.next_value_seed(BoundedString {
                    max: MAX_METADATA_VALUE_CHARS,
                    what: "metadata value",
                })?;
                out.insert(key, value);
            }
            Ok(Some(out))
        }
    }
    d.deserialize_any(V)
}

/// A `metadata` key; `None` when it is too long (refused by the map, which
/// the error then names).
struct MetadataKey;

impl<'de> DeserializeSeed<'de> for MetadataKey {
    type Value = Option<String>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for MetadataKey {
    type Value = Option<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E>(self, v: &str) -> Result<Option<String>, E> {
        Ok((!longer_than(v, MAX_METADATA_KEY_CHARS)).then(|| v.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `Value` read by the schema helper, under a request budget.
    fn read_schema(text: &str) -> Result<Option<Value>, String> {
        per_request(|| {
            let mut de = serde_json::Deserializer::from_str(text);
            schema(&mut de).map_err(|e| e.to_string())
        })
    }

    #[test]
    fn a_schema_is_measured_as_compact_json() {
        for v in [
            json!({"type":"object","properties":{"a":{"type":"string","enum":["x","y"]},"n":{"type":"number","minimum":-1.5e300,"maximum":12}},"required":["a"],"additionalProperties":false}),
            json!([
                true,
                false,
                null,
                0,
                -7,
                18446744073709551615u64,
                0.25,
                1e-7,
                "é\"",
                {},
                []
            ]),
        ] {
            let text = serde_json::to_string(&v).unwrap();
            let mut b = Builder::new(usize::MAX, usize::MAX);
            let mut de = serde_json::Deserializer::from_str(&text);
            let built = Node(&mut b).deserialize(&mut de).unwrap();
            assert_eq!(built, v);
            // Escapes are counted decoded (`\"` is one byte).
            let escapes = text.matches('\\').count();
            assert_eq!(b.bytes, text.len() - escapes, "{text}");
        }
    }

    #[test]
    fn a_schema_over_its_bound_is_refused_with_its_code() {
        let ok = format!(
            r#"{{"type":"string","description":"{}"}}"#,
            "d".repeat(MAX_SCHEMA_BYTES - 40)
        );
        assert!(read_schema(&ok).unwrap().is_some());
        let big = format!(
            r#"{{"type":"string","description":"{}"}}"#,
            "d".repeat(MAX_SCHEMA_BYTES)
        );
        let e = read_schema(&big).unwrap_err();
        let c = split_code(&e).expect(&e);
        assert_eq!((c.code, c.depth), (SCHEMA_TOO_LARGE, 0));
        assert!(c.message.contains("262144"), "{}", c.message);
        // Found two levels down: the error says so, for its `param`.
        let deep = format!(r#"{{"a":{{"b":["{}"]}}}}"#, "d".repeat(MAX_SCHEMA_BYTES));
        let e = read_schema(&deep).unwrap_err();
        assert_eq!(split_code(&e).map(|c| c.depth), Some(2), "{e}");
        assert_eq!(read_schema("null"), Ok(None));
    }

    #[test]
    fn the_schemas_of_one_request_share_a_bound() {
        let quarter = format!(
            r#"{{"description":"{}"}}"#,
            "d".repeat(MAX_REQUEST_SCHEMA_BYTES / 4)
        );
        let e = per_request(|| {
            for _ in 0..3 {
                let mut de = serde_json::Deserializer::from_str(&quarter);
                schema(&mut de).map_err(|e| e.to_string())?;
            }
            let mut de = serde_json::Deserializer::from_str(&quarter);
            schema(&mut de).map_err(|e| e.to_string())
        })
        .unwrap_err();
        let c = split_code(&e).expect(&e);
        assert_eq!(c.code, SCHEMA_TOO_LARGE);
        assert!(c.message.contains("together"), "{}", c.message);
        // Outside a request (data read back), only the per-schema bound.
        for _ in 0..4 {
            let mut de = serde_json::Deserializer::from_str(&quarter);
            assert!(schema(&mut de).is_ok());
        }
    }

    /// The audit's tool parameters: millions of `0`s. The helper stops
    /// reading at the first value over the bound: a few milliseconds.
    #[test]
    fn millions_of_tiny_values_are_refused_without_being_built() {
        let zeros = format!(r#"{{"type":"object","x":[{}0]}}"#, "0,".repeat(8_000_000));
        let started = std::time::Instant::now();
        let e = read_schema(&zeros).unwrap_err();
        let took = started.elapsed();
        assert_eq!(
            split_code(&e).map(|c| c.code),
            Some(SCHEMA_TOO_LARGE),
            "{e}"
        );
        println!("{} bytes of zeros refused in {took:?}", zeros.len());
        assert!(took < std::time::Duration::from_millis(100), "{took:?}");
        // The same values as free-form JSON run out of the element budget.
        let e = per_request(|| {
            let mut de = serde_json::Deserializer::from_str(&zeros);
            json(&mut de).map_err(|e| e.to_string())
        })
        .unwrap_err();
        assert!(e.contains("more than 65536 elements"), "{e}");
    }

    #[test]
    fn metadata_is_checked_pair_by_pair() {
        let read = |text: &str| {
            let mut de = serde_json::Deserializer::from_str(text);
            metadata(&mut de).map_err(|e| e.to_string())
        };
        assert_eq!(read("null"), Ok(None));
        let m = read(r#"{"a":"b"}"#).unwrap().unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("b"));
        let sixteen: Vec<String> = (0..16).map(|i| format!(r#""k{i}":"v""#)).collect();
        assert!(read(&format!("{{{}}}", sixteen.join(","))).is_ok());
        let e = read(&format!("{{{},\"k16\":\"v\"}}", sixteen.join(","))).unwrap_err();
        assert!(e.contains("at most 16 pairs"), "{e}");
        let e = read(&format!(r#"{{"{}":"v"}}"#, "k".repeat(65))).unwrap_err();
        assert!(e.contains("keys may have at most 64"), "{e}");
        let e = read(&format!(r#"{{"a":"{}"}}"#, "é".repeat(513))).unwrap_err();
        assert!(e.contains("at most 512 characters"), "{e}");
        assert!(read(&format!(r#"{{"a":"{}"}}"#, "é".repeat(512))).is_ok());
        let e = read(r#"{"a":1}"#).unwrap_err();
        assert!(e.starts_with("invalid type"), "{e}");
        // 5.6M `{}` in a value: refused at its first byte, not built.
        let e = read(&format!(r#"{{"a":[{}{{}}]}}"#, "{},".repeat(1_000_000))).unwrap_err();
        assert!(e.starts_with("invalid type"), "{e}");
    }

    #[test]
    fn character_counts_are_exact_around_the_bound() {
        assert!(!longer_than(&"é".repeat(256), 256));
        assert!(longer_than(&"é".repeat(257), 256));
        assert!(!longer_than(&"x".repeat(256), 256));
        assert!(longer_than(&"x".repeat(257), 256));
        assert!(longer_than(&"x".repeat(5000), 256));
    }
}
