//! `soak`: mixed traffic at a fixed rate for a long time, with a network
//! fault every interval, then an audit of what is stored.
//!
//! It starts a gateway on Redis and three synthetic `base` workers, each
//! behind a [`FaultProxy`] (and one in front of Redis), and sends chat
//! completions (streaming and not), stored responses, background runs and
//! cancels of running ones. Every `--fault-every` seconds the next fault of
//! a fixed rotation hits a link (Redis stall and partition, a worker link
//! partitioned, slowed or refusing, every connection dropped) and heals.
//! Runs get a short request deadline (`--run-timeout-secs`), so the
//! contract "every run ends by its deadline plus a lease" is checked while
//! the traffic runs: every 15 s a monitor reads, straight from Redis, the
//! status of every run older than that bound and reports (and describes)
//! any still going. At the end it waits for every run to end (bounded by
//! `--drain-secs`) and reports the answers by kind and status, every
//! background run that is not terminal (the figure that must be zero),
//! every run that was ever seen overdue, and every event log that does not
//! end in exactly one terminal event.
//!
//! ```text
//! cargo run --release -p tests --bin soak -- --minutes 30 --rate 500
//! ```
//! Loopback only; bounded in time and count.

use anyhow::{Context, Result};
use clap::Parser;
use harness::replicas::{output_text, streamed_text};
use harness::{FaultProxy, Gateway, GatewayOpts, RedisScope, WorkerOpts};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Mixed traffic with a network fault every interval; audits stored runs")]
struct Args {
    /// How long to send traffic.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Requests per second, all kinds together.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Seconds between faults.
    #[arg(long, default_value_t = 60)]
    fault_every: u64,
    /// Most requests in flight; beyond it a tick's request is skipped (and counted).
    #[arg(long, default_value_t = 4000)]
    max_in_flight: usize,
    /// The gateway's request deadline: every run must be terminal by this
    /// plus a lease and a sweep.
    #[arg(long, default_value_t = 60)]
    run_timeout_secs: u64,
    /// After the traffic, how long runs may take to end before those still
    /// going count as stranded (at least the deadline plus a lease).
    #[arg(long, default_value_t = 90)]
    drain_secs: u64,
}

const LEASE_MILLIS: u64 = 3000;
const LEASES: &str =
    "[store]\nlease_millis = 3000\nheartbeat_millis = 500\nsweep_interval_millis = 500\n";

/// Background runs created so far, with when their create was answered.
type Runs = Arc<Mutex<Vec<(String, Instant)>>>;

/// Foreground stored responses as their clients got them: id, status and
/// output text, checked against the store at the end.
type Told = Arc<Mutex<Vec<(String, String, String)>>>;

/// Answers by (kind, outcome).
type Tally = Arc<Mutex<BTreeMap<(&'static str, String), u64>>>;

fn count(tally: &Tally, kind: &'static str, outcome: impl Into<String>) {
    if let Ok(mut t) = tally.lock() {
        *t.entry((kind, outcome.into())).or_default() += 1;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let scope =
        Arc::new(RedisScope::new().context("the Redis on TEST_REDIS_URL or 127.0.0.1:6379")?);
    let redis_proxy = FaultProxy::start(scope.addr()?)?;
    let opts = WorkerOpts::paced(0, 2000);
    let workers = harness::start_workers("base", &[opts.clone(), opts.clone(), opts]);
    let worker_proxies: Vec<FaultProxy> = workers
        .iter()
        .map(|w| FaultProxy::start(w.addr().parse()?))
        .collect::<Result<_>>()?;
    let mut opts = GatewayOpts {
        redis: Some((redis_proxy.redis_url(), scope.prefix().to_string())),
        extra_toml: format!(
            "request_timeout_seconds = {}\n{LEASES}",
            args.run_timeout_secs
        ),
        ..GatewayOpts::default()
    };
    opts.workers.insert(
        "base".into(),
        worker_proxies
            .iter()
            .map(|p| p.addr().to_string())
            .collect(),
    );
    let gateway = Gateway::start(opts)?;
    let client = gateway.client();
    let tally: Tally = Arc::default();
    let runs: Runs = Arc::default();
    let told: Told = Arc::default();
    // A run still going past this bound broke the contract.
    let bound =
        Duration::from_secs(args.run_timeout_secs + 5) + Duration::from_millis(LEASE_MILLIS);
    let overdue = tokio::spawn(monitor(scope.clone(), runs.clone(), tally.clone(), bound));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(args.max_in_flight));

    println!(
        "soak: {} min at {} req/s, a fault every {} s (load average at start: {})",
        args.minutes,
        args.rate,
        args.fault_every,
        load_average()
    );
    let started = Instant::now();
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut next_fault = started + Duration::from_secs(args.fault_every);
    let mut faults = 0usize;
    let mut n: u64 = 0;
    while started.elapsed() < duration {
        tick.tick().await;
        if Instant::now() >= next_fault {
            inject(faults, &redis_proxy, &worker_proxies);
            faults += 1;
            next_fault += Duration::from_secs(args.fault_every);
        }
        n += 1;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            count(&tally, "skipped", "max in flight");
            continue;
        };
        let (client, tally, runs, told) =
            (client.clone(), tally.clone(), runs.clone(), told.clone());
        tokio::spawn(async move {
            one_request(n, &client, &tally, &runs, &told).await;
            drop(permit);
        });
    }
    println!("traffic done after {n} requests, {faults} faults; healing and waiting");
    redis_proxy.heal();
    for p in &worker_proxies {
        p.heal();
    }
    // Requests still running, then a lease and a few sweeps.
    let _ = tokio::time::timeout(
        Duration::from_secs(120),
        in_flight.acquire_many(args.max_in_flight as u32),
    )
    .await;
    // Background runs go on after their create answered: wait until every
    // one ended (each is bounded by the request deadline, and a lost one by
    // its lease plus a sweep), then audit.
    let ids: Vec<String> = runs
        .lock()
        .map(|r| r.iter().map(|(id, _)| id.clone()).collect())
        .unwrap_or_default();
    let drain_started = Instant::now();
    let drain_limit = Duration::from_secs(args.drain_secs);
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut pending = ids.clone();
    loop {
        let statuses = statuses(&scope, &pending)?;
        let mut still = Vec::new();
        for (id, status) in pending.into_iter().zip(statuses) {
            if matches!(status.as_str(), "queued" | "in_progress") {
                still.push(id);
            } else {
                *by_status.entry(status).or_default() += 1;
            }
        }
        pending = still;
        println!(
            "[{}] runs not yet terminal: {} (after {:.0} s)",
            chrono_like_now(),
            pending.len(),
            drain_started.elapsed().as_secs_f64()
        );
        if pending.is_empty() || drain_started.elapsed() >= drain_limit {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let stranded = pending;
    for status in statuses(&scope, &stranded)? {
        *by_status.entry(status).or_default() += 1;
    }
    overdue.abort();
    let ever_overdue = OVERDUE_SEEN.load(std::sync::atomic::Ordering::Relaxed);
    let (bad_logs, replay_mismatches) = audit_logs(&scope, &ids)?;
    // Final writes deferred by a fault land within their retries: give them
    // a minute, then every stored response must say what its client got.
    let told = told.lock().map(|t| t.clone()).unwrap_or_default();
    let mut told_mismatches = audit_told(&scope, &told)?;
    let settle_started = Instant::now();
    while told_mismatches > 0 && settle_started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        told_mismatches = audit_told(&scope, &told)?;
    }

    println!("\nanswers by kind and outcome:");
    if let Ok(t) = tally.lock() {
        for ((kind, outcome), n) in t.iter() {
            println!("  {kind:<12} {outcome:<28} {n}");
        }
    }
    println!("\nbackground runs by final status ({} runs):", ids.len());
    for (s, n) in &by_status {
        println!("  {s:<12} {n}");
    }
    println!("event logs not ending in exactly one terminal event: {bad_logs}");
    println!(
        "runs whose replayed text differs from their stored output: {replay_mismatches} of {}",
        ids.len()
    );
    println!(
        "stored responses differing from what their client got: {told_mismatches} of {}",
        told.len()
    );
    println!(
        "runs seen still going past their deadline + lease ({} s) while the traffic ran: {ever_overdue}",
        bound.as_secs()
    );
    println!(
        "drain: {:.0} s after the traffic; non-terminal runs at the end: {}",
        drain_started.elapsed().as_secs_f64(),
        stranded.len()
    );
    for id in stranded.iter().take(10) {
        println!("  {}", describe(&scope, id));
    }
    println!("load average at end: {}", load_average());
    if !stranded.is_empty()
        || bad_logs > 0
        || ever_overdue > 0
        || replay_mismatches > 0
        || told_mismatches > 0
    {
        anyhow::bail!("stranded or overdue runs, bad event logs, or a store that disagrees with what clients were told");
    }
    Ok(())
}

/// The fault rotation; each heals itself after a while.
fn inject(i: usize, redis: &FaultProxy, workers: &[FaultProxy]) {
    let at = chrono_like_now();
    match i % 6 {
        0 => {
            println!("[{at}] fault: Redis stall 1 s");
            redis.stall(Duration::from_secs(1));
        }
        1 => {
            println!("[{at}] fault: Redis partition 5 s");
            redis.partition();
            heal_later(redis, Duration::from_secs(5));
        }
        2 => {
            println!("[{at}] fault: worker 0 link partition 10 s");
            workers[0].partition();
            heal_later(&workers[0], Duration::from_secs(10));
        }
        3 => {
            println!("[{at}] fault: worker 1 link +50 ms for 20 s");
            workers[1].set_latency(Duration::from_millis(50));
            heal_later(&workers[1], Duration::from_secs(20));
        }
        4 => {
            println!("[{at}] fault: worker 2 refuses new connections and drops its own for 10 s");
            workers[2].refuse(true);
            workers[2].drop_connections();
            heal_later(&workers[2], Duration::from_secs(10));
        }
        _ => {
            println!("[{at}] fault: every Redis connection dropped");
            redis.drop_connections();
        }
    }
}

/// Heals `proxy` after `after` (the proxy handle is shared by address: a
/// clone of its control channel).
fn heal_later(proxy: &FaultProxy, after: Duration) {
    let healer = proxy.healer();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        healer();
    });
}

fn chrono_like_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02}Z",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One request of the mix, chosen by its number.
async fn one_request(n: u64, client: &harness::Client, tally: &Tally, runs: &Runs, told: &Told) {
    match n % 20 {
        // 45%: chat, half of it streaming.
        0..=8 => {
            let stream = n.is_multiple_of(2);
            let body = json!({"model": "base", "stream": stream,
                "messages": [{"role": "user", "content": "synthetic:reply_tokens=20 soak"}]});
            if stream {
                match client.stream("/chat/completions", &body).await {
                    Ok(s) if s.status == 200 => match s.collect().await {
                        Ok(frames) => {
                            let outcome = if frames.iter().any(|f| f.data.contains("\"error\"")) {
                                "200 in-band error"
                            } else if frames.last().is_some_and(|f| f.is_done()) {
                                "200 complete"
                            } else {
                                "200 cut short"
                            };
                            count(tally, "chat-stream", outcome);
                        }
                        Err(_) => count(tally, "chat-stream", "read error"),
                    },
                    Ok(s) => count(tally, "chat-stream", s.status.to_string()),
                    Err(_) => count(tally, "chat-stream", "transport error"),
                }
            } else {
                let r = client.post_json("/chat/completions", &body).await;
                count(tally, "chat", status_of(&r));
            }
        }
        // 30%: stored foreground responses.
        9..=14 => {
            let r = client
                .post_json(
                    "/responses",
                    &json!({"model": "base", "input": "synthetic:reply_tokens=20 soak"}),
                )
                .await;
            if let Ok(reply) = &r {
                if reply.status == 200 {
                    let object = reply.json();
                    if let (Some(id), Some(status)) =
                        (object["id"].as_str(), object["status"].as_str())
                    {
                        if let Ok(mut told) = told.lock() {
                            told.push((id.into(), status.into(), output_text(&object)));
                        }
                    }
                }
            }
            count(tally, "response", status_of(&r));
        }
        // 20%: background runs.
        15..=18 => {
            let r = client
                .post_json(
                    "/responses",
                    &json!({"model": "base", "input": "synthetic:reply_tokens=300 soak", "background": true}),
                )
                .await;
            if let Ok(reply) = &r {
                if reply.status == 200 {
                    if let Some(id) = reply.json()["id"].as_str() {
                        if let Ok(mut runs) = runs.lock() {
                            runs.push((id.to_string(), Instant::now()));
                        }
                    }
                }
            }
            count(tally, "background", status_of(&r));
        }
        // 5%: cancel the latest background run.
        _ => {
            let last = runs
                .lock()
                .ok()
                .and_then(|r| r.last().map(|(id, _)| id.clone()));
            let Some(id) = last else { return };
            let r = client
                .post_json(&format!("/responses/{id}/cancel"), &json!({}))
                .await;
            count(tally, "cancel", status_of(&r));
        }
    }
}

/// Runs seen going past their bound, all monitor passes together.
static OVERDUE_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The stored status of each run (`"absent"` for none), read straight from
/// Redis in pipelined batches: the audit must not wait on the gateway it
/// audits, nor take minutes over a hundred thousand runs.
fn statuses(scope: &RedisScope, ids: &[String]) -> Result<Vec<String>> {
    let mut conn = scope.connection()?;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(1000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.cmd("HGET")
                .arg(format!("{}resp:{{{id}}}", scope.prefix()))
                .arg("status");
        }
        let got: Vec<Option<String>> = pipe.query(&mut conn)?;
        out.extend(
            got.into_iter()
                .map(|s| s.unwrap_or_else(|| "absent".into())),
        );
    }
    Ok(out)
}

/// Every 15 s while the traffic runs: answers since the last pass that were
/// not a 200, and every run older than `bound` that is still going (each
/// counted once and described when first seen).
async fn monitor(scope: Arc<RedisScope>, runs: Runs, tally: Tally, bound: Duration) {
    let mut known_done: std::collections::HashSet<String> = Default::default();
    let mut reported: std::collections::HashSet<String> = Default::default();
    let mut last_tally: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
    let client_less = scope.clone();
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        let now = Instant::now();
        let old: Vec<String> = runs
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|(id, at)| now.duration_since(*at) > bound && !known_done.contains(id))
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default();
        let scope = client_less.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let statuses = statuses(&scope, &old)?;
            Ok::<_, anyhow::Error>(old.into_iter().zip(statuses).collect::<Vec<_>>())
        })
        .await;
        let Ok(Ok(checked)) = checked else {
            println!(
                "[{}] monitor: could not read run statuses",
                chrono_like_now()
            );
            continue;
        };
        let mut going = 0;
        for (id, status) in checked {
            if matches!(status.as_str(), "queued" | "in_progress") {
                going += 1;
                if reported.insert(id.clone()) {
                    OVERDUE_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if reported.len() <= 10 {
                        println!("  overdue: {}", describe(&client_less, &id));
                    }
                }
            } else {
                known_done.insert(id);
            }
        }
        let now_tally = tally.lock().map(|t| t.clone()).unwrap_or_default();
        let errors: Vec<String> = now_tally
            .iter()
            .filter(|((_, outcome), _)| !outcome.starts_with("200"))
            .filter_map(|(k, n)| {
                let delta = n - last_tally.get(k).copied().unwrap_or(0);
                (delta > 0).then(|| format!("{} {}: {delta}", k.0, k.1))
            })
            .collect();
        last_tally = now_tally;
        println!(
            "[{}] monitor: {going} runs past {} s still going; not-200 since last: {}",
            chrono_like_now(),
            bound.as_secs(),
            if errors.is_empty() {
                "none".to_string()
            } else {
                errors.join(", ")
            }
        );
    }
}

fn status_of(r: &Result<harness::Reply>) -> String {
    match r {
        Ok(reply) => {
            let code = serde_json::from_slice::<Value>(&reply.body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
            match code {
                Some(c) => format!("{} {c}", reply.status),
                None => reply.status.to_string(),
            }
        }
        Err(_) => "transport error".into(),
    }
}

/// What is stored of a stranded run: status, error, age, event log and
/// lease (straight from Redis).
fn describe(scope: &RedisScope, id: &str) -> String {
    let Ok(mut conn) = scope.connection() else {
        return format!("{id}: no Redis connection");
    };
    let obj: Option<String> = redis::cmd("HGET")
        .arg(format!("{}resp:{{{id}}}", scope.prefix()))
        .arg("obj")
        .query(&mut conn)
        .unwrap_or(None);
    let object: Value = obj
        .and_then(|o| serde_json::from_str(&o).ok())
        .unwrap_or(Value::Null);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let age = object["created_at"].as_u64().map(|c| now.saturating_sub(c));
    let key = format!("{}resp:{{{id}}}:events", scope.prefix());
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(&key)
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap_or_default();
    let last = entries
        .last()
        .and_then(|(_, f)| f.get(1).cloned())
        .unwrap_or_default();
    let lease: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{}runs:{{leases}}", scope.prefix()))
        .arg(id)
        .query(&mut conn)
        .unwrap_or(None);
    let lease_in = lease.map(|l| (l as i64 - now as i64 * 1000) as f64 / 1000.0);
    format!(
        "{id}: status {} error {} age {age:?} s, {} events (last {last:?}), lease ends in {lease_in:?} s, output tokens {}",
        object["status"],
        object["error"]["code"],
        entries.len(),
        object["usage"]["output_tokens"]
    )
}

/// Stored responses whose status or output text differ from what their
/// client was told (read from Redis directly, in pipelined batches).
fn audit_told(scope: &RedisScope, told: &[(String, String, String)]) -> Result<usize> {
    let mut conn = scope.connection()?;
    let mut differ = 0;
    for chunk in told.chunks(1000) {
        let mut pipe = redis::pipe();
        for (id, _, _) in chunk {
            pipe.cmd("HGET")
                .arg(format!("{}resp:{{{id}}}", scope.prefix()))
                .arg("obj");
        }
        let stored: Vec<Option<String>> = pipe.query(&mut conn)?;
        for ((id, status, text), obj) in chunk.iter().zip(stored) {
            let object: Value = obj
                .and_then(|o| serde_json::from_str(&o).ok())
                .unwrap_or(Value::Null);
            if object["status"] != status.as_str() || output_text(&object) != *text {
                differ += 1;
                if differ <= 10 {
                    println!(
                        "  told {status} but stored {} ({}): {id}",
                        object["status"], object["error"]["code"]
                    );
                }
            }
        }
    }
    Ok(differ)
}

/// Event logs that do not end in exactly one terminal event, and runs whose
/// replayed text is not their stored object's output (read from Redis
/// directly, not through the proxy).
fn audit_logs(scope: &RedisScope, ids: &[String]) -> Result<(usize, usize)> {
    let mut conn = scope.connection()?;
    let mut bad = 0;
    let mut mismatched = 0;
    for id in ids {
        let key = format!("{}resp:{{{id}}}:events", scope.prefix());
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query(&mut conn)?;
        let obj: Option<String> = redis::cmd("HGET")
            .arg(format!("{}resp:{{{id}}}", scope.prefix()))
            .arg("obj")
            .query(&mut conn)?;
        let object: Value = obj
            .and_then(|o| serde_json::from_str(&o).ok())
            .unwrap_or(Value::Null);
        let replayed: Vec<(String, Value)> = entries
            .iter()
            .map(|(_, f)| {
                let data = f.get(3).and_then(|d| serde_json::from_str(d).ok());
                (
                    f.get(1).cloned().unwrap_or_default(),
                    data.unwrap_or(Value::Null),
                )
            })
            .collect();
        if streamed_text(replayed.iter().map(|(n, d)| (n.as_str(), d))) != output_text(&object) {
            mismatched += 1;
            if mismatched <= 10 {
                println!(
                    "  replay differs from the stored object ({} {}): {id}",
                    object["status"], object["error"]["code"]
                );
            }
        }
        let terminal: Vec<usize> = entries
            .iter()
            .enumerate()
            .filter(|(_, (_, f))| {
                matches!(
                    f.get(1).map(String::as_str),
                    Some("response.completed" | "response.failed" | "response.incomplete")
                )
            })
            .map(|(i, _)| i)
            .collect();
        // A cancelled run's log ends without a terminal event of its own
        // only if it was cancelled before its first write; anything else
        // must end with exactly one.
        let ok = terminal.is_empty() && entries.is_empty()
            || terminal.len() == 1 && terminal[0] + 1 == entries.len();
        if !ok {
            bad += 1;
        }
    }
    Ok((bad, mismatched))
}
