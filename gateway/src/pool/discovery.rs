//! Where a pool's workers are: static addresses, or DNS names re-resolved
//! periodically (a Kubernetes headless Service answers with one A record per
//! ready pod, so scale-ups and restarts show up without a gateway restart).

use std::net::ToSocketAddrs;

/// One configured worker address.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// `host:port` or `http://host:port`: one worker.
    Static(String),
    /// `dns://name:port`: every address the name resolves to.
    Dns(String),
}

impl Target {
    pub fn parse(addr: &str) -> Target {
        match addr.strip_prefix("dns://") {
            Some(name) => Target::Dns(name.trim_end_matches('/').to_owned()),
            None => Target::Static(addr.to_owned()),
        }
    }
}

/// The worker addresses `targets` stand for right now, or `None` when a
/// name failed to resolve. A failed lookup (a DNS server restarting, a
/// timeout) says nothing about the workers, so the caller keeps the members
/// it has rather than emptying the pool; workers that are really gone fail
/// their health checks and leave selection that way.
pub async fn resolve(targets: &[Target]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for t in targets {
        match t {
            Target::Static(a) => out.push(a.clone()),
            Target::Dns(name) => match tokio::net::lookup_host(name.as_str()).await {
                Ok(addrs) => out.extend(addrs.map(|a| a.to_string())),
                Err(e) => {
                    tracing::warn!(name = %name, "worker DNS lookup failed; keeping the current members: {e}");
                    return None;
                }
            },
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// The same, blocking: used once at startup, before any runtime exists.
pub fn resolve_blocking(targets: &[Target]) -> Vec<String> {
    let mut out = Vec::new();
    for t in targets {
        match t {
            Target::Static(a) => out.push(a.clone()),
            Target::Dns(name) => match name.to_socket_addrs() {
                Ok(addrs) => out.extend(addrs.map(|a| a.to_string())),
                Err(e) => tracing::warn!(name = %name, "worker DNS lookup failed: {e}"),
            },
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_static_and_dns_targets() {
        assert_eq!(
            Target::parse("127.0.0.1:5"),
            Target::Static("127.0.0.1:5".into())
        );
        assert_eq!(
            Target::parse("dns://worker-base.inference.svc:50051"),
            Target::Dns("worker-base.inference.svc:50051".into())
        );
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_the_members_and_a_good_one_replaces_them() {
        // No port: the lookup fails at once, without the network.
        assert_eq!(
            resolve(&[
                Target::Static("127.0.0.1:5".into()),
                Target::Dns("localhost".into())
            ])
            .await,
            None
        );
        let members = resolve(&[
            Target::Static("127.0.0.1:5".into()),
            Target::Dns("localhost:50051".into()),
        ])
        .await
        .expect("resolves");
        assert!(members.contains(&"127.0.0.1:5".to_string()), "{members:?}");
        assert!(members.len() >= 2, "{members:?}");
    }

    #[test]
    fn localhost_resolves_to_loopback_addresses() {
        let addrs = resolve_blocking(&[Target::Dns("localhost:50051".into())]);
        assert!(
            addrs
                .iter()
                .any(|a| a == "127.0.0.1:50051" || a == "[::1]:50051"),
            "{addrs:?}"
        );
    }
}
