//! What each public model is, as far as a worker needs to know: its context
//! window and its capabilities, from the model table the gateway reads too
//! (`inference_proto::models`).

use inference_proto::{models, v1 as pb};

/// The served model's fixed facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelProfile {
    pub id: String,
    pub context_window: u32,
    /// Image input is accepted only on `base`.
    pub image_input: bool,
    /// The reasoning budget is configurable only on `base`.
    pub reasoning_budget: bool,
}

impl ModelProfile {
    /// The profile of a model id; `context_window` overrides the default.
    /// Unknown ids get `base`'s window and no image input.
    pub fn new(id: &str, context_window: Option<u32>) -> Self {
        let spec = models::find(id);
        let default_window = models::find("base").map_or(0, |b| b.context_window);
        Self {
            id: id.to_owned(),
            context_window: context_window
                .unwrap_or_else(|| spec.map_or(default_window, |s| s.context_window)),
            image_input: spec.is_some_and(|s| s.image_input),
            reasoning_budget: spec.is_some_and(|s| s.reasoning_budget),
        }
    }

    /// As [`ModelProfile::new`] for `worker serve`: an id beyond the
    /// spec's three (one the gateway's config adds) has no window of its
    /// own, so one must be given rather than borrowed from `base`.
    pub fn for_serving(id: &str, context_window: Option<u32>) -> anyhow::Result<Self> {
        if models::find(id).is_none() && context_window.is_none() {
            anyhow::bail!(
                "--model {id} is not one of base, base-ultra, base-mini: give its window with --context-window N (as the gateway's [models.{id}] context_window)"
            );
        }
        Ok(Self::new(id, context_window))
    }

    pub fn capabilities(&self) -> pb::Capabilities {
        pb::Capabilities {
            image_input: self.image_input,
            reasoning_budget: self.reasoning_budget,
            tools: true,
            structured_output: true,
            // The engine's to say (`Engines::resumes`, `Engines::resumes_any`).
            resume: false,
            resume_any: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_capabilities_follow_the_spec_table() {
        let base = ModelProfile::new("base", None);
        assert_eq!(base.context_window, 196_608);
        assert!(base.image_input && base.reasoning_budget);
        let ultra = ModelProfile::new("base-ultra", None);
        assert_eq!(ultra.context_window, 1_000_000);
        assert!(!ultra.image_input && !ultra.reasoning_budget);
        let mini = ModelProfile::new("base-mini", Some(4096));
        assert_eq!(mini.context_window, 4096);
        assert!(!mini.image_input);
        let added = ModelProfile::for_serving("llama-70b", Some(8192)).unwrap();
        assert_eq!(added.context_window, 8192);
        assert!(!added.image_input && !added.reasoning_budget);
        let e = ModelProfile::for_serving("llama-70b", None).unwrap_err();
        assert!(e.to_string().contains("--context-window"), "{e}");
        assert!(ModelProfile::for_serving("base", None).is_ok());
    }
}
