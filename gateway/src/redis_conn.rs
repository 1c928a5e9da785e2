//! The shared Redis connection: one multiplexed, auto-reconnecting
//! connection per process, created on first use inside the server's runtime,
//! with bounded timeouts so a dead Redis gives a fast, defined failure
//! (the redis crate otherwise retries for about 6 s).
//!
//! `rediss://` connects over TLS (rustls): the server certificate is
//! checked against `store.redis_ca_file` when given, else the system's
//! roots. `#insecure` (no certificate check) is refused: an attacker on the
//! path to Redis would hold every key, plan and stored response.
//!
//! Every key goes through [`RedisHandle::key`]: the configured prefix plus a
//! `{hash tag}` so that all keys of one entity land in one Redis Cluster slot.

use anyhow::{bail, Context};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::IntoConnectionInfo;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// How long one command may take before it counts as a Redis failure.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

pub struct RedisHandle {
    client: redis::Client,
    prefix: String,
    manager: OnceCell<ConnectionManager>,
    /// For connections of our own (the limiter's pipe) to a `rediss://` URL.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl RedisHandle {
    pub fn new(url: &str, prefix: &str) -> anyhow::Result<Self> {
        Self::with_ca(url, prefix, None)
    }

    /// A handle whose TLS connections trust the CA in `ca_file` (PEM).
    pub fn with_ca(url: &str, prefix: &str, ca_file: Option<&Path>) -> anyhow::Result<Self> {
        let info = url
            .into_connection_info()
            .context("store.redis_url is not a Redis URL")?;
        let ca_pem = ca_file
            .map(|f| {
                std::fs::read(f).with_context(|| format!("store.redis_ca_file {}", f.display()))
            })
            .transpose()?;
        let (client, tls) = match info.addr() {
            redis::ConnectionAddr::TcpTls { insecure: true, .. } => bail!(
                "store.redis_url: rediss://...#insecure would skip the certificate check; \
                 give the server's CA with store.redis_ca_file instead"
            ),
            redis::ConnectionAddr::TcpTls { .. } => {
                let roots = match &ca_pem {
                    Some(pem) => crate::tls::roots_from_pem(pem, "store.redis_ca_file")?,
                    None => crate::tls::native_roots()?,
                };
                let client = match ca_pem {
                    Some(pem) => redis::Client::build_with_tls(
                        info,
                        redis::TlsCertificates {
                            client_tls: None,
                            root_cert: Some(pem),
                        },
                    )?,
                    None => redis::Client::open(info)?,
                };
                (client, Some(Arc::new(crate::tls::client_config(roots)?)))
            }
            _ if ca_pem.is_some() => {
                bail!("store.redis_ca_file is set, but store.redis_url is not rediss://")
            }
            _ => (redis::Client::open(info)?, None),
        };
        Ok(Self {
            client,
            prefix: prefix.to_owned(),
            manager: OnceCell::new(),
            tls,
        })
    }

    /// The TLS configuration of `rediss://` connections (`None` for plain
    /// TCP and Unix sockets).
    pub fn tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.clone()
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

/// Test support: deletes every key under `handle`'s prefix with SCAN, so
/// it stays quick on a server that holds many keys of other tests (KEYS
/// would walk them all in one command and time out).
#[cfg(test)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_urls_check_the_server_certificate() {
        let ca = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/pool/testdata/cluster-ca.pem"
        ));
        let h = RedisHandle::with_ca("rediss://127.0.0.1:6380/", "igw:", Some(ca)).unwrap();
        assert!(h.tls().is_some());
        let e = RedisHandle::with_ca("rediss://127.0.0.1:6380/#insecure", "igw:", Some(ca))
            .err()
            .unwrap();
        assert!(e.to_string().contains("redis_ca_file"), "{e}");
        let e = RedisHandle::with_ca("redis://127.0.0.1:6379/", "igw:", Some(ca))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not rediss://"), "{e}");
        assert!(RedisHandle::new("redis://127.0.0.1:6379/", "igw:")
            .unwrap()
            .tls()
            .is_none());
    }

    #[test]
    fn keys_carry_prefix_and_hash_tag() {
        let h = RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap();
        assert_eq!(
            h.key("resp", "resp_1", ":events"),
            "igw:resp:{resp_1}:events"
        );
    }
}
