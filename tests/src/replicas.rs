//! Two gateway replicas sharing one Redis, each reaching it over a link of
//! its own (a [`FaultProxy`]), in front of one synthetic worker: the shape
//! of the faults that split a fleet (one replica cut off from the store
//! while its peer sweeps, one replica's store link stalled, the store
//! restarting).
//!
//! Where network namespaces can be made (root, iproute2: CI and developer
//! machines), Redis, each replica and the worker run on hosts of their own
//! ([`NetLab`]: separate namespaces and addresses, as on separate
//! machines), Redis persistent (AOF, fsync always) and restartable with its
//! data; the proxies sit on the links in the test's namespace. Elsewhere
//! every process is on loopback. Each test says which mode ran. The audit
//! helpers read the store directly, never through a gateway, so what a
//! client was told is checked against what is kept.

use crate::netlab::{Host, NetLab};
use crate::{
    Client, FaultProxy, Gateway, GatewayOpts, PersistentRedis, SseFrame, Value, Worker, WorkerOpts,
};
use anyhow::{Context, Result};
use std::time::{Duration, Instant};

/// Fields drop in order: processes before the lab that hosts them.
pub struct Replicas {
    pub a: Gateway,
    pub b: Gateway,
    /// Replica A's link to Redis.
    pub link_a: FaultProxy,
    /// Replica B's link to Redis.
    pub link_b: FaultProxy,
    /// Both replicas' link to the worker.
    pub link_worker: FaultProxy,
    pub worker: Worker,
    /// The store both replicas share.
    pub redis: PersistentRedis,
    prefix: String,
    /// The hosts of replica A, replica B, the worker and Redis, in
    /// namespace mode.
    pub hosts: Option<[Host; 4]>,
    _lab: Option<NetLab>,
}

impl Replicas {
    /// Both replicas on one fresh Redis, one `base` worker with `worker`,
    /// and `extra_toml` for both gateways.
    pub fn start(mut worker: WorkerOpts, extra_toml: &str) -> Result<Replicas> {
        let mut lab = NetLab::new();
        let hosts = match &mut lab {
            Some(lab) => Some([
                lab.host("gw-a")?,
                lab.host("gw-b")?,
                lab.host("worker")?,
                lab.host("redis")?,
            ]),
            None => None,
        };
        let proxy_ip = match &lab {
            Some(lab) => std::net::IpAddr::V4(lab.bridge_ip()),
            None => std::net::Ipv4Addr::LOCALHOST.into(),
        };
        eprintln!(
            "fault mode: {}",
            if hosts.is_some() {
                "network namespaces (Redis, each replica and the worker on hosts of their own; a fault proxy on each replica's Redis link)"
            } else {
                "loopback (network namespaces unavailable; a fault proxy on each replica's Redis link)"
            }
        );
        let host = |i: usize| hosts.as_ref().map(|h| h[i].clone());
        let redis = PersistentRedis::start(host(3).as_ref())?;
        let link_a = FaultProxy::start_at(proxy_ip, redis.addr())?;
        let link_b = FaultProxy::start_at(proxy_ip, redis.addr())?;
        worker.host = host(2);
        let worker = Worker::start("base", worker)?;
        let link_worker = FaultProxy::start_at(proxy_ip, worker.addr().parse()?)?;
        let prefix = format!("igwtest:{}:", crate::random_hex(12));
        let opts = |link: &FaultProxy, host: Option<Host>, keys| {
            let mut opts = GatewayOpts {
                extra_toml: extra_toml.to_owned(),
                redis: Some((link.redis_url(), prefix.clone())),
                host,
                ..GatewayOpts::default()
            };
            if let Some(keys) = keys {
                opts.keys = keys;
            }
            opts.workers
                .insert("base".into(), vec![link_worker.addr().to_string()]);
            opts
        };
        let a = Gateway::start(opts(&link_a, host(0), None))?;
        // One key for both: a client may reach either replica.
        let b = Gateway::start(opts(&link_b, host(1), Some(a.keys().to_vec())))?;
        Ok(Replicas {
            a,
            b,
            link_a,
            link_b,
            link_worker,
            worker,
            redis,
            prefix,
            hosts,
            _lab: lab,
        })
    }

    /// Cuts replica A off from everything: its host's cable in namespace
    /// mode; in loopback mode its Redis link (the worker link is shared).
    pub fn cut_a(&self) -> Result<()> {
        match &self.hosts {
            Some(h) => h[0].cut(),
            None => {
                self.link_a.partition();
                Ok(())
            }
        }
    }

    pub fn reconnect_a(&self) -> Result<()> {
        match &self.hosts {
            Some(h) => h[0].reconnect(),
            None => {
                self.link_a.heal();
                Ok(())
            }
        }
    }

    /// Both gateways' logs, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- replica a ---\n{}\n--- replica b ---\n{}",
            self.a.log_tail(),
            self.b.log_tail()
        )
    }

    fn conn(&self) -> Result<redis::Connection> {
        redis::Client::open(self.redis.url())?
            .get_connection_with_timeout(std::time::Duration::from_secs(2))
            .context("the replicas' Redis")
    }

    /// The stored response object, read from Redis (not through a gateway).
    pub fn stored_object(&self, id: &str) -> Result<Option<Value>> {
        let key = format!("{}resp:{{{id}}}", self.prefix);
        let obj: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("obj")
            .query(&mut self.conn()?)?;
        obj.map(|o| serde_json::from_str(&o).context("stored object"))
            .transpose()
    }

    /// The run's event log as (name, payload), read from Redis.
    pub fn stored_events(&self, id: &str) -> Result<Vec<(String, Value)>> {
        let key = format!("{}resp:{{{id}}}:events", self.prefix);
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query(&mut self.conn()?)?;
        entries
            .into_iter()
            .map(|(_, fields)| {
                let name = fields.get(1).cloned().unwrap_or_default();
                let data = fields.get(3).map(String::as_str).unwrap_or("null");
                Ok((name, serde_json::from_str(data)?))
            })
            .collect()
    }

    /// The key prefix both replicas use in Redis.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `gateway usage --org ORG --json` over the replicas' Redis: one row
    /// per key and model, as billed.
    pub fn usage(&self, org: &str) -> Result<Vec<Value>> {
        let url = self.redis.url();
        let out = crate::stack::gateway_cli(
            &[
                ("GATEWAY_REDIS_URL", url.as_str()),
                ("GATEWAY_KEY_PREFIX", self.prefix.as_str()),
            ],
            &["usage", "--org", org, "--json"],
        );
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("a usage row"))
            .collect()
    }

    /// The stored object once the run is terminal (read from Redis),
    /// failing after `within`.
    pub async fn terminal(&self, id: &str, within: Duration) -> Value {
        eventually(
            within,
            "the run terminal",
            || self.logs(),
            || {
                self.stored_object(id)
                    .ok()
                    .flatten()
                    .filter(|o| is_terminal(o["status"].as_str().unwrap_or_default()))
            },
        )
        .await
    }

    /// Run leases still in the store.
    pub fn leases_left(&self) -> Result<usize> {
        Ok(redis::cmd("ZCARD")
            .arg(format!("{}runs:{{leases}}", self.prefix))
            .query(&mut self.conn()?)?)
    }
}

/// The text of every message item of a response object's `output`.
pub fn output_text(object: &Value) -> String {
    object["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().into_iter().flatten())
        .filter_map(|p| p["text"].as_str())
        .collect()
}

/// The text a Responses event stream delivered: its `output_text` deltas.
pub fn streamed_text<'a>(events: impl IntoIterator<Item = (&'a str, &'a Value)>) -> String {
    events
        .into_iter()
        .filter(|(name, _)| *name == "response.output_text.delta")
        .filter_map(|(_, data)| data["delta"].as_str())
        .collect()
}

/// Whether a response status is terminal.
pub fn is_terminal(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "cancelled" | "incomplete")
}

/// A Responses stream's frames as (event name, payload).
pub fn events(frames: &[SseFrame]) -> Vec<(String, Value)> {
    frames
        .iter()
        .filter_map(|f| Some((f.event.clone()?, f.json())))
        .collect()
}

/// Polls `read` until it gives `Some`, failing after `within` with `what`
/// and `logs()`.
pub async fn eventually<T>(
    within: Duration,
    what: &str,
    logs: impl Fn() -> String,
    mut read: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = read() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a background run of `input` on `base`; its id.
pub async fn create_background(client: &Client, input: &str) -> String {
    let reply = client
        .post_json(
            "/responses",
            &serde_json::json!({"model": "base", "input": input, "background": true}),
        )
        .await
        .expect("create");
    assert_eq!(reply.status, 200, "{reply}");
    reply.json()["id"].as_str().expect("id").to_owned()
}
