//! The agent directory: operator-managed entries (id, card address,
//! optional auth header whose value comes from a secret, enabled flag)
//! from the config file and from the host's store (`gateway agents ...`), and the
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

mod discovery;
mod entry;

pub use discovery::slug;
pub use entry::{same_origin, valid_allowed_host, valid_id, AgentEntry};

use crate::a2a::{AgentCard, CardError, Endpoint};
use crate::net::{redact_url, AgentHttp, NetLimits};
use crate::ports::DirectoryStore;
use discovery::{score, unique_id, words};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
            crate::text::clip(&self.card.description, 300)
        );
        for skill in self.card.skills.iter().take(8) {
            s.push_str(&format!(
                "; skill {}: {}",
                skill.name,
                crate::text::clip(&skill.description, 200)
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
    config_entries: Vec<AgentEntry>,
    store: Option<Arc<dyn DirectoryStore>>,
    /// Stored entries, read at most every few seconds.
    stored: Mutex<Option<(Instant, Vec<AgentEntry>)>>,
    cards: Mutex<HashMap<(String, CardScope), CachedCard>>,
    card_ttl: Duration,
    http: Arc<AgentHttp>,
    limits: NetLimits,
    allow_request_urls: bool,
}

/// How long stored entries are trusted before they are read again.
const ENTRIES_TTL: Duration = Duration::from_secs(5);

impl Directory {
    pub fn new(
        config_entries: Vec<AgentEntry>,
        store: Option<Arc<dyn DirectoryStore>>,
        card_ttl: Duration,
        http: Arc<AgentHttp>,
        limits: NetLimits,
        allow_request_urls: bool,
    ) -> Self {
        Self {
            config_entries,
            store,
            stored: Mutex::new(None),
            cards: Mutex::new(HashMap::new()),
            card_ttl,
            http,
            limits,
            allow_request_urls,
        }
    }

    /// Every entry: the config's, then the stored ones (which win on equal
    /// ids).
    pub async fn entries(&self) -> Vec<AgentEntry> {
        let mut by_id: BTreeMap<String, AgentEntry> = self
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
                    Ok(stored) => {
                        let e: Vec<AgentEntry> = stored
                            .iter()
                            .filter_map(|v| serde_json::from_str(v).ok())
                            .collect();
                        if let Ok(mut c) = self.stored.lock() {
                            *c = Some((Instant::now(), e.clone()));
                        }
                        e
                    }
                    Err(e) => {
                        tracing::warn!("agent directory unreadable in its store: {e}");
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
    pub async fn entry_card(&self, e: &AgentEntry) -> Result<AgentCard, CardError> {
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
        let card = crate::a2a::fetch_card(&self.http, address, headers, self.limits).await;
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
    async fn usable_entry_card(&self, e: &AgentEntry) -> Result<AgentCard, UnusableReason> {
        let card = self.entry_card(e).await.map_err(UnusableReason::NoCard)?;
        if !e.endpoint_allowed(&card.endpoint) {
            tracing::warn!(
                agent = %e.id,
                "agent card names endpoint {} outside the entry's origin {} and allowed_hosts {:?}: not called",
                redact_url(&card.endpoint),
                redact_url(&e.url),
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
        let by_id: BTreeMap<&str, &AgentEntry> =
            entries.iter().map(|e| (e.id.as_str(), e)).collect();
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
                        if !same_origin(&card.endpoint, address) {
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
            let candidates: Vec<&AgentEntry> = entries
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
            let mut scored: Vec<(usize, &AgentEntry, AgentCard)> = candidates
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
                        redact_url(&agent.card.endpoint),
                        redact_url(&e.url),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::a2a::{Protocol, Skill};

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
        let e = AgentEntry {
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
        let old: AgentEntry = serde_json::from_str(
            r#"{"id":"x","url":"https://a","auth_header":null,"auth_secret_env":null,"enabled":true}"#,
        )
        .unwrap();
        assert!(old.allowed_hosts.is_empty());
    }

    fn entry(url: &str, allowed: &[&str]) -> AgentEntry {
        AgentEntry {
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
            assert_eq!(valid_allowed_host(host), ok, "{host}");
        }
        // An http entry may list http hosts.
        let plain = entry("http://127.0.0.1:7000", &["127.0.0.1"]);
        assert!(plain.endpoint_allowed("http://127.0.0.1:7001/rpc"));
        assert!(!plain.endpoint_allowed("http://127.0.0.2:7001/rpc"));
    }

    fn directory() -> Directory {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let http = AgentHttp::new(
            crate::net::AddressPolicy::default(),
            tls,
            Duration::from_millis(200),
        );
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
    async fn a_failed_card_is_logged_without_the_url_s_credentials() {
        // Loopback is refused by the strict policy: no traffic.
        let d = directory();
        let e = d
            .anonymous_card("http://bob:pw@127.0.0.1:9/a?token=sekrit")
            .await
            .unwrap_err();
        // What the WARN line prints, and what the caller is told.
        for shown in [e.to_string(), e.public()] {
            assert!(shown.contains("http://***@127.0.0.1:9/a/"), "{shown}");
            assert!(
                !shown.contains("pw") && !shown.contains("sekrit"),
                "{shown}"
            );
        }
        let e = d
            .anonymous_card("ftp://bob:pw@h/?token=sekrit")
            .await
            .unwrap_err();
        let shown = e.to_string();
        assert!(
            !shown.contains("pw") && !shown.contains("sekrit"),
            "{shown}"
        );
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
