//! Priority under a flood, on the simulator: a request of a higher tier
//! that finds every slot of its pool running `flex` work preempts one of
//! those generations (stopped on its worker, its slot given over), and the
//! preempted one resumes through the migration path once a slot frees. Its
//! client sees a pause and the same reply the model gives unpreempted
//! (the simulator's reply is fixed by the prompt and the seed). Asserted
//! from what each client got, the worker's own counters and the gateway's
//! metrics.

use harness::prometheus::sample;
use harness::{
    bounded, chat, json, key_on_plan, wait_until, GatewayOpts, Stack, Value, WorkerOpts,
};
use std::time::{Duration, Instant};

/// Tokens per second of the paced worker: a 300-token reply takes 3 s, one
/// decode step is 10 ms.
const PACE: u64 = 100;
const DECODE_STEP: Duration = Duration::from_millis(1000 / PACE);

/// The plans of the flood (`flex` at most), the interactive org
/// (`default`) and the premium one (`priority`).
const PLANS: &str = "[plans.batch]\nmax_service_tier = \"flex\"\n\
                     [plans.standard]\n\
                     [plans.premium]\nmax_service_tier = \"priority\"\n";

struct Keys {
    batch: String,
    standard: String,
    premium: String,
}

/// One paced `base` worker of `slots` sequences behind a gateway with the
/// three plans and `pool_toml` under `[models.base]`.
async fn flooded_stack(slots: u32, pool_toml: &str) -> (Stack, Keys) {
    let (batch_toml, batch) = key_on_plan("org-batch", "batch");
    let (standard_toml, standard) = key_on_plan("org-standard", "standard");
    let (premium_toml, premium) = key_on_plan("org-premium", "premium");
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts {
            max_concurrency: Some(slots),
            ..WorkerOpts::paced(0, PACE)
        })
        .gateway_opts(GatewayOpts {
            extra_toml: format!(
                "{batch_toml}{standard_toml}{premium_toml}{PLANS}[models.base]\n{pool_toml}\n"
            ),
            ..GatewayOpts::default()
        })
        .start()
        .expect("stack");
    wait_until(
        "the gateway to know the pool's capacity",
        Duration::from_secs(5),
        // The admin listener may not answer yet: asked again.
        || async {
            stack
                .gateway
                .admin_get("/metrics")
                .await
                .is_ok_and(|(_, page)| page.contains("gateway_worker_load_ratio{model=\"base\"}"))
        },
    )
    .await;
    (
        stack,
        Keys {
            batch,
            standard,
            premium,
        },
    )
}

/// A streamed story of `tokens` tokens, fixed by `seed`.
fn story(seed: u32, tokens: u32) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": format!("Story {seed}, please. synthetic:reply_tokens={tokens}")}],
        "seed": seed,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// A stream's text, finish reasons and usage, asserting no error frame and
/// one chunk id.
fn read_stream(frames: &[harness::SseFrame]) -> (String, Vec<String>, Value) {
    for f in frames {
        assert!(
            f.is_done() || f.json().get("error").is_none(),
            "no error frame: {f:?}"
        );
    }
    assert!(
        frames.last().is_some_and(|f| f.is_done()),
        "ends with [DONE]"
    );
    let chunks = chat::chunks(frames);
    let mut ids: Vec<&str> = chunks.iter().filter_map(|c| c["id"].as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 1, "one chunk id: {ids:?}");
    let finish = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .map(str::to_owned)
        .collect();
    let usage = chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or(Value::Null);
    (chat::streamed_text(&chunks), finish, usage)
}

/// Time from sending `body` with `key` to its first content chunk.
async fn time_to_first_token(
    stack: &Stack,
    key: &str,
    body: &Value,
) -> (Duration, Vec<harness::SseFrame>) {
    let client = stack.client().with_key(Some(key));
    let sent = Instant::now();
    let mut stream = client
        .stream("/chat/completions", body)
        .await
        .expect("stream");
    let mut frames = Vec::new();
    let mut first = None;
    while let Some(frame) = stream.next_frame().await.expect("frame") {
        let has_text = !frame.is_done()
            && frame.json()["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty());
        if has_text && first.is_none() {
            first = Some(sent.elapsed());
        }
        frames.push(frame);
    }
    (first.expect("a first token"), frames)
}

async fn metric(stack: &Stack, name: &str, labels: &[&str]) -> f64 {
    let (_, page) = stack.gateway.admin_get("/metrics").await.expect("metrics");
    sample(&page, name, labels)
}

/// Streams of `key`'s `bodies`, each read to its end on a task, waiting
/// until each has its first chunk before the next starts.
async fn running_streams(
    stack: &Stack,
    key: &str,
    bodies: Vec<Value>,
) -> Vec<tokio::task::JoinHandle<Vec<harness::SseFrame>>> {
    let mut tasks = Vec::new();
    for body in bodies {
        let client = stack.client().with_key(Some(key));
        let mut stream = client
            .stream("/chat/completions", &body)
            .await
            .expect("stream");
        let first = stream
            .next_frame()
            .await
            .expect("frame")
            .expect("a first frame");
        tasks.push(tokio::spawn(async move {
            let mut frames = vec![first];
            while let Some(f) = stream.next_frame().await.expect("frame") {
                frames.push(f);
            }
            frames
        }));
    }
    tasks
}

/// The case: both slots run the flood's `flex` streams; a
/// `priority` request reaches its first token within one decode step plus
/// its prefill (its isolated time to first token) plus 100 ms, and the
/// preempted stream reads whole, as the same request reads unpreempted.
#[tokio::test]
async fn a_priority_request_on_a_full_pool_preempts_flex_work_which_resumes_whole() {
    bounded(60, async {
        let (stack, keys) = flooded_stack(2, "").await;
        // References: each request alone, unpreempted.
        let short = story(7, 20);
        // Its time alone: the slowest of three, so a loaded machine's
        // noise does not pass for the preemption's cost.
        let mut isolated = Duration::ZERO;
        for _ in 0..3 {
            let (ttft, _) = time_to_first_token(&stack, &keys.premium, &short).await;
            isolated = isolated.max(ttft);
        }
        let mut reference = Vec::new();
        for seed in [1, 2] {
            let frames = chat::stream(
                &stack.client().with_key(Some(&keys.batch)),
                &story(seed, 150),
            )
            .await;
            reference.push(read_stream(&frames));
        }
        let worker = stack.worker("base");
        let cancelled_before = worker.counters().await.expect("counters").cancelled;

        let flood = running_streams(&stack, &keys.batch, vec![story(1, 150), story(2, 150)]).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (ttft, frames) = time_to_first_token(&stack, &keys.premium, &short).await;
        let bound = isolated + DECODE_STEP + Duration::from_millis(100);
        assert!(
            ttft <= bound,
            "priority TTFT {ttft:?} on a full pool, isolated {isolated:?}: bound {bound:?}"
        );
        read_stream(&frames);

        for (task, expected) in flood.into_iter().zip(&reference) {
            let got = read_stream(&task.await.expect("task"));
            assert_eq!(got.0, expected.0, "the preempted stream's text");
            assert_eq!(got.1, expected.1, "its finish reason");
            assert_eq!(
                got.2["completion_tokens"], expected.2["completion_tokens"],
                "its usage: the whole generation once"
            );
            assert_eq!(got.2["prompt_tokens"], expected.2["prompt_tokens"]);
        }
        let preempted = metric(
            &stack,
            "gateway_preemptions_total",
            &["model=\"base\"", "tier=\"flex\"", "org=\"org-batch\""],
        )
        .await;
        assert_eq!(
            preempted, 1.0,
            "one flex generation preempted for one request"
        );
        let moved = metric(
            &stack,
            "gateway_generation_moves_total",
            &["reason=\"preempted\"", "outcome=\"moved\""],
        )
        .await;
        assert_eq!(moved, 1.0, "and resumed through the migration path");
        assert_eq!(
            metric(&stack, "gateway_worker_circuit_open", &["model=\"base\""]).await,
            0.0,
            "a preemption is no worker failure"
        );
        let counters = worker.counters().await.expect("counters");
        assert_eq!(
            counters.cancelled - cancelled_before,
            1,
            "the preempted generation stopped on its worker"
        );
        assert_eq!(counters.failed, 0);
    })
    .await;
}

/// A non-streamed `flex` reply that was preempted is whole: the same body
/// the model gives without the preemption.
#[tokio::test]
async fn a_preempted_non_streamed_reply_is_whole() {
    bounded(60, async {
        let (stack, keys) = flooded_stack(1, "").await;
        let mut body = story(3, 150);
        body["stream"] = json!(false);
        body.as_object_mut().map(|b| b.remove("stream_options"));
        let batch = stack.client().with_key(Some(&keys.batch));
        let reference = batch
            .post_json("/chat/completions", &body)
            .await
            .expect("reply");
        assert_eq!(reference.status, 200, "{reference}");

        let flood = tokio::spawn({
            let (batch, body) = (batch.clone(), body.clone());
            async move { batch.post_json("/chat/completions", &body).await }
        });
        wait_until("the flex reply to run", Duration::from_secs(5), || async {
            stack
                .worker("base")
                .load()
                .await
                .is_ok_and(|l| l.running == 1)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_, frames) = time_to_first_token(&stack, &keys.standard, &story(9, 10)).await;
        read_stream(&frames);
        let got = flood.await.expect("task").expect("reply");
        assert_eq!(got.status, 200, "{got}");
        let (a, b) = (got.json(), reference.json());
        assert_eq!(chat::content(&a), chat::content(&b), "the whole text");
        assert_eq!(
            a["choices"][0]["finish_reason"],
            b["choices"][0]["finish_reason"]
        );
        assert_eq!(
            a["usage"]["completion_tokens"],
            b["usage"]["completion_tokens"]
        );
        assert_eq!(a["service_tier"], "flex");
        assert_eq!(
            metric(&stack, "gateway_preemptions_total", &["tier=\"flex\""]).await,
            1.0,
            "a default request preempts flex work too"
        );
    })
    .await;
}

/// `max_preemptions`: a generation preempted that many times runs to its
/// end; the next higher-tier request waits for its slot.
#[tokio::test]
async fn a_generation_is_preempted_at_most_max_preemptions_times() {
    bounded(60, async {
        let (stack, keys) = flooded_stack(1, "max_preemptions = 1").await;
        let flood = running_streams(&stack, &keys.batch, vec![story(4, 150)]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (first, _) = time_to_first_token(&stack, &keys.premium, &story(10, 5)).await;
        assert!(
            first < Duration::from_millis(500),
            "preempted for the first: {first:?}"
        );
        // The flex stream resumed; a second priority request must wait for it.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (second, _) = time_to_first_token(&stack, &keys.premium, &story(11, 5)).await;
        assert!(
            second > Duration::from_millis(500),
            "the preemption limit held: the second waited {second:?}"
        );
        let frames = flood.into_iter().next().expect("one").await.expect("task");
        read_stream(&frames);
        assert_eq!(
            metric(&stack, "gateway_preemptions_total", &["tier=\"flex\""]).await,
            1.0
        );
    })
    .await;
}

/// Who may be preempted is the tier's: a key whose plan caps it at `flex`
/// is preempted even when it asks for `priority`, and `default` work is
/// not preempted unless the pool says so (`preempt_tiers`).
#[tokio::test]
async fn the_plan_sets_the_tier_and_the_pool_the_tiers_preempted() {
    bounded(60, async {
        let (stack, keys) = flooded_stack(1, "").await;
        // Asks for priority; its plan serves it at flex.
        let mut asks_priority = story(5, 150);
        asks_priority["service_tier"] = json!("priority");
        let flood = running_streams(&stack, &keys.batch, vec![asks_priority]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (ttft, _) = time_to_first_token(&stack, &keys.premium, &story(12, 5)).await;
        assert!(
            ttft < Duration::from_millis(500),
            "flex preempted: {ttft:?}"
        );
        read_stream(&flood.into_iter().next().expect("one").await.expect("task"));

        // A default generation is not preempted by default.
        let running = running_streams(&stack, &keys.standard, vec![story(6, 100)]).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (waited, _) = time_to_first_token(&stack, &keys.premium, &story(13, 5)).await;
        assert!(
            waited > Duration::from_millis(500),
            "default work runs on: the priority request waited {waited:?}"
        );
        read_stream(
            &running
                .into_iter()
                .next()
                .expect("one")
                .await
                .expect("task"),
        );
        assert_eq!(
            metric(&stack, "gateway_preemptions_total", &["tier=\"default\""]).await,
            0.0
        );
    })
    .await;
}
