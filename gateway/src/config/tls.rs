//! TLS sections: the public listener's certificate (`[tls]`) and the
//! gateway's TLS to its workers (`[worker_tls]`), with their rules.

use anyhow::bail;
use serde::Deserialize;

/// The public listener's certificate (`[tls]`). Both files are PEM and
/// read again whenever their contents change (checked every 2 s): new
/// connections get the new certificate, open ones keep theirs, and a pair
/// that does not load is logged and the previous one kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerTlsConfig {
    /// The certificate chain, leaf first.
    pub cert_file: std::path::PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: std::path::PathBuf,
    /// How long a client has from connecting to finishing its TLS
    /// handshake before the connection is closed (Pingora's own limit is
    /// 60 s).
    #[serde(default = "default_handshake_timeout_seconds")]
    pub handshake_timeout_seconds: u64,
}

fn default_handshake_timeout_seconds() -> u64 {
    10
}

/// TLS to the workers (`[worker_tls]`), whose addresses are then reached
/// over `https` (`host:port` or `https://host:port`). Read at start-up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerTlsConfig {
    /// PEM of the CA(s) the workers' certificates must chain to.
    pub ca_file: std::path::PathBuf,
    /// The gateway's client certificate (PEM), for workers started with
    /// `--tls-client-ca`; goes with `key_file`.
    #[serde(default)]
    pub cert_file: Option<std::path::PathBuf>,
    #[serde(default)]
    pub key_file: Option<std::path::PathBuf>,
    /// The name checked on every worker's certificate instead of the
    /// address's host (needed when `dns://`/`k8s://` resolve to IPs).
    #[serde(default)]
    pub server_name: Option<String>,
}

impl WorkerTlsConfig {
    /// The section's rules: a client certificate goes with its key, and a
    /// server name is not empty.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            bail!("worker_tls: cert_file and key_file go together");
        }
        if self
            .server_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            bail!("worker_tls.server_name must not be empty");
        }
        Ok(())
    }
}
