//! The planner's HTTP client for agents: who may be called (the address
//! policy, checked on every address a name resolves to, so a DNS answer
//! cannot smuggle in a private address), and how long and how much an
//! agent may take (connect, first byte, idle, body size).
//!
//! hyper's pooled HTTP/1.1 client (already in the tree for Kubernetes
//! discovery) over rustls with ring; no redirects are followed.

mod client;
mod policy;
mod redact;
mod sse;

pub use client::{check_url, AgentHttp, BodyReader, Response};
pub use policy::{AddressPolicy, AllowedNetwork};
pub use redact::redact_url;
pub use sse::SseReader;

use std::time::Duration;

/// Time and size limits of one agent exchange.
#[derive(Debug, Clone, Copy)]
pub struct NetLimits {
    pub first_byte: Duration,
    pub idle: Duration,
    pub max_body: usize,
}

/// Why an HTTP exchange with an agent failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetError {
    /// The address policy forbids the URL's IP literal (known before any
    /// network traffic).
    Denied(String),
    /// Every address the URL's name resolves to is forbidden.
    DeniedResolved(String),
    /// The URL is not an absolute http(s) URL.
    BadUrl(String),
    /// Connecting failed; `reason` is one of [`CONNECT_REASONS`].
    Connect {
        reason: &'static str,
        detail: String,
    },
    /// No response head within the first-byte deadline.
    FirstByte,
    /// The body went silent for longer than the idle deadline.
    Idle,
    /// The body is larger than allowed.
    TooLarge(usize),
    /// The connection broke while reading.
    Broken(String),
}

/// The bounded reasons of a failed connection (a metrics label).
pub const CONNECT_REASONS: [&str; 6] = ["refused", "timeout", "dns", "tls", "reset", "other"];

impl NetError {
    /// A bounded label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            NetError::Denied(_) => "policy",
            NetError::DeniedResolved(_) => "policy_dns",
            NetError::BadUrl(_) => "bad_url",
            NetError::Connect { reason, .. } => reason,
            NetError::FirstByte => "first_byte",
            NetError::Idle => "idle",
            NetError::TooLarge(_) => "too_large",
            NetError::Broken(_) => "broken",
        }
    }
}

impl std::fmt::Display for NetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetError::Denied(why) => write!(f, "address not allowed: {why}"),
            NetError::DeniedResolved(why) => write!(f, "address not allowed: {why}"),
            NetError::BadUrl(u) => write!(f, "not an http(s) URL: {u}"),
            NetError::Connect { reason, detail } => {
                write!(f, "could not connect ({reason}): {detail}")
            }
            NetError::FirstByte => f.write_str("no response before the first-byte deadline"),
            NetError::Idle => f.write_str("the response went silent past the idle deadline"),
            NetError::TooLarge(n) => write!(f, "the response exceeds {n} bytes"),
            NetError::Broken(e) => write!(f, "the connection broke: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::policy::{allowed_answers, PolicyResolver};
    use super::*;
    use hyper_util::client::legacy::connect::dns::Name;
    use std::net::{IpAddr, SocketAddr};

    #[test]
    fn private_link_local_and_metadata_addresses_are_denied_by_default() {
        let strict = AddressPolicy::default();
        for ok in ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"] {
            assert!(strict.check(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for denied in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "::1",
            "fd12::1",
            "169.254.169.254",
            "fe80::1",
            "100.100.100.200",
            "fd00:ec2::254",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            assert!(strict.check(denied.parse().unwrap()).is_err(), "{denied}");
        }
        let private = AddressPolicy {
            allow_private: true,
            allow_link_local: false,
            allowed: Vec::new(),
        };
        assert!(private.check("127.0.0.1".parse().unwrap()).is_ok());
        assert!(private.check("10.0.0.1".parse().unwrap()).is_ok());
        assert!(private.check("169.254.169.254".parse().unwrap()).is_err());
        assert!(private.check("fd00:ec2::254".parse().unwrap()).is_err());
        let all = AddressPolicy {
            allow_private: true,
            allow_link_local: true,
            allowed: Vec::new(),
        };
        assert!(all.check("169.254.169.254".parse().unwrap()).is_ok());
        assert!(all.check("0.0.0.0".parse().unwrap()).is_err());
    }

    /// Every IPv6 transition form that embeds an IPv4 address, and the
    /// reserved ranges: (address, allowed by the strict policy, allowed
    /// with private addresses on). An embedded address is judged as that
    /// IPv4 address would be.
    const TABLE: [(&str, bool, bool); 44] = [
        // IPv4 ranges.
        ("198.18.0.1", false, false),
        ("198.19.255.254", false, false),
        ("198.20.0.1", true, true),
        ("240.0.0.1", false, false),
        ("255.255.255.254", false, false),
        ("255.255.255.255", false, false),
        ("192.0.0.9", false, false),
        ("192.0.2.1", false, false),
        ("192.0.1.1", true, true),
        // IPv4-mapped ::ffff:0:0/96 and translated ::ffff:0:0:0/96.
        ("::ffff:10.0.0.1", false, true),
        ("::ffff:8.8.8.8", true, true),
        ("::ffff:0:10.0.0.1", false, true),
        ("::ffff:0:8.8.8.8", true, true),
        // IPv4-compatible ::/96.
        ("::10.0.0.1", false, true),
        ("::127.0.0.1", false, true),
        ("::169.254.169.254", false, false),
        ("::8.8.8.8", true, true),
        ("::0.0.0.2", false, false),
        // NAT64 64:ff9b::/96: the embedded address decides.
        ("64:ff9b::10.0.0.1", false, true),
        ("64:ff9b::127.0.0.1", false, true),
        ("64:ff9b::169.254.169.254", false, false),
        ("64:ff9b::240.0.0.1", false, false),
        ("64:ff9b::8.8.8.8", true, true),
        // Local-use NAT64 64:ff9b:1::/48 and the rest of 64:ff9b::/32:
        // refused outright (the IPv4 address's position is ambiguous).
        ("64:ff9b:1::808:808", false, false),
        ("64:ff9b:1:a00:1::", false, false),
        ("64:ff9b:0:1::808:808", false, false),
        // 6to4 2002::/16: bits 16..48.
        ("2002:a00:1::1", false, true),
        ("2002:7f00:1::1", false, true),
        ("2002:a9fe:a9fe::1", false, false),
        ("2002:c612:1::1", false, false),
        ("2002:808:808::1", true, true),
        // Teredo 2001::/32: server 8.8.8.8 or 10.0.0.1 in bits 32..64,
        // client 10.0.0.1 (f5ff:fffe inverted) or 8.8.8.8 (f7f7:f7f7).
        ("2001:0:808:808:0:0:f5ff:fffe", false, true),
        ("2001:0:a00:1:0:0:f7f7:f7f7", false, true),
        ("2001:0:808:808:0:0:5601:5601", false, false),
        ("2001:0:808:808:0:0:f7f7:f7f7", true, true),
        // Site-local fec0::/10, unique-local, link-local, documentation.
        ("fec0::1", false, true),
        ("feff::1", false, true),
        ("fd00::1", false, true),
        ("fe80::1", false, false),
        ("2001:db8::1", false, false),
        // Plain public and the special cases.
        ("2606:2800:220:1::1", true, true),
        ("::1", false, true),
        ("::", false, false),
        ("1.1.1.1", true, true),
    ];

    #[test]
    fn transition_forms_and_reserved_ranges_follow_the_ipv4_policy() {
        let strict = AddressPolicy::default();
        let private = AddressPolicy {
            allow_private: true,
            allow_link_local: false,
            allowed: Vec::new(),
        };
        for (addr, strict_ok, private_ok) in TABLE {
            let ip: IpAddr = addr.parse().unwrap_or_else(|e| panic!("{addr}: {e}"));
            assert_eq!(strict.check(ip).is_ok(), strict_ok, "strict: {addr}");
            assert_eq!(private.check(ip).is_ok(), private_ok, "private: {addr}");
            // As an IP literal of a URL.
            let url = match ip {
                IpAddr::V4(_) => format!("http://{ip}:8080/a"),
                IpAddr::V6(_) => format!("http://[{ip}]:8080/a"),
            };
            assert_eq!(check_url(&strict, &url).is_ok(), strict_ok, "url: {url}");
            // As a DNS answer (the resolver's filter).
            let answer = vec![SocketAddr::new(ip, 0)];
            let filtered = allowed_answers(&strict, "agent.example", answer);
            assert_eq!(filtered.is_ok(), strict_ok, "dns: {addr}");
            if let Err(e) = filtered {
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
            }
        }
    }

    #[test]
    fn a_dns_answer_keeps_only_its_allowed_addresses() {
        let strict = AddressPolicy::default();
        let answer: Vec<SocketAddr> = ["64:ff9b::a00:1", "2002:808:808::1", "10.0.0.1"]
            .iter()
            .map(|a| SocketAddr::new(a.parse().unwrap(), 0))
            .collect();
        let kept = allowed_answers(&strict, "mixed.example", answer).unwrap();
        assert_eq!(
            kept,
            vec![SocketAddr::new("2002:808:808::1".parse().unwrap(), 0)]
        );
    }

    #[test]
    fn urls_must_be_http_and_ip_literals_are_checked() {
        let strict = AddressPolicy::default();
        assert!(check_url(&strict, "https://agents.example.com/a").is_ok());
        assert!(matches!(
            check_url(&strict, "http://127.0.0.1:9/"),
            Err(NetError::Denied(_))
        ));
        assert!(matches!(
            check_url(&strict, "http://[::1]:9/"),
            Err(NetError::Denied(_))
        ));
        assert!(matches!(
            check_url(&strict, "http://169.254.169.254/latest/meta-data"),
            Err(NetError::Denied(_))
        ));
        assert!(matches!(
            check_url(&strict, "ftp://example.com/"),
            Err(NetError::BadUrl(_))
        ));
        assert!(matches!(
            check_url(&strict, "not a url"),
            Err(NetError::BadUrl(_))
        ));
    }

    #[tokio::test]
    async fn the_resolver_drops_forbidden_addresses() {
        use tower_service::Service;
        let mut strict = PolicyResolver {
            policy: AddressPolicy::default(),
        };
        let name: Name = "localhost".parse().unwrap();
        let e = strict.call(name.clone()).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let mut open = PolicyResolver {
            policy: AddressPolicy {
                allow_private: true,
                allow_link_local: false,
                allowed: Vec::new(),
            },
        };
        assert!(open.call(name).await.unwrap().next().is_some());
    }

    fn allowing(entries: &[&str]) -> AddressPolicy {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        AddressPolicy::new(false, false, &entries).unwrap()
    }

    #[test]
    fn allowed_networks_open_their_private_ranges_only() {
        let p = allowing(&["10.0.0.0/8", "fd00::/8", "127.0.0.1", "192.168.7.0/24"]);
        for ok in [
            "10.1.2.3",
            "fd12::1",
            "127.0.0.1",
            "192.168.7.9",
            "::ffff:10.0.0.1",
            "8.8.8.8",
        ] {
            assert!(p.check(ok.parse().unwrap()).is_ok(), "{ok}");
        }
        for denied in [
            "127.0.0.2",
            "172.16.0.1",
            "192.168.8.1",
            "fc00::1",
            "::1",
            "100.64.0.1",
        ] {
            assert_eq!(
                p.check(denied.parse().unwrap()),
                Err("a private address"),
                "{denied}"
            );
        }
        // A range over link-local, metadata or reserved addresses opens
        // none of them: those take allow_link_local, or nothing.
        let wide = allowing(&[
            "169.254.0.0/16",
            "fe80::/10",
            "100.100.100.0/24",
            "240.0.0.0/8",
            "198.18.0.0/15",
        ]);
        for denied in [
            "169.254.169.254",
            "fe80::1",
            "100.100.100.200",
            "240.0.0.1",
            "198.18.0.1",
        ] {
            assert!(wide.check(denied.parse().unwrap()).is_err(), "{denied}");
        }
        let link = AddressPolicy::new(false, true, &["10.0.0.0/8".into()]).unwrap();
        assert!(link.check("169.254.169.254".parse().unwrap()).is_ok());
        assert!(link.check("172.16.0.1".parse().unwrap()).is_err());
        // IP literals in URLs follow the same ranges.
        assert!(check_url(&p, "http://10.0.0.5:8080/a").is_ok());
        assert!(matches!(
            check_url(&p, "http://172.16.0.5/a"),
            Err(NetError::Denied(_))
        ));
    }

    #[test]
    fn allowed_host_names_open_the_private_addresses_they_resolve_to() {
        let p = allowing(&["agents.ns.svc.cluster.local", "*.svc.cluster.local"]);
        let private: IpAddr = "10.96.0.12".parse().unwrap();
        assert!(p
            .check_resolved(Some("agents.ns.svc.cluster.local"), private)
            .is_ok());
        assert!(p
            .check_resolved(Some("Search.Team.SVC.cluster.local."), private)
            .is_ok());
        assert!(p
            .check_resolved(Some("svc.cluster.local"), private)
            .is_err());
        assert!(p
            .check_resolved(Some("evil-svc.cluster.local"), private)
            .is_err());
        assert!(p
            .check_resolved(Some("agents.example.com"), private)
            .is_err());
        assert!(p.check(private).is_err(), "a literal is not a name");
        // Never link-local or reserved, whatever the name.
        for denied in ["169.254.169.254", "fd00:ec2::254", "240.0.0.1"] {
            let ip: IpAddr = denied.parse().unwrap();
            assert!(
                p.check_resolved(Some("a.svc.cluster.local"), ip).is_err(),
                "{denied}"
            );
        }
        let answer = vec![SocketAddr::new(private, 0)];
        assert!(allowed_answers(&p, "a.svc.cluster.local", answer.clone()).is_ok());
        assert_eq!(
            allowed_answers(&p, "a.example.com", answer)
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn allowed_network_entries_are_checked() {
        assert_eq!(
            AllowedNetwork::parse("10.0.0.0/8"),
            Ok(AllowedNetwork::Range {
                network: "10.0.0.0".parse().unwrap(),
                prefix: 8
            })
        );
        assert_eq!(
            AllowedNetwork::parse("*.svc.cluster.local"),
            Ok(AllowedNetwork::Domain("svc.cluster.local".into()))
        );
        assert_eq!(
            AllowedNetwork::parse("Agents.NS.svc.cluster.local."),
            Ok(AllowedNetwork::Host("agents.ns.svc.cluster.local".into()))
        );
        for bad in [
            "10.0.0.0/33",
            "fd00::/129",
            "0.0.0.0/0",
            "::/0",
            "10.0.0.0/x",
            "*.local",
            "*",
            "",
            "http://agents",
            "a..b",
            "-a.b",
            "*.*.svc",
        ] {
            assert!(AllowedNetwork::parse(bad).is_err(), "{bad}");
        }
        let e = AddressPolicy::new(false, false, &["10.0.0.0/40".into()]).unwrap_err();
        assert!(
            e.to_string()
                .contains("planner.allowed_networks: '10.0.0.0/40'"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_resolver_honours_allowed_host_names() {
        use tower_service::Service;
        let mut resolver = PolicyResolver {
            policy: allowing(&["localhost"]),
        };
        let name: Name = "localhost".parse().unwrap();
        assert!(resolver.call(name).await.unwrap().next().is_some());
    }
}
