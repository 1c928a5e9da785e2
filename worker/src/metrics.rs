//! The worker's Prometheus endpoint (`--metrics-listen`): its own queue and
//! totals, for the operator's autoscaler and alerts.
//!
//! The gateway's `gateway_worker_*` series are one replica's view of a
//! pool; summed across gateway replicas they count each worker several
//! times. A worker's own `/metrics` is the one source of its queue
//! (`worker_requests_waiting` drives the pool's HPA). Values are read at
//! scrape time from the same load report as `Info` (the admission's counts,
//! or an upstream engine's own queue) and the totals, so nothing on the
//! generation path records twice.

use crate::service::WorkerState;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    CounterVec, Encoder, GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

/// Reads the worker's state into metric families on every scrape.
struct WorkerCollector {
    state: Arc<WorkerState>,
    running: IntGaugeVec,
    waiting: IntGaugeVec,
    capacity: IntGaugeVec,
    draining: IntGaugeVec,
    kv_cache_usage: GaugeVec,
    generations: IntCounterVec,
    rejected: IntCounterVec,
    tokens: IntCounterVec,
    engine_steps: IntCounterVec,
    engine_step_seconds: CounterVec,
    descs: Vec<Desc>,
}

impl WorkerCollector {
    fn new(state: Arc<WorkerState>) -> prometheus::Result<Self> {
        let gauge = |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &["model"]);
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
        };
        let running = gauge(
            "worker_requests_running",
            "Generations holding a slot of the engine.",
        )?;
        let waiting = gauge(
            "worker_requests_waiting",
            "Generations admitted and waiting for a slot.",
        )?;
        let capacity = gauge(
            "worker_capacity",
            "Generations the engine runs at once (its slots).",
        )?;
        let draining = gauge(
            "worker_draining",
            "1 while the worker drains after SIGTERM.",
        )?;
        let kv_cache_usage = GaugeVec::new(
            Opts::new(
                "worker_kv_cache_usage_ratio",
                "Share of the engine's KV cache holding tokens (the simulator: its prefix cache), 0..1.",
            ),
            &["model"],
        )?;
        let generations = counter(
            "worker_generations_total",
            "Generations that ended, by outcome (completed, cancelled, failed).",
            &["model", "outcome"],
        )?;
        let rejected = counter(
            "worker_requests_rejected_total",
            "Requests refused before generating (overloaded, draining, too long, invalid).",
            &["model"],
        )?;
        let tokens = counter(
            "worker_tokens_total",
            "Tokens by kind: prompt, cached_prompt (reused from the prefix cache), generated.",
            &["model", "kind"],
        )?;
        let engine_steps = counter(
            "worker_engine_steps_total",
            "Decode steps of the in-process engine, by batch: generate (generated tokens only) or prefill (with prompt tokens).",
            &["model", "batch"],
        )?;
        let engine_step_seconds = CounterVec::new(
            Opts::new(
                "worker_engine_step_seconds_total",
                "Time in the in-process engine's decode steps, by batch and part: decode (the forward pass) or sample (sampling and handing tokens to their streams).",
            ),
            &["model", "batch", "part"],
        )?;
        let descs = [&running, &waiting, &capacity, &draining]
            .iter()
            .flat_map(|g| g.desc().into_iter().cloned())
            .chain(kv_cache_usage.desc().into_iter().cloned())
            .chain(
                [&generations, &rejected, &tokens, &engine_steps]
                    .iter()
                    .flat_map(|c| c.desc().into_iter().cloned()),
            )
            .chain(engine_step_seconds.desc().into_iter().cloned())
            .collect();
        Ok(Self {
            state,
            running,
            waiting,
            capacity,
            draining,
            kv_cache_usage,
            generations,
            rejected,
            tokens,
            engine_steps,
            engine_step_seconds,
            descs,
        })
    }
}

impl Collector for WorkerCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = &self.state;
        let model = s.model.id.as_str();
        let load = s.load();
        let gauges = [
            (&self.running, load.running),
            (&self.waiting, load.queued),
            (&self.capacity, load.capacity),
            (&self.draining, u32::from(s.drain.is_draining())),
        ];
        for (gauge, value) in gauges {
            gauge.with_label_values(&[model]).set(i64::from(value));
        }
        // Absent rather than 0 when the engine does not report it.
        self.kv_cache_usage.reset();
        if let Some(usage) = load.kv_cache_usage {
            self.kv_cache_usage.with_label_values(&[model]).set(usage);
        }
        let totals = s.counters.snapshot();
        // Counters are rebuilt from the totals each scrape: reset, then set.
        self.generations.reset();
        self.rejected.reset();
        self.tokens.reset();
        for (outcome, n) in [
            ("completed", totals.completed),
            ("cancelled", totals.cancelled),
            ("failed", totals.failed),
        ] {
            self.generations
                .with_label_values(&[model, outcome])
                .inc_by(n);
        }
        self.rejected
            .with_label_values(&[model])
            .inc_by(totals.rejected);
        for (kind, n) in [
            ("prompt", totals.prompt_tokens),
            ("cached_prompt", totals.cached_prompt_tokens),
            ("generated", totals.tokens_generated),
        ] {
            self.tokens.with_label_values(&[model, kind]).inc_by(n);
        }
        self.engine_steps.reset();
        self.engine_step_seconds.reset();
        let timings = s.engine.step_timings();
        if let Some(t) = timings {
            for (batch, totals) in [("generate", t.generate), ("prefill", t.prefill)] {
                self.engine_steps
                    .with_label_values(&[model, batch])
                    .inc_by(totals.steps);
                for (part, ns) in [("decode", totals.decode_ns), ("sample", totals.sample_ns)] {
                    self.engine_step_seconds
                        .with_label_values(&[model, batch, part])
                        .inc_by(ns as f64 / 1e9);
                }
            }
        }
        let mut families = Vec::new();
        for g in [&self.running, &self.waiting, &self.capacity, &self.draining] {
            families.extend(g.collect());
        }
        families.extend(self.kv_cache_usage.collect());
        for c in [&self.generations, &self.rejected, &self.tokens] {
            families.extend(c.collect());
        }
        if timings.is_some() {
            families.extend(self.engine_steps.collect());
            families.extend(self.engine_step_seconds.collect());
        }
        families
    }
}

/// The exposition of one registry, rendered on request.
#[derive(Clone)]
pub struct MetricsPage {
    registry: Registry,
}

impl MetricsPage {
    pub fn new(state: Arc<WorkerState>) -> prometheus::Result<Self> {
        let registry = Registry::new();
        registry.register(Box::new(WorkerCollector::new(state)?))?;
        Ok(Self { registry })
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }

    fn answer(&self, request: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let (status, content_type, body) = match (request.method(), request.uri().path()) {
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(self.render()),
            ),
            (_, "/metrics") => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                Bytes::from_static(b"GET only\n"),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                "text/plain",
                Bytes::from_static(b"not found; try /metrics\n"),
            ),
        };
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, v);
        }
        response
    }

    /// Serves `GET /metrics` on `listener` until the task is dropped.
    pub async fn serve(self, listener: TcpListener) {
        loop {
            let (socket, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("metrics listener: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let page = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let response = page.answer(&request);
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(socket), service)
                    .await;
            });
        }
    }
}

/// Binds `addr` for [`MetricsPage::serve`]; the bound address is returned
/// so that port 0 can be used.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((listener, bound))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Admission;
    use crate::counters::Counters;
    use crate::drain::DrainFlag;
    use crate::model::ModelProfile;
    use crate::seam::Outcome;
    use crate::service::Engines;

    fn state() -> Arc<WorkerState> {
        use crate::engine::synthetic::{SyntheticConfig, SyntheticEngine};
        let engine = SyntheticEngine::new(
            SyntheticConfig {
                prefix_cache_blocks: 16,
                ..SyntheticConfig::default()
            },
            ModelProfile::new("base", None),
        );
        Arc::new(WorkerState {
            model: ModelProfile::new("base", None),
            engine_name: "synthetic",
            description: String::new(),
            engine: Engines::Sequence(Arc::new(engine)),
            admission: Admission::new(3, 5),
            counters: Counters::default(),
            drain: DrainFlag::default(),
            cache_report: crate::cache_report::CacheReport::new(
                crate::cache_report::Source::Estimated { ttl: None },
                3,
                true,
            ),
            sampling_defaults: Default::default(),
            running: Default::default(),
        })
    }

    fn line<'a>(page: &'a str, series: &str) -> Option<&'a str> {
        page.lines().find(|l| l.starts_with(series))
    }

    #[test]
    fn a_scrape_reads_the_live_queue_and_totals() {
        let state = state();
        let page = MetricsPage::new(Arc::clone(&state)).expect("registry");
        state.counters.started(100, 40);
        state.counters.finished(Outcome::Completed { tokens: 7 });
        state.counters.finished(Outcome::Cancelled { tokens: 2 });
        state.counters.rejected();
        let text = String::from_utf8(page.render()).expect("utf-8");
        assert_eq!(
            line(&text, "worker_capacity{"),
            Some("worker_capacity{model=\"base\"} 3")
        );
        assert_eq!(
            line(&text, "worker_requests_waiting{"),
            Some("worker_requests_waiting{model=\"base\"} 0")
        );
        assert!(text.contains("worker_generations_total{model=\"base\",outcome=\"completed\"} 1"));
        assert!(text.contains("worker_generations_total{model=\"base\",outcome=\"cancelled\"} 1"));
        assert!(text.contains("worker_tokens_total{kind=\"generated\",model=\"base\"} 9"));
        assert!(text.contains("worker_tokens_total{kind=\"cached_prompt\",model=\"base\"} 40"));
        assert!(text.contains("worker_requests_rejected_total{model=\"base\"} 1"));
        // The simulator reports its prefix cache.
        assert!(
            text.contains("worker_kv_cache_usage_ratio{model=\"base\"} 0"),
            "{text}"
        );
        // A second scrape reports the same totals, not doubled ones.
        let again = String::from_utf8(page.render()).expect("utf-8");
        assert!(again.contains("worker_tokens_total{kind=\"generated\",model=\"base\"} 9"));
    }
}
