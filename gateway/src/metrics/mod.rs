//! Prometheus metrics, served on the admin listener. Names follow the
//! OpenTelemetry GenAI conventions where they exist (`gen_ai_*`).

mod moves;
mod preemption;
mod series;
pub use moves::{generation_moves, GenerationMoves};
pub use preemption::{preempted, preemption_resumed};
pub use series::{
    model_series, register_model, AccountModelSeries, AccountSeries, LimitDecision, LimitStage,
    ModelSeries, TokenKind,
};

use prometheus::{
    register_counter_vec_with_registry, register_gauge_vec_with_registry,
    register_histogram_vec_with_registry, register_int_counter_vec_with_registry,
    register_int_gauge_vec_with_registry, register_int_gauge_with_registry, CounterVec, Encoder,
    GaugeVec, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};
use std::sync::LazyLock;

pub struct Metrics {
    registry: Registry,
    /// Requests by route, model and final status.
    pub requests: IntCounterVec,
    /// Whole-request latency by route and model.
    pub request_duration: HistogramVec,
    pub time_to_first_token: HistogramVec,
    /// One sample per request: decode time / (output tokens − 1).
    pub time_per_output_token: HistogramVec,
    /// Gaps between relayed output events of a stream, every one.
    pub inter_token_latency: HistogramVec,
    /// Generations that failed after their first event (a stream's status
    /// was already 200), by model and error code.
    pub stream_failures: IntCounterVec,
    /// Generations whose worker failed after their first event, by model,
    /// reason and outcome (`moved`, `refused`: it could not move, `failed`:
    /// no worker took it).
    pub generation_moves: IntCounterVec,
    /// The gap a move left in a generation's output: from the last output
    /// event of the failed worker to the first of the next.
    pub generation_move_gap: HistogramVec,
    /// Worker calls retried on another worker before the first event.
    pub worker_retries: IntCounterVec,
    /// Requests waiting in a model pool's queue, by model and tier.
    pub queue_depth: IntGaugeVec,
    /// Time requests waited in a model pool's queue (0 when a worker was
    /// free), by model and tier.
    pub queue_wait: HistogramVec,
    /// Requests the queue turned away, by model, reason (`queue_full`,
    /// `queue_timeout`, `draining`) and organisation (the account store's
    /// ids, as on the usage series: never client input).
    pub queue_shed: IntCounterVec,
    /// Weighted tokens served per organisation in a model's pool (its
    /// virtual counter's increments: prompt + 2 × output, ÷ plan weight).
    pub queue_served: CounterVec,
    /// Tokens by model and type (`input`, `cached_input`, `output`, `reasoning`).
    pub tokens: IntCounterVec,
    /// Worker call failures by model, reason and class (`client`: the
    /// request's fault; `capacity`: overloaded or draining; `fault`: the
    /// worker's).
    pub worker_errors: IntCounterVec,
    pub open_streams: IntGauge,
    /// Responses WebSocket connections currently open.
    pub websocket_connections: IntGauge,
    /// The same per organisation (what `[websocket]
    /// max_connections_per_key` bounds, summed over the org's keys).
    pub websocket_org_connections: IntGaugeVec,
    /// Connection-local conversations held (a connection's latest response,
    /// kept for chaining, `store: false` included), per organisation.
    pub websocket_conversations: IntGaugeVec,
    /// The input items those conversations hold, per organisation.
    pub websocket_conversation_items: IntGaugeVec,
    /// 1 while a worker is selectable (healthy, not draining, circuit closed).
    pub worker_up: IntGaugeVec,
    /// 1 while a worker's circuit breaker is open.
    pub worker_circuit_open: IntGaugeVec,
    /// Prompt-prefix blocks each worker last reported its engine holds
    /// (what `cache_aware` routing matches prompts against).
    pub worker_cached_prefix_blocks: IntGaugeVec,
    /// What this gateway measured of each worker's engine (moving
    /// averages): time to first token per prompt block prefilled, and how
    /// long a request keeps a slot; `cache_aware` routing weighs a wait
    /// against a prefill with them.
    pub worker_engine_seconds: GaugeVec,
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
    /// Runs failed because they outlived their hard deadline.
    pub runs_overdue: prometheus::IntCounter,
    /// Background runs a draining replica handed to its peers.
    pub runs_handed_over: prometheus::IntCounter,
    /// Handed-over background runs this replica adopted.
    pub runs_adopted: prometheus::IntCounter,
    /// Foreground responses whose final write first failed and went on in
    /// the background.
    pub final_writes_deferred: prometheus::IntCounter,
    /// Foreground responses whose final write never landed.
    pub final_writes_lost: prometheus::IntCounter,
    /// Failed Redis operations by component (`store`, `limiter`,
    /// `accounts`) and operation.
    pub redis_errors: IntCounterVec,
    /// Redis Cluster slot-map fetches (`CLUSTER SLOTS`) of the gateway's
    /// own connections, by reason (`initial`, `moved`, `ask`,
    /// `connection_error`, `unserved`, `periodic`).
    pub redis_slot_refreshes: IntCounterVec,
    /// Slot-map fetches that found slots served by another node than
    /// before: a failover (or a resharding).
    pub redis_failovers: IntCounter,
    /// Failed worker discovery refreshes (a DNS name or a Kubernetes
    /// Service that did not resolve) by model and source (`dns`,
    /// `kubernetes`); the pool keeps its members meanwhile.
    pub discovery_failures: IntCounterVec,
}

/// Up to the longest request deadline (600 s), so a slow generation lands
/// in a bucket of its own rather than in +Inf.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
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
                "Decode time per output token after the first, one sample per request: \
                 (last output - first output) / (output tokens - 1).",
                &["gen_ai_request_model"],
                TOKEN_GAP_BUCKETS.to_vec(),
                registry
            )?,
            inter_token_latency: register_histogram_vec_with_registry!(
                "gateway_inter_token_latency_seconds",
                "Gaps between relayed output events of a generation (each gap one sample).",
                &["gen_ai_request_model"],
                TOKEN_GAP_BUCKETS.to_vec(),
                registry
            )?,
            stream_failures: register_int_counter_vec_with_registry!(
                "gateway_stream_failures_total",
                "Generations that failed after their first event, by model and error code.",
                &["model", "code"],
                registry
            )?,
            generation_moves: register_int_counter_vec_with_registry!(
                "gateway_generation_moves_total",
                "Generations whose worker failed after their first event, by model, reason \
                 and outcome (moved, refused, failed).",
                &["model", "reason", "outcome"],
                registry
            )?,
            generation_move_gap: register_histogram_vec_with_registry!(
                "gateway_generation_move_gap_seconds",
                "Gap a move to another worker left in a generation's output: from the \
                 failed worker's last output event to the next worker's first event.",
                &["model"],
                LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            queue_depth: register_int_gauge_vec_with_registry!(
                "gateway_queue_depth",
                "Requests waiting in a model pool's queue for a free worker, by tier.",
                &["model", "tier"],
                registry
            )?,
            queue_wait: register_histogram_vec_with_registry!(
                "gateway_queue_wait_seconds",
                "Time a request waited in its model pool's queue before going to a worker.",
                &["model", "tier"],
                LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            queue_shed: register_int_counter_vec_with_registry!(
                "gateway_queue_shed_total",
                "Requests refused by a model pool's queue (503), by reason and by the organisation refused.",
                &["model", "reason", "org"],
                registry
            )?,
            queue_served: register_counter_vec_with_registry!(
                "gateway_queue_served_weighted_tokens_total",
                "Weighted tokens served per organisation in a model's pool (prompt + 2 x output, / plan weight): what its fair share is measured in.",
                &["model", "org"],
                registry
            )?,
            worker_retries: register_int_counter_vec_with_registry!(
                "gateway_worker_retries_total",
                "Worker calls retried on another worker before the first event, by model and reason.",
                &["model", "reason"],
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
                "Failed worker calls by model, reason and class (client, capacity, fault).",
                &["model", "reason", "class"],
                registry
            )?,
            open_streams: register_int_gauge_with_registry!(
                "gateway_open_streams",
                "Streaming responses currently open.",
                registry
            )?,
            websocket_connections: register_int_gauge_with_registry!(
                "gateway_websocket_connections",
                "Responses WebSocket connections currently open.",
                registry
            )?,
            // `org` is bounded as the usage metrics' is: organisations
            // come from keys an operator made, never from a request.
            websocket_org_connections: register_int_gauge_vec_with_registry!(
                "gateway_websocket_org_connections",
                "Responses WebSocket connections currently open, by organisation.",
                &["org"],
                registry
            )?,
            websocket_conversations: register_int_gauge_vec_with_registry!(
                "gateway_websocket_conversations",
                "Connection-local conversations held by open Responses WebSocket connections (each connection's latest response, kept for chaining), by organisation.",
                &["org"],
                registry
            )?,
            websocket_conversation_items: register_int_gauge_vec_with_registry!(
                "gateway_websocket_conversation_items",
                "Input items held in connection-local conversations of open Responses WebSocket connections, by organisation.",
                &["org"],
                registry
            )?,
            worker_up: register_int_gauge_vec_with_registry!(
                "gateway_worker_up",
                "1 while the worker is selectable.",
                &["model", "worker"],
                registry
            )?,
            worker_cached_prefix_blocks: register_int_gauge_vec_with_registry!(
                "gateway_worker_cached_prefix_blocks",
                "Prompt-prefix blocks the worker last reported its engine holds.",
                &["model", "worker"],
                registry
            )?,
            worker_engine_seconds: register_gauge_vec_with_registry!(
                "gateway_worker_engine_seconds",
                "What this gateway measured of the worker's engine: time to first token per prompt block prefilled (measure=prefill_per_block) and time a request keeps a slot (measure=slot_hold).",
                &["model", "worker", "measure"],
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
            runs_handed_over: prometheus::register_int_counter_with_registry!(
                "gateway_response_runs_handed_over_total",
                "Background runs a draining replica handed to the other replicas.",
                registry
            )?,
            runs_adopted: prometheus::register_int_counter_with_registry!(
                "gateway_response_runs_adopted_total",
                "Handed-over background runs this replica adopted and ran.",
                registry
            )?,
            runs_overdue: prometheus::register_int_counter_with_registry!(
                "gateway_response_runs_overdue_total",
                "Runs failed because they outlived their request deadline plus a lease.",
                registry
            )?,
            final_writes_deferred: prometheus::register_int_counter_with_registry!(
                "gateway_response_final_writes_deferred_total",
                "Foreground stored responses whose final write failed once and was retried in the background.",
                registry
            )?,
            final_writes_lost: prometheus::register_int_counter_with_registry!(
                "gateway_response_final_writes_lost_total",
                "Foreground stored responses whose final write never landed (the sweeper's record says so).",
                registry
            )?,
            redis_errors: register_int_counter_vec_with_registry!(
                "gateway_redis_errors_total",
                "Failed Redis operations (errors, timeouts, lost connections) by component \
                 (store, limiter, accounts) and operation.",
                &["component", "op"],
                registry
            )?,
            redis_slot_refreshes: register_int_counter_vec_with_registry!(
                "gateway_redis_slot_refreshes_total",
                "Redis Cluster slot-map fetches (CLUSTER SLOTS) by reason (initial, moved, ask, \
                 connection_error, unserved, periodic).",
                &["reason"],
                registry
            )?,
            redis_failovers: prometheus::register_int_counter_with_registry!(
                "gateway_redis_failovers_total",
                "Redis Cluster slot-map fetches that found slots served by another node than \
                 before (a failover or a resharding).",
                registry
            )?,
            discovery_failures: register_int_counter_vec_with_registry!(
                "gateway_discovery_failures_total",
                "Failed worker discovery lookups (DNS, Kubernetes EndpointSlices) by model and \
                 source; the pool keeps its current members.",
                &["model", "source"],
                registry
            )?,
            registry,
        })
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 * 1024);
        // Encoding into a Vec only fails on invalid metric names, fixed above.
        let mut families = self.registry.gather();
        families.extend(planner::metrics::gather());
        families.extend(preemption::gather());
        let _ = TextEncoder::new().encode(&families, &mut out);
        out
    }
}

/// Counts one failed Redis operation of `component` (`store`, `limiter`,
/// `accounts`).
pub fn redis_error(component: &'static str, op: &'static str) {
    METRICS
        .redis_errors
        .with_label_values(&[component, op])
        .inc();
}

/// The process-wide metrics. Registration of the fixed names above cannot
/// fail at run time; a failure here is a programming error caught by tests.
pub static METRICS: LazyLock<Metrics> =
    LazyLock::new(|| Metrics::new().expect("metric definitions are valid"));

/// Counts one open thing (a stream, a WebSocket) on a gauge while it
/// lives, so a dropped reply future cannot leave the gauge high.
pub struct GaugeGuard(&'static IntGauge);

impl GaugeGuard {
    pub fn new(gauge: &'static IntGauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Counts one request and observes its duration: by the listener for each
/// HTTP request, and for each response of a WebSocket connection.
pub fn record_request(
    route: &'static str,
    model: &'static str,
    status: u16,
    started: std::time::Instant,
) {
    METRICS
        .requests
        .with_label_values(&[route, model, status_label(status)])
        .inc();
    METRICS
        .request_duration
        .with_label_values(&[route, model])
        .observe(started.elapsed().as_secs_f64());
}

/// Static labels for the statuses the gateway sends (no allocation per request).
pub fn status_label(status: u16) -> &'static str {
    match status {
        101 => "101",
        200 => "200",
        304 => "304",
        400 => "400",
        401 => "401",
        402 => "402",
        403 => "403",
        404 => "404",
        405 => "405",
        408 => "408",
        409 => "409",
        413 => "413",
        415 => "415",
        426 => "426",
        429 => "429",
        431 => "431",
        499 => "499",
        500 => "500",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_series_are_the_labelled_ones() {
        let base = model_series("base").unwrap();
        base.tokens(TokenKind::CachedInput).inc_by(3);
        base.limiter_decision(LimitStage::Global, LimitDecision::Tokens)
            .inc();
        let account = AccountSeries::default();
        let s = account.for_model("org-m", "key-m", "base-mini").unwrap();
        s.tokens[TokenKind::Reasoning as usize].inc_by(2);
        let again = account.for_model("org-m", "key-m", "base-mini").unwrap();
        assert_eq!(again.tokens[TokenKind::Reasoning as usize].get(), 2);
        assert!(model_series("gpt-4").is_none());
        register_model("metrics-added");
        register_model("metrics-added");
        let added = model_series("metrics-added").unwrap();
        added.tokens(TokenKind::Output).inc_by(5);
        assert_eq!(added.index, model_series("metrics-added").unwrap().index);
        account
            .for_model("org-m", "key-m", "metrics-added")
            .unwrap()
            .cost
            .inc_by(0.5);
        let text = String::from_utf8(METRICS.render()).unwrap();
        assert!(text.contains(
            "gen_ai_usage_tokens_total{gen_ai_request_model=\"base\",gen_ai_token_type=\"cached_input\"}"
        ));
        assert!(text.contains(
            "gateway_rate_limit_decisions_total{decision=\"tokens\",model=\"base\",stage=\"global\"} 1"
        ));
        assert!(text.contains(
            "gateway_usage_tokens_total{gen_ai_request_model=\"base-mini\",gen_ai_token_type=\"reasoning\",key_id=\"key-m\",org=\"org-m\"} 2"
        ));
        assert!(text.contains(
            "gen_ai_usage_tokens_total{gen_ai_request_model=\"metrics-added\",gen_ai_token_type=\"output\"} 5"
        ));
    }

    #[test]
    fn renders_registered_families() {
        METRICS
            .requests
            .with_label_values(&["chat", "base", "200"])
            .inc();
        redis_error("limiter", "admit");
        METRICS
            .discovery_failures
            .with_label_values(&["base", "dns"])
            .inc();
        let text = String::from_utf8(METRICS.render()).unwrap();
        assert!(text.contains("gateway_redis_errors_total{component=\"limiter\",op=\"admit\"}"));
        assert!(text.contains("gateway_discovery_failures_total{model=\"base\",source=\"dns\"}"));
        assert!(
            text.contains("gateway_requests_total{model=\"base\",route=\"chat\",status=\"200\"}")
        );
    }
}
