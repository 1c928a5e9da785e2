//! A model id beyond the spec's three, added in the gateway's config
//! (`[models.llama-70b]` with a window, prices and capabilities) and served
//! by a worker started with `--model llama-70b --context-window 8192`:
//! listed, served on both APIs, held to its own window, billed at its own
//! price, allowed in key allow-lists; bad configs refuse to start.

use harness::{assert_error, hash_key, json, Stack, Value, WorkerOpts};
use std::time::{Duration, Instant};

/// USD per million tokens: input, output; cached input defaults to 10 %.
const INPUT_PRICE: f64 = 2.0;
const OUTPUT_PRICE: f64 = 4.0;
const RESTRICTED_KEY: &str = "sk-test-llama-only-0123456789";

fn stack() -> Stack {
    Stack::builder()
        .models(&["base", "llama-70b"])
        .model_opts(
            "llama-70b",
            WorkerOpts {
                context_window: Some(8192),
                ..WorkerOpts::default()
            },
        )
        .extra_toml(&format!(
            r#"
[models.llama-70b]
context_window = 8192
input_price = {INPUT_PRICE}
output_price = {OUTPUT_PRICE}
description = "Llama 3.3 70B Instruct on our GPU pool."

[[keys]]
sha256 = "{}"
org = "org-restricted"
models = ["llama-70b"]
"#,
            hash_key(RESTRICTED_KEY)
        ))
        .start()
        .expect("stack starts")
}

fn chat(model: &str, text: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    })
}

/// The cost of one reply's usage at llama-70b's prices.
fn cost(input: u64, cached: u64, output: u64) -> f64 {
    ((input - cached) as f64 * INPUT_PRICE
        + cached as f64 * INPUT_PRICE / 10.0
        + output as f64 * OUTPUT_PRICE)
        / 1e6
}

/// The gateway's cost counter of `model` for the first key's organisation.
async fn billed(stack: &Stack, model: &str) -> f64 {
    let (status, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with("gateway_usage_cost_usd_total{"))
        .filter(|l| l.contains(&format!("gen_ai_request_model=\"{model}\"")))
        .filter(|l| l.contains("org=\"org-test\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn an_added_model_is_listed_served_held_to_its_window_and_billed() {
    let stack = stack();
    let client = stack.client();

    // Listed, retrievable, and in the Codex catalogue with its facts.
    let list = client.get("/models").await.unwrap();
    assert_eq!(list.status, 200, "{list}");
    let ids: Vec<String> = list.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["base-mini", "base", "base-ultra", "llama-70b"]);
    let one = client.get("/models/llama-70b").await.unwrap();
    assert_eq!(one.status, 200, "{one}");
    assert_eq!(one.json()["id"], "llama-70b");
    let codex = client
        .send(
            client
                .request(reqwest::Method::GET, "/models")
                .header("originator", "codex_cli_rs"),
        )
        .await
        .unwrap();
    let entry = codex.json()["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["slug"] == "llama-70b")
        .cloned()
        .expect("llama-70b in the Codex catalogue");
    assert_eq!(entry["context_window"], 8192);
    assert_eq!(
        entry["description"],
        "Llama 3.3 70B Instruct on our GPU pool."
    );
    assert_eq!(entry["input_modalities"], json!(["text"]));

    // Served on both APIs.
    let mut expected_cost = 0.0;
    let r = client
        .post_json(
            "/chat/completions",
            &chat("llama-70b", "Hello there. synthetic:reply_tokens=12", 64),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}\n{}", stack.logs());
    let v = r.json();
    assert_eq!(v["model"], "llama-70b");
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 12, "{u}");
    expected_cost += cost(
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap(),
    );
    let r = client
        .post_json(
            "/responses",
            &json!({"model": "llama-70b", "input": "Hi again. synthetic:reply_tokens=7", "max_output_tokens": 64}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}\n{}", stack.logs());
    let v = r.json();
    assert_eq!(
        (v["model"].as_str(), v["status"].as_str()),
        (Some("llama-70b"), Some("completed"))
    );
    let u = &v["usage"];
    assert_eq!(u["output_tokens"], 7, "{u}");
    expected_cost += cost(
        u["input_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["output_tokens"].as_u64().unwrap(),
    );

    // Its own window: the gateway refuses output that fills 8192 tokens,
    // the worker a ~9,000-token prompt that base (196,608) serves.
    let r = client
        .post_json("/chat/completions", &chat("llama-70b", "hi", 8192))
        .await
        .unwrap();
    let e = assert_error(&r, 400, "context_length_exceeded");
    assert_eq!(e["param"], "max_tokens");
    assert!(e["message"].as_str().unwrap().contains("8192"), "{e}");
    let long = "word ".repeat(9_000);
    let r = client
        .post_json("/chat/completions", &chat("llama-70b", &long, 16))
        .await
        .unwrap();
    let e = assert_error(&r, 400, "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("8192"), "{e}");
    let r = client
        .post_json("/chat/completions", &chat("base", &long, 16))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "base's window holds it: {r}");

    // Billed at its own price (the cost counter settles after the reply).
    let deadline = Instant::now() + Duration::from_secs(3);
    let got = loop {
        let got = billed(&stack, "llama-70b").await;
        if (got - expected_cost).abs() < 1e-12 || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(expected_cost > 0.0);
    assert!(
        (got - expected_cost).abs() < 1e-12,
        "billed {got} USD, expected {expected_cost} USD"
    );

    // A key allowed only llama-70b uses it, and not base.
    let restricted = client.with_key(Some(RESTRICTED_KEY));
    let r = restricted
        .post_json("/chat/completions", &chat("llama-70b", "ok", 8))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let r = restricted
        .post_json("/chat/completions", &chat("base", "ok", 8))
        .await
        .unwrap();
    let e = assert_error(&r, 403, "permission_denied");
    assert_eq!(e["param"], "model");
}

/// `gateway serve` on `config`: its exit status and stderr (it must stop
/// at once).
async fn serve_config(config: &str) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("igw-added-{}.toml", harness::random_hex(8)));
    std::fs::write(&path, config).unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(harness::bins::bin("gateway").unwrap())
            .args(["serve", "--config"])
            .arg(&path)
            .output(),
    )
    .await
    .expect("the gateway stops at once on a bad config")
    .unwrap();
    let _ = std::fs::remove_file(&path);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_bad_added_model_refuses_to_start_with_a_clear_message() {
    let cases = [
        (
            "[models.Llama-70B]\nworkers = [\"127.0.0.1:1\"]\ncontext_window = 8192\ninput_price = 1.0\noutput_price = 1.0\n",
            "config names model 'Llama-70B': a model id is 1 to 64 of a-z 0-9 . _ -",
        ),
        (
            "[models.llama-70b]\nworkers = [\"127.0.0.1:1\"]\ninput_price = 1.0\noutput_price = 1.0\n",
            "models.llama-70b: context_window is required",
        ),
        (
            "[models.llama-70b]\nworkers = [\"127.0.0.1:1\"]\n",
            "config names model 'llama-70b', which the service does not offer; to add it, give [models.llama-70b] a context_window, input_price and output_price",
        ),
        (
            "[models.base]\nworkers = [\"127.0.0.1:1\"]\ncontext_window = 4096\n",
            "models.base: context_window, prices, capabilities and description are the spec's for base",
        ),
    ];
    for (config, message) in cases {
        let (ok, stderr) = serve_config(config).await;
        assert!(!ok, "{config}");
        assert!(stderr.contains(message), "{message}\nin: {stderr}");
    }
}
