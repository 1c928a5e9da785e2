//! rustls client configurations, with ring as the only crypto provider (no
//! system OpenSSL): the Kubernetes API client and Redis over TLS.

use anyhow::{bail, Context};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::sync::Arc;

/// The certificates of a PEM bundle (`what` names it in errors).
pub fn roots_from_pem(pem: &[u8], what: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(cert.with_context(|| format!("{what} is not PEM"))?)
            .with_context(|| what.to_owned())?;
    }
    if roots.is_empty() {
        bail!("{what} holds no certificate");
    }
    Ok(roots)
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
