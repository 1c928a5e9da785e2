//! Which redirects a fetch follows. The init container that runs
//! `fetch-weights` often sits next to a cloud metadata service
//! (169.254.169.254) and cluster-internal services, and holds write access
//! to the weights volume, so a source (or anyone who can answer for it)
//! must not be able to send it elsewhere: a redirect may not leave https
//! for http, may not leave the configured host (the Hub's CDN and S3's
//! regional endpoints are allowed by name: `Source::redirect_hosts`, plus
//! `--allow-redirect-host`), and may not reach a loopback, private or
//! link-local address unless the original URL's host was in that range
//! itself (a test server on 127.0.0.1, a MinIO on 10.x).
//!
//! The addresses are checked when the redirect is followed, by resolving
//! its host; a name that resolves differently a moment later (DNS
//! rebinding) is not caught here. The host rule is what holds then.

use anyhow::{bail, Context};
use http::Uri;
use std::net::IpAddr;

/// The address ranges that are not the public internet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Range {
    Public,
    Loopback,
    Private,
    LinkLocal,
}

impl Range {
    fn of(ip: IpAddr) -> Range {
        match ip {
            IpAddr::V4(v4) => {
                let [a, b, ..] = v4.octets();
                if v4.is_loopback() || v4.is_unspecified() || a == 0 {
                    // 0.0.0.0 reaches the local host on Linux.
                    Range::Loopback
                } else if v4.is_link_local() {
                    Range::LinkLocal
                } else if v4.is_private() || (a == 100 && (64..128).contains(&b)) {
                    // RFC 1918 and the carrier-grade NAT block.
                    Range::Private
                } else {
                    Range::Public
                }
            }
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return Range::of(IpAddr::V4(v4));
                }
                let first = v6.segments()[0];
                if v6.is_loopback() || v6.is_unspecified() {
                    Range::Loopback
                } else if first & 0xffc0 == 0xfe80 {
                    Range::LinkLocal
                } else if first & 0xfe00 == 0xfc00 {
                    // Unique local addresses.
                    Range::Private
                } else {
                    Range::Public
                }
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Range::Public => "public",
            Range::Loopback => "loopback",
            Range::Private => "private",
            Range::LinkLocal => "link-local",
        }
    }
}

/// The rules for one fetch, taken from its original URL.
#[derive(Debug, Clone)]
pub struct RedirectPolicy {
    origin_host: String,
    /// Further hosts a redirect may go to: `name` exactly, `.suffix` for
    /// any host under it.
    allowed_hosts: Vec<String>,
    /// The non-public ranges the origin itself is in.
    origin_ranges: Vec<Range>,
}

impl RedirectPolicy {
    /// The policy of a fetch of `origin` (its host resolved now, to learn
    /// which ranges it is in).
    pub async fn for_origin(origin: &Uri, allowed_hosts: &[String]) -> Self {
        let origin_host = host_of(origin);
        let origin_ranges = match addresses(origin).await {
            Ok(ips) => ips.into_iter().map(Range::of).collect(),
            // The request itself will fail the same way; nothing private
            // is allowed on the strength of a name that did not resolve.
            Err(_) => Vec::new(),
        };
        Self {
            origin_host,
            allowed_hosts: allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty())
                .collect(),
            origin_ranges,
        }
    }

    /// Whether a redirect from `from` to `to` may be followed; the error
    /// says why not.
    pub async fn check(&self, from: &Uri, to: &Uri) -> anyhow::Result<()> {
        match (from.scheme_str(), to.scheme_str()) {
            (_, Some("https")) | (Some("http"), Some("http")) => {}
            (Some("https"), Some("http")) => {
                bail!("refusing a redirect from https to http ({})", describe(to))
            }
            _ => bail!(
                "refusing a redirect to a URL that is not http(s) ({})",
                describe(to)
            ),
        }
        let host = host_of(to);
        if !self.host_allowed(&host) {
            bail!(
                "refusing a redirect from {} to another host, {host} (allow it with --allow-redirect-host)",
                self.origin_host
            );
        }
        for ip in addresses(to).await? {
            let range = Range::of(ip);
            if range != Range::Public && !self.origin_ranges.contains(&range) {
                bail!(
                    "refusing a redirect to {host}: it resolves to {ip}, a {} address, and {} is not in that range",
                    range.name(),
                    self.origin_host
                );
            }
        }
        Ok(())
    }

    fn host_allowed(&self, host: &str) -> bool {
        host == self.origin_host
            || self
                .allowed_hosts
                .iter()
                .any(|allowed| match allowed.strip_prefix('.') {
                    Some(suffix) => {
                        host == suffix
                            || host
                                .strip_suffix(suffix)
                                .is_some_and(|head| head.ends_with('.'))
                    }
                    None => host == allowed,
                })
    }
}

/// The URL's host, lower case, without an IPv6 literal's brackets.
fn host_of(uri: &Uri) -> String {
    uri.host()
        .unwrap_or("")
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

fn describe(uri: &Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or(""),
        uri.authority().map_or("", |a| a.as_str()),
        uri.path()
    )
}

/// The addresses the URL's host stands for: itself when it is an address,
/// else what it resolves to.
async fn addresses(uri: &Uri) -> anyhow::Result<Vec<IpAddr>> {
    let host = host_of(uri);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    let found: Vec<IpAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .with_context(|| format!("resolving {host}"))?
        .map(|a| a.ip())
        .collect();
    if found.is_empty() {
        bail!("{host} resolves to no address");
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_are_classified() {
        let of = |s: &str| Range::of(s.parse().unwrap());
        assert_eq!(of("169.254.169.254"), Range::LinkLocal);
        assert_eq!(of("fe80::1"), Range::LinkLocal);
        assert_eq!(of("127.0.0.1"), Range::Loopback);
        assert_eq!(of("::1"), Range::Loopback);
        assert_eq!(of("0.0.0.0"), Range::Loopback);
        assert_eq!(of("::ffff:10.1.2.3"), Range::Private);
        assert_eq!(of("10.1.2.3"), Range::Private);
        assert_eq!(of("172.20.0.1"), Range::Private);
        assert_eq!(of("192.168.1.1"), Range::Private);
        assert_eq!(of("100.100.0.1"), Range::Private);
        assert_eq!(of("fd00::1"), Range::Private);
        assert_eq!(of("8.8.8.8"), Range::Public);
        assert_eq!(of("2606:4700::1111"), Range::Public);
    }

    #[tokio::test]
    async fn redirects_keep_their_scheme_host_and_range() {
        let public = RedirectPolicy::for_origin(
            &uri("https://8.8.8.8/m.gguf"),
            &[".hf.co".to_owned(), "cdn.example".to_owned()],
        )
        .await;
        let from = uri("https://8.8.8.8/m.gguf");
        assert!(public.check(&from, &uri("https://8.8.8.8/b")).await.is_ok());
        let e = public
            .check(&from, &uri("http://8.8.8.8/b"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("https to http"), "{e}");
        let e = public
            .check(&from, &uri("https://8.8.4.4/b"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("another host"), "{e}");
        let e = public
            .check(&from, &uri("https://169.254.169.254/latest"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("another host"), "{e}");
        assert!(public.host_allowed("cdn-lfs.hf.co"));
        assert!(public.host_allowed("hf.co"));
        assert!(!public.host_allowed("evilhf.co"));
        assert!(public.host_allowed("cdn.example"));
        assert!(!public.host_allowed("x.cdn.example"));

        // A loopback origin may be redirected within loopback, never to
        // the metadata service, even when that host is allowed by name.
        let local = RedirectPolicy::for_origin(
            &uri("http://127.0.0.1:9000/m"),
            &["169.254.169.254".to_owned(), "10.0.0.1".to_owned()],
        )
        .await;
        let from = uri("http://127.0.0.1:9000/m");
        assert!(local
            .check(&from, &uri("http://127.0.0.1:9001/cdn"))
            .await
            .is_ok());
        let e = local
            .check(&from, &uri("http://169.254.169.254/latest/meta-data"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("link-local"), "{e}");
        let e = local
            .check(&from, &uri("http://10.0.0.1/m"))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("private"), "{e}");
    }
}
