//! Pipelined connections to a Redis Cluster (the limiter's): one lean pipe
//! ([`RedisPipe`]) per primary, each command sent to the primary serving
//! the slot of its keys (a command's keys share one hash tag, so one slot).
//!
//! The slot map comes from the handle's [`Topology`] (`CLUSTER SLOTS`).
//! A `MOVED` reply sends the command on to the node it names at once and
//! refreshes the map in the background; an `ASK` reply (a slot part way
//! through a migration) sends it on with `ASKING` before it, the map left
//! as is; `TRYAGAIN` (a multi-key command during a migration) and
//! `CLUSTERDOWN` are retried after a short pause. A node that cannot be
//! reached (refused, reset, timed out: a killed primary sends no `MOVED`)
//! fails the call (the caller's failure policy decides: no wait for a
//! refresh on the limiter's admission path) and refreshes the map in the background,
//! asking the other nodes first, so the next calls go to its replacement
//! once one is promoted. The map is also fetched every 30 s. Pipes to nodes
//! a new map no longer names (a failed primary, a removed node) are
//! dropped.

use super::cluster::{key_slot, Node, Redirect, RefreshReason, SlotMap, Topology};
use super::pipe::{PipeError, RedisPipe, Reply, RespCommand};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Redirects and retries one call follows before giving up.
const MAX_HOPS: usize = 5;

/// Pause before retrying `TRYAGAIN` / `CLUSTERDOWN`.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

pub struct ClusterPipe {
    topology: Arc<Topology>,
    tls: Option<Arc<rustls::ClientConfig>>,
    scripts: Vec<&'static str>,
    pipes: RwLock<HashMap<Node, Arc<RedisPipe>>>,
    /// The map `pipes` was last pruned against.
    pruned_for: RwLock<Option<Arc<SlotMap>>>,
}

impl ClusterPipe {
    pub fn new(
        topology: Arc<Topology>,
        tls: Option<Arc<rustls::ClientConfig>>,
        scripts: Vec<&'static str>,
    ) -> Self {
        Self {
            topology,
            tls,
            scripts,
            pipes: RwLock::new(HashMap::new()),
            pruned_for: RwLock::new(None),
        }
    }

    /// Sends the command `encode` builds to the primary serving `key`'s
    /// slot (every key of the command has that slot) and waits for its
    /// reply, following redirects.
    pub async fn call(
        &self,
        key: &str,
        encode: impl Fn() -> RespCommand,
    ) -> Result<Reply, PipeError> {
        let slot = key_slot(key.as_bytes());
        let mut map = self.topology.map().await.map_err(map_failed)?;
        self.prune(&map);
        let mut node = match map.owner(slot) {
            Some(n) => n.clone(),
            None => {
                map = self
                    .topology
                    .refresh(Some(&map), RefreshReason::Unserved)
                    .await
                    .map_err(map_failed)?;
                map.owner(slot).cloned().ok_or_else(|| {
                    PipeError::Server(format!("CLUSTERDOWN no node serves slot {slot}"))
                })?
            }
        };
        let mut asking = false;
        let mut last = None;
        for _ in 0..MAX_HOPS {
            let pipe = self.pipe(&node);
            let reply = if asking {
                pipe.call_asking(&encode).await
            } else {
                pipe.call(&encode).await
            };
            asking = false;
            let error = match reply {
                Err(PipeError::Server(e)) => e,
                Err(PipeError::Connection(e)) => {
                    // The node may be gone (failed over): learn the new map
                    // for the calls after this one.
                    self.topology.refresh_soon(
                        Some(map),
                        RefreshReason::ConnectionError,
                        Some(node.clone()),
                    );
                    return Err(PipeError::Connection(format!("{node}: {e}")));
                }
                ok => return ok,
            };
            match Redirect::parse(&error, &node) {
                Some(Redirect::Moved(to)) => {
                    self.topology
                        .refresh_soon(Some(map.clone()), RefreshReason::Moved, None);
                    node = to;
                }
                Some(Redirect::Ask(to)) => {
                    node = to;
                    asking = true;
                }
                None if error.starts_with("TRYAGAIN") || error.starts_with("CLUSTERDOWN") => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    if let Some(current) = self.topology.current() {
                        map = current;
                    }
                    if let Some(n) = map.owner(slot) {
                        node = n.clone();
                    }
                }
                None => return Err(PipeError::Server(error)),
            }
            last = Some(error);
        }
        Err(PipeError::Server(format!(
            "Redis Cluster: slot {slot} still redirected after {MAX_HOPS} hops ({})",
            last.unwrap_or_default()
        )))
    }

    /// Once its reply is back, every command sent before on every node's
    /// connection has been applied.
    pub async fn flush(&self) {
        let pipes: Vec<Arc<RedisPipe>> = match self.pipes.read() {
            Ok(p) => p.values().cloned().collect(),
            Err(_) => return,
        };
        let pings = pipes
            .iter()
            .map(|p| p.call(|| RespCommand::command(&["PING".into()])));
        futures::future::join_all(pings).await;
    }

    /// Once per new map: drops the pipes to nodes it does not name (calls
    /// under way on one finish on their own reference; its connection ends
    /// with the last).
    fn prune(&self, map: &Arc<SlotMap>) {
        if let Ok(seen) = self.pruned_for.read() {
            if seen.as_ref().is_some_and(|s| Arc::ptr_eq(s, map)) {
                return;
            }
        }
        if let Ok(mut seen) = self.pruned_for.write() {
            *seen = Some(map.clone());
        }
        let mut pipes = self.pipes.write().unwrap_or_else(|p| p.into_inner());
        pipes.retain(|node, _| map.nodes().contains(node));
    }

    /// The pipe to `node` (made on first use; its connection opens lazily).
    fn pipe(&self, node: &Node) -> Arc<RedisPipe> {
        if let Ok(pipes) = self.pipes.read() {
            if let Some(p) = pipes.get(node) {
                return p.clone();
            }
        }
        let mut pipes = self.pipes.write().unwrap_or_else(|p| p.into_inner());
        pipes
            .entry(node.clone())
            .or_insert_with(|| {
                Arc::new(RedisPipe::to(
                    self.topology.node_info(node),
                    self.tls.clone(),
                    self.scripts.clone(),
                ))
            })
            .clone()
    }

    /// The nodes this pipe has talked to (tests).
    #[cfg(test)]
    fn nodes(&self) -> Vec<Node> {
        self.pipes
            .read()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }
}

fn map_failed(e: redis::RedisError) -> PipeError {
    PipeError::Connection(format!("Redis Cluster slot map: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::{RedisHandle, Target};
    use harness::redis_server::RedisCluster;

    fn topology(handle: &RedisHandle) -> Arc<Topology> {
        match handle.target() {
            Target::Cluster(t) => t.clone(),
            Target::Single(_) => panic!("not a cluster handle"),
        }
    }

    fn node_of(cluster: &RedisCluster, port: u16) -> Node {
        assert!(cluster.ports().contains(&port));
        Node {
            host: "127.0.0.1".into(),
            port,
        }
    }

    /// Keys whose slots are served by different primaries.
    fn keys_on_every_node(map: &SlotMap) -> Vec<String> {
        let mut keys: Vec<String> = Vec::new();
        for i in 0.. {
            let k = format!("{{org-{i}}}:k");
            let owner = map.owner(key_slot(k.as_bytes()));
            if keys
                .iter()
                .all(|o| map.owner(key_slot(o.as_bytes())) != owner)
            {
                keys.push(k);
            }
            if keys.len() == map.nodes().len() || i > 10_000 {
                break;
            }
        }
        keys
    }

    #[tokio::test]
    async fn commands_go_to_the_slot_owner_and_follow_moved_and_ask() {
        let cluster = RedisCluster::start(3).expect("a 3-node Redis Cluster");
        let handle = RedisHandle::open(&cluster.urls(), "t:", None, true).unwrap();
        let topology = topology(&handle);
        let script = crate::redis::pipe::Script::new(
            "redis.call('INCR', KEYS[1]) return redis.call('GET', KEYS[1])",
        );
        let pipe = ClusterPipe::new(topology.clone(), None, vec![script.source]);
        let incr = |key: &'static str| {
            let script = &script;
            move || RespCommand::evalsha(script, &[key], &[])
        };
        // Every primary serves some of the keys.
        let map = topology.map().await.unwrap();
        assert!(map.covers_all());
        assert_eq!(map.nodes().len(), 3);
        let keys: Vec<&'static str> = keys_on_every_node(&map)
            .into_iter()
            .map(|k| &*Box::leak(k.into_boxed_str()))
            .collect();
        assert_eq!(keys.len(), 3);
        for k in &keys {
            let r = pipe.call(k, incr(k)).await.unwrap();
            assert_eq!(r, Reply::Bulk(Some(b"1".to_vec())));
        }
        assert_eq!(pipe.nodes().len(), 3, "one connection per primary");

        // A stale map (every slot on the first node): MOVED replies lead
        // each command to its owner, and the map is fetched again.
        let first = node_of(&cluster, cluster.ports()[0]);
        // (A refresh is asked for no sooner than this after the last.)
        tokio::time::sleep(crate::redis::cluster::MIN_REFRESH_INTERVAL).await;
        topology.set(SlotMap::single(first.clone()));
        for k in &keys {
            let r = pipe.call(k, incr(k)).await.unwrap();
            assert_eq!(r, Reply::Bulk(Some(b"2".to_vec())), "{k}");
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while topology.current().is_none_or(|m| m.nodes().len() != 3) {
            assert!(
                std::time::Instant::now() < deadline,
                "the map was not refreshed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // A slot migrating from its owner to another node: the owner
        // answers ASK for a key it does not hold, and the command goes to
        // the importing node behind ASKING.
        let map = topology.map().await.unwrap();
        let fresh = (0..)
            .map(|i| format!("{{mig-{i}}}:k"))
            .find(|k| map.owner(key_slot(k.as_bytes())) == Some(&first))
            .unwrap();
        let fresh: &'static str = Box::leak(fresh.into_boxed_str());
        let slot = key_slot(fresh.as_bytes());
        let target = map.nodes().iter().find(|n| **n != first).unwrap().clone();
        let id = |port: u16| cluster.node_id(port).unwrap();
        cluster
            .command(
                target.port,
                &[
                    "CLUSTER",
                    "SETSLOT",
                    &slot.to_string(),
                    "IMPORTING",
                    &id(first.port),
                ],
            )
            .unwrap();
        cluster
            .command(
                first.port,
                &[
                    "CLUSTER",
                    "SETSLOT",
                    &slot.to_string(),
                    "MIGRATING",
                    &id(target.port),
                ],
            )
            .unwrap();
        let r = pipe.call(fresh, incr(fresh)).await.unwrap();
        assert_eq!(r, Reply::Bulk(Some(b"1".to_vec())));
        // It landed on the importing node.
        let on_target = cluster
            .command(
                target.port,
                &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
            )
            .unwrap();
        assert_eq!(on_target.trim(), "1");
        // Put the slot back as it was.
        for port in [first.port, target.port] {
            cluster
                .command(port, &["CLUSTER", "SETSLOT", &slot.to_string(), "STABLE"])
                .unwrap();
        }
    }

    /// A killed primary answers no `MOVED`: its connection is refused. The
    /// calls after the first refused one go to the replica promoted in its
    /// place (the map fetched again on the connection error, the dead
    /// node's pipe dropped), without the dead node coming back.
    #[tokio::test]
    async fn calls_follow_a_failover_to_the_promoted_replica() {
        let mut cluster = RedisCluster::start_with_replicas(3).expect("a Redis Cluster");
        let handle = RedisHandle::open(&cluster.urls(), "t:", None, true).unwrap();
        let topology = topology(&handle);
        let pipe = ClusterPipe::new(topology.clone(), None, vec![]);
        let incr = || RespCommand::command(&["INCR".into(), "{fo}:n".into()]);
        assert_eq!(pipe.call("{fo}:n", incr).await.unwrap(), Reply::Int(1));

        let slot = key_slot(b"{fo}:n");
        let dead = cluster.primary_of(slot).unwrap().expect("an owner");
        assert_eq!(topology.current().unwrap().owner(slot).unwrap().port, dead);
        // The replica must hold the first write before its primary dies
        // (a replica that lags under load would otherwise be promoted
        // without it).
        let acked = (0..10).any(|_| {
            cluster
                .command(dead, &["WAIT", "1", "2000"])
                .is_ok_and(|n| n.trim() == "1")
        });
        assert!(acked, "the replica acknowledged the first write");
        cluster.kill(dead).unwrap();
        let promoted = cluster
            .wait_for_failover(dead, slot, Duration::from_secs(30))
            .unwrap();

        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let n = loop {
            match pipe.call("{fo}:n", incr).await {
                Ok(r) => break r,
                Err(PipeError::Connection(e)) => {
                    assert!(std::time::Instant::now() < deadline, "{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert_eq!(n, Reply::Int(2), "the replica had the first write");
        let map = topology.current().unwrap();
        assert_eq!(map.owner(slot).unwrap().port, promoted);
        assert!(!map.nodes().contains(&node_of(&cluster, dead)));
        assert!(
            !pipe.nodes().contains(&node_of(&cluster, dead)),
            "the dead node's pipe is dropped: {:?}",
            pipe.nodes()
        );
    }
}
