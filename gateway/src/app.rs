//! The gateway's shared state: configuration, keys, worker pools. One
//! instance per process, shared by every request.

use crate::accounts::cache::Accounts;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::idempotency::claims::Claims;
use crate::lifecycle::Shutdown;
use crate::limits::Limiter;
use crate::pool::{PoolSpec, Pools};
use crate::redis::RedisHandle;
use crate::runs::Runs;
use crate::store::ResponseStore;
use planner::Planner;
use std::sync::Arc;
use std::time::Duration;

pub struct App {
    pub config: Config,
    /// The models offered: the spec's three and the config's added ids.
    pub catalog: Catalog,
    /// Keys, organisations and plans (config keys, plus Redis when configured).
    pub accounts: Arc<Accounts>,
    /// Plan limits: the local stage plus Redis (or the in-process store).
    pub limiter: Arc<Limiter>,
    pub pools: Arc<Pools>,
    /// Stored responses and run event logs: Redis when `store.redis_url`
    /// is set, else in-process.
    pub store: Arc<dyn ResponseStore>,
    /// `Idempotency-Key` records of the generation creates: Redis when
    /// the store is, else in-process (like `store`); and the claims this
    /// replica renews (on the runs' heartbeat).
    pub idempotency: Arc<Claims>,
    /// Runs owned by this replica: leases, heartbeat, sweeper.
    pub runs: Arc<Runs>,
    /// The shutdown signal and the work in flight it waits for.
    pub shutdown: Arc<Shutdown>,
    /// Planner mode: the agent directory, the agents' client, sessions.
    pub planner: Arc<Planner>,
}

impl App {
    pub fn new(config: Config) -> anyhow::Result<Self> {
        let catalog = config.catalog()?;
        for model in catalog.models() {
            crate::metrics::register_model(model.id);
        }
        // Connects lazily, inside the server's runtime.
        let redis = match &config.store.redis_url {
            Some(url) => Some(Arc::new(RedisHandle::open(
                url,
                &config.store.key_prefix,
                config.store.redis_ca_file.as_deref(),
                config.store.redis_cluster,
            )?)),
            None => None,
        };
        // One handle (one shared connection) for keys, limits and the store.
        let accounts = Arc::new(Accounts::from_config(&config, redis.clone())?);
        let planner = Arc::new(crate::planner_mode::build(&config.planner, redis.clone())?);
        let limiter = Arc::new(Limiter::from_config(&config, redis.clone()));
        let pools = Pools::new(
            config.models.iter().map(|(model, pool)| PoolSpec {
                model: model.clone(),
                workers: pool.workers.clone(),
                policy: pool.policy,
                queue: crate::pool::QueueLimits {
                    max_wait: std::time::Duration::from_millis(pool.queue_timeout_ms),
                    max_depth: pool.queue_max_depth as usize,
                    preempt: preempt_policy(pool),
                },
                stall_timeout: std::time::Duration::from_millis(pool.stall_timeout_ms),
            }),
            crate::pool::worker_auth(config.worker_token.as_deref())?,
            config
                .worker_tls
                .as_ref()
                .map(crate::tls::worker::channel_tls)
                .transpose()?,
            redis.clone(),
        )?;
        let idempotency_store =
            crate::idempotency::open(redis.clone(), config.store.idempotency_max_memory_bytes);
        let store = crate::store::open(
            redis,
            Duration::from_secs(config.store.storage_window_seconds),
        );
        let runs = Arc::new(Runs::new(store.clone(), &config.store));
        let idempotency = Arc::new(Claims::new(idempotency_store, runs.lease_span()));
        runs.renew_also(idempotency.clone());
        Ok(Self {
            config,
            catalog,
            accounts,
            limiter,
            pools: Arc::new(pools),
            store,
            idempotency,
            runs,
            shutdown: Arc::new(Shutdown::default()),
            planner,
        })
    }

    pub fn read_timeout(&self) -> Duration {
        Duration::from_secs(self.config.read_timeout_seconds)
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.config.request_timeout_seconds)
    }

    /// What the Responses path uses of the gateway.
    pub fn responses(&self) -> crate::responses::Services<'_> {
        crate::responses::Services {
            catalog: &self.catalog,
            pools: &self.pools,
            limiter: &self.limiter,
            runs: &self.runs,
            shutdown: &self.shutdown,
            max_body_bytes: self.config.max_body_bytes,
            request_timeout: self.request_timeout(),
        }
    }
}

/// A pool's preemption settings as its queue applies them.
fn preempt_policy(pool: &crate::config::ModelPool) -> crate::pool::PreemptPolicy {
    use crate::accounts::ServiceTier;
    use crate::config::PreemptibleTier;
    let mut tiers = [false; 3];
    for tier in &pool.preempt_tiers {
        let tier = match tier {
            PreemptibleTier::Default => ServiceTier::Default,
            PreemptibleTier::Flex => ServiceTier::Flex,
        };
        tiers[tier as usize] = true;
    }
    crate::pool::PreemptPolicy {
        tiers,
        max_per_generation: pool.max_preemptions,
    }
}
