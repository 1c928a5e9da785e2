//! The real model end to end, what only the in-process `llama` engine does:
//! the real gateway in front of a real `llama` worker (llama.cpp in process)
//! on the SmolLM2-135M GGUF. What every engine must do the same (chat,
//! stops, schemas, tool calls, the window, cancel, Responses) is in
//! `engine_conformance.rs`. Short replies and a 1024-token window keep it
//! fast. SmolLM2 is a weak model: the asserts are on structure (lengths,
//! counts), not on what it knows.

use harness::chat::{self, content, create as post, greedy};
use harness::model::model_file;
use harness::{json, Stack, Value, WorkerOpts};
use std::time::{Duration, Instant};

const N_CTX: u32 = 1024;

fn llama_stack(parallel: u32) -> Stack {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    Stack::single(WorkerOpts::llama(&file, N_CTX, parallel))
}

/// The prompt is the model's own template's: SmolLM2's Jinja template adds
/// its default system message when the caller sends none, so a bare user
/// message costs exactly as many prompt tokens as one with that system
/// message spelled out (and more than one with a shorter system message).
#[tokio::test]
async fn the_prompt_is_rendered_by_the_model_s_own_template() {
    let stack = llama_stack(1);
    let prompt_tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    let bare = post(&stack, &greedy("Hi", 1)).await;
    let mut body = greedy("Hi", 1);
    body["messages"] = json!([
        {"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
        {"role": "user", "content": "Hi"},
    ]);
    let spelled_out = post(&stack, &body).await;
    body["messages"][0]["content"] = json!("Be brief.");
    let short = post(&stack, &body).await;
    assert_eq!(
        prompt_tokens(&bare),
        prompt_tokens(&spelled_out),
        "{bare}\n{spelled_out}"
    );
    assert!(
        prompt_tokens(&short) < prompt_tokens(&bare),
        "{short}\n{bare}"
    );
}

#[tokio::test]
async fn same_seed_and_a_cold_cache_give_the_same_text() {
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": 16,
        "temperature": 0.8,
        "seed": 1234,
    });
    let mut texts = Vec::new();
    for _ in 0..2 {
        // A fresh worker each time: a cold cache.
        let stack = llama_stack(1);
        texts.push(content(&post(&stack, &body).await));
    }
    assert!(!texts[0].is_empty());
    assert_eq!(texts[0], texts[1]);
    // Greedy twice on one worker (the second reuses the cached prompt).
    let stack = llama_stack(1);
    let a = content(&post(&stack, &greedy("What is the capital of France?", 8)).await);
    let b = content(&post(&stack, &greedy("What is the capital of France?", 8)).await);
    assert_eq!(a, b);
}

#[tokio::test]
async fn an_image_part_is_refused_by_name() {
    let stack = llama_stack(1);
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
        ]}],
        "max_tokens": 4,
    });
    let reply = stack
        .client()
        .post_json("/chat/completions", &body)
        .await
        .expect("reply");
    assert_eq!(reply.status, 400, "{reply}");
    assert!(reply.text().contains("content[1]"), "{reply}");
}

/// Four sequences share the engine's decode batch: each has streamed
/// content while all four hold a slot, and dropping them frees every slot.
/// (Throughput is measured by `realbench`, not asserted here.)
#[tokio::test]
async fn four_concurrent_streams_decode_together() {
    let stack = llama_stack(4);
    let mut streams = Vec::new();
    for i in 0..4 {
        let body = chat::long_story(
            &format!("Tell me a very long story about dragon number {i}."),
            i,
        );
        let stream = stack
            .client()
            .stream("/chat/completions", &body)
            .await
            .expect("stream");
        streams.push(stream);
    }
    for stream in &mut streams {
        loop {
            let frame = stream.next_frame().await.expect("frame").expect("open");
            assert!(!frame.is_done(), "a long story ended at once");
            let delta = &frame.json()["choices"][0]["delta"]["content"];
            if delta.as_str().is_some_and(|t| !t.is_empty()) {
                break;
            }
        }
    }
    let worker = stack.worker("base");
    let load = worker.load().await.expect("load");
    assert_eq!((load.running, load.queued), (4, 0), "{load:?}");
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let info = worker.info().await.expect("info");
        let load = info.load.unwrap_or_default();
        if load.running == 0 && info.counters.unwrap_or_default().cancelled == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "slots not freed: {load:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A long prefix held by a busy slot is shared with a concurrent request:
/// the second request, started while the first still streams from the
/// other slot, reports most of the shared system prompt as cached (its KV
/// cells were copied, not recomputed), and its reply is still its own. The
/// worker's exact cache report then names both slots' prompts.
#[tokio::test]
async fn a_busy_slot_shares_its_prefix_with_a_concurrent_request() {
    let stack = llama_stack(2);
    let system = "You are the librarian of a small town. ".repeat(30);
    let ask = |question: &str, max_tokens: u32| {
        json!({"model": "base", "max_tokens": max_tokens, "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ]})
    };
    let mut long = ask("Tell me a very long story about the library.", 600);
    long["stream"] = json!(true);
    let mut first = stack
        .client()
        .stream("/chat/completions", &long)
        .await
        .expect("stream");
    loop {
        let frame = first.next_frame().await.expect("frame").expect("open");
        assert!(!frame.is_done(), "the long story ended at once");
        let delta = &frame.json()["choices"][0]["delta"]["content"];
        if delta.as_str().is_some_and(|t| !t.is_empty()) {
            break;
        }
    }
    let second = post(&stack, &ask("When do you open?", 8)).await;
    let usage = &second["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap_or(0);
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        prompt > 250 && cached * 10 >= prompt * 8,
        "the shared system prompt is reused from the busy slot: {cached} of {prompt}"
    );
    assert!(!content(&second).is_empty(), "{second}");
    let load = stack.worker("base").load().await.expect("load");
    assert_eq!(load.running, 1, "the story still runs: {load:?}");
    let report = stack
        .worker("base")
        .prefix_report()
        .await
        .expect("a prefix report");
    assert_eq!(report.source, "exact");
    assert_eq!((report.capacity, report.used), (2, 2), "{report:?}");
    // Both prompts share the system prompt's blocks; the report holds
    // them once.
    assert!(report.blocks.len() >= system.len() / 128, "{report:?}");
    drop(first);
}

/// The engine times its decode steps on the worker's metrics page (what
/// `realbench` reads to split a token's time between the forward pass,
/// sampling and the serving path): one greedy reply of N tokens is one
/// prefill step and N − 1 generate steps, each with time in both parts.
#[tokio::test]
async fn the_engine_times_its_decode_steps_on_the_metrics_page() {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    let metrics_addr = harness::process::free_addr().expect("a free port");
    let mut opts = WorkerOpts::llama(&file, N_CTX, 1);
    opts.extra_args
        .extend(["--metrics-listen".into(), metrics_addr.clone()]);
    let stack = Stack::single(opts);
    let reply = post(&stack, &greedy("Tell me a long story about a dragon.", 24)).await;
    let generated = reply["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!(generated > 2, "{reply}");
    // Each generate step decodes the token sampled before it; a reply cut
    // at max_tokens never decodes its last token, one that ended on its
    // own decoded every token and sampled the end after the last.
    let generate_steps = match reply["choices"][0]["finish_reason"].as_str() {
        Some("length") => generated - 1,
        _ => generated,
    };
    // The engine counts a step after handing its tokens to their streams,
    // so the reply can reach the client before its last step is counted.
    let scrape = || async {
        reqwest::get(format!("http://{metrics_addr}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("body")
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut page = scrape().await;
    while harness::prometheus::sample(&page, "worker_engine_steps_total", &["batch=\"generate\""])
        < generate_steps as f64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
        page = scrape().await;
    }
    let sample = |name: &str, labels: &[&str]| harness::prometheus::sample(&page, name, labels);
    let steps = |batch: &str| sample("worker_engine_steps_total", &[batch]);
    assert_eq!(steps("batch=\"prefill\""), 1.0, "{page}");
    assert_eq!(steps("batch=\"generate\""), generate_steps as f64, "{page}");
    for batch in ["batch=\"prefill\"", "batch=\"generate\""] {
        for part in ["part=\"decode\"", "part=\"sample\""] {
            let seconds = sample("worker_engine_step_seconds_total", &[batch, part]);
            assert!(seconds > 0.0, "{batch} {part}: {page}");
        }
    }
}
