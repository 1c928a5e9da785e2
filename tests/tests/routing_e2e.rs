//! Cache-aware routing end to end (`policy = "cache_aware"`): the workers
//! report what their engines hold (`Info.prefix_cache`) and the gateway
//! routes on it. Real gateways, real synthetic workers (their reports are
//! `estimated`: the prompts they were sent), loopback only.

use harness::prometheus::sample;
use harness::{bounded, chat, gateway_over, json, start_workers, Value, Worker, WorkerOpts};
use std::time::{Duration, Instant};

const CACHE_AWARE: &str = "[models.base]\npolicy = \"cache_aware\"\n";

/// Longer than one report interval of the gateway's checks (1 s).
const REPORT_INTERVAL: Duration = Duration::from_millis(1300);

/// A system prompt of about 1.5 KiB: a dozen prefix blocks.
fn system_prompt(app: &str) -> String {
    format!("You are the assistant of {app}. ")
        + &"Answer briefly and cite the handbook. ".repeat(40)
}

async fn started(workers: &[Worker]) -> Vec<u64> {
    let mut counts = Vec::new();
    for w in workers {
        counts.push(w.counters().await.expect("worker info").started);
    }
    counts
}

fn delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// The prefix blocks the gateway last heard `worker` report.
async fn reported_blocks(gateway: &harness::Gateway, worker: &Worker) -> f64 {
    let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
    sample(
        &page,
        "gateway_worker_cached_prefix_blocks",
        &[&format!("worker=\"{}\"", worker.addr())],
    )
}

/// Waits until `check` holds, polling every 100 ms; how long it took.
async fn within(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// A worker that restarts comes back with an empty cache and a new epoch:
/// the gateway forgets what the old one held within one report interval,
/// and the prompt it held is no longer pinned to it.
#[tokio::test]
async fn a_restarted_engine_loses_its_prefixes_within_one_report_interval() {
    bounded(60, async {
        let mut workers = start_workers("base", &[WorkerOpts::default(), WorkerOpts::default()]);
        let gateway = gateway_over(&workers, CACHE_AWARE);
        let client = gateway.client();
        let body = json!({"model": "base", "messages": [
            {"role": "system", "content": system_prompt("a bakery")},
            {"role": "user", "content": "Opening hours? synthetic:reply_tokens=3"}
        ]});
        let before = started(&workers).await;
        assert_eq!(chat::post(&client, &body).await.status, 200);
        let served = delta(&started(&workers).await, &before)
            .iter()
            .position(|&n| n == 1)
            .expect("one worker served");
        let held = within(Duration::from_secs(3), async || {
            reported_blocks(&gateway, &workers[served]).await >= 10.0
        })
        .await;
        assert!(held.is_some(), "the worker reports the prompt's blocks");
        // The same prompt keeps going where its prefix is.
        for _ in 0..4 {
            let before = started(&workers).await;
            assert_eq!(chat::post(&client, &body).await.status, 200);
            let d = delta(&started(&workers).await, &before);
            assert_eq!(d[served], 1, "follows its prefix: {d:?}");
        }
        let old_epoch = workers[served]
            .info()
            .await
            .unwrap()
            .prefix_cache
            .unwrap()
            .epoch;

        workers[served].restart().expect("worker restarts");
        let info = workers[served]
            .info()
            .await
            .expect("restarted worker answers");
        let report = info.prefix_cache.expect("a prefix report");
        assert_ne!(report.epoch, old_epoch, "a new cache, a new epoch");
        assert!(report.blocks.is_empty());
        let forgot = within(REPORT_INTERVAL + Duration::from_millis(700), async || {
            reported_blocks(&gateway, &workers[served]).await == 0.0
        })
        .await;
        assert!(
            forgot.is_some(),
            "the gateway forgets the old cache within one report interval"
        );
    })
    .await;
}

/// One prefix everybody uses, more concurrent requests than its engine has
/// slots: the load gate sends the overflow to the other engine's free
/// slots instead of queueing it behind the one that holds the prefix.
#[tokio::test]
async fn a_hot_prefix_spills_to_a_second_engine_under_load() {
    bounded(60, async {
        let two_slots = WorkerOpts {
            max_concurrency: Some(2),
            max_queue: Some(8),
            ..WorkerOpts::default()
        };
        let workers = start_workers("base", &[two_slots.clone(), two_slots]);
        let gateway = gateway_over(&workers, CACHE_AWARE);
        let client = gateway.client();
        let system = system_prompt("a railway");
        let ask = |q: &str| {
            json!({"model": "base", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": q}
            ]})
        };
        // Warm one engine and let the report say so. The gateway times it
        // too: a reply as long as the load's keeps a slot ~1 s, and the
        // prefill takes no time (a GPU), so waiting never pays here.
        let before = started(&workers).await;
        assert_eq!(
            chat::post(
                &client,
                &ask("Warm up. synthetic:reply_tokens=40 synthetic:slow_ms=25")
            )
            .await
            .status,
            200
        );
        let hot = delta(&started(&workers).await, &before)
            .iter()
            .position(|&n| n == 1)
            .expect("one worker served");
        tokio::time::sleep(REPORT_INTERVAL).await;

        // Four slow replies at once on the hot prefix.
        let before = started(&workers).await;
        let bodies: Vec<Value> = (0..4)
            .map(|i| {
                ask(&format!(
                    "Question {i}. synthetic:reply_tokens=40 synthetic:slow_ms=25"
                ))
            })
            .collect();
        // One at a time into the gateway, so each sees the last's slot.
        let pending = bodies.iter().enumerate().map(|(i, body)| {
            let client = &client;
            async move {
                tokio::time::sleep(Duration::from_millis(50) * i as u32).await;
                chat::post(client, body).await
            }
        });
        let replies = futures::future::join_all(pending).await;
        assert!(replies.iter().all(|r| r.status == 200));
        let d = delta(&started(&workers).await, &before);
        assert_eq!(d[hot], 2, "the hot engine fills its two slots: {d:?}");
        assert_eq!(d[1 - hot], 2, "the overflow takes the other engine: {d:?}");
        for w in &workers {
            let c = w.counters().await.unwrap();
            assert_eq!(c.rejected, 0);
        }
    })
    .await;
}

/// Engines whose prefill is slow beside how long a request keeps a slot
/// (a CPU): once the gateway has measured both, a request whose long
/// prefix one engine holds waits for that engine's slot instead of
/// prefilling the whole prompt on the idle one; the reply shows the prefix
/// reused.
#[tokio::test]
async fn a_busy_engine_holding_a_long_prefix_is_waited_for_when_its_prefill_would_take_longer() {
    bounded(90, async {
        let one_slot_slow_prefill = WorkerOpts {
            max_concurrency: Some(1),
            max_queue: Some(8),
            extra_args: vec!["--prefill-tokens-per-second".into(), "4000".into()],
            ..WorkerOpts::default()
        };
        let workers = start_workers(
            "base",
            &[one_slot_slow_prefill.clone(), one_slot_slow_prefill],
        );
        let gateway = gateway_over(&workers, CACHE_AWARE);
        let client = gateway.client();
        let ask = |system: &str, q: &str| {
            json!({"model": "base", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": q}
            ]})
        };
        // Each engine measured: apps of their own until both served one.
        let before = started(&workers).await;
        for app in 0..40 {
            if delta(&started(&workers).await, &before)
                .iter()
                .all(|&n| n > 0)
            {
                break;
            }
            let body = ask(
                &system_prompt(&format!("app {app}")),
                "Hi. synthetic:reply_tokens=2",
            );
            assert_eq!(chat::post(&client, &body).await.status, 200);
        }
        let served = delta(&started(&workers).await, &before);
        assert!(
            served.iter().all(|&n| n > 0),
            "both engines measured: {served:?}"
        );
        // The metrics page shows what the routing weighs.
        for w in &workers {
            let measured = within(REPORT_INTERVAL * 2, async || {
                let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
                let worker = format!("worker=\"{}\"", w.addr());
                ["measure=\"prefill_per_block\"", "measure=\"slot_hold\""]
                    .iter()
                    .all(|m| sample(&page, "gateway_worker_engine_seconds", &[&worker, m]) > 0.0)
            })
            .await;
            assert!(
                measured.is_some(),
                "gateway_worker_engine_seconds for {}",
                w.addr()
            );
        }

        // A prompt of ~3,000 tokens (0.75 s of prefill here) on one engine.
        let long = "Follow the railway's operating handbook to the letter. ".repeat(280);
        let before = started(&workers).await;
        let warm = chat::post(&client, &ask(&long, "Warm up. synthetic:reply_tokens=2")).await;
        assert_eq!(warm.status, 200);
        let holder = delta(&started(&workers).await, &before)
            .iter()
            .position(|&n| n == 1)
            .expect("one worker served");

        // Its one slot busy for ~300 ms with the same prefix; then one more.
        let before = started(&workers).await;
        let busy_body = ask(
            &long,
            "First. synthetic:reply_tokens=10 synthetic:slow_ms=30",
        );
        let busy = chat::post(&client, &busy_body);
        let next = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            chat::post(&client, &ask(&long, "Second. synthetic:reply_tokens=2")).await
        };
        let (busy, next) = futures::future::join(busy, next).await;
        assert_eq!((busy.status, next.status), (200, 200));
        let d = delta(&started(&workers).await, &before);
        assert_eq!(
            d[holder], 2,
            "both went to the engine holding the prefix: {d:?}"
        );
        let next = next.json();
        let prompt = next["usage"]["prompt_tokens"].as_u64().expect("usage");
        let cached = next["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens");
        assert!(cached * 10 >= prompt * 9, "the prefix was reused: {next}");
    })
    .await;
}

/// Two gateway replicas that share nothing but the workers: a conversation
/// whose turns alternate between them stays on the engine holding it,
/// because both read the same reports from the workers. The conversations
/// stay under 1 KiB, so their head (the fallback's rendezvous key) changes
/// every turn: only the reports keep a conversation home.
#[tokio::test]
async fn two_gateway_replicas_route_one_conversation_to_the_same_engine() {
    bounded(90, async {
        let workers = start_workers(
            "base",
            &[WorkerOpts::default(), WorkerOpts::default(), WorkerOpts::default()],
        );
        let replicas = [gateway_over(&workers, CACHE_AWARE), gateway_over(&workers, CACHE_AWARE)];
        // Three conversations at once, each its own system prompt, so the
        // engines fill with different prefixes.
        let mut conversations: Vec<Vec<Value>> = ["a library", "a garage", "a clinic"]
            .iter()
            .map(|app| {
                let system = format!("You help the visitors of {app}. ") + &"Answer briefly. ".repeat(12);
                vec![json!({"role": "system", "content": system})]
            })
            .collect();
        let mut homes: Vec<Option<usize>> = vec![None; conversations.len()];
        for turn in 0..6 {
            for (c, messages) in conversations.iter_mut().enumerate() {
                messages.push(json!({"role": "user", "content": format!("Turn {turn} of {c}. synthetic:reply_tokens=6")}));
                let client = replicas[(turn + c) % 2].client();
                let before = started(&workers).await;
                let r = chat::post(&client, &json!({"model": "base", "messages": messages})).await;
                assert_eq!(r.status, 200, "{r}");
                let d = delta(&started(&workers).await, &before);
                let served = d.iter().position(|&n| n == 1).expect("one worker served");
                match homes[c] {
                    None => homes[c] = Some(served),
                    Some(home) => assert_eq!(
                        served, home,
                        "turn {turn} of conversation {c} left its engine: {d:?}"
                    ),
                }
                messages.push(json!({"role": "assistant", "content": chat::content(&r.json())}));
            }
            // The other replica learns from the workers' next report.
            tokio::time::sleep(REPORT_INTERVAL).await;
        }
    })
    .await;
}
