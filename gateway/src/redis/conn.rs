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
//! With `store.redis_cluster = true` the URL names one or more seed nodes
//! of a Redis Cluster (comma-separated) and the shared connection is the
//! redis crate's cluster client (`cluster-async`: it routes each command to
//! the primary serving its key's slot, follows `MOVED`/`ASK` and
//! reconnects). [`RedisConn`] wraps both kinds, so the store, accounts and
//! the operator CLI run their commands the same way on either. Connections
//! of our own (the pipes of [`super::pipe`], blocking reads, pub/sub) find their
//! node through [`super::cluster::Topology`], whose slot map is
//! fetched again after a redirect, after a node fails to answer (a
//! failover) and periodically ([`RedisHandle::refresh_after`]).
//!
//! Every key goes through [`RedisHandle::key`]: the configured prefix plus a
//! `{hash tag}` so that all keys of one entity land in one Redis Cluster slot.

use super::cluster::Topology;
use anyhow::{bail, Context};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;

/// How long one command may take before it counts as a Redis failure.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

pub struct RedisHandle {
    backend: Backend,
    prefix: String,
    /// For connections of our own (the limiter's pipe) to a `rediss://` URL.
    tls: Option<Arc<rustls::ClientConfig>>,
}

enum Backend {
    /// One server (or a proxy in front of many).
    Single {
        client: Box<redis::Client>,
        manager: OnceCell<ConnectionManager>,
    },
    /// A Redis Cluster: the redis crate's cluster client routes each
    /// command by its key's slot, follows `MOVED`/`ASK` and reconnects;
    /// `topology` serves the connections it does not make.
    Cluster {
        client: Box<ClusterClient>,
        conn: OnceCell<ClusterConnection>,
        topology: Arc<Topology>,
    },
}

/// The shared connection, of either kind. Commands, pipelines and scripts
/// run on it the same way (`query_async(&mut conn)`); on a cluster a
/// pipeline must keep to one slot (a `MULTI` always does).
#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

impl RedisHandle {
    /// A handle on one server (tests and tools).
    pub fn new(url: &str, prefix: &str) -> anyhow::Result<Self> {
        Self::open(url, prefix, None, false)
    }

    /// A handle on `url` (with `cluster`: one or more seed nodes of a Redis
    /// Cluster, separated by commas), whose TLS connections trust the CA
    /// in `ca_file` (PEM). Nothing connects until first use.
    pub fn open(
        url: &str,
        prefix: &str,
        ca_file: Option<&Path>,
        cluster: bool,
    ) -> anyhow::Result<Self> {
        let urls: Vec<&str> = url
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            bail!("store.redis_url is empty");
        }
        if urls.len() > 1 && !cluster {
            bail!(
                "store.redis_url lists {} URLs: several seed nodes need store.redis_cluster = true",
                urls.len()
            );
        }
        let infos = urls
            .iter()
            .map(|u| {
                u.into_connection_info()
                    .context("store.redis_url is not a Redis URL")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ca_pem = ca_file
            .map(|f| {
                std::fs::read(f).with_context(|| format!("store.redis_ca_file {}", f.display()))
            })
            .transpose()?;
        let mut tls_urls = 0;
        for info in &infos {
            match info.addr() {
                redis::ConnectionAddr::TcpTls { insecure: true, .. } => bail!(
                    "store.redis_url: rediss://...#insecure would skip the certificate check; \
                     give the server's CA with store.redis_ca_file instead"
                ),
                redis::ConnectionAddr::TcpTls { .. } => tls_urls += 1,
                redis::ConnectionAddr::Unix(_) if cluster => {
                    bail!("store.redis_cluster: cluster nodes are reached over TCP, not a socket")
                }
                _ => {}
            }
        }
        if tls_urls != 0 && tls_urls != infos.len() {
            bail!("store.redis_url: either every seed node is rediss:// or none is");
        }
        if ca_pem.is_some() && tls_urls == 0 {
            bail!("store.redis_ca_file is set, but store.redis_url is not rediss://");
        }
        let tls = if tls_urls > 0 {
            let roots = match &ca_pem {
                Some(pem) => crate::tls::roots_from_pem(pem, "store.redis_ca_file")?,
                None => crate::tls::native_roots()?,
            };
            Some(Arc::new(crate::tls::client_config(roots)?))
        } else {
            None
        };
        let backend = if cluster {
            if infos.iter().any(|i| i.redis_settings().db() != 0) {
                bail!("store.redis_url: a Redis Cluster has database 0 only");
            }
            let mut builder = ClusterClient::builder(infos.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(3)
                .min_retry_wait(10)
                .max_retry_wait(100);
            if let Some(pem) = &ca_pem {
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                });
            }
            let client = builder
                .build()
                .context("store.redis_url: the Redis Cluster seed nodes")?;
            Backend::Cluster {
                client: Box::new(client),
                conn: OnceCell::new(),
                topology: Arc::new(Topology::new(
                    infos,
                    ca_pem,
                    CONNECT_TIMEOUT,
                    RESPONSE_TIMEOUT,
                )),
            }
        } else {
            let info = infos.into_iter().next().context("store.redis_url")?;
            let client = match (ca_pem, tls.is_some()) {
                (Some(pem), true) => redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem),
                    },
                )?,
                _ => redis::Client::open(info)?,
            };
            Backend::Single {
                client: Box::new(client),
                manager: OnceCell::new(),
            }
        };
        Ok(Self {
            backend,
            prefix: prefix.to_owned(),
            tls,
        })
    }

    /// The TLS configuration of `rediss://` connections (`None` for plain
    /// TCP and Unix sockets).
    pub fn tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }

    /// A cheap clone of the shared connection (connecting on first use).
    pub async fn conn(&self) -> redis::RedisResult<RedisConn> {
        match &self.backend {
            Backend::Single { client, manager } => {
                let manager = manager
                    .get_or_try_init(|| async {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(CONNECT_TIMEOUT))
                            .set_response_timeout(Some(RESPONSE_TIMEOUT))
                            .set_number_of_retries(1)
                            .set_max_delay(Duration::from_millis(200));
                        ConnectionManager::new_with_config(client.as_ref().clone(), config).await
                    })
                    .await?;
                Ok(RedisConn::Single(manager.clone()))
            }
            Backend::Cluster { client, conn, .. } => {
                let conn = conn
                    .get_or_try_init(|| async {
                        tokio::time::timeout(CONNECT_TIMEOUT * 4, client.get_async_connection())
                            .await
                            .map_err(|_| {
                                redis::RedisError::from((
                                    redis::ErrorKind::Io,
                                    "Redis Cluster connect timed out",
                                ))
                            })?
                    })
                    .await?;
                Ok(RedisConn::Cluster(conn.clone()))
            }
        }
    }

    /// Where the connections of our own go: one server, or a cluster.
    pub fn target(&self) -> Target<'_> {
        match &self.backend {
            Backend::Single { client, .. } => Target::Single(client.get_connection_info()),
            Backend::Cluster { topology, .. } => Target::Cluster(topology),
        }
    }

    /// A connection of its own to the server holding `key`, for blocking
    /// reads such as `XREAD BLOCK` (which would stall the shared one):
    /// replies may take up to `response_timeout`.
    pub async fn dedicated(
        &self,
        key: &str,
        response_timeout: Duration,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        match &self.backend {
            Backend::Single { client, .. } => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(response_timeout));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
            }
            Backend::Cluster { topology, .. } => topology.dedicated(key, response_timeout).await,
        }
    }

    /// After `error` on a dedicated connection for `key` (or on making
    /// one): on a cluster, fetches the slot map again when the error says
    /// it may be stale: a redirect, or a node that refused, dropped or did
    /// not answer (a failed primary sends no redirect, and its replica may
    /// have its slots now). Whether one more try is worth it; never on one
    /// server.
    pub async fn refresh_after(&self, key: &str, error: &redis::RedisError) -> bool {
        match &self.backend {
            Backend::Cluster { topology, .. } => topology.refresh_after(key, error).await,
            Backend::Single { .. } => false,
        }
    }

    /// A pub/sub connection (on a cluster, to any node: messages published
    /// on one reach the subscribers of all).
    pub async fn pubsub(&self) -> redis::RedisResult<redis::aio::PubSub> {
        match &self.backend {
            Backend::Single { client, .. } => {
                tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                    .await
                    .map_err(|_| {
                        redis::RedisError::from((redis::ErrorKind::Io, "pub/sub connect timed out"))
                    })?
            }
            Backend::Cluster { topology, .. } => topology.pubsub().await,
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster { .. })
    }

    /// `<prefix><kind>:{<id>}<suffix>`: the id is the hash tag, so an
    /// entity's keys (object, items, events) share one cluster slot.
    ///
    /// An id that would make an empty tag (`""`, or one starting with `}`)
    /// gets a `~` before it: Redis hashes the whole key when the tag is
    /// empty, which would put one entity's keys in different slots.
    pub fn key(&self, kind: &str, id: &str, suffix: &str) -> String {
        let marker = if id.is_empty() || id.starts_with('}') {
            "~"
        } else {
            ""
        };
        format!("{}{kind}:{{{marker}{id}}}{suffix}", self.prefix)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

/// Where a connection of our own goes.
pub enum Target<'a> {
    Single(&'a redis::ConnectionInfo),
    Cluster(&'a Arc<Topology>),
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
        let h = RedisHandle::open("rediss://127.0.0.1:6380/", "igw:", Some(ca), false).unwrap();
        assert!(h.tls().is_some());
        let e = RedisHandle::open("rediss://127.0.0.1:6380/#insecure", "igw:", Some(ca), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("redis_ca_file"), "{e}");
        let e = RedisHandle::open("redis://127.0.0.1:6379/", "igw:", Some(ca), false)
            .err()
            .unwrap();
        assert!(e.to_string().contains("not rediss://"), "{e}");
        assert!(RedisHandle::new("redis://127.0.0.1:6379/", "igw:")
            .unwrap()
            .tls()
            .is_none());
    }

    #[test]
    fn cluster_urls_are_seed_lists_of_one_kind() {
        let two = "redis://127.0.0.1:7000, redis://127.0.0.1:7001/";
        let h = RedisHandle::open(two, "igw:", None, true).unwrap();
        assert!(h.is_cluster() && h.tls().is_none());
        assert!(matches!(h.target(), Target::Cluster(_)));
        let e = RedisHandle::open(two, "igw:", None, false).err().unwrap();
        assert!(e.to_string().contains("redis_cluster = true"), "{e}");
        let mixed = "redis://127.0.0.1:7000,rediss://127.0.0.1:7001";
        let e = RedisHandle::open(mixed, "igw:", None, true).err().unwrap();
        assert!(e.to_string().contains("every seed node"), "{e}");
        let e = RedisHandle::open("redis://127.0.0.1:7000/2", "igw:", None, true)
            .err()
            .unwrap();
        assert!(e.to_string().contains("database 0"), "{e}");
        let e = RedisHandle::open("rediss://h:1,rediss://h:2#insecure", "igw:", None, true)
            .err()
            .unwrap();
        assert!(e.to_string().contains("insecure"), "{e}");
        assert!(!RedisHandle::new("redis://127.0.0.1:6379", "igw:")
            .unwrap()
            .is_cluster());
    }

    #[test]
    fn keys_carry_prefix_and_hash_tag() {
        let h = RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap();
        assert_eq!(
            h.key("resp", "resp_1", ":events"),
            "igw:resp:{resp_1}:events"
        );
        assert_eq!(h.key("spend", "", ""), "igw:spend:{~}");
        assert_eq!(h.key("rl", "}x", ":m"), "igw:rl:{~}x}:m");
    }
}
