//! The agent directory: operator-managed entries (id, card address,
//! optional auth header whose value comes from a secret, enabled flag)
//! from the config file and from Redis (`gateway agents ...`), and the
//! agents' cards, fetched, validated and cached with a TTL. A broken card
//! marks its entry unhealthy for a while; it never breaks planning.
//!
//! For one request the directory resolves the request's `agents` (ids or
//! URLs) and discovers more by matching the request's words against the
//! cards' names, descriptions and skills.

use super::a2a::{self, AgentCard, Endpoint};
use super::net::{AgentHttp, NetLimits};
use crate::redis_conn::RedisHandle;
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
}

impl ResolvedAgent {
    /// What the planner's prompt says about the agent.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{}: {}",
            self.card.name,
            super::clip(&self.card.description, 300)
        );
        for skill in self.card.skills.iter().take(8) {
            s.push_str(&format!(
                "; skill {}: {}",
                skill.name,
                super::clip(&skill.description, 200)
            ));
        }
        s
    }
}

/// An address of the request that cannot be used, and why.
#[derive(Debug, Clone)]
pub struct Unusable {
    pub address: String,
    pub outcome: &'static str,
    pub reason: String,
}

struct CachedCard {
    card: Result<AgentCard, String>,
    until: Instant,
}

/// The directory, with its card cache.
pub struct Directory {
    config_entries: Vec<Entry>,
    store: Option<DirectoryStore>,
    /// Redis entries, read at most every few seconds.
    stored: Mutex<Option<(Instant, Vec<Entry>)>>,
    cards: Mutex<HashMap<String, CachedCard>>,
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

    /// An agent's card, from the cache or fetched (a failure is cached
    /// for a tenth of the TTL, at most 30 s: an unhealthy entry).
    pub async fn card(
        &self,
        address: &str,
        headers: &[(String, String)],
    ) -> Result<AgentCard, String> {
        if let Ok(cards) = self.cards.lock() {
            if let Some(c) = cards.get(address).filter(|c| c.until > Instant::now()) {
                return c.card.clone();
            }
        }
        let card = a2a::fetch_card(&self.http, address, headers, self.limits).await;
        let ttl = match &card {
            Ok(_) => self.card_ttl,
            Err(_) => (self.card_ttl / 10).min(Duration::from_secs(30)),
        };
        if let Ok(mut cards) = self.cards.lock() {
            cards.insert(
                address.to_owned(),
                CachedCard {
                    card: card.clone(),
                    until: Instant::now() + ttl,
                },
            );
        }
        card
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
                        outcome: "denied",
                        reason: "this deployment takes only directory ids in 'agents'".into(),
                    });
                    continue;
                }
                match self.card(address, &[]).await {
                    Ok(card) => {
                        // A request's URL may only lead to its own origin.
                        if a2a::origin(&card.endpoint) != a2a::origin(address) {
                            unusable.push(Unusable {
                                address: address.to_owned(),
                                outcome: "denied",
                                reason: format!(
                                    "the card's endpoint {} is on another origin than the address",
                                    card.endpoint
                                ),
                            });
                            continue;
                        }
                        let id = unique_id(&slug(&card.name), &mut ids);
                        agents.push(ResolvedAgent {
                            id,
                            directory_id: None,
                            address: address.to_owned(),
                            card,
                        });
                    }
                    Err(reason) => unusable.push(Unusable {
                        address: address.to_owned(),
                        outcome: "no_card",
                        reason,
                    }),
                }
            } else {
                match by_id.get(address) {
                    Some(e) if e.enabled => match self.card(&e.url, &e.headers()).await {
                        Ok(card) => {
                            if ids.insert(e.id.clone()) {
                                agents.push(ResolvedAgent {
                                    id: e.id.clone(),
                                    directory_id: Some(e.id.clone()),
                                    address: e.url.clone(),
                                    card,
                                });
                            }
                        }
                        Err(reason) => unusable.push(Unusable {
                            address: address.to_owned(),
                            outcome: "no_card",
                            reason,
                        }),
                    },
                    Some(_) => unusable.push(Unusable {
                        address: address.to_owned(),
                        outcome: "disabled",
                        reason: "the directory entry is disabled".into(),
                    }),
                    None => unusable.push(Unusable {
                        address: address.to_owned(),
                        outcome: "unknown",
                        reason: "not in the agent directory".into(),
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
                    .map(|e| async { self.card(&e.url, &e.headers()).await }),
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
                    });
                }
            }
        }
        (agents, unusable)
    }

    /// How to call a resolved agent (its directory auth header included).
    pub async fn endpoint(&self, agent: &ResolvedAgent) -> Endpoint {
        let headers = match &agent.directory_id {
            Some(id) => self
                .entries()
                .await
                .into_iter()
                .find(|e| &e.id == id)
                .map(|e| e.headers())
                .unwrap_or_default(),
            None => Vec::new(),
        };
        Endpoint {
            url: agent.card.endpoint.clone(),
            protocol: agent.card.protocol,
            streaming: agent.card.streaming,
            headers,
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
            enabled: true,
        };
        assert!(e.headers().is_empty());
        let stored = serde_json::to_string(&e).unwrap();
        assert!(!stored.contains("Bearer"));
    }
}
