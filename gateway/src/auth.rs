//! Bearer-key authentication. Keys are kept only as sha256 digests; a
//! request's key is hashed once and looked up by digest.

use crate::config::StaticKey;
use crate::error::ApiError;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
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

/// Extracts the key from `Authorization: Bearer <key>` (scheme case-insensitive).
pub fn bearer_token(header: Option<&[u8]>) -> Option<&str> {
    let value = std::str::from_utf8(header?).ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Static keys from the config file (the embedded mode's key store).
pub struct Authenticator {
    keys: HashMap<[u8; 32], Principal>,
}

impl Authenticator {
    pub fn from_config(keys: &[StaticKey]) -> anyhow::Result<Self> {
        let mut map = HashMap::with_capacity(keys.len());
        for k in keys {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(&k.sha256, &mut digest)?;
            map.insert(
                digest,
                Principal {
                    org: k.org.as_str().into(),
                    key_name: k.name.as_str().into(),
                    key_id: k.sha256[..12].into(),
                },
            );
        }
        Ok(Self { keys: map })
    }

    /// 401 `invalid_api_key` for a missing, malformed or unknown key.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Principal, ApiError> {
        let token = bearer_token(authorization).ok_or_else(ApiError::invalid_api_key)?;
        self.keys
            .get(&hash_key(token))
            .cloned()
            .ok_or_else(ApiError::invalid_api_key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Authenticator {
        Authenticator::from_config(&[StaticKey {
            sha256: hash_key_hex("sk-test"),
            org: "org-a".into(),
            name: "ci".into(),
        }])
        .unwrap()
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some(b"Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some(b"bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some(b"Basic abc")), None);
        assert_eq!(bearer_token(Some(b"Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }

    #[test]
    fn known_key_maps_to_its_org_and_others_are_401() {
        let a = auth();
        let p = a.authenticate(Some(b"Bearer sk-test")).unwrap();
        assert_eq!(&*p.org, "org-a");
        assert_eq!(p.key_id.len(), 12);
        let e = a.authenticate(Some(b"Bearer sk-wrong")).unwrap_err();
        assert_eq!((e.status, e.code.as_ref()), (401, "invalid_api_key"));
        assert_eq!(a.authenticate(None).unwrap_err().status, 401);
    }
}
