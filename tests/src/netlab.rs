//! Hosts as network namespaces: each process of a fault test on an address
//! of its own, as on separate machines, joined by a bridge in the test's
//! namespace (where the test's clients and its fault proxies live).
//!
//! ```text
//!   test namespace: bridge 10.214.S.1/24 ── clients, FaultProxy per link
//!      ├── veth ── host "redis"   10.214.S.2
//!      ├── veth ── host "gw-a"    10.214.S.3
//!      └── ...
//! ```
//!
//! Needs root and `ip` (iproute2); [`NetLab::new`] answers `None` where
//! namespaces cannot be made, and callers fall back to loopback. A host can
//! be cut off whole ([`Host::cut`]: its link down, as a pulled cable);
//! finer faults (a stall, a one-way link) come from the proxies.

use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::process::Command;

/// A bridge and the namespaces on it; all removed on drop.
pub struct NetLab {
    tag: String,
    subnet: u8,
    bridge: String,
    hosts: Vec<String>,
}

/// One namespace on the lab's bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// The namespace's name (for `ip netns exec`).
    pub ns: String,
    pub ip: Ipv4Addr,
    /// The link's end in the test namespace.
    link: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A /24 of its own per lab: tests of one binary run in parallel in one
/// process, so a counter (from a random start, apart from other runs)
/// keeps their addresses apart.
fn next_subnet() -> u8 {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: std::sync::OnceLock<AtomicUsize> = std::sync::OnceLock::new();
    let next = NEXT.get_or_init(|| {
        AtomicUsize::new(usize::from_str_radix(&crate::random_hex(2), 16).unwrap_or(0))
    });
    (next.fetch_add(1, Ordering::Relaxed) % 254 + 1) as u8
}

impl NetLab {
    /// A fresh lab, or `None` (with the reason on stderr) where network
    /// namespaces are not permitted.
    pub fn new() -> Option<NetLab> {
        let hex = crate::random_hex(6);
        let subnet = next_subnet();
        let lab = NetLab {
            tag: hex.clone(),
            subnet,
            bridge: format!("igwb{hex}"),
            hosts: Vec::new(),
        };
        let made = (|| -> Result<()> {
            ip(&["link", "add", &lab.bridge, "type", "bridge"])?;
            ip(&[
                "addr",
                "add",
                &format!("{}/24", lab.bridge_ip()),
                "dev",
                &lab.bridge,
            ])?;
            ip(&["link", "set", &lab.bridge, "up"])
        })();
        match made {
            Ok(()) => Some(lab),
            Err(e) => {
                eprintln!("network namespaces unavailable ({e:#})");
                None
            }
        }
    }

    /// The bridge's address in the test namespace: where hosts reach the
    /// test's proxies.
    pub fn bridge_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 214, self.subnet, 1)
    }

    /// A new host named `role`, up, with its own address and loopback.
    pub fn host(&mut self, role: &str) -> Result<Host> {
        let k = self.hosts.len() + 2;
        anyhow::ensure!(k < 255, "a lab holds at most 252 hosts");
        let ns = format!("igw-{}-{role}", self.tag);
        let link = format!("igwv{}{k:02}", self.tag);
        let inner = format!("igwi{}{k:02}", self.tag);
        let addr = Ipv4Addr::new(10, 214, self.subnet, k as u8);
        ip(&["netns", "add", &ns])?;
        self.hosts.push(ns.clone());
        ip(&["link", "add", &link, "type", "veth", "peer", "name", &inner])?;
        ip(&["link", "set", &inner, "netns", &ns])?;
        ip(&["link", "set", &link, "master", &self.bridge])?;
        ip(&["link", "set", &link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns, "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["link", "set", "lo", "up"])?;
        inside(&["addr", "add", &format!("{addr}/24"), "dev", &inner])?;
        inside(&["link", "set", &inner, "up"])?;
        Ok(Host { ns, ip: addr, link })
    }
}

impl Host {
    /// Pulls the host's cable: nothing reaches it or leaves it.
    pub fn cut(&self) -> Result<()> {
        ip(&["link", "set", &self.link, "down"])
    }

    pub fn reconnect(&self) -> Result<()> {
        ip(&["link", "set", &self.link, "up"])
    }

    /// `ip netns exec <ns>`: the prefix that runs a program on this host.
    pub fn exec_prefix(&self) -> Vec<String> {
        ["netns", "exec", &self.ns].map(String::from).to_vec()
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        for ns in &self.hosts {
            // Deleting a namespace removes its end of the veth, and the
            // pair with it; processes still in it were killed by then.
            let _ = ip(&["netns", "del", ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// `program args` as run on `host` (through `ip netns exec`, which execs
/// it in place: same pid), or as is without one.
pub fn on(
    host: Option<&Host>,
    program: impl Into<std::path::PathBuf>,
    args: Vec<String>,
) -> (std::path::PathBuf, Vec<String>) {
    let program = program.into();
    match host {
        Some(h) => {
            let mut all = h.exec_prefix();
            all.push(program.to_string_lossy().into_owned());
            all.extend(args);
            ("ip".into(), all)
        }
        None => (program, args),
    }
}
