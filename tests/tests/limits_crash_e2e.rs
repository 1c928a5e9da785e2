//! A replica that dies frees its organisations' concurrency slots within one
//! lease (issue 26, defect 4): two gateway replicas share Redis, replica A
//! holds both slots of a plan with slow streams and is SIGKILLed; replica B
//! refuses with a `retry-after` that tells the truth, then admits once A's
//! unrenewed slots lapse (a lease, not the old 900 s TTL).

use harness::{assert_error, chat_body, stream_body, Client, Gateway, Stack, WorkerOpts};
use std::time::{Duration, Instant};

/// Short, so the test is: A's slots lapse this long after its last renewal.
const LEASE_MS: u64 = 3000;
const HEARTBEAT_MS: u64 = 300;

/// `retry-after-ms` and `retry-after` (whole seconds) of a 429.
#[track_caller]
fn retry_after(r: &harness::Reply) -> (u64, u64) {
    let num = |name: &str| -> u64 {
        r.header(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no numeric {name} on {r}"))
    };
    let (ms, secs) = (num("retry-after-ms"), num("retry-after"));
    assert_eq!(secs, ms.div_ceil(1000).max(1), "{r}");
    (ms, secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicas_slots_free_within_a_lease_and_retry_after_says_when() {
    let mut stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::default())
        .redis()
        .extra_toml(&format!(
            "[store]\nlease_millis = {LEASE_MS}\nheartbeat_millis = {HEARTBEAT_MS}\n"
        ))
        .start()
        .expect("stack starts");
    let b = Gateway::start(stack.gateway.opts().clone()).expect("replica B starts");
    stack.cli(&["plans", "set", "two", "--max-concurrent", "2"]);
    let key = stack
        .cli(&["keys", "create", "--org", "org-crash", "--plan", "two"])
        .trim()
        .to_string();
    assert!(key.starts_with("sk-"), "{key}");
    let on_a = Client::new(&stack.gateway.base_url(), Some(&key));
    let on_b = Client::new(&b.base_url(), Some(&key));
    let quick = chat_body("base", "hi synthetic:reply_tokens=1");

    // A takes both slots with streams that would run for minutes.
    let slow = stream_body(
        "base",
        "Go on. synthetic:reply_tokens=5000 synthetic:slow_ms=100",
    );
    let mut streams = Vec::new();
    for _ in 0..2 {
        let mut s = on_a.stream("/chat/completions", &slow).await.unwrap();
        assert_eq!(s.status, 200);
        s.next_frame().await.unwrap().expect("a first frame");
        streams.push(s);
    }

    // Past one lease, A's heartbeat still holds them; their owner is alive,
    // so B's refusal is a short hint.
    tokio::time::sleep(Duration::from_millis(LEASE_MS + 500)).await;
    let r = on_b.post_json("/chat/completions", &quick).await.unwrap();
    assert_error(&r, 429, "rate_limit_exceeded");
    let (ms, secs) = retry_after(&r);
    assert!((1..=1000).contains(&ms) && secs == 1, "live owner: {r}");

    // A (the stack's gateway) dies without settling anything.
    stack.gateway.kill();
    let killed = Instant::now();

    // B refuses until the slots lapse. Once A has missed two renewals, the
    // refusal names the lapse (beyond the 1 s hint): retrying then works.
    let (said, asked) = loop {
        assert!(
            killed.elapsed() < Duration::from_millis(LEASE_MS + 2000),
            "no refusal named the lapse of the dead replica's slots"
        );
        let sent = Instant::now();
        let r = on_b.post_json("/chat/completions", &quick).await.unwrap();
        assert_error(&r, 429, "rate_limit_exceeded");
        let (ms, _) = retry_after(&r);
        assert!(ms <= LEASE_MS, "no slot outlives a lease: {r}");
        eprintln!(
            "{:?} after the kill: 429, retry after {ms} ms",
            sent - killed
        );
        if ms > 1000 {
            break (Duration::from_millis(ms), sent);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(said.saturating_sub(asked.elapsed()) + Duration::from_millis(50)).await;
    let r = on_b.post_json("/chat/completions", &quick).await.unwrap();
    assert_eq!(r.status, 200, "admitted when the refusal said: {r}");
    let freed = killed.elapsed();
    eprintln!("admitted {freed:?} after the kill (lease {LEASE_MS} ms)");
    assert!(
        freed < Duration::from_millis(LEASE_MS + 1500),
        "freed within about one lease, took {freed:?}"
    );
    // The second slot is free too: both lapsed with their owner.
    let r = on_b.post_json("/chat/completions", &quick).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    drop(streams);
}
