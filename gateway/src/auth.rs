//! Bearer keys: parsing the header and hashing. Keys are kept only as
//! sha256 digests; a request's key is hashed once and looked up by digest
//! (the lookup, cache and permissions are in `accounts/`).

use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Who is calling: the organisation and key a request is billed and limited to.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    pub org: Arc<str>,
    pub key_name: Arc<str>,
    /// First 12 hex digits of the key's digest: safe to log and to label metrics.
    pub key_id: Arc<str>,
}

/// The digest under which a key is stored.
pub fn hash_key(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// `gateway hash-key` output and config form of a digest.
pub fn hash_key_hex(secret: &str) -> String {
    hex::encode(hash_key(secret))
}

/// The digest of a name a client chose within its organisation (a planner
/// session id, an `Idempotency-Key`), hex: another organisation's same
/// name is another digest, and the name itself is never stored.
pub fn org_scoped_digest(org: &str, name: &str) -> String {
    let mut h = Sha256::new();
    h.update(org.as_bytes());
    // The separator keeps (org, name) pairs apart: ("ab", "c") ≠ ("a", "bc").
    h.update([0]);
    h.update(name.as_bytes());
    hex::encode(h.finalize())
}

/// Extracts the key from `Authorization: Bearer <key>` (scheme case-insensitive).
pub fn bearer_token(header: Option<&[u8]>) -> Option<&str> {
    let value = std::str::from_utf8(header?).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some(b"Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some(b"bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some(b"Basic abc")), None);
        assert_eq!(bearer_token(Some(b"Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }
}
