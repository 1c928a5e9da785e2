//! Who may be called: the address policy, checked on every address a name
//! resolves to (the resolver drops forbidden answers), so a DNS answer
//! cannot smuggle in a private address.

use hyper_util::client::legacy::connect::dns::Name;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

/// Which addresses agents may live at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Loopback, RFC 1918, CGNAT (100.64/10), unique-local (fc00::/7),
    /// site-local (fec0::/10).
    pub allow_private: bool,
    /// Link-local (169.254/16, fe80::/10) and cloud metadata endpoints.
    pub allow_link_local: bool,
    /// Private addresses allowed without `allow_private`: in these ranges,
    /// or resolved from these host names. Never link-local or metadata
    /// (that takes `allow_link_local`), never the reserved ranges.
    pub allowed: Vec<AllowedNetwork>,
}

/// One entry of `[planner] allowed_networks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedNetwork {
    /// An address range (`10.0.0.0/8`, `fd00::/8`) or one address.
    Range { network: IpAddr, prefix: u8 },
    /// Every address one host name resolves to (`agents.ns.svc.cluster.local`).
    Host(String),
    /// Every address the names under a domain resolve to
    /// (`*.svc.cluster.local`: `a.svc.cluster.local`, not the domain itself).
    Domain(String),
}

impl AllowedNetwork {
    /// Parses a CIDR, an address, a host name or `*.domain`.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("'{entry}' {why}");
        let entry_trimmed = entry.trim();
        if let Some((addr, prefix)) = entry_trimmed.split_once('/') {
            let network: IpAddr = addr
                .parse()
                .map_err(|_| bad("is not a CIDR (address/prefix)"))?;
            let max = if network.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad(&format!("has a prefix length beyond 0..={max}")))?;
            if prefix < 8 {
                return Err(bad("is wider than a /8: name the private ranges you mean"));
            }
            return Ok(Self::Range { network, prefix });
        }
        if let Ok(network) = entry_trimmed.parse::<IpAddr>() {
            let prefix = if network.is_ipv4() { 32 } else { 128 };
            return Ok(Self::Range { network, prefix });
        }
        let name = entry_trimmed.trim_end_matches('.').to_ascii_lowercase();
        let (domain, pattern) = match name.strip_prefix("*.") {
            Some(rest) => (rest, true),
            None => (name.as_str(), false),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if domain.is_empty() || domain.len() > 253 || !domain.split('.').all(label_ok) {
            return Err(bad("is not a CIDR, an address, a host name or *.domain"));
        }
        if pattern && !domain.contains('.') {
            return Err(bad("is a wildcard over a top-level domain"));
        }
        Ok(if pattern {
            Self::Domain(domain.to_owned())
        } else {
            Self::Host(domain.to_owned())
        })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let Self::Range { network, prefix } = self else {
            return false;
        };
        match (network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(*prefix)).unwrap_or(0);
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }

    fn names(&self, host: &str) -> bool {
        match self {
            Self::Range { .. } => false,
            Self::Host(h) => h == host,
            Self::Domain(d) => host
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

/// Cloud metadata endpoints outside the link-local ranges.
const METADATA_V4: [Ipv4Addr; 1] = [Ipv4Addr::new(100, 100, 100, 200)];
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// The IPv4 address in the last 32 bits of an IPv6 address.
fn low_v4(ip: Ipv6Addr) -> Ipv4Addr {
    let o = ip.octets();
    Ipv4Addr::new(o[12], o[13], o[14], o[15])
}

impl AddressPolicy {
    /// The policy of `[planner]`: the two switches and `allowed_networks`
    /// (each entry parsed, see [`AllowedNetwork::parse`]).
    pub fn new(
        allow_private: bool,
        allow_link_local: bool,
        allowed_networks: &[String],
    ) -> anyhow::Result<Self> {
        let allowed = allowed_networks
            .iter()
            .map(|e| AllowedNetwork::parse(e))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("planner.allowed_networks: {e}"))?;
        Ok(Self {
            allow_private,
            allow_link_local,
            allowed,
        })
    }

    /// `Err` names why `ip` may not be called (an IP literal, or an
    /// address of a name no host entry of the allow-list names).
    pub fn check(&self, ip: IpAddr) -> Result<(), &'static str> {
        self.check_resolved(None, ip)
    }

    /// As [`AddressPolicy::check`] for an address `host` resolved to: a
    /// host allowed by name may be private.
    pub fn check_resolved(&self, host: Option<&str>, ip: IpAddr) -> Result<(), &'static str> {
        let named = !self.allowed.is_empty()
            && host.is_some_and(|h| {
                let h = h.trim_end_matches('.').to_ascii_lowercase();
                self.allowed.iter().any(|a| a.names(&h))
            });
        match ip {
            IpAddr::V4(v4) => self.check_v4(v4, named),
            IpAddr::V6(v6) => self.check_v6(v6, named),
        }
    }

    /// A private address passes: every private address is allowed, or its
    /// name is, or its range is.
    fn private_ok(&self, ip: IpAddr, named: bool) -> Result<(), &'static str> {
        if self.allow_private || named || self.allowed.iter().any(|a| a.contains(ip)) {
            Ok(())
        } else {
            Err("a private address")
        }
    }

    fn check_v4(&self, ip: Ipv4Addr, named: bool) -> Result<(), &'static str> {
        let [a, b, c, _] = ip.octets();
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || a == 0 {
            return Err("not a unicast address");
        }
        // Never a public agent: reserved (240/4), benchmarking
        // (198.18/15), IETF protocol assignments (192.0.0/24) and the
        // documentation ranges.
        let reserved = a >= 240
            || (a == 198 && (b & 0xfe) == 18)
            || (a == 192 && b == 0 && c == 0)
            || (a == 192 && b == 0 && c == 2)
            || (a == 198 && b == 51 && c == 100)
            || (a == 203 && b == 0 && c == 113);
        if reserved {
            return Err("a reserved address");
        }
        if ip.is_link_local() || METADATA_V4.contains(&ip) {
            return if self.allow_link_local {
                Ok(())
            } else {
                Err("a link-local or cloud metadata address")
            };
        }
        let cgnat = a == 100 && (64..128).contains(&b);
        if ip.is_loopback() || ip.is_private() || cgnat {
            return self.private_ok(IpAddr::V4(ip), named);
        }
        Ok(())
    }

    fn check_v6(&self, ip: Ipv6Addr, named: bool) -> Result<(), &'static str> {
        let s = ip.segments();
        if ip.is_unspecified() || ip.is_multicast() {
            return Err("not a unicast address");
        }
        if ip.is_loopback() {
            return self.private_ok(IpAddr::V6(ip), named);
        }
        // Transition forms that carry an IPv4 address: the packets end up
        // at that address, so it is held to the IPv4 policy.
        // IPv4-mapped ::ffff:0:0/96 and IPv4-compatible ::/96 (the two
        // special cases above aside).
        if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
            return self.check_v4(low_v4(ip), named);
        }
        // IPv4-translated ::ffff:0:0:0/96 (RFC 2765).
        if s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0 {
            return self.check_v4(low_v4(ip), named);
        }
        // NAT64 well-known prefix 64:ff9b::/96 (RFC 6052).
        if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
            return self.check_v4(low_v4(ip), named);
        }
        // The rest of 64:ff9b::/32, the local-use NAT64 prefix
        // 64:ff9b:1::/48 (RFC 8215) included: where its IPv4 address sits
        // depends on a prefix length chosen by the network operator, so
        // it cannot be extracted reliably; refused outright.
        if s[0] == 0x64 && s[1] == 0xff9b {
            return Err("a NAT64 address whose IPv4 address is ambiguous");
        }
        // 6to4 2002::/16: the IPv4 address in bits 16..48.
        if s[0] == 0x2002 {
            let [a, b] = s[1].to_be_bytes();
            let [c, d] = s[2].to_be_bytes();
            return self.check_v4(Ipv4Addr::new(a, b, c, d), named);
        }
        // Teredo 2001::/32 (RFC 4380): the server's IPv4 address in bits
        // 32..64, the client's (where packets go) in the last 32 bits,
        // inverted. Both must pass.
        if s[0] == 0x2001 && s[1] == 0 {
            let [a, b] = s[2].to_be_bytes();
            let [c, d] = s[3].to_be_bytes();
            self.check_v4(Ipv4Addr::new(a, b, c, d), named)?;
            let client = u32::from(low_v4(ip)) ^ 0xffff_ffff;
            return self.check_v4(Ipv4Addr::from(client), named);
        }
        // Documentation 2001:db8::/32.
        if s[0] == 0x2001 && s[1] == 0x0db8 {
            return Err("a reserved address");
        }
        if (s[0] & 0xffc0) == 0xfe80 || METADATA_V6.contains(&ip) {
            return if self.allow_link_local {
                Ok(())
            } else {
                Err("a link-local or cloud metadata address")
            };
        }
        // Unique-local fc00::/7 and the deprecated site-local fec0::/10.
        if (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfec0 {
            return self.private_ok(IpAddr::V6(ip), named);
        }
        Ok(())
    }
}

/// A resolver that drops the addresses the policy forbids (and fails when
/// none is left), so the connector only ever dials checked addresses.
#[derive(Clone)]
pub struct PolicyResolver {
    pub(super) policy: AddressPolicy,
}

type Resolving =
    Pin<Box<dyn Future<Output = std::io::Result<std::vec::IntoIter<SocketAddr>>> + Send>>;

impl tower_service::Service<Name> for PolicyResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = Resolving;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        ResolveFailed(format!("{host}: {e}")),
                    )
                })?
                .collect();
            Ok(allowed_answers(&policy, &host, found)?.into_iter())
        })
    }
}

/// A name that did not resolve (told apart from other connect errors for
/// the logs and metrics).
#[derive(Debug)]
pub(super) struct ResolveFailed(String);

impl std::fmt::Display for ResolveFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not resolve {}", self.0)
    }
}

impl std::error::Error for ResolveFailed {}

/// The addresses of a DNS answer the policy allows; an error (of kind
/// `PermissionDenied`) when none is left.
pub(super) fn allowed_answers(
    policy: &AddressPolicy,
    host: &str,
    found: Vec<SocketAddr>,
) -> std::io::Result<Vec<SocketAddr>> {
    let allowed: Vec<SocketAddr> = found
        .iter()
        .copied()
        .filter(|a| policy.check_resolved(Some(host), a.ip()).is_ok())
        .collect();
    if allowed.is_empty() {
        let why = found
            .first()
            .and_then(|a| policy.check_resolved(Some(host), a.ip()).err())
            .unwrap_or("no address");
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{host} resolves to {why}"),
        ));
    }
    Ok(allowed)
}
