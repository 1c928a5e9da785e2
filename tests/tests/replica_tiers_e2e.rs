//! The pool's order across gateway replicas: two real replicas sharing one
//! Redis in front of one paced synthetic worker of 2 slots
//! ([`Replicas`]). Tier order and the organisations' fair shares hold for
//! the pool, not per replica, and a replica that dies with slots and
//! waiters does not starve its peer's requests. Preemption is off
//! (`max_preemptions = 0`) so only the queue's order shows, except where a
//! test is about preemption across replicas. Asserted from when each
//! client got its first token and its reply, and what it read.

use harness::replicas::Replicas;
use harness::{bounded, json, key_on_plan, wait_until, Client, Gateway, Value, WorkerOpts};
use std::time::{Duration, Instant};

/// Tokens per second of the paced worker.
const PACE: u64 = 100;

const PLANS: &str = "[plans.standard]\n[plans.premium]\nmax_service_tier = \"priority\"\n";

/// Both replicas with `keys` (config lines) in front of a worker of 2
/// slots, once both know its capacity; preemption off.
async fn replicas(keys: &str) -> Replicas {
    replicas_with(keys, "max_preemptions = 0\n").await
}

/// As [`replicas`], with `pool` lines in `[models.base]`.
async fn replicas_with(keys: &str, pool: &str) -> Replicas {
    let worker = WorkerOpts {
        max_concurrency: Some(2),
        ..WorkerOpts::paced(0, PACE)
    };
    let toml = format!("{keys}{PLANS}[models.base]\n{pool}");
    let r = Replicas::start(worker, &toml).expect("replicas");
    for gw in [&r.a, &r.b] {
        wait_until(
            "the replica to know the pool's capacity",
            Duration::from_secs(10),
            || async {
                let (_, page) = gw.admin_get("/metrics").await.expect("metrics");
                page.contains("gateway_worker_load_ratio{model=\"base\"}")
            },
        )
        .await;
    }
    r
}

/// A streamed reply of `tokens` tokens; the same prompt length for every
/// caller (the queue charges the prompt at dispatch).
fn body(tokens: u32, tier: &str) -> Value {
    json!({
        "model": "base",
        "messages": [{"role": "user", "content": format!("Tell it. synthetic:reply_tokens={tokens:04}")}],
        "stream": true,
        "service_tier": tier,
    })
}

/// When a request got its first token and when its reply ended, and the
/// text it read.
#[derive(Debug, Clone)]
struct Timed {
    first: Instant,
    done: Instant,
    text: String,
}

/// Sends `body` on its own task; its times once read to the end.
fn send(gw: &Gateway, key: &str, body: Value) -> tokio::task::JoinHandle<Timed> {
    let client: Client = gw.client().with_key(Some(key));
    tokio::spawn(async move {
        let mut stream = client
            .stream("/chat/completions", &body)
            .await
            .expect("stream");
        let mut first = None;
        let mut read = String::new();
        while let Some(frame) = stream.next_frame().await.expect("frame") {
            if frame.is_done() {
                continue;
            }
            let chunk = frame.json();
            assert!(chunk.get("error").is_none(), "no error frame: {chunk}");
            let text = chunk["choices"][0]["delta"]["content"].as_str();
            if first.is_none() && text.is_some_and(|t| !t.is_empty()) {
                first = Some(Instant::now());
            }
            read.push_str(text.unwrap_or_default());
        }
        Timed {
            first: first.expect("a first token"),
            done: Instant::now(),
            text: read,
        }
    })
}

async fn all(tasks: Vec<tokio::task::JoinHandle<Timed>>) -> Vec<Timed> {
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

/// Both slots busy with `org`'s long replies sent to replica A, long
/// enough for the replicas to see it (a heartbeat) and for the test's
/// waiters to queue behind it.
async fn fill(r: &Replicas, key: &str) -> Vec<tokio::task::JoinHandle<Timed>> {
    let tasks = vec![
        send(&r.a, key, body(150, "default")),
        send(&r.a, key, body(150, "default")),
    ];
    tokio::time::sleep(Duration::from_millis(800)).await;
    tasks
}

/// The case: 6 `default` requests waiting on replica A, 6
/// `priority` ones on replica B: every priority request starts before any
/// of the default ones (one replica: the same; per-replica order: 4 of 6
/// default ones went first).
#[tokio::test]
async fn a_priority_request_waiting_on_one_replica_goes_before_default_ones_waiting_on_the_other() {
    bounded(90, async {
        let (fill_toml, filler) = key_on_plan("org-fill", "standard");
        let (default_toml, standard) = key_on_plan("org-default", "standard");
        let (prio_toml, premium) = key_on_plan("org-prio", "premium");
        let r = replicas(&format!("{fill_toml}{default_toml}{prio_toml}")).await;
        let busy = fill(&r, &filler).await;
        let defaults: Vec<_> = (0..6)
            .map(|_| send(&r.a, &standard, body(30, "default")))
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let priorities: Vec<_> = (0..6)
            .map(|_| send(&r.b, &premium, body(30, "priority")))
            .collect();
        let defaults = all(defaults).await;
        let priorities = all(priorities).await;
        all(busy).await;
        let last_priority = priorities.iter().map(|t| t.first).max().expect("six");
        let early = defaults.iter().filter(|d| d.first < last_priority).count();
        assert_eq!(
            early,
            0,
            "default requests that started before the last priority one: {early} of 6\n{}",
            r.logs()
        );
    })
    .await;
}

/// Jain's fairness index of `shares`.
fn jain(shares: &[f64]) -> f64 {
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|s| s * s).sum();
    sum * sum / (shares.len() as f64 * squares)
}

/// Equal backlogged organisations split across the replicas (C on A, D and
/// E on B) share the pool evenly: Jain's index of the replies each got
/// while all three still had requests waiting is at least 0.98 (per
/// replica: C gets half, about 0.89).
#[tokio::test]
async fn equal_organisations_split_across_replicas_share_the_pool_evenly() {
    bounded(120, async {
        let (fill_toml, filler) = key_on_plan("org-fill", "standard");
        let (c_toml, c) = key_on_plan("org-c", "standard");
        let (d_toml, d) = key_on_plan("org-d", "standard");
        let (e_toml, e) = key_on_plan("org-e", "standard");
        let r = replicas(&format!("{fill_toml}{c_toml}{d_toml}{e_toml}")).await;
        let busy = fill(&r, &filler).await;
        const EACH: usize = 16;
        let backlog = |gw: &Gateway, key: &str| -> Vec<_> {
            (0..EACH)
                .map(|_| send(gw, key, body(10, "default")))
                .collect()
        };
        let c = backlog(&r.a, &c);
        let d = backlog(&r.b, &d);
        let e = backlog(&r.b, &e);
        let orgs = [all(c).await, all(d).await, all(e).await];
        all(busy).await;
        // The window: until the first organisation's backlog ran out.
        let end = orgs
            .iter()
            .map(|o| o.iter().map(|t| t.done).max().expect("replies"))
            .min()
            .expect("three");
        let served: Vec<f64> = orgs
            .iter()
            .map(|o| o.iter().filter(|t| t.done <= end).count() as f64)
            .collect();
        let index = jain(&served);
        eprintln!("replies in the window (C on A; D, E on B): {served:?}; Jain {index:.3}");
        assert!(
            index >= 0.98,
            "Jain's index {index:.3} over {served:?}\n{}",
            r.logs()
        );
    })
    .await;
}

/// A replica killed (SIGKILL) while it holds both slots and has requests
/// waiting: its entry lapses and the survivor serves its own waiting
/// requests within a few seconds (its peer's slots are not counted
/// forever).
#[tokio::test]
async fn a_killed_replica_s_slots_and_waiters_stop_counting_on_its_peer() {
    bounded(90, async {
        let (fill_toml, filler) = key_on_plan("org-fill", "premium");
        let (b_toml, b_key) = key_on_plan("org-b", "standard");
        let mut r = replicas(&format!("{fill_toml}{b_toml}")).await;
        let client = r.a.client().with_key(Some(&filler));
        // A's two long replies hold the slots; two more wait on A, at
        // priority, so its peer defers to them.
        let mut held = Vec::new();
        for _ in 0..2 {
            let c = client.clone();
            held.push(tokio::spawn(async move {
                c.stream("/chat/completions", &body(3000, "default")).await
            }));
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        let waiting_on_a: Vec<_> = (0..2)
            .map(|_| {
                let c = client.clone();
                tokio::spawn(
                    async move { c.stream("/chat/completions", &body(30, "priority")).await },
                )
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let b: Vec<_> = (0..3)
            .map(|_| send(&r.b, &b_key, body(30, "default")))
            .collect();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed = Instant::now();
        r.a.kill();
        for t in held.into_iter().chain(waiting_on_a) {
            t.abort();
        }
        let served = all(b).await;
        let last = served.iter().map(|t| t.first).max().expect("three");
        let after = last.saturating_duration_since(killed);
        // The entry lapses within 2 s; three replies of 0.3 s on 2 slots.
        assert!(
            after < Duration::from_secs(5),
            "the survivor's requests started {after:?} after its peer died\n{}",
            r.logs()
        );
    })
    .await;
}

/// Preemption across replicas: both slots hold `flex` streams sent to
/// replica A; a `priority` request sent to replica B, which runs nothing it
/// could preempt, has A preempt one of them and starts within a fraction
/// of a second (without it: when a flex stream ends, 3 s later). The
/// preempted stream reads as the other one does: every token, once.
#[tokio::test]
async fn a_priority_request_on_one_replica_preempts_flex_work_running_from_the_other() {
    bounded(90, async {
        let (flex_toml, flexer) = key_on_plan("org-flex", "standard");
        let (prio_toml, premium) = key_on_plan("org-prio", "premium");
        let r = replicas_with(&format!("{flex_toml}{prio_toml}"), "").await;
        const FLEX_TOKENS: u32 = 300;
        let flex: Vec<_> = (0..2)
            .map(|_| send(&r.a, &flexer, body(FLEX_TOKENS, "flex")))
            .collect();
        tokio::time::sleep(Duration::from_millis(800)).await;
        let sent = Instant::now();
        let prio = send(&r.b, &premium, body(10, "priority"))
            .await
            .expect("priority request");
        let waited = prio.first.saturating_duration_since(sent);
        let flex = all(flex).await;
        assert!(
            waited < Duration::from_millis(1000),
            "the priority request's first token came {waited:?} after it was sent\n{}",
            r.logs()
        );
        for f in &flex {
            let words = f.text.split_whitespace().count() + f.text.matches('.').count();
            assert_eq!(words, FLEX_TOKENS as usize, "a flex stream read whole: {}", f.text);
        }
        let (_, metrics) = r.a.admin_get("/metrics").await.expect("metrics");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("gateway_preemptions_total{") && l.contains("tier=\"flex\"")),
            "replica A counted the preemption:\n{metrics}"
        );
    })
    .await;
}
