//! Stored bytes counted per organisation against its plan's cap: the
//! usage buckets of responses and of other records, and the adds and
//! refunds of their counts.

use super::scripts::{ADJUST, CHARGE};
use super::{unavailable, RedisStore};
use crate::redis::RedisConn;
use crate::store::{StoreError, StoreResult};

/// Periods of a storage window that stored bytes are counted in.
pub const QUOTA_BUCKETS: u64 = 32;

impl RedisStore {
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

    /// Counts `bytes` of a new response against `org`'s cap: the bucket
    /// it was counted in, or the refusal.
    pub(super) async fn charge(
        &self,
        conn: &mut RedisConn,
        org: &str,
        bytes: u64,
        cap: u64,
    ) -> StoreResult<String> {
        let now = crate::store::now_ms();
        let (keys, ttl) = self.quota_buckets(org, now);
        // Idempotency records count too; the current bucket stays last.
        let records = self.record_buckets(org, now).0;
        charge_last(conn, records.iter().chain(&keys), bytes, cap, ttl, "create").await?;
        // Never empty: the range of buckets includes the current one.
        Ok(keys.last().cloned().unwrap_or_default())
    }

    /// Counts `bytes` of another record against `org`'s cap, in a bucket
    /// that lives `keep` past its period.
    pub(super) async fn charge_record_bytes(
        &self,
        conn: &mut RedisConn,
        org: &str,
        bytes: u64,
        cap: u64,
        keep: std::time::Duration,
    ) -> StoreResult<()> {
        let now = crate::store::now_ms();
        let (records, until_period_ends) = self.record_buckets(org, now);
        // The responses' buckets, then the records' with the current last
        // (the one the script adds to).
        let keys = self.quota_buckets(org, now).0;
        let ttl = until_period_ends + keep.as_millis() as u64;
        charge_last(conn, keys.iter().chain(&records), bytes, cap, ttl, "charge").await
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
    pub(super) async fn refund(&self, conn: &mut RedisConn, bucket: &str, bytes: u64) {
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
    pub(super) async fn settled(
        &self,
        conn: &mut RedisConn,
        (code, bucket, extra): (i64, String, i64),
    ) -> i64 {
        if extra > 0 && !bucket.is_empty() {
            self.adjust(conn, &bucket, extra, "charge").await;
        }
        code
    }
}

/// Adds `bytes` to the last of `keys` unless the sum over all of them
/// would pass `cap` ([`CHARGE`], one script in the org's slot).
async fn charge_last<'a>(
    conn: &mut RedisConn,
    keys: impl Iterator<Item = &'a String>,
    bytes: u64,
    cap: u64,
    ttl_ms: u64,
    op: &'static str,
) -> StoreResult<()> {
    let mut script = CHARGE.prepare_invoke();
    for key in keys {
        script.key(key);
    }
    let (added, used): (i64, u64) = script
        .arg(bytes)
        .arg(cap)
        .arg(ttl_ms)
        .invoke_async(conn)
        .await
        .map_err(unavailable(op))?;
    if added != 1 {
        return Err(StoreError::QuotaExceeded {
            used,
            needed: bytes,
            cap,
        });
    }
    Ok(())
}
