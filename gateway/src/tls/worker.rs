//! TLS of the gateway's channels to its workers (`[worker_tls]`): the CA
//! the workers' certificates are checked against, the gateway's own client
//! certificate when the workers require one (mutual TLS), and the name to
//! check when workers are addressed by IP (`dns://`, `k8s://`).

use crate::config::WorkerTlsConfig;
use anyhow::Context;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// A worker that accepts the TCP connection but never finishes the
/// handshake must not hold a channel (and the requests queued on it).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// The channels' TLS settings, with every file read and checked now, so a
/// bad file stops the gateway at start-up rather than failing each call.
pub fn channel_tls(config: &WorkerTlsConfig) -> anyhow::Result<ClientTlsConfig> {
    let ca = std::fs::read(&config.ca_file)
        .with_context(|| format!("reading worker_tls.ca_file {}", config.ca_file.display()))?;
    super::roots_from_pem(&ca, "worker_tls.ca_file")?;
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .timeout(HANDSHAKE_TIMEOUT);
    if let (Some(cert_file), Some(key_file)) = (&config.cert_file, &config.key_file) {
        let cert = std::fs::read(cert_file)
            .with_context(|| format!("reading worker_tls.cert_file {}", cert_file.display()))?;
        let key = std::fs::read(key_file)
            .with_context(|| format!("reading worker_tls.key_file {}", key_file.display()))?;
        super::certified_key(&cert, &key).context("worker_tls client certificate")?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = &config.server_name {
        tls = tls.domain_name(name.clone());
    }
    Ok(tls)
}
