//! Whether the engine is fit to take requests: its health endpoint says
//! so (the scrape in [`super::load`]) *and* it is not stalled. An engine
//! can answer `/health` while its generations hang (a wedged scheduler or
//! GPU); the relay notices that as a first-byte or idle timeout and marks
//! the engine stalled here, which takes the worker out of selection
//! (`grpc.health.v1` NOT_SERVING). The stall lasts until the engine
//! answers a generation again: any request's first event, or the probe
//! below, a one-token chat completion sent while stalled (no request
//! would reach a worker out of selection, and `/health` proved nothing).

use super::client::Http;
use super::kind::{Kind, MaxTokensField};
use bytes::Bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Readiness shared by the scrape, the probe and every generation.
#[derive(Debug)]
pub struct Liveness {
    ready: watch::Sender<bool>,
    /// The last health scrape succeeded.
    healthy: AtomicBool,
    /// A generation timed out and none has answered since.
    stalled: AtomicBool,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            ready: watch::channel(true).0,
            healthy: AtomicBool::new(true),
            stalled: AtomicBool::new(false),
        }
    }
}

impl Liveness {
    /// Follows readiness: healthy and not stalled.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// The outcome of a health scrape.
    pub fn scraped(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
        self.publish();
    }

    /// A generation's first event arrived in time: the engine answers.
    pub fn answered(&self) {
        // The common case costs one load.
        if self.stalled.load(Ordering::Relaxed) && self.stalled.swap(false, Ordering::Relaxed) {
            tracing::info!("the upstream engine answers again");
            self.publish();
        }
    }

    /// A generation got nothing from the engine within a timeout.
    pub fn timed_out(&self) {
        if !self.stalled.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the upstream engine stalled: the worker reports NOT_SERVING until it answers"
            );
            self.publish();
        }
    }

    fn publish(&self) {
        // Computed under the channel's lock, so the last writer publishes
        // from the latest flags whatever the interleaving.
        self.ready.send_if_modified(|ready| {
            let now = self.healthy.load(Ordering::Relaxed) && !self.stalled.load(Ordering::Relaxed);
            std::mem::replace(ready, now) != now
        });
    }
}

/// While the engine is stalled, sends it a one-token chat completion every
/// `interval` (each bounded by `timeout`, the first-byte timeout); the first
/// that succeeds clears the stall.
pub async fn probe(
    http: Http,
    kind: Kind,
    model: String,
    liveness: Arc<Liveness>,
    interval: Duration,
    timeout: Duration,
) {
    let body = probe_body(kind, &model);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !liveness.is_stalled() {
            continue;
        }
        match http
            .call(
                http::Method::POST,
                "/v1/chat/completions",
                body.clone(),
                timeout,
            )
            .await
        {
            Ok((code, _)) if code.is_success() => liveness.answered(),
            Ok((code, _)) => tracing::debug!(%code, "stall probe refused"),
            Err(e) => tracing::debug!(error = %e.message(), "stall probe failed"),
        }
    }
}

/// A non-streamed one-token request (no `stream_options`: vLLM refuses
/// them without `stream`).
fn probe_body(kind: Kind, model: &str) -> Bytes {
    let field = match kind.max_tokens_field() {
        MaxTokensField::MaxTokens => "max_tokens",
        MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
    };
    let mut body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "stream": false,
    });
    body[field] = serde_json::json!(1);
    Bytes::from(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_needs_health_and_no_stall() {
        let l = Liveness::default();
        let rx = l.subscribe();
        assert!(*rx.borrow());
        l.timed_out();
        assert!(!*rx.borrow(), "a stall takes the worker out");
        l.scraped(true);
        assert!(!l.is_ready(), "a good /health does not clear a stall");
        l.answered();
        assert!(l.is_ready(), "an answer does");
        l.scraped(false);
        assert!(!l.is_ready());
        l.answered();
        assert!(!l.is_ready(), "an answer does not outvote /health");
        l.scraped(true);
        assert!(l.is_ready());
    }

    #[test]
    fn the_probe_names_the_kinds_limit_field() {
        let v: serde_json::Value =
            serde_json::from_slice(&probe_body(Kind::Openai, "m")).expect("json");
        assert_eq!(v["max_completion_tokens"], 1);
        assert_eq!(v["stream"], false);
        let v: serde_json::Value =
            serde_json::from_slice(&probe_body(Kind::Vllm, "m")).expect("json");
        assert_eq!(
            (v["max_tokens"].as_u64(), v["model"].as_str()),
            (Some(1), Some("m"))
        );
    }
}
