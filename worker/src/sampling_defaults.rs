//! The model's own sampling defaults: what a request that leaves
//! `temperature` or `top_p` unset is sampled with, as vLLM applies a
//! model's generation config. A small instruct model sampled at the API's
//! bare default (temperature 1, no nucleus cut) rambles to the end of its
//! window; at its model card's values it answers and stops.

use inference_proto::v1 as pb;

/// Defaults for unset sampling fields; `None` leaves the engine's own.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// llama.cpp's repetition penalty (1 = none): what keeps a small model
    /// at a low temperature out of a loop.
    pub repeat_penalty: Option<f64>,
}

impl SamplingDefaults {
    /// `self`, with every value `over` sets taken from it (the operator's
    /// flags over the weights file's metadata).
    pub fn overridden_by(self, over: SamplingDefaults) -> Self {
        Self {
            temperature: over.temperature.or(self.temperature),
            top_p: over.top_p.or(self.top_p),
            repeat_penalty: over.repeat_penalty.or(self.repeat_penalty),
        }
    }

    /// Fills the fields the request left unset.
    pub fn apply(&self, request: &mut pb::GenerateRequest) {
        if *self == Self::default() {
            return;
        }
        let sampling = request.sampling.get_or_insert_with(Default::default);
        if sampling.temperature.is_none() {
            sampling.temperature = self.temperature;
        }
        if sampling.top_p.is_none() {
            sampling.top_p = self.top_p;
        }
        if sampling.repeat_penalty.is_none() {
            sampling.repeat_penalty = self.repeat_penalty;
        }
    }

    /// As reported in `Info`.
    pub fn to_proto(self) -> pb::SamplingDefaults {
        pb::SamplingDefaults {
            temperature: self.temperature,
            top_p: self.top_p,
            repeat_penalty: self.repeat_penalty,
        }
    }

    /// Checks the values are in the API's ranges (temperature 0..=2, top_p
    /// 0..=1) and the penalty in llama.cpp's useful one (above 0, at most
    /// 2; 0 would divide by zero): a typo in a flag or odd metadata must
    /// not reach every request.
    pub fn validated(self) -> anyhow::Result<Self> {
        if let Some(t) = self.temperature {
            anyhow::ensure!(
                (0.0..=2.0).contains(&t),
                "default temperature {t} is outside 0..=2"
            );
        }
        if let Some(p) = self.top_p {
            anyhow::ensure!(
                (0.0..=1.0).contains(&p),
                "default top_p {p} is outside 0..=1"
            );
        }
        if let Some(r) = self.repeat_penalty {
            anyhow::ensure!(
                r > 0.0 && r <= 2.0,
                "default repeat penalty {r} is outside (0, 2]"
            );
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(temperature: Option<f64>, top_p: Option<f64>) -> pb::GenerateRequest {
        pb::GenerateRequest {
            sampling: Some(pb::Sampling {
                temperature,
                top_p,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_unset_fields_take_the_defaults() {
        let d = SamplingDefaults {
            temperature: Some(0.2),
            top_p: Some(0.9),
            repeat_penalty: None,
        };
        let mut unset = request(None, None);
        d.apply(&mut unset);
        let s = unset.sampling.unwrap();
        assert_eq!((s.temperature, s.top_p), (Some(0.2), Some(0.9)));
        let mut set = request(Some(0.0), None);
        d.apply(&mut set);
        let s = set.sampling.unwrap();
        assert_eq!((s.temperature, s.top_p), (Some(0.0), Some(0.9)));
        let mut bare = pb::GenerateRequest::default();
        d.apply(&mut bare);
        assert_eq!(bare.sampling.unwrap().temperature, Some(0.2));
    }

    #[test]
    fn flags_override_metadata_and_bad_values_are_refused() {
        let gguf = SamplingDefaults {
            temperature: Some(0.6),
            top_p: Some(0.95),
            repeat_penalty: Some(1.05),
        };
        let flags = SamplingDefaults {
            temperature: Some(0.2),
            top_p: None,
            repeat_penalty: None,
        };
        assert_eq!(
            gguf.overridden_by(flags),
            SamplingDefaults {
                temperature: Some(0.2),
                top_p: Some(0.95),
                repeat_penalty: Some(1.05),
            }
        );
        for bad in [
            SamplingDefaults {
                temperature: Some(3.0),
                ..Default::default()
            },
            SamplingDefaults {
                top_p: Some(1.5),
                ..Default::default()
            },
            SamplingDefaults {
                repeat_penalty: Some(0.0),
                ..Default::default()
            },
        ] {
            assert!(bad.validated().is_err(), "{bad:?}");
        }
    }
}
