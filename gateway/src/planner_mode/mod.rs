//! The gateway's side of planner mode (the `planner` crate): the planner
//! built over the gateway's stores and TLS roots, and its ports — model
//! calls over the one generation driver (`calls`), paused plans and
//! directory entries in Redis or in this process (`sessions`). The wire
//! format is `translate::planner`; the route is `routes/planner.rs`.

pub mod calls;
pub mod sessions;

use crate::redis::RedisHandle;
use planner::ports::{DirectoryStore, SessionStore};
use planner::{Planner, PlannerConfig};
use std::sync::Arc;

/// The process's planner: sessions and stored directory entries in Redis
/// when there is one (any replica resumes a plan), else in memory.
pub fn build(config: &PlannerConfig, redis: Option<Arc<RedisHandle>>) -> anyhow::Result<Planner> {
    let roots = crate::tls::native_roots().unwrap_or_else(|_| rustls::RootCertStore::empty());
    let tls = crate::tls::client_config(roots)?;
    let (sessions, stored_agents): (Arc<dyn SessionStore>, Option<Arc<dyn DirectoryStore>>) =
        match redis {
            Some(r) => (
                Arc::new(sessions::RedisSessions::new(r.clone())),
                Some(Arc::new(sessions::RedisDirectory::new(r))),
            ),
            None => (Arc::new(sessions::MemorySessions::default()), None),
        };
    Planner::new(config, tls, sessions, stored_agents)
}
