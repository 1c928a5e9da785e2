//! The Redis store, shared by every gateway replica.
//!
//! Key layout (prefix from config, `{id}` is the Redis Cluster hash tag):
//! - `<p>resp:{id}`: hash `org`, `status`, `obj` (response JSON), `items`
//!   and `ctx` (JSON arrays of input items and of the conversation);
//! - `<p>resp:{id}:events`: the run's event log, a Stream whose entry ids
//!   are `0-<sequence_number + 1>`, so `starting_after=N` is an `XRANGE`
//!   from `0-<N + 2>` and replicas agree on numbering without a counter;
//! - `<p>resp:{id}:handover`: the hand-over record of a run its draining
//!   owner let go (`runs::handover`), then `adopted:<until_ms>` once a
//!   peer's sweeper took it;
//! - `<p>runs:{leases}`: sorted set of running response ids scored by lease
//!   deadline (milliseconds), renewed in one `ZADD` per replica heartbeat;
//! - `<p>quota:{org}:stored:<n>`: the bytes of `org`'s responses stored in
//!   the `n`th period of a storage window cut in [`QUOTA_BUCKETS`] (about
//!   22 hours of a 30-day window), counted only under a plan with a cap.
//!   A bucket expires when the last response it counts does, so expiry
//!   gives the bytes back at most one period late; a delete gives them back
//!   at once (the response's hash names its bucket: `qkey`, `qbytes`).
//!   When a capped response's run ends, the script of its terminal write
//!   recounts it whole (object, items, conversation and `ebytes`, the
//!   bytes of its event log) into `qbytes`, and the difference is added
//!   to its bucket, unrefused (see [`SETTLE`]). The
//!   buckets of an org share its `{org}` tag: the check-and-add is one
//!   script in one slot, apart from the response's own slot (so a create
//!   refused by the store after its bytes were added gives them back);
//! - `<p>quota:{org}:records:<n>`: the same for the records of
//!   `Idempotency-Key`s charged in the `n`th period, each bucket expiring
//!   the idempotency window after its period ends; every check of the cap
//!   adds both kinds up.
//!
//! A response's keys share its `{id}` hash tag, so every script and
//! transaction over them stays in one Redis Cluster slot; the leases set is
//! a key (and slot) of its own, written apart (see `create`).
//!
//! Both keys of a response share a time to live of one storage window.
//! Writes that may end a run are Lua scripts that check the status first, so
//! a terminal status is set once and nothing is appended after it.
//!
//! Round trips: one per batch of relayed events (the owner's `write`), one
//! per lease heartbeat for all of a replica's runs, and a blocking `XREAD`
//! on a dedicated connection per live follower.

mod follow;
mod quota;
mod scripts;

use super::{
    EndedBy, EventFollower, NewResponse, ResponseStore, StoreError, StoreResult,
    StoredConversation, TakeHandover, WriteOutcome,
};
use crate::api::event_log::fold_output;
use crate::api::responses::{external_terminal, EncodedEvent};
use crate::api::responses::{InputItem, ResponseObject, ResponseStatus};
use crate::metrics::METRICS;
use crate::redis::{RedisConn, RedisHandle};
use async_trait::async_trait;
use follow::{frames, start_id, RedisFollower};
pub use quota::QUOTA_BUCKETS;
use scripts::*;
use std::sync::Arc;
use std::time::Duration;

/// More events than any run's log holds (the `COUNT` of a read of it all).
const WHOLE_LOG: usize = 1 << 30;

pub struct RedisStore {
    redis: Arc<RedisHandle>,
    window: Duration,
}

impl RedisStore {
    pub fn new(redis: Arc<RedisHandle>, window: Duration) -> Self {
        Self { redis, window }
    }

    fn hash(&self, id: &str) -> String {
        self.redis.key("resp", id, "")
    }

    fn events(&self, id: &str) -> String {
        self.redis.key("resp", id, ":events")
    }

    fn handover(&self, id: &str) -> String {
        self.redis.key("resp", id, ":handover")
    }

    fn leases(&self) -> String {
        self.redis.key("runs", "leases", "")
    }

    async fn conn(&self) -> StoreResult<RedisConn> {
        self.redis.conn().await.map_err(unavailable("connect"))
    }

    /// Fields of the hash for an org, `None` when absent or another org's.
    async fn fields(
        &self,
        org: &str,
        id: &str,
        names: &[&str],
    ) -> StoreResult<Option<Vec<String>>> {
        let _rt = RoundTrip::start("read");
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(self.hash(id)).arg("org");
        for n in names {
            cmd.arg(*n);
        }
        let values: Vec<Option<String>> = cmd
            .query_async(&mut conn)
            .await
            .map_err(unavailable("read"))?;
        if values.first().and_then(|o| o.as_deref()) != Some(org) {
            return Ok(None);
        }
        Ok(values.into_iter().skip(1).collect())
    }

    /// The lease and the response's keys (`create` after the cap).
    async fn store_new(
        &self,
        conn: &mut RedisConn,
        new: &NewResponse<'_>,
        key: &str,
        [object, items, context]: [String; 3],
        bucket: Option<&str>,
        bytes: u64,
    ) -> StoreResult<()> {
        // The lease first, then the response: the two keys are in different
        // Redis Cluster slots (one transaction cannot span them), and in
        // this order a connection lost part way never leaves a running
        // response without the lease that lets a sweeper end it. A lease
        // whose response never landed is harmless: the sweeper finds no
        // response (`Gone`) and drops it.
        if let Some(until) = new.lease_until_ms {
            redis::cmd("ZADD")
                .arg(self.leases())
                .arg(until)
                .arg(&new.object.id)
                .query_async::<()>(conn)
                .await
                .map_err(unavailable("create"))?;
        }
        // One script over the response's own keys (one slot): a script is
        // one command, so a cluster client follows a `MOVED` for it (and
        // fetches the slot map again) as for any other; inside MULTI/EXEC a
        // `MOVED` aborts the transaction and is followed by nothing, which
        // failed creates for minutes after a failover whose old primary
        // came back as a replica.
        let mut invocation = STORE_NEW.key(key);
        invocation
            .arg(self.window.as_millis() as u64)
            .arg("org")
            .arg(new.org)
            .arg("status")
            .arg(new.object.status.as_str())
            .arg("obj")
            .arg(object)
            .arg("items")
            .arg(items)
            .arg("ctx")
            .arg(context);
        if let Some(bucket) = bucket {
            invocation.arg("qkey").arg(bucket).arg("qbytes").arg(bytes);
        }
        invocation
            .invoke_async::<()>(conn)
            .await
            .map_err(unavailable("create"))
    }
}

/// Counts one round trip of `op` and its latency.
struct RoundTrip {
    op: &'static str,
    started: std::time::Instant,
}

impl RoundTrip {
    fn start(op: &'static str) -> Self {
        METRICS.store_round_trips.with_label_values(&[op]).inc();
        Self {
            op,
            started: std::time::Instant::now(),
        }
    }
}

impl Drop for RoundTrip {
    fn drop(&mut self) {
        METRICS
            .store_duration
            .with_label_values(&[self.op])
            .observe(self.started.elapsed().as_secs_f64());
    }
}

/// A Redis failure of `op`: logged, counted in `gateway_redis_errors_total`,
/// and returned as [`StoreError::Unavailable`] (the client sees a retryable 503).
fn unavailable(op: &'static str) -> impl Fn(redis::RedisError) -> StoreError {
    move |e| {
        tracing::warn!(op, "response store error: {e}");
        crate::metrics::redis_error("store", op);
        StoreError::Unavailable { op }
    }
}

fn corrupt(what: &'static str) -> StoreError {
    StoreError::Corrupt { what }
}

fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|_| StoreError::Encode)
}

fn outcome(code: i64) -> WriteOutcome {
    match code {
        0 => WriteOutcome::Written,
        1 => WriteOutcome::AlreadyTerminal,
        _ => WriteOutcome::Gone,
    }
}

#[async_trait]
impl ResponseStore for RedisStore {
    async fn create(&self, new: NewResponse<'_>) -> StoreResult<()> {
        let _rt = RoundTrip::start("create");
        let mut conn = self.conn().await?;
        let key = self.hash(&new.object.id);
        let (object, items, context) = (
            to_json(new.object)?,
            to_json(&new.input_items)?,
            to_json(&new.context)?,
        );
        // The cap before anything is written: a refused response leaves
        // nothing behind.
        let bytes = super::stored_bytes(&object, &items, &context);
        let bucket = match new.max_stored_bytes {
            0 => None,
            cap => Some(self.charge(&mut conn, new.org, bytes, cap).await?),
        };
        let stored = self
            .store_new(
                &mut conn,
                &new,
                &key,
                [object, items, context],
                bucket.as_deref(),
                bytes,
            )
            .await;
        if let (Err(_), Some(bucket)) = (&stored, &bucket) {
            self.refund(&mut conn, bucket, bytes).await;
        }
        stored
    }

    async fn get(&self, org: &str, id: &str) -> StoreResult<Option<ResponseObject>> {
        let Some(f) = self.fields(org, id, &["obj"]).await? else {
            return Ok(None);
        };
        let obj = f.into_iter().next().ok_or_else(|| corrupt("object"))?;
        serde_json::from_str(&obj)
            .map(Some)
            .map_err(|_| corrupt("object"))
    }

    async fn object(&self, id: &str) -> StoreResult<Option<ResponseObject>> {
        let _rt = RoundTrip::start("read");
        let mut conn = self.conn().await?;
        let obj: Option<String> = redis::cmd("HGET")
            .arg(self.hash(id))
            .arg("obj")
            .query_async(&mut conn)
            .await
            .map_err(unavailable("read"))?;
        obj.map(|o| serde_json::from_str(&o).map_err(|_| corrupt("object")))
            .transpose()
    }

    async fn conversation(&self, org: &str, id: &str) -> StoreResult<Option<StoredConversation>> {
        let Some(f) = self.fields(org, id, &["obj", "ctx"]).await? else {
            return Ok(None);
        };
        let [obj, ctx] = <[String; 2]>::try_from(f).map_err(|_| corrupt("conversation"))?;
        Ok(Some(StoredConversation {
            object: serde_json::from_str(&obj).map_err(|_| corrupt("object"))?,
            context: serde_json::from_str(&ctx).map_err(|_| corrupt("context"))?,
        }))
    }

    async fn input_items(&self, org: &str, id: &str) -> StoreResult<Option<Vec<InputItem>>> {
        let Some(f) = self.fields(org, id, &["items"]).await? else {
            return Ok(None);
        };
        let items = f.into_iter().next().ok_or_else(|| corrupt("items"))?;
        serde_json::from_str(&items)
            .map(Some)
            .map_err(|_| corrupt("items"))
    }

    async fn delete(&self, org: &str, id: &str) -> StoreResult<bool> {
        let _rt = RoundTrip::start("delete");
        let mut conn = self.conn().await?;
        let (deleted, bucket, bytes): (i64, String, u64) = DELETE
            .key(self.hash(id))
            .key(self.events(id))
            .arg(org)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("delete"))?;
        if deleted == 1 && !bucket.is_empty() && bytes > 0 {
            self.refund(&mut conn, &bucket, bytes).await;
        }
        Ok(deleted == 1)
    }

    async fn write(
        &self,
        id: &str,
        object: Option<&ResponseObject>,
        events: &[EncodedEvent],
    ) -> StoreResult<WriteOutcome> {
        let _rt = RoundTrip::start("write");
        let mut conn = self.conn().await?;
        let mut inv = WRITE.key(self.hash(id));
        inv.key(self.events(id));
        match object {
            Some(o) => inv.arg(to_json(o)?).arg(o.status.as_str()),
            None => inv.arg("").arg(""),
        };
        for f in events {
            inv.arg(f.seq).arg(&f.name).arg(&f.data);
        }
        let reply = inv
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("write"))?;
        Ok(outcome(self.settled(&mut conn, reply).await))
    }

    async fn finish(&self, id: &str, object: &ResponseObject) -> StoreResult<WriteOutcome> {
        let _rt = RoundTrip::start("write");
        let mut conn = self.conn().await?;
        let reply = FINISH
            .key(self.hash(id))
            .arg(to_json(object)?)
            .arg(object.status.as_str())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("write"))?;
        Ok(outcome(self.settled(&mut conn, reply).await))
    }

    async fn terminate(
        &self,
        id: &str,
        object: &mut ResponseObject,
        by: EndedBy,
    ) -> StoreResult<WriteOutcome> {
        let terminal = if object.background {
            // Close the log to the owner, then read all of it: the object
            // then tells what the replay shows. If this replica dies between
            // the two writes, the run stays closed but running, its owner
            // stops, the lease lapses and a sweeper ends it the same way.
            let closed = {
                let _rt = RoundTrip::start("terminate");
                let mut conn = self.conn().await?;
                CLOSE
                    .key(self.hash(id))
                    .invoke_async::<i64>(&mut conn)
                    .await
                    .map_err(unavailable("terminate"))?
            };
            if closed != 0 {
                return Ok(outcome(closed));
            }
            let events = self.read_events(id, None, WHOLE_LOG).await?;
            object.output = fold_output(&events);
            let seq = events.last().map_or(0, |e| e.seq + 1);
            Some(external_terminal(object, seq))
        } else {
            None
        };
        let _rt = RoundTrip::start("terminate");
        let mut conn = self.conn().await?;
        let mut inv = TERMINATE.key(self.hash(id));
        inv.key(self.events(id))
            .arg(to_json(object)?)
            .arg(object.status.as_str())
            .arg(if by == EndedBy::Sweeper { "1" } else { "" });
        if let Some(event) = &terminal {
            inv.arg(event.seq).arg(&event.name).arg(&event.data);
        }
        let reply = inv
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("terminate"))?;
        let code = self.settled(&mut conn, reply).await;
        if code == OUT_OF_SEQUENCE {
            tracing::error!(response_id = %id, "a closed event log grew before its terminal event");
            return Err(corrupt("event log"));
        }
        Ok(outcome(code))
    }

    async fn read_events(
        &self,
        id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<EncodedEvent>> {
        let _rt = RoundTrip::start("read_events");
        let mut conn = self.conn().await?;
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(self.events(id))
            .arg(start_id(after))
            .arg("+")
            .arg("COUNT")
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable("read_events"))?;
        Ok(frames(entries))
    }

    async fn follow(&self, id: &str, after: Option<u64>) -> StoreResult<Box<dyn EventFollower>> {
        Ok(Box::new(RedisFollower::new(
            self.redis.clone(),
            self.events(id),
            after,
        )))
    }

    async fn status(&self, id: &str) -> StoreResult<Option<ResponseStatus>> {
        let _rt = RoundTrip::start("status");
        let mut conn = self.conn().await?;
        let status: Option<String> = redis::cmd("HGET")
            .arg(self.hash(id))
            .arg("status")
            .query_async(&mut conn)
            .await
            .map_err(unavailable("status"))?;
        status
            .map(|s| ResponseStatus::parse(&s).ok_or_else(|| corrupt("status")))
            .transpose()
    }

    async fn renew_leases(&self, ids: &[String], until_ms: u64) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _rt = RoundTrip::start("lease");
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("ZADD");
        cmd.arg(self.leases());
        for id in ids {
            cmd.arg(until_ms).arg(id);
        }
        cmd.query_async::<()>(&mut conn)
            .await
            .map_err(unavailable("lease"))
    }

    async fn release_lease(&self, id: &str) -> StoreResult<()> {
        let _rt = RoundTrip::start("lease");
        let mut conn = self.conn().await?;
        redis::cmd("ZREM")
            .arg(self.leases())
            .arg(id)
            .query_async::<()>(&mut conn)
            .await
            .map_err(unavailable("lease"))
    }

    async fn hand_over(&self, id: &str, record: &str) -> StoreResult<()> {
        let _rt = RoundTrip::start("lease");
        let mut conn = self.conn().await?;
        // The record first, then the lease's end (two slots): a replica
        // that dies between them leaves a lease that lapses on its own into
        // the same adoption.
        redis::cmd("SET")
            .arg(self.handover(id))
            .arg(record)
            .arg("PX")
            .arg(self.window.as_millis() as u64)
            .query_async::<()>(&mut conn)
            .await
            .map_err(unavailable("lease"))?;
        redis::cmd("ZADD")
            .arg(self.leases())
            .arg(0)
            .arg(id)
            .query_async::<()>(&mut conn)
            .await
            .map_err(unavailable("lease"))
    }

    async fn take_handover(
        &self,
        id: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> StoreResult<TakeHandover> {
        let _rt = RoundTrip::start("lease");
        let mut conn = self.conn().await?;
        let (code, record): (i64, Option<String>) = TAKE_HANDOVER
            .key(self.handover(id))
            .arg(now_ms)
            .arg(until_ms)
            .invoke_async::<Vec<redis::Value>>(&mut conn)
            .await
            .map_err(unavailable("lease"))
            .and_then(|v| {
                let code = match v.first() {
                    Some(redis::Value::Int(c)) => *c,
                    _ => return Err(corrupt("handover")),
                };
                let record = match v.get(1) {
                    Some(redis::Value::BulkString(b)) => {
                        Some(String::from_utf8(b.clone()).map_err(|_| corrupt("handover"))?)
                    }
                    _ => None,
                };
                Ok((code, record))
            })?;
        match (code, record) {
            (2, Some(record)) => {
                redis::cmd("ZADD")
                    .arg(self.leases())
                    .arg(until_ms)
                    .arg(id)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(unavailable("lease"))?;
                Ok(TakeHandover::Taken(record))
            }
            (1, _) => Ok(TakeHandover::Held),
            _ => Ok(TakeHandover::NotHandedOver),
        }
    }

    fn shared(&self) -> bool {
        true
    }

    async fn charge_record(
        &self,
        org: &str,
        bytes: u64,
        cap: u64,
        keep: Duration,
    ) -> StoreResult<()> {
        let _rt = RoundTrip::start("charge");
        let mut conn = self.conn().await?;
        self.charge_record_bytes(&mut conn, org, bytes, cap, keep)
            .await
    }

    async fn expired_leases(&self, now_ms: u64, limit: usize) -> StoreResult<Vec<String>> {
        let _rt = RoundTrip::start("lease");
        let mut conn = self.conn().await?;
        redis::cmd("ZRANGEBYSCORE")
            .arg(self.leases())
            .arg("-inf")
            .arg(format!("({now_ms}"))
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable("lease"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store under a random prefix; its keys are removed afterwards.
    fn store(window: Duration) -> (RedisStore, Arc<RedisHandle>) {
        let prefix = format!("igwtest:{}:", crate::ids::new_id(""));
        let handle = Arc::new(RedisHandle::new("redis://127.0.0.1:6379", &prefix).unwrap());
        (RedisStore::new(handle.clone(), window), handle)
    }

    async fn cleanup(handle: &RedisHandle) {
        crate::redis::testing::delete_prefix(handle).await.unwrap();
    }

    #[tokio::test]
    async fn passes_the_store_suite() {
        let (store, handle) = store(Duration::from_secs(60));
        super::super::suite::run(&store).await;
        cleanup(&handle).await;
    }

    /// The suite on a real 3-primary Redis Cluster: responses of many ids
    /// spread over the nodes, the leases set on one, followers on each
    /// stream's node.
    #[tokio::test]
    async fn passes_the_store_suite_on_a_cluster() {
        let cluster = harness::RedisCluster::start(3).expect("a Redis Cluster");
        let handle = Arc::new(RedisHandle::open(&cluster.urls(), "igwtest:", None, true).unwrap());
        let store = RedisStore::new(handle, Duration::from_secs(60));
        super::super::suite::run(&store).await;
        // Responses with leases: each created (lease, then response) on
        // its own node, readable, and its lease on the leases' node.
        let mut ids = Vec::new();
        for _ in 0..12 {
            let id = super::super::suite::new_id();
            let obj = super::super::suite::object(&id, true);
            store
                .create(super::super::NewResponse {
                    org: "org-c",
                    object: &obj,
                    input_items: &[],
                    context: &[],
                    lease_until_ms: Some(1),
                    // The usage buckets of one org share a slot of their own.
                    max_stored_bytes: 1 << 30,
                })
                .await
                .unwrap();
            assert_eq!(store.get("org-c", &id).await.unwrap(), Some(obj));
            ids.push(id);
        }
        let expired = store.expired_leases(2, 1000).await.unwrap();
        assert!(ids.iter().all(|id| expired.contains(id)), "{expired:?}");
        let counts = cluster.key_counts().unwrap();
        assert!(
            counts.iter().filter(|n| **n > 0).count() >= 2,
            "keys on several nodes: {counts:?}"
        );
    }

    /// The suite on a cluster that speaks only TLS (followers' dedicated
    /// connections included), the certificate checked against its CA.
    #[tokio::test]
    async fn passes_the_store_suite_on_a_tls_cluster() {
        let cluster = harness::RedisCluster::start_tls(3).expect("a TLS Redis Cluster");
        let ca = harness::RedisCluster::test_ca();
        let handle =
            Arc::new(RedisHandle::open(&cluster.urls(), "igwtest:", Some(&ca), true).unwrap());
        let store = RedisStore::new(handle, Duration::from_secs(60));
        super::super::suite::run(&store).await;
    }

    #[tokio::test]
    async fn responses_expire_after_the_window() {
        let (store, handle) = store(Duration::from_millis(300));
        super::super::suite::expires(&store, Duration::from_millis(500)).await;
        cleanup(&handle).await;
    }

    #[test]
    fn a_responses_keys_share_one_slot() {
        let handle = Arc::new(RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap());
        let store = RedisStore::new(handle, Duration::from_secs(60));
        let slot = |k: String| crate::redis::cluster::key_slot(k.as_bytes());
        assert_eq!(slot(store.hash("resp_1")), slot(store.events("resp_1")));
    }

    #[test]
    fn stream_ids_map_to_sequence_numbers() {
        assert_eq!(start_id(Some(3)), "0-5");
        let f = frames(vec![(
            "0-5".into(),
            vec!["t".into(), "x".into(), "d".into(), "{}".into()],
        )]);
        assert_eq!(f[0].seq, 4);
    }
}
