//! A test's private corner of the shared test Redis: a random key prefix,
//! and a cleanup that deletes only keys under it.

use anyhow::{Context, Result};

/// The test Redis: `$TEST_REDIS_URL`, default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A random `igwtest:<hex>:` prefix on the test Redis. Dropping it deletes
/// every key under the prefix (and nothing else).
#[derive(Debug)]
pub struct RedisScope {
    url: String,
    prefix: String,
}

impl RedisScope {
    /// A fresh prefix on the test Redis; fails if Redis does not answer.
    pub fn new() -> Result<Self> {
        let scope = Self {
            url: redis_url(),
            prefix: format!("igwtest:{}:", crate::random_hex(12)),
        };
        let mut conn = scope.connection()?;
        let pong: String = redis::cmd("PING")
            .query(&mut conn)
            .with_context(|| format!("PING {}", scope.url))?;
        anyhow::ensure!(pong == "PONG", "unexpected PING reply {pong}");
        Ok(scope)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The test Redis's socket address, for a [`crate::FaultProxy`] in
    /// front of it.
    pub fn addr(&self) -> Result<std::net::SocketAddr> {
        use std::net::ToSocketAddrs;
        let rest = self
            .url
            .strip_prefix("redis://")
            .context("the test Redis URL is not redis://")?;
        let authority = rest.split('/').next().unwrap_or(rest);
        let host_port = authority.rsplit('@').next().unwrap_or(authority);
        let host_port = if host_port.contains(':') {
            host_port.to_string()
        } else {
            format!("{host_port}:6379")
        };
        host_port
            .to_socket_addrs()?
            .next()
            .context("the test Redis's host has no address")
    }

    /// `igwtest:<hex>:`; give it to the gateway as `store.key_prefix`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A synchronous connection, for test assertions on stored state.
    pub fn connection(&self) -> Result<redis::Connection> {
        let client = redis::Client::open(self.url.as_str())?;
        client
            .get_connection_with_timeout(std::time::Duration::from_secs(2))
            .with_context(|| format!("connecting to Redis at {}", self.url))
    }

    /// Every key under the prefix (SCAN, so it is safe on a busy server).
    pub fn keys(&self) -> Result<Vec<String>> {
        let mut conn = self.connection()?;
        let pattern = format!("{}*", glob_escape(&self.prefix));
        let iter: redis::Iter<String> = redis::cmd("SCAN")
            .cursor_arg(0)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .clone()
            .iter(&mut conn)?;
        Ok(iter.filter_map(Result::ok).collect())
    }

    /// Deletes every key under the prefix; returns how many went.
    pub fn cleanup(&self) -> Result<usize> {
        let keys = self.keys()?;
        if keys.is_empty() {
            return Ok(0);
        }
        let mut conn = self.connection()?;
        let mut deleted = 0;
        for chunk in keys.chunks(500) {
            let n: usize = redis::cmd("UNLINK").arg(chunk).query(&mut conn)?;
            deleted += n;
        }
        Ok(deleted)
    }
}

impl Drop for RedisScope {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("RedisScope: cleanup of {} failed: {e:#}", self.prefix);
        }
    }
}

/// Escapes Redis glob metacharacters so the prefix matches literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_deletes_only_keys_under_the_prefix() {
        let a = RedisScope::new().unwrap();
        let b = RedisScope::new().unwrap();
        let mut conn = a.connection().unwrap();
        let _: () = redis::cmd("SET")
            .arg(format!("{}x", a.prefix()))
            .arg(1)
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(format!("{}{{tag}}:y", a.prefix()))
            .arg(1)
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("SET")
            .arg(format!("{}x", b.prefix()))
            .arg(1)
            .query(&mut conn)
            .unwrap();
        assert_eq!(a.keys().unwrap().len(), 2);
        assert_eq!(a.cleanup().unwrap(), 2);
        assert!(a.keys().unwrap().is_empty());
        assert_eq!(b.keys().unwrap().len(), 1, "another scope's keys stay");
        let b_key = format!("{}x", b.prefix());
        drop(b);
        let exists: bool = redis::cmd("EXISTS").arg(&b_key).query(&mut conn).unwrap();
        assert!(!exists, "dropping a scope deletes its keys");
    }
}
