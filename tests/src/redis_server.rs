//! Private `redis-server`s on free loopback ports, for what the shared
//! test Redis cannot be: a server that speaks only TLS, or a Redis Cluster
//! ([`RedisCluster`]). Killed on drop.

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

    fn start(name: &str, port: u16, args: Vec<String>) -> Result<RedisServer> {
        Self::start_in(name, port, args, TempDir::new(name)?)
    }

    fn start_in(name: &str, port: u16, mut args: Vec<String>, dir: TempDir) -> Result<RedisServer> {
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

/// A Redis Cluster of `n` primaries (no replicas) on loopback ports, each
/// a private `redis-server --cluster-enabled yes` (its cluster bus on a
/// free port of its own: the default, port + 10000, may be taken or past
/// 65535), joined by `redis-cli --cluster create` and ready once every node
/// reports `cluster_state:ok`. Killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The CA file, for a cluster that speaks only TLS.
    tls_ca: Option<PathBuf>,
}

impl RedisCluster {
    pub fn start(n: usize) -> Result<RedisCluster> {
        Self::start_with(n, None)
    }

    /// A cluster whose nodes accept only TLS, clients and cluster bus
    /// alike, with the test certificate of tests/testdata/redis-cluster
    /// (clients need not present certificates; nodes authenticate each
    /// other with it, so it allows client authentication). Clients trust
    /// [`RedisCluster::test_ca`].
    pub fn start_tls(n: usize) -> Result<RedisCluster> {
        let (cert, key) = (test_cert_file("node.pem"), test_cert_file("node.key"));
        Self::start_with(n, Some((&cert, &key, &Self::test_ca())))
    }

    /// The CA that signed the TLS cluster's certificate.
    pub fn test_ca() -> std::path::PathBuf {
        test_cert_file("ca.pem")
    }

    fn start_with(n: usize, tls: Option<(&Path, &Path, &Path)>) -> Result<RedisCluster> {
        anyhow::ensure!(n >= 3, "a Redis Cluster needs at least 3 primaries");
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut nodes = Vec::with_capacity(n);
        for _ in 0..n {
            let port = free_port()?;
            let bus = loop {
                let b = free_port()?;
                if b != port {
                    break b;
                }
            };
            let dir = TempDir::new("redis-cluster")?;
            let mut args: Vec<String> = match tls {
                None => vec!["--port".into(), port.to_string()],
                Some((cert, key, ca)) => vec![
                    "--port".into(),
                    "0".into(),
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cluster".into(),
                    "yes".into(),
                    "--tls-cert-file".into(),
                    path(cert),
                    "--tls-key-file".into(),
                    path(key),
                    "--tls-ca-cert-file".into(),
                    path(ca),
                    "--tls-auth-clients".into(),
                    "no".into(),
                ],
            };
            args.extend([
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-port".into(),
                bus.to_string(),
                "--cluster-config-file".into(),
                dir.0.join("nodes.conf").to_string_lossy().into_owned(),
                "--cluster-node-timeout".into(),
                "2000".into(),
            ]);
            nodes.push(RedisServer::start_in("redis-cluster", port, args, dir)?);
        }
        let cluster = RedisCluster {
            nodes,
            tls_ca: tls.map(|(_, _, ca)| ca.to_path_buf()),
        };
        let mut create = cluster.cli_tls_args();
        create.extend(["--cluster".into(), "create".into()]);
        create.extend(cluster.ports().iter().map(|p| format!("127.0.0.1:{p}")));
        create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
        // Bounded: a node that cannot join (a cluster bus refusing a
        // certificate) would keep redis-cli waiting for ever.
        let out = output_within(
            std::process::Command::new("redis-cli").args(&create),
            Duration::from_secs(30),
        )
        .context("redis-cli (tests/run.sh installs it)")?;
        anyhow::ensure!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        for port in cluster.ports() {
            loop {
                let info = cluster.command(port, &["CLUSTER", "INFO"])?;
                if info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384") {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "node {port} of the Redis Cluster is not ready:\n{info}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(cluster)
    }

    fn cli_tls_args(&self) -> Vec<String> {
        match &self.tls_ca {
            Some(ca) => vec![
                "--tls".into(),
                "--cacert".into(),
                ca.to_string_lossy().into_owned(),
            ],
            None => Vec::new(),
        }
    }

    /// The primaries' ports, in start order.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// Every node as a seed: `redis://127.0.0.1:P1/,redis://127.0.0.1:P2/,...`
    /// (`rediss://` for a TLS cluster).
    pub fn urls(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        self.ports()
            .iter()
            .map(|p| format!("{scheme}://127.0.0.1:{p}/"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `redis-cli -p PORT ARGS...` on one node; its stdout.
    pub fn command(&self, port: u16, args: &[&str]) -> Result<String> {
        let out = output_within(
            std::process::Command::new("redis-cli")
                .args(self.cli_tls_args())
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(args),
            Duration::from_secs(10),
        )
        .context("redis-cli")?;
        anyhow::ensure!(
            out.status.success(),
            "redis-cli -p {port} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The cluster node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> Result<String> {
        Ok(self.command(port, &["CLUSTER", "MYID"])?.trim().to_owned())
    }

    /// How many keys each node holds, in [`Self::ports`] order.
    pub fn key_counts(&self) -> Result<Vec<u64>> {
        self.ports()
            .into_iter()
            .map(|p| {
                self.command(p, &["DBSIZE"])?
                    .trim()
                    .parse()
                    .context("DBSIZE")
            })
            .collect()
    }
}

/// Runs `cmd` to its end, killing it after `limit`; its output (small:
/// it is read once the process has exited).
fn output_within(cmd: &mut std::process::Command, limit: Duration) -> Result<std::process::Output> {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            anyhow::bail!(
                "timed out after {limit:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
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

/// A file of the TLS cluster's test certificates.
fn test_cert_file(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/redis-cluster")
        .join(name)
}
