//! Compiled JSON Schemas, remembered by content: request validation
//! (`validate/`) compiles the tool and format schemas a request carries,
//! and the output check (`output_check.rs`) reuses the same validator for
//! the reply. Below both, so neither imports the other for it.

use serde_json::Value;
use std::sync::Arc;

/// A schema compiled into a validator, or why it cannot be.
pub type CompiledSchema = Result<Arc<jsonschema::Validator>, String>;

/// The compiled validator of `schema`, from the same cache that request
/// validation fills: the output check of a `json_schema` reply reuses the
/// validator that validating the request built, instead of compiling the
/// schema again for every reply.
pub fn compiled_schema(schema: &Value) -> CompiledSchema {
    SCHEMA_CACHE.get_or_compile(schema)
}

fn compile_uncached(schema: &Value) -> CompiledSchema {
    // Building a validator checks the schema against its draft's meta-schema
    // first (the crate's default), then compiles it.
    match jsonschema::validator_for(schema) {
        Ok(v) => Ok(Arc::new(v)),
        Err(e) => {
            let at = e.instance_path().as_str();
            let text = truncate(&e.to_string(), 300);
            Err(if at.is_empty() {
                text
            } else {
                format!("{text} (at '{at}')")
            })
        }
    }
}

/// Outcomes of [`compiled_schema`] keyed by a keyed hash (SipHash with
/// a per-process random key, so collisions cannot be crafted) of the
/// schema's JSON text. Bounded by entries and by the bytes of the schemas
/// it holds: when either is full it starts over, which is cheap and keeps
/// the hot set after a moment. Schemas over [`MAX_CACHED_SCHEMA_BYTES`] are
/// compiled each time and never kept, so distinct large schemas, request
/// after request, cannot fill it with what one request may send.
pub struct SchemaCache {
    hasher: std::hash::RandomState,
    entries: std::sync::Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    /// Outcome and the schema's text length.
    map: std::collections::HashMap<u64, (CompiledSchema, usize)>,
    /// Text length of every schema held.
    bytes: usize,
}

/// Most distinct schemas remembered at once.
pub const SCHEMA_CACHE_ENTRIES: usize = 4096;

/// Most bytes of schema text (compact JSON) remembered at once: hundreds
/// of real tool schemas. A compiled validator is resident at 25 to 28
/// bytes per byte of its text, realistic or built of tiny values
/// (`tests::memory_of_compiled_schemas`), so the cache holds about 30 MiB
/// at most whatever it is sent (4,096 entries of 1 MB schemas kept 1 GiB).
pub const SCHEMA_CACHE_BYTES: usize = 1 << 20;

/// Largest schema kept: a client's tools and formats are resent on every
/// turn and are a few KB each; a larger one is compiled for its request
/// (and for its reply's check) and dropped.
pub const MAX_CACHED_SCHEMA_BYTES: usize = 32 << 10;

static SCHEMA_CACHE: std::sync::LazyLock<SchemaCache> = std::sync::LazyLock::new(SchemaCache::new);

impl SchemaCache {
    fn new() -> Self {
        SchemaCache {
            hasher: std::hash::RandomState::new(),
            entries: std::sync::Mutex::new(Entries::default()),
        }
    }

    fn get_or_compile(&self, schema: &Value) -> CompiledSchema {
        use std::hash::BuildHasher;
        thread_local! {
            static TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let key = TEXT.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            let key = serde_json::to_writer(&mut *buf, schema)
                .ok()
                .map(|()| (self.hasher.hash_one(buf.as_slice()), buf.len()));
            // A thread keeps the buffer of an ordinary schema, not of the
            // largest one it ever saw.
            if buf.capacity() > MAX_CACHED_SCHEMA_BYTES {
                *buf = Vec::new();
            }
            key
        });
        let Some((key, bytes)) = key.filter(|(_, bytes)| *bytes <= MAX_CACHED_SCHEMA_BYTES) else {
            return compile_uncached(schema);
        };
        if let Some(hit) = self
            .entries
            .lock()
            .ok()
            .and_then(|e| e.map.get(&key).map(|(outcome, _)| outcome.clone()))
        {
            return hit;
        }
        let outcome = compile_uncached(schema);
        if let Ok(mut e) = self.entries.lock() {
            if e.map.len() >= SCHEMA_CACHE_ENTRIES || e.bytes + bytes > SCHEMA_CACHE_BYTES {
                e.map.clear();
                e.bytes = 0;
            }
            // Another thread may have compiled the same schema meanwhile.
            if let Some((_, old)) = e.map.insert(key, (outcome.clone(), bytes)) {
                e.bytes -= old;
            }
            e.bytes += bytes;
        }
        outcome
    }

    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        self.entries
            .lock()
            .map(|e| (e.map.len(), e.bytes))
            .unwrap_or_default()
    }
}

/// Cuts the compiler's message quoted back to the client.
fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `{"type":"string","x-id":i,"x-junk":[{},{},…]}`: the audit's
    /// schemas, of about `bytes`.
    fn junk(i: usize, bytes: usize) -> Value {
        json!({"type": "string", "x-id": i, "x-junk": vec![json!({}); bytes / 3]})
    }

    #[test]
    fn the_cache_is_bounded_by_bytes_and_skips_large_schemas() {
        let cache = SchemaCache::new();
        // Distinct schemas just under the per-schema bound: the cache
        // starts over rather than holding more than its bytes.
        let mut most = 0;
        for i in 0..200 {
            assert!(cache
                .get_or_compile(&junk(i, MAX_CACHED_SCHEMA_BYTES - 64))
                .is_ok());
            let (_, bytes) = cache.held();
            most = most.max(bytes);
            assert!(bytes <= SCHEMA_CACHE_BYTES, "{bytes}");
        }
        assert!(most > SCHEMA_CACHE_BYTES / 2, "{most}");
        // A larger schema is compiled and not kept.
        let (entries, bytes) = cache.held();
        assert!(cache.get_or_compile(&junk(999, 1 << 20)).is_ok());
        assert_eq!(cache.held(), (entries, bytes));
        // A small one is a hit the second time (same validator).
        let small = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let first = cache.get_or_compile(&small).unwrap();
        let again = cache.get_or_compile(&small).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
    }

    /// Resident memory of compiled validators per byte of schema text, for
    /// the cache's bound. `cargo test --release -p gateway --lib
    /// memory_of_compiled_schemas -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn memory_of_compiled_schemas() {
        fn rss_kib() -> u64 {
            std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                })
                .unwrap_or(0)
        }
        let realistic = |i: usize| {
            let props: serde_json::Map<String, Value> = (0..40)
                .map(|p| {
                    (
                        format!("field_{i}_{p}"),
                        json!({"type": "string", "description": "what this field holds, in a few words"}),
                    )
                })
                .collect();
            json!({"type": "object", "properties": props, "additionalProperties": false})
        };
        let junk_of = |i: usize| junk(i, 30_000);
        // The realistic one first: RSS does not shrink between the two.
        let makers: [(&str, &dyn Fn(usize) -> Value); 2] = [
            ("40 described properties", &realistic),
            ("junk [{},{},…]", &junk_of),
        ];
        for (name, make) in makers {
            let schemas: Vec<Value> = (0..100).map(make).collect();
            let text: usize = schemas
                .iter()
                .map(|s| serde_json::to_vec(s).map_or(0, |t| t.len()))
                .sum();
            let before = rss_kib();
            let held: Vec<_> = schemas.iter().map(compile_uncached).collect();
            let grown = rss_kib().saturating_sub(before) * 1024;
            println!(
                "{name}: {text} bytes of text, {grown} bytes resident for {} validators: {:.1} bytes per byte",
                held.len(),
                grown as f64 / text as f64
            );
        }
    }
}
