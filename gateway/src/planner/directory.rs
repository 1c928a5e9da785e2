//! The agent directory: operator-managed entries (id, card address,
//! optional auth header whose value comes from a secret, enabled flag)
//! from the config file and from Redis (`gateway agents ...`), and the
//! agents' cards, fetched, validated and cached with a TTL. A broken card
//! marks its entry unhealthy for a while; it never breaks planning.
//!
//! Trust: an entry's auth header goes only to the origin of its URL (or
//! the hosts of its `allowed_hosts`): a card naming an endpoint elsewhere
//! makes the agent unusable. Cards are cached per entry and credential;
//! a request naming a URL gets an anonymous fetch and an entry of its
//! own, so it can neither see a card fetched with a secret nor make an
//! entry unhealthy.
//!
//! For one request the directory resolves the request's `agents` (ids or
//! URLs) and discovers more by matching the request's words against the
//! cards' names, descriptions and skills.

use super::a2a::{self, AgentCard, CardError, Endpoint};
use super::net::{AgentHttp, NetLimits};
use crate::redis::RedisHandle;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One directory entry, as configured and as stored (never the secret
/// itself: only the name of the variable that holds it).
pub use crate::config::AgentEntryConfig as Entry;

impl Entry {
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

impl Entry {
    /// The credential's identity for the card cache: a hash of the header
    /// name, the variable and its value (never the secret in clear).
    fn credential(&self) -> [u8; 32] {
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

/// Whether `s` is a valid directory id.
pub fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Directory entries in Redis: one hash, `<prefix>agents:{directory}`.
pub struct DirectoryStore {
    redis: Arc<RedisHandle>,
}

impl DirectoryStore {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self { redis }
    }

    fn key(&self) -> String {
        self.redis.key("agents", "directory", "")
    }

    pub async fn list(&self) -> anyhow::Result<Vec<Entry>> {
        let mut conn = self.redis.conn().await?;
        let all: BTreeMap<String, String> =
            redis::AsyncCommands::hgetall(&mut conn, self.key()).await?;
        Ok(all
            .values()
            .filter_map(|v| serde_json::from_str(v).ok())
            .collect())
    }

    pub async fn put(&self, entry: &Entry) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = redis::AsyncCommands::hset(
            &mut conn,
            self.key(),
            &entry.id,
            serde_json::to_string(entry)?,
        )
        .await?;
        Ok(())
    }

    pub async fn remove(&self, id: &str) -> anyhow::Result<bool> {
        let mut conn = self.redis.conn().await?;
        let n: i64 = redis::AsyncCommands::hdel(&mut conn, self.key(), id).await?;
        Ok(n > 0)
    }
}

/// An agent the planner may call in this request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResolvedAgent {
    /// The plan's name for it: the directory id, or one made from the card.
    pub id: String,
    /// The directory entry it came from (its auth header is looked up
    /// again on resume; secrets are never stored with a plan).
    pub directory_id: Option<String>,
    pub address: String,
    pub card: AgentCard,
    /// Named in the request's `agents` (not discovered): a plan consults
    /// it unless it says why not.
    #[serde(default)]
    pub named: bool,
}

impl ResolvedAgent {
    /// What the planner's prompt says about the agent.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: {}",
            self.card.name,
            super::text::clip(&self.card.description, 300)
        );
        for skill in self.card.skills.iter().take(8) {
            s.push_str(&format!(
                "; skill {}: {}",
                skill.name,
                super::text::clip(&skill.description, 200)
            ));
        }
        s
    }
}

/// An address of the request that cannot be used, and why.
#[derive(Debug, Clone)]
pub struct Unusable {
    pub address: String,
    pub why: UnusableReason,
}

/// Why an agent cannot be used for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum UnusableReason {
    /// A URL in `agents` where the deployment takes only directory ids.
    RequestUrlsOff,
    /// A request URL's card sends the planner to another origin.
    OtherOrigin {
        endpoint: String,
    },
    /// A directory card names an endpoint outside its entry's origins.
    OutsideOrigins,
    /// No usable card.
    NoCard(CardError),
    Disabled,
    /// Not in the directory.
    Unknown,
}

impl UnusableReason {
    /// The outcome label of `tool_thought` and the metrics.
    pub fn outcome(&self) -> &'static str {
        match self {
            UnusableReason::RequestUrlsOff
            | UnusableReason::OtherOrigin { .. }
            | UnusableReason::OutsideOrigins => "denied",
            UnusableReason::NoCard(_) => "no_card",
            UnusableReason::Disabled => "disabled",
            UnusableReason::Unknown => "unknown",
        }
    }

    /// What the caller may see (a card's network failure is only "agent
    /// unreachable": see [`CardError::public`]).
    pub fn public(&self) -> String {
        match self {
            UnusableReason::RequestUrlsOff => {
                "this deployment takes only directory ids in 'agents'".into()
            }
            UnusableReason::OtherOrigin { endpoint } => {
                format!("the card's endpoint {endpoint} is on another origin than the address")
            }
            UnusableReason::OutsideOrigins => {
                "the agent's card names an endpoint outside the origins configured for it".into()
            }
            UnusableReason::NoCard(e) => e.public(),
            UnusableReason::Disabled => "the directory entry is disabled".into(),
            UnusableReason::Unknown => "not in the agent directory".into(),
        }
    }
}

struct CachedCard {
    card: Result<AgentCard, CardError>,
    until: Instant,
}

/// Whose card a cache entry holds: an anonymous fetch (a request's URL),
/// or a directory entry's fetch with its credential. A request URL never
/// reads or writes an entry's card, even at the same address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum CardScope {
    Anonymous,
    Entry { id: String, credential: [u8; 32] },
}

/// Cached cards beyond which expired ones are dropped (request URLs are
/// the tenants' to choose).
const MAX_CACHED_CARDS: usize = 4096;

/// The directory, with its card cache.
pub struct Directory {
    config_entries: Vec<Entry>,
    store: Option<DirectoryStore>,
    /// Redis entries, read at most every few seconds.
    stored: Mutex<Option<(Instant, Vec<Entry>)>>,
    cards: Mutex<HashMap<(String, CardScope), CachedCard>>,
    card_ttl: Duration,
    http: Arc<AgentHttp>,
    limits: NetLimits,
    allow_request_urls: bool,
}

/// How long Redis entries are trusted before they are read again.
const ENTRIES_TTL: Duration = Duration::from_secs(5);

impl Directory {
    pub fn new(
        config_entries: Vec<Entry>,
        redis: Option<Arc<RedisHandle>>,
        card_ttl: Duration,
        http: Arc<AgentHttp>,
        limits: NetLimits,
        allow_request_urls: bool,
    ) -> Self {
        Self {
            config_entries,
            store: redis.map(DirectoryStore::new),
            stored: Mutex::new(None),
            cards: Mutex::new(HashMap::new()),
            card_ttl,
            http,
            limits,
            allow_request_urls,
        }
    }

    /// Every entry: the config's, then Redis's (which win on equal ids).
    pub async fn entries(&self) -> Vec<Entry> {
        let mut by_id: BTreeMap<String, Entry> = self
            .config_entries
            .iter()
            .map(|e| (e.id.clone(), e.clone()))
            .collect();
        if let Some(store) = &self.store {
            let cached = self.stored.lock().ok().and_then(|c| {
                c.as_ref()
                    .filter(|(t, _)| t.elapsed() < ENTRIES_TTL)
                    .map(|(_, e)| e.clone())
            });
            let stored = match cached {
                Some(e) => e,
                None => match store.list().await {
                    Ok(e) => {
                        if let Ok(mut c) = self.stored.lock() {
                            *c = Some((Instant::now(), e.clone()));
                        }
                        e
                    }
                    Err(e) => {
                        tracing::warn!("agent directory unreadable in Redis: {e:#}");
                        Vec::new()
                    }
                },
            };
            for e in stored {
                by_id.insert(e.id.clone(), e);
            }
        }
        by_id.into_values().collect()
    }

    /// A directory entry's card, fetched with its headers and cached for
    /// that entry and credential only.
    pub async fn entry_card(&self, e: &Entry) -> Result<AgentCard, CardError> {
        let scope = CardScope::Entry {
            id: e.id.clone(),
            credential: e.credential(),
        };
        self.card(&e.url, scope, &e.headers()).await
    }

    /// A request URL's card: fetched without credentials, cached apart.
    pub async fn anonymous_card(&self, address: &str) -> Result<AgentCard, CardError> {
        self.card(address, CardScope::Anonymous, &[]).await
    }

    /// An agent's card, from the cache or fetched (a failure is cached
    /// for a tenth of the TTL, at most 30 s: an unhealthy entry).
    async fn card(
        &self,
        address: &str,
        scope: CardScope,
        headers: &[(String, String)],
    ) -> Result<AgentCard, CardError> {
        let key = (address.to_owned(), scope);
        if let Ok(cards) = self.cards.lock() {
            if let Some(c) = cards.get(&key).filter(|c| c.until > Instant::now()) {
                return c.card.clone();
            }
        }
        let card = a2a::fetch_card(&self.http, address, headers, self.limits).await;
        if let Err(e) = &card {
            tracing::warn!(
                reason = e.reason(),
                "agent card unavailable (cached for a while): {e}"
            );
        }
        let ttl = match &card {
            Ok(_) => self.card_ttl,
            Err(_) => (self.card_ttl / 10).min(Duration::from_secs(30)),
        };
        if let Ok(mut cards) = self.cards.lock() {
            if cards.len() >= MAX_CACHED_CARDS {
                let now = Instant::now();
                cards.retain(|_, c| c.until > now);
            }
            if cards.len() < MAX_CACHED_CARDS {
                cards.insert(
                    key,
                    CachedCard {
                        card: card.clone(),
                        until: Instant::now() + ttl,
                    },
                );
            }
        }
        card
    }

    /// An entry's card, when its endpoint stays within the entry's
    /// origins.
    async fn usable_entry_card(&self, e: &Entry) -> Result<AgentCard, UnusableReason> {
        let card = self.entry_card(e).await.map_err(UnusableReason::NoCard)?;
        if !e.endpoint_allowed(&card.endpoint) {
            tracing::warn!(
                agent = %e.id,
                "agent card names endpoint {} outside the entry's origin {} and allowed_hosts {:?}: not called",
                card.endpoint,
                e.url,
                e.allowed_hosts
            );
            return Err(UnusableReason::OutsideOrigins);
        }
        Ok(card)
    }

    /// The agents of one request: its `agents` (directory ids or URLs),
    /// then up to `max_discovered` directory entries whose cards match
    /// `query`.
    pub async fn resolve(
        &self,
        requested: &[String],
        query: &str,
        max_discovered: usize,
    ) -> (Vec<ResolvedAgent>, Vec<Unusable>) {
        let entries = self.entries().await;
        let by_id: BTreeMap<&str, &Entry> = entries.iter().map(|e| (e.id.as_str(), e)).collect();
        let mut agents: Vec<ResolvedAgent> = Vec::new();
        let mut unusable = Vec::new();
        let mut ids = BTreeSet::new();
        for address in requested {
            let address = address.trim();
            if address.starts_with("http://") || address.starts_with("https://") {
                if !self.allow_request_urls {
                    unusable.push(Unusable {
                        address: address.to_owned(),
                        why: UnusableReason::RequestUrlsOff,
                    });
                    continue;
                }
                match self.anonymous_card(address).await {
                    Ok(card) => {
                        // A request's URL may only lead to its own origin.
                        if a2a::origin(&card.endpoint) != a2a::origin(address) {
                            unusable.push(Unusable {
                                address: address.to_owned(),
                                why: UnusableReason::OtherOrigin {
                                    endpoint: card.endpoint,
                                },
                            });
                            continue;
                        }
                        let id = unique_id(&slug(&card.name), &mut ids);
                        agents.push(ResolvedAgent {
                            id,
                            directory_id: None,
                            address: address.to_owned(),
                            card,
                            named: true,
                        });
                    }
                    Err(e) => unusable.push(Unusable {
                        address: address.to_owned(),
                        why: UnusableReason::NoCard(e),
                    }),
                }
            } else {
                match by_id.get(address) {
                    Some(e) if e.enabled => match self.usable_entry_card(e).await {
                        Ok(card) => {
                            if ids.insert(e.id.clone()) {
                                agents.push(ResolvedAgent {
                                    id: e.id.clone(),
                                    directory_id: Some(e.id.clone()),
                                    address: e.url.clone(),
                                    card,
                                    named: true,
                                });
                            }
                        }
                        Err(why) => unusable.push(Unusable {
                            address: address.to_owned(),
                            why,
                        }),
                    },
                    Some(_) => unusable.push(Unusable {
                        address: address.to_owned(),
                        why: UnusableReason::Disabled,
                    }),
                    None => unusable.push(Unusable {
                        address: address.to_owned(),
                        why: UnusableReason::Unknown,
                    }),
                }
            }
        }
        // Discovery: the enabled entries not named, ranked by matching words.
        let words = words(query);
        if max_discovered > 0 && !words.is_empty() {
            let candidates: Vec<&Entry> = entries
                .iter()
                .filter(|e| e.enabled && !ids.contains(&e.id))
                .take(64)
                .collect();
            let cards = futures::future::join_all(
                candidates
                    .iter()
                    .map(|e| async { self.usable_entry_card(e).await }),
            )
            .await;
            let mut scored: Vec<(usize, &Entry, AgentCard)> = candidates
                .into_iter()
                .zip(cards)
                .filter_map(|(e, c)| c.ok().map(|c| (e, c)))
                .map(|(e, c)| (score(&words, &c), e, c))
                .filter(|(s, _, _)| *s > 0)
                .collect();
            scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
            for (_, e, card) in scored.into_iter().take(max_discovered) {
                if ids.insert(e.id.clone()) {
                    agents.push(ResolvedAgent {
                        id: e.id.clone(),
                        directory_id: Some(e.id.clone()),
                        address: e.url.clone(),
                        card,
                        named: false,
                    });
                }
            }
        }
        (agents, unusable)
    }

    /// How to call a resolved agent (its directory auth header included).
    /// The entry's origins are checked again here (a paused plan resumes
    /// with the card it stored, and the entry may have changed since): an
    /// endpoint outside them gets no headers and refuses every call.
    pub async fn endpoint(&self, agent: &ResolvedAgent) -> Endpoint {
        let mut refused = None;
        let headers = match &agent.directory_id {
            Some(id) => match self.entries().await.into_iter().find(|e| &e.id == id) {
                Some(e) if e.endpoint_allowed(&agent.card.endpoint) => e.headers(),
                Some(e) => {
                    tracing::warn!(
                        agent = %e.id,
                        "agent endpoint {} is outside the entry's origin {} and allowed_hosts {:?}: not called",
                        agent.card.endpoint,
                        e.url,
                        e.allowed_hosts
                    );
                    refused = Some(
                        "the agent's card names an endpoint outside the origins configured for it"
                            .to_owned(),
                    );
                    Vec::new()
                }
                None => Vec::new(),
            },
            None => Vec::new(),
        };
        Endpoint {
            url: agent.card.endpoint.clone(),
            protocol: agent.card.protocol,
            streaming: agent.card.streaming,
            headers,
            refused,
        }
    }
}

/// A plan id from a card's name: lowercase letters, digits and dashes.
pub fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') && !s.is_empty() {
            s.push('-');
        }
        if s.len() >= 40 {
            break;
        }
    }
    let s = s.trim_end_matches('-').to_owned();
    if s.is_empty() {
        "agent".into()
    } else {
        s
    }
}

fn unique_id(base: &str, taken: &mut BTreeSet<String>) -> String {
    let mut id = base.to_owned();
    let mut n = 2;
    while taken.contains(&id) {
        id = format!("{base}-{n}");
        n += 1;
    }
    taken.insert(id.clone());
    id
}

const STOPWORDS: [&str; 24] = [
    "the",
    "and",
    "for",
    "with",
    "that",
    "this",
    "what",
    "please",
    "from",
    "into",
    "about",
    "your",
    "you",
    "are",
    "can",
    "will",
    "how",
    "give",
    "get",
    "tell",
    "use",
    "all",
    "then",
    "synthetic",
];

/// The distinct content words of a text.
fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 3 && !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// How many of the request's words the card mentions.
fn score(query: &BTreeSet<String>, card: &AgentCard) -> usize {
    let mut text = format!("{} {}", card.name, card.description);
    for s in &card.skills {
        text.push(' ');
        text.push_str(&s.name);
        text.push(' ');
        text.push_str(&s.description);
        for t in &s.tags {
            text.push(' ');
            text.push_str(t);
        }
    }
    let card_words = words(&text);
    query.intersection(&card_words).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::a2a::{Protocol, Skill};

    fn card(name: &str, description: &str, tags: &[&str]) -> AgentCard {
        AgentCard {
            name: name.into(),
            description: description.into(),
            skills: vec![Skill {
                name: "s".into(),
                description: String::new(),
                tags: tags.iter().map(|t| t.to_string()).collect(),
            }],
            endpoint: "https://a/rpc".into(),
            protocol: Protocol::V1,
            streaming: false,
        }
    }

    #[test]
    fn discovery_scores_by_shared_words() {
        let q = words("What is the weather forecast in Paris tomorrow?");
        assert_eq!(
            score(&q, &card("Weather", "Daily forecast by city", &["weather"])),
            2
        );
        assert_eq!(score(&q, &card("News", "Headlines", &["politics"])), 0);
    }

    #[test]
    fn slugs_and_ids() {
        assert_eq!(slug("Weather Agent (v2)"), "weather-agent-v2");
        assert_eq!(slug("!!!"), "agent");
        let mut taken = BTreeSet::new();
        assert_eq!(unique_id("a", &mut taken), "a");
        assert_eq!(unique_id("a", &mut taken), "a-2");
        assert!(valid_id("weather.v2_eu-1"));
        assert!(!valid_id("has space"));
        assert!(!valid_id(""));
    }

    #[test]
    fn auth_headers_come_from_the_environment_only() {
        let e = Entry {
            id: "x".into(),
            url: "https://a".into(),
            auth_header: Some("authorization".into()),
            auth_secret_env: Some("IGW_TEST_AGENT_SECRET_THAT_IS_UNSET".into()),
            allowed_hosts: Vec::new(),
            enabled: true,
        };
        assert!(e.headers().is_empty());
        let stored = serde_json::to_string(&e).unwrap();
        assert!(!stored.contains("Bearer"));
        // Entries stored before `allowed_hosts` existed still read.
        assert!(!stored.contains("allowed_hosts"), "{stored}");
        let old: Entry = serde_json::from_str(
            r#"{"id":"x","url":"https://a","auth_header":null,"auth_secret_env":null,"enabled":true}"#,
        )
        .unwrap();
        assert!(old.allowed_hosts.is_empty());
    }

    fn entry(url: &str, allowed: &[&str]) -> Entry {
        Entry {
            id: "e".into(),
            url: url.into(),
            auth_header: None,
            auth_secret_env: None,
            allowed_hosts: allowed.iter().map(|h| h.to_string()).collect(),
            enabled: true,
        }
    }

    #[test]
    fn a_directory_card_may_only_name_its_own_origin_or_allowed_hosts() {
        let own = entry("https://agents.example.com/weather", &[]);
        for ok in [
            "https://agents.example.com/rpc",
            "https://AGENTS.example.com:443/other/path",
        ] {
            assert!(own.endpoint_allowed(ok), "{ok}");
        }
        for refused in [
            "https://evil.example.net/rpc",
            "http://agents.example.com/rpc",
            "https://agents.example.com:8443/rpc",
            "https://agents.example.com.evil.net/rpc",
            "not a url",
        ] {
            assert!(!own.endpoint_allowed(refused), "{refused}");
        }
        let listed = entry(
            "https://agents.example.com",
            &["rpc.example.com", "10.1.2.3:8443", "[2001:db8::1]:9000"],
        );
        for ok in [
            "https://rpc.example.com/a",
            "https://rpc.example.com:9443/a",
            "https://10.1.2.3:8443/rpc",
            "https://[2001:db8::1]:9000/rpc",
        ] {
            assert!(listed.endpoint_allowed(ok), "{ok}");
        }
        for refused in [
            // No downgrade to http from an https entry.
            "http://rpc.example.com/a",
            "https://10.1.2.3:8444/rpc",
            "https://other.example.com/a",
            "https://[2001:db8::1]:9001/rpc",
        ] {
            assert!(!listed.endpoint_allowed(refused), "{refused}");
        }
        for (host, ok) in [
            ("rpc.example.com", true),
            ("rpc.example.com:8443", true),
            ("[2001:db8::1]:9000", true),
            ("https://rpc.example.com", false),
            ("rpc.example.com/path", false),
            ("user@rpc.example.com", false),
            ("", false),
        ] {
            assert_eq!(crate::config::valid_allowed_host(host), ok, "{host}");
        }
        // An http entry may list http hosts.
        let plain = entry("http://127.0.0.1:7000", &["127.0.0.1"]);
        assert!(plain.endpoint_allowed("http://127.0.0.1:7001/rpc"));
        assert!(!plain.endpoint_allowed("http://127.0.0.2:7001/rpc"));
    }

    fn directory() -> Directory {
        let http = AgentHttp::new(
            super::super::net::AddressPolicy::default(),
            Duration::from_millis(200),
        )
        .unwrap();
        Directory::new(
            Vec::new(),
            None,
            Duration::from_secs(300),
            Arc::new(http),
            NetLimits {
                first_byte: Duration::from_millis(200),
                idle: Duration::from_millis(200),
                max_body: 1024,
            },
            true,
        )
    }

    #[tokio::test]
    async fn the_card_cache_is_keyed_by_entry_and_credential_not_by_url_alone() {
        // Loopback is refused by the strict policy: a fetch fails at once,
        // without traffic.
        let url = "http://127.0.0.1:9";
        let secret_var = "IGW_TEST_DIRECTORY_CACHE_SECRET";
        std::env::set_var(secret_var, "Bearer one");
        let mut e = entry(url, &[]);
        e.auth_header = Some("authorization".into());
        e.auth_secret_env = Some(secret_var.into());
        let d = directory();
        // The card as fetched with the entry's secret.
        let authenticated = card("Protected", "Fetched with the secret", &[]);
        let scope = CardScope::Entry {
            id: e.id.clone(),
            credential: e.credential(),
        };
        d.cards.lock().unwrap().insert(
            (url.to_owned(), scope.clone()),
            CachedCard {
                card: Ok(authenticated.clone()),
                until: Instant::now() + Duration::from_secs(60),
            },
        );
        // A request naming the URL is not served the authenticated card...
        assert!(d.anonymous_card(url).await.is_err());
        // ...and its failure, now cached, does not disable the entry.
        assert!(d.anonymous_card(url).await.is_err());
        assert_eq!(d.entry_card(&e).await.unwrap(), authenticated);
        // Another credential is another key (a rotated secret refetches).
        std::env::set_var(secret_var, "Bearer two");
        assert_ne!(
            e.credential(),
            match &scope {
                CardScope::Entry { credential, .. } => *credential,
                CardScope::Anonymous => unreachable!(),
            }
        );
        assert!(d.entry_card(&e).await.is_err());
        // Keys never hold the secret in clear.
        let keys = format!("{:?}", d.cards.lock().unwrap().keys().collect::<Vec<_>>());
        assert!(!keys.contains("Bearer"), "{keys}");
        std::env::remove_var(secret_var);
    }
}
