//! TLS on the gRPC listener (`--tls-cert`, `--tls-key`), optionally
//! requiring a client certificate signed by `--tls-client-ca` (mutual TLS
//! with the gateways). Handshakes run in our own accept loop rather than
//! tonic's so that a refused client (no certificate, another CA) is logged
//! at warn with its address: the operator's first clue when a gateway's
//! certificate is wrong. rustls with ring only.

use anyhow::{bail, Context};
use futures::Stream;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A client that opens a connection and never finishes the handshake
/// holds only its socket, and not for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the listener's certificate, key and client CA come from.
pub struct TlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    /// Clients must present a certificate chaining to this CA.
    pub client_ca: Option<&'a Path>,
}

/// The listener's rustls configuration (HTTP/2 by ALPN, as gRPC needs).
pub fn server_config(files: &TlsFiles<'_>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certs(files.cert, "--tls-cert")?;
    let key = PrivateKeyDer::from_pem_file(files.key)
        .map_err(|e| anyhow::anyhow!("--tls-key {}: {e}", files.key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS versions")?;
    let builder = match files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs(ca, "--tls-client-ca")? {
                roots.add(cert).context("--tls-client-ca")?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .context("--tls-client-ca")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .context("--tls-cert with --tls-key")?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

fn certs(path: &Path, flag: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        bail!("{flag} {}: no certificate in the file", path.display());
    }
    Ok(certs)
}

/// The TLS connections accepted on `listener`, for tonic's
/// `serve_with_incoming`. Each handshake runs in its own task; a failed
/// one is logged and its connection dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let acceptor = TlsAcceptor::from(config);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<TlsStream<TcpStream>, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors and the like: wait, do not spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = tx.closed() => return,
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "TLS handshake refused")
                    }
                    Err(_) => tracing::warn!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
