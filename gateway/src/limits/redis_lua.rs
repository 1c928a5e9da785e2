//! The global stage in Redis: one Lua script to admit (`admit.lua`) and one
//! to settle (`settle.lua`), each a single round trip (EVALSHA) over the
//! limiter's own pipelined connection ([`crate::redis::pipe`]); and the
//! slot heartbeat (`renew.lua`, one call per in-flight set per beat, see
//! [`super::slots`]).
//!
//! Keys of one organisation share its hash tag, so both scripts touch one
//! Redis Cluster slot (on a cluster, each call goes to the primary serving
//! it: [`crate::redis::cluster_pipe`]):
//!
//! ```text
//! <prefix>rl:{<org>}:<model>:req       zset  request log (sliding minute)
//! <prefix>rl:{<org>}:<model>:tok       zset  token log ("<request id>:<tokens>")
//! <prefix>rl:{<org>}:<model>:toksum    string sum of the token log
//! <prefix>rl:{<org>}:<model>:inflight  zset  in-flight requests by slot lapse
//! <prefix>rl:{<org>}:<model>:settled:<request id>  string  settled marker (one window)
//! <prefix>spend:{<org>}                string nano-dollars spent
//! <prefix>usage:{<org>}:<YYYY-MM-DD>   hash  "<key id>|<model>|<counter>" -> n
//! ```

use super::store::{Admission, AdmitRequest, LimitStore, Settlement, Verdict, WINDOW_MS};
use crate::metrics::redis_error;
use crate::redis::cluster_pipe::ClusterPipe;
use crate::redis::pipe::{Arg, PipeError, RedisPipe, Reply, RespCommand, Script};
use crate::redis::{RedisHandle, Target};
use crate::usage::usage_key;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Usage counters are kept this long (seconds).
pub const USAGE_TTL_SECS: u64 = 400 * 86_400;

/// Most (organisation, model) key sets kept; the cache starts over beyond.
const MAX_CACHED_KEY_SETS: usize = 100_000;

/// The Redis keys of one organisation's limits on one model, formatted once
/// (building them was a dozen small allocations per request).
struct LimitKeys {
    req: String,
    tok: String,
    toksum: String,
    inflight: String,
    /// `<prefix>rl:{<org>}:<model>:settled:`, completed by the request id.
    settled_stem: String,
    spend: String,
    /// `<prefix>usage:{<org>}:`, completed by the day.
    usage_stem: String,
}

/// org -> model -> keys; looked up by `&str` without allocating.
type KeyCache = HashMap<String, HashMap<String, Arc<LimitKeys>>>;

pub struct RedisLimits {
    redis: Arc<RedisHandle>,
    admit: Script,
    settle: Script,
    renew: Script,
    /// The scripts go over one lean pipelined connection (one per primary
    /// on a cluster): concurrent admissions and settlements share writes
    /// and reads, each still one round trip (see [`crate::redis::pipe`] for
    /// why not the redis crate's).
    pipe: Pipe,
    keys: RwLock<KeyCache>,
}

impl RedisLimits {
    pub fn new(redis: Arc<RedisHandle>) -> Self {
        let admit = Script::new(include_str!("admit.lua"));
        let settle = Script::new(include_str!("settle.lua"));
        let renew = Script::new(include_str!("renew.lua"));
        let sources = vec![admit.source, settle.source, renew.source];
        let pipe = match redis.target() {
            Target::Single(info) => Pipe::Single(RedisPipe::to(info.clone(), redis.tls(), sources)),
            Target::Cluster(topology) => {
                Pipe::Cluster(ClusterPipe::new(topology.clone(), redis.tls(), sources))
            }
        };
        Self {
            redis,
            admit,
            settle,
            renew,
            pipe,
            keys: RwLock::new(HashMap::new()),
        }
    }

    fn keys(&self, org: &str, model: &str) -> Arc<LimitKeys> {
        if let Ok(cache) = self.keys.read() {
            if let Some(keys) = cache.get(org).and_then(|models| models.get(model)) {
                return keys.clone();
            }
        }
        let keys = Arc::new(LimitKeys {
            req: self.window_key(org, model, "req"),
            tok: self.window_key(org, model, "tok"),
            toksum: self.window_key(org, model, "toksum"),
            inflight: self.window_key(org, model, "inflight"),
            settled_stem: self.window_key(org, model, "settled:"),
            spend: spend_key(&self.redis, org),
            usage_stem: usage_key(&self.redis, org, ""),
        });
        if let Ok(mut cache) = self.keys.write() {
            if cache.len() >= MAX_CACHED_KEY_SETS {
                cache.clear();
            }
            cache
                .entry(org.to_owned())
                .or_default()
                .insert(model.to_owned(), keys.clone());
        }
        keys
    }

    /// The keys of `admit.lua` (all of one org's hash tag).
    fn admit_keys(k: &LimitKeys) -> [&str; 5] {
        [&k.req, &k.tok, &k.toksum, &k.inflight, &k.spend]
    }

    fn window_key(&self, org: &str, model: &str, what: &str) -> String {
        self.redis.key("rl", org, &format!(":{model}:{what}"))
    }
}

/// `<prefix>spend:{<org>}`: nano-dollars an organisation has spent.
fn spend_key(redis: &RedisHandle, org: &str) -> String {
    redis.key("spend", org, "")
}

/// What `org` has spent so far, in nano-dollars (0 before its first
/// settlement): for the operator CLI, which must not know the limiter's keys.
pub async fn spent_nano(redis: &RedisHandle, org: &str) -> redis::RedisResult<i64> {
    let mut conn = redis.conn().await?;
    let spent: Option<i64> = redis::AsyncCommands::get(&mut conn, spend_key(redis, org)).await?;
    Ok(spent.unwrap_or(0))
}

#[async_trait]
impl LimitStore for RedisLimits {
    async fn admit(&self, r: &AdmitRequest<'_>) -> anyhow::Result<Admission> {
        let k = self.keys(r.org, r.model);
        let frame = || {
            RespCommand::evalsha(
                &self.admit,
                &Self::admit_keys(&k),
                &[
                    r.request_id.into(),
                    r.plan.rpm.into(),
                    r.plan.tpm.into(),
                    r.plan.max_concurrent.into(),
                    r.tokens.into(),
                    r.slot_lease_ms.into(),
                    r.budget_nano.unwrap_or(-1).into(),
                    WINDOW_MS.into(),
                    r.renew_every_ms.into(),
                    u64::from(r.taken_over).into(),
                ],
            )
        };
        let reply = self
            .pipe
            .call(&k.spend, frame)
            .await
            .inspect_err(|_| redis_error("limiter", "admit"))?;
        let Some(&[verdict, used_req, used_tok, reset_req, reset_tok, retry]) =
            reply.ints().as_deref()
        else {
            anyhow::bail!("admission script returned {reply:?}");
        };
        let verdict = match verdict {
            0 => Verdict::Admitted,
            1 => Verdict::Requests,
            2 => Verdict::Tokens,
            3 => Verdict::Concurrency,
            4 => Verdict::OverBudget,
            v => anyhow::bail!("admission script returned verdict {v}"),
        };
        let ms = |v: i64| v.max(0) as u64;
        Ok(Admission {
            verdict,
            used_requests: ms(used_req),
            used_tokens: ms(used_tok),
            reset_requests_ms: ms(reset_req),
            reset_tokens_ms: ms(reset_tok),
            retry_after_ms: ms(retry),
        })
    }

    async fn settle(&self, s: &Settlement<'_>) -> anyhow::Result<()> {
        let u = s.usage.unwrap_or_default();
        let k = self.keys(s.org, s.model);
        let usage_key = [k.usage_stem.as_str(), s.day].concat();
        let field_prefix = [s.key_id, "|", s.model, "|"].concat();
        let settled = [k.settled_stem.as_str(), s.request_id].concat();
        let frame = || {
            RespCommand::evalsha(
                &self.settle,
                &[
                    &k.tok,
                    &k.toksum,
                    &k.inflight,
                    &k.spend,
                    &usage_key,
                    &settled,
                ],
                &[
                    s.request_id.into(),
                    s.reserved_tokens.into(),
                    s.actual_tokens.into(),
                    WINDOW_MS.into(),
                    field_prefix.as_str().into(),
                    u64::from(s.usage.is_some() && s.counts_request).into(),
                    u.input.into(),
                    u.cached_input.into(),
                    u.output.into(),
                    u.reasoning.into(),
                    s.cost_nano.into(),
                    USAGE_TTL_SECS.into(),
                ],
            )
        };
        // Waiting keeps "settled before the reply is sent": a client's next
        // request sees its slot and tokens back.
        self.pipe
            .call(&k.spend, frame)
            .await
            .inspect_err(|_| redis_error("limiter", "settle"))?;
        Ok(())
    }

    async fn renew(
        &self,
        org: &str,
        model: &str,
        request_ids: &[String],
        lease_ms: u64,
    ) -> anyhow::Result<()> {
        let k = self.keys(org, model);
        let frame = || {
            let args: Vec<Arg<'_>> = std::iter::once(lease_ms.into())
                .chain(request_ids.iter().map(|id| id.as_str().into()))
                .collect();
            RespCommand::evalsha(&self.renew, &[&k.inflight], &args)
        };
        self.pipe
            .call(&k.inflight, frame)
            .await
            .inspect_err(|_| redis_error("limiter", "renew"))?;
        Ok(())
    }

    async fn flush(&self) {
        // Replies come in order: once this one is back, every settlement
        // sent before it has been applied.
        match &self.pipe {
            Pipe::Single(p) => {
                let _ = p.call(|| RespCommand::command(&["PING".into()])).await;
            }
            Pipe::Cluster(p) => p.flush().await,
        }
    }
}

/// The limiter's connection: one server, or the primaries of a cluster.
enum Pipe {
    Single(RedisPipe),
    Cluster(ClusterPipe),
}

impl Pipe {
    /// `key`: one of the command's keys (all share its slot).
    async fn call(&self, key: &str, encode: impl Fn() -> RespCommand) -> Result<Reply, PipeError> {
        match self {
            Pipe::Single(p) => p.call(encode).await,
            Pipe::Cluster(p) => p.call(key, encode).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::memory::MemoryLimits;
    use crate::limits::tests_shared;
    use crate::redis::testing::{cleanup, test_redis};

    #[tokio::test]
    async fn redis_store_passes_the_shared_suite() {
        let redis = test_redis();
        let store = RedisLimits::new(redis.clone());
        tests_shared::suite(&store).await;
        // A retried settlement (its first reply lost) changes nothing.
        let used = crate::limits::TokenUsage {
            input: 100,
            cached_input: 10,
            output: 0,
            reasoning: 5,
        };
        store
            .settle(&tests_shared::settlement(
                "base",
                "r1",
                300,
                Some(used),
                777,
            ))
            .await
            .unwrap();
        store.flush().await;
        // Usage and spend landed in the org's keys.
        let mut conn = redis.conn().await.unwrap();
        let usage: std::collections::HashMap<String, i64> =
            redis::AsyncCommands::hgetall(&mut conn, usage_key(&redis, "org-suite", "2026-11-23"))
                .await
                .unwrap();
        assert_eq!(usage.get("k1|base|requests"), Some(&1));
        assert_eq!(usage.get("k1|base|input"), Some(&100));
        assert_eq!(usage.get("k1|base|cost_nano"), Some(&777));
        // The rest of a request billed elsewhere (a handed-over run) adds
        // its output but no request.
        let rest = crate::limits::TokenUsage {
            output: 7,
            ..Default::default()
        };
        let continued = crate::limits::Settlement {
            counts_request: false,
            ..tests_shared::settlement("base", "r1-adopted", 0, Some(rest), 1)
        };
        store.settle(&continued).await.unwrap();
        store.flush().await;
        let usage: std::collections::HashMap<String, i64> =
            redis::AsyncCommands::hgetall(&mut conn, usage_key(&redis, "org-suite", "2026-11-23"))
                .await
                .unwrap();
        assert_eq!(usage.get("k1|base|requests"), Some(&1));
        assert_eq!(usage.get("k1|base|output"), Some(&7));
        cleanup(&redis).await;
    }

    #[test]
    fn key_sets_are_formatted_once_per_org_and_model() {
        let redis = Arc::new(RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap());
        let store = RedisLimits::new(redis);
        let a = store.keys("org-a", "base");
        assert_eq!(a.req, "igw:rl:{org-a}:base:req");
        assert_eq!(a.inflight, "igw:rl:{org-a}:base:inflight");
        assert_eq!(a.spend, "igw:spend:{org-a}");
        assert!(Arc::ptr_eq(&a, &store.keys("org-a", "base")));
        assert_eq!(
            store.keys("org-a", "base-mini").tok,
            "igw:rl:{org-a}:base-mini:tok"
        );
        assert_eq!(
            store.keys("org-b", "base").toksum,
            "igw:rl:{org-b}:base:toksum"
        );
    }

    #[test]
    fn every_key_of_a_script_call_is_in_one_slot() {
        use crate::redis::cluster::key_slot;
        let redis = Arc::new(RedisHandle::new("redis://127.0.0.1:6379", "igw:").unwrap());
        let store = RedisLimits::new(redis.clone());
        for (org, model) in [
            ("org-a", "base"),
            ("o{x}", "base-mini"),
            ("a}b", "base"),
            ("", "m"),
            ("}x", "m"),
        ] {
            let k = store.keys(org, model);
            let settle = [
                k.tok.clone(),
                k.toksum.clone(),
                k.inflight.clone(),
                k.spend.clone(),
                [k.usage_stem.as_str(), "2026-01-01"].concat(),
                [k.settled_stem.as_str(), "req_1"].concat(),
            ];
            let slot = key_slot(k.spend.as_bytes());
            for key in RedisLimits::admit_keys(&k)
                .iter()
                .copied()
                .chain(settle.iter().map(String::as_str))
            {
                assert_eq!(key_slot(key.as_bytes()), slot, "{key} vs {}", k.spend);
            }
        }
    }

    /// The shared suite, and usage, against a real 3-primary Redis Cluster:
    /// organisations spread over the nodes, each call on its org's node.
    #[tokio::test]
    async fn redis_store_passes_the_shared_suite_on_a_cluster() {
        let cluster = harness::RedisCluster::start(3).expect("a Redis Cluster");
        let redis = Arc::new(RedisHandle::open(&cluster.urls(), "igwtest:", None, true).unwrap());
        let store = RedisLimits::new(redis.clone());
        tests_shared::suite(&store).await;
        tests_shared::lease_suite(&store).await;
        let used = crate::limits::TokenUsage {
            input: 7,
            cached_input: 0,
            output: 3,
            reasoning: 0,
        };
        store
            .settle(&tests_shared::settlement("base", "rc", 0, Some(used), 5))
            .await
            .unwrap();
        store.flush().await;
        let mut conn = redis.conn().await.unwrap();
        let usage: std::collections::HashMap<String, i64> =
            redis::AsyncCommands::hgetall(&mut conn, usage_key(&redis, "org-suite", "2026-11-23"))
                .await
                .unwrap();
        assert!(
            usage.get("k1|base|input").is_some_and(|n| *n >= 7),
            "{usage:?}"
        );
        // Several orgs, admitted on whichever node serves each.
        let plan = crate::accounts::RatePlan {
            rpm: 1,
            tpm: 0,
            max_concurrent: 0,
            default_max_tokens: 0,
            ..crate::accounts::RatePlan::default()
        };
        for i in 0..20 {
            let org = format!("org-{i}");
            let r = crate::limits::AdmitRequest {
                org: &org,
                model: "base",
                request_id: "r",
                tokens: 1,
                plan,
                budget_nano: None,
                slot_lease_ms: 60_000,
                renew_every_ms: 1_000,
                taken_over: false,
            };
            assert_eq!(store.admit(&r).await.unwrap().verdict, Verdict::Admitted);
            assert_eq!(store.admit(&r).await.unwrap().verdict, Verdict::Requests);
        }
        let counts = cluster.key_counts().unwrap();
        assert!(
            counts.iter().all(|n| *n > 0),
            "keys on every node: {counts:?}"
        );
    }

    /// The same over TLS: a cluster whose nodes speak only TLS, its
    /// certificate checked against a private CA, by the redis crate's
    /// cluster client and by the limiter's own per-node connections.
    #[tokio::test]
    async fn redis_store_passes_the_shared_suite_on_a_tls_cluster() {
        let cluster = harness::RedisCluster::start_tls(3).expect("a TLS Redis Cluster");
        let ca = harness::RedisCluster::test_ca();
        assert!(cluster.urls().starts_with("rediss://"));
        let redis =
            Arc::new(RedisHandle::open(&cluster.urls(), "igwtest:", Some(&ca), true).unwrap());
        let store = RedisLimits::new(redis.clone());
        tests_shared::suite(&store).await;
        let spent = spent_nano(&redis, "org-suite").await.unwrap();
        assert!(spent > 0, "{spent}");
    }

    #[tokio::test]
    async fn memory_store_passes_the_shared_suite() {
        tests_shared::suite(&MemoryLimits::default()).await;
    }

    #[tokio::test]
    async fn redis_store_leases_slots_to_live_owners() {
        let redis = test_redis();
        let store = RedisLimits::new(redis.clone());
        tests_shared::lease_suite(&store).await;
        // The set lives no longer than its slots need: one lease.
        let plan = crate::accounts::RatePlan {
            max_concurrent: 1,
            ..Default::default()
        };
        let r = crate::limits::AdmitRequest {
            org: "org-ttl",
            model: "base",
            request_id: "r",
            tokens: 1,
            plan,
            budget_nano: None,
            slot_lease_ms: 1000,
            renew_every_ms: 100,
            taken_over: false,
        };
        assert_eq!(store.admit(&r).await.unwrap().verdict, Verdict::Admitted);
        let mut conn = redis.conn().await.unwrap();
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&store.keys("org-ttl", "base").inflight)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!((1..=1000).contains(&pttl), "{pttl}");
        cleanup(&redis).await;
    }

    #[tokio::test]
    async fn memory_store_leases_slots_to_live_owners() {
        tests_shared::lease_suite(&MemoryLimits::default()).await;
    }
}
