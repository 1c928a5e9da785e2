//! The planner's HTTP client for agents: who may be called (the address
//! policy, checked on every address a name resolves to, so a DNS answer
//! cannot smuggle in a private address), and how long and how much an
//! agent may take (connect, first byte, idle, body size).
//!
//! hyper's pooled HTTP/1.1 client (already in the tree for Kubernetes
//! discovery) over rustls with ring; no redirects are followed.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

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
    policy: AddressPolicy,
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
struct ResolveFailed(String);

impl std::fmt::Display for ResolveFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "could not resolve {}", self.0)
    }
}

impl std::error::Error for ResolveFailed {}

/// The addresses of a DNS answer the policy allows; an error (of kind
/// `PermissionDenied`) when none is left.
fn allowed_answers(
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

type Connector = hyper_rustls::HttpsConnector<HttpConnector<PolicyResolver>>;
type Client = hyper_util::client::legacy::Client<Connector, http_body_util::Full<Bytes>>;

/// The agents' HTTP client.
pub struct AgentHttp {
    client: Client,
    policy: AddressPolicy,
}

/// A response head, with its body still to read.
pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub body: BodyReader,
}

impl AgentHttp {
    pub fn new(policy: AddressPolicy, connect_timeout: Duration) -> anyhow::Result<Self> {
        let mut http = HttpConnector::new_with_resolver(PolicyResolver {
            policy: policy.clone(),
        });
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let roots = crate::tls::native_roots().unwrap_or_else(|_| rustls::RootCertStore::empty());
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::tls::client_config(roots)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(8)
                .build(connector);
        Ok(Self { client, policy })
    }

    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// Checks a URL before it is called: http(s), and an IP literal host
    /// must pass the policy (names are checked as they resolve).
    pub fn check_url(&self, url: &str) -> Result<http::Uri, NetError> {
        check_url(&self.policy, url)
    }

    /// Sends a request and waits for its head (the first-byte deadline).
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(String, String)],
        body: Option<Vec<u8>>,
        limits: NetLimits,
    ) -> Result<Response, NetError> {
        let uri = self.check_url(url)?;
        let mut request = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(http_body_util::Full::new(Bytes::from(
                body.unwrap_or_default(),
            )))
            .map_err(|e| NetError::BadUrl(e.to_string()))?;
        let response = tokio::time::timeout(limits.first_byte, self.client.request(request))
            .await
            .map_err(|_| NetError::FirstByte)?
            .map_err(|e| connect_error(&e))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        Ok(Response {
            status,
            content_type,
            body: BodyReader {
                body: response.into_body(),
                idle: limits.idle,
                max: limits.max_body,
                read: 0,
            },
        })
    }
}

/// The policy's check of a URL (see [`AgentHttp::check_url`]).
pub fn check_url(policy: &AddressPolicy, url: &str) -> Result<http::Uri, NetError> {
    let uri: http::Uri = url.parse().map_err(|_| NetError::BadUrl(url.to_owned()))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(NetError::BadUrl(url.to_owned())),
    }
    let host = uri.host().ok_or_else(|| NetError::BadUrl(url.to_owned()))?;
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        policy
            .check(ip)
            .map_err(|why| NetError::Denied(format!("{ip} is {why}")))?;
    }
    Ok(uri)
}

/// The error of a request that got no response: a policy refusal from the
/// resolver, or a connection failure with its reason.
fn connect_error(e: &hyper_util::client::legacy::Error) -> NetError {
    let mut text = e.to_string();
    let mut reason = "other";
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = s.to_string();
        if s.downcast_ref::<rustls::Error>().is_some() {
            reason = "tls";
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let inner = io.get_ref();
            if inner.is_some_and(|i| i.downcast_ref::<ResolveFailed>().is_some()) {
                reason = "dns";
            } else if inner.is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some()) {
                reason = "tls";
            } else {
                match io.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        return NetError::DeniedResolved(io.to_string())
                    }
                    std::io::ErrorKind::ConnectionRefused => reason = "refused",
                    std::io::ErrorKind::TimedOut => reason = "timeout",
                    std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof => reason = "reset",
                    _ => {}
                }
            }
        }
        source = s.source();
    }
    if reason == "other" && text.to_ascii_lowercase().contains("timed out") {
        reason = "timeout";
    }
    NetError::Connect {
        reason,
        detail: text,
    }
}

/// A response body read under the idle deadline and the size cap.
pub struct BodyReader {
    body: hyper::body::Incoming,
    idle: Duration,
    max: usize,
    read: usize,
}

impl BodyReader {
    /// The next chunk of data; `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, NetError> {
        loop {
            let frame = tokio::time::timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| NetError::Idle)?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(NetError::Broken(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.read += data.len();
                        if self.read > self.max {
                            return Err(NetError::TooLarge(self.max));
                        }
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The whole body.
    pub async fn all(mut self) -> Result<Bytes, NetError> {
        let mut out = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }

    /// Reads the body as server-sent events.
    pub fn events(self) -> SseReader {
        SseReader {
            body: self,
            buf: Vec::new(),
            done: false,
        }
    }
}

/// Server-sent events of a body: the `data` of each event.
pub struct SseReader {
    body: BodyReader,
    buf: Vec<u8>,
    done: bool,
}

impl SseReader {
    /// The next event's data (its `data:` lines joined); `None` at the end.
    pub async fn next(&mut self) -> Result<Option<String>, NetError> {
        loop {
            if let Some(event) = take_event(&mut self.buf) {
                if let Some(data) = event_data(&event) {
                    return Ok(Some(data));
                }
                continue;
            }
            if self.done {
                return Ok(None);
            }
            match self.body.chunk().await? {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => {
                    self.done = true;
                    // A last event without its blank line still counts.
                    if !self.buf.is_empty() {
                        self.buf.extend_from_slice(b"\n\n");
                    }
                }
            }
        }
    }
}

/// Removes the first complete event (up to a blank line) from `buf`.
fn take_event(buf: &mut Vec<u8>) -> Option<String> {
    let normalized_end = |b: &[u8]| -> Option<(usize, usize)> {
        for i in 0..b.len() {
            if b[i..].starts_with(b"\n\n") {
                return Some((i, 2));
            }
            if b[i..].starts_with(b"\r\n\r\n") {
                return Some((i, 4));
            }
        }
        None
    };
    let (at, sep) = normalized_end(buf)?;
    let event: Vec<u8> = buf.drain(..at + sep).collect();
    Some(String::from_utf8_lossy(&event[..at]).into_owned())
}

/// The `data` of one event, or `None` for an event without data (a
/// comment or keep-alive).
fn event_data(event: &str) -> Option<String> {
    let mut data: Option<String> = None;
    for line in event.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            let rest = rest.strip_prefix(' ').unwrap_or(rest);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(rest);
                }
                None => data = Some(rest.to_owned()),
            }
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sse_events_split_on_blank_lines_and_join_data_lines() {
        let mut buf =
            b": keep-alive\n\ndata: {\"a\":1}\n\ndata: x\ndata: y\r\n\r\npartial".to_vec();
        let e1 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e1), None);
        let e2 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e2).as_deref(), Some("{\"a\":1}"));
        let e3 = take_event(&mut buf).unwrap();
        assert_eq!(event_data(&e3).as_deref(), Some("x\ny"));
        assert!(take_event(&mut buf).is_none());
        assert_eq!(buf, b"partial");
    }
}
