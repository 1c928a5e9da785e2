//! A directory entry and its rules: which ids are valid, which hosts an
//! entry may allow, and which endpoints its credentials may go to (one
//! origin rule for entries and for a request's URLs).

use serde::{Deserialize, Serialize};

/// One agent of the directory, as configured (`[[planner.agents]]`) and as
/// stored (`gateway agents`): one shape wherever it comes from, never the
/// secret itself (only the name of the variable that holds it).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// Directory id (`[A-Za-z0-9._-]`, at most 64): what `agents` may name.
    pub id: String,
    /// The agent's base URL (its card at `/.well-known/agent-card.json`)
    /// or the card's own URL.
    pub url: String,
    /// A header sent on every call to the agent (e.g. `authorization`)...
    #[serde(default)]
    pub auth_header: Option<String>,
    /// ...whose value is read from this environment variable (a secret),
    /// never from the file or Redis.
    #[serde(default)]
    pub auth_secret_env: Option<String>,
    /// Hosts (`host` for any port, or `host:port`) besides the URL's own
    /// origin that the agent's card may name as its endpoint. Empty: the
    /// card must stay on the URL's origin (scheme, host and port), so the
    /// auth header never goes to a host the operator did not name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    #[serde(default = "default_true")]
    pub enabled: bool,
}

/// Whether `s` is a host (`name`, `1.2.3.4`, `[::1]`) with an optional
/// `:port`: what `allowed_hosts` takes.
pub fn valid_allowed_host(s: &str) -> bool {
    let Ok(authority) = s.parse::<http::uri::Authority>() else {
        return false;
    };
    !s.is_empty() && !s.contains('@') && authority.as_str() == s && !authority.host().is_empty()
}

fn default_true() -> bool {
    true
}

impl AgentEntry {
    /// The headers of every call: the auth header, its value read from the
    /// secret's environment variable (absent variable: no header).
    pub fn headers(&self) -> Vec<(String, String)> {
        match (&self.auth_header, &self.auth_secret_env) {
            (Some(name), Some(var)) => std::env::var(var)
                .ok()
                .map(|v| vec![(name.clone(), v)])
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

impl AgentEntry {
    /// The credential's identity for the card cache: a hash of the header
    /// name, the variable and its value (never the secret in clear).
    pub(crate) fn credential(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for (name, value) in self.headers() {
            h.update(name.as_bytes());
            h.update([0]);
            h.update(value.as_bytes());
            h.update([0]);
        }
        h.update(self.auth_secret_env.as_deref().unwrap_or("").as_bytes());
        h.finalize().into()
    }

    /// Whether a card's endpoint may be called with this entry's headers:
    /// on the URL's origin, or on one of `allowed_hosts` (and then over
    /// https, or http only when the URL itself is http).
    pub fn endpoint_allowed(&self, endpoint: &str) -> bool {
        let (Some(own), Some(to)) = (origin_of(&self.url), origin_of(endpoint)) else {
            return false;
        };
        if own == to {
            return true;
        }
        if !(to.scheme == "https" || to.scheme == own.scheme) {
            return false;
        }
        self.allowed_hosts.iter().any(|allowed| {
            let allowed = allowed.to_ascii_lowercase();
            match allowed.parse::<http::uri::Authority>() {
                Ok(a) => host_of(a.host()) == to.host && a.port_u16().is_none_or(|p| p == to.port),
                Err(_) => false,
            }
        })
    }
}

/// An origin compared as the browser does: scheme, host, port (defaults
/// filled in).
#[derive(Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

fn host_of(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// Whether two URLs share an origin (a request's URL may only lead to its
/// own origin).
pub fn same_origin(a: &str, b: &str) -> bool {
    matches!((origin_of(a), origin_of(b)), (Some(a), Some(b)) if a == b)
}

fn origin_of(url: &str) -> Option<Origin> {
    let uri: http::Uri = url.parse().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    Some(Origin {
        port: uri.port_u16().unwrap_or(default),
        host: host_of(uri.host()?),
        scheme,
    })
}

/// Whether `s` is a directory id: 1 to 64 of `A-Z a-z 0-9 . _ -` (the
/// config's entries, `gateway agents`, and a request's `agents`).
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}
