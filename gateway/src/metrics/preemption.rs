//! The preemption series: generations a higher tier preempted, the
//! recompute their resumes cost (billed to nobody) and the pause their
//! clients saw. Their own registry, gathered beside the gateway's.

use prometheus::{
    register_histogram_vec_with_registry, register_int_counter_vec_with_registry, HistogramVec,
    IntCounterVec, Registry,
};
use std::sync::LazyLock;

struct Preemption {
    registry: Registry,
    preemptions: IntCounterVec,
    resume_tokens: IntCounterVec,
    pause: HistogramVec,
}

/// From a few milliseconds (a slot freed at once) to the longest deadline.
const PAUSE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

impl Preemption {
    fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        Ok(Self {
            preemptions: register_int_counter_vec_with_registry!(
                "gateway_preemptions_total",
                "Generations a waiting request of a higher tier preempted, by model, the \
                 preempted generation's tier and organisation (the account store's ids).",
                &["model", "tier", "org"],
                registry
            )?,
            resume_tokens: register_int_counter_vec_with_registry!(
                "gateway_preemption_resume_tokens_total",
                "Tokens a preempted generation's resume sends to prefill again (its prompt \
                 plus the output it had delivered, before any prefix cache): the recompute \
                 preemption costs, billed to nobody.",
                &["model", "tier", "org"],
                registry
            )?,
            pause: register_histogram_vec_with_registry!(
                "gateway_preemption_pause_seconds",
                "The pause a preempted generation's client saw: from its last output before \
                 the preemption to the first output of its resume.",
                &["model"],
                PAUSE_BUCKETS.to_vec(),
                registry
            )?,
            registry,
        })
    }
}

static PREEMPTION: LazyLock<Preemption> =
    LazyLock::new(|| Preemption::new().expect("metric definitions are valid"));

/// A generation of `tier` and `org` was preempted; its resume prefills
/// `resume_tokens` again.
pub fn preempted(model: &str, tier: &str, org: &str, resume_tokens: u64) {
    let labels = [model, tier, org];
    PREEMPTION.preemptions.with_label_values(&labels).inc();
    PREEMPTION
        .resume_tokens
        .with_label_values(&labels)
        .inc_by(resume_tokens);
}

/// A preempted generation resumed after a pause of `pause`.
pub fn preemption_resumed(model: &str, pause: std::time::Duration) {
    PREEMPTION
        .pause
        .with_label_values(&[model])
        .observe(pause.as_secs_f64());
}

pub(super) fn gather() -> Vec<prometheus::proto::MetricFamily> {
    PREEMPTION.registry.gather()
}
