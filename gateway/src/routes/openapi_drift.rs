//! The drift guard of `docs/openapi.json`: the wire types are read from
//! their source (with `syn`, the way serde's derive reads them: field
//! names, `rename`, `rename_all`, `tag`, `flatten`, `skip`,
//! `deny_unknown_fields`) and compared with the document's component
//! schemas. A field added to, renamed in or removed from a type of
//! `api/` (or the error shapes) without the document fails here, and so
//! does a document property that no type has.
//!
//! A type's schema has the type's name unless `RENAMED` says otherwise.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::{Attribute, Fields, Item};

/// (file, Rust type) → schema name, where the Rust name would be ambiguous
/// or says less than the document's.
const RENAMED: &[(&str, &str, &str)] = &[
    ("api/chat.rs", "ContentPart", "ChatContentPart"),
    ("api/chat.rs", "ChatChunk", "ChatCompletionChunk"),
    ("api/chat.rs", "PlannerChunk", "PlannerCompletionChunk"),
    (
        "api/responses/request.rs",
        "ContentPart",
        "InputContentPart",
    ),
    ("api/messages.rs", "InputMessage", "AnthropicInputMessage"),
    ("api/messages.rs", "Block", "AnthropicInputBlock"),
    ("api/messages.rs", "ImageSource", "AnthropicImageSource"),
    ("api/messages.rs", "Tool", "AnthropicTool"),
    ("api/messages.rs", "ToolChoice", "AnthropicToolChoice"),
    ("api/messages.rs", "Thinking", "AnthropicThinking"),
    ("api/messages.rs", "Metadata", "AnthropicMetadata"),
    ("api/messages.rs", "OutputConfig", "AnthropicOutputConfig"),
    ("api/messages.rs", "Message", "AnthropicMessage"),
    ("api/messages.rs", "ContentBlock", "AnthropicContentBlock"),
    ("api/messages.rs", "Usage", "AnthropicUsage"),
    ("api/messages.rs", "TokenCount", "AnthropicTokenCount"),
    ("error/mod.rs", "Envelope", "ErrorEnvelope"),
    ("error/mod.rs", "WireError", "Error"),
    ("error/mod.rs", "BlockedBody", "BlockedAccount"),
    ("error/mod.rs", "BlockedData", "BlockedAccountData"),
];

/// Serde types of the walked files that are not on the wire, and why.
const NOT_WIRE: &[(&str, &str, &str)] = &[(
    "api/event_log.rs",
    "Payload",
    "reads stored events back; never sent",
)];

/// The error shapes live in `error/`, beside the status table; only these
/// of its serde types are wire types (`BlockedAccount` is the 402 detail
/// inside `ApiError`; `BlockedBody` is what is sent).
const ERROR_WIRE_TYPES: &[&str] = &["Envelope", "WireError", "BlockedBody", "BlockedData"];

/// Schemas of the document with no serde type of their own, and why.
const DOC_ONLY: &[(&str, &str)] = &[
    (
        "MessageContent",
        "api::chat::MessageContent, read by a hand-written visitor",
    ),
    ("Input", "api::responses::Input, a hand-written Deserialize"),
    (
        "WebSocketResponseCreateEvent",
        "the create body beside a `type`, split by routes::responses_ws",
    ),
    (
        "StopSequences",
        "api::chat::StopSequences, a hand-written Deserialize",
    ),
    (
        "ChatToolChoice",
        "a serde_json::Value checked by validate::chat",
    ),
    (
        "ResponseToolChoice",
        "a serde_json::Value checked by validate::responses",
    ),
    (
        "Metadata",
        "a serde_json::Value / map checked by validate::common",
    ),
    ("ExecutableData", "JSON the planner builds (planner/)"),
    (
        "AnthropicContent",
        "api::messages::Content, read by a hand-written visitor",
    ),
    (
        "AnthropicTool",
        "api::messages::Tool flattens its unknown fields (for validation to name them), which the drift check does not read",
    ),
    (
        "AnthropicErrorEnvelope",
        "built by error::anthropic from the one ApiError",
    ),
    (
        "AnthropicStreamEvent",
        "JSON built by translate::messages::stream",
    ),
];

/// One serde type as its derive sees it.
struct WireType {
    file: String,
    name: String,
    serialize: bool,
    deserialize: bool,
    deny_unknown: bool,
    shape: Shape,
}

enum Shape {
    /// Named fields: (wire name, is `Option<_>`, is flattened, Rust type).
    Struct(Vec<WireField>),
    /// An internally tagged enum: the tag and each variant's wire name and fields.
    Tagged(String, Vec<(String, Vec<WireField>)>),
    /// Untagged or tuple variants: no field names to compare.
    Opaque,
}

#[derive(Clone)]
struct WireField {
    name: String,
    optional: bool,
    flatten: bool,
    ty: String,
}

#[derive(Default)]
struct SerdeAttrs {
    rename: Option<String>,
    rename_all: Option<String>,
    tag: Option<String>,
    untagged: bool,
    flatten: bool,
    skip: bool,
    deny_unknown: bool,
}

fn serde_attrs(attrs: &[Attribute]) -> SerdeAttrs {
    let mut out = SerdeAttrs::default();
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            let value = if meta.input.peek(syn::Token![=]) {
                let expr: syn::Expr = meta.value()?.parse()?;
                match expr {
                    syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) => Some(s.value()),
                    _ => None,
                }
            } else {
                None
            };
            match key.as_str() {
                "rename" => out.rename = value,
                "rename_all" => out.rename_all = value,
                "tag" => out.tag = value,
                "untagged" => out.untagged = true,
                "flatten" => out.flatten = true,
                "skip" => out.skip = true,
                "deny_unknown_fields" => out.deny_unknown = true,
                _ => {}
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("unreadable serde attribute: {e}"));
    }
    out
}

fn derives(attrs: &[Attribute]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("derive")) {
        let _ = attr.parse_nested_meta(|meta| {
            if let Some(last) = meta.path.segments.last() {
                out.insert(last.ident.to_string());
            }
            Ok(())
        });
    }
    out
}

fn snake_case(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn named_fields(fields: &Fields) -> Option<Vec<WireField>> {
    let Fields::Named(named) = fields else {
        return match fields {
            Fields::Unit => Some(Vec::new()),
            _ => None,
        };
    };
    let mut out = Vec::new();
    for f in &named.named {
        let attrs = serde_attrs(&f.attrs);
        if attrs.skip {
            continue;
        }
        let ident = f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default();
        let ident = ident.trim_start_matches("r#").to_string();
        let ty = quote_type(&f.ty);
        out.push(WireField {
            name: attrs.rename.unwrap_or(ident),
            optional: ty.starts_with("Option <") || ty.starts_with("Option<"),
            flatten: attrs.flatten,
            ty,
        });
    }
    Some(out)
}

fn quote_type(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .iter()
            .map(|s| match &s.arguments {
                syn::PathArguments::AngleBracketed(a) => {
                    let inner: Vec<String> = a
                        .args
                        .iter()
                        .filter_map(|arg| match arg {
                            syn::GenericArgument::Type(t) => Some(quote_type(t)),
                            _ => None,
                        })
                        .collect();
                    format!("{}<{}>", s.ident, inner.join(","))
                }
                _ => s.ident.to_string(),
            })
            .collect::<Vec<_>>()
            .join("::"),
        syn::Type::Reference(r) => quote_type(&r.elem),
        syn::Type::Slice(s) => format!("[{}]", quote_type(&s.elem)),
        syn::Type::Array(a) => format!("[{};N]", quote_type(&a.elem)),
        _ => String::from("?"),
    }
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The `.rs` files under `dir` (relative to `src/`), at any depth.
fn rust_files(dir: &str) -> Vec<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(src_dir().join(dir))
        .expect("a source folder")
        .filter_map(|e| e.ok())
    {
        let path = format!("{dir}/{}", entry.file_name().to_string_lossy());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            files.extend(rust_files(&path));
        } else if path.ends_with(".rs") {
            files.push(path);
        }
    }
    files
}

/// Every serde type of `api/**/*.rs` and the error shapes of `error/mod.rs`.
fn wire_types() -> Vec<WireType> {
    let mut files = rust_files("api");
    files.sort();
    files.push("error/mod.rs".into());
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(src_dir().join(&file)).expect("readable source");
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        for item in parsed.items {
            let (ident, attrs, shape) = match &item {
                Item::Struct(s) => {
                    let shape = match named_fields(&s.fields) {
                        Some(f) => Shape::Struct(f),
                        None => Shape::Opaque,
                    };
                    (s.ident.to_string(), &s.attrs, shape)
                }
                Item::Enum(e) => {
                    let container = serde_attrs(&e.attrs);
                    let shape = match (&container.tag, container.untagged) {
                        (Some(tag), false) => {
                            let mut variants = Vec::new();
                            for v in &e.variants {
                                let va = serde_attrs(&v.attrs);
                                let name = va.rename.unwrap_or_else(|| {
                                    match container.rename_all.as_deref() {
                                        Some("snake_case") => snake_case(&v.ident.to_string()),
                                        None => v.ident.to_string(),
                                        Some(other) => panic!("rename_all = {other} not read"),
                                    }
                                });
                                let fields = named_fields(&v.fields)
                                    .unwrap_or_else(|| panic!("{}: tuple variant", v.ident));
                                variants.push((name, fields));
                            }
                            Shape::Tagged(tag.clone(), variants)
                        }
                        _ => Shape::Opaque,
                    };
                    (e.ident.to_string(), &e.attrs, shape)
                }
                _ => continue,
            };
            let derived = derives(attrs);
            let serialize = derived.contains("Serialize");
            let deserialize = derived.contains("Deserialize");
            if !(serialize || deserialize) {
                continue;
            }
            if file == "error/mod.rs" && !ERROR_WIRE_TYPES.contains(&ident.as_str()) {
                continue;
            }
            out.push(WireType {
                deny_unknown: serde_attrs(attrs).deny_unknown,
                file: file.clone(),
                name: ident,
                serialize,
                deserialize,
                shape,
            });
        }
    }
    out
}

fn document() -> Value {
    serde_json::from_str(super::DOCUMENT).expect("docs/openapi.json is JSON")
}

fn schema_name(t: &WireType) -> String {
    RENAMED
        .iter()
        .find(|(f, n, _)| *f == t.file && *n == t.name)
        .map_or_else(|| t.name.clone(), |(_, _, s)| s.to_string())
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            &doc["components"]["schemas"][name]
        }
        None => schema,
    }
}

fn property_names(schema: &Value) -> BTreeSet<String> {
    schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// Whether a property's schema admits `null` (an `Option` the request
/// parser reads as absent must be documented as nullable, or a client
/// sending `null` breaks the document's promise).
fn admits_null(doc: &Value, schema: &Value) -> bool {
    let schema = resolve(doc, schema);
    let typed = |t: &Value| match t {
        Value::String(s) => s == "null",
        Value::Array(a) => a.iter().any(|v| v == "null"),
        _ => false,
    };
    if let Some(t) = schema.get("type") {
        return typed(t);
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(branches) = schema.get(key).and_then(Value::as_array) {
            return branches.iter().any(|b| admits_null(doc, b));
        }
    }
    // No `type` and no alternatives: any JSON value.
    schema.get("const").is_none() && schema.get("enum").is_none()
}

/// Compares one object's wire fields with a schema; returns the differences.
fn compare(
    doc: &Value,
    what: &str,
    t: &WireType,
    fields: &[WireField],
    extra: &[String],
    schema: &Value,
) -> Vec<String> {
    let mut problems = Vec::new();
    let wire: BTreeSet<String> = fields
        .iter()
        .filter(|f| !f.flatten)
        .map(|f| f.name.clone())
        .chain(extra.iter().cloned())
        .collect();
    let documented = property_names(schema);
    for f in wire.difference(&documented) {
        problems.push(format!(
            "{what}: field `{f}` of {}::{} is not in the document",
            t.file, t.name
        ));
    }
    for p in documented.difference(&wire) {
        problems.push(format!(
            "{what}: the document has `{p}`, which {}::{} does not",
            t.file, t.name
        ));
    }
    if t.deserialize {
        let closed = schema.get("additionalProperties") == Some(&Value::Bool(false));
        if closed != t.deny_unknown {
            problems.push(format!(
                "{what}: additionalProperties must be false exactly when {} denies unknown fields",
                t.name
            ));
        }
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // Request types (read, never written): reply types that are also
        // read back from the store omit their `None`s instead.
        let request_only = !t.serialize || t.name == "InputItem";
        for f in fields.iter().filter(|f| f.optional && request_only) {
            let prop = &schema["properties"][&f.name];
            if !prop.is_null() && !required.contains(f.name.as_str()) && !admits_null(doc, prop) {
                problems.push(format!(
                    "{what}.{}: `{}` is an Option the parser reads null as absent; document it as nullable",
                    f.name, f.ty
                ));
            }
        }
    }
    problems
}

/// The struct a field flattens, when it flattens a struct (not an enum).
fn flattened_struct<'t>(types: &'t [WireType], f: &WireField) -> Option<&'t [WireField]> {
    let inner = f.ty.split('<').next().unwrap_or_default();
    types.iter().find_map(|t| match &t.shape {
        Shape::Struct(fields) if t.name == inner => Some(fields.as_slice()),
        _ => None,
    })
}

/// Fields a struct adds around a flattened enum (`Sequenced` adds
/// `sequence_number` to every `StreamEvent`), keyed by the enum's name.
fn flatten_extras(types: &[WireType]) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for t in types {
        if let Shape::Struct(fields) = &t.shape {
            if let Some(f) = fields
                .iter()
                .find(|f| f.flatten && flattened_struct(types, f).is_none())
            {
                let inner = f.ty.split('<').next().unwrap_or_default().to_string();
                let rest = fields
                    .iter()
                    .filter(|g| !g.flatten)
                    .map(|g| g.name.clone())
                    .collect();
                out.insert(inner, rest);
            }
        }
    }
    out
}

fn drift(doc: &Value, types: &[WireType]) -> Vec<String> {
    let schemas = &doc["components"]["schemas"];
    let extras = flatten_extras(types);
    let mut problems = Vec::new();
    let mut covered: BTreeSet<String> = BTreeSet::new();
    for t in types {
        if NOT_WIRE
            .iter()
            .any(|(f, n, _)| *f == t.file && *n == t.name)
        {
            continue;
        }
        let name = schema_name(t);
        // A struct flattening a struct has both's fields (`PlannerChunk`
        // around a `ChatChunk`).
        let mut merged: Option<Vec<WireField>> = None;
        if let Shape::Struct(fields) = &t.shape {
            for f in fields.iter().filter(|f| f.flatten) {
                match flattened_struct(types, f) {
                    Some(inner) => merged
                        .get_or_insert_with(|| fields.clone())
                        .extend(inner.iter().cloned()),
                    // Checked through the flattened enum (its fields are
                    // extras there).
                    None => merged = None,
                }
            }
            if merged.is_none() && fields.iter().any(|f| f.flatten) {
                continue;
            }
        }
        let Some(schema) = schemas.get(&name) else {
            problems.push(format!(
                "{}::{} has no schema `{name}` in docs/openapi.json",
                t.file, t.name
            ));
            continue;
        };
        covered.insert(name.clone());
        let extra = extras.get(&t.name).cloned().unwrap_or_default();
        match &t.shape {
            Shape::Struct(fields) => {
                let fields = merged.as_deref().unwrap_or(fields);
                problems.extend(compare(doc, &name, t, fields, &extra, schema));
            }
            Shape::Tagged(tag, variants) => {
                let branches: Vec<&Value> = schema["oneOf"]
                    .as_array()
                    .map(|b| b.iter().map(|s| resolve(doc, s)).collect())
                    .unwrap_or_default();
                let tag_of = |s: &Value| {
                    s["properties"][tag]["const"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_default()
                };
                let documented: BTreeSet<String> = branches.iter().map(|b| tag_of(b)).collect();
                let wire: BTreeSet<String> = variants.iter().map(|(n, _)| n.clone()).collect();
                for v in wire.symmetric_difference(&documented) {
                    problems.push(format!(
                        "{name}: variant `{v}` is in only one of {}::{} and the document",
                        t.file, t.name
                    ));
                }
                for (variant, fields) in variants {
                    if let Some(b) = branches.iter().find(|b| tag_of(b) == *variant) {
                        let mut extra = extra.clone();
                        extra.push(tag.clone());
                        problems.extend(compare(
                            doc,
                            &format!("{name}[{variant}]"),
                            t,
                            fields,
                            &extra,
                            b,
                        ));
                    }
                }
            }
            Shape::Opaque => {
                if schema.get("oneOf").is_none() {
                    problems.push(format!("{name}: an untagged enum is documented as a oneOf"));
                }
            }
        }
    }
    if let Some(all) = schemas.as_object() {
        for name in all.keys() {
            if !covered.contains(name) && !DOC_ONLY.iter().any(|(n, _)| n == name) {
                problems.push(format!(
                    "the document's schema `{name}` matches no wire type (add it to DOC_ONLY with the reason)"
                ));
            }
        }
    }
    problems
}

#[test]
fn document_matches_the_wire_types() {
    let doc = document();
    let types = wire_types();
    assert!(
        types.len() > 40,
        "the walk found too few wire types: {}",
        types.len()
    );
    let problems = drift(&doc, &types);
    assert!(
        problems.is_empty(),
        "docs/openapi.json differs from the wire types:\n  {}",
        problems.join("\n  ")
    );
}

/// The guard itself: a field added to a wire type without the document,
/// and a document property without a field, are both reported.
#[test]
fn an_undocumented_field_is_reported() {
    let doc = document();
    let mut types = wire_types();
    let request = types
        .iter_mut()
        .find(|t| t.name == "ChatCompletionRequest")
        .expect("the chat request type");
    if let Shape::Struct(fields) = &mut request.shape {
        fields.push(WireField {
            name: "brand_new".into(),
            optional: true,
            flatten: false,
            ty: "Option<bool>".into(),
        });
        fields.retain(|f| f.name != "seed");
    }
    let problems = drift(&doc, &types).join("\n");
    assert!(problems.contains("field `brand_new`"), "{problems}");
    assert!(problems.contains("the document has `seed`"), "{problems}");
}

#[test]
fn document_is_openapi_3_1_version_1_0_0() {
    let doc = document();
    assert!(doc["openapi"]
        .as_str()
        .is_some_and(|v| v.starts_with("3.1")));
    assert_eq!(doc["info"]["version"], "1.0.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
    // Every `$ref` points at a schema that exists.
    let text = super::DOCUMENT;
    let schemas = &doc["components"]["schemas"];
    for (i, _) in text.match_indices("#/components/schemas/") {
        let rest = &text[i + "#/components/schemas/".len()..];
        let name: String = rest.chars().take_while(|c| *c != '"').collect();
        assert!(schemas.get(&name).is_some(), "dangling $ref to {name}");
    }
}

/// Every route of the router is a path of the document, and back.
#[test]
fn document_paths_are_the_routes() {
    let router = std::fs::read_to_string(src_dir().join("routes/mod.rs")).expect("routes/mod.rs");
    let mut routes = BTreeSet::new();
    for line in router.lines() {
        let line = line.trim();
        if !line.starts_with("[\"v1\"") || !line.ends_with("=> {") {
            continue;
        }
        let inner = &line[1..line.find(']').expect("a slice pattern")];
        let segments: Vec<String> = inner
            .split(',')
            .map(str::trim)
            .skip(1)
            .map(|s| {
                s.strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .map_or_else(|| "{}".to_string(), str::to_string)
            })
            .collect();
        routes.insert(format!("/{}", segments.join("/")));
    }
    let documented: BTreeSet<String> = document()["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .map(|p| {
            p.split('/')
                .map(|s| if s.starts_with('{') { "{}" } else { s })
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    assert!(routes.len() >= 8, "{routes:?}");
    assert_eq!(routes, documented);
}

#[test]
fn snake_case_matches_serde() {
    assert_eq!(snake_case("ImageUrl"), "image_url");
    assert_eq!(snake_case("Text"), "text");
}
