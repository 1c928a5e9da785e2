//! The spec's three models and their fixed properties (spec 1 and 8):
//! context windows, capabilities and prices. One table, read by the gateway
//! (the first entries of its catalogue, `gateway::catalog`, which adds the
//! ids its config describes) and by workers (a model's default window and
//! capabilities), so the two cannot disagree.

/// One public model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSpec {
    pub id: &'static str,
    pub display_name: &'static str,
    pub description: &'static str,
    pub context_window: u32,
    /// Image input on chat completions (only `base`).
    pub image_input: bool,
    /// `thinking_budget` is configurable (only `base`).
    pub reasoning_budget: bool,
    pub price: Price,
    /// Order in the Codex catalogue (lower first).
    pub priority: i32,
}

/// US dollars per million tokens. Cached input is 10% of input; reasoning is
/// billed at the output rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub cached_input: f64,
    pub output: f64,
}

/// In the order `GET /v1/models` lists them.
pub const MODELS: [ModelSpec; 3] = [
    ModelSpec {
        id: "base-mini",
        display_name: "Base Mini",
        description: "Fastest and lightest model.",
        context_window: 262_144,
        image_input: false,
        reasoning_budget: false,
        price: Price {
            input: 0.18,
            cached_input: 0.018,
            output: 0.45,
        },
        priority: 2,
    },
    ModelSpec {
        id: "base",
        display_name: "Base",
        description: "General-purpose default model.",
        context_window: 196_608,
        image_input: true,
        reasoning_budget: true,
        price: Price {
            input: 0.50,
            cached_input: 0.05,
            output: 1.90,
        },
        priority: 0,
    },
    ModelSpec {
        id: "base-ultra",
        display_name: "Base Ultra",
        description: "Most capable model; highest latency and cost.",
        context_window: 1_000_000,
        image_input: false,
        reasoning_budget: false,
        price: Price {
            input: 1.26,
            cached_input: 0.126,
            output: 3.96,
        },
        priority: 1,
    },
];

/// Looks a model id up; `None` for an id the service does not offer.
pub fn find(id: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_models_with_spec_windows() {
        assert_eq!(find("base").map(|m| m.context_window), Some(196_608));
        assert_eq!(
            find("base-ultra").map(|m| m.context_window),
            Some(1_000_000)
        );
        assert_eq!(find("base-mini").map(|m| m.context_window), Some(262_144));
        assert!(find("gpt-4").is_none());
    }

    #[test]
    fn cached_input_is_ten_percent() {
        for m in MODELS {
            assert!(
                (m.price.cached_input - m.price.input / 10.0).abs() < 1e-9,
                "{}",
                m.id
            );
        }
    }
}
