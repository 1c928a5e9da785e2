//! Property tests over the request parsers and validators: arbitrary bytes,
//! arbitrary JSON, and the contract table's bodies with one value replaced
//! by arbitrary JSON never panic, and always end in either a typed, valid
//! request or an [`ApiError`] with a 4xx status and a stable code.
//!
//! Bounded for CI (`PROPTEST_CASES` overrides the default per property);
//! run longer locally with e.g. `PROPTEST_CASES=200000`.

use super::contract_cases::{all_cases, Api, Case};
use crate::api::chat::ChatCompletionRequest;
use crate::api::responses::CreateResponseRequest;
use crate::error::ApiError;
use crate::parse::json_body;
use proptest::prelude::*;
use serde_json::{Map, Value};
use std::sync::OnceLock;

/// Field names the strategies prefer, so that random JSON reaches the
/// interesting code paths instead of dying at `unknown_parameter`.
const KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "function",
    "name",
    "parameters",
    "strict",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "anyOf",
    "$ref",
    "$defs",
    "$schema",
    "pattern",
    "json_schema",
    "schema",
    "tool_calls",
    "id",
    "arguments",
    "tool_call_id",
    "image_url",
    "url",
    "detail",
    "tools",
    "tool_choice",
    "response_format",
    "stop",
    "temperature",
    "top_p",
    "max_tokens",
    "n",
    "logit_bias",
    "metadata",
    "stream",
    "stream_options",
    "include_usage",
    "thinking_budget",
    "planner_mode",
    "reasoning_effort",
    "input",
    "instructions",
    "reasoning",
    "effort",
    "background",
    "store",
    "format",
    "max_output_tokens",
    "call_id",
    "output",
];

const WORDS: &[&str] = &[
    "base",
    "base-mini",
    "base-ultra",
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "function",
    "object",
    "string",
    "integer",
    "array",
    "text",
    "json_object",
    "json_schema",
    "image_url",
    "input_text",
    "auto",
    "none",
    "required",
    "high",
    "#/$defs/x",
    "http://example.com/s.json",
    "(",
    "",
];

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e6f64..1e6).prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((arb_key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ]
}

/// The contract rows whose bodies are small JSON (built once).
fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        all_cases()
            .into_iter()
            .filter(|c| c.body.len() < 4096 && serde_json::from_slice::<Value>(&c.body).is_ok())
            .collect()
    })
}

/// Parses and validates `body` as the given API would.
fn run(api: Api, body: &[u8], session: Option<&str>) -> Result<(), ApiError> {
    match api {
        Api::Chat => {
            let req: ChatCompletionRequest = json_body(body)?;
            super::chat::validate(
                &crate::catalog::Catalog::default(),
                &req,
                &super::chat::ChatHeaders {
                    session_id: session,
                },
            )
            .map(|_| ())
        }
        Api::Responses => {
            let req: CreateResponseRequest = json_body(body)?;
            super::responses::validate(&crate::catalog::Catalog::default(), &req).map(|_| ())
        }
    }
}

fn apis() -> impl Strategy<Value = Api> {
    prop_oneof![Just(Api::Chat), Just(Api::Responses)]
}

/// The property: a client error, with a code and a JSON body, or success.
fn assert_client_outcome(result: Result<(), ApiError>) -> Result<(), TestCaseError> {
    if let Err(e) = result {
        prop_assert!((400..500).contains(&e.status), "status {} ({e})", e.status);
        prop_assert!(!e.code.is_empty());
        let body: Value = serde_json::from_slice(&e.body())
            .map_err(|err| TestCaseError::fail(format!("error body is not JSON: {err}")))?;
        prop_assert_eq!(&body["error"]["status"], &Value::from(e.status));
    }
    Ok(())
}

/// Replaces the value found by walking `steps` into `v` with `new`.
fn replace_at(v: &mut Value, steps: &[usize], new: Value) {
    let child = match v {
        Value::Object(m) if !m.is_empty() => {
            let Some(&step) = steps.first() else {
                *v = new;
                return;
            };
            let i = step % m.len();
            m.values_mut().nth(i)
        }
        Value::Array(a) if !a.is_empty() => {
            let Some(&step) = steps.first() else {
                *v = new;
                return;
            };
            let i = step % a.len();
            a.get_mut(i)
        }
        _ => None,
    };
    match child {
        Some(c) => replace_at(c, &steps[1..], new),
        None => *v = new,
    }
}

fn config() -> ProptestConfig {
    // 700 cases per property in CI (a few seconds); `PROPTEST_CASES` overrides.
    let base = ProptestConfig::default();
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            base.cases
        } else {
            700
        },
        failure_persistence: None,
        ..base
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(api in apis(), body in prop::collection::vec(any::<u8>(), 0..256)) {
        assert_client_outcome(run(api, &body, None))?;
    }

    #[test]
    fn arbitrary_json_never_panics(api in apis(), v in arb_json()) {
        let body = serde_json::to_vec(&v).unwrap_or_default();
        assert_client_outcome(run(api, &body, None))?;
    }

    #[test]
    fn contract_bodies_with_one_value_replaced_never_panic(
        row in any::<prop::sample::Index>(),
        steps in prop::collection::vec(any::<usize>(), 0..7),
        new in arb_json(),
        session in prop::option::of(Just("sess-fuzz")),
    ) {
        let case = row.get(cases());
        let mut v = serde_json::from_slice::<Value>(&case.body).unwrap_or_default();
        replace_at(&mut v, &steps, new);
        let body = serde_json::to_vec(&v).unwrap_or_default();
        assert_client_outcome(run(case.api, &body, session))?;
    }

    #[test]
    fn arbitrary_tool_and_format_schemas_never_panic(schema in arb_json(), strict in any::<bool>()) {
        let body = serde_json::json!({
            "model": "base",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema.clone(), "strict": strict}}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": strict}},
        });
        let body = serde_json::to_vec(&body).unwrap_or_default();
        assert_client_outcome(run(Api::Chat, &body, None))?;
    }
}

#[test]
fn replace_at_walks_objects_and_arrays() {
    let mut v = serde_json::json!({"a": [1, {"b": 2}]});
    replace_at(&mut v, &[0, 1, 0], Value::from("x"));
    assert_eq!(v, serde_json::json!({"a": [1, {"b": "x"}]}));
    replace_at(&mut v, &[], Value::Null);
    assert_eq!(v, Value::Null);
}
