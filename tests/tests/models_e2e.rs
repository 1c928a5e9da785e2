//! Model listing and retrieval end to end, and the Codex CLI's catalogue.

use harness::{assert_error, Stack};
use std::collections::BTreeSet;

#[tokio::test]
async fn list_has_the_three_models() {
    let stack = Stack::gateway_only();
    let reply = stack.client().get("/models").await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));
    let v = reply.json();
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    let ids: BTreeSet<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, BTreeSet::from(["base", "base-mini", "base-ultra"]));
    assert_eq!(data.len(), 3);
    for m in data {
        assert_eq!(m["object"], "model", "{m}");
        assert_eq!(m["created"], 0, "{m}");
        assert_eq!(m["owned_by"], "base", "{m}");
    }
}

#[tokio::test]
async fn retrieve_returns_one_model_and_404s_an_unknown_id() {
    let stack = Stack::gateway_only();
    let client = stack.client();
    for id in ["base", "base-mini", "base-ultra"] {
        let reply = client.get(&format!("/models/{id}")).await.unwrap();
        assert_eq!(reply.status, 200, "{reply}");
        assert!(reply
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/json")));
        let m = reply.json();
        assert_eq!(m["id"], id);
        assert_eq!(m["object"], "model");
        assert_eq!(m["created"], 0);
        assert_eq!(m["owned_by"], "base");
    }
    for id in ["gpt-4o", "BASE", "base-mega"] {
        let reply = client.get(&format!("/models/{id}")).await.unwrap();
        assert_error(&reply, 404, "model_not_found");
    }
}

#[tokio::test]
async fn model_routes_need_a_key() {
    let stack = Stack::gateway_only();
    for path in ["/models", "/models/base"] {
        for key in [None, Some("sk-wrong")] {
            let reply = stack.client().with_key(key).get(path).await.unwrap();
            assert_error(&reply, 401, "invalid_api_key");
        }
    }
}

/// Fields of one Codex catalogue entry (wire-conventions, "Codex CLI").
const CODEX_FIELDS: [&str; 17] = [
    "slug",
    "display_name",
    "description",
    "default_reasoning_level",
    "supported_reasoning_levels",
    "shell_type",
    "visibility",
    "supported_in_api",
    "priority",
    "base_instructions",
    "supports_reasoning_summaries",
    "support_verbosity",
    "truncation_policy",
    "supports_parallel_tool_calls",
    "context_window",
    "experimental_supported_tools",
    "input_modalities",
];

#[tokio::test]
async fn codex_gets_its_catalogue_with_a_stable_etag() {
    let mut stack = Stack::gateway_only();
    let client = stack.client();
    let codex = |c: &harness::Client| {
        c.request(reqwest::Method::GET, "/models?client_version=0.63.0")
            .header("originator", "codex_cli_rs")
            .header(
                "user-agent",
                "codex_cli_rs/0.63.0 (Debian 12; x86_64) xterm",
            )
    };
    let reply = client.send(codex(&client)).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    let etag = reply.header("etag").expect("an ETag").to_string();
    let v = reply.json();
    assert!(v.get("object").is_none(), "not the OpenAI list: {v}");
    let models = v["models"].as_array().expect("models");
    let slugs: BTreeSet<&str> = models.iter().map(|m| m["slug"].as_str().unwrap()).collect();
    assert_eq!(slugs, BTreeSet::from(["base", "base-mini", "base-ultra"]));
    for m in models {
        for field in CODEX_FIELDS {
            assert!(m.get(field).is_some(), "{field} in {m}");
        }
        assert!(
            m["context_window"].as_u64().is_some_and(|w| w >= 196_608),
            "{m}"
        );
        for level in m["supported_reasoning_levels"].as_array().unwrap() {
            assert!(level["effort"].is_string() && level["description"].is_string());
        }
        assert!(m["truncation_policy"]["mode"].is_string());
        // Codex 0.169 refuses an entry whose `base_instructions` is null.
        assert!(
            m["base_instructions"]
                .as_str()
                .is_some_and(|s| !s.trim().is_empty()),
            "{m}"
        );
    }

    // The same ETag again; If-None-Match with it is a 304 without a body.
    let again = client.send(codex(&client)).await.unwrap();
    assert_eq!(again.header("etag"), Some(etag.as_str()));
    let not_modified = client
        .send(codex(&client).header("if-none-match", &etag))
        .await
        .unwrap();
    assert_eq!(not_modified.status, 304, "{not_modified}");
    assert!(not_modified.body.is_empty());
    assert_eq!(not_modified.header("etag"), Some(etag.as_str()));
    let stale = client
        .send(codex(&client).header("if-none-match", "\"stale\""))
        .await
        .unwrap();
    assert_eq!(stale.status, 200);
    // `*`, a list and a weak tag match too (RFC 9110 13.1.2).
    for condition in [
        "*".to_string(),
        format!("\"stale\", {etag}"),
        format!("W/{etag}"),
    ] {
        let r = client
            .send(codex(&client).header("if-none-match", &condition))
            .await
            .unwrap();
        assert_eq!(r.status, 304, "{condition}: {r}");
    }

    // The User-Agent alone identifies Codex too.
    let by_agent = client
        .send(
            client
                .request(reqwest::Method::GET, "/models")
                .header("user-agent", "codex_exec/0.63.0"),
        )
        .await
        .unwrap();
    assert!(by_agent.json()["models"].is_array(), "{by_agent}");

    // Other clients keep the OpenAI list.
    assert_eq!(
        client.get("/models").await.unwrap().json()["object"],
        "list"
    );

    // A restarted gateway serves the same ETag (it depends on the catalogue only).
    stack.gateway.restart().unwrap();
    let client = stack.client();
    let after = client.send(codex(&client)).await.unwrap();
    assert_eq!(after.header("etag"), Some(etag.as_str()));
}
