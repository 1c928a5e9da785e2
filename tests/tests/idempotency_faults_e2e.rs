//! `Idempotency-Key` claims through the faults of a fleet (issue 53, item
//! 1): two gateway replicas on one Redis (`harness::replicas`). A claim is
//! a short lease its replica renews while the request runs, so it frees
//! within one lease of its holder's loss; an outcome the store does not
//! take at once is written in the background until it does. Before, a
//! claim was one lease of `request_timeout_seconds` + 30 s (630 s at the
//! defaults, which these tests keep) and an outcome was written once.

use harness::replicas::Replicas;
use harness::{bounded, json, Client, Reply, Value, WorkerOpts};
use reqwest::Method;
use std::time::{Duration, Instant};

async fn post(client: &Client, key: &str, body: &Value) -> anyhow::Result<Reply> {
    client
        .send(
            client
                .request(Method::POST, "/chat/completions")
                .header("Idempotency-Key", key)
                .json(body),
        )
        .await
}

/// Retries `body` under `key` on `client`, as the SDKs do (honouring a
/// 409's `retry-after`), until an answer other than 409; that answer, how
/// many 409s came first, and when the last of them was sent (when the
/// key was last seen held). Fails after `within`.
async fn retry_until_answered(
    client: &Client,
    key: &str,
    body: &Value,
    within: Duration,
    logs: impl Fn() -> String,
) -> (Reply, usize, Option<Instant>) {
    let deadline = Instant::now() + within;
    let (mut in_use, mut held_at) = (0, None);
    loop {
        let sent = Instant::now();
        let r = post(client, key, body)
            .await
            .expect("the retry is answered");
        if r.status != 409 {
            return (r, in_use, held_at);
        }
        held_at = Some(sent);
        assert_eq!(r.json()["error"]["code"], "idempotency_key_in_use", "{r}");
        in_use += 1;
        assert!(
            Instant::now() < deadline,
            "still 409 after {within:?}: {r}\n{}",
            logs()
        );
        let wait: u64 = r
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        tokio::time::sleep(Duration::from_secs(wait).min(Duration::from_millis(500))).await;
    }
}

async fn started(r: &Replicas) -> u64 {
    r.worker.counters().await.expect("worker counters").started
}

/// The audit's first case: a request with a key on A, A SIGKILLed 2 s in.
/// Retries on B are told to wait only until the claim's lease (2 s, and a
/// heartbeat) runs out, then the request runs on B, once: a retry after
/// that is the same reply, replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_frees_within_one_lease_of_its_replicas_death() {
    bounded(120, async {
        let leases = "[store]\nlease_millis = 2000\nheartbeat_millis = 500\n";
        let mut r = Replicas::start(WorkerOpts::paced(0, 20), leases).expect("replicas");
        let key = format!("killed-{}", harness::random_hex(8));
        // 200 tokens at 20 a second: ten seconds, far longer than a lease.
        let body = json!({"model": "base", "messages": [{"role": "user", "content": "synthetic:reply_tokens=200 go"}]});
        let first = tokio::spawn({
            let (client, key, body) = (r.a.client(), key.clone(), body.clone());
            async move { post(&client, &key, &body).await }
        });
        // Past several leases, the claim is still held: renewed.
        tokio::time::sleep(Duration::from_millis(5000)).await;
        let busy = post(&r.b.client(), &key, &body).await.expect("answered");
        harness::assert_error(&busy, 409, "idempotency_key_in_use");
        assert_eq!(busy.header("retry-after"), Some("2"), "{busy}");

        r.a.kill();
        let killed = Instant::now();
        let lost = first.await.expect("the first request's task");
        assert!(
            !lost.as_ref().is_ok_and(|r| r.status == 200),
            "the killed replica answered: {lost:?}"
        );
        let (ran, in_use, held_at) =
            retry_until_answered(&r.b.client(), &key, &body, Duration::from_secs(60), || {
                r.logs()
            })
            .await;
        // The last retry told to wait, from the kill: the claim held at most
        // this long (the next retry, half a second later, ran).
        let freed = held_at.map_or(Duration::ZERO, |at| at.duration_since(killed));
        println!("a killed holder's claim freed in {freed:?} ({in_use} retries told to wait)");
        assert_eq!(ran.status, 200, "{ran}");
        assert_eq!(ran.header("idempotent-replayed"), None, "{ran}");
        // One lease and a heartbeat (2.5 s), and a margin.
        assert!(
            freed < Duration::from_millis(2500 + 2000),
            "the claim held {freed:?} after its replica died"
        );
        // The client got one reply: from now on, the same one.
        let before = started(&r).await;
        let again = post(&r.b.client(), &key, &body).await.expect("answered");
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{again}");
        assert_eq!(again.body, ran.body);
        assert_eq!(started(&r).await, before, "a replay runs nothing");
    })
    .await;
}

/// The audit's second case: a Redis stall shorter than one lease over the
/// end of the first request. The client gets its reply; the outcome write
/// that met the stall is retried until the store answers, so retries on B
/// get the first outcome replayed: not a 409 for minutes, not a second run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_write_that_meets_a_store_stall_lands_when_the_store_answers() {
    bounded(120, async {
        let leases = "[store]\nlease_millis = 4000\nheartbeat_millis = 1000\n";
        let r = Replicas::start(WorkerOpts::paced(0, 20), leases).expect("replicas");
        let key = format!("stalled-{}", harness::random_hex(8));
        // 50 tokens at 20 a second: the reply ends about 2.5 s in.
        let body = json!({"model": "base", "messages": [{"role": "user", "content": "synthetic:reply_tokens=50 go"}]});
        let before = started(&r).await;
        let sent = Instant::now();
        let first = tokio::spawn({
            let (client, key, body) = (r.a.client(), key.clone(), body.clone());
            async move { post(&client, &key, &body).await }
        });
        tokio::time::sleep(Duration::from_millis(1000)).await;
        // 3.5 s: shorter than one lease (4 s), over the reply's end.
        r.link_a.stall(Duration::from_millis(3500));
        let first = first.await.expect("task").expect("the first is answered");
        println!("the first reply took {:?} (stall from 1 s to 4.5 s)", sent.elapsed());
        assert_eq!(first.status, 200, "{first}");
        let (again, in_use, _) =
            retry_until_answered(&r.b.client(), &key, &body, Duration::from_secs(30), || {
                r.logs()
            })
            .await;
        println!(
            "the outcome replayed {:?} after the first request ({in_use} retries told to wait)",
            sent.elapsed()
        );
        assert_eq!(again.status, 200, "{again}");
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{again}");
        assert_eq!(again.body, first.body);
        assert_eq!(started(&r).await - before, 1, "one generation");
    })
    .await;
}
