//! The planner's stores (its [`ports`](planner::ports)): where paused
//! plans wait for their tool results, under the organisation and the
//! session id hashed together (so another organisation using the same
//! session id finds nothing), with an expiry and a per-session lock; and
//! the directory entries `gateway agents` keeps.
//!
//! Two implementations of the sessions, like the Responses store: Redis
//! (every replica sees the plan, so any replica resumes it, also after a
//! restart) and in-process (the embedded mode).

use crate::redis::RedisHandle;
use async_trait::async_trait;
use planner::agents::AgentEntry;
use planner::ports::{DirectoryStore, SessionStore, StoreResult, StoreUnavailable};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The store key of an organisation's session.
pub fn session_key(org: &str, session: &str) -> String {
    crate::auth::org_scoped_digest(org, session)
}

fn unavailable(e: redis::RedisError) -> StoreUnavailable {
    StoreUnavailable(Box::new(e))
}

/// A panic while the in-process store was held: its maps may be half
/// written, so it answers as a store that is away.
fn poisoned<T>(_: T) -> StoreUnavailable {
    StoreUnavailable("the in-process session store is poisoned".into())
}

/// Sessions in Redis: `<prefix>plan:{<key>}` and its `:lock`, one slot.
pub struct RedisSessions {
    redis: Arc<RedisHandle>,
}

impl RedisSessions {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self { redis }
    }

    fn state_key(&self, key: &str) -> String {
        self.redis.key("plan", key, "")
    }

    fn lock_key(&self, key: &str) -> String {
        self.redis.key("plan", key, ":lock")
    }
}

/// Deletes the lock only if the caller still holds it.
const UNLOCK: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Extends the lock only if the caller still holds it.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

#[async_trait]
impl SessionStore for RedisSessions {
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let set: Option<String> = redis::cmd("SET")
            .arg(self.lock_key(key))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(set.is_some())
    }

    async fn unlock(&self, key: &str, token: &str) -> StoreResult<()> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let _: i64 = redis::Script::new(UNLOCK)
            .key(self.lock_key(key))
            .arg(token)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let renewed: i64 = redis::Script::new(RENEW)
            .key(self.lock_key(key))
            .arg(token)
            .arg(ttl.as_millis().max(1) as u64)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(renewed == 1)
    }

    async fn lock_left(&self, key: &str) -> StoreResult<Option<Duration>> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let left: i64 = redis::cmd("PTTL")
            .arg(self.lock_key(key))
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        // -2: no key; -1: no expiry (not written by this code).
        Ok(u64::try_from(left).ok().map(Duration::from_millis))
    }

    async fn load(&self, key: &str) -> StoreResult<Option<String>> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        redis::AsyncCommands::get(&mut conn, self.state_key(key))
            .await
            .map_err(unavailable)
    }

    async fn save(&self, key: &str, state: &str, ttl: Duration) -> StoreResult<()> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let _: () = redis::AsyncCommands::set_ex(
            &mut conn,
            self.state_key(key),
            state,
            ttl.as_secs().max(1),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn clear(&self, key: &str) -> StoreResult<()> {
        let mut conn = self.redis.conn().await.map_err(unavailable)?;
        let _: () = redis::AsyncCommands::del(&mut conn, self.state_key(key))
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

/// Sessions in this process (embedded mode).
#[derive(Default)]
pub struct MemorySessions {
    inner: Mutex<MemoryInner>,
}

#[derive(Default)]
struct MemoryInner {
    states: HashMap<String, (String, Instant)>,
    locks: HashMap<String, (String, Instant)>,
}

impl MemoryInner {
    fn sweep(&mut self, now: Instant) {
        self.states.retain(|_, (_, until)| *until > now);
        self.locks.retain(|_, (_, until)| *until > now);
    }
}

#[async_trait]
impl SessionStore for MemorySessions {
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner.sweep(now);
        if inner.locks.contains_key(key) {
            return Ok(false);
        }
        inner
            .locks
            .insert(key.to_owned(), (token.to_owned(), now + ttl));
        Ok(true)
    }

    async fn unlock(&self, key: &str, token: &str) -> StoreResult<()> {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        if inner.locks.get(key).is_some_and(|(t, _)| t == token) {
            inner.locks.remove(key);
        }
        Ok(())
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> StoreResult<bool> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner.sweep(now);
        match inner.locks.get_mut(key) {
            Some((held_by, until)) if held_by == token => {
                *until = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn lock_left(&self, key: &str) -> StoreResult<Option<Duration>> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner.sweep(now);
        Ok(inner
            .locks
            .get(key)
            .map(|(_, until)| until.saturating_duration_since(now)))
    }

    async fn load(&self, key: &str) -> StoreResult<Option<String>> {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner.sweep(Instant::now());
        Ok(inner.states.get(key).map(|(s, _)| s.clone()))
    }

    async fn save(&self, key: &str, state: &str, ttl: Duration) -> StoreResult<()> {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner
            .states
            .insert(key.to_owned(), (state.to_owned(), Instant::now() + ttl));
        Ok(())
    }

    async fn clear(&self, key: &str) -> StoreResult<()> {
        let mut inner = self.inner.lock().map_err(poisoned)?;
        inner.states.remove(key);
        Ok(())
    }
}

/// Directory entries in Redis: one hash, `<prefix>agents:{directory}`.
pub struct RedisDirectory {
    redis: Arc<RedisHandle>,
}

impl RedisDirectory {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self { redis }
    }

    fn key(&self) -> String {
        self.redis.key("agents", "directory", "")
    }

    /// Every entry (one that does not parse is skipped).
    pub async fn list(&self) -> anyhow::Result<Vec<AgentEntry>> {
        Ok(self
            .values()
            .await?
            .iter()
            .filter_map(|v| serde_json::from_str(v).ok())
            .collect())
    }

    /// Every entry's stored JSON.
    async fn values(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.redis.conn().await?;
        let all: BTreeMap<String, String> =
            redis::AsyncCommands::hgetall(&mut conn, self.key()).await?;
        Ok(all.into_values().collect())
    }

    pub async fn put(&self, entry: &AgentEntry) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = redis::AsyncCommands::hset(
            &mut conn,
            self.key(),
            &entry.id,
            serde_json::to_string(entry)?,
        )
        .await?;
        Ok(())
    }

    pub async fn remove(&self, id: &str) -> anyhow::Result<bool> {
        let mut conn = self.redis.conn().await?;
        let n: i64 = redis::AsyncCommands::hdel(&mut conn, self.key(), id).await?;
        Ok(n > 0)
    }
}

#[async_trait]
impl DirectoryStore for RedisDirectory {
    async fn list(&self) -> StoreResult<Vec<String>> {
        self.values().await.map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn suite(store: &dyn SessionStore, tag: &str) {
        let key = session_key("org-a", &format!("s-{tag}"));
        let other = session_key("org-b", &format!("s-{tag}"));
        assert_ne!(key, other, "another org's session is another key");
        assert!(store
            .lock(&key, "t1", Duration::from_secs(5))
            .await
            .unwrap());
        assert!(!store
            .lock(&key, "t2", Duration::from_secs(5))
            .await
            .unwrap());
        // Only the holder unlocks.
        store.unlock(&key, "t2").await.unwrap();
        assert!(!store
            .lock(&key, "t3", Duration::from_secs(5))
            .await
            .unwrap());
        // Only the holder renews; the lease says how long it is held.
        assert!(!store
            .renew(&key, "t2", Duration::from_secs(60))
            .await
            .unwrap());
        assert!(store
            .renew(&key, "t1", Duration::from_secs(60))
            .await
            .unwrap());
        let left = store.lock_left(&key).await.unwrap().expect("held");
        assert!(left > Duration::from_secs(50), "{left:?}");
        store.unlock(&key, "t1").await.unwrap();
        assert_eq!(store.lock_left(&key).await.unwrap(), None);
        assert!(store
            .lock(&key, "t3", Duration::from_millis(50))
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert!(
            store
                .lock(&key, "t4", Duration::from_secs(5))
                .await
                .unwrap(),
            "an expired lock is free"
        );
        store.unlock(&key, "t4").await.unwrap();

        assert_eq!(store.load(&key).await.unwrap(), None);
        store
            .save(&key, "{\"x\":1}", Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            store.load(&key).await.unwrap().as_deref(),
            Some("{\"x\":1}")
        );
        assert_eq!(store.load(&other).await.unwrap(), None);
        store.clear(&key).await.unwrap();
        assert_eq!(store.load(&key).await.unwrap(), None);
    }

    #[tokio::test]
    async fn memory_sessions_pass_the_suite() {
        suite(&MemorySessions::default(), "mem").await;
    }

    #[tokio::test]
    async fn redis_sessions_pass_the_suite() {
        let url =
            std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
        let prefix = format!("igw-test-planner-{}:", crate::ids::new_id(""));
        let handle = Arc::new(RedisHandle::new(&url, &prefix).unwrap());
        if handle.conn().await.is_err() {
            eprintln!("no Redis at {url}; skipping");
            return;
        }
        suite(&RedisSessions::new(handle.clone()), "redis").await;
        crate::redis::testing::delete_prefix(&handle).await.unwrap();
    }
}
