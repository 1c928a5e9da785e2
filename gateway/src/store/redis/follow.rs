//! Reading a run's event log as it grows: the Stream's entry ids mapped
//! to sequence numbers, and a follower blocking on `XREAD`.

use super::{unavailable, RoundTrip};
use crate::api::responses::EncodedEvent;
use crate::redis::RedisHandle;
use crate::store::{EventFollower, StoreResult};
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use std::sync::Arc;
use std::time::Duration;

/// `0-<seq+1>` stream entry ids back to frames.
pub(super) fn frames(entries: Vec<(String, Vec<String>)>) -> Vec<EncodedEvent> {
    entries
        .into_iter()
        .filter_map(|(id, fields)| {
            let seq = id.split_once('-')?.1.parse::<u64>().ok()?.checked_sub(1)?;
            let mut name = None;
            let mut data = None;
            for pair in fields.chunks_exact(2) {
                match pair[0].as_str() {
                    "t" => name = Some(pair[1].clone()),
                    "d" => data = Some(pair[1].clone()),
                    _ => {}
                }
            }
            Some(EncodedEvent {
                seq,
                name: name?,
                data: data?,
            })
        })
        .collect()
}

/// The first stream id strictly after sequence number `after`.
pub(super) fn start_id(after: Option<u64>) -> String {
    match after {
        Some(n) => format!("0-{}", n + 2),
        None => "-".into(),
    }
}

/// Follows a Stream with `XREAD BLOCK` on its own connection (a blocking
/// command would stall every other request on the shared one), to the
/// node serving the stream's slot on a cluster.
pub(super) struct RedisFollower {
    redis: Arc<RedisHandle>,
    conn: Option<MultiplexedConnection>,
    key: String,
    /// The last stream id delivered.
    last_id: String,
}

impl RedisFollower {
    /// Follows the log at `key` from the event after sequence number
    /// `after` (from its start for `None`).
    pub(super) fn new(redis: Arc<RedisHandle>, key: String, after: Option<u64>) -> Self {
        Self {
            redis,
            conn: None,
            key,
            last_id: after.map_or_else(|| "0-0".to_string(), |n| format!("0-{}", n + 1)),
        }
    }
}

type XReadReply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;

#[async_trait]
impl EventFollower for RedisFollower {
    async fn next_batch(&mut self, wait: Duration) -> StoreResult<Vec<EncodedEvent>> {
        // A second try only after the cluster's slot map was fetched
        // again: after a redirect (the stream's slot moved since the
        // connection was made), or after its node refused, dropped or did
        // not answer (a killed primary sends no redirect; its replica may
        // hold the slot now).
        let mut refreshed = false;
        let reply: XReadReply = loop {
            let conn = match &mut self.conn {
                Some(c) => c,
                None => match self
                    .redis
                    .dedicated(&self.key, wait + Duration::from_secs(2))
                    .await
                {
                    Ok(c) => self.conn.insert(c),
                    Err(e) => {
                        if !refreshed && self.redis.refresh_after(&self.key, &e).await {
                            refreshed = true;
                            continue;
                        }
                        return Err(unavailable("follow")(e));
                    }
                },
            };
            let _rt = RoundTrip::start("follow");
            let reply = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1000)
                .arg("BLOCK")
                .arg(wait.as_millis().max(1) as u64)
                .arg("STREAMS")
                .arg(&self.key)
                .arg(&self.last_id)
                .query_async(conn)
                .await;
            match reply {
                Ok(r) => break r,
                Err(e) => {
                    self.conn = None;
                    if !refreshed && self.redis.refresh_after(&self.key, &e).await {
                        refreshed = true;
                        continue;
                    }
                    return Err(unavailable("follow")(e));
                }
            }
        };
        let entries = reply
            .and_then(|keys| keys.into_iter().next())
            .map(|(_, entries)| entries)
            .unwrap_or_default();
        if let Some((id, _)) = entries.last() {
            self.last_id.clone_from(id);
        }
        Ok(frames(entries))
    }
}
