//! Idle connections held open on a gateway, and what each costs it in
//! resident memory. `loadgen --idle-streams` / `--idle-websockets` and
//! `hostile_e2e`'s bounds measure the same way:
//!
//! - an idle stream is a streamed chat completion whose first frame (one
//!   token) has arrived, its worker then silent for an hour
//!   (`synthetic:slow_ms`);
//! - an idle WebSocket is an upgraded `GET /v1/responses` on which nothing
//!   was sent (no response).
//!
//! The cost is the growth of the gateway's `VmRSS` while they open (and
//! two seconds after), divided by how many it holds.

use crate::procfs;
use crate::websocket::{self, WsClient};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Connections that opened, and why the others did not.
pub struct Held<T> {
    pub open: Vec<T>,
    /// Failure message → how many.
    pub failures: BTreeMap<String, u64>,
    pub opened_in: Duration,
}

/// The gateway's memory around opening some idle connections.
#[derive(Debug, Clone, Copy)]
pub struct Cost {
    /// Connections held open when `rss_with_kib` was read.
    pub held: usize,
    pub rss_before_kib: u64,
    pub rss_with_kib: u64,
}

impl Cost {
    /// Growth of resident memory per held connection, in KiB.
    pub fn kib_per_connection(&self) -> f64 {
        if self.held == 0 {
            return 0.0;
        }
        self.rss_with_kib.saturating_sub(self.rss_before_kib) as f64 / self.held as f64
    }
}

/// Reads the gateway's `VmRSS`, opens connections with `open`, waits two
/// seconds for the gateway to settle, and reads it again. The connections
/// are returned open: the caller decides when they close.
pub async fn measure<T>(
    gateway_pid: u32,
    open: impl Future<Output = Held<T>>,
) -> anyhow::Result<(Cost, Held<T>)> {
    let rss_before_kib = procfs::rss_kib(gateway_pid)?;
    let held = open.await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_with_kib = procfs::rss_kib(gateway_pid)?;
    let cost = Cost {
        held: held.open.len(),
        rss_before_kib,
        rss_with_kib,
    };
    Ok((cost, held))
}

/// Opens `n` connections, `parallelism` at a time; `connect(i)` opens the
/// `i`-th.
pub async fn open<T, F, Fut>(n: usize, parallelism: usize, connect: F) -> Held<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<T, String>> + Send + 'static,
{
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sem = Arc::new(tokio::sync::Semaphore::new(parallelism.max(1)));
    for i in 0..n {
        let Ok(permit) = sem.clone().acquire_owned().await else {
            break;
        };
        let (attempt, tx) = (connect(i), tx.clone());
        tokio::spawn(async move {
            let r = attempt.await;
            drop(permit);
            let _ = tx.send(r);
        });
    }
    drop(tx);
    let mut held = Held {
        open: Vec::with_capacity(n),
        failures: BTreeMap::new(),
        opened_in: Duration::ZERO,
    };
    while let Some(r) = rx.recv().await {
        match r {
            Ok(c) => held.open.push(c),
            Err(e) => *held.failures.entry(e).or_default() += 1,
        }
    }
    held.opened_in = started.elapsed();
    held
}

/// The body of an idle stream: one token, then an hour's silence.
pub fn stream_body(model: &str) -> Bytes {
    Bytes::from(
        json!({
            "model": model,
            "messages": [{"role": "user", "content": "Wait. synthetic:slow_ms=3600000 synthetic:reply_tokens=100"}],
            "stream": true,
        })
        .to_string(),
    )
}

/// Opens `n` idle streams on `url` (`.../v1/chat/completions`), each on
/// its own connection; one is open once its first frame arrived.
pub async fn streams(
    url: &str,
    key: &str,
    model: &str,
    n: usize,
    parallelism: usize,
) -> anyhow::Result<Held<reqwest::Response>> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .tcp_nodelay(true)
        .build()?;
    let body = stream_body(model);
    Ok(open(n, parallelism, |_| {
        let (client, url, key, body) =
            (client.clone(), url.to_owned(), key.to_owned(), body.clone());
        async move { open_stream(&client, &url, &key, body).await }
    })
    .await)
}

async fn open_stream(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: Bytes,
) -> Result<reqwest::Response, String> {
    let mut resp = client
        .post(url)
        .bearer_auth(key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(body);
        return Err(format!("HTTP {status}: {message}"));
    }
    // The first frame: the stream is open end to end.
    tokio::time::timeout(Duration::from_secs(60), resp.chunk())
        .await
        .map_err(|_| "no first frame".to_string())?
        .map_err(|e| e.to_string())?;
    Ok(resp)
}

/// Opens `n` idle upgraded `GET /v1/responses` connections on the gateway
/// at `base_url`, spread over `keys` in turn (a key holds a bounded number
/// of connections: give at least `n / 32` keys).
pub async fn websockets(
    base_url: &str,
    keys: &[String],
    n: usize,
    parallelism: usize,
) -> Held<WsClient> {
    let keys: Arc<[String]> = keys.into();
    open(n, parallelism, |i| {
        let (base, keys) = (base_url.to_owned(), keys.clone());
        async move {
            let key = keys.get(i % keys.len().max(1)).cloned().unwrap_or_default();
            tokio::time::timeout(Duration::from_secs(60), websocket::connect(&base, &key))
                .await
                .map_err(|_| "the upgrade took over 60 s".to_string())?
                .map_err(|e| format!("{e:#}"))
        }
    })
    .await
}
