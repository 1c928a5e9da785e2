//! `GET /v1/openapi.json`: the interface description, served without a key,
//! byte for byte the document in the tree. (Its agreement with the wire
//! types is the gateway's unit test `routes::openapi::drift`; its agreement
//! with the live service is tests/conformance/schemathesis.)

use harness::{assert_error, Stack};
use reqwest::Method;

const IN_TREE: &str = include_str!("../../docs/openapi.json");

#[tokio::test]
async fn the_document_is_served_without_a_key() {
    let stack = Stack::gateway_only();
    for key in [None, Some("sk-wrong")] {
        let reply = stack
            .client()
            .with_key(key)
            .get("/openapi.json")
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "{reply}");
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_eq!(reply.text(), IN_TREE);
        let doc = reply.json();
        assert_eq!(doc["info"]["version"], "1.0.0");
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        assert!(doc["paths"]["/chat/completions"]["post"].is_object());
    }
}

/// The document has an ETag: `If-None-Match` naming it (or `*`, a list, a
/// weak tag) is a 304 without a body, and HEAD is GET's head alone.
#[tokio::test]
async fn the_document_has_an_etag_and_a_head() {
    let stack = Stack::gateway_only();
    let client = stack.client().with_key(None);
    let reply = client.get("/openapi.json").await.unwrap();
    let etag = reply.header("etag").expect("an ETag").to_string();
    for condition in [
        etag.clone(),
        "*".to_string(),
        format!("\"stale\", {etag}"),
        format!("W/{etag}"),
    ] {
        let r = client
            .send(
                client
                    .request(Method::GET, "/openapi.json")
                    .header("if-none-match", &condition),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 304, "{condition}: {r}");
        assert!(r.body.is_empty());
        assert_eq!(r.header("etag"), Some(etag.as_str()));
    }
    let stale = client
        .send(
            client
                .request(Method::GET, "/openapi.json")
                .header("if-none-match", "\"stale\""),
        )
        .await
        .unwrap();
    assert_eq!(stale.text(), IN_TREE);
    let head = client
        .send(client.request(Method::HEAD, "/openapi.json"))
        .await
        .unwrap();
    assert_eq!(head.status, 200, "{head}");
    assert!(head.body.is_empty());
    assert_eq!(head.header("etag"), Some(etag.as_str()));
    assert_eq!(
        head.header("content-length"),
        Some(IN_TREE.len().to_string().as_str())
    );
}

/// A 405 names the methods the path takes in `Allow` (RFC 9110; found by
/// schemathesis's `unsupported_method` check).
#[tokio::test]
async fn a_405_carries_allow() {
    let stack = Stack::gateway_only();
    let client = stack.client();
    for (method, path, allowed) in [
        (Method::POST, "/openapi.json", "GET, HEAD"),
        (Method::TRACE, "/chat/completions", "POST"),
        (Method::PUT, "/models", "GET"),
        (Method::PATCH, "/responses/resp_1", "GET, DELETE"),
        (Method::GET, "/responses/resp_1/cancel", "POST"),
    ] {
        let reply = client
            .send(client.request(method.clone(), path))
            .await
            .unwrap();
        assert_error(&reply, 405, "method_not_allowed");
        assert_eq!(reply.header("allow"), Some(allowed), "{method} {path}");
    }
}
