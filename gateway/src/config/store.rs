//! `[store]`: where responses, runs and idempotency records live, and
//! their windows and leases.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// `redis://[user:password@]host:port/db`, or `rediss://` for TLS;
    /// absent = the embedded in-process store. With `redis_cluster`, one
    /// or more seed nodes of the cluster, separated by commas.
    pub redis_url: Option<String>,
    /// `redis_url` names nodes of a Redis Cluster (cluster mode enabled):
    /// commands go to the primary serving each key's slot, following the
    /// cluster's redirects. Database 0 only.
    #[serde(default)]
    pub redis_cluster: bool,
    /// PEM file of the CA that signed the Redis server's certificate (for
    /// `rediss://`); absent = the system's trusted roots.
    #[serde(default)]
    pub redis_ca_file: Option<std::path::PathBuf>,
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    /// How long stored responses (object, input items, event log) are kept.
    #[serde(default = "default_storage_window")]
    pub storage_window_seconds: u64,
    /// How long an `Idempotency-Key` of a generation create is remembered
    /// (its outcome replayed to a retry with the same key and body).
    #[serde(default = "default_idempotency_window")]
    pub idempotency_window_seconds: u64,
    /// The largest reply an idempotency record keeps (a chat completion,
    /// or an unstored response object); a larger success pins its key
    /// without a replayable reply (409 `idempotency_result_not_kept`).
    #[serde(default = "default_idempotency_max_record_bytes")]
    pub idempotency_max_record_bytes: usize,
    /// The embedded store only: the most bytes of idempotency records kept
    /// in the gateway's memory; past it the least recently used finished
    /// records go (a retry of an evicted key runs again).
    #[serde(default = "default_idempotency_max_memory_bytes")]
    pub idempotency_max_memory_bytes: usize,
    /// A run whose lease is not renewed within this is taken for dead and
    /// failed by another replica's sweeper.
    #[serde(default = "default_lease_millis")]
    pub lease_millis: u64,
    /// How often a replica renews the leases of its runs (one round trip).
    #[serde(default = "default_heartbeat_millis")]
    pub heartbeat_millis: u64,
    /// How often a replica looks for runs with expired leases.
    #[serde(default = "default_sweep_millis")]
    pub sweep_interval_millis: u64,
    /// While a background run's worker is quiet, how often its owner checks
    /// for a cancel from another replica (between batches it learns of it
    /// from every write).
    #[serde(default = "default_cancel_poll_millis")]
    pub cancel_poll_millis: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            redis_cluster: false,
            redis_ca_file: None,
            key_prefix: default_key_prefix(),
            storage_window_seconds: default_storage_window(),
            idempotency_window_seconds: default_idempotency_window(),
            idempotency_max_record_bytes: default_idempotency_max_record_bytes(),
            idempotency_max_memory_bytes: default_idempotency_max_memory_bytes(),
            lease_millis: default_lease_millis(),
            heartbeat_millis: default_heartbeat_millis(),
            sweep_interval_millis: default_sweep_millis(),
            cancel_poll_millis: default_cancel_poll_millis(),
        }
    }
}

fn default_storage_window() -> u64 {
    30 * 24 * 3600
}
fn default_idempotency_window() -> u64 {
    24 * 3600
}
fn default_idempotency_max_record_bytes() -> usize {
    1 << 20
}
fn default_idempotency_max_memory_bytes() -> usize {
    64 << 20
}
fn default_lease_millis() -> u64 {
    10_000
}
fn default_heartbeat_millis() -> u64 {
    2_000
}
fn default_sweep_millis() -> u64 {
    1_000
}
fn default_cancel_poll_millis() -> u64 {
    150
}

fn default_key_prefix() -> String {
    "igw:".into()
}
