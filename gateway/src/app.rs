//! The gateway's shared state: configuration, keys, worker pools. One
//! instance per process, shared by every request.

use crate::auth::Authenticator;
use crate::config::Config;
use crate::pool::{PoolSpec, Pools};
use std::sync::Arc;
use std::time::Duration;

pub struct App {
    pub config: Config,
    pub auth: Authenticator,
    pub pools: Arc<Pools>,
}

impl App {
    pub fn new(config: Config) -> anyhow::Result<Self> {
        let auth = Authenticator::from_config(&config.keys)?;
        let pools = Pools::new(config.models.iter().map(|(model, pool)| PoolSpec {
            model: model.clone(),
            workers: pool.workers.clone(),
            policy: pool.policy,
        }))?;
        Ok(Self {
            config,
            auth,
            pools: Arc::new(pools),
        })
    }

    pub fn read_timeout(&self) -> Duration {
        Duration::from_secs(self.config.read_timeout_seconds)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.config.request_timeout_seconds)
    }
}
