//! The Redis transport, below every domain that keeps data in Redis (the
//! Responses store, limits, accounts, planner sessions, usage):
//!
//! - [`conn`]: the process's [`RedisHandle`]: URL and TLS checks, the
//!   shared auto-reconnecting connection ([`RedisConn`], one server or the
//!   redis crate's cluster client), dedicated connections for blocking
//!   reads and pub/sub, and [`RedisHandle::key`] (prefix and hash tag);
//! - [`cluster`]: Redis Cluster slots, the slot map and its follower
//!   ([`cluster::Topology`]: refreshes after redirects, failovers and
//!   periodically) for the connections the cluster client does not make;
//! - [`pipe`]: a lean pipelined connection for scripts on the hot path;
//! - [`cluster_pipe`]: one such pipe per primary of a cluster, routing each
//!   command by its key's slot and following redirects.
//!
//! Nothing here knows a domain's keys or scripts: each domain keeps its own
//! key layout (built with [`RedisHandle::key`]) and Lua scripts.

pub mod cluster;
pub mod cluster_pipe;
pub mod conn;
pub mod pipe;

pub use conn::{RedisConn, RedisHandle, Target, CONNECT_TIMEOUT, RESPONSE_TIMEOUT};

/// A test Redis for unit tests of every domain.
#[cfg(test)]
pub(crate) mod testing {
    use super::RedisHandle;
    use rand::distr::{Alphanumeric, SampleString};
    use std::sync::Arc;

    /// A handle on the test Redis (`TEST_REDIS_URL`, default the local
    /// one) under a random prefix; [`cleanup`] deletes exactly its keys.
    pub(crate) fn test_redis() -> Arc<RedisHandle> {
        let url =
            std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
        let prefix = format!(
            "igwtest:{}:",
            Alphanumeric.sample_string(&mut rand::rng(), 10)
        );
        Arc::new(RedisHandle::new(&url, &prefix).unwrap())
    }

    /// Deletes every key under `handle`'s prefix.
    pub(crate) async fn cleanup(handle: &RedisHandle) {
        delete_prefix(handle).await.unwrap();
    }

    /// Deletes every key under `handle`'s prefix with SCAN, so it stays
    /// quick on a server that holds many keys of other tests (KEYS would
    /// walk them all in one command and time out).
    pub(crate) async fn delete_prefix(handle: &RedisHandle) -> redis::RedisResult<()> {
        let mut conn = handle.conn().await?;
        let pattern = format!("{}*", handle.prefix());
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            if !keys.is_empty() {
                redis::cmd("DEL")
                    .arg(keys)
                    .query_async::<()>(&mut conn)
                    .await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}
