//! The per-request series resolved once and kept: per model
//! ([`ModelSeries`]) and per cached account ([`AccountSeries`]), and the
//! label sets they are indexed by.

use super::METRICS;
use prometheus::{Counter, Histogram, IntCounter};
use std::sync::{LazyLock, OnceLock, PoisonError, RwLock};

/// Token types of the usage counters, in [`TokenKind::ALL`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Input,
    CachedInput,
    Output,
    Reasoning,
}

impl TokenKind {
    pub const ALL: [TokenKind; 4] = [
        TokenKind::Input,
        TokenKind::CachedInput,
        TokenKind::Output,
        TokenKind::Reasoning,
    ];

    pub fn label(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::CachedInput => "cached_input",
            TokenKind::Output => "output",
            TokenKind::Reasoning => "reasoning",
        }
    }
}

/// Where the limiter decided (the `stage` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitStage {
    Local,
    Global,
    Memory,
}

/// `stage` labels, indexed by [`LimitStage`].
const LIMIT_STAGES: [&str; 3] = ["local", "global", "memory"];
/// What the limiter decided (the `decision` label), in
/// [`LimitDecision::ALL`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitDecision {
    Admitted,
    Requests,
    Tokens,
    Concurrency,
    Budget,
}

impl LimitDecision {
    pub const ALL: [LimitDecision; 5] = [
        LimitDecision::Admitted,
        LimitDecision::Requests,
        LimitDecision::Tokens,
        LimitDecision::Concurrency,
        LimitDecision::Budget,
    ];

    pub fn label(self) -> &'static str {
        match self {
            LimitDecision::Admitted => "admitted",
            LimitDecision::Requests => "requests",
            LimitDecision::Tokens => "tokens",
            LimitDecision::Concurrency => "concurrency",
            LimitDecision::Budget => "budget",
        }
    }
}

/// One model's per-request series, each resolved on first use and then
/// kept: `with_label_values` hashes every label and takes a lock, and the
/// request path would otherwise pay that a dozen times per request.
pub struct ModelSeries {
    model: &'static str,
    /// Position in the registry of model series.
    pub(super) index: usize,
    tokens: [OnceLock<IntCounter>; 4],
    time_to_first_token: OnceLock<Histogram>,
    time_per_output_token: OnceLock<Histogram>,
    inter_token_latency: OnceLock<Histogram>,
    decisions: [[OnceLock<IntCounter>; LimitDecision::ALL.len()]; LIMIT_STAGES.len()],
}

impl ModelSeries {
    pub fn tokens(&self, kind: TokenKind) -> &IntCounter {
        self.tokens[kind as usize].get_or_init(|| {
            METRICS
                .tokens
                .with_label_values(&[self.model, kind.label()])
        })
    }

    pub fn time_to_first_token(&self) -> &Histogram {
        self.time_to_first_token
            .get_or_init(|| METRICS.time_to_first_token.with_label_values(&[self.model]))
    }

    pub fn time_per_output_token(&self) -> &Histogram {
        self.time_per_output_token.get_or_init(|| {
            METRICS
                .time_per_output_token
                .with_label_values(&[self.model])
        })
    }

    pub fn inter_token_latency(&self) -> &Histogram {
        self.inter_token_latency
            .get_or_init(|| METRICS.inter_token_latency.with_label_values(&[self.model]))
    }

    pub fn limiter_decision(&self, stage: LimitStage, decision: LimitDecision) -> &IntCounter {
        let stage = stage as usize;
        self.decisions[stage][decision as usize].get_or_init(|| {
            METRICS.limiter_decisions.with_label_values(&[
                self.model,
                LIMIT_STAGES[stage],
                decision.label(),
            ])
        })
    }
}

/// The per-model series of every catalogue model, in registration order
/// (a model's position indexes its per-account series). The spec's three
/// are there from the start; the App registers its catalogue's added ids.
static MODEL_SERIES: LazyLock<RwLock<Vec<&'static ModelSeries>>> = LazyLock::new(|| {
    let mut models = Vec::new();
    for m in &inference_proto::models::MODELS {
        push_model(&mut models, m.id);
    }
    RwLock::new(models)
});

fn push_model(models: &mut Vec<&'static ModelSeries>, model: &'static str) {
    // Leaked once per model id: the series live as long as the process.
    models.push(Box::leak(Box::new(ModelSeries {
        model,
        index: models.len(),
        tokens: Default::default(),
        time_to_first_token: OnceLock::new(),
        time_per_output_token: OnceLock::new(),
        inter_token_latency: OnceLock::new(),
        decisions: Default::default(),
    })));
}

/// Gives a catalogue model its series (once per id; later calls are no-ops).
pub fn register_model(model: &'static str) {
    let mut models = MODEL_SERIES.write().unwrap_or_else(PoisonError::into_inner);
    if !models.iter().any(|s| s.model == model) {
        push_model(&mut models, model);
    }
}

/// The series of a catalogue model (`None` for an id never registered, so
/// no label value comes from outside the catalogue).
pub fn model_series(model: &str) -> Option<&'static ModelSeries> {
    MODEL_SERIES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .copied()
        .find(|s| s.model == model)
}

/// One API key's usage series per model, kept with its cached account so
/// the labels (organisation, key id, model, type) are resolved once.
#[derive(Default)]
pub struct AccountSeries {
    /// By the model's registration index; filled on first use.
    by_model: RwLock<Vec<Option<AccountModelSeries>>>,
}

impl Clone for AccountSeries {
    fn clone(&self) -> Self {
        let by_model = self
            .by_model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Self {
            by_model: RwLock::new(by_model),
        }
    }
}

/// Counters of one key and model (handles: cloning one shares its counts).
#[derive(Clone)]
pub struct AccountModelSeries {
    pub tokens: [IntCounter; 4],
    pub cost: Counter,
}

impl AccountSeries {
    pub fn for_model(&self, org: &str, key_id: &str, model: &str) -> Option<AccountModelSeries> {
        let index = model_series(model)?.index;
        if let Some(Some(series)) = self
            .by_model
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(index)
        {
            return Some(series.clone());
        }
        let series = AccountModelSeries {
            tokens: TokenKind::ALL.map(|kind| {
                METRICS
                    .org_tokens
                    .with_label_values(&[org, key_id, model, kind.label()])
            }),
            cost: METRICS.org_cost.with_label_values(&[org, key_id, model]),
        };
        let mut by_model = self
            .by_model
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if by_model.len() <= index {
            by_model.resize(index + 1, None);
        }
        by_model[index] = Some(series.clone());
        Some(series)
    }
}

impl std::fmt::Debug for AccountSeries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccountSeries")
    }
}
