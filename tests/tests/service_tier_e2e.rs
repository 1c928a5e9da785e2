//! The tier a request is served at, where it shows: on every streamed chat
//! chunk as on the body, and, behind an `upstream` worker started with
//! `--upstream-priority`, in the `priority` field a vLLM-kind engine
//! receives (a loopback fake engine records each body). The real gateway
//! and worker over gRPC; no real engine is needed.

use harness::fake_engine::{Behavior, FakeEngine};
use harness::{json, Stack, Value, WorkerOpts};

/// A key on a plan that may be served at `priority`.
fn premium_key() -> (String, String) {
    let secret = format!("sk-test-premium-{}", harness::random_hex(8));
    let toml = format!(
        "[[keys]]\nsha256 = \"{}\"\norg = \"org-premium\"\nname = \"premium\"\nplan = \"premium\"\n\
         [plans.premium]\nmax_service_tier = \"priority\"\n",
        harness::hash_key(&secret)
    );
    (toml, secret)
}

fn chat(tier: Option<&str>, stream: bool) -> Value {
    let mut body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": stream,
    });
    if let Some(tier) = tier {
        body["service_tier"] = json!(tier);
    }
    body
}

/// A gateway in front of one upstream worker of `kind` before `engine`.
fn upstream_stack(engine: &FakeEngine, kind: &str, pass_priority: bool, toml: &str) -> Stack {
    let mut opts = WorkerOpts::upstream(&engine.url(), kind);
    if pass_priority {
        opts.extra_args.push("--upstream-priority".into());
    }
    Stack::builder()
        .models(&["base"])
        .worker_opts(opts)
        .extra_toml(toml)
        .start()
        .expect("stack starts")
}

/// The `priority` of the last streamed chat completion the engine received.
fn last_priority(engine: &FakeEngine) -> Option<Value> {
    let last = engine
        .last_streamed_request()
        .expect("the engine received a streamed chat completion");
    last.get("priority").cloned()
}

#[tokio::test]
async fn a_vllm_engine_is_told_each_tier_in_its_own_priority_order() {
    let engine = FakeEngine::start(Behavior::Normal).expect("fake engine");
    let (toml, key) = premium_key();
    let stack = upstream_stack(&engine, "vllm", true, &toml);
    let client = stack.client().with_key(Some(&key));
    // vLLM serves lower values first: priority -1, default 0, flex 1.
    for (asked, sent) in [
        (Some("priority"), -1),
        (None, 0),
        (Some("default"), 0),
        (Some("flex"), 1),
    ] {
        let r = client
            .post_json("/chat/completions", &chat(asked, false))
            .await
            .expect("reply");
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(last_priority(&engine), Some(json!(sent)), "asked {asked:?}");
    }
    // A plan capped at `default` is served (and sent) at `default`.
    let r = stack
        .client()
        .post_json("/chat/completions", &chat(Some("priority"), false))
        .await
        .expect("reply");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["service_tier"], "default");
    assert_eq!(last_priority(&engine), Some(json!(0)));
}

#[tokio::test]
async fn without_the_flag_no_engine_is_told_a_priority() {
    let engine = FakeEngine::start(Behavior::Normal).expect("fake engine");
    let (toml, key) = premium_key();
    let stack = upstream_stack(&engine, "vllm", false, &toml);
    let r = stack
        .client()
        .with_key(Some(&key))
        .post_json("/chat/completions", &chat(Some("priority"), false))
        .await
        .expect("reply");
    assert_eq!(r.status, 200, "{r}");
    assert_eq!(r.json()["service_tier"], "priority");
    assert_eq!(last_priority(&engine), None);
}

#[tokio::test]
async fn every_streamed_chunk_says_the_tier_served() {
    let (toml, key) = premium_key();
    let stack = Stack::builder()
        .models(&["base"])
        .extra_toml(&toml)
        .start()
        .expect("stack starts");
    for (client, asked, served) in [
        (stack.client().with_key(Some(&key)), "priority", "priority"),
        (stack.client().with_key(Some(&key)), "flex", "flex"),
        // The default key's plan caps it at `default`.
        (stack.client(), "priority", "default"),
    ] {
        let mut body = chat(Some(asked), true);
        body["stream_options"] = json!({"include_usage": true});
        let chunks = harness::chat::chunks(&harness::chat::stream(&client, &body).await);
        assert!(
            chunks.len() >= 3,
            "role, content, finish, usage: {chunks:?}"
        );
        for chunk in &chunks {
            assert_eq!(chunk["service_tier"], served, "asked {asked}: {chunk}");
        }
    }
}
