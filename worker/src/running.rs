//! The generations running on this worker, by request id, so that
//! `Cancel` can stop one and say how many tokens it produced: a client
//! that leaves is billed what the engine generated, not only what had
//! reached the gateway (a batched reply holds up to a second of output).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::oneshot;

/// How a cancelled generation hands back its count of generated tokens.
pub type Reply = oneshot::Sender<u32>;

/// Running generations by request id (a request id may run more than once
/// on one worker, for example a planner's calls: each is its own entry).
#[derive(Debug, Default)]
pub struct Running {
    by_request: Mutex<HashMap<String, Vec<Entry>>>,
    next: AtomicU64,
}

#[derive(Debug)]
struct Entry {
    key: u64,
    stop: oneshot::Sender<Reply>,
}

/// A registered generation: its stop signal, and its entry removed when
/// it is dropped (however the generation ends).
#[derive(Debug)]
pub struct Registered {
    running: Arc<Running>,
    request_id: String,
    key: u64,
    /// Fires when `Cancel` names the generation; it answers on the reply.
    pub stop: oneshot::Receiver<Reply>,
}

impl Running {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Vec<Entry>>> {
        match self.by_request.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Registers a generation that is starting.
    pub fn register(self: &Arc<Self>, request_id: &str) -> Registered {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let (stop, rx) = oneshot::channel();
        self.map()
            .entry(request_id.to_owned())
            .or_default()
            .push(Entry { key, stop });
        Registered {
            running: Arc::clone(self),
            request_id: request_id.to_owned(),
            key,
            stop: rx,
        }
    }

    /// Stops every generation running under `request_id`; `None` when none
    /// was, else the tokens they had generated. Each answers when it has
    /// stopped, so nothing is generated after the count.
    pub async fn cancel(&self, request_id: &str) -> Option<u32> {
        let entries = self.map().remove(request_id)?;
        let mut replies = Vec::with_capacity(entries.len());
        for entry in entries {
            let (reply, rx) = oneshot::channel();
            if entry.stop.send(reply).is_ok() {
                replies.push(rx);
            }
        }
        let mut tokens = 0u32;
        for rx in replies {
            // A generation that ended meanwhile drops its reply: it was
            // counted as it ended.
            tokens = tokens.saturating_add(rx.await.unwrap_or(0));
        }
        Some(tokens)
    }

    /// Generations running now (for tests and metrics).
    pub fn len(&self) -> usize {
        self.map().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut map = self.running.map();
        if let Some(entries) = map.get_mut(&self.request_id) {
            entries.retain(|e| e.key != self.key);
            if entries.is_empty() {
                map.remove(&self.request_id);
            }
        }
    }
}

/// Reads a generation's count when it is cancelled.
pub fn tokens(count: &AtomicU32) -> u32 {
    count.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generation that answers its stop with `tokens`.
    fn answering(mut r: Registered, tokens: u32) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            if let Ok(reply) = (&mut r.stop).await {
                let _ = reply.send(tokens);
            }
        })
    }

    #[tokio::test]
    async fn cancel_stops_every_generation_of_the_id_and_sums_their_tokens() {
        let running = Arc::new(Running::default());
        let a = answering(running.register("req"), 7);
        let b = answering(running.register("req"), 5);
        let other = running.register("other");
        assert_eq!(running.len(), 3);
        assert_eq!(running.cancel("req").await, Some(12));
        let _ = (a.await, b.await);
        assert_eq!(running.cancel("req").await, None, "removed once cancelled");
        assert_eq!(running.len(), 1);
        drop(other);
        assert!(running.is_empty(), "an ended generation leaves the table");
    }

    #[tokio::test]
    async fn an_ended_generation_is_not_found() {
        let running = Arc::new(Running::default());
        drop(running.register("req"));
        assert_eq!(running.cancel("req").await, None);
        assert_eq!(running.cancel("missing").await, None);
    }
}
