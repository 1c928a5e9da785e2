//! Resolving a bearer key to its [`Account`], with a short-lived cache.
//!
//! A warm lookup is one sha256 and one hash-map read. Entries (including
//! "unknown key") live for `limits.key_cache_ttl_ms`; `keys revoke`, `orgs
//! block` and `plans set` also publish an invalidation that
//! [`Accounts::listen_for_invalidations`] applies at once on every replica,
//! so the TTL only bounds a message lost while a replica was disconnected
//! (the listener clears the whole cache when it reconnects).

use super::store::{AccountStore, KeyRecord};
use super::RatePlan;
use super::{Account, AccountError, OrgStatus, Scopes};
use crate::auth::{bearer_token, hash_key, Principal};
use crate::config::{Config, OnStoreFailure};
use crate::redis::RedisHandle;
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Most cached digests; past it the cache is emptied (a flood of random
/// keys must not grow memory without bound).
const MAX_ENTRIES: usize = 100_000;

struct Entry {
    /// `None`: the key is unknown or revoked (cached too).
    account: Option<Arc<Account>>,
    fetched: Instant,
}

/// The key store the request path sees: config keys plus, with Redis, the
/// keys created by `gateway keys create`.
pub struct Accounts {
    static_keys: HashMap<[u8; 32], KeyRecord>,
    store: Option<AccountStore>,
    cache: RwLock<HashMap<[u8; 32], Entry>>,
    ttl: Duration,
    plans: BTreeMap<String, RatePlan>,
    default_plan: String,
    orgs: BTreeMap<String, OrgStatus>,
    policy: OnStoreFailure,
    /// After a Redis failure, lookups skip Redis until this instant, so an
    /// outage costs one timeout per second rather than one per request.
    redis_down_until: RwLock<Option<Instant>>,
    /// Every invalidation applied, for holders of a key's rights beyond
    /// one request (an open WebSocket re-checks its key on each).
    changes: broadcast::Sender<Invalidation>,
}

/// A change to the keys, organisations or plans: one key's digest, or
/// any (`orgs block`, `orgs budget`, `plans set`, a resubscription).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalidation {
    Key([u8; 32]),
    All,
}

/// Invalidations kept for a slow holder; one that falls further behind
/// sees [`broadcast::error::RecvError::Lagged`], to be taken as `All`.
const CHANGES_KEPT: usize = 64;

/// How long Redis is left alone after a failed lookup.
const REDIS_RETRY: Duration = Duration::from_secs(1);

impl Accounts {
    /// The request path's access check, in order: authenticate the bearer
    /// key of the `authorization` header (401), the organisation's standing
    /// (402), the key's permission for `scope` (403). Call it before
    /// reading the body; once the body names a model, call
    /// [`Account::check_model`]. Every route uses this one entry.
    pub async fn authorize(
        &self,
        authorization: Option<&[u8]>,
        scope: super::Scope,
    ) -> Result<Arc<Account>, AccountError> {
        let token = bearer_token(authorization).ok_or(AccountError::InvalidKey)?;
        self.authorize_digest(hash_key(token), scope).await
    }

    /// [`Self::authorize`] for a key already hashed: what a holder of a
    /// key's rights beyond one request (an open WebSocket) asks again, so
    /// each of its requests runs under the key's and organisation's
    /// current state.
    pub async fn authorize_digest(
        &self,
        digest: [u8; 32],
        scope: super::Scope,
    ) -> Result<Arc<Account>, AccountError> {
        let account = self.by_digest(digest).await?;
        account.check_org()?;
        account.check_scope(scope)?;
        Ok(account)
    }

    /// The invalidations applied from now on (see [`Invalidation`]).
    pub fn changes(&self) -> broadcast::Receiver<Invalidation> {
        self.changes.subscribe()
    }

    pub fn from_config(config: &Config, redis: Option<Arc<RedisHandle>>) -> anyhow::Result<Self> {
        let mut static_keys = HashMap::with_capacity(config.keys.len());
        for k in &config.keys {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(&k.sha256, &mut digest)?;
            let scopes = match &k.scopes {
                None => Scopes::ALL,
                Some(list) => Scopes::parse_list(&list.join(","))
                    .map_err(|s| anyhow::anyhow!("keys[].scopes: unknown scope '{s}'"))?,
            };
            static_keys.insert(
                digest,
                KeyRecord {
                    digest_hex: k.sha256.to_ascii_lowercase(),
                    org: k.org.clone(),
                    name: k.name.clone(),
                    plan: k.plan.clone().unwrap_or_default(),
                    scopes,
                    models: k.models.clone(),
                    created_unix: 0,
                    revoked: false,
                },
            );
        }
        let plans = config
            .plans
            .iter()
            .map(|(name, p)| (name.clone(), RatePlan::from(p)))
            .collect();
        let orgs = config
            .orgs
            .iter()
            .map(|(name, o)| {
                (
                    name.clone(),
                    OrgStatus {
                        blocked: o.blocked,
                        blocked_reason: o.blocked_reason.clone(),
                        budget_nano: o.budget_usd.map(super::store::usd_to_nano),
                    },
                )
            })
            .collect();
        Ok(Self {
            static_keys,
            store: redis.map(AccountStore::new),
            cache: RwLock::new(HashMap::new()),
            ttl: Duration::from_millis(config.limits.key_cache_ttl_ms),
            plans,
            default_plan: config.limits.default_plan.clone(),
            orgs,
            policy: config.limits.on_store_failure,
            redis_down_until: RwLock::new(None),
            changes: broadcast::channel(CHANGES_KEPT).0,
        })
    }

    /// 401 `invalid_api_key` for a missing, malformed, unknown or revoked
    /// key; 503 when the key cannot be looked up (Redis down, nothing cached).
    pub async fn authenticate(
        &self,
        authorization: Option<&[u8]>,
    ) -> Result<Arc<Account>, AccountError> {
        let token = bearer_token(authorization).ok_or(AccountError::InvalidKey)?;
        self.by_digest(hash_key(token)).await
    }

    /// The account of the key stored under `digest` (its sha256): the
    /// lookup behind [`Self::authenticate`], also used to run a background
    /// run another replica handed over under the key that created it.
    pub async fn by_digest(&self, digest: [u8; 32]) -> Result<Arc<Account>, AccountError> {
        let stale = match self.cached(&digest) {
            Cached::Fresh(account) => return account.ok_or(AccountError::InvalidKey),
            Cached::Stale(account) => Some(account),
            Cached::Missing => None,
        };
        let redis_down = self
            .redis_down_until
            .read()
            .ok()
            .and_then(|d| *d)
            .is_some_and(|until| Instant::now() < until);
        let resolved = if redis_down {
            Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "skipped: Redis failed less than a second ago",
            )))
        } else {
            self.resolve(&digest).await.inspect_err(|e| {
                tracing::warn!("key lookup failed: {e}");
                crate::metrics::redis_error("accounts", "lookup");
                if let Ok(mut d) = self.redis_down_until.write() {
                    *d = Some(Instant::now() + REDIS_RETRY);
                }
            })
        };
        match resolved {
            Ok(account) => {
                self.insert(digest, account.clone());
                account.ok_or(AccountError::InvalidKey)
            }
            Err(_) => {
                if let Some(account) = stale {
                    // Better a few seconds' stale grant than an outage.
                    return account.ok_or(AccountError::InvalidKey);
                }
                if let Some(record) = self.static_keys.get(&digest) {
                    if self.policy == OnStoreFailure::FailOpenLocal {
                        return Ok(Arc::new(self.account_from(record, None, None)));
                    }
                }
                Err(AccountError::StoreUnavailable)
            }
        }
    }

    fn cached(&self, digest: &[u8; 32]) -> Cached {
        let Ok(cache) = self.cache.read() else {
            return Cached::Missing;
        };
        match cache.get(digest) {
            // Without Redis nothing can change: entries never expire.
            Some(e) if self.store.is_none() || e.fetched.elapsed() < self.ttl => {
                Cached::Fresh(e.account.clone())
            }
            Some(e) => Cached::Stale(e.account.clone()),
            None => Cached::Missing,
        }
    }

    fn insert(&self, digest: [u8; 32], account: Option<Arc<Account>>) {
        if let Ok(mut cache) = self.cache.write() {
            if cache.len() >= MAX_ENTRIES {
                cache.clear();
            }
            cache.insert(
                digest,
                Entry {
                    account,
                    fetched: Instant::now(),
                },
            );
        }
    }

    /// The key's account as the stores hold it now (`None`: unknown/revoked).
    async fn resolve(&self, digest: &[u8; 32]) -> redis::RedisResult<Option<Arc<Account>>> {
        let from_redis;
        let record = match (self.static_keys.get(digest), &self.store) {
            (Some(r), _) => r,
            (None, None) => return Ok(None),
            (None, Some(store)) => {
                from_redis = store.key(&hex::encode(digest)).await?;
                match &from_redis {
                    Some(r) if !r.revoked => r,
                    _ => return Ok(None),
                }
            }
        };
        let (org, plan) = match &self.store {
            Some(store) => {
                store
                    .org_and_plan(&record.org, self.plan_name(record))
                    .await?
            }
            None => (None, None),
        };
        Ok(Some(Arc::new(self.account_from(record, org, plan))))
    }

    fn plan_name<'a>(&'a self, record: &'a KeyRecord) -> &'a str {
        if record.plan.is_empty() {
            &self.default_plan
        } else {
            &record.plan
        }
    }

    /// Builds the account; Redis values (when given) win over the config's.
    fn account_from(
        &self,
        record: &KeyRecord,
        org: Option<OrgStatus>,
        plan: Option<RatePlan>,
    ) -> Account {
        let plan_name = self.plan_name(record);
        Account {
            principal: Principal {
                org: record.org.as_str().into(),
                key_name: record.name.as_str().into(),
                key_id: record.key_id().into(),
            },
            scopes: record.scopes,
            models: record
                .models
                .as_ref()
                .map(|m| m.iter().map(|s| s.as_str().into()).collect()),
            plan_name: plan_name.into(),
            plan: plan
                .or_else(|| self.plans.get(plan_name).copied())
                .unwrap_or_default(),
            org: org
                .or_else(|| self.orgs.get(&record.org).cloned())
                .unwrap_or_default(),
            series: Default::default(),
        }
    }

    /// Applies one invalidation message (`key:<hex>` or `all`), then tells
    /// the holders of [`Self::changes`].
    pub fn invalidate(&self, message: &str) {
        let change = match message.strip_prefix("key:") {
            Some(hex_digest) => {
                let mut digest = [0u8; 32];
                match hex::decode_to_slice(hex_digest, &mut digest) {
                    Ok(()) => Invalidation::Key(digest),
                    Err(_) => Invalidation::All,
                }
            }
            None => Invalidation::All,
        };
        if let Ok(mut cache) = self.cache.write() {
            match change {
                Invalidation::Key(digest) => {
                    cache.remove(&digest);
                }
                Invalidation::All => cache.clear(),
            }
        }
        // After the cache is cleared, so a holder's re-check reads anew.
        // No receiver is not an error.
        let _ = self.changes.send(change);
    }

    /// Follows the invalidation channel for as long as the process runs,
    /// resubscribing after a failure (and then clearing the cache, since
    /// messages may have been missed). Returns at once without Redis.
    pub async fn listen_for_invalidations(&self) {
        let Some(store) = &self.store else {
            return;
        };
        let channel = store.channel();
        loop {
            match subscribe(store.redis(), &channel).await {
                Ok(mut pubsub) => {
                    self.invalidate("all");
                    let mut messages = pubsub.on_message();
                    while let Some(msg) = messages.next().await {
                        if let Ok(payload) = msg.get_payload::<String>() {
                            self.invalidate(&payload);
                        }
                    }
                    tracing::warn!("key invalidation channel closed; resubscribing");
                }
                Err(e) => {
                    crate::metrics::redis_error("accounts", "subscribe");
                    tracing::warn!("cannot subscribe to key invalidations: {e}")
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

async fn subscribe(redis: &RedisHandle, channel: &str) -> redis::RedisResult<redis::aio::PubSub> {
    let mut pubsub = redis.pubsub().await?;
    pubsub.subscribe(channel).await?;
    Ok(pubsub)
}

enum Cached {
    Fresh(Option<Arc<Account>>),
    Stale(Option<Arc<Account>>),
    Missing,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::Scope;
    use crate::config::StaticKey;
    use crate::redis::testing::{cleanup, test_redis};

    fn config_with_static_key() -> Config {
        let mut c = Config::defaults();
        c.keys.push(StaticKey {
            sha256: crate::auth::hash_key_hex("sk-static"),
            org: "org-s".into(),
            name: "ci".into(),
            plan: Some("small".into()),
            scopes: Some(vec!["chat.write".into()]),
            models: None,
        });
        c.plans.insert(
            "small".into(),
            crate::config::RatePlanConfig {
                rpm: 5,
                ..Default::default()
            },
        );
        c
    }

    #[tokio::test]
    async fn static_keys_work_without_redis() {
        let a = Accounts::from_config(&config_with_static_key(), None).unwrap();
        let acc = a.authenticate(Some(b"Bearer sk-static")).await.unwrap();
        assert_eq!(&*acc.principal.org, "org-s");
        assert_eq!(acc.plan.rpm, 5);
        assert!(acc.scopes.contains(Scope::ChatWrite) && !acc.scopes.contains(Scope::ModelsRead));
        let e = a.authenticate(Some(b"Bearer sk-other")).await.unwrap_err();
        assert_eq!(e, AccountError::InvalidKey);
        assert_eq!(
            a.authenticate(None).await.unwrap_err(),
            AccountError::InvalidKey
        );
    }

    #[tokio::test]
    async fn every_invalidation_reaches_the_holders_of_a_key_s_rights() {
        let a = Accounts::from_config(&config_with_static_key(), None).unwrap();
        let digest = hash_key("sk-static");
        // A held key is authorized again by its digest, as by its header.
        let acc = a.authorize_digest(digest, Scope::ChatWrite).await.unwrap();
        assert_eq!(&*acc.principal.org, "org-s");
        assert_eq!(
            a.authorize_digest(digest, Scope::ModelsRead)
                .await
                .unwrap_err(),
            AccountError::MissingScope(Scope::ModelsRead)
        );
        let mut changes = a.changes();
        a.invalidate(&format!("key:{}", hex::encode(digest)));
        a.invalidate("all");
        a.invalidate("key:not-hex");
        assert_eq!(changes.try_recv(), Ok(Invalidation::Key(digest)));
        assert_eq!(changes.try_recv(), Ok(Invalidation::All));
        // A message it cannot read concerns every key.
        assert_eq!(changes.try_recv(), Ok(Invalidation::All));
        assert!(changes.try_recv().is_err());
    }

    #[tokio::test]
    async fn revocation_is_seen_at_once_through_the_channel_and_ttl_bounds_the_rest() {
        let redis = test_redis();
        let mut config = config_with_static_key();
        config.limits.key_cache_ttl_ms = 300;
        let accounts = Arc::new(Accounts::from_config(&config, Some(redis.clone())).unwrap());
        let listener = tokio::spawn({
            let a = accounts.clone();
            async move { a.listen_for_invalidations().await }
        });
        let store = AccountStore::new(redis.clone());
        // Wait until the listener is subscribed (it clears on subscribe).
        let mut conn = redis.conn().await.unwrap();
        for _ in 0..100 {
            let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(store.channel())
                .query_async(&mut conn)
                .await
                .unwrap();
            if n.first().is_some_and(|(_, c)| *c > 0) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (secret, rec) = store
            .create_key("org-r", "ci", "", Scopes::ALL, None)
            .await
            .unwrap();
        let header = format!("Bearer {secret}");
        let acc = accounts
            .authenticate(Some(header.as_bytes()))
            .await
            .unwrap();
        assert_eq!(&*acc.principal.key_id, rec.key_id());
        assert_eq!(&*acc.plan_name, "default");

        // Revocation: the pub/sub message drops the cached entry well
        // within the TTL.
        store.revoke(rec.key_id()).await.unwrap();
        let started = Instant::now();
        loop {
            match accounts.authenticate(Some(header.as_bytes())).await {
                Err(e) => {
                    assert_eq!(e, AccountError::InvalidKey);
                    break;
                }
                Ok(_) => {
                    assert!(
                        started.elapsed() < Duration::from_millis(250),
                        "revocation not applied"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }

        // Without the listener, the TTL alone bounds staleness.
        listener.abort();
        let acc = accounts
            .authenticate(Some(b"Bearer sk-static"))
            .await
            .unwrap();
        assert!(!acc.org.blocked);
        let mut conn = redis.conn().await.unwrap();
        let _: () =
            redis::AsyncCommands::hset(&mut conn, redis.key("org", "org-s", ""), "blocked", "1")
                .await
                .unwrap();
        assert!(
            !accounts
                .authenticate(Some(b"Bearer sk-static"))
                .await
                .unwrap()
                .org
                .blocked
        );
        tokio::time::sleep(Duration::from_millis(320)).await;
        let acc = accounts
            .authenticate(Some(b"Bearer sk-static"))
            .await
            .unwrap();
        assert!(acc.org.blocked);
        assert!(matches!(acc.check_org(), Err(AccountError::Blocked { .. })));
        cleanup(&redis).await;
    }
}
