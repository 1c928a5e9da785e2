//! Private `redis-server`s on free loopback ports, for what the shared
//! test Redis cannot be: a server that speaks only TLS, or a Redis Cluster
//! ([`RedisCluster`], with replicas to fail over to if asked for). Killed
//! on drop.

use crate::process::{free_port, ChildProcess, Spec};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    process: ChildProcess,
    /// How it was started (the same again revives it on its data).
    spec: Spec,
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
        let spec = Spec {
            name: name.into(),
            program: "redis-server".into(),
            args,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready_prefix: "Ready to accept connections".into(),
            ready_timeout: Duration::from_secs(10),
        };
        let (process, _) =
            ChildProcess::start(&spec).context("redis-server (tests/run.sh installs it)")?;
        Ok(RedisServer {
            port,
            process,
            spec,
            _dir: dir,
        })
    }

    /// The same server again, on the same port and directory (a cluster
    /// node rejoins with its `nodes.conf`), after [`Self::kill`].
    pub fn revive(&mut self) -> Result<()> {
        self.process.kill();
        let (process, _) = ChildProcess::start(&self.spec).context("redis-server again")?;
        self.process = process;
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILL (no chance to say goodbye to clients or the cluster bus).
    pub fn kill(&mut self) {
        self.process.kill();
    }
}

/// A Redis Cluster of `n` primaries (no replicas, or one each with
/// [`RedisCluster::start_with_replicas`]) on loopback ports, each a private
/// `redis-server --cluster-enabled yes` (its cluster bus on a free port of
/// its own: the default, port + 10000, may be taken or past 65535), joined
/// by `redis-cli --cluster create` and ready once every node reports
/// `cluster_state:ok` (and every replica is in sync). Killed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// The CA file, for a cluster that speaks only TLS.
    tls_ca: Option<PathBuf>,
    /// Ports of the nodes [`Self::kill`]ed.
    killed: Vec<u16>,
}

/// How long a node may be unreachable before the others count it failed
/// (and a replica takes its place): short, so failover tests are quick.
const REPLICA_NODE_TIMEOUT_MS: u32 = 1000;

impl RedisCluster {
    pub fn start(n: usize) -> Result<RedisCluster> {
        Self::start_with(n, 0, None)
    }

    /// `n` primaries, each with one replica (`2 * n` nodes) that takes its
    /// slots over within a few seconds of its death (node timeout
    /// [`REPLICA_NODE_TIMEOUT_MS`]).
    pub fn start_with_replicas(n: usize) -> Result<RedisCluster> {
        Self::start_with(n, 1, None)
    }

    /// A cluster whose nodes accept only TLS, clients and cluster bus
    /// alike, with the test certificate of tests/testdata/redis-cluster
    /// (clients need not present certificates; nodes authenticate each
    /// other with it, so it allows client authentication). Clients trust
    /// [`RedisCluster::test_ca`].
    pub fn start_tls(n: usize) -> Result<RedisCluster> {
        let (cert, key) = (test_cert_file("node.pem"), test_cert_file("node.key"));
        Self::start_with(n, 0, Some((&cert, &key, &Self::test_ca())))
    }

    /// The CA that signed the TLS cluster's certificate.
    pub fn test_ca() -> std::path::PathBuf {
        test_cert_file("ca.pem")
    }

    fn start_with(
        n: usize,
        replicas: usize,
        tls: Option<(&Path, &Path, &Path)>,
    ) -> Result<RedisCluster> {
        anyhow::ensure!(n >= 3, "a Redis Cluster needs at least 3 primaries");
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let node_timeout = if replicas > 0 {
            REPLICA_NODE_TIMEOUT_MS
        } else {
            2000
        };
        let mut nodes = Vec::with_capacity(n * (1 + replicas));
        for _ in 0..n * (1 + replicas) {
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
                node_timeout.to_string(),
            ]);
            nodes.push(RedisServer::start_in("redis-cluster", port, args, dir)?);
        }
        let cluster = RedisCluster {
            nodes,
            tls_ca: tls.map(|(_, _, ca)| ca.to_path_buf()),
            killed: Vec::new(),
        };
        let mut create = cluster.cli_tls_args();
        create.extend(["--cluster".into(), "create".into()]);
        create.extend(cluster.ports().iter().map(|p| format!("127.0.0.1:{p}")));
        create.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
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
            // A replica that has not synced yet could not take over.
            loop {
                let info = cluster.command(port, &["INFO", "replication"])?;
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "replica {port} of the Redis Cluster is not in sync:\n{info}"
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

    /// Every node's port, in start order (without replicas: the
    /// primaries'), killed ones included.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// The ports of the nodes not killed.
    pub fn live_ports(&self) -> Vec<u16> {
        self.ports()
            .into_iter()
            .filter(|p| !self.killed.contains(p))
            .collect()
    }

    /// SIGKILLs the node on `port` (a primary's replica then takes its
    /// slots over: see [`Self::wait_for_failover`]).
    pub fn kill(&mut self, port: u16) -> Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .with_context(|| format!("no node of the cluster on port {port}"))?;
        node.kill();
        self.killed.push(port);
        Ok(())
    }

    /// Starts a [`Self::kill`]ed node again on its data: a primary whose
    /// replica took over rejoins as that replica's replica. Returns once
    /// the node reports itself a replica in sync with its primary.
    pub fn revive(&mut self, port: u16, within: Duration) -> Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .with_context(|| format!("no node of the cluster on port {port}"))?;
        node.revive()?;
        self.killed.retain(|p| *p != port);
        let deadline = std::time::Instant::now() + within;
        loop {
            let info = self.command(port, &["INFO", "replication"])?;
            if info.contains("role:slave") && info.contains("master_link_status:up") {
                return Ok(());
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "node {port} did not rejoin as a replica within {within:?}:\n{info}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The hash slot of `key`, as the cluster computes it.
    pub fn key_slot(&self, key: &str) -> Result<u16> {
        let port = *self.live_ports().first().context("no live node")?;
        self.command(port, &["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .context("CLUSTER KEYSLOT")
    }

    /// The port of the primary serving `slot`, as the live nodes see it
    /// (`None` while none serves it, or they disagree).
    pub fn primary_of(&self, slot: u16) -> Result<Option<u16>> {
        let mut seen = None;
        for port in self.live_ports() {
            let owner = slot_owner(&self.command(port, &["CLUSTER", "NODES"])?, slot);
            match (seen, owner) {
                (_, None) => return Ok(None),
                (None, Some(o)) => seen = Some(o),
                (Some(s), Some(o)) if s != o => return Ok(None),
                _ => {}
            }
        }
        Ok(seen)
    }

    /// Waits until another node than `dead` serves `slot` in the view of
    /// every live node, and they all report `cluster_state:ok`; the new
    /// primary's port.
    pub fn wait_for_failover(&self, dead: u16, slot: u16, within: Duration) -> Result<u16> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(port) = self.primary_of(slot)?.filter(|p| *p != dead) {
                let ok = self.live_ports().into_iter().all(|p| {
                    self.command(p, &["CLUSTER", "INFO"])
                        .is_ok_and(|i| i.contains("cluster_state:ok"))
                });
                if ok {
                    return Ok(port);
                }
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "slot {slot} was not failed over from {dead} within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
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

/// The port of the primary, not failed, serving `slot` in a
/// `CLUSTER NODES` reply (lines `<id> <ip:port@bus> <flags> <primary>
/// <ping> <pong> <epoch> <link> <slot ranges...>`).
fn slot_owner(nodes: &str, slot: u16) -> Option<u16> {
    nodes.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2)?;
        if !flags.contains("master") || flags.contains("fail") {
            return None;
        }
        let serves = fields.iter().skip(8).any(|range| {
            let (a, b) = range.split_once('-').unwrap_or((range, range));
            matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if (a..=b).contains(&slot))
        });
        let addr = fields.get(1)?.split('@').next()?;
        serves.then(|| addr.rsplit(':').next()?.parse().ok())?
    })
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

/// A persistent `redis-server`: an append-only file fsynced on every write
/// (`--appendfsync always`, the production setting the chart uses), so
/// [`PersistentRedis::restart`] brings it back with every acknowledged
/// write. On a [`crate::netlab::Host`]'s address, or on loopback without
/// one. Killed on drop.
pub struct PersistentRedis {
    host: Option<crate::netlab::Host>,
    ip: std::net::IpAddr,
    port: u16,
    dir: TempDir,
    process: Option<ChildProcess>,
}

impl PersistentRedis {
    pub fn start(host: Option<&crate::netlab::Host>) -> Result<PersistentRedis> {
        let (ip, port) = match host {
            Some(h) => (std::net::IpAddr::V4(h.ip), 6379),
            None => (std::net::Ipv4Addr::LOCALHOST.into(), free_port()?),
        };
        let mut redis = PersistentRedis {
            host: host.cloned(),
            ip,
            port,
            dir: TempDir::new("redis-aof")?,
            process: None,
        };
        redis.process = Some(redis.spawn()?);
        Ok(redis)
    }

    fn spawn(&self) -> Result<ChildProcess> {
        let args = [
            "--bind",
            &self.ip.to_string(),
            "--port",
            &self.port.to_string(),
            "--protected-mode",
            "no",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--logfile",
            "",
            "--dir",
            &self.dir.0.to_string_lossy(),
        ]
        .map(String::from)
        .to_vec();
        let (program, args) = crate::netlab::on(self.host.as_ref(), "redis-server", args);
        let (process, _) = ChildProcess::start(&Spec {
            name: "redis-aof".into(),
            program,
            args,
            env: Vec::new(),
            env_remove: Vec::new(),
            ready_prefix: "Ready to accept connections".into(),
            ready_timeout: Duration::from_secs(10),
        })
        .context("a persistent redis-server (tests/run.sh installs it)")?;
        Ok(process)
    }

    /// `redis://ip:port`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(self.ip, self.port)
    }

    /// SIGKILL, `down_for` without a server, then the same server on the
    /// same data.
    pub fn restart(&mut self, down_for: Duration) -> Result<()> {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
        std::thread::sleep(down_for);
        self.process = Some(self.spawn()?);
        Ok(())
    }
}
