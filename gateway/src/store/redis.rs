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
use redis::aio::MultiplexedConnection;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

/// The owner's write: object (optional) and events, unless terminal or gone.
/// KEYS: hash, events. ARGV: obj JSON or "", status, then seq/name/data triples.
/// Returns {0 written / 1 already terminal / -1 gone, then [`SETTLE`]'s
/// bucket and bytes}.
///
/// Idempotent: a write whose reply was lost (a client timeout while Redis
/// applied it) is retried by the owner, and the retry finds its own last
/// event (same id, same payload) already in the log, or, for an object
/// alone, the same object already stored: that is success, not a conflict.
static WRITE: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if #ARGV >= 5 then
  local n = #ARGV - 2
  local landed = redis.call('XRANGE', KEYS[2], '0-' .. (tonumber(ARGV[n]) + 1), '0-' .. (tonumber(ARGV[n]) + 1))
  if #landed > 0 and landed[1][2][4] == ARGV[n + 2] then return {0, '', 0} end
elseif ARGV[1] ~= '' and redis.call('HGET', KEYS[1], 'obj') == ARGV[1] then
  return {0, '', 0}
end
if terminal(st) then return {1, '', 0} end
if redis.call('HEXISTS', KEYS[1], 'closing') == 1 then return {1, '', 0} end
if ARGV[1] ~= '' then redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2]) end
if #ARGV >= 5 then
  local bytes = 0
  for i = 3, #ARGV, 3 do
    redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[i]) + 1), 't', ARGV[i + 1], 'd', ARGV[i + 2])
    bytes = bytes + #ARGV[i + 1] + #ARGV[i + 2]
  end
  redis.call('HINCRBY', KEYS[1], 'ebytes', bytes)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
if ARGV[1] ~= '' and terminal(ARGV[2]) then return settle(0) end
return {0, '', 0}
"#,
    )
});

/// Lua shared by the scripts that may end a run: `terminal(status)`, and
/// `settle(code)`, which recounts a capped response (one with `qkey`) at
/// its full size (object, input items, conversation and the event log's
/// `ebytes`, each entry's name and payload, as `store::charged_at_end`
/// counts) and returns {code, its bucket, the bytes to add to the bucket}
/// ({code, '', 0} when nothing is to be added). The bucket is in another
/// slot, so the caller adds them ([`RedisStore::adjust`]).
const SETTLE: &str = r#"
local function terminal(st)
  return st == 'completed' or st == 'failed' or st == 'cancelled' or st == 'incomplete'
end
local function settle(code)
  local q = redis.call('HMGET', KEYS[1], 'qkey', 'qbytes', 'ebytes')
  if not q[1] then return {code, '', 0} end
  local total = redis.call('HSTRLEN', KEYS[1], 'obj') + redis.call('HSTRLEN', KEYS[1], 'items')
    + redis.call('HSTRLEN', KEYS[1], 'ctx') + (tonumber(q[3]) or 0)
  local extra = total - (tonumber(q[2]) or 0)
  if extra <= 0 then return {code, '', 0} end
  redis.call('HSET', KEYS[1], 'qbytes', total)
  return {code, q[1], extra}
end
"#;

/// A script that may end a run, with [`SETTLE`]'s functions.
fn settling(body: &str) -> redis::Script {
    redis::Script::new(&format!("{SETTLE}{body}"))
}

/// A new response's hash and its time to live, in one step. KEYS: hash.
/// ARGV: time to live (ms), then field/value pairs.
static STORE_NEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 0
"#,
    )
});

/// Closes a running response's event log to its owner before an outside
/// terminal write (the owner's next WRITE answers "terminal"), so the log
/// read next is the whole log. KEYS: hash. Returns 0 closed (or already
/// closing), 1 already terminal, -1 gone.
/// A sweeper takes a handed-over run. KEYS: the hand-over key. ARGV: now
/// and the adopter's lease deadline (ms). Returns {2, record} when taken
/// (the key then reads `adopted:<until>`), {1} while an adopter that took
/// it has not renewed the lease yet, {0} when there is nothing to adopt.
static TAKE_HANDOVER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local v = redis.call('GET', KEYS[1])
if not v then return {0} end
if string.sub(v, 1, 8) == 'adopted:' then
  if tonumber(string.sub(v, 9)) > tonumber(ARGV[1]) then return {1} end
  return {0}
end
redis.call('SET', KEYS[1], 'adopted:' .. ARGV[2], 'KEEPTTL')
return {2, v}
"#,
    )
});

static CLOSE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return -1 end
if st == 'completed' or st == 'failed' or st == 'cancelled' or st == 'incomplete' then return 1 end
redis.call('HSET', KEYS[1], 'closing', '1')
return 0
"#,
    )
});

/// The owner's final write of a foreground response. KEYS: hash.
/// ARGV: obj JSON, status. Replaces a running status, or a terminal one
/// that a sweeper wrote (`swept`); a repeat of a landed write is success.
/// Returns {0 written / 1 already terminal / -1 gone, then [`SETTLE`]'s
/// bucket and bytes}.
static FINISH: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if redis.call('HGET', KEYS[1], 'obj') == ARGV[1] then return {0, '', 0} end
if terminal(st) and redis.call('HGET', KEYS[1], 'swept') ~= '1' then return {1, '', 0} end
redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2])
redis.call('HDEL', KEYS[1], 'swept')
return settle(0)
"#,
    )
});

/// An outside terminal write (cancel, sweeper). KEYS: hash, events.
/// ARGV: obj JSON, status, "1" when a sweeper writes, then for a background
/// run its terminal event: sequence number, name, payload. The log was
/// closed to its owner before it was read, so the event's number is the
/// one after the log's last entry; the script checks that before it writes
/// anything (-2 if not), rather than append out of order. Returns {code,
/// then [`SETTLE`]'s bucket and bytes}.
static TERMINATE: LazyLock<redis::Script> = LazyLock::new(|| {
    settling(
        r#"
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {-1, '', 0} end
if terminal(st) then return {1, '', 0} end
local event = #ARGV >= 6
if event then
  local seq = 0
  local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #last > 0 then seq = tonumber(string.match(last[1][1], '-(%d+)$')) end
  if seq ~= tonumber(ARGV[4]) then return {-2, '', 0} end
end
redis.call('HSET', KEYS[1], 'obj', ARGV[1], 'status', ARGV[2])
redis.call('HDEL', KEYS[1], 'closing')
if ARGV[3] == '1' then redis.call('HSET', KEYS[1], 'swept', '1') end
if event then
  redis.call('XADD', KEYS[2], '0-' .. (tonumber(ARGV[4]) + 1), 't', ARGV[5], 'd', ARGV[6])
  redis.call('HINCRBY', KEYS[1], 'ebytes', #ARGV[5] + #ARGV[6])
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return settle(0)
"#,
    )
});

/// TERMINATE's answer when its event would not follow the log's last one.
const OUT_OF_SEQUENCE: i64 = -2;

/// Deletes a response if it belongs to the org. KEYS: hash, events. ARGV: org.
/// Returns {deleted (0/1), its usage bucket or '', its counted bytes}.
static DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('HGET', KEYS[1], 'org') ~= ARGV[1] then return {0, '', '0'} end
local q = redis.call('HMGET', KEYS[1], 'qkey', 'qbytes')
redis.call('DEL', KEYS[1], KEYS[2])
return {1, q[1] or '', q[2] or '0'}
"#,
    )
});

/// Periods of a storage window that stored bytes are counted in.
pub const QUOTA_BUCKETS: u64 = 32;

/// Adds a new response's bytes to its org's usage unless that passes the
/// cap. KEYS: the org's live buckets, the current one last. ARGV: bytes,
/// cap, the current bucket's time to live (ms). Returns {added (0/1), the
/// bytes counted before}.
static CHARGE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
local used = 0
for i = 1, #KEYS do
  used = used + math.max(0, tonumber(redis.call('GET', KEYS[i])) or 0)
end
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return {0, used} end
redis.call('INCRBY', KEYS[#KEYS], ARGV[1])
redis.call('PEXPIRE', KEYS[#KEYS], ARGV[3])
return {1, used}
"#,
    )
});

/// Adds bytes to a usage bucket (negative: gives them back), unless it
/// already expired (which gave back everything it counted). KEYS: bucket.
/// ARGV: bytes.
static ADJUST: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
return redis.call('INCRBY', KEYS[1], ARGV[1])
"#,
    )
});

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

    /// `org`'s usage buckets that may count live responses at `now_ms`
    /// (oldest first, the current one last), and the current one's time to
    /// live: until the last response it may count expires.
    fn quota_buckets(&self, org: &str, now_ms: u64) -> (Vec<String>, u64) {
        let window = self.window.as_millis() as u64;
        let period = (window / QUOTA_BUCKETS).max(1000);
        let current = now_ms / period;
        let live = window.div_ceil(period);
        let keys = (current.saturating_sub(live)..=current)
            .map(|n| self.redis.key("quota", org, &format!(":stored:{n}")))
            .collect();
        let ttl = (current + 1) * period + window - now_ms;
        (keys, ttl)
    }

    /// Counts `bytes` against `org`'s cap: the bucket it was counted in,
    /// or the refusal.
    async fn charge(
        &self,
        conn: &mut RedisConn,
        org: &str,
        bytes: u64,
        cap: u64,
    ) -> StoreResult<String> {
        let (keys, ttl) = self.quota_buckets(org, super::now_ms());
        let mut script = CHARGE.prepare_invoke();
        // Idempotency records count too; the current bucket stays last.
        for key in self.record_buckets(org, super::now_ms()).0 {
            script.key(key);
        }
        for key in &keys {
            script.key(key);
        }
        let (added, used): (i64, u64) = script
            .arg(bytes)
            .arg(cap)
            .arg(ttl)
            .invoke_async(conn)
            .await
            .map_err(unavailable("create"))?;
        if added != 1 {
            return Err(StoreError::QuotaExceeded {
                used,
                needed: bytes,
                cap,
            });
        }
        // Never empty: the range of buckets includes the current one.
        Ok(keys.last().cloned().unwrap_or_default())
    }

    /// `org`'s usage buckets of other records ([`ResponseStore::charge_record`],
    /// `quota:{org}:records:<n>`): the same periods as the responses'
    /// buckets, but each expires `keep` after its period ends (the last
    /// record it counts expires by then). The current one last.
    fn record_buckets(&self, org: &str, now_ms: u64) -> (Vec<String>, u64) {
        let window = self.window.as_millis() as u64;
        let period = (window / QUOTA_BUCKETS).max(1000);
        let current = now_ms / period;
        let keys = (current.saturating_sub(window.div_ceil(period))..=current)
            .map(|n| self.redis.key("quota", org, &format!(":records:{n}")))
            .collect();
        (keys, (current + 1) * period - now_ms)
    }

    /// Gives `bytes` back to a usage bucket; a failure only logs (the
    /// bucket's expiry gives them back later).
    async fn refund(&self, conn: &mut RedisConn, bucket: &str, bytes: u64) {
        self.adjust(conn, bucket, -(bytes as i64), "refund").await;
    }

    /// Adds `bytes` to a usage bucket (what an ended run holds beyond its
    /// creation, [`SETTLE`]): never refused, the run was admitted. A
    /// failure only logs: the organisation's next create then counts less.
    async fn adjust(&self, conn: &mut RedisConn, bucket: &str, bytes: i64, op: &'static str) {
        let adjusted: Result<i64, _> = ADJUST.key(bucket).arg(bytes).invoke_async(conn).await;
        if let Err(e) = adjusted {
            tracing::warn!("response store: counting stored bytes ({op}) failed: {e}");
            crate::metrics::redis_error("store", op);
        }
    }

    /// The outcome of a script that may end a run, charging what the
    /// ended run holds beyond what its creation counted.
    async fn settled(
        &self,
        conn: &mut RedisConn,
        (code, bucket, extra): (i64, String, i64),
    ) -> i64 {
        if extra > 0 && !bucket.is_empty() {
            self.adjust(conn, &bucket, extra, "charge").await;
        }
        code
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

/// `0-<seq+1>` stream entry ids back to frames.
fn frames(entries: Vec<(String, Vec<String>)>) -> Vec<EncodedEvent> {
    entries
        .into_iter()
        .filter_map(|(id, fields)| {
            let seq = id.split_once('-')?.1.parse::<u64>().ok()?.checked_sub(1)?;
            let mut name = None;
            let mut data = None;
            for pair in fields.chunks_exact(2) {
                match pair[0].as_str() {
                    "t" => name = Some(pair[1].clone()),
                    "d" => data = Some(pair[1].clone()),
                    _ => {}
                }
            }
            Some(EncodedEvent {
                seq,
                name: name?,
                data: data?,
            })
        })
        .collect()
}

/// The first stream id strictly after sequence number `after`.
fn start_id(after: Option<u64>) -> String {
    match after {
        Some(n) => format!("0-{}", n + 2),
        None => "-".into(),
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
        Ok(Box::new(RedisFollower {
            redis: self.redis.clone(),
            conn: None,
            key: self.events(id),
            last_id: after.map_or_else(|| "0-0".to_string(), |n| format!("0-{}", n + 1)),
        }))
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
        let now = super::now_ms();
        let (records, until_period_ends) = self.record_buckets(org, now);
        let mut script = CHARGE.prepare_invoke();
        // The responses' buckets, then the records' with the current last
        // (the one the script adds to).
        for key in self.quota_buckets(org, now).0.iter().chain(&records) {
            script.key(key);
        }
        let (added, used): (i64, u64) = script
            .arg(bytes)
            .arg(cap)
            .arg(until_period_ends + keep.as_millis() as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("charge"))?;
        if added != 1 {
            return Err(StoreError::QuotaExceeded {
                used,
                needed: bytes,
                cap,
            });
        }
        Ok(())
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

/// Follows a Stream with `XREAD BLOCK` on its own connection (a blocking
/// command would stall every other request on the shared one), to the
/// node serving the stream's slot on a cluster.
struct RedisFollower {
    redis: Arc<RedisHandle>,
    conn: Option<MultiplexedConnection>,
    key: String,
    /// The last stream id delivered.
    last_id: String,
}

type XReadReply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;

#[async_trait]
impl EventFollower for RedisFollower {
    async fn next_batch(&mut self, wait: Duration) -> StoreResult<Vec<EncodedEvent>> {
        // A second try only after the cluster's slot map was fetched
        // again: after a redirect (the stream's slot moved since the
        // connection was made), or after its node refused, dropped or did
        // not answer (a killed primary sends no redirect; its replica may
        // hold the slot now).
        let mut refreshed = false;
        let reply: XReadReply = loop {
            let conn = match &mut self.conn {
                Some(c) => c,
                None => match self
                    .redis
                    .dedicated(&self.key, wait + Duration::from_secs(2))
                    .await
                {
                    Ok(c) => self.conn.insert(c),
                    Err(e) => {
                        if !refreshed && self.redis.refresh_after(&self.key, &e).await {
                            refreshed = true;
                            continue;
                        }
                        return Err(unavailable("follow")(e));
                    }
                },
            };
            let _rt = RoundTrip::start("follow");
            let reply = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(wait.as_millis().max(1) as u64)
                .arg("STREAMS")
                .arg(&self.key)
                .arg(&self.last_id)
                .query_async(conn)
                .await;
            match reply {
                Ok(r) => break r,
                Err(e) => {
                    self.conn = None;
                    if !refreshed && self.redis.refresh_after(&self.key, &e).await {
                        refreshed = true;
                        continue;
                    }
                    return Err(unavailable("follow")(e));
                }
            }
        };
        let entries = reply
            .and_then(|keys| keys.into_iter().next())
            .map(|(_, entries)| entries)
            .unwrap_or_default();
        if let Some((id, _)) = entries.last() {
            self.last_id.clone_from(id);
        }
        Ok(frames(entries))
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
