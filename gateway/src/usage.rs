//! Usage accounting at the end of a generation: token counters by model
//! and type, and the cost from the spec's price table.

use crate::catalog::ModelSpec;
use crate::metrics::METRICS;
use inference_proto::v1 as pb;

/// Records a finished generation's tokens.
pub fn record(model: &ModelSpec, usage: &pb::Usage) {
    let fresh_input = usage
        .prompt_tokens
        .saturating_sub(usage.cached_prompt_tokens);
    let visible_output = usage
        .completion_tokens
        .saturating_sub(usage.reasoning_tokens);
    for (kind, n) in [
        ("input", fresh_input),
        ("cached_input", usage.cached_prompt_tokens),
        ("output", visible_output),
        ("reasoning", usage.reasoning_tokens),
    ] {
        if n > 0 {
            METRICS
                .tokens
                .with_label_values(&[model.id, kind])
                .inc_by(u64::from(n));
        }
    }
}

/// Cost in US dollars: fresh input at the input rate, cached input at the
/// cached rate (10%), output and reasoning at the output rate.
pub fn cost_usd(model: &ModelSpec, usage: &pb::Usage) -> f64 {
    let fresh_input = f64::from(
        usage
            .prompt_tokens
            .saturating_sub(usage.cached_prompt_tokens),
    );
    let cached = f64::from(usage.cached_prompt_tokens);
    let output = f64::from(usage.completion_tokens);
    (fresh_input * model.price.input
        + cached * model.price.cached_input
        + output * model.price.output)
        / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_matches_the_price_table() {
        let base = crate::catalog::find("base").unwrap();
        let u = pb::Usage {
            prompt_tokens: 1_000_000,
            cached_prompt_tokens: 400_000,
            completion_tokens: 200_000,
            reasoning_tokens: 50_000,
            image_tokens: 0,
        };
        // 600k fresh * 0.50 + 400k cached * 0.05 + 200k output (incl. reasoning) * 1.90
        let expected = 0.30 + 0.02 + 0.38;
        assert!((cost_usd(base, &u) - expected).abs() < 1e-9);
    }
}
