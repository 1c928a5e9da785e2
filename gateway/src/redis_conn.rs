//! The shared Redis connection: one multiplexed, auto-reconnecting
//! connection per process, created on first use inside the server's runtime,
//! with bounded timeouts so a dead Redis gives a fast, defined failure
//! (the redis crate otherwise retries for about 6 s).
//!
//! Every key goes through [`RedisHandle::key`]: the configured prefix plus a
//! `{hash tag}` so that all keys of one entity land in one Redis Cluster slot.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;
use tokio::sync::OnceCell;

/// How long one command may take before it counts as a Redis failure.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

pub struct RedisHandle {
    client: redis::Client,
    prefix: String,
    manager: OnceCell<ConnectionManager>,
}

impl RedisHandle {
    pub fn new(url: &str, prefix: &str) -> anyhow::Result<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
            prefix: prefix.to_owned(),
            manager: OnceCell::new(),
        })
    }

    /// A cheap clone of the shared connection (connecting on first use).
    pub async fn conn(&self) -> redis::RedisResult<ConnectionManager> {
        let manager = self
            .manager
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await?;
        Ok(manager.clone())
    }

    /// `<prefix><kind>:{<id>}<suffix>`: the id is the hash tag, so an
    /// entity's keys (object, items, events) share one cluster slot.
    pub fn key(&self, kind: &str, id: &str, suffix: &str) -> String {
        format!("{}{kind}:{{{id}}}{suffix}", self.prefix)
    }

    /// The client, for callers that need a dedicated connection (blocking
    /// reads such as `XREAD BLOCK` would stall the shared one).
    /// `<prefix>usage:{<org>}:<day>`: an organisation's usage of one UTC
    /// day (the limiter's settle script writes it; `usage` reads it).
    pub fn usage_key(&self, org: &str, day: &str) -> String {
        self.key("usage", org, ":") + day
    }

    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_prefix_and_hash_tag() {
        let h = RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap();
        assert_eq!(
            h.key("resp", "resp_1", ":events"),
            "igw:resp:{resp_1}:events"
        );
    }
}
