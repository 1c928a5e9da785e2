//! `soak`: mixed traffic at a fixed rate for a long time, with a fault every
//! interval, then an audit of what is stored.
//!
//! Two gateways share three synthetic `base` workers, each worker behind a
//! [`FaultProxy`]: gateway A keeps its state in a persistent Redis (AOF,
//! fsync always) behind a proxy of its own, gateway B in a Redis Cluster
//! of three primaries with a replica each. Traffic alternates between them:
//! chat completions (streaming and not), stored responses, background runs
//! and cancels of running ones; on A, planner sessions also pause on a
//! caller's tool call and are resumed half a minute later. Every
//! `--fault-every` seconds the next fault of a fixed rotation hits: A's
//! Redis stalled for exactly one lease (the tolerated bound), partitioned,
//! restarted on its data (under paused planner sessions) or its
//! connections dropped; a worker link partitioned, slowed or refusing; a
//! primary of B's cluster killed and, once its replica took over, started
//! again (it returns as a replica); an idempotent create (`Idempotency-Key`)
//! on A's peer replica (a third gateway on A's Redis), that replica
//! SIGKILLed mid-reply and the create retried on A: the claim must free
//! (no more 409) within one lease of the kill, the retry answer with the
//! first's reply if the first had one, and the peer is started again.
//!
//! With `--worker-fault-every`, workers are also killed and rolled on
//! their own clock, in turn: one SIGKILLed and started again 3 s later
//! (a node lost, its pod rescheduled), the next drained with SIGTERM and
//! a grace period shorter than the longest replies, then started again (a
//! rollout). Their generations move to the other workers, so with
//! `--fault-every 0` (worker faults only) no answer may fail for a
//! worker's fault: any client-visible error but the store's refusal (503
//! `store_unavailable`, which a Redis slowed by the machine's load can
//! still cause) fails the run.
//!
//! Runs get a short request deadline (`--run-timeout-secs`), so the
//! contract "every run ends by its deadline plus a lease" is checked while
//! the traffic runs: every 15 s a monitor reads, straight from each store,
//! the status of every run older than that bound and reports (and
//! describes) any still going. At the end it waits for every run to end
//! (bounded by `--drain-secs`) and reports the answers by kind and status,
//! every background run that is not terminal (the figure that must be
//! zero), every run that was ever seen overdue, every event log that does
//! not end in exactly one terminal event, every stored response that
//! differs from what its client got, and every planner session whose
//! paused plan was lost, never resumed, or stayed locked past its lease.
//!
//! ```text
//! cargo run --release -p tests --bin soak -- --minutes 30 --rate 500
//! cargo run --release -p tests --bin soak -- --minutes 30 --rate 60 \
//!     --fault-every 0 --worker-fault-every 60 --reply-tokens 200 --tokens-per-second 100
//! ```
//! Loopback only; bounded in time and count.

use anyhow::{Context, Result};
use clap::Parser;
use harness::planner;
use harness::replicas::{output_text, streamed_text};
use harness::{FaultProxy, Gateway, GatewayOpts, PersistentRedis, RedisCluster, WorkerOpts};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "Mixed traffic with a fault every interval; audits what is stored")]
struct Args {
    /// How long to send traffic.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// Requests per second, all kinds together.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Seconds between faults of the store and link rotation (0: none).
    #[arg(long, default_value_t = 60)]
    fault_every: u64,
    /// Seconds between worker kills and rollouts, in turn (0: none).
    #[arg(long, default_value_t = 0)]
    worker_fault_every: u64,
    /// The workers' drain grace period: a rollout cuts longer replies,
    /// which must move.
    #[arg(long, default_value_t = 1)]
    worker_grace_secs: u64,
    /// Tokens of a chat or stored response reply (background runs: 300).
    #[arg(long, default_value_t = 20)]
    reply_tokens: u32,
    /// The simulated workers' decode speed per generation.
    #[arg(long, default_value_t = 2000)]
    tokens_per_second: u64,
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
    /// How long a planner session stays paused on its tool call before the
    /// caller answers it.
    #[arg(long, default_value_t = 30)]
    pause_secs: u64,
}

const LEASE_MILLIS: u64 = 3000;
const LEASES: &str = "lease_millis = 3000\nheartbeat_millis = 500\nsweep_interval_millis = 500\n";

/// A planner session's lock lease: a session must be free this long (and
/// a little) after whatever held it, even across a Redis restart.
const SESSION_LOCK_LEASE: Duration = Duration::from_secs(15);

/// Where one gateway keeps its state, read directly (never through the
/// gateway it audits, nor through a faulty link).
struct Store {
    name: &'static str,
    prefix: String,
    reader: Reader,
}

enum Reader {
    Single(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
}

impl Store {
    fn connection(&self) -> Result<Box<dyn redis::ConnectionLike + Send>> {
        Ok(match &self.reader {
            Reader::Single(c) => Box::new(c.get_connection()?),
            Reader::Cluster(c) => Box::new(c.get_connection()?),
        })
    }

    /// A response's hash (`suffix` ""), or its event log (":events").
    fn key(&self, id: &str, suffix: &str) -> String {
        format!("{}resp:{{{id}}}{suffix}", self.prefix)
    }

    /// `field` of each response's hash: pipelined in batches on one server,
    /// one command each on a cluster (a pipeline there goes to one node).
    fn fields(&self, ids: &[String], field: &str) -> Result<Vec<Option<String>>> {
        let mut conn = self.connection()?;
        let mut out = Vec::with_capacity(ids.len());
        match self.reader {
            Reader::Single(_) => {
                for chunk in ids.chunks(1000) {
                    let mut pipe = redis::pipe();
                    for id in chunk {
                        pipe.cmd("HGET").arg(self.key(id, "")).arg(field);
                    }
                    let got: Vec<Option<String>> = pipe.query(&mut *conn)?;
                    out.extend(got);
                }
            }
            Reader::Cluster(_) => {
                for id in ids {
                    out.push(
                        redis::cmd("HGET")
                            .arg(self.key(id, ""))
                            .arg(field)
                            .query(&mut *conn)?,
                    );
                }
            }
        }
        Ok(out)
    }
}

/// One gateway under test and the store it keeps its state in.
struct Target {
    client: harness::Client,
    store: Arc<Store>,
}

/// Background runs created so far: the target, the id and when its create
/// was answered.
type Runs = Arc<Mutex<Vec<(usize, String, Instant)>>>;

/// Foreground stored responses as their clients got them: target, id,
/// status and output text, checked against the store at the end.
type Told = Arc<Mutex<Vec<(usize, String, String, String)>>>;

/// Answers by (kind, outcome).
type Tally = Arc<Mutex<BTreeMap<(&'static str, String), u64>>>;

fn count(tally: &Tally, kind: &'static str, outcome: impl Into<String>) {
    if let Ok(mut t) = tally.lock() {
        *t.entry((kind, outcome.into())).or_default() += 1;
    }
}

/// What the faults act on.
struct Faulty {
    redis_link: FaultProxy,
    redis: Arc<Mutex<PersistentRedis>>,
    cluster: Arc<Mutex<RedisCluster>>,
    workers: Vec<FaultProxy>,
    /// The worker processes behind `workers`, killed and restarted in
    /// place.
    processes: Arc<Mutex<Vec<harness::Worker>>>,
    /// A's peer replica (on A's Redis), killed under an idempotent create.
    peer: Arc<Mutex<Gateway>>,
    peer_client: harness::Client,
    a_client: harness::Client,
    /// Tokens of the idempotent create: about four seconds of decoding.
    idempotent_tokens: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let redis = PersistentRedis::start(None).context("a persistent redis-server")?;
    let redis_link = FaultProxy::start(redis.addr())?;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(3))
        .await?
        .context("a Redis Cluster of 3 primaries and 3 replicas")?;
    let opts = WorkerOpts {
        grace_period_seconds: Some(args.worker_grace_secs),
        ..WorkerOpts::paced(0, args.tokens_per_second)
    };
    let workers = harness::start_workers("base", &[opts.clone(), opts.clone(), opts]);
    let worker_links: Vec<FaultProxy> = workers
        .iter()
        .map(|w| FaultProxy::start(w.addr().parse()?))
        .collect::<Result<_>>()?;
    let agent = harness::a2a_agents::TestAgent::start(
        "good",
        "Answers anything",
        harness::a2a_agents::Behavior::good(),
    )
    .await;

    let run = harness::random_hex(6);
    let (prefix_a, prefix_b) = (format!("soak:{run}:a:"), format!("soak:{run}:b:"));
    let gateway_opts = |url: String, prefix: &str, store_toml: &str, more: &str| {
        let mut opts = GatewayOpts {
            redis: Some((url, prefix.to_owned())),
            extra_toml: format!(
                "request_timeout_seconds = {}\n[store]\n{store_toml}{LEASES}{more}",
                args.run_timeout_secs
            ),
            ..GatewayOpts::default()
        };
        opts.workers.insert(
            "base".into(),
            worker_links.iter().map(|p| p.addr().to_string()).collect(),
        );
        opts
    };
    let gateway_a = Gateway::start(gateway_opts(
        redis_link.redis_url(),
        &prefix_a,
        "",
        &planner::config("allow_private_addresses = true\nhedge_after_ms = 400\n"),
    ))?;
    let gateway_b = Gateway::start(gateway_opts(
        cluster.urls(),
        &prefix_b,
        "redis_cluster = true\n",
        "",
    ))?;
    let mut peer_opts = gateway_opts(redis_link.redis_url(), &prefix_a, "", "");
    peer_opts.keys = gateway_a.keys().to_vec();
    let peer = Gateway::start(peer_opts)?;
    let cluster_urls: Vec<String> = cluster.urls().split(',').map(str::to_owned).collect();
    let targets = Arc::new(vec![
        Target {
            client: gateway_a.client(),
            store: Arc::new(Store {
                name: "A (Redis)",
                prefix: prefix_a,
                reader: Reader::Single(Box::new(redis::Client::open(redis.url())?)),
            }),
        },
        Target {
            client: gateway_b.client(),
            store: Arc::new(Store {
                name: "B (cluster)",
                prefix: prefix_b,
                reader: Reader::Cluster(Box::new(redis::cluster::ClusterClient::new(
                    cluster_urls,
                )?)),
            }),
        },
    ]);
    let faulty = Faulty {
        redis_link,
        redis: Arc::new(Mutex::new(redis)),
        cluster: Arc::new(Mutex::new(cluster)),
        workers: worker_links,
        processes: Arc::new(Mutex::new(workers)),
        peer_client: peer.client(),
        a_client: gateway_a.client(),
        peer: Arc::new(Mutex::new(peer)),
        idempotent_tokens: args.tokens_per_second * 4,
    };

    let tally: Tally = Arc::default();
    let runs: Runs = Arc::default();
    let told: Told = Arc::default();
    // A run still going past this bound broke the contract.
    let bound =
        Duration::from_secs(args.run_timeout_secs + 5) + Duration::from_millis(LEASE_MILLIS);
    let overdue = tokio::spawn(monitor(targets.clone(), runs.clone(), tally.clone(), bound));
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
    let sessions = tokio::spawn(planner_sessions(
        targets[0].client.clone(),
        agent.url(),
        started + duration,
        Duration::from_secs(args.pause_secs),
        Duration::from_secs(args.run_timeout_secs),
    ));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let every = |secs: u64| (secs > 0).then(|| Duration::from_secs(secs));
    let (fault_every, worker_fault_every) =
        (every(args.fault_every), every(args.worker_fault_every));
    let mut next_fault = fault_every.map(|d| started + d);
    let mut next_worker_fault = worker_fault_every.map(|d| started + d);
    let (mut faults, mut worker_faults) = (0usize, 0usize);
    let mut n: u64 = 0;
    while started.elapsed() < duration {
        tick.tick().await;
        if let (Some(at), Some(d)) = (next_fault.as_mut(), fault_every) {
            if Instant::now() >= *at {
                inject(faults, &faulty);
                faults += 1;
                *at += d;
            }
        }
        if let (Some(at), Some(d)) = (next_worker_fault.as_mut(), worker_fault_every) {
            if Instant::now() >= *at {
                hit_worker(worker_faults, &faulty, args.worker_grace_secs);
                worker_faults += 1;
                *at += d;
            }
        }
        n += 1;
        let reply_tokens = args.reply_tokens;
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            count(&tally, "skipped", "max in flight");
            continue;
        };
        let (targets, tally, runs, told) =
            (targets.clone(), tally.clone(), runs.clone(), told.clone());
        tokio::spawn(async move {
            one_request(n, reply_tokens, &targets, &tally, &runs, &told).await;
            drop(permit);
        });
    }
    println!(
        "traffic done after {n} requests, {faults} store and link faults, {worker_faults} worker kills and rollouts; healing and waiting"
    );
    faulty.redis_link.heal();
    for p in &faulty.workers {
        p.heal();
    }
    // Requests still running, then a lease and a few sweeps.
    let _ = tokio::time::timeout(
        Duration::from_secs(120),
        in_flight.acquire_many(args.max_in_flight as u32),
    )
    .await;
    let sessions = sessions.await.unwrap_or_else(|e| {
        let mut broken = Sessions::default();
        broken.violated("the session driver failed", "-", &e.to_string());
        broken
    });
    // Background runs go on after their create answered: wait until every
    // one ended (each is bounded by the request deadline, and a lost one by
    // its lease plus a sweep), then audit.
    let runs: Vec<(usize, String)> = runs
        .lock()
        .map(|r| r.iter().map(|(t, id, _)| (*t, id.clone())).collect())
        .unwrap_or_default();
    let drain_started = Instant::now();
    let drain_limit = Duration::from_secs(args.drain_secs);
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut pending = runs.clone();
    loop {
        let statuses = statuses(&targets, &pending)?;
        let mut still = Vec::new();
        for (run, status) in pending.into_iter().zip(statuses) {
            if matches!(status.as_str(), "queued" | "in_progress") {
                still.push(run);
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
    for status in statuses(&targets, &stranded)? {
        *by_status.entry(status).or_default() += 1;
    }
    overdue.abort();
    let ever_overdue = OVERDUE_SEEN.load(std::sync::atomic::Ordering::Relaxed);
    let idempotent_violations = IDEMPOTENT_VIOLATIONS.load(std::sync::atomic::Ordering::Relaxed);
    let (bad_logs, replay_mismatches) = audit_logs(&targets, &runs)?;
    // Final writes deferred by a fault land within their retries: give them
    // a minute, then every stored response must say what its client got.
    let told = told.lock().map(|t| t.clone()).unwrap_or_default();
    let mut told_mismatches = audit_told(&targets, &told)?;
    let settle_started = Instant::now();
    while told_mismatches > 0 && settle_started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(5)).await;
        told_mismatches = audit_told(&targets, &told)?;
    }

    println!("\nanswers by kind and outcome:");
    if let Ok(t) = tally.lock() {
        for ((kind, outcome), n) in t.iter() {
            println!("  {kind:<12} {outcome:<28} {n}");
        }
    }
    println!("\nbackground runs by final status ({} runs):", runs.len());
    for (s, n) in &by_status {
        println!("  {s:<12} {n}");
    }
    for (why, n) in unfinished_runs(&targets, &runs)? {
        println!("    {why:<40} {n}");
    }
    println!("event logs not ending in exactly one terminal event: {bad_logs}");
    println!(
        "runs whose replayed text differs from their stored output: {replay_mismatches} of {}",
        runs.len()
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
    for (t, id) in stranded.iter().take(10) {
        println!("  {}", describe(&targets[*t].store, id));
    }
    println!(
        "\nplanner sessions (paused on a tool call, resumed {} s later):",
        args.pause_secs
    );
    for (outcome, n) in &sessions.outcomes {
        println!("  {outcome:<40} {n}");
    }
    println!(
        "  longest a session stayed busy: {:.1} s (lock lease {} s)",
        sessions.longest_busy.as_secs_f64(),
        SESSION_LOCK_LEASE.as_secs()
    );
    println!("planner session violations: {}", sessions.violations);
    println!(
        "idempotent creates whose killed replica's claim held past one lease, or whose retry ran again after a reply: {idempotent_violations}"
    );
    // Answers that were not whole, and among them those a worker fault
    // caused (what a move absorbs): every one but a refusal of the store
    // (503 `store_unavailable`), which no worker fault causes.
    let (answer_errors, worker_errors) = tally
        .lock()
        .map(|t| {
            t.iter()
                .filter(|((kind, outcome), _)| {
                    matches!(*kind, "chat" | "chat-stream" | "response" | "background")
                        && !matches!(outcome.as_str(), "200" | "200 complete")
                })
                .fold((0, 0), |(all, worker), ((_, outcome), n)| {
                    let store = outcome == "503 store_unavailable";
                    (all + n, worker + if store { 0 } else { *n })
                })
        })
        .unwrap_or((0, 0));
    let run_errors = by_status.get("failed").copied().unwrap_or(0)
        + by_status.get("incomplete").copied().unwrap_or(0);
    let client_visible = answer_errors + run_errors;
    let absorbable = worker_errors + run_errors;
    println!(
        "client-visible errors: {client_visible} ({answer_errors} answers, {run_errors} background runs failed or incomplete); not a store refusal (a worker fault's, which a move absorbs): {absorbable}"
    );
    for (name, gateway) in [("A", &gateway_a), ("B", &gateway_b)] {
        let mut moves = Vec::new();
        for outcome in ["moved", "refused", "failed"] {
            moves.push(format!(
                "{} {outcome}",
                gateway.generation_moves("base", outcome).await
            ));
        }
        println!(
            "gateway {name}: generations moved off a failed worker: {}",
            moves.join(", ")
        );
    }
    println!("load average at end: {}", load_average());
    if fault_every.is_none() && absorbable > 0 {
        anyhow::bail!("with worker faults only, no answer may fail for a worker's fault");
    }
    if !stranded.is_empty()
        || bad_logs > 0
        || ever_overdue > 0
        || replay_mismatches > 0
        || told_mismatches > 0
        || sessions.violations > 0
        || idempotent_violations > 0
    {
        anyhow::bail!("stranded or overdue runs, bad event logs, a store that disagrees with what clients were told, or planner sessions lost or stuck");
    }
    Ok(())
}

/// The fault rotation; each heals itself after a while.
fn inject(i: usize, faulty: &Faulty) {
    let at = chrono_like_now();
    let (redis, workers) = (&faulty.redis_link, &faulty.workers);
    match i % 10 {
        0 => {
            println!("[{at}] fault: A's Redis stalled for one lease ({LEASE_MILLIS} ms)");
            redis.stall(Duration::from_millis(LEASE_MILLIS));
        }
        1 => {
            println!("[{at}] fault: A's Redis partitioned 5 s");
            redis.partition();
            heal_later(redis, Duration::from_secs(5));
        }
        2 => {
            println!("[{at}] fault: worker 0 link partition 10 s");
            workers[0].partition();
            heal_later(&workers[0], Duration::from_secs(10));
        }
        3 => {
            println!("[{at}] fault: A's Redis killed, restarted on its data 2 s later");
            let server = faulty.redis.clone();
            tokio::task::spawn_blocking(move || {
                let restarted = server
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))
                    .and_then(|mut s| s.restart(Duration::from_secs(2)));
                if let Err(e) = restarted {
                    println!("  the restart failed: {e}");
                }
            });
        }
        4 => {
            println!("[{at}] fault: worker 1 link +50 ms for 20 s");
            workers[1].set_latency(Duration::from_millis(50));
            heal_later(&workers[1], Duration::from_secs(20));
        }
        5 | 8 => {
            let slot = if i % 9 == 5 { 0 } else { 16383 };
            println!("[{at}] fault: B's cluster primary of slot {slot} killed; back as a replica after the failover");
            let cluster = faulty.cluster.clone();
            tokio::task::spawn_blocking(move || {
                let failed_over = cluster
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))
                    .and_then(|mut c| failover(&mut c, slot));
                match failed_over {
                    Ok(took) => {
                        println!("  slot {slot} failed over, old primary back after {took:?}")
                    }
                    Err(e) => println!("  the failover failed: {e}"),
                }
            });
        }
        6 => {
            println!("[{at}] fault: worker 2 refuses new connections and drops its own for 10 s");
            workers[2].refuse(true);
            workers[2].drop_connections();
            heal_later(&workers[2], Duration::from_secs(10));
        }
        9 => {
            println!("[{at}] fault: an idempotent create on A's peer replica, SIGKILLed 1 s in; retried on A");
            tokio::spawn(idempotent_create_killed(
                faulty.peer.clone(),
                faulty.peer_client.clone(),
                faulty.a_client.clone(),
                faulty.idempotent_tokens,
            ));
        }
        _ => {
            println!("[{at}] fault: every connection to A's Redis dropped");
            redis.drop_connections();
        }
    }
}

/// Idempotent creates whose retry broke the contract.
static IDEMPOTENT_VIOLATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An idempotent create on A's peer replica, the replica SIGKILLed 1 s in
/// and the create retried on A as the SDKs do (honouring a 409's
/// `retry-after`): the claim must free (no more 409) within one lease and
/// a heartbeat of the kill (and a margin), and if the first got its reply
/// after all, the retry answers with that reply. Then the peer is started
/// again.
async fn idempotent_create_killed(
    peer: Arc<Mutex<Gateway>>,
    on_peer: harness::Client,
    on_a: harness::Client,
    tokens: u64,
) {
    let key = format!("soak-killed-{}", harness::random_hex(8));
    let body = json!({"model": "base", "messages": [{"role": "user",
        "content": format!("synthetic:reply_tokens={tokens} idempotent")}]});
    let post = |client: harness::Client, key: String, body: Value| async move {
        client
            .send(
                client
                    .request(reqwest::Method::POST, "/chat/completions")
                    .header("Idempotency-Key", key)
                    .json(&body),
            )
            .await
    };
    let first = tokio::spawn(post(on_peer, key.clone(), body.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killer = peer.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut p) = killer.lock() {
            p.kill();
        }
    })
    .await;
    let killed = Instant::now();
    let first = first
        .await
        .ok()
        .and_then(Result::ok)
        .filter(|r| r.status == 200);
    let bound = Duration::from_millis(LEASE_MILLIS + 500 + 3000);
    let violated = |why: String| {
        println!("  idempotent create {key}: {why}");
        IDEMPOTENT_VIOLATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    // The last retry told to wait: the claim held until then.
    let mut held_at = killed;
    let answer = loop {
        let sent = Instant::now();
        match post(on_a.clone(), key.clone(), body.clone()).await {
            Ok(r) if r.status == 409 && killed.elapsed() < Duration::from_secs(60) => {
                held_at = sent;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => break other,
        }
    };
    let took = held_at.duration_since(killed);
    match (&answer, &first) {
        (Ok(r), _) if r.status != 200 => {
            violated(format!("the retry answered {} after {took:?}", r.status))
        }
        (Err(e), _) => violated(format!("the retry failed: {e}")),
        (Ok(_), _) if took > bound => violated(format!("the claim held {took:?} after the kill")),
        (Ok(r), Some(f)) if r.body != f.body => {
            violated("the first got a reply, the retry another".into())
        }
        (Ok(_), _) => {
            println!("  idempotent create {key}: the claim freed within {took:?} of the kill")
        }
    }
    let _ = tokio::task::spawn_blocking(move || {
        if let Ok(mut p) = peer.lock() {
            if let Err(e) = p.restart() {
                println!("  A's peer replica did not come back: {e}");
            }
        }
    })
    .await;
}

/// The next worker fault, in turn on each worker: a SIGKILL and a start
/// 3 s later on the same address, or a rollout (SIGTERM, the worker drains
/// for `grace_secs` and exits, a new one starts on the same address).
fn hit_worker(i: usize, faulty: &Faulty, grace_secs: u64) {
    let at = chrono_like_now();
    let which = i % faulty.workers.len();
    let rollout = i % 2 == 1;
    if rollout {
        println!(
            "[{at}] fault: worker {which} rolled (SIGTERM, {grace_secs} s grace, then a new one)"
        );
    } else {
        println!("[{at}] fault: worker {which} SIGKILLed, started again 3 s later");
    }
    let processes = faulty.processes.clone();
    tokio::task::spawn_blocking(move || {
        let restarted = processes
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))
            .and_then(|mut workers| {
                let worker = &mut workers[which];
                if rollout {
                    worker.signal(libc::SIGTERM);
                    worker
                        .wait_exit(Duration::from_secs(grace_secs + 10))
                        .context("the drained worker did not exit")?;
                } else {
                    worker.kill();
                    std::thread::sleep(Duration::from_secs(3));
                }
                worker.restart()
            });
        if let Err(e) = restarted {
            println!("  worker {which} did not come back: {e}");
        }
    });
}

/// Kills the primary serving `slot`, waits for its replica to take over and
/// starts it again (it returns as the new primary's replica); how long it
/// all took.
fn failover(cluster: &mut RedisCluster, slot: u16) -> Result<Duration> {
    let started = Instant::now();
    let primary = cluster
        .primary_of(slot)?
        .context("no primary serves the slot")?;
    cluster.kill(primary)?;
    cluster.wait_for_failover(primary, slot, Duration::from_secs(30))?;
    cluster.revive(primary, Duration::from_secs(30))?;
    Ok(started.elapsed())
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

/// One request of the mix, chosen by its number, to one of the targets in
/// turn (twenty requests each).
async fn one_request(
    n: u64,
    reply_tokens: u32,
    targets: &[Target],
    tally: &Tally,
    runs: &Runs,
    told: &Told,
) {
    let ask = format!("synthetic:reply_tokens={reply_tokens} soak");
    let target = (n / 20) as usize % targets.len();
    let client = &targets[target].client;
    match n % 20 {
        // 45%: chat, half of it streaming.
        0..=8 => {
            let stream = n.is_multiple_of(2);
            let body = json!({"model": "base", "stream": stream,
                "messages": [{"role": "user", "content": ask}]});
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
                .post_json("/responses", &json!({"model": "base", "input": ask}))
                .await;
            if let Ok(reply) = &r {
                if reply.status == 200 {
                    let object = reply.json();
                    if let (Some(id), Some(status)) =
                        (object["id"].as_str(), object["status"].as_str())
                    {
                        if let Ok(mut told) = told.lock() {
                            told.push((target, id.into(), status.into(), output_text(&object)));
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
                            runs.push((target, id.to_string(), Instant::now()));
                        }
                    }
                }
            }
            count(tally, "background", status_of(&r));
        }
        // 5%: cancel the latest background run of this target.
        _ => {
            let last = runs.lock().ok().and_then(|r| {
                r.iter()
                    .rev()
                    .find(|(t, _, _)| *t == target)
                    .map(|(_, id, _)| id.clone())
            });
            let Some(id) = last else { return };
            let r = client
                .post_json(&format!("/responses/{id}/cancel"), &json!({}))
                .await;
            count(tally, "cancel", status_of(&r));
        }
    }
}

/// What became of the planner sessions.
#[derive(Debug, Default)]
struct Sessions {
    /// Answers by outcome.
    outcomes: BTreeMap<String, u64>,
    /// The longest a session answered `session_busy`.
    longest_busy: Duration,
    /// Paused plans lost, sessions never resumed or busy past their lease,
    /// a 409 without `retry-after`.
    violations: u64,
}

impl Sessions {
    fn saw(&mut self, outcome: impl Into<String>) {
        *self.outcomes.entry(outcome.into()).or_default() += 1;
    }

    fn violated(&mut self, what: &str, session: &str, detail: &str) {
        self.violations += 1;
        self.saw(format!("VIOLATION {what}"));
        if self.violations <= 10 {
            println!("  planner session {session}: {what}: {detail}");
        }
    }
}

/// A session paused on its caller's tool call, waiting to be answered.
struct Paused {
    session: String,
    text: String,
    reply: Value,
    at: Instant,
}

/// Until `until`: once a second, a new planner session on `client` that
/// pauses on the caller's `get_time`; each is answered `pause` later (so
/// that faults, Redis restarts among them, hit sessions while paused).
/// After `until` the rest are answered. Every paused plan must resume.
async fn planner_sessions(
    client: harness::Client,
    agent_url: String,
    until: Instant,
    pause: Duration,
    request_deadline: Duration,
) -> Sessions {
    let mut report = Sessions::default();
    let mut paused: std::collections::VecDeque<Paused> = Default::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while Instant::now() < until {
        tick.tick().await;
        let session = planner::session();
        let text = planner::scripted("What time is it?", &[planner::tool_pause_plan("good")]);
        let mut body = planner::body("base", &text, std::slice::from_ref(&agent_url));
        body["tools"] = planner::time_tool();
        match planner::try_post(&client, &session, &body).await {
            Ok(r)
                if r.status == 200
                    && json_of(&r)["choices"][0]["finish_reason"] == "tool_calls" =>
            {
                report.saw("paused");
                paused.push_back(Paused {
                    session,
                    text,
                    reply: json_of(&r),
                    at: Instant::now(),
                });
            }
            Ok(r) => report.saw(format!("not paused: {}", status_of(&Ok(r)))),
            Err(_) => report.saw("not paused: transport error"),
        }
        while paused.front().is_some_and(|p| p.at.elapsed() >= pause) {
            if let Some(p) = paused.pop_front() {
                resume(&client, p, request_deadline, &mut report).await;
            }
        }
    }
    for p in paused {
        resume(&client, p, request_deadline, &mut report).await;
    }
    report
}

/// Answers a paused session's tool call until it resumes (retrying through
/// faults for up to 90 s). A `session_busy` must carry `retry-after` and
/// clear within the lock's lease of the last request that held the session
/// (or that request's deadline, while one went unanswered); "no paused plan
/// waits" is a lost plan,
/// unless an earlier try may have resumed it (its answer lost in a fault).
async fn resume(
    client: &harness::Client,
    p: Paused,
    request_deadline: Duration,
    report: &mut Sessions,
) {
    let call_id = p.reply["choices"][0]["message"]["tool_calls"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut body = planner::body("base", &p.text, &[]);
    body["messages"] = planner::resume_messages(&p.text, &p.reply, &call_id, "12:00 UTC");
    body["tools"] = planner::time_tool();
    let started = Instant::now();
    let mut busy_since: Option<Instant> = None;
    let mut maybe_resumed = false;
    // How long the session may answer `session_busy`: one lock lease after
    // the last request that held it ended; while a try of ours went
    // unanswered (a transport error, a 502/504), that request may still
    // be running, up to its deadline.
    let mut busy_bound = SESSION_LOCK_LEASE + Duration::from_secs(2);
    while started.elapsed() < Duration::from_secs(90) + request_deadline {
        let reply = planner::try_post(client, &p.session, &body).await;
        let code = reply
            .as_ref()
            .ok()
            .and_then(|r| json_of(r)["error"]["code"].as_str().map(str::to_owned));
        match (&reply, code.as_deref()) {
            (Ok(r), _) if r.status == 200 => {
                let content = json_of(r)["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if content.contains("12:00 UTC") {
                    report.saw("resumed");
                } else {
                    report.violated("resumed without the tool's result", &p.session, &content);
                }
                return;
            }
            (Ok(r), Some("session_busy")) => {
                let since = *busy_since.get_or_insert_with(Instant::now);
                report.longest_busy = report.longest_busy.max(since.elapsed());
                if since.elapsed() > busy_bound {
                    report.violated("busy past the lock's lease", &p.session, &r.text());
                    return;
                }
                let Some(wait) = r.header("retry-after").and_then(|v| v.parse::<u64>().ok()) else {
                    report.violated(
                        "409 session_busy without retry-after",
                        &p.session,
                        &r.text(),
                    );
                    return;
                };
                report.saw("409 session_busy (retried after retry-after)");
                tokio::time::sleep(Duration::from_secs(wait.min(5))).await;
            }
            (Ok(_), Some("invalid_value")) if maybe_resumed => {
                report.saw("resumed (its answer lost in a fault)");
                return;
            }
            (Ok(r), Some("invalid_value")) => {
                report.violated("paused plan lost", &p.session, &r.text());
                return;
            }
            (Ok(r), _) if r.status >= 500 || r.status == 429 => {
                // A 502/504 may have resumed the plan before it failed.
                if r.status != 503 && r.status != 429 {
                    maybe_resumed = true;
                    busy_bound = SESSION_LOCK_LEASE + request_deadline;
                }
                report.saw(format!("{} (retried)", status_of(&reply)));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (Ok(r), _) => {
                report.violated("unexpected answer", &p.session, &r.text());
                return;
            }
            (Err(_), _) => {
                maybe_resumed = true;
                busy_bound = SESSION_LOCK_LEASE + request_deadline;
                report.saw("transport error (retried)");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    report.violated("never resumed", &p.session, "");
}

/// A reply's JSON body, or null (a planner answer is read, never trusted).
fn json_of(reply: &harness::Reply) -> Value {
    serde_json::from_slice(&reply.body).unwrap_or(Value::Null)
}

/// Runs seen going past their bound, all monitor passes together.
static OVERDUE_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The runs that ended `failed` or `incomplete`, by status and error code
/// (or incomplete reason), read from each store.
fn unfinished_runs(targets: &[Target], runs: &[(usize, String)]) -> Result<BTreeMap<String, u64>> {
    let mut why = BTreeMap::new();
    for (t, target) in targets.iter().enumerate() {
        let ids: Vec<String> = runs
            .iter()
            .filter(|(rt, _)| *rt == t)
            .map(|(_, id)| id.clone())
            .collect();
        for obj in target.store.fields(&ids, "obj")?.into_iter().flatten() {
            let object: Value = serde_json::from_str(&obj).unwrap_or(Value::Null);
            let detail = match object["status"].as_str() {
                Some("failed") => &object["error"]["code"],
                Some("incomplete") => &object["incomplete_details"]["reason"],
                _ => continue,
            };
            let status = object["status"].as_str().unwrap_or_default();
            *why.entry(format!("{status}: {}", detail.as_str().unwrap_or("?")))
                .or_default() += 1;
        }
    }
    Ok(why)
}

/// The stored status of each run (`"absent"` for none), read straight from
/// its store: the audit must not wait on the gateway it audits.
fn statuses(targets: &[Target], runs: &[(usize, String)]) -> Result<Vec<String>> {
    let mut out = vec![String::new(); runs.len()];
    for (t, target) in targets.iter().enumerate() {
        let (at, ids): (Vec<usize>, Vec<String>) = runs
            .iter()
            .enumerate()
            .filter(|(_, (rt, _))| *rt == t)
            .map(|(i, (_, id))| (i, id.clone()))
            .unzip();
        for (i, status) in at.into_iter().zip(target.store.fields(&ids, "status")?) {
            out[i] = status.unwrap_or_else(|| "absent".into());
        }
    }
    Ok(out)
}

/// Every 15 s while the traffic runs: answers since the last pass that were
/// not a 200, and every run older than `bound` that is still going (each
/// counted once and described when first seen).
async fn monitor(targets: Arc<Vec<Target>>, runs: Runs, tally: Tally, bound: Duration) {
    let mut known_done: std::collections::HashSet<String> = Default::default();
    let mut reported: std::collections::HashSet<String> = Default::default();
    let mut last_tally: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
    loop {
        tokio::time::sleep(Duration::from_secs(15)).await;
        let now = Instant::now();
        let old: Vec<(usize, String)> = runs
            .lock()
            .map(|r| {
                r.iter()
                    .filter(|(_, id, at)| {
                        now.duration_since(*at) > bound && !known_done.contains(id)
                    })
                    .map(|(t, id, _)| (*t, id.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let readers = targets.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let statuses = statuses(&readers, &old)?;
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
        for ((t, id), status) in checked {
            if matches!(status.as_str(), "queued" | "in_progress") {
                going += 1;
                if reported.insert(id.clone()) {
                    OVERDUE_SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if reported.len() <= 10 {
                        println!("  overdue: {}", describe(&targets[t].store, &id));
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
/// lease (straight from its store).
fn describe(store: &Store, id: &str) -> String {
    let Ok(mut conn) = store.connection() else {
        return format!("{id}: no Redis connection");
    };
    let obj: Option<String> = redis::cmd("HGET")
        .arg(store.key(id, ""))
        .arg("obj")
        .query(&mut *conn)
        .unwrap_or(None);
    let object: Value = obj
        .and_then(|o| serde_json::from_str(&o).ok())
        .unwrap_or(Value::Null);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let age = object["created_at"].as_u64().map(|c| now.saturating_sub(c));
    let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(store.key(id, ":events"))
        .arg("-")
        .arg("+")
        .query(&mut *conn)
        .unwrap_or_default();
    let last = entries
        .last()
        .and_then(|(_, f)| f.get(1).cloned())
        .unwrap_or_default();
    let lease: Option<f64> = redis::cmd("ZSCORE")
        .arg(format!("{}runs:{{leases}}", store.prefix))
        .arg(id)
        .query(&mut *conn)
        .unwrap_or(None);
    let lease_in = lease.map(|l| (l as i64 - now as i64 * 1000) as f64 / 1000.0);
    format!(
        "{} {id}: status {} error {} age {age:?} s, {} events (last {last:?}), lease ends in {lease_in:?} s, output tokens {}",
        store.name,
        object["status"],
        object["error"]["code"],
        entries.len(),
        object["usage"]["output_tokens"]
    )
}

/// Stored responses whose status or output text differ from what their
/// client was told (read from each store directly).
fn audit_told(targets: &[Target], told: &[(usize, String, String, String)]) -> Result<usize> {
    let mut differ = 0;
    for (t, target) in targets.iter().enumerate() {
        let mine: Vec<&(usize, String, String, String)> =
            told.iter().filter(|(tt, ..)| *tt == t).collect();
        let ids: Vec<String> = mine.iter().map(|(_, id, _, _)| id.clone()).collect();
        let stored = target.store.fields(&ids, "obj")?;
        for ((_, id, status, text), obj) in mine.into_iter().zip(stored) {
            let object: Value = obj
                .and_then(|o| serde_json::from_str(&o).ok())
                .unwrap_or(Value::Null);
            if object["status"] != status.as_str() || output_text(&object) != *text {
                differ += 1;
                if differ <= 10 {
                    println!(
                        "  {}: told {status} but stored {} ({}): {id}",
                        target.store.name, object["status"], object["error"]["code"]
                    );
                }
            }
        }
    }
    Ok(differ)
}

/// Event logs that do not end in exactly one terminal event, and runs whose
/// replayed text is not their stored object's output (read from each store
/// directly, not through a proxy).
fn audit_logs(targets: &[Target], runs: &[(usize, String)]) -> Result<(usize, usize)> {
    let mut conns = targets
        .iter()
        .map(|t| t.store.connection())
        .collect::<Result<Vec<_>>>()?;
    let mut bad = 0;
    let mut mismatched = 0;
    for (t, id) in runs {
        let (store, conn) = (&targets[*t].store, &mut conns[*t]);
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(store.key(id, ":events"))
            .arg("-")
            .arg("+")
            .query(&mut **conn)?;
        let obj: Option<String> = redis::cmd("HGET")
            .arg(store.key(id, ""))
            .arg("obj")
            .query(&mut **conn)?;
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
                    "  {}: replay differs from the stored object ({} {}): {id}",
                    store.name, object["status"], object["error"]["code"]
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
