//! Redis Cluster for the connections the redis crate's cluster client does
//! not make: the pipelined connections of [`super::cluster_pipe`] (one per
//! primary), and
//! the dedicated connections of blocking reads (`XREAD BLOCK`) and pub/sub.
//!
//! - [`key_slot`]: the hash slot of a key (CRC16 of its `{hash tag}`, or of
//!   the whole key without one, modulo 16384), as the servers compute it;
//! - [`SlotMap`]: which primary serves each slot, from `CLUSTER SLOTS`;
//! - [`Topology`]: the current map of one cluster, fetched from the seed
//!   nodes on first use, again after a redirect or an error reaching a node
//!   (a killed primary answers no `MOVED`: its connections are refused or
//!   time out, while its replica takes its slots), and every
//!   [`PERIODIC_REFRESH`]; single-flight, at most one fetch every
//!   [`MIN_REFRESH_INTERVAL`] however many calls fail meanwhile, asking the
//!   other known nodes and the seeds before the node that failed;
//! - [`RefreshReason`]: why a map is fetched (counted in
//!   `gateway_redis_slot_refreshes_total`; a fetch that finds slots on
//!   another node than before counts in `gateway_redis_failovers_total`);
//! - [`Redirect`]: a `MOVED`/`ASK` error reply.
//!
//! Every multi-key operation of the gateway names keys of one hash tag (an
//! organisation, a response id), so each goes to one node.

use crate::metrics::METRICS;
use redis::{ConnectionAddr, ConnectionInfo, RedisResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Hash slots of a Redis Cluster.
pub const SLOTS: usize = 16384;

/// A refresh asked for sooner than this after the last one waits for the
/// interval to pass (a storm of failing calls makes at most one
/// `CLUSTER SLOTS` per interval, and callers waiting meanwhile share it).
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(250);

/// The map is fetched again this often even when nothing failed: a
/// failover or resharding is learnt before a call runs into it. One
/// `CLUSTER SLOTS` per process per period: cheap.
pub const PERIODIC_REFRESH: Duration = Duration::from_secs(30);

/// Why the slot map is fetched (the `reason` label of
/// `gateway_redis_slot_refreshes_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshReason {
    /// The first use: no map yet.
    Initial,
    /// A `MOVED` reply: the slot lives on another node now.
    Moved,
    /// An `ASK` reply: the slot is being migrated.
    Ask,
    /// A node could not be reached, reset the connection or timed out:
    /// it may have failed, its slots taken over by a replica.
    ConnectionError,
    /// The map names no node for a slot.
    Unserved,
    /// Every [`PERIODIC_REFRESH`].
    Periodic,
}

impl RefreshReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RefreshReason::Initial => "initial",
            RefreshReason::Moved => "moved",
            RefreshReason::Ask => "ask",
            RefreshReason::ConnectionError => "connection_error",
            RefreshReason::Unserved => "unserved",
            RefreshReason::Periodic => "periodic",
        }
    }

    /// Whether an error on a connection of our own says the map may be
    /// stale, and why: a redirect, or a node that did not answer (refused,
    /// reset, timed out: every I/O failure). Other errors (a script's, a
    /// wrong type) say nothing about where slots live.
    pub fn for_error(e: &redis::RedisError) -> Option<RefreshReason> {
        match e.kind() {
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => Some(RefreshReason::Moved),
            redis::ErrorKind::Server(redis::ServerErrorKind::Ask) => Some(RefreshReason::Ask),
            redis::ErrorKind::Io | redis::ErrorKind::ClusterConnectionNotFound => {
                Some(RefreshReason::ConnectionError)
            }
            _ => None,
        }
    }
}

/// Whether a call that failed with an error of `reason` is worth one more
/// try once the map has been fetched again: after a redirect (the new map
/// leads elsewhere) or a lost or refused connection, yes; after a timeout
/// only if the slot's owner changed (the same stalled node would only make
/// the caller wait as long again).
pub fn retry_after_refresh(reason: RefreshReason, timed_out: bool, owner_changed: bool) -> bool {
    match reason {
        RefreshReason::Moved | RefreshReason::Ask => true,
        RefreshReason::ConnectionError => owner_changed || !timed_out,
        RefreshReason::Initial | RefreshReason::Unserved | RefreshReason::Periodic => owner_changed,
    }
}

/// The order in which nodes are asked for the map: the nodes of the current
/// map, then the seeds not among them, and last the node that just failed
/// (a dead node may hold every caller for a connect timeout).
pub fn ask_order(known: &[Node], seeds: &[Node], failed: Option<&Node>) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::with_capacity(known.len() + seeds.len());
    for n in known.iter().chain(seeds) {
        if !nodes.contains(n) {
            nodes.push(n.clone());
        }
    }
    if let Some(i) = failed.and_then(|f| nodes.iter().position(|n| n == f)) {
        let n = nodes.remove(i);
        nodes.push(n);
    }
    nodes
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum
/// of Redis Cluster's key distribution.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The part of a key that is hashed: the text between the first `{` and
/// the first `}` after it, when that is not empty; else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The hash slot of a key.
pub fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS as u16 - 1)
}

/// A primary node: host (as the cluster announces it) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Node {
    /// `host:port` as a redirect names it (an IPv6 host unbracketed;
    /// an empty host means the node that answered: `asked`).
    fn parse(addr: &str, asked: &Node) -> Option<Node> {
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(Node {
            host: if host.is_empty() {
                asked.host.clone()
            } else {
                host.to_owned()
            },
            port: port.parse().ok()?,
        })
    }
}

/// A redirect error reply: the slot now lives on (`Moved`), or is being
/// migrated to (`Ask`), another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    Moved(Node),
    Ask(Node),
}

impl Redirect {
    /// `MOVED <slot> <host>:<port>` or `ASK <slot> <host>:<port>`, from the
    /// node `asked`.
    pub fn parse(error: &str, asked: &Node) -> Option<Redirect> {
        let mut words = error.split_ascii_whitespace();
        let kind = words.next()?;
        let _slot: u16 = words.next()?.parse().ok()?;
        let node = Node::parse(words.next()?, asked)?;
        match kind {
            "MOVED" => Some(Redirect::Moved(node)),
            "ASK" => Some(Redirect::Ask(node)),
            _ => None,
        }
    }
}

/// Which primary serves each slot.
#[derive(Debug)]
pub struct SlotMap {
    /// Per slot, an index into `nodes` (`u16::MAX`: no node serves it).
    owner: Box<[u16]>,
    nodes: Vec<Node>,
}

const UNSERVED: u16 = u16::MAX;

impl SlotMap {
    /// From a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id, ...],
    /// replicas...], ...]`) of the node `asked` (an empty or `?` host is
    /// that node's).
    pub fn from_cluster_slots(reply: &redis::Value, asked: &Node) -> Result<SlotMap, String> {
        let redis::Value::Array(ranges) = reply else {
            return Err(format!("CLUSTER SLOTS answered {reply:?}"));
        };
        let mut map = SlotMap {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        };
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                return Err(format!("CLUSTER SLOTS range {range:?}"));
            };
            let (Some(start), Some(end), Some(redis::Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(format!("CLUSTER SLOTS range {range:?}"));
            };
            let int = |v: &redis::Value| match v {
                redis::Value::Int(n) => Some(*n),
                _ => None,
            };
            let (Some(start), Some(end)) = (int(start), int(end)) else {
                return Err(format!("CLUSTER SLOTS range {range:?}"));
            };
            let host = match primary.first() {
                Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(redis::Value::SimpleString(s)) => s.clone(),
                _ => String::new(),
            };
            let port = primary.get(1).and_then(int);
            let (Some(port), true) = (port, (0..SLOTS as i64).contains(&start) && start <= end)
            else {
                return Err(format!("CLUSTER SLOTS range {range:?}"));
            };
            let node = Node {
                host: if host.is_empty() || host == "?" {
                    asked.host.clone()
                } else {
                    host
                },
                port: u16::try_from(port).map_err(|_| format!("CLUSTER SLOTS port {port}"))?,
            };
            let index = match map.nodes.iter().position(|n| *n == node) {
                Some(i) => i,
                None => {
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            let end = (end as usize).min(SLOTS - 1);
            for slot in &mut map.owner[start as usize..=end] {
                *slot = index as u16;
            }
        }
        if map.nodes.is_empty() {
            return Err("CLUSTER SLOTS: no slot is served".into());
        }
        Ok(map)
    }

    /// The primary serving `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&Node> {
        match self.owner.get(usize::from(slot)) {
            Some(&i) if i != UNSERVED => self.nodes.get(usize::from(i)),
            _ => None,
        }
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Whether every slot has a primary.
    pub fn covers_all(&self) -> bool {
        self.owner.iter().all(|&i| i != UNSERVED)
    }

    /// How many slots `self` and `newer` both serve from different nodes,
    /// and the first such slot's old and new owner: a failover (a replica
    /// promoted in a primary's place) or a resharding.
    pub fn moved_to(&self, newer: &SlotMap) -> Option<(usize, Node, Node)> {
        let mut first = None;
        let mut count = 0;
        for slot in 0..SLOTS as u16 {
            if let (Some(old), Some(new)) = (self.owner(slot), newer.owner(slot)) {
                if old != new {
                    count += 1;
                    first.get_or_insert_with(|| (old.clone(), new.clone()));
                }
            }
        }
        first.map(|(old, new)| (count, old, new))
    }

    /// A map from `(first slot, last slot, node)` ranges (tests).
    #[cfg(test)]
    pub fn from_ranges(ranges: &[(u16, u16, Node)]) -> SlotMap {
        let mut map = SlotMap {
            owner: vec![UNSERVED; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
        };
        for (start, end, node) in ranges {
            let index = match map.nodes.iter().position(|n| n == node) {
                Some(i) => i,
                None => {
                    map.nodes.push(node.clone());
                    map.nodes.len() - 1
                }
            };
            for slot in &mut map.owner[usize::from(*start)..=usize::from(*end)] {
                *slot = index as u16;
            }
        }
        map
    }

    /// A map where `node` serves every slot (tests: a stale map whose
    /// calls are redirected).
    #[cfg(test)]
    pub fn single(node: Node) -> SlotMap {
        SlotMap {
            owner: vec![0; SLOTS].into_boxed_slice(),
            nodes: vec![node],
        }
    }
}

/// The node a TCP address names (`None` for a socket path).
fn node_at(info: &ConnectionInfo) -> Option<Node> {
    match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => Some(Node {
            host: host.clone(),
            port: *port,
        }),
        _ => None,
    }
}

/// The slot map of one cluster, and how to connect to its nodes.
pub struct Topology {
    seeds: Vec<ConnectionInfo>,
    /// The CA to check `rediss://` nodes against (PEM), if not the system's.
    ca_pem: Option<Vec<u8>>,
    connect_timeout: Duration,
    response_timeout: Duration,
    map: RwLock<Option<Arc<SlotMap>>>,
    /// Held while fetching: one refresh at a time; when it last finished.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    /// Whether the periodic refresh has been started (on first use, inside
    /// the runtime that uses the map).
    periodic: AtomicBool,
}

impl Topology {
    /// `seeds` are the configured nodes (at least one, all of one TLS mode
    /// and credentials: the caller checks).
    pub fn new(
        seeds: Vec<ConnectionInfo>,
        ca_pem: Option<Vec<u8>>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            seeds,
            ca_pem,
            connect_timeout,
            response_timeout,
            map: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(None),
            periodic: AtomicBool::new(false),
        }
    }

    /// The map as last fetched, if any.
    pub fn current(&self) -> Option<Arc<SlotMap>> {
        self.map.read().ok().and_then(|m| m.clone())
    }

    /// Installs a map (tests: a stale one).
    #[cfg(test)]
    pub fn set(&self, map: SlotMap) {
        if let Ok(mut m) = self.map.write() {
            *m = Some(Arc::new(map));
        }
    }

    /// The current map, fetched first if there is none yet.
    pub async fn map(self: &Arc<Self>) -> RedisResult<Arc<SlotMap>> {
        self.keep_fresh();
        match self.current() {
            Some(m) => Ok(m),
            None => self.refresh(None, RefreshReason::Initial).await,
        }
    }

    /// Starts the refresh every [`PERIODIC_REFRESH`] (once; it ends with
    /// the topology or its runtime).
    fn keep_fresh(self: &Arc<Self>) {
        if self.periodic.swap(true, Ordering::Relaxed) {
            return;
        }
        let topology = Arc::downgrade(self);
        tokio::spawn(async move {
            let start = tokio::time::Instant::now() + PERIODIC_REFRESH;
            let mut ticks = tokio::time::interval_at(start, PERIODIC_REFRESH);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let Some(topology) = topology.upgrade() else {
                    return;
                };
                let Some(stale) = topology.current() else {
                    continue;
                };
                if let Err(e) = topology
                    .refresh(Some(&stale), RefreshReason::Periodic)
                    .await
                {
                    tracing::warn!("Redis Cluster slot map periodic refresh failed: {e}");
                }
            }
        });
    }

    /// The node serving `key` now.
    pub async fn node_of(self: &Arc<Self>, key: &str) -> RedisResult<Node> {
        let slot = key_slot(key.as_bytes());
        let map = self.map().await?;
        if let Some(n) = map.owner(slot) {
            return Ok(n.clone());
        }
        let map = self.refresh(Some(&map), RefreshReason::Unserved).await?;
        map.owner(slot).cloned().ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                "no Redis Cluster node serves the slot",
                format!("slot {slot}"),
            ))
        })
    }

    /// Fetches the map again, unless another caller did since `stale` was
    /// read (then the current map is returned). A fetch sooner than
    /// [`MIN_REFRESH_INTERVAL`] after the last waits for the interval.
    /// Asks the nodes of the current map, then the seeds, until one answers.
    pub async fn refresh(
        &self,
        stale: Option<&Arc<SlotMap>>,
        reason: RefreshReason,
    ) -> RedisResult<Arc<SlotMap>> {
        self.refresh_avoiding(stale, reason, None).await
    }

    /// [`Self::refresh`], asking `failed` (a node that just did not answer)
    /// only after every other.
    pub async fn refresh_avoiding(
        &self,
        stale: Option<&Arc<SlotMap>>,
        reason: RefreshReason,
        failed: Option<&Node>,
    ) -> RedisResult<Arc<SlotMap>> {
        let mut last = self.refreshing.lock().await;
        let previous = self.current();
        if let Some(current) = &previous {
            if stale.is_none_or(|s| !Arc::ptr_eq(s, current)) {
                return Ok(current.clone());
            }
            if let Some(wait) = last.and_then(|t| MIN_REFRESH_INTERVAL.checked_sub(t.elapsed())) {
                tokio::time::sleep(wait).await;
            }
        }
        METRICS
            .redis_slot_refreshes
            .with_label_values(&[reason.as_str()])
            .inc();
        let known: Vec<Node> = previous
            .as_ref()
            .map(|m| m.nodes().to_vec())
            .unwrap_or_default();
        let seeds: Vec<Node> = self.seeds.iter().filter_map(node_at).collect();
        let mut failure = None;
        for node in ask_order(&known, &seeds, failed) {
            match self.fetch(self.node_info(&node)).await {
                Ok(map) => {
                    let map = Arc::new(map);
                    if let Some((slots, from, to)) =
                        previous.as_ref().and_then(|p| p.moved_to(&map))
                    {
                        METRICS.redis_failovers.inc();
                        tracing::warn!(
                            "Redis Cluster: {slots} slots moved (a failover or resharding), \
                             from {from} to {to} among them"
                        );
                    }
                    if let Ok(mut m) = self.map.write() {
                        *m = Some(map.clone());
                    }
                    *last = Some(Instant::now());
                    return Ok(map);
                }
                Err(e) => failure = Some(e),
            }
        }
        *last = Some(Instant::now());
        Err(failure.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Io, "no Redis Cluster node to ask"))
        }))
    }

    /// Refreshes in the background (after a redirect or a failed node:
    /// `failed`), so the caller need not wait for it.
    pub fn refresh_soon(
        self: &Arc<Self>,
        stale: Option<Arc<SlotMap>>,
        reason: RefreshReason,
        failed: Option<Node>,
    ) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me
                .refresh_avoiding(stale.as_ref(), reason, failed.as_ref())
                .await
            {
                tracing::warn!("Redis Cluster slot map refresh failed: {e}");
            }
        });
    }

    /// After `error` on a connection of our own to the node serving `key`:
    /// fetches the map again if the error says it may be stale (see
    /// [`RefreshReason::for_error`]), and says whether one more try is
    /// worth it ([`retry_after_refresh`]).
    pub async fn refresh_after(&self, key: &str, error: &redis::RedisError) -> bool {
        let Some(reason) = RefreshReason::for_error(error) else {
            return false;
        };
        let slot = key_slot(key.as_bytes());
        let stale = self.current();
        let before = stale.as_ref().and_then(|m| m.owner(slot).cloned());
        let failed = before
            .as_ref()
            .filter(|_| reason == RefreshReason::ConnectionError);
        match self.refresh_avoiding(stale.as_ref(), reason, failed).await {
            Ok(map) => retry_after_refresh(
                reason,
                error.is_timeout(),
                map.owner(slot) != before.as_ref(),
            ),
            Err(e) => {
                tracing::warn!("Redis Cluster slot map refresh failed: {e}");
                false
            }
        }
    }

    async fn fetch(&self, info: ConnectionInfo) -> RedisResult<SlotMap> {
        let Some(asked) = node_at(&info) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "Redis Cluster nodes are reached over TCP",
                info.addr().to_string(),
            )));
        };
        let client = self.client_for(info)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.connection_config(None))
            .await?;
        let reply: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await?;
        SlotMap::from_cluster_slots(&reply, &asked).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::Parse, "bad CLUSTER SLOTS reply", e))
        })
    }

    fn connection_config(
        &self,
        response_timeout: Option<Duration>,
    ) -> redis::AsyncConnectionConfig {
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(response_timeout.unwrap_or(self.response_timeout)))
    }

    /// How to reach `node`: as its seed URL says if it is a seed, else with
    /// the first seed's credentials, database and TLS mode at the node's
    /// address.
    pub fn node_info(&self, node: &Node) -> ConnectionInfo {
        if let Some(seed) = self
            .seeds
            .iter()
            .find(|s| node_at(s).as_ref() == Some(node))
        {
            return seed.clone();
        }
        let seed = self.seeds[0].clone();
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: node.host.clone(),
                port: node.port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(node.host.clone(), node.port),
        };
        seed.set_addr(addr)
    }

    fn client_for(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        match (&self.ca_pem, info.addr()) {
            (Some(pem), ConnectionAddr::TcpTls { .. }) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
            _ => redis::Client::open(info),
        }
    }

    /// A connection of its own to the node serving `key` (for a blocking
    /// read), whose replies may take up to `response_timeout`.
    pub async fn dedicated(
        self: &Arc<Self>,
        key: &str,
        response_timeout: Duration,
    ) -> RedisResult<redis::aio::MultiplexedConnection> {
        let node = self.node_of(key).await?;
        self.client_for(self.node_info(&node))?
            .get_multiplexed_async_connection_with_config(
                &self.connection_config(Some(response_timeout)),
            )
            .await
    }

    /// A pub/sub connection to any node that answers (a `PUBLISH` on one
    /// node of a cluster reaches the subscribers of every node): the nodes
    /// of the current map first (after a failover the seeds may name dead
    /// nodes), then the seeds. A node that does not answer has the map
    /// fetched again, in the background.
    pub async fn pubsub(self: &Arc<Self>) -> RedisResult<redis::aio::PubSub> {
        let stale = self.current();
        let known: Vec<Node> = stale
            .as_ref()
            .map(|m| m.nodes().to_vec())
            .unwrap_or_default();
        let seeds: Vec<Node> = self.seeds.iter().filter_map(node_at).collect();
        let mut failure = None;
        for node in ask_order(&known, &seeds, None) {
            let client = self.client_for(self.node_info(&node))?;
            let e =
                match tokio::time::timeout(self.connect_timeout, client.get_async_pubsub()).await {
                    Ok(Ok(p)) => return Ok(p),
                    Ok(Err(e)) => e,
                    Err(_) => {
                        redis::RedisError::from((redis::ErrorKind::Io, "pub/sub connect timed out"))
                    }
                };
            if stale.is_some() && known.contains(&node) {
                self.refresh_soon(stale.clone(), RefreshReason::ConnectionError, Some(node));
            }
            failure = Some(e);
        }
        Err(failure.unwrap_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::Io,
                "no Redis Cluster node to subscribe on",
            ))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_and_slots_match_redis() {
        // The check value of CRC16/XMODEM, and the example of the Redis
        // Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"123456789"), 12739);
        assert_eq!(key_slot(b"{123456789}.anything"), 12739);
        // Keys of one tag share a slot; the tag is the first {...}.
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(hash_tag(b"no tag"), b"no tag");
        assert_eq!(hash_tag(b"{open"), b"{open");
        // Values `redis-cli CLUSTER KEYSLOT` gives.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn redirects_parse() {
        let asked = Node {
            host: "10.0.0.1".into(),
            port: 6379,
        };
        assert_eq!(
            Redirect::parse("MOVED 3999 127.0.0.1:6381", &asked),
            Some(Redirect::Moved(Node {
                host: "127.0.0.1".into(),
                port: 6381
            }))
        );
        assert_eq!(
            Redirect::parse("ASK 3999 :6381", &asked),
            Some(Redirect::Ask(Node {
                host: "10.0.0.1".into(),
                port: 6381
            }))
        );
        assert_eq!(
            Redirect::parse("MOVED 1 ::1:7000", &asked),
            Some(Redirect::Moved(Node {
                host: "::1".into(),
                port: 7000
            }))
        );
        assert_eq!(
            Redirect::parse("ERR wrong number of arguments", &asked),
            None
        );
        assert_eq!(Redirect::parse("NOSCRIPT No matching script", &asked), None);
    }

    fn n(port: u16) -> Node {
        Node {
            host: "127.0.0.1".into(),
            port,
        }
    }

    /// A killed primary answers no redirect: its connections are refused,
    /// reset or time out. Each of those fetches the map again, as a
    /// redirect does; errors of the command itself do not.
    #[test]
    fn connection_errors_refresh_the_map_as_redirects_do() {
        use std::io::{Error, ErrorKind as Io};
        let reason = |e: redis::RedisError| RefreshReason::for_error(&e);
        for kind in [
            Io::ConnectionRefused,
            Io::ConnectionReset,
            Io::BrokenPipe,
            Io::UnexpectedEof,
            Io::TimedOut,
        ] {
            assert_eq!(
                reason(Error::from(kind).into()),
                Some(RefreshReason::ConnectionError),
                "{kind:?}"
            );
        }
        assert_eq!(
            reason((redis::ErrorKind::Io, "connect timed out").into()),
            Some(RefreshReason::ConnectionError)
        );
        let server = |kind, detail: &str| -> redis::RedisError {
            (redis::ErrorKind::Server(kind), "", detail.to_owned()).into()
        };
        assert_eq!(
            reason(server(redis::ServerErrorKind::Moved, "3999 127.0.0.1:6381")),
            Some(RefreshReason::Moved)
        );
        assert_eq!(
            reason(server(redis::ServerErrorKind::Ask, "3999 127.0.0.1:6381")),
            Some(RefreshReason::Ask)
        );
        for kind in [
            redis::ServerErrorKind::ResponseError,
            redis::ServerErrorKind::NoScript,
            redis::ServerErrorKind::TryAgain,
        ] {
            assert_eq!(reason(server(kind, "x")), None, "{kind:?}");
        }
        assert_eq!(reason((redis::ErrorKind::Parse, "bad reply").into()), None);

        // One more try after the refresh: always after a redirect or a
        // refused / lost connection; after a timeout only when the slot
        // went to another node (the same stalled node would stall again).
        use RefreshReason::*;
        assert!(retry_after_refresh(Moved, false, false));
        assert!(retry_after_refresh(Ask, false, false));
        assert!(retry_after_refresh(ConnectionError, false, false));
        assert!(retry_after_refresh(ConnectionError, false, true));
        assert!(retry_after_refresh(ConnectionError, true, true));
        assert!(!retry_after_refresh(ConnectionError, true, false));
        assert_eq!(ConnectionError.as_str(), "connection_error");
    }

    #[test]
    fn a_refresh_asks_the_failed_node_last() {
        let known = [n(1), n(2), n(3)];
        let seeds = [n(1), n(4)];
        assert_eq!(
            ask_order(&known, &seeds, Some(&n(1))),
            vec![n(2), n(3), n(4), n(1)]
        );
        assert_eq!(ask_order(&[], &seeds, None), vec![n(1), n(4)]);
        assert_eq!(ask_order(&known, &[], Some(&n(9))), vec![n(1), n(2), n(3)]);
    }

    #[test]
    fn a_slot_served_by_another_node_is_a_failover() {
        let before = SlotMap::from_ranges(&[(0, 99, n(1)), (100, 16383, n(2))]);
        let same = SlotMap::from_ranges(&[(0, 99, n(1)), (100, 16383, n(2))]);
        assert_eq!(before.moved_to(&same), None);
        // A replica (port 3) promoted in place of port 1.
        let after = SlotMap::from_ranges(&[(0, 99, n(3)), (100, 16383, n(2))]);
        assert_eq!(before.moved_to(&after), Some((100, n(1), n(3))));
        // Slots no longer served (the cluster mid-failover) are not moves.
        let partial = SlotMap::from_ranges(&[(100, 16383, n(2))]);
        assert_eq!(before.moved_to(&partial), None);
    }

    #[test]
    fn cluster_slots_replies_map_every_slot() {
        use redis::Value::{Array, BulkString, Int};
        let node = |host: &str, port: i64| {
            Array(vec![
                BulkString(host.as_bytes().to_vec()),
                Int(port),
                BulkString(b"id".to_vec()),
            ])
        };
        let reply = Array(vec![
            Array(vec![Int(0), Int(5460), node("127.0.0.1", 7000)]),
            Array(vec![
                Int(5461),
                Int(10922),
                node("", 7001),
                node("127.0.0.1", 7004),
            ]),
            Array(vec![Int(10923), Int(16383), node("127.0.0.1", 7002)]),
        ]);
        let asked = Node {
            host: "10.1.1.1".into(),
            port: 7001,
        };
        let map = SlotMap::from_cluster_slots(&reply, &asked).unwrap();
        assert!(map.covers_all());
        assert_eq!(map.nodes().len(), 3);
        assert_eq!(map.owner(0).unwrap().port, 7000);
        assert_eq!(map.owner(5461).unwrap(), &asked);
        assert_eq!(map.owner(16383).unwrap().port, 7002);
        let partial = Array(vec![Array(vec![Int(0), Int(10), node("h", 1)])]);
        let map = SlotMap::from_cluster_slots(&partial, &asked).unwrap();
        assert!(!map.covers_all());
        assert_eq!(map.owner(11), None);
        assert!(SlotMap::from_cluster_slots(&Array(vec![]), &asked).is_err());
        assert!(SlotMap::from_cluster_slots(&Int(1), &asked).is_err());
    }
}
