//! Idempotency keys of the two generation creates (`Idempotency-Key` on
//! `POST /v1/chat/completions` and `POST /v1/responses`, the payment APIs'
//! convention): the same key, organisation and body within the window get
//! the first request's outcome, never a second generation or charge.
//!
//! A key's life, as its record says it:
//! 1. **Claimed** (`outcome: None`): one atomic insert-if-absent with a
//!    short time to live, the *lease* (`store.lease_millis` and a
//!    heartbeat), renewed by its replica while the request runs
//!    ([`claims`]), so a replica that dies mid-run frees the key within
//!    one lease. A duplicate meanwhile is told the key is in use (409).
//! 2. **Completed** (`outcome: Some`): the claimant, and only it (its
//!    `token`), replaces the record with what a retry replays, kept for the
//!    window.
//! 3. **Released**: a first request that did not succeed (refused, failed,
//!    its client left) deletes its claim, so a retry runs.
//!
//! Two implementations with one suite, picked like the Responses store's:
//! Redis (every replica shares the keys; `idem:{<digest>}` under the
//! store's key prefix) and in-process (`gateway up`). This module knows no
//! HTTP: the routes read the header and map [`IdempotencyError`] at the
//! edge. Keys are kept only as digests.

pub mod claims;
pub mod memory;
pub mod redis;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// The longest key accepted (Stripe's bound).
pub const MAX_KEY_LEN: usize = 255;

/// What a retry under a key finds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The claimant's random token: only it completes or releases the key.
    pub token: String,
    /// [`fingerprint`] of the first request's route and body.
    pub fingerprint: String,
    /// `None` while the first request runs.
    pub outcome: Option<Outcome>,
}

/// What the first request's success was, enough to give it again. Only a
/// success is ever recorded; anything else releases the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// A chat completion: its `chat.completion` JSON, or for a stream the
    /// same reply folded into a few chunks (`translate::replay`), as sent
    /// again.
    Chat { body: String, stream: bool },
    /// A Responses reply that was not stored: the final response object.
    /// A streamed one is sent again as its events, folded.
    Response { body: String, stream: bool },
    /// A stored response, read back by id: a retry sees what a retrieve
    /// would. A streamed background run is followed from its first event.
    Stored {
        response_id: String,
        stream: bool,
        background: bool,
    },
    /// It succeeded, but its reply was larger than the record keeps
    /// (`idempotency_max_record_bytes`): a retry is told so, not run.
    NotKept,
}

/// Why the idempotency store could not answer. Mapped to the spec's
/// envelope in `error/map.rs`: an outage is 503 `store_unavailable`
/// like every store outage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyError {
    /// The backing store did not answer `op`.
    Unavailable { op: &'static str },
    /// A record could not be decoded.
    Corrupt,
}

impl std::fmt::Display for IdempotencyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unavailable { op } => write!(f, "the idempotency store did not answer ({op})"),
            Self::Corrupt => f.write_str("an idempotency record could not be read"),
        }
    }
}

impl std::error::Error for IdempotencyError {}

pub type IdempotencyResult<T> = Result<T, IdempotencyError>;

/// Where idempotency records live. `key` is always [`record_key`]'s digest.
#[async_trait::async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// Inserts `record` (a claim: no outcome) for `lease` unless the key
    /// has a record; atomically. `None`: claimed; else the record found.
    async fn claim(
        &self,
        key: &str,
        record: &Record,
        lease: Duration,
    ) -> IdempotencyResult<Option<Record>>;

    /// Extends `token`'s claim of `key` to `lease` from now, if it is still
    /// that claim (not completed, released, or lapsed). False otherwise.
    async fn renew(&self, key: &str, token: &str, lease: Duration) -> IdempotencyResult<bool>;

    /// Replaces the claim with `record` (its outcome) for `keep`, if the
    /// claim is still `record.token`'s. False when it was not (its lease
    /// ran out, and another request may hold the key now).
    async fn complete(&self, key: &str, record: &Record, keep: Duration)
        -> IdempotencyResult<bool>;

    /// Deletes the claim if it is still `token`'s and has no outcome.
    async fn release(&self, key: &str, token: &str) -> IdempotencyResult<()>;
}

/// The idempotency store to use: Redis through `redis` (the process's
/// handle) when configured, else in-process, keeping at most
/// `max_memory_bytes` of records.
pub fn open(
    redis: Option<Arc<crate::redis::RedisHandle>>,
    max_memory_bytes: usize,
) -> Arc<dyn IdempotencyStore> {
    match redis {
        Some(handle) => Arc::new(redis::RedisIdempotency::new(handle)),
        None => Arc::new(memory::MemoryIdempotency::new(max_memory_bytes)),
    }
}

/// What a record under `key` takes in a store, about: its key, token,
/// fingerprint and kept reply, and the rest of its encoding. The
/// in-process bound and the organisation's storage cap count this.
pub fn record_bytes(key: &str, record: &Record) -> usize {
    let reply = match &record.outcome {
        Some(Outcome::Chat { body, .. } | Outcome::Response { body, .. }) => body.len(),
        Some(Outcome::Stored { response_id, .. }) => response_id.len(),
        Some(Outcome::NotKept) | None => 0,
    };
    // The JSON around the fields, and the map's own entry.
    const FRAME: usize = 96;
    key.len() + record.token.len() + record.fingerprint.len() + reply + FRAME
}

/// Why a header value is not a usable key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyProblem {
    Empty,
    TooLong,
    /// Anything but visible ASCII (0x21–0x7e).
    NotVisibleAscii,
}

/// The key a client sent, checked: 1 to [`MAX_KEY_LEN`] visible ASCII
/// characters (a UUID, as most clients send, is one).
pub fn parse_key(raw: &[u8]) -> Result<&str, KeyProblem> {
    if raw.is_empty() {
        return Err(KeyProblem::Empty);
    }
    if raw.len() > MAX_KEY_LEN {
        return Err(KeyProblem::TooLong);
    }
    if !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(KeyProblem::NotVisibleAscii);
    }
    // Visible ASCII is UTF-8.
    std::str::from_utf8(raw).map_err(|_| KeyProblem::NotVisibleAscii)
}

/// The record's key: the organisation and the client's key hashed
/// together, so another organisation's same key is another record and
/// the client's key is never stored.
pub fn record_key(org: &str, key: &str) -> String {
    crate::auth::org_scoped_digest(org, key)
}

/// What makes two requests "the same": the route and the body's JSON in
/// canonical form (object keys sorted, no insignificant whitespace), so a
/// client that re-serializes its body differently is still the same
/// request. A body that is not JSON is hashed as its bytes (it is refused
/// by parsing before any key is claimed anyway). The routes take it only
/// of a body their bounded parse accepted, so a hostile body refused by
/// the parse costs no more with the header than without.
pub fn fingerprint(route: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(route.as_bytes());
    h.update([0]);
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => canonical(&v, &mut h),
        Err(_) => h.update(body),
    }
    hex::encode(h.finalize())
}

/// Feeds `v`'s canonical JSON to `h`: sorted keys, compact.
fn canonical(v: &Value, h: &mut Sha256) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            h.update(b"{");
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    h.update(b",");
                }
                canonical(&Value::String(k.clone()), h);
                h.update(b":");
                canonical(&map[k], h);
            }
            h.update(b"}");
        }
        Value::Array(items) => {
            h.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    h.update(b",");
                }
                canonical(item, h);
            }
            h.update(b"]");
        }
        // Scalars serialize one way; serializing into memory cannot fail.
        scalar => h.update(serde_json::to_vec(scalar).unwrap_or_default()),
    }
}

/// A fresh claim token.
pub fn new_token() -> String {
    use rand::distr::{Alphanumeric, SampleString};
    Alphanumeric.sample_string(&mut rand::rng(), 24)
}

/// The shared test suite: every implementation must pass it.
#[cfg(test)]
pub mod suite {
    use super::*;

    fn claim(token: &str, fingerprint: &str) -> Record {
        Record {
            token: token.into(),
            fingerprint: fingerprint.into(),
            outcome: None,
        }
    }

    pub async fn run(store: &dyn IdempotencyStore, tag: &str) {
        let key = record_key("org-a", &format!("k-{tag}"));
        let long = Duration::from_secs(60);

        // The first claim wins; a second finds the first's record.
        let first = claim("t1", "fp");
        assert_eq!(store.claim(&key, &first, long).await.unwrap(), None);
        let found = store.claim(&key, &claim("t2", "fp"), long).await.unwrap();
        assert_eq!(found, Some(first.clone()));

        // Only the claimant completes; the outcome is what a retry finds.
        let mut done = first.clone();
        done.outcome = Some(Outcome::Stored {
            response_id: "resp_1".into(),
            stream: false,
            background: true,
        });
        let mut stranger = done.clone();
        stranger.token = "t2".into();
        assert!(!store.complete(&key, &stranger, long).await.unwrap());
        assert!(store.complete(&key, &done, long).await.unwrap());
        let found = store.claim(&key, &claim("t3", "fp"), long).await.unwrap();
        assert_eq!(found, Some(done.clone()));
        // A completed record is not released, by anyone.
        store.release(&key, "t1").await.unwrap();
        let found = store.claim(&key, &claim("t3", "fp"), long).await.unwrap();
        assert_eq!(found, Some(done));

        // A released claim frees the key; only its claimant releases it.
        let other = record_key("org-a", &format!("k2-{tag}"));
        assert_eq!(
            store.claim(&other, &claim("t1", "fp"), long).await.unwrap(),
            None
        );
        store.release(&other, "t9").await.unwrap();
        assert!(store
            .claim(&other, &claim("t2", "fp"), long)
            .await
            .unwrap()
            .is_some());
        store.release(&other, "t1").await.unwrap();
        assert_eq!(
            store.claim(&other, &claim("t2", "fp"), long).await.unwrap(),
            None
        );

        // Only the claimant renews, and only a claim: a renewal never cuts
        // a finished record's window short.
        let renewing = record_key("org-a", &format!("k4-{tag}"));
        let short = Duration::from_millis(150);
        assert_eq!(
            store
                .claim(&renewing, &claim("t1", "fp"), short)
                .await
                .unwrap(),
            None
        );
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(80)).await;
            assert!(!store.renew(&renewing, "t2", short).await.unwrap());
            assert!(store.renew(&renewing, "t1", short).await.unwrap());
        }
        let mut finished = claim("t1", "fp");
        finished.outcome = Some(Outcome::NotKept);
        assert!(store.complete(&renewing, &finished, long).await.unwrap());
        assert!(!store.renew(&renewing, "t1", short).await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let found = store.claim(&renewing, &claim("t2", "fp"), long).await;
        assert_eq!(found.unwrap(), Some(finished));

        // A lapsed claim frees the key; its claimant can no longer complete.
        let lapsing = record_key("org-a", &format!("k3-{tag}"));
        let short = Duration::from_millis(50);
        assert_eq!(
            store
                .claim(&lapsing, &claim("t1", "fp"), short)
                .await
                .unwrap(),
            None
        );
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(
            store
                .claim(&lapsing, &claim("t2", "fp"), long)
                .await
                .unwrap(),
            None
        );
        let mut late = claim("t1", "fp");
        late.outcome = Some(Outcome::NotKept);
        assert!(!store.complete(&lapsing, &late, long).await.unwrap());

        // Another organisation's same key is another record.
        let elsewhere = record_key("org-b", &format!("k-{tag}"));
        assert_eq!(
            store
                .claim(&elsewhere, &claim("t1", "fp"), long)
                .await
                .unwrap(),
            None
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_store_passes_the_suite() {
        suite::run(&memory::MemoryIdempotency::new(1 << 20), "mem").await;
    }

    #[test]
    fn keys_are_visible_ascii_up_to_255() {
        assert_eq!(parse_key(b"abc-123_XYZ:="), Ok("abc-123_XYZ:="));
        assert_eq!(parse_key(b""), Err(KeyProblem::Empty));
        assert_eq!(parse_key(&[b'a'; 255]).map(str::len), Ok(255));
        assert_eq!(parse_key(&[b'a'; 256]), Err(KeyProblem::TooLong));
        for bad in [&b"a b"[..], b"tab\t", b"\x7f", "é".as_bytes()] {
            assert_eq!(parse_key(bad), Err(KeyProblem::NotVisibleAscii), "{bad:?}");
        }
    }

    #[test]
    fn the_record_key_is_a_digest_per_organisation() {
        let a = record_key("org-a", "key");
        assert_eq!(a.len(), 64);
        assert!(!a.contains("key"));
        assert_ne!(a, record_key("org-b", "key"));
        // The separator keeps (org, key) pairs apart.
        assert_ne!(record_key("ab", "c"), record_key("a", "bc"));
    }

    #[test]
    fn the_fingerprint_ignores_key_order_and_whitespace_but_not_values() {
        let a = fingerprint(
            "chat",
            br#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#,
        );
        let b = fingerprint(
            "chat",
            br#" { "messages" : [ {"content":"hi", "role":"user"} ], "model":"base" } "#,
        );
        assert_eq!(a, b);
        let c = fingerprint(
            "chat",
            br#"{"model":"base","messages":[{"role":"user","content":"ho"}]}"#,
        );
        assert_ne!(a, c);
        // Array order is meaning.
        assert_ne!(
            fingerprint("r", br#"{"input":["a","b"]}"#),
            fingerprint("r", br#"{"input":["b","a"]}"#)
        );
        // The same body on the other route is another request.
        assert_ne!(
            a,
            fingerprint(
                "responses",
                br#"{"model":"base","messages":[{"role":"user","content":"hi"}]}"#
            )
        );
        // Not JSON: the bytes.
        assert_ne!(fingerprint("chat", b"{x"), fingerprint("chat", b"{y"));
    }

    #[test]
    fn records_round_trip_through_json() {
        for outcome in [
            None,
            Some(Outcome::Chat {
                body: "{}".into(),
                stream: true,
            }),
            Some(Outcome::Response {
                body: "{}".into(),
                stream: false,
            }),
            Some(Outcome::NotKept),
        ] {
            let r = Record {
                token: new_token(),
                fingerprint: "fp".into(),
                outcome,
            };
            let text = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Record>(&text).unwrap(), r);
        }
    }
}
