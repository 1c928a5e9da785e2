//! An agent's card: where it is, fetching it within the network limits,
//! and parsing either version's (v1.0 `supportedInterfaces`, v0.3
//! top-level `url`) into an [`AgentCard`].

use super::{wire, Protocol};
use crate::net::{redact_url, AgentHttp, NetError, NetLimits};
use serde::{Deserialize, Serialize};

/// What the planner knows of an agent from its card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCard {
    pub name: String,
    pub description: String,
    pub skills: Vec<Skill>,
    /// The JSON-RPC endpoint.
    pub endpoint: String,
    pub protocol: Protocol,
    pub streaming: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skill {
    pub name: String,
    pub description: String,
    pub tags: Vec<String>,
}

/// Where an agent's card is: the address itself when its path names a
/// `.json` file, else the v1.0 well-known path, then (v0.3 and older)
/// `agent.json`, each under the address's path. The well-known path goes
/// into the parsed URL's path, so a query (`?token=…`) stays a query and
/// is sent with the card request rather than swallowing the path.
pub fn card_urls(address: &str) -> Vec<String> {
    let Ok(base) = url::Url::parse(address.trim()) else {
        // Not a URL: the fetch refuses it (`not an http(s) URL`).
        return vec![address.to_owned()];
    };
    let path = base.path().trim_end_matches('/');
    if path.ends_with(".json") {
        let mut url = base.clone();
        url.set_path(path);
        return vec![url.to_string()];
    }
    ["agent-card.json", "agent.json"]
        .into_iter()
        .map(|file| {
            let mut url = base.clone();
            url.set_path(&format!("{path}/.well-known/{file}"));
            url.to_string()
        })
        .collect()
}

/// Why an agent's card could not be had.
#[derive(Debug, Clone, PartialEq)]
pub enum CardError {
    Net { url: String, error: NetError },
    Http { url: String, status: u16 },
    Invalid { url: String, why: InvalidCard },
}

/// Why a fetched card cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum InvalidCard {
    /// The address gave no card URL to try.
    NoCardUrl,
    /// Not an agent card's JSON (the parser's message).
    NotACard(String),
    NoName,
    NoJsonRpcInterface,
    BadCardUrl,
    /// The interface URL is neither http(s) nor relative to the card.
    NotHttpUrl(String),
}

impl std::fmt::Display for InvalidCard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InvalidCard::NoCardUrl => f.write_str("no card URL"),
            InvalidCard::NotACard(e) => write!(f, "not an agent card: {e}"),
            InvalidCard::NoName => f.write_str("the card has no name"),
            InvalidCard::NoJsonRpcInterface => {
                f.write_str("the card declares no JSON-RPC interface of A2A 1.0 or 0.3")
            }
            InvalidCard::BadCardUrl => f.write_str("bad card URL"),
            InvalidCard::NotHttpUrl(url) => {
                write!(f, "the card's interface URL '{url}' is not an http(s) URL")
            }
        }
    }
}

impl CardError {
    /// What the caller of a request may see: network failures say only
    /// "agent unreachable" (connection refused, timed out, TLS errors
    /// would let a tenant probe hosts and ports); a refusal of the URL
    /// itself by the policy reveals nothing about the network.
    pub fn public(&self) -> String {
        match self {
            CardError::Net {
                url,
                error: e @ (NetError::Denied(_) | NetError::BadUrl(_)),
            } => format!("card {url}: {e}"),
            CardError::Net { .. } => "agent unreachable".into(),
            CardError::Http { url, status } => format!("card {url}: HTTP {status}"),
            CardError::Invalid { url, why } => format!("card {url}: {why}"),
        }
    }

    /// A bounded label for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            CardError::Net { error, .. } => error.reason(),
            CardError::Http { .. } => "http_status",
            CardError::Invalid { .. } => "invalid_card",
        }
    }
}

/// The whole detail, for the operator (logs, `gateway agents probe`).
impl std::fmt::Display for CardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CardError::Net { url, error } => write!(f, "card {url}: {error}"),
            CardError::Http { url, status } => write!(f, "card {url}: HTTP {status}"),
            CardError::Invalid { url, why } => write!(f, "card {url}: {why}"),
        }
    }
}

/// Fetches and parses an agent's card.
pub async fn fetch_card(
    http: &AgentHttp,
    address: &str,
    headers: &[(String, String)],
    limits: NetLimits,
) -> Result<AgentCard, CardError> {
    // An error names its URL redacted: errors are logged.
    let mut last = CardError::Invalid {
        url: redact_url(address),
        why: InvalidCard::NoCardUrl,
    };
    for url in card_urls(address) {
        let shown = redact_url(&url);
        let net = |error: NetError| CardError::Net {
            url: shown.clone(),
            error,
        };
        let response = http
            .send(http::Method::GET, &url, headers, None, limits)
            .await
            .map_err(net)?;
        if response.status == 404 {
            last = CardError::Http {
                url: shown,
                status: 404,
            };
            continue;
        }
        if !(200..300).contains(&response.status) {
            return Err(CardError::Http {
                url: shown,
                status: response.status,
            });
        }
        let body = response.body.all().await.map_err(net)?;
        return parse_card(&body, &url).map_err(|why| CardError::Invalid { url: shown, why });
    }
    Err(last)
}

/// Parses a card (v1.0 `supportedInterfaces`, or v0.3 top-level `url`).
pub fn parse_card(body: &[u8], card_url: &str) -> Result<AgentCard, InvalidCard> {
    let card: wire::Card =
        serde_json::from_slice(body).map_err(|e| InvalidCard::NotACard(e.to_string()))?;
    let name = card.name.trim().to_owned();
    if name.is_empty() {
        return Err(InvalidCard::NoName);
    }
    let jsonrpc = |binding: &Option<String>| {
        binding
            .as_deref()
            .is_none_or(|b| b.eq_ignore_ascii_case("JSONRPC"))
    };
    let version_of = |v: &str| {
        if v.starts_with("1.") || v == "1" {
            Some(Protocol::V1)
        } else if v.starts_with("0.3") || v.starts_with("0.2") {
            Some(Protocol::V03)
        } else {
            None
        }
    };
    let mut endpoint = None;
    // v1.0: the first JSON-RPC interface of a version we speak, 1.0 first.
    let interfaces: Vec<&wire::Interface> = card
        .supported_interfaces
        .iter()
        .chain(card.additional_interfaces.iter())
        .collect();
    for want in [Protocol::V1, Protocol::V03] {
        if endpoint.is_some() {
            break;
        }
        for i in &interfaces {
            let binding = i.protocol_binding.clone().or_else(|| i.transport.clone());
            let version = i
                .protocol_version
                .as_deref()
                .or(card.protocol_version.as_deref())
                .and_then(version_of);
            if jsonrpc(&binding) && version == Some(want) && !i.url.is_empty() {
                endpoint = Some((i.url.clone(), want));
                break;
            }
        }
    }
    // v0.3: a top-level url, JSON-RPC unless another transport is preferred.
    if endpoint.is_none() {
        if let Some(url) = card.url.as_deref().filter(|u| !u.is_empty()) {
            let version = card
                .protocol_version
                .as_deref()
                .map_or(Some(Protocol::V03), version_of);
            match version {
                Some(v) if jsonrpc(&card.preferred_transport) => {
                    endpoint = Some((url.to_owned(), v))
                }
                _ => {}
            }
        }
    }
    let (url, protocol) = endpoint.ok_or(InvalidCard::NoJsonRpcInterface)?;
    let endpoint = resolve_url(card_url, &url)?;
    Ok(AgentCard {
        name,
        description: card.description.unwrap_or_default(),
        skills: card
            .skills
            .into_iter()
            .map(|s| Skill {
                name: s.name.unwrap_or_default(),
                description: s.description.unwrap_or_default(),
                tags: s.tags,
            })
            .collect(),
        endpoint,
        protocol,
        streaming: card.capabilities.and_then(|c| c.streaming).unwrap_or(false),
    })
}

/// An endpoint URL, absolute or relative to the card's URL.
fn resolve_url(card_url: &str, url: &str) -> Result<String, InvalidCard> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(url.to_owned());
    }
    let uri: http::Uri = card_url.parse().map_err(|_| InvalidCard::BadCardUrl)?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(InvalidCard::BadCardUrl);
    };
    if url.starts_with('/') {
        Ok(format!("{scheme}://{authority}{url}"))
    } else {
        Err(InvalidCard::NotHttpUrl(redact_url(url)))
    }
}
