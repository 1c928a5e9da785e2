//! Open Responses WebSocket connections per key, on this replica: the cap
//! of `[websocket] max_connections_per_key`, taken at the upgrade and
//! given back when the connection ends.
//!
//! Per key rather than per organisation: a key is what one client (one
//! Codex session, one CI job) holds, so one runaway client is refused
//! without shutting out the rest of its organisation; per replica because
//! what a connection costs is this process's memory, and a count shared
//! through Redis would outlive a replica that died with its connections.

use crate::auth::Principal;
use crate::metrics::METRICS;
use prometheus::IntGauge;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The open connections of each key (only keys with one open are kept).
#[derive(Default)]
pub struct Connections {
    /// 0: no cap.
    max_per_key: u32,
    open: Arc<Mutex<HashMap<Arc<str>, u32>>>,
}

/// An upgrade refused: the key holds `limit` connections open already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyConnections {
    pub limit: u32,
}

/// One connection counted against its key (and on the organisation's
/// gauge) for as long as it lives.
pub struct OpenConnection {
    open: Arc<Mutex<HashMap<Arc<str>, u32>>>,
    key_id: Arc<str>,
    gauge: IntGauge,
}

impl Connections {
    pub fn new(max_per_key: u32) -> Self {
        Self {
            max_per_key,
            open: Arc::default(),
        }
    }

    /// Counts a connection of `principal`'s key, or refuses it at the cap.
    pub fn open(&self, principal: &Principal) -> Result<OpenConnection, TooManyConnections> {
        {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            let n = open.entry(principal.key_id.clone()).or_insert(0);
            if self.max_per_key > 0 && *n >= self.max_per_key {
                return Err(TooManyConnections {
                    limit: self.max_per_key,
                });
            }
            *n += 1;
        }
        let gauge = METRICS
            .websocket_org_connections
            .with_label_values(&[&*principal.org]);
        gauge.inc();
        Ok(OpenConnection {
            open: self.open.clone(),
            key_id: principal.key_id.clone(),
            gauge,
        })
    }

    /// The connections `key_id` holds open.
    pub fn open_for(&self, key_id: &str) -> u32 {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(key_id).copied().unwrap_or(0)
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.key_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(org: &str, key_id: &str) -> Principal {
        Principal {
            org: org.into(),
            key_name: "k".into(),
            key_id: key_id.into(),
        }
    }

    #[test]
    fn a_key_holds_at_most_its_cap_and_a_closed_connection_frees_its_place() {
        let c = Connections::new(2);
        let (a, b) = (
            principal("org-conn-a", "aaaaaaaaaaaa"),
            principal("org-conn-a", "bbbbbbbbbbbb"),
        );
        let gauge = || {
            METRICS
                .websocket_org_connections
                .with_label_values(&["org-conn-a"])
                .get()
        };
        let first = c.open(&a).unwrap();
        let _second = c.open(&a).unwrap();
        assert_eq!(c.open(&a).err(), Some(TooManyConnections { limit: 2 }));
        // Another key of the same organisation has its own count.
        let other = c.open(&b).unwrap();
        assert_eq!((c.open_for("aaaaaaaaaaaa"), gauge()), (2, 3));
        drop(first);
        assert_eq!(c.open_for("aaaaaaaaaaaa"), 1);
        let _third = c.open(&a).unwrap();
        drop(other);
        assert_eq!((c.open_for("bbbbbbbbbbbb"), gauge()), (0, 2));
        // No entry is kept for a key with nothing open.
        assert!(!c.open.lock().unwrap().contains_key("bbbbbbbbbbbb"));
    }

    #[test]
    fn zero_is_no_cap() {
        let c = Connections::new(0);
        let p = principal("org-conn-z", "cccccccccccc");
        let held: Vec<_> = (0..100).map(|_| c.open(&p).unwrap()).collect();
        assert_eq!(c.open_for("cccccccccccc"), 100);
        drop(held);
        assert_eq!(c.open_for("cccccccccccc"), 0);
    }
}
