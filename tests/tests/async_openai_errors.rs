//! Error bodies of every status, read by the Rust `async-openai` crate: each
//! 4xx parses into its `ApiError` (string `code`, `param`, `type`) with the
//! right status, server errors keep their JSON body, and the 402 blocked
//! shape is what the spec says it is (unwrapped, so a client that reads
//! `error` first fails to parse it: spec 7, rule 2).

use async_openai::error::OpenAIError;
use async_openai::types::chat::CreateChatCompletionRequest;
use async_openai::types::responses::CreateResponse;
use harness::openai;
use harness::{hash_key, json, random_hex, Stack, Value, WorkerOpts};

struct Keys {
    models_only: String,
    blocked: String,
    limited: String,
}

/// `base` and `base-mini` with workers (paced, so a background run stays
/// running for a while), `base-ultra` on a dead address, and keys for 403,
/// 402 and 429 (one request at a time).
fn stack() -> (Stack, Keys) {
    let keys = Keys {
        models_only: format!("sk-m-{}", random_hex(16)),
        blocked: format!("sk-b-{}", random_hex(16)),
        limited: format!("sk-l-{}", random_hex(16)),
    };
    let extra = format!(
        r#"
[[keys]]
sha256 = "{}"
org = "org-errors"
name = "models-only"
scopes = ["models.read"]

[[keys]]
sha256 = "{}"
org = "org-blocked"
name = "blocked"

[[keys]]
sha256 = "{}"
org = "org-limited"
name = "limited"
plan = "one-at-a-time"

[plans.one-at-a-time]
max_concurrent = 1

[orgs.org-blocked]
blocked = true
blocked_reason = "payment overdue"

[models.base-ultra]
workers = ["127.0.0.1:1"]
"#,
        hash_key(&keys.models_only),
        hash_key(&keys.blocked),
        hash_key(&keys.limited),
    );
    let stack = Stack::builder()
        .models(&["base", "base-mini"])
        .worker_opts(WorkerOpts::paced(0, 400))
        .extra_toml(&extra)
        .start()
        .expect("stack starts");
    (stack, keys)
}

/// A typed request built from the JSON a user would write.
fn chat(v: Value) -> CreateChatCompletionRequest {
    serde_json::from_value(v).expect("a valid async-openai chat request")
}

fn chat_on(model: &str, extra: Value) -> CreateChatCompletionRequest {
    let mut v = json!({"model": model, "messages": [{"role": "user", "content": "hi synthetic:reply_tokens=1"}]});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    chat(v)
}

fn response(v: Value) -> CreateResponse {
    serde_json::from_value(v).expect("a valid async-openai responses request")
}

#[tokio::test]
async fn every_error_status_parses() {
    let (stack, keys) = stack();
    let ok = openai::client(&stack);

    // 400: code and param of the validation rules, on both APIs.
    for (extra, code, param) in [
        (json!({"temperature": 3.0}), "invalid_value", "temperature"),
        (json!({"n": 2}), "unsupported_value", "n"),
        (
            json!({"logprobs": true}),
            "unsupported_parameter",
            "logprobs",
        ),
        (
            json!({"max_completion_tokens": 0}),
            "invalid_value",
            "max_completion_tokens",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "strict": true,
                "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]}),
            "invalid_function_parameters",
            "tools.0.function.parameters",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": true,
                "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}}),
            "invalid_json_schema",
            "response_format.json_schema.schema",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}),
            "invalid_value",
            "messages.0.content.0",
        ),
        (
            json!({"max_tokens": 262_144}),
            "context_length_exceeded",
            "max_tokens",
        ),
    ] {
        let (status, e) =
            openai::api_error(ok.chat().create(chat_on("base-mini", extra.clone())).await);
        assert_eq!(status, 400, "{extra}");
        assert_eq!(e.code.as_deref(), Some(code), "{extra}");
        assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        assert_eq!(e.r#type.as_deref(), Some("invalid_request_error"));
        assert!(!e.message.is_empty());
    }
    let (status, e) = openai::api_error(
        ok.responses()
            .create(response(
                json!({"model": "base", "input": "hi", "background": true, "store": false}),
            ))
            .await,
    );
    assert_eq!((status, e.param.as_deref()), (400, Some("background")));
    let (status, e) = openai::api_error(
        ok.responses()
            .create(response(json!({"model": "base", "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objekt"}}}})))
            .await,
    );
    assert_eq!(
        (status, e.code.as_deref()),
        (400, Some("invalid_json_schema"))
    );

    // 401
    let (status, e) = openai::api_error(
        openai::client_with_key(&stack, "sk-wrong")
            .chat()
            .create(chat_on("base", json!({})))
            .await,
    );
    assert_eq!((status, e.code.as_deref()), (401, Some("invalid_api_key")));
    assert_eq!(e.r#type.as_deref(), Some("authentication_error"));

    // 403: a key that may only list models.
    let models_only = openai::client_with_key(&stack, &keys.models_only);
    assert!(models_only.models().list().await.is_ok());
    let (status, e) =
        openai::api_error(models_only.chat().create(chat_on("base", json!({}))).await);
    assert_eq!(status, 403);
    assert_eq!(e.r#type.as_deref(), Some("permission_error"));
    assert!(e.code.is_some_and(|c| !c.is_empty()));

    // 404 on both generation endpoints and on a response id.
    let (status, e) = openai::api_error(ok.chat().create(chat_on("gpt-4o", json!({}))).await);
    assert_eq!((status, e.code.as_deref()), (404, Some("model_not_found")));
    assert_eq!(e.param.as_deref(), Some("model"));
    let (status, e) = openai::api_error(
        ok.responses()
            .create(response(json!({"model": "base-large", "input": "hi"})))
            .await,
    );
    assert_eq!((status, e.code.as_deref()), (404, Some("model_not_found")));
    let (status, _) = openai::api_error(ok.responses().retrieve("resp_missing").await);
    assert_eq!(status, 404);

    // 409: chaining on a background run that is still going.
    let running = ok
        .responses()
        .create(response(json!({"model": "base", "input": "long synthetic:reply_tokens=4000", "background": true})))
        .await
        .expect("background create parses");
    let (status, e) = openai::api_error(
        ok.responses()
            .create(response(
                json!({"model": "base", "input": "next", "previous_response_id": running.id}),
            ))
            .await,
    );
    assert_eq!(status, 409);
    assert_eq!(e.param.as_deref(), Some("previous_response_id"));
    let cancelled = ok
        .responses()
        .cancel(&running.id)
        .await
        .expect("cancel parses");
    assert_eq!(cancelled.id, running.id);

    // 429: a plan of one request at a time, while a long stream holds the
    // slot. (The crate retries a 429 three times, honouring `retry-after`;
    // the concurrency refusal asks for 1 s, so this takes about 3 s.)
    let limited = openai::client_with_key(&stack, &keys.limited);
    let held = limited
        .chat()
        .create_stream(chat_on(
            "base-mini",
            json!({"stream": true, "messages": [{"role": "user", "content": "long synthetic:reply_tokens=4000"}]}),
        ))
        .await
        .expect("the first request is admitted");
    let (status, e) =
        openai::api_error(limited.chat().create(chat_on("base-mini", json!({}))).await);
    assert_eq!(
        (status, e.code.as_deref()),
        (429, Some("rate_limit_exceeded"))
    );
    assert_eq!(e.r#type.as_deref(), Some("rate_limit_error"));
    drop(held);

    // 402: the unwrapped blocked shape does not fit `{error:…}`; the crate
    // says so and hands over the body, which is the spec's shape.
    match openai::client_with_key(&stack, &keys.blocked)
        .chat()
        .create(chat_on("base", json!({})))
        .await
    {
        Err(OpenAIError::JSONDeserialize(_, body)) => {
            let v: Value = serde_json::from_str(&body).expect("402 body is JSON");
            assert!(v.get("error").is_none(), "{v}");
            assert!(v["code"].is_i64() && v["ev"].is_i64(), "{v}");
            assert_eq!(v["data"]["reason"], "payment overdue");
        }
        other => panic!("expected the unwrapped 402 body, got {other:?}"),
    }

    // 5xx: the crate keeps the body as the message; it is still our envelope.
    let (status, e) = openai::api_error(ok.chat().create(chat_on("base-ultra", json!({}))).await);
    assert!((500..600).contains(&status), "{status}");
    let v: Value = serde_json::from_str(&e.message).expect("5xx body is JSON");
    assert_eq!(v["error"]["status"], status);
    assert_eq!(v["error"]["type"], "server_error");
}
