//! Readiness and load from the engine itself: its health endpoint and its
//! Prometheus metrics, scraped on a short interval, so the gateway's
//! least-loaded and prefix-affine routing see the engine's real queue
//! (other clients of the engine included).

use super::client::Http;
use super::kind::{Kind, MetricNames};
use super::liveness::Liveness;
use crate::seam::chat::EngineLoad;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Per-scrape timeout: a stuck engine must not stall the loop.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Sums each wanted family over its label sets (one series per engine
/// process or model). `None` when no series of `names` is present.
fn family(text: &str, names: &[&str]) -> Option<f64> {
    for name in names {
        let mut sum = None;
        for line in text.lines() {
            if line.starts_with('#') {
                continue;
            }
            let Some(rest) = line.strip_prefix(name) else {
                continue;
            };
            // `name{labels} value [ts]` or `name value [ts]`; not `name_total`.
            let value = if let Some(labelled) = rest.strip_prefix('{') {
                labelled.rsplit_once('}').map(|(_, v)| v)
            } else if rest.starts_with(' ') {
                Some(rest)
            } else {
                None
            };
            let Some(v) = value.and_then(|v| v.split_whitespace().next()) else {
                continue;
            };
            if let Ok(v) = v.parse::<f64>() {
                if v.is_finite() {
                    *sum.get_or_insert(0.0) += v;
                }
            }
        }
        if sum.is_some() {
            return sum;
        }
    }
    None
}

fn count(v: f64) -> u32 {
    // Gauges are non-negative integers in float form.
    v.max(0.0).round().min(f64::from(u32::MAX)) as u32
}

/// The load in an engine's `/metrics` text; `None` without its families.
pub fn parse_metrics(text: &str, names: &MetricNames, capacity: Option<u32>) -> Option<EngineLoad> {
    let running = family(text, names.running)?;
    let waiting = family(text, names.waiting).unwrap_or(0.0);
    Some(EngineLoad {
        running: count(running),
        waiting: count(waiting),
        capacity,
        kv_cache_usage: family(text, names.kv_usage),
    })
}

/// The last scrape, shared with the engine.
#[derive(Debug, Default)]
pub struct LoadCell {
    last: Mutex<Option<(Instant, EngineLoad)>>,
}

impl LoadCell {
    pub fn set(&self, load: EngineLoad) {
        if let Ok(mut g) = self.last.lock() {
            *g = Some((Instant::now(), load));
        }
    }

    /// The last load if it is younger than `max_age`.
    pub fn get(&self, max_age: Duration) -> Option<EngineLoad> {
        let g = self.last.lock().ok()?;
        g.filter(|(at, _)| at.elapsed() <= max_age).map(|(_, l)| l)
    }
}

/// Scrapes health and metrics every `interval` until the process ends;
/// health goes to `liveness`.
pub async fn scrape(
    http: Http,
    kind: Kind,
    capacity: Option<u32>,
    cell: Arc<LoadCell>,
    liveness: Arc<Liveness>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tick.tick().await;
        let healthy = matches!(
            http.call(http::Method::GET, kind.health_path(), bytes::Bytes::new(), SCRAPE_TIMEOUT).await,
            Ok((code, _)) if code.is_success()
        );
        liveness.scraped(healthy);
        let Some(names) = kind.metrics() else {
            continue;
        };
        if !healthy {
            continue;
        }
        let text = match http
            .call(
                http::Method::GET,
                "/metrics",
                bytes::Bytes::new(),
                SCRAPE_TIMEOUT,
            )
            .await
        {
            Ok((code, body)) if code.is_success() => String::from_utf8_lossy(&body).into_owned(),
            _ => continue,
        };
        match parse_metrics(&text, &names, capacity) {
            Some(load) => cell.set(load),
            None if !warned => {
                warned = true;
                tracing::warn!(
                    engine = kind.as_str(),
                    "the engine's /metrics has no running-requests gauge (llama-server needs \
                     --metrics): load is the worker's own"
                );
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_metrics_sum_over_label_sets_and_take_the_new_kv_name_first() {
        let text = "\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0
vllm:num_requests_running_total 99
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 4.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25
vllm:gpu_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.9
";
        let names = Kind::Vllm.metrics().expect("names");
        let load = parse_metrics(text, &names, Some(8)).expect("load");
        assert_eq!((load.running, load.waiting, load.capacity), (5, 4, Some(8)));
        assert_eq!(load.kv_cache_usage, Some(0.25));
        // An older vLLM: only the old KV name.
        let old = "vllm:num_requests_running{a=\"b\"} 1\nvllm:gpu_cache_usage_perc{a=\"b\"} 0.5\n";
        let load = parse_metrics(old, &names, None).expect("load");
        assert_eq!((load.running, load.waiting), (1, 0));
        assert_eq!(load.kv_cache_usage, Some(0.5));
    }

    #[test]
    fn llama_server_and_sglang_metrics() {
        let llama = "# HELP llamacpp:requests_processing Number of requests processing.\n\
                     # TYPE llamacpp:requests_processing gauge\n\
                     llamacpp:requests_processing 2\n\
                     llamacpp:requests_deferred 6\n";
        let load = parse_metrics(llama, &Kind::LlamaServer.metrics().expect("names"), Some(2))
            .expect("load");
        assert_eq!((load.running, load.waiting), (2, 6));
        let sglang = "sglang:num_running_reqs{model_name=\"m\"} 7.0\n\
                      sglang:num_queue_reqs{model_name=\"m\"} 1.0\n\
                      sglang:token_usage{model_name=\"m\"} 0.3\n";
        let load =
            parse_metrics(sglang, &Kind::Sglang.metrics().expect("names"), None).expect("load");
        assert_eq!((load.running, load.waiting), (7, 1));
        assert_eq!(load.kv_cache_usage, Some(0.3));
        // No family: no load (the worker falls back to its own).
        assert!(parse_metrics("other 1\n", &Kind::Vllm.metrics().expect("names"), None).is_none());
        assert!(parse_metrics(
            "vllm:num_requests_running{} NaN\n",
            &Kind::Vllm.metrics().expect("n"),
            None
        )
        .is_none());
    }

    #[test]
    fn a_stale_load_is_not_reported() {
        let cell = LoadCell::default();
        assert!(cell.get(Duration::from_secs(1)).is_none());
        cell.set(EngineLoad {
            running: 1,
            ..Default::default()
        });
        assert_eq!(cell.get(Duration::from_secs(1)).map(|l| l.running), Some(1));
    }
}
