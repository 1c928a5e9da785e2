//! The models this service offers: the spec's three (`inference_proto::models`,
//! the table the workers read too) and the ids an operator adds with
//! catalogue fields in `[models.NAME]`. Built once at startup from the
//! config (`Config::catalog`) and held by the App: every lookup of a model
//! id (validation, listing, billing, key allow-lists) goes through it.

pub use inference_proto::models::{ModelSpec, Price, MODELS as SPEC_MODELS};

/// Longest model id (and the shape every id takes: `[a-z0-9][a-z0-9._-]*`).
pub const MAX_ID_LEN: usize = 64;

/// Whether `id` may name a model: `[a-z0-9][a-z0-9._-]{0,63}`. The chart's
/// schema accepts exactly these names.
pub fn valid_model_id(id: &str) -> bool {
    let mut bytes = id.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    first_ok
        && id.len() <= MAX_ID_LEN
        && bytes.all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

/// Whether `id` is one of the spec's three (whose facts are the spec's).
pub fn is_spec_model(id: &str) -> bool {
    SPEC_MODELS.iter().any(|m| m.id == id)
}

/// A model an operator adds beside the spec's three, as the config
/// describes it (checked there).
#[derive(Debug, Clone, PartialEq)]
pub struct AddedModel {
    pub id: String,
    pub description: String,
    pub context_window: u32,
    pub image_input: bool,
    pub reasoning_budget: bool,
    pub price: Price,
}

/// The catalogue: the spec's three, then the added ids by name.
#[derive(Debug, Clone)]
pub struct Catalog {
    models: Vec<&'static ModelSpec>,
}

impl Default for Catalog {
    /// The spec's three only.
    fn default() -> Self {
        Self {
            models: SPEC_MODELS.iter().collect(),
        }
    }
}

impl Catalog {
    /// The spec's three, then `added` in the given order.
    ///
    /// An added model's facts are leaked once, here: requests, background
    /// runs and metrics hold `&'static ModelSpec` for as long as the
    /// process serves, and a process builds its catalogue once.
    pub fn with_added(added: Vec<AddedModel>) -> Self {
        let mut catalog = Self::default();
        let first_added_priority = SPEC_MODELS.iter().map(|m| m.priority).max().unwrap_or(0) + 1;
        for (i, m) in added.into_iter().enumerate() {
            let id: &'static str = Box::leak(m.id.into_boxed_str());
            let spec = ModelSpec {
                id,
                display_name: id,
                description: Box::leak(m.description.into_boxed_str()),
                context_window: m.context_window,
                image_input: m.image_input,
                reasoning_budget: m.reasoning_budget,
                price: m.price,
                priority: first_added_priority + i32::try_from(i).unwrap_or(i32::MAX - 4),
            };
            catalog.models.push(Box::leak(Box::new(spec)));
        }
        catalog
    }

    /// Looks a model id up; `None` for an id the service does not offer.
    pub fn find(&self, id: &str) -> Option<&'static ModelSpec> {
        self.models.iter().copied().find(|m| m.id == id)
    }

    /// Every model, in the order `GET /v1/models` lists them.
    pub fn models(&self) -> &[&'static ModelSpec] {
        &self.models
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama() -> AddedModel {
        AddedModel {
            id: "llama-70b".into(),
            description: "Llama 3.3 70B".into(),
            context_window: 8192,
            image_input: false,
            reasoning_budget: false,
            price: Price {
                input: 0.6,
                cached_input: 0.06,
                output: 0.8,
            },
        }
    }

    #[test]
    fn added_models_follow_the_spec_three() {
        let c = Catalog::with_added(vec![llama()]);
        let ids: Vec<&str> = c.models().iter().map(|m| m.id).collect();
        assert_eq!(ids, ["base-mini", "base", "base-ultra", "llama-70b"]);
        let l = c.find("llama-70b").unwrap();
        assert_eq!((l.context_window, l.price.output), (8192, 0.8));
        assert!(l.priority > c.find("base-mini").unwrap().priority);
        assert_eq!(c.find("base").map(|m| m.context_window), Some(196_608));
        assert!(Catalog::default().find("llama-70b").is_none());
        assert!(c.find("gpt-4").is_none());
    }

    #[test]
    fn model_ids_take_one_shape() {
        for ok in ["llama-70b", "a", "qwen2.5_7b", "0x", &"a".repeat(64)] {
            assert!(valid_model_id(ok), "{ok}");
        }
        for bad in [
            "",
            "Llama",
            "-x",
            ".x",
            "a b",
            "a/b",
            &"a".repeat(65),
            "modèle",
        ] {
            assert!(!valid_model_id(bad), "{bad}");
        }
        assert!(is_spec_model("base-ultra") && !is_spec_model("llama-70b"));
    }
}
