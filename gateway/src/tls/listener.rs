//! The public listener's certificate (`[tls]`): read from PEM files, and
//! read again whenever their contents change, so a renewed certificate
//! (Kubernetes swaps a mounted Secret's symlink; cert-manager renews) is
//! served to new connections without a restart. Open connections keep the
//! session they negotiated. A new pair that does not load (half written, a
//! key of another certificate) or whose certificate is outside its validity
//! period (expired, or not yet valid: a clock or a renewal gone wrong) is
//! logged once at warn and the old one kept: every client would refuse it,
//! while the old one may still be good.

use anyhow::Context;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// How often the files are read for changes. Reading two small files is
/// cheap, and comparing contents (not mtimes) sees a symlink swap too.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The certificate every handshake of the public listener gets.
pub struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// Digest of the file contents last tried, good or bad: a change is
    /// acted on (and a bad pair logged) once.
    last_seen: Mutex<[u8; 32]>,
}

/// What one look at the files found.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    Unchanged,
    Replaced,
    /// The new contents do not make a usable pair; the old one stays.
    Refused(String),
}

impl ReloadingCert {
    /// Loads the pair; an unusable pair at start-up is an error (the
    /// gateway refuses to start rather than serve without TLS). One outside
    /// its validity period is served with a warning: there is nothing
    /// better to serve yet, and a renewal will be picked up.
    pub fn load(cert_file: &Path, key_file: &Path) -> anyhow::Result<Self> {
        let (cert_pem, key_pem) = read_pair(cert_file, key_file)?;
        let key = super::certified_key(&cert_pem, &key_pem)
            .with_context(|| format!("tls: {} with {}", cert_file.display(), key_file.display()))?;
        if let Err(why) = check_validity(&key, std::time::SystemTime::now()) {
            tracing::warn!(
                cert_file = %cert_file.display(),
                "tls: {why:#}; serving it until a renewed certificate is installed"
            );
        }
        Ok(Self {
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            current: RwLock::new(Arc::new(key)),
            last_seen: Mutex::new(digest(&cert_pem, &key_pem)),
        })
    }

    /// Reads the files and swaps the served certificate if they changed
    /// into a usable pair.
    pub fn reload_if_changed(&self) -> Reload {
        let (cert_pem, key_pem) = match read_pair(&self.cert_file, &self.key_file) {
            Ok(pair) => pair,
            // A file missing for a moment (mid-swap) is not a change yet.
            Err(e) => return self.refuse_once([0; 32], format!("{e:#}")),
        };
        let seen = digest(&cert_pem, &key_pem);
        if *lock(&self.last_seen) == seen {
            return Reload::Unchanged;
        }
        let usable = super::certified_key(&cert_pem, &key_pem).and_then(|key| {
            check_validity(&key, std::time::SystemTime::now())?;
            Ok(key)
        });
        match usable {
            Ok(key) => {
                *lock(&self.last_seen) = seen;
                match self.current.write() {
                    Ok(mut g) => *g = Arc::new(key),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(key),
                }
                Reload::Replaced
            }
            Err(e) => self.refuse_once(seen, format!("{e:#}")),
        }
    }

    fn refuse_once(&self, seen: [u8; 32], why: String) -> Reload {
        let mut last = lock(&self.last_seen);
        if *last == seen {
            return Reload::Unchanged;
        }
        *last = seen;
        Reload::Refused(why)
    }

    /// Polls the files until the process ends, logging each change.
    pub async fn watch(&self) {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Reload::Unchanged => {}
                Reload::Replaced => tracing::info!(
                    cert_file = %self.cert_file.display(),
                    "tls: new certificate loaded; new connections get it"
                ),
                Reload::Refused(why) => tracing::warn!(
                    cert_file = %self.cert_file.display(),
                    key_file = %self.key_file.display(),
                    "tls: the changed certificate files were refused ({why}); still serving the previous certificate"
                ),
            }
        }
    }

    fn served(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.served())
    }
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<[u8; 32]>) -> std::sync::MutexGuard<'_, [u8; 32]> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The leaf certificate is within its validity period at `now`.
fn check_validity(key: &CertifiedKey, now: std::time::SystemTime) -> anyhow::Result<()> {
    let der = key
        .end_entity_cert()
        .map_err(|e| anyhow::anyhow!("the certificate file holds no leaf certificate: {e}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| anyhow::anyhow!("the certificate cannot be read: {e}"))?;
    let validity = cert.validity();
    let now = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if now > validity.not_after.timestamp() {
        anyhow::bail!("the certificate expired on {}", validity.not_after);
    }
    if now < validity.not_before.timestamp() {
        anyhow::bail!("the certificate is not valid until {}", validity.not_before);
    }
    Ok(())
}

fn read_pair(cert_file: &Path, key_file: &Path) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let cert = std::fs::read(cert_file)
        .with_context(|| format!("reading tls.cert_file {}", cert_file.display()))?;
    let key = std::fs::read(key_file)
        .with_context(|| format!("reading tls.key_file {}", key_file.display()))?;
    Ok((cert, key))
}

fn digest(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert_pem.len() as u64).to_le_bytes());
    h.update(cert_pem);
    h.update(key_pem);
    h.finalize().into()
}

/// The listener's rustls settings for Pingora: our certificate resolver,
/// HTTP/1.1 only (ALPN), no client certificates.
pub fn settings(
    cert: Arc<ReloadingCert>,
) -> anyhow::Result<pingora_core::listeners::tls::TlsSettings> {
    // Pingora reads the two paths only without a resolver; with one they
    // are ignored, so the resolver's own files are named for clarity.
    let mut settings = pingora_core::listeners::tls::TlsSettings::intermediate(
        &cert.cert_file.display().to_string(),
        &cert.key_file.display().to_string(),
    )
    .map_err(|e| anyhow::anyhow!("tls settings: {e}"))?;
    settings.set_cert_resolver(cert);
    settings.set_alpn(pingora_core::listeners::ALPN::H1);
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness::certs::TestCa;

    fn served_der(cert: &ReloadingCert) -> Vec<u8> {
        cert.served().end_entity_cert().unwrap().to_vec()
    }

    #[test]
    fn a_changed_pair_is_served_and_a_bad_one_is_refused_once() {
        let ca = TestCa::new("unit").unwrap();
        let first = ca.server("first", &["localhost"]).unwrap();
        let second = ca.server("second", &["localhost"]).unwrap();
        let live = (ca.dir().join("live.crt"), ca.dir().join("live.key"));
        let install = |cert: &Path, key: &Path| {
            std::fs::copy(cert, &live.0).unwrap();
            std::fs::copy(key, &live.1).unwrap();
        };
        install(&first.cert_file, &first.key_file);
        let cert = ReloadingCert::load(&live.0, &live.1).unwrap();
        assert_eq!(served_der(&cert), first.der);
        assert_eq!(cert.reload_if_changed(), Reload::Unchanged);

        install(&second.cert_file, &second.key_file);
        assert_eq!(cert.reload_if_changed(), Reload::Replaced);
        assert_eq!(served_der(&cert), second.der);

        // Half of a renewal: the new certificate with the old key.
        install(&first.cert_file, &second.key_file);
        assert!(matches!(cert.reload_if_changed(), Reload::Refused(why) if why.contains("pair")));
        assert_eq!(cert.reload_if_changed(), Reload::Unchanged, "logged once");
        assert_eq!(served_der(&cert), second.der, "the old pair stays");

        std::fs::write(&live.0, "not PEM").unwrap();
        assert!(
            matches!(cert.reload_if_changed(), Reload::Refused(why) if why.contains("no certificate"))
        );
        assert_eq!(served_der(&cert), second.der);
    }

    #[test]
    fn an_expired_or_not_yet_valid_certificate_is_refused_on_reload() {
        let ca = TestCa::new("unit").unwrap();
        let good = ca.server("good", &["localhost"]).unwrap();
        let expired = ca.expired_server("expired", &["localhost"]).unwrap();
        let early = ca.future_server("early", &["localhost"]).unwrap();
        let live = (ca.dir().join("live.crt"), ca.dir().join("live.key"));
        let install = |files: &harness::certs::CertFiles| {
            std::fs::copy(&files.cert_file, &live.0).unwrap();
            std::fs::copy(&files.key_file, &live.1).unwrap();
        };
        install(&good);
        let cert = ReloadingCert::load(&live.0, &live.1).unwrap();

        install(&expired);
        assert!(
            matches!(cert.reload_if_changed(), Reload::Refused(why) if why.contains("expired")),
            "an expired pair is refused"
        );
        assert_eq!(served_der(&cert), good.der, "the old pair stays");
        assert_eq!(cert.reload_if_changed(), Reload::Unchanged, "logged once");

        install(&early);
        assert!(
            matches!(cert.reload_if_changed(), Reload::Refused(why) if why.contains("not valid until"))
        );
        assert_eq!(served_der(&cert), good.der);

        // At start-up there is nothing older to keep: it is served.
        let started = ReloadingCert::load(&expired.cert_file, &expired.key_file).unwrap();
        assert_eq!(served_der(&started), expired.der);
    }

    #[test]
    fn an_unusable_pair_at_start_up_is_an_error_naming_the_files() {
        let ca = TestCa::new("unit").unwrap();
        let a = ca.server("a", &["localhost"]).unwrap();
        let b = ca.server("b", &["localhost"]).unwrap();
        let e = ReloadingCert::load(&a.cert_file, &b.key_file).unwrap_err();
        assert!(format!("{e:#}").contains("a.crt"), "{e:#}");
        let e = ReloadingCert::load(&a.cert_file, &ca.dir().join("missing.key")).unwrap_err();
        assert!(format!("{e:#}").contains("tls.key_file"), "{e:#}");
    }
}
