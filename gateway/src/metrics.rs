//! Prometheus metrics, served on the admin listener. Names follow the
//! OpenTelemetry GenAI conventions where they exist (`gen_ai_*`).

use prometheus::{
    register_counter_vec_with_registry, register_gauge_vec_with_registry,
    register_histogram_vec_with_registry, register_int_counter_vec_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry, CounterVec, Encoder,
    GaugeVec, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};
use std::sync::LazyLock;

pub struct Metrics {
    registry: Registry,
    /// Requests by route, model and final status.
    pub requests: IntCounterVec,
    /// Whole-request latency by route and model.
    pub request_duration: HistogramVec,
    pub time_to_first_token: HistogramVec,
    pub time_per_output_token: HistogramVec,
    /// Tokens by model and type (`input`, `cached_input`, `output`, `reasoning`).
    pub tokens: IntCounterVec,
    /// Worker call failures by model and reason.
    pub worker_errors: IntCounterVec,
    pub open_streams: IntGauge,
    /// 1 while a worker is selectable (healthy, not draining, circuit closed).
    pub worker_up: IntGaugeVec,
    /// 1 while a worker's circuit breaker is open.
    pub worker_circuit_open: IntGaugeVec,
    /// (running + queued) / capacity over a model's pool, as the workers
    /// report it: the autoscaling signal for worker Deployments.
    pub worker_load_ratio: GaugeVec,
    /// Admission decisions by model, stage (`local`, `global`, `memory`)
    /// and outcome (`admitted`, `requests`, `tokens`, `concurrency`, `budget`).
    pub limiter_decisions: IntCounterVec,
    /// Tokens by organisation, key id, model and type.
    pub org_tokens: IntCounterVec,
    /// Cost in US dollars by organisation, key id and model.
    pub org_cost: CounterVec,
    /// Round trips to the response store by operation (Redis only).
    pub store_round_trips: IntCounterVec,
    /// Latency of response-store round trips by operation.
    pub store_duration: HistogramVec,
    /// Stored-response runs this replica owns (lease held).
    pub runs_owned: IntGauge,
    /// Runs ended by a sweeper after their owner's lease expired.
    pub runs_lost: prometheus::IntCounter,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];
const TOKEN_GAP_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

impl Metrics {
    fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Self {
            requests: register_int_counter_vec_with_registry!(
                "gateway_requests_total",
                "Requests by route, model and status.",
                &["route", "model", "status"],
                registry
            )?,
            request_duration: register_histogram_vec_with_registry!(
                "gateway_request_duration_seconds",
                "Request latency from first byte read to last byte written.",
                &["route", "model"],
                LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            time_to_first_token: register_histogram_vec_with_registry!(
                "gen_ai_server_time_to_first_token_seconds",
                "Time from request receipt to the first generated token.",
                &["gen_ai_request_model"],
                LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            time_per_output_token: register_histogram_vec_with_registry!(
                "gen_ai_server_time_per_output_token_seconds",
                "Time between streamed tokens after the first.",
                &["gen_ai_request_model"],
                TOKEN_GAP_BUCKETS.to_vec(),
                registry
            )?,
            tokens: register_int_counter_vec_with_registry!(
                "gen_ai_usage_tokens_total",
                "Tokens processed, by model and token type.",
                &["gen_ai_request_model", "gen_ai_token_type"],
                registry
            )?,
            worker_errors: register_int_counter_vec_with_registry!(
                "gateway_worker_errors_total",
                "Failed worker calls by model and reason.",
                &["model", "reason"],
                registry
            )?,
            open_streams: register_int_gauge_with_registry!(
                "gateway_open_streams",
                "Streaming responses currently open.",
                registry
            )?,
            worker_up: register_int_gauge_vec_with_registry!(
                "gateway_worker_up",
                "1 while the worker is selectable.",
                &["model", "worker"],
                registry
            )?,
            worker_circuit_open: register_int_gauge_vec_with_registry!(
                "gateway_worker_circuit_open",
                "1 while the worker's circuit breaker is open.",
                &["model", "worker"],
                registry
            )?,
            worker_load_ratio: register_gauge_vec_with_registry!(
                "gateway_worker_load_ratio",
                "Reported (running + queued) / capacity over the model's pool.",
                &["model"],
                registry
            )?,
            limiter_decisions: register_int_counter_vec_with_registry!(
                "gateway_rate_limit_decisions_total",
                "Admission decisions by model, stage and outcome.",
                &["model", "stage", "decision"],
                registry
            )?,
            org_tokens: register_int_counter_vec_with_registry!(
                "gateway_usage_tokens_total",
                "Tokens billed, by organisation, key id, model and token type.",
                &["org", "key_id", "gen_ai_request_model", "gen_ai_token_type"],
                registry
            )?,
            org_cost: register_counter_vec_with_registry!(
                "gateway_usage_cost_usd_total",
                "Cost billed in US dollars, by organisation, key id and model.",
                &["org", "key_id", "gen_ai_request_model"],
                registry
            )?,
            store_round_trips: register_int_counter_vec_with_registry!(
                "gateway_store_round_trips_total",
                "Round trips to the response store by operation.",
                &["op"],
                registry
            )?,
            store_duration: register_histogram_vec_with_registry!(
                "gateway_store_duration_seconds",
                "Latency of response-store round trips by operation.",
                &["op"],
                LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            runs_owned: register_int_gauge_with_registry!(
                "gateway_response_runs_owned",
                "Stored-response runs this replica owns.",
                registry
            )?,
            runs_lost: prometheus::register_int_counter_with_registry!(
                "gateway_response_runs_lost_total",
                "Runs failed by a sweeper after their owner's lease expired.",
                registry
            )?,
            registry,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec only fails on invalid metric names, fixed above.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// The process-wide metrics. Registration of the fixed names above cannot
/// fail at run time; a failure here is a programming error caught by tests.
pub static METRICS: LazyLock<Metrics> =
    LazyLock::new(|| Metrics::new().expect("metric definitions are valid"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_families() {
        METRICS
            .requests
            .with_label_values(&["chat", "base", "200"])
            .inc();
        let text = String::from_utf8(METRICS.render()).unwrap();
        assert!(
            text.contains("gateway_requests_total{model=\"base\",route=\"chat\",status=\"200\"}")
        );
    }
}
