//! A private `redis-server` on free loopback ports, for what the shared
//! test Redis cannot be: a server that speaks only TLS. Killed on drop.

use crate::process::{free_addr, ChildProcess, Spec};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    _process: ChildProcess,
    _dir: TempDir,
}

impl RedisServer {
    /// A server accepting only TLS on its port, with `cert`/`key` signed by
    /// `ca` (clients need not present certificates).
    pub fn start_tls(cert: &Path, key: &Path, ca: &Path) -> Result<RedisServer> {
        let port = free_port()?;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let args = vec![
            "--port".into(),
            "0".into(),
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(cert),
            "--tls-key-file".into(),
            path(key),
            "--tls-ca-cert-file".into(),
            path(ca),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        Self::start("redis-tls", port, args)
    }

    fn start(name: &str, port: u16, mut args: Vec<String>) -> Result<RedisServer> {
        let dir = TempDir::new(name)?;
        args.extend(
            [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                "",
                "--dir",
            ]
            .map(String::from),
        );
        args.push(dir.0.to_string_lossy().into_owned());
        let (process, _) = ChildProcess::start(&Spec {
            name: name.into(),
            program: "redis-server".into(),
            args,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready_prefix: "Ready to accept connections".into(),
            ready_timeout: Duration::from_secs(10),
        })
        .context("redis-server (tests/run.sh installs it)")?;
        Ok(RedisServer {
            port,
            _process: process,
            _dir: dir,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

fn free_port() -> Result<u16> {
    let addr = free_addr()?;
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("free_addr gave no port")
}

/// A directory removed on drop (redis-server writes nothing to it with
/// persistence off, but needs a working directory of its own).
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Result<TempDir> {
        let dir = std::env::temp_dir().join(format!("igw-{name}-{}", crate::random_hex(8)));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
