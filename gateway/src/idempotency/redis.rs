//! Idempotency records in Redis, shared by every replica:
//! `<prefix>idem:{<digest>}`, one JSON string per key (the digest is the
//! hash tag, so a record is one slot on a cluster). Claiming is one atomic
//! `SET NX PX` (the lease); renewing, completing and releasing are compare-and-set
//! scripts on the claimant's token, so a claimant whose lease ran out can
//! neither overwrite nor delete the record of the request that took the
//! key after it.

use super::{IdempotencyError, IdempotencyResult, IdempotencyStore, Record};
use crate::redis::RedisHandle;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

pub struct RedisIdempotency {
    redis: Arc<RedisHandle>,
}

impl RedisIdempotency {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self { redis }
    }

    fn key(&self, digest: &str) -> String {
        self.redis.key("idem", digest, "")
    }
}

/// `SET NX PX`, or the record already there: one round trip, atomic (a
/// record that lapses between a failed `SET NX` and a `GET` cannot make
/// the claim see nothing).
static CLAIM: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
return redis.call('GET', KEYS[1])
"#,
    )
});

/// The head of the scripts that act only for the claimant (`ARGV[1]`):
/// past it, `record` is the decoded record and it is the claimant's; else
/// the script has returned 0.
const CLAIMANTS_ONLY: &str = r#"
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local ok, record = pcall(cjson.decode, current)
if not ok or record['token'] ~= ARGV[1] then return 0 end
"#;

/// Replaces the claimant's record with `ARGV[2]` for `ARGV[3]` ms.
static COMPLETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{CLAIMANTS_ONLY}redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])\nreturn 1\n"
    ))
});

/// Extends the claimant's claim to `ARGV[2]` ms, unless it already has an
/// outcome (whose window a renewal must not cut short).
static RENEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{CLAIMANTS_ONLY}if record['outcome'] ~= nil and record['outcome'] ~= cjson.null then return 0 end\nreturn redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    ))
});

/// Deletes the claimant's claim unless it already has an outcome.
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&format!(
        "{CLAIMANTS_ONLY}if record['outcome'] ~= nil and record['outcome'] ~= cjson.null then return 0 end\nreturn redis.call('DEL', KEYS[1])\n"
    ))
});

fn unavailable(op: &'static str) -> impl Fn(redis::RedisError) -> IdempotencyError {
    move |e| {
        tracing::warn!(op, "idempotency store: {e}");
        IdempotencyError::Unavailable { op }
    }
}

fn millis(d: Duration) -> u64 {
    d.as_millis().clamp(1, u64::MAX as u128) as u64
}

#[async_trait::async_trait]
impl IdempotencyStore for RedisIdempotency {
    async fn claim(
        &self,
        key: &str,
        record: &Record,
        lease: Duration,
    ) -> IdempotencyResult<Option<Record>> {
        let value = serde_json::to_string(record).map_err(|_| IdempotencyError::Corrupt)?;
        let mut conn = self.redis.conn().await.map_err(unavailable("connect"))?;
        let found: Option<String> = CLAIM
            .key(self.key(key))
            .arg(value)
            .arg(millis(lease))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("claim"))?;
        found
            .map(|text| serde_json::from_str(&text).map_err(|_| IdempotencyError::Corrupt))
            .transpose()
    }

    async fn renew(&self, key: &str, token: &str, lease: Duration) -> IdempotencyResult<bool> {
        let mut conn = self.redis.conn().await.map_err(unavailable("connect"))?;
        let renewed: i64 = RENEW
            .key(self.key(key))
            .arg(token)
            .arg(millis(lease))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("renew"))?;
        Ok(renewed == 1)
    }

    async fn complete(
        &self,
        key: &str,
        record: &Record,
        keep: Duration,
    ) -> IdempotencyResult<bool> {
        let value = serde_json::to_string(record).map_err(|_| IdempotencyError::Corrupt)?;
        let mut conn = self.redis.conn().await.map_err(unavailable("connect"))?;
        let done: i64 = COMPLETE
            .key(self.key(key))
            .arg(&record.token)
            .arg(value)
            .arg(millis(keep))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("complete"))?;
        Ok(done == 1)
    }

    async fn release(&self, key: &str, token: &str) -> IdempotencyResult<()> {
        let mut conn = self.redis.conn().await.map_err(unavailable("connect"))?;
        let _: i64 = RELEASE
            .key(self.key(key))
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable("release"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::testing::{cleanup, test_redis};

    #[tokio::test]
    async fn the_redis_store_passes_the_suite() {
        let handle = test_redis();
        if handle.conn().await.is_err() {
            eprintln!("no test Redis; skipping");
            return;
        }
        super::super::suite::run(&RedisIdempotency::new(handle.clone()), "redis").await;
        // Keys follow the store's layout: prefix, kind, the digest as hash tag.
        let key = RedisIdempotency::new(handle.clone()).key("abc");
        assert_eq!(key, format!("{}idem:{{abc}}", handle.prefix()));
        cleanup(&handle).await;
    }
}
