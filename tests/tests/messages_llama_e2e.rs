//! The Anthropic Messages API on the real model (the SmolLM2 GGUF of
//! `IGW_MODEL_FILE`, llama.cpp in process, a 2048-token window): one
//! message whole and one streamed, Claude Code's `max_tokens: 32000`
//! clamped to the worker's window, and `count_tokens` equal to the billed
//! prompt under the model's own template. SmolLM2 is a weak model: the
//! asserts are on structure, not on what it knows.

use harness::model::model_file;
use harness::{json, Stack, Value, WorkerOpts};
use reqwest::Method;

const N_CTX: u32 = 2048;

fn body(text: &str) -> Value {
    json!({
        "model": "base",
        "max_tokens": 32000,
        "temperature": 0,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": text}],
    })
}

async fn post(stack: &Stack, path: &str, body: &Value) -> harness::client::Reply {
    let client = stack.client();
    let rb = client
        .with_key(None)
        .request(Method::POST, path)
        .header("x-api-key", stack.gateway.api_key())
        .header("anthropic-version", "2023-06-01")
        .json(body);
    client.send(rb).await.unwrap()
}

#[tokio::test]
async fn a_message_whole_and_streamed_on_the_real_model() {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    let stack = Stack::single(WorkerOpts::llama(&file, N_CTX, 1));
    let mut b = body("Name one colour.");
    b["max_tokens"] = json!(32000);
    // The worker's window is known once a health check has read its Info.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let r = post(&stack, "/messages", &b).await;
    assert_eq!(r.status, 200, "32000 is clamped to the window: {r}");
    let m = r.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["content"][0]["type"], "text", "{m}");
    assert!(["end_turn", "max_tokens"].contains(&m["stop_reason"].as_str().unwrap()));
    let u = &m["usage"];
    let billed =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    let counted = post(&stack, "/messages/count_tokens", &b).await.json()["input_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(counted, billed, "{u}");

    b["stream"] = json!(true);
    b["max_tokens"] = json!(16);
    let client = stack.client();
    let rb = client
        .with_key(None)
        .request(Method::POST, "/messages")
        .header("x-api-key", stack.gateway.api_key())
        .json(&b);
    let frames = client
        .open_stream(rb)
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let names: Vec<&str> = frames.iter().filter_map(|f| f.event.as_deref()).collect();
    assert_eq!(names[0], "message_start", "{names:?}");
    assert!(names.contains(&"content_block_delta"), "{names:?}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{names:?}"
    );
    let delta = frames[frames.len() - 2].json();
    let out = delta["usage"]["output_tokens"].as_u64().unwrap();
    assert!(out > 0 && out <= 16, "{delta}");
}

/// `top_k` and `stop_sequences` on the real model. With `top_k: 1` the
/// sampler keeps only the likeliest token, so sampling at temperature 1
/// (a new random seed each time) answers what greedy decoding answers;
/// a word of that answer as a stop sequence ends the reply before it,
/// with `stop_reason: "stop_sequence"` and the word named.
#[tokio::test]
async fn top_k_and_a_stop_sequence_on_the_real_model() {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    let stack = Stack::single(WorkerOpts::llama(&file, N_CTX, 1));
    let text = |m: &Value| {
        m["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let mut b = body("Write one sentence about the sea.");
    b["max_tokens"] = json!(24);
    let greedy = post(&stack, "/messages", &b).await.json();
    let greedy_text = text(&greedy);
    assert!(greedy_text.split_whitespace().count() >= 4, "{greedy}");
    b["temperature"] = json!(1);
    b["top_k"] = json!(1);
    for _ in 0..3 {
        let m = post(&stack, "/messages", &b).await.json();
        assert_eq!(text(&m), greedy_text, "top_k 1 is greedy: {m}");
    }

    // The third word of the greedy answer stops it.
    b["temperature"] = json!(0);
    b.as_object_mut().unwrap().remove("top_k");
    let word = greedy_text.split_whitespace().nth(2).unwrap().to_owned();
    b["stop_sequences"] = json!([word]);
    let m = post(&stack, "/messages", &b).await.json();
    assert_eq!(
        (m["stop_reason"].as_str(), m["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(word.as_str())),
        "{m}"
    );
    let before = &greedy_text[..greedy_text.find(&word).unwrap()];
    assert_eq!(text(&m), before, "{m}");
}
