//! rustls configurations, with ring as the only crypto provider (no system
//! OpenSSL): the Kubernetes API client and Redis over TLS (here), the public
//! listener's certificate (`listener`), the channels to workers (`worker`).

pub mod handshake;
pub mod listener;
pub mod worker;

use anyhow::{bail, Context};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use std::sync::Arc;

/// The certificates of a PEM file, at least one (`what` names it in errors).
pub fn certs_from_pem(pem: &[u8], what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} is not PEM"))?;
    if certs.is_empty() {
        bail!("{what} holds no certificate");
    }
    Ok(certs)
}

/// The certificates of a PEM bundle as trust roots (`what` names it in errors).
pub fn roots_from_pem(pem: &[u8], what: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs_from_pem(pem, what)? {
        roots.add(cert).with_context(|| what.to_owned())?;
    }
    Ok(roots)
}

/// A certificate chain and its private key (PEM), checked to belong
/// together, signing with ring.
pub fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> anyhow::Result<CertifiedKey> {
    let chain = certs_from_pem(cert_pem, "the certificate file")?;
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| anyhow::anyhow!("the key file holds no usable private key: {e}"))?;
    let provider = rustls::crypto::ring::default_provider();
    CertifiedKey::from_der(chain, key, &provider)
        .map_err(|e| anyhow::anyhow!("the certificate and key do not make a pair: {e}"))
}

/// The system's trusted roots (`SSL_CERT_FILE` / `SSL_CERT_DIR` override
/// where they are read from), as the redis crate trusts them.
pub fn native_roots() -> anyhow::Result<rustls::RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        bail!(
            "no trusted root certificates found on this system ({} errors); \
             give the CA file explicitly",
            found.errors.len()
        );
    }
    Ok(roots)
}

/// A client configuration trusting `roots`, no client certificate.
pub fn client_config(roots: rustls::RootCertStore) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pem_without_certificates_is_refused_by_name() {
        let e = roots_from_pem(b"not a certificate", "store.redis_ca_file").unwrap_err();
        assert!(e.to_string().contains("store.redis_ca_file"), "{e}");
        let ca = include_bytes!("pool/testdata/cluster-ca.pem");
        assert_eq!(roots_from_pem(ca, "ca").unwrap().len(), 1);
    }
}
