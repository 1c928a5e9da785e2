//! Where paused plans wait for their tool results: under the organisation
//! and the session id (hashed together, so another organisation using the
//! same session id finds nothing), with an expiry. A per-session lock
//! makes a second request on a busy session a 409 rather than a second
//! run over the same plan.
//!
//! Two implementations, like the Responses store: Redis (every replica
//! sees the plan, so any replica resumes it, also after a restart) and
//! in-process (the embedded mode).

use crate::redis::RedisHandle;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The store key of an organisation's session.
pub fn session_key(org: &str, session: &str) -> String {
    crate::auth::org_scoped_digest(org, session)
}

/// Why a request could not take or use its session.
#[derive(Debug)]
pub enum SessionError {
    /// Redis failed or could not be reached.
    Redis(redis::RedisError),
    /// The in-process store's mutex was poisoned by a panic.
    Poisoned,
    /// Another request holds the session's lock, for at most this long
    /// unless its holder renews it.
    Busy { retry_after: Duration },
    /// The trailing `tool` message at `index` answers no pending call of
    /// the session's paused plan.
    NotPending { index: usize, call_id: String },
    /// The paused plan went away while its results were being checked
    /// (not reached: a result answers a pending call of a stored plan).
    Vanished,
    /// A paused plan's state could not be encoded for the store.
    Encode(serde_json::Error),
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionError::Redis(e) => write!(f, "redis: {e}"),
            SessionError::Poisoned => f.write_str("the in-process session store is poisoned"),
            SessionError::Busy { .. } => f.write_str("the session is busy"),
            SessionError::NotPending { index, call_id } => write!(
                f,
                "messages.{index}: no pending tool call with id '{call_id}'"
            ),
            SessionError::Vanished => f.write_str("the paused plan disappeared"),
            SessionError::Encode(e) => write!(f, "plan state: {e}"),
        }
    }
}

impl std::error::Error for SessionError {}

impl From<redis::RedisError> for SessionError {
    fn from(e: redis::RedisError) -> Self {
        SessionError::Redis(e)
    }
}

/// A session store's answer.
pub type SessionResult<T> = Result<T, SessionError>;

#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Takes the session's lock for `ttl` unless someone holds it.
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool>;
    /// Drops the lock if `token` still holds it.
    async fn unlock(&self, key: &str, token: &str) -> SessionResult<()>;
    /// Extends the lock to `ttl` from now if `token` still holds it.
    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool>;
    /// How long the lock is held for yet (`None`: free).
    async fn lock_left(&self, key: &str) -> SessionResult<Option<Duration>>;
    /// The paused plan's state (JSON), if any.
    async fn load(&self, key: &str) -> SessionResult<Option<String>>;
    async fn save(&self, key: &str, state: &str, ttl: Duration) -> SessionResult<()>;
    async fn clear(&self, key: &str) -> SessionResult<()>;
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
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool> {
        let mut conn = self.redis.conn().await?;
        let set: Option<String> = redis::cmd("SET")
            .arg(self.lock_key(key))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        Ok(set.is_some())
    }

    async fn unlock(&self, key: &str, token: &str) -> SessionResult<()> {
        let mut conn = self.redis.conn().await?;
        let _: i64 = redis::Script::new(UNLOCK)
            .key(self.lock_key(key))
            .arg(token)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool> {
        let mut conn = self.redis.conn().await?;
        let renewed: i64 = redis::Script::new(RENEW)
            .key(self.lock_key(key))
            .arg(token)
            .arg(ttl.as_millis().max(1) as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok(renewed == 1)
    }

    async fn lock_left(&self, key: &str) -> SessionResult<Option<Duration>> {
        let mut conn = self.redis.conn().await?;
        let left: i64 = redis::cmd("PTTL")
            .arg(self.lock_key(key))
            .query_async(&mut conn)
            .await?;
        // -2: no key; -1: no expiry (not written by this code).
        Ok(u64::try_from(left).ok().map(Duration::from_millis))
    }

    async fn load(&self, key: &str) -> SessionResult<Option<String>> {
        let mut conn = self.redis.conn().await?;
        Ok(redis::AsyncCommands::get(&mut conn, self.state_key(key)).await?)
    }

    async fn save(&self, key: &str, state: &str, ttl: Duration) -> SessionResult<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = redis::AsyncCommands::set_ex(
            &mut conn,
            self.state_key(key),
            state,
            ttl.as_secs().max(1),
        )
        .await?;
        Ok(())
    }

    async fn clear(&self, key: &str) -> SessionResult<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = redis::AsyncCommands::del(&mut conn, self.state_key(key)).await?;
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
    async fn lock(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner.sweep(now);
        if inner.locks.contains_key(key) {
            return Ok(false);
        }
        inner
            .locks
            .insert(key.to_owned(), (token.to_owned(), now + ttl));
        Ok(true)
    }

    async fn unlock(&self, key: &str, token: &str) -> SessionResult<()> {
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        if inner.locks.get(key).is_some_and(|(t, _)| t == token) {
            inner.locks.remove(key);
        }
        Ok(())
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> SessionResult<bool> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner.sweep(now);
        match inner.locks.get_mut(key) {
            Some((held_by, until)) if held_by == token => {
                *until = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn lock_left(&self, key: &str) -> SessionResult<Option<Duration>> {
        let now = Instant::now();
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner.sweep(now);
        Ok(inner
            .locks
            .get(key)
            .map(|(_, until)| until.saturating_duration_since(now)))
    }

    async fn load(&self, key: &str) -> SessionResult<Option<String>> {
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner.sweep(Instant::now());
        Ok(inner.states.get(key).map(|(s, _)| s.clone()))
    }

    async fn save(&self, key: &str, state: &str, ttl: Duration) -> SessionResult<()> {
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner
            .states
            .insert(key.to_owned(), (state.to_owned(), Instant::now() + ttl));
        Ok(())
    }

    async fn clear(&self, key: &str) -> SessionResult<()> {
        let mut inner = self.inner.lock().map_err(|_| SessionError::Poisoned)?;
        inner.states.remove(key);
        Ok(())
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
