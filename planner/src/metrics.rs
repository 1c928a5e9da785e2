//! The planner's Prometheus series, in a registry of its own that the host
//! serves beside its own ([`gather`]). Names keep the `gateway_planner_`
//! prefix the dashboards and alerts know.

use prometheus::{
    register_histogram_vec_with_registry, register_histogram_with_registry,
    register_int_counter_vec_with_registry, register_int_counter_with_registry, Histogram,
    HistogramVec, IntCounter, IntCounterVec, Registry,
};
use std::sync::LazyLock;

/// Latency buckets of agent calls, in seconds (a card fetch to a long
/// task).
const AGENT_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0,
];

pub struct PlannerMetrics {
    registry: Registry,
    pub planner_plans: IntCounterVec,
    /// Plan calls by result: valid, rejected by the plan guard, failed.
    pub planner_plan_calls: IntCounterVec,
    pub planner_plan_tokens: Histogram,
    /// Steps by kind and outcome.
    pub planner_steps: IntCounterVec,
    /// Agent calls by outcome and reason.
    pub planner_agent_latency: HistogramVec,
    pub planner_hedges: IntCounter,
    pub planner_replans: IntCounter,
    pub planner_pauses: IntCounter,
    pub planner_resumes: IntCounter,
}

/// The planner's series. A registration cannot fail on a fresh registry
/// with distinct names (a unit test renders them), so a failure is a
/// programming error caught by that test.
pub static METRICS: LazyLock<PlannerMetrics> =
    LazyLock::new(|| PlannerMetrics::new().expect("the planner's metrics register"));

/// Every planner series, for the host's `/metrics`.
pub fn gather() -> Vec<prometheus::proto::MetricFamily> {
    METRICS.registry.gather()
}

impl PlannerMetrics {
    fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Self {
            planner_plans: register_int_counter_vec_with_registry!(
                "gateway_planner_plans_total",
                "Planner runs: new plans made, and runs answered.",
                &["event"],
                registry
            )?,
            planner_plan_calls: register_int_counter_vec_with_registry!(
                "gateway_planner_plan_calls_total",
                "Plan calls by result: valid, rejected by the plan guard, failed.",
                &["result"],
                registry
            )?,
            planner_plan_tokens: register_histogram_with_registry!(
                "gateway_planner_plan_output_tokens",
                "Output tokens of plan calls.",
                vec![16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0],
                registry
            )?,
            planner_steps: register_int_counter_vec_with_registry!(
                "gateway_planner_steps_total",
                "Planner steps by kind (agent, function, llm) and outcome.",
                &["kind", "outcome"],
                registry
            )?,
            planner_agent_latency: register_histogram_vec_with_registry!(
                "gateway_planner_agent_duration_seconds",
                "Latency of agent calls (A2A) by outcome, and reason (refused, timeout, dns, tls, reset, policy, ...; none).",
                &["outcome", "reason"],
                AGENT_LATENCY_BUCKETS.to_vec(),
                registry
            )?,
            planner_hedges: register_int_counter_with_registry!(
                "gateway_planner_hedges_total",
                "Slow agent steps hedged: an alternate started beside the first agent.",
                registry
            )?,
            planner_replans: register_int_counter_with_registry!(
                "gateway_planner_replans_total",
                "Re-plans after failed steps.",
                registry
            )?,
            planner_pauses: register_int_counter_with_registry!(
                "gateway_planner_pauses_total",
                "Plans paused for the caller's function tools.",
                registry
            )?,
            planner_resumes: register_int_counter_with_registry!(
                "gateway_planner_resumes_total",
                "Paused plans resumed with the caller's tool results.",
                registry
            )?,
            registry,
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_series_registers_and_renders() {
        super::METRICS.planner_hedges.inc();
        let names: Vec<String> = super::gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        assert!(
            names.contains(&"gateway_planner_hedges_total".to_owned()),
            "{names:?}"
        );
    }
}
