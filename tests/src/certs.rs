//! Certificates made at run time for TLS tests: a test CA that issues
//! server and client certificates into PEM files of its own directory
//! (deleted on drop). Made fresh each run, so nothing checked in expires,
//! and a second CA stands in for "signed by someone else".

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A date: (year, month, day).
type Ymd = (i32, u8, u8);

/// A CA and the directory its files go to.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: PathBuf,
    ca_file: PathBuf,
}

/// A certificate and key issued by a [`TestCa`], written as PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The certificate (DER), to compare with what a server presented.
    pub der: Vec<u8>,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to [`TestCa::ca_file`].
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let dir = std::env::temp_dir().join(format!(
            "igw-tls-{}-{}-{}",
            name,
            std::process::id(),
            crate::random_hex(6)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, issuer.pem())?;
        Ok(Self {
            issuer,
            dir,
            ca_file,
        })
    }

    /// The CA certificate (PEM file): what clients trust.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The directory the files go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A server certificate for `names` (DNS names or IP addresses),
    /// written as `STEM.crt` / `STEM.key`.
    pub fn server(&self, stem: &str, names: &[&str]) -> Result<CertFiles> {
        self.issue(stem, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A server certificate that expired in 2001.
    pub fn expired_server(&self, stem: &str, names: &[&str]) -> Result<CertFiles> {
        self.issue_valid(
            stem,
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
            Some(((2000, 1, 1), (2001, 1, 1))),
        )
    }

    /// A server certificate valid from 2100 on.
    pub fn future_server(&self, stem: &str, names: &[&str]) -> Result<CertFiles> {
        self.issue_valid(
            stem,
            names,
            ExtendedKeyUsagePurpose::ServerAuth,
            Some(((2100, 1, 1), (2101, 1, 1))),
        )
    }

    /// A client certificate with common name `name`.
    pub fn client(&self, stem: &str, name: &str) -> Result<CertFiles> {
        self.issue(stem, &[name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        stem: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<CertFiles> {
        self.issue_valid(stem, names, usage, None)
    }

    /// `validity`: (not before, not after) as (year, month, day); rcgen's
    /// default without.
    fn issue_valid(
        &self,
        stem: &str,
        names: &[&str],
        usage: ExtendedKeyUsagePurpose,
        validity: Option<(Ymd, Ymd)>,
    ) -> Result<CertFiles> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone())?;
        if let Some(((y0, m0, d0), (y1, m1, d1))) = validity {
            params.not_before = rcgen::date_time_ymd(y0, m0, d0);
            params.not_after = rcgen::date_time_ymd(y1, m1, d1);
        }
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        let files = CertFiles {
            cert_file: self.dir.join(format!("{stem}.crt")),
            key_file: self.dir.join(format!("{stem}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&files.cert_file, cert.pem())?;
        std::fs::write(&files.key_file, key.serialize_pem())?;
        Ok(files)
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        if !crate::process::keep_logs() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
