//! The global stage in Redis: one Lua script to admit (`admit.lua`) and one
//! to settle (`settle.lua`), each a single round trip (EVALSHA).
//!
//! Keys of one organisation share its hash tag, so both scripts touch one
//! Redis Cluster slot:
//!
//! ```text
//! <prefix>rl:{<org>}:<model>:req       zset  request log (sliding minute)
//! <prefix>rl:{<org>}:<model>:tok       zset  token log ("<request id>:<tokens>")
//! <prefix>rl:{<org>}:<model>:toksum    string sum of the token log
//! <prefix>rl:{<org>}:<model>:inflight  zset  in-flight requests by deadline
//! <prefix>spend:{<org>}                string nano-dollars spent
//! <prefix>usage:{<org>}:<YYYY-MM-DD>   hash  "<key id>|<model>|<counter>" -> n
//! ```

use super::{Admission, AdmitRequest, LimitStore, Settlement, Verdict, WINDOW_MS};
use crate::redis_conn::RedisHandle;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use tokio::sync::{mpsc, oneshot};

/// Usage counters are kept this long (seconds).
pub const USAGE_TTL_SECS: u64 = 400 * 86_400;

const SETTLE_LUA: &str = include_str!("settle.lua");

/// Most settlements sent in one pipeline.
const MAX_SETTLE_BATCH: usize = 256;

/// Most (organisation, model) key sets kept; the cache starts over beyond.
const MAX_CACHED_KEY_SETS: usize = 100_000;

/// The Redis keys of one organisation's limits on one model, formatted once
/// (building them was a dozen small allocations per request).
struct LimitKeys {
    req: String,
    tok: String,
    toksum: String,
    inflight: String,
    spend: String,
}

/// org -> model -> keys; looked up by `&str` without allocating.
type KeyCache = HashMap<String, HashMap<String, Arc<LimitKeys>>>;

pub struct RedisLimits {
    redis: Arc<RedisHandle>,
    admit: redis::Script,
    settle: Arc<redis::Script>,
    /// Settlements go through one task that sends whatever has queued up as
    /// a single pipeline: under load many settles share one write and one
    /// read (the kernel's socket work is most of a round trip's CPU). Each
    /// settle still costs at most one round trip. Started on first use,
    /// inside the server's runtime.
    settle_queue: OnceLock<mpsc::UnboundedSender<SettleJob>>,
    keys: RwLock<KeyCache>,
}

enum SettleJob {
    /// A settle script call, answered once its pipeline has been applied.
    Settle(redis::Cmd, oneshot::Sender<()>),
    /// Answered once everything queued before it has been sent.
    Flush(oneshot::Sender<()>),
}

impl RedisLimits {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self {
            redis,
            admit: redis::Script::new(include_str!("admit.lua")),
            settle: Arc::new(redis::Script::new(SETTLE_LUA)),
            settle_queue: OnceLock::new(),
            keys: RwLock::new(HashMap::new()),
        }
    }

    fn keys(&self, org: &str, model: &str) -> Arc<LimitKeys> {
        if let Ok(cache) = self.keys.read() {
            if let Some(keys) = cache.get(org).and_then(|models| models.get(model)) {
                return keys.clone();
            }
        }
        let keys = Arc::new(LimitKeys {
            req: self.window_key(org, model, "req"),
            tok: self.window_key(org, model, "tok"),
            toksum: self.window_key(org, model, "toksum"),
            inflight: self.window_key(org, model, "inflight"),
            spend: Self::spend_key(&self.redis, org),
        });
        if let Ok(mut cache) = self.keys.write() {
            if cache.len() >= MAX_CACHED_KEY_SETS {
                cache.clear();
            }
            cache
                .entry(org.to_owned())
                .or_default()
                .insert(model.to_owned(), keys.clone());
        }
        keys
    }

    fn queue(&self) -> &mpsc::UnboundedSender<SettleJob> {
        self.settle_queue.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(settle_sender(self.redis.clone(), self.settle.clone(), rx));
            tx
        })
    }

    fn window_key(&self, org: &str, model: &str, what: &str) -> String {
        self.redis.key("rl", org, &format!(":{model}:{what}"))
    }

    pub fn spend_key(redis: &RedisHandle, org: &str) -> String {
        redis.key("spend", org, "")
    }

    pub fn usage_key(redis: &RedisHandle, org: &str, day: &str) -> String {
        redis.key("usage", org, &format!(":{day}"))
    }
}

#[async_trait]
impl LimitStore for RedisLimits {
    async fn admit(&self, r: &AdmitRequest<'_>) -> anyhow::Result<Admission> {
        let keys = self.keys(r.org, r.model);
        let mut conn = self.redis.conn().await?;
        let (verdict, used_req, used_tok, reset_req, reset_tok, retry): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = self
            .admit
            .key(&keys.req)
            .key(&keys.tok)
            .key(&keys.toksum)
            .key(&keys.inflight)
            .key(&keys.spend)
            .arg(r.request_id)
            .arg(r.plan.rpm)
            .arg(r.plan.tpm)
            .arg(r.plan.max_concurrent)
            .arg(r.tokens)
            .arg(r.in_flight_ttl_ms)
            .arg(r.budget_nano.unwrap_or(-1))
            .arg(WINDOW_MS)
            .invoke_async(&mut conn)
            .await?;
        let verdict = match verdict {
            0 => Verdict::Admitted,
            1 => Verdict::Requests,
            2 => Verdict::Tokens,
            3 => Verdict::Concurrency,
            4 => Verdict::OverBudget,
            v => anyhow::bail!("admission script returned verdict {v}"),
        };
        let ms = |v: i64| v.max(0) as u64;
        Ok(Admission {
            verdict,
            used_requests: ms(used_req),
            used_tokens: ms(used_tok),
            reset_requests_ms: ms(reset_req),
            reset_tokens_ms: ms(reset_tok),
            retry_after_ms: ms(retry),
        })
    }

    async fn settle(&self, s: &Settlement<'_>) -> anyhow::Result<()> {
        let u = s.usage.unwrap_or_default();
        let keys = self.keys(s.org, s.model);
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.settle.get_hash())
            .arg(5)
            .arg(&keys.tok)
            .arg(&keys.toksum)
            .arg(&keys.inflight)
            .arg(&keys.spend)
            .arg(Self::usage_key(&self.redis, s.org, s.day))
            .arg(s.request_id)
            .arg(s.reserved_tokens)
            .arg(s.actual_tokens)
            .arg(WINDOW_MS)
            .arg(format!("{}|{}|", s.key_id, s.model))
            .arg(u64::from(s.usage.is_some()))
            .arg(u.input)
            .arg(u.cached_input)
            .arg(u.output)
            .arg(u.reasoning)
            .arg(s.cost_nano)
            .arg(USAGE_TTL_SECS);
        let (done, applied) = oneshot::channel();
        self.queue()
            .send(SettleJob::Settle(cmd, done))
            .map_err(|_| anyhow::anyhow!("the settle sender has stopped"))?;
        // Waiting keeps "settled before the reply is sent": a client's next
        // request sees its slot and tokens back.
        applied
            .await
            .map_err(|_| anyhow::anyhow!("the settle sender has stopped"))
    }

    async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.queue().send(SettleJob::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Sends queued settlements, batching whatever is waiting into one pipeline.
async fn settle_sender(
    redis: Arc<RedisHandle>,
    script: Arc<redis::Script>,
    mut rx: mpsc::UnboundedReceiver<SettleJob>,
) {
    let mut jobs = Vec::with_capacity(MAX_SETTLE_BATCH);
    while rx.recv_many(&mut jobs, MAX_SETTLE_BATCH).await > 0 {
        let mut pipe = redis::pipe();
        let mut waiting = Vec::new();
        for job in jobs.drain(..) {
            match job {
                SettleJob::Settle(cmd, done) => {
                    pipe.add_command(cmd).ignore();
                    waiting.push(done);
                }
                SettleJob::Flush(done) => waiting.push(done),
            }
        }
        if !pipe.is_empty() {
            if let Err(e) = send_settles(&redis, &script, &pipe).await {
                // The in-flight deadlines and window expiry bound the damage.
                tracing::warn!("settling {} requests failed: {e}", pipe.len());
            }
        }
        for done in waiting {
            let _ = done.send(());
        }
    }
}

async fn send_settles(
    redis: &RedisHandle,
    _script: &redis::Script,
    pipe: &redis::Pipeline,
) -> redis::RedisResult<()> {
    let mut conn = redis.conn().await?;
    match pipe.query_async::<()>(&mut conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            // Redis restarted or flushed its scripts: load and resend.
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(SETTLE_LUA)
                .query_async(&mut conn)
                .await?;
            pipe.query_async::<()>(&mut conn).await
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::store::tests::{cleanup, test_redis};
    use crate::limits::memory::MemoryLimits;
    use crate::limits::tests_shared;

    #[tokio::test]
    async fn redis_store_passes_the_shared_suite() {
        let redis = test_redis();
        let store = RedisLimits::new(redis.clone());
        tests_shared::suite(&store).await;
        store.flush().await;
        // Usage and spend landed in the org's keys.
        let mut conn = redis.conn().await.unwrap();
        let usage: std::collections::HashMap<String, i64> = redis::AsyncCommands::hgetall(
            &mut conn,
            RedisLimits::usage_key(&redis, "org-suite", "2026-11-23"),
        )
        .await
        .unwrap();
        assert_eq!(usage.get("k1|base|requests"), Some(&1));
        assert_eq!(usage.get("k1|base|input"), Some(&100));
        assert_eq!(usage.get("k1|base|cost_nano"), Some(&777));
        cleanup(&redis).await;
    }

    #[test]
    fn key_sets_are_formatted_once_per_org_and_model() {
        let redis = Arc::new(RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap());
        let store = RedisLimits::new(redis);
        let a = store.keys("org-a", "base");
        assert_eq!(a.req, "igw:rl:{org-a}:base:req");
        assert_eq!(a.inflight, "igw:rl:{org-a}:base:inflight");
        assert_eq!(a.spend, "igw:spend:{org-a}");
        assert!(Arc::ptr_eq(&a, &store.keys("org-a", "base")));
        assert_eq!(
            store.keys("org-a", "base-mini").tok,
            "igw:rl:{org-a}:base-mini:tok"
        );
        assert_eq!(
            store.keys("org-b", "base").toksum,
            "igw:rl:{org-b}:base:toksum"
        );
    }

    #[tokio::test]
    async fn memory_store_passes_the_shared_suite() {
        tests_shared::suite(&MemoryLimits::default()).await;
    }
}
