//! The Redis layout of keys, organisations and plans, and the operations
//! the request path (lookup) and the operator CLI (create, list, revoke, block,
//! plans) perform on it.
//!
//! ```text
//! <prefix>key:{<sha256 hex>}   hash  org, name, plan, scopes, models, created, revoked
//! <prefix>keys                 set   every key digest (for `keys list` and `keys revoke`)
//! <prefix>org:{<org>}          hash  blocked, reason, budget_nano
//! <prefix>plan:{<name>}        hash  rpm, tpm, max_concurrent, default_max_tokens,
//!                                    max_service_tier, weight, max_stored_bytes
//! <prefix>accounts:invalidate  pub/sub channel: `key:<hex>` or `all`
//! ```
//!
//! The secret itself is never stored: `keys create` prints it once.

use super::{OrgStatus, Scopes};
use super::{RatePlan, ServiceTier};
use crate::redis::RedisHandle;
use rand::distr::{Alphanumeric, SampleString};
use redis::AsyncCommands;
use std::collections::HashMap;
use std::sync::Arc;

/// A key as stored (everything but the secret).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRecord {
    pub digest_hex: String,
    pub org: String,
    pub name: String,
    /// Empty = the configured default plan.
    pub plan: String,
    pub scopes: Scopes,
    pub models: Option<Vec<String>>,
    pub created_unix: u64,
    pub revoked: bool,
}

impl KeyRecord {
    /// First 12 hex digits of the digest: safe to print, log and label.
    pub fn key_id(&self) -> &str {
        &self.digest_hex[..12.min(self.digest_hex.len())]
    }

    fn from_hash(digest_hex: &str, h: &HashMap<String, String>) -> Option<Self> {
        let org = h.get("org")?.clone();
        let get = |k: &str| h.get(k).cloned().unwrap_or_default();
        let models = get("models");
        Some(Self {
            digest_hex: digest_hex.to_owned(),
            org,
            name: get("name"),
            plan: get("plan"),
            scopes: h
                .get("scopes")
                .map(|s| Scopes::parse_list(s).unwrap_or(Scopes::NONE))
                .unwrap_or(Scopes::ALL),
            models: (!models.is_empty()).then(|| models.split(',').map(str::to_owned).collect()),
            created_unix: get("created").parse().unwrap_or(0),
            revoked: get("revoked") == "1",
        })
    }
}

/// Keys, organisations and plans in Redis.
#[derive(Clone)]
pub struct AccountStore {
    redis: Arc<RedisHandle>,
}

impl AccountStore {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        Self { redis }
    }

    fn key_key(&self, digest_hex: &str) -> String {
        self.redis.key("key", digest_hex, "")
    }
    fn index_key(&self) -> String {
        format!("{}keys", self.redis.prefix())
    }
    fn org_key(&self, org: &str) -> String {
        self.redis.key("org", org, "")
    }
    fn plan_key(&self, name: &str) -> String {
        self.redis.key("plan", name, "")
    }

    /// The pub/sub channel every replica listens on for cache invalidations.
    pub fn channel(&self) -> String {
        format!("{}accounts:invalidate", self.redis.prefix())
    }

    pub fn redis(&self) -> &Arc<RedisHandle> {
        &self.redis
    }

    /// One key by digest; `None` if unknown.
    pub async fn key(&self, digest_hex: &str) -> redis::RedisResult<Option<KeyRecord>> {
        let mut conn = self.redis.conn().await?;
        let h: HashMap<String, String> = conn.hgetall(self.key_key(digest_hex)).await?;
        Ok(KeyRecord::from_hash(digest_hex, &h))
    }

    /// An organisation's status and a plan, in one round trip. `None` for
    /// each that Redis does not hold.
    ///
    /// Two commands sent together rather than one pipeline: the keys are
    /// of two hash tags (two Redis Cluster slots, maybe two nodes). On one
    /// server the multiplexed connection writes both before reading.
    pub async fn org_and_plan(
        &self,
        org: &str,
        plan: &str,
    ) -> redis::RedisResult<(Option<OrgStatus>, Option<RatePlan>)> {
        let conn = self.redis.conn().await?;
        let (mut c1, mut c2) = (conn.clone(), conn);
        let (org_key, plan_key) = (self.org_key(org), self.plan_key(plan));
        let (o, p): (HashMap<String, String>, HashMap<String, String>) =
            futures::try_join!(c1.hgetall(&org_key), c2.hgetall(&plan_key))?;
        Ok((org_from_hash(&o), plan_from_hash(&p)))
    }

    // ---- operator operations ------------------------------------------------

    /// Creates a key and returns its secret (shown once) and record.
    pub async fn create_key(
        &self,
        org: &str,
        name: &str,
        plan: &str,
        scopes: Scopes,
        models: Option<&[String]>,
    ) -> anyhow::Result<(String, KeyRecord)> {
        anyhow::ensure!(!org.is_empty(), "the organisation must not be empty");
        let secret = format!("sk-{}", Alphanumeric.sample_string(&mut rand::rng(), 40));
        let digest_hex = crate::auth::hash_key_hex(&secret);
        let record = KeyRecord {
            digest_hex: digest_hex.clone(),
            org: org.to_owned(),
            name: name.to_owned(),
            plan: plan.to_owned(),
            scopes,
            models: models.map(<[String]>::to_vec),
            created_unix: unix_now(),
            revoked: false,
        };
        let mut conn = self.redis.conn().await?;
        let models = record
            .models
            .as_deref()
            .map(|m| m.join(","))
            .unwrap_or_default();
        // The index first, then the record (two slots on a cluster, so two
        // commands): a failure between them leaves an index entry without
        // a record, which lists and authenticates as nothing, never a
        // working key that `keys list` and `keys revoke` cannot see.
        let _: () = conn.sadd(self.index_key(), &digest_hex).await?;
        let _: () = conn
            .hset_multiple(
                self.key_key(&digest_hex),
                &[
                    ("org", record.org.as_str()),
                    ("name", record.name.as_str()),
                    ("plan", record.plan.as_str()),
                    ("scopes", &scopes.to_list()),
                    ("models", &models),
                    ("created", &record.created_unix.to_string()),
                    ("revoked", "0"),
                ],
            )
            .await?;
        // A replica may have cached this digest as unknown.
        self.publish(&format!("key:{digest_hex}")).await?;
        Ok((secret, record))
    }

    /// Every key (optionally of one org), oldest first.
    pub async fn list_keys(&self, org: Option<&str>) -> anyhow::Result<Vec<KeyRecord>> {
        let mut conn = self.redis.conn().await?;
        let digests: Vec<String> = conn.smembers(self.index_key()).await?;
        let mut out = Vec::with_capacity(digests.len());
        for d in digests {
            if let Some(r) = self.key(&d).await? {
                if org.is_none_or(|o| o == r.org) {
                    out.push(r);
                }
            }
        }
        out.sort_by(|a, b| (a.created_unix, &a.digest_hex).cmp(&(b.created_unix, &b.digest_hex)));
        Ok(out)
    }

    /// Revokes the keys whose digest starts with `id` (a key id of at least
    /// 8 hex digits, or the full digest) and tells every replica. Returns
    /// the revoked records.
    pub async fn revoke(&self, id: &str) -> anyhow::Result<Vec<KeyRecord>> {
        let id = id.trim().to_ascii_lowercase();
        anyhow::ensure!(
            id.len() >= 8 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "give the key id (at least 8 hex digits, as `keys list` prints it)"
        );
        let mut conn = self.redis.conn().await?;
        let digests: Vec<String> = conn.smembers(self.index_key()).await?;
        let matching: Vec<String> = digests.into_iter().filter(|d| d.starts_with(&id)).collect();
        anyhow::ensure!(
            matching.len() <= 1,
            "key id '{id}' is ambiguous; give more digits"
        );
        let mut revoked = Vec::new();
        for d in matching {
            let _: () = conn.hset(self.key_key(&d), "revoked", "1").await?;
            self.publish(&format!("key:{d}")).await?;
            if let Some(r) = self.key(&d).await? {
                revoked.push(r);
            }
        }
        Ok(revoked)
    }

    pub async fn set_org_blocked(
        &self,
        org: &str,
        blocked: bool,
        reason: &str,
    ) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = conn
            .hset_multiple(
                self.org_key(org),
                &[
                    ("blocked", if blocked { "1" } else { "0" }),
                    ("reason", reason),
                ],
            )
            .await?;
        self.publish("all").await
    }

    /// Sets (or with `None` clears) an organisation's spending budget.
    pub async fn set_org_budget(&self, org: &str, budget_usd: Option<f64>) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        match budget_usd {
            Some(usd) => {
                let _: () = conn
                    .hset(self.org_key(org), "budget_nano", usd_to_nano(usd))
                    .await?;
            }
            None => {
                let _: () = conn.hdel(self.org_key(org), "budget_nano").await?;
            }
        }
        self.publish("all").await
    }

    pub async fn org(&self, org: &str) -> anyhow::Result<Option<OrgStatus>> {
        let mut conn = self.redis.conn().await?;
        let h: HashMap<String, String> = conn.hgetall(self.org_key(org)).await?;
        Ok(org_from_hash(&h))
    }

    pub async fn set_plan(&self, name: &str, plan: &RatePlan) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        let _: () = conn
            .hset_multiple(
                self.plan_key(name),
                &[
                    ("rpm", plan.rpm.to_string()),
                    ("tpm", plan.tpm.to_string()),
                    ("max_concurrent", plan.max_concurrent.to_string()),
                    ("default_max_tokens", plan.default_max_tokens.to_string()),
                    (
                        "max_service_tier",
                        plan.max_service_tier.as_str().to_owned(),
                    ),
                    ("weight", plan.weight.to_string()),
                    ("max_stored_bytes", plan.max_stored_bytes.to_string()),
                ],
            )
            .await?;
        self.publish("all").await
    }

    pub async fn plan(&self, name: &str) -> anyhow::Result<Option<RatePlan>> {
        let mut conn = self.redis.conn().await?;
        let h: HashMap<String, String> = conn.hgetall(self.plan_key(name)).await?;
        Ok(plan_from_hash(&h))
    }

    async fn publish(&self, message: &str) -> anyhow::Result<()> {
        let mut conn = self.redis.conn().await?;
        let _: i64 = conn.publish(self.channel(), message).await?;
        Ok(())
    }
}

fn org_from_hash(h: &HashMap<String, String>) -> Option<OrgStatus> {
    if h.is_empty() {
        return None;
    }
    Some(OrgStatus {
        blocked: h.get("blocked").is_some_and(|v| v == "1"),
        blocked_reason: h.get("reason").cloned().unwrap_or_default(),
        budget_nano: h.get("budget_nano").and_then(|v| v.parse().ok()),
    })
}

fn plan_from_hash(h: &HashMap<String, String>) -> Option<RatePlan> {
    if h.is_empty() {
        return None;
    }
    let num = |k: &str| h.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Some(RatePlan {
        rpm: num("rpm") as u32,
        tpm: num("tpm"),
        max_concurrent: num("max_concurrent") as u32,
        default_max_tokens: num("default_max_tokens") as u32,
        max_service_tier: h
            .get("max_service_tier")
            .and_then(|t| ServiceTier::parse(t))
            .unwrap_or(ServiceTier::Default),
        weight: (num("weight") as u32).max(1),
        max_stored_bytes: num("max_stored_bytes"),
    })
}

/// US dollars to the integer nano-dollars budgets and spend are kept in.
pub fn usd_to_nano(usd: f64) -> i64 {
    (usd * 1e9).round() as i64
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounts::Scope;
    use crate::redis::testing::{cleanup, test_redis};

    #[tokio::test]
    async fn create_lookup_list_revoke_against_redis() {
        let redis = test_redis();
        lifecycle(&redis).await;
        cleanup(&redis).await;
    }

    /// The same on a real 3-primary Redis Cluster: the key, its index, the
    /// org and the plan are in different slots.
    #[tokio::test]
    async fn create_lookup_list_revoke_on_a_cluster() {
        let cluster = harness::RedisCluster::start(3).expect("a Redis Cluster");
        let redis = Arc::new(RedisHandle::open(&cluster.urls(), "igwtest:", None, true).unwrap());
        lifecycle(&redis).await;
    }

    async fn lifecycle(redis: &Arc<RedisHandle>) {
        let store = AccountStore::new(redis.clone());
        let (secret, rec) = store
            .create_key(
                "org-x",
                "ci",
                "pro",
                Scopes::NONE.with(Scope::ChatWrite),
                Some(&["base".to_string()]),
            )
            .await
            .unwrap();
        assert!(secret.starts_with("sk-") && secret.len() == 43);
        // Only the digest is stored, never the secret.
        let mut conn = redis.conn().await.unwrap();
        let all: Vec<String> = conn.keys(format!("{}*", redis.prefix())).await.unwrap();
        for k in &all {
            let t: String = redis::cmd("TYPE")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            if t == "hash" {
                let h: HashMap<String, String> = conn.hgetall(k).await.unwrap();
                assert!(h.values().all(|v| !v.contains(&secret)));
            }
            assert!(!k.contains(&secret));
        }
        let found = store
            .key(&crate::auth::hash_key_hex(&secret))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found, rec);
        assert_eq!(found.models.as_deref(), Some(&["base".to_string()][..]));
        assert_eq!(store.list_keys(Some("org-x")).await.unwrap().len(), 1);
        assert!(store.list_keys(Some("org-y")).await.unwrap().is_empty());

        let revoked = store.revoke(rec.key_id()).await.unwrap();
        assert_eq!(revoked.len(), 1);
        assert!(revoked[0].revoked);
        assert!(store.revoke("zz").await.is_err());

        store.set_org_blocked("org-x", true, "fraud").await.unwrap();
        store.set_org_budget("org-x", Some(1.5)).await.unwrap();
        let plan = RatePlan {
            rpm: 10,
            tpm: 1000,
            max_concurrent: 2,
            default_max_tokens: 64,
            max_stored_bytes: 1 << 20,
            ..RatePlan::default()
        };
        store.set_plan("pro", &plan).await.unwrap();
        let (org, p) = store.org_and_plan("org-x", "pro").await.unwrap();
        assert_eq!(
            org,
            Some(OrgStatus {
                blocked: true,
                blocked_reason: "fraud".into(),
                budget_nano: Some(1_500_000_000)
            })
        );
        assert_eq!(p, Some(plan));
        assert_eq!(
            store.org_and_plan("nobody", "none").await.unwrap(),
            (None, None)
        );
    }
}
