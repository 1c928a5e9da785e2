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
/// schema's JSON text. Bounded: when full it starts over, which is cheap
/// and keeps the hot set after a moment.
pub struct SchemaCache {
    hasher: std::hash::RandomState,
    entries: std::sync::Mutex<std::collections::HashMap<u64, CompiledSchema>>,
}

/// Most distinct schemas remembered at once.
pub const SCHEMA_CACHE_ENTRIES: usize = 4096;

static SCHEMA_CACHE: std::sync::LazyLock<SchemaCache> = std::sync::LazyLock::new(|| SchemaCache {
    hasher: std::hash::RandomState::new(),
    entries: std::sync::Mutex::new(std::collections::HashMap::new()),
});

impl SchemaCache {
    fn get_or_compile(&self, schema: &Value) -> CompiledSchema {
        use std::hash::BuildHasher;
        thread_local! {
            static TEXT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let key = TEXT.with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            serde_json::to_writer(&mut *buf, schema)
                .ok()
                .map(|()| self.hasher.hash_one(buf.as_slice()))
        });
        let Some(key) = key else {
            return compile_uncached(schema);
        };
        if let Some(hit) = self.entries.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return hit;
        }
        let outcome = compile_uncached(schema);
        if let Ok(mut m) = self.entries.lock() {
            if m.len() >= SCHEMA_CACHE_ENTRIES {
                m.clear();
            }
            m.insert(key, outcome.clone());
        }
        outcome
    }
}

/// Cuts the compiler's message quoted back to the client.
fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
