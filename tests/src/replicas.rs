//! Two gateway replicas sharing one Redis, each reaching it over a link of
//! its own (a [`FaultProxy`]), in front of one synthetic worker: the shape
//! of the faults that split a fleet (one replica cut off from the store
//! while its peer sweeps, one replica's store link stalled).
//!
//! Links are loopback proxies: every process runs on this host, and a fault
//! is the proxy holding or dropping bytes, as a partition or a congested
//! link would. The audit helpers read the store directly, never through a
//! gateway, so what a client was told is checked against what is kept.

use crate::{FaultProxy, Gateway, GatewayOpts, RedisScope, Value, Worker, WorkerOpts};
use anyhow::{Context, Result};

pub struct Replicas {
    pub a: Gateway,
    pub b: Gateway,
    /// Replica A's link to Redis.
    pub link_a: FaultProxy,
    /// Replica B's link to Redis.
    pub link_b: FaultProxy,
    pub worker: Worker,
    /// Keys under this prefix are deleted on drop.
    pub scope: RedisScope,
}

impl Replicas {
    /// Both replicas on a fresh prefix of the test Redis, one `base`
    /// worker with `worker`, and `extra_toml` for both gateways.
    pub fn start(worker: WorkerOpts, extra_toml: &str) -> Result<Replicas> {
        eprintln!("fault mode: loopback links (a TCP fault proxy per replica)");
        let scope = RedisScope::new().context("the test Redis")?;
        let link_a = FaultProxy::start(scope.addr()?)?;
        let link_b = FaultProxy::start(scope.addr()?)?;
        let worker = Worker::start("base", worker)?;
        let opts = |link: &FaultProxy, keys| {
            let mut opts = GatewayOpts {
                extra_toml: extra_toml.to_owned(),
                redis: Some((link.redis_url(), scope.prefix().to_owned())),
                ..GatewayOpts::default()
            };
            if let Some(keys) = keys {
                opts.keys = keys;
            }
            opts.workers
                .insert("base".into(), vec![worker.addr().to_owned()]);
            opts
        };
        let a = Gateway::start(opts(&link_a, None))?;
        // One key for both: a client may reach either replica.
        let b = Gateway::start(opts(&link_b, Some(a.keys().to_vec())))?;
        Ok(Replicas {
            a,
            b,
            link_a,
            link_b,
            worker,
            scope,
        })
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
        self.scope.connection()
    }

    /// The stored response object, read from Redis (not through a gateway).
    pub fn stored_object(&self, id: &str) -> Result<Option<Value>> {
        let key = format!("{}resp:{{{id}}}", self.scope.prefix());
        let obj: Option<String> = redis::cmd("HGET")
            .arg(&key)
            .arg("obj")
            .query(&mut self.conn()?)?;
        obj.map(|o| serde_json::from_str(&o).context("stored object"))
            .transpose()
    }

    /// The run's event log as (name, payload), read from Redis.
    pub fn stored_events(&self, id: &str) -> Result<Vec<(String, Value)>> {
        let key = format!("{}resp:{{{id}}}:events", self.scope.prefix());
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

    /// Run leases still in the store.
    pub fn leases_left(&self) -> Result<usize> {
        Ok(redis::cmd("ZCARD")
            .arg(format!("{}runs:{{leases}}", self.scope.prefix()))
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
