//! Where the `llama` engine's layers run: `--n-gpu-layers`, and what the
//! worker says about it at load. Built without the `llama` feature too (the
//! flag is parsed either way).
//!
//! A `cuda` build links the CUDA runtime statically and no driver library
//! (scripts/cuda-build.sh, "Link options"), so it starts on a machine
//! without a GPU or driver: llama.cpp's CUDA backend then has no device
//! and every layer stays on the CPU. That is allowed (the same image serves
//! a CPU node), but it must not pass unnoticed on a GPU node whose driver
//! is missing: the worker says so at warn level, once, at load.

use std::fmt;
use std::str::FromStr;

/// `--n-gpu-layers`: how many of the model's layers llama.cpp offloads to
/// the GPU (the rest run on the CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuLayers {
    /// Every layer (llama.cpp's own default), the output layer included.
    #[default]
    All,
    /// The first N repeating layers; 0 keeps the model on the CPU.
    Count(u32),
}

impl FromStr for GpuLayers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("all") {
            return Ok(GpuLayers::All);
        }
        s.parse::<u32>().map(GpuLayers::Count).map_err(|_| {
            format!("`{s}` is not a layer count: want `all` or a number (0 = CPU only)")
        })
    }
}

impl fmt::Display for GpuLayers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuLayers::All => f.write_str("all"),
            GpuLayers::Count(n) => write!(f, "{n}"),
        }
    }
}

/// What the worker logs at load about the GPU, from what the build has
/// and what llama.cpp found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A GPU build with devices: layers are offloaded to them.
    Gpu {
        devices: Vec<String>,
        layers: GpuLayers,
    },
    /// A GPU build that found no device: everything runs on the CPU.
    NoGpuFound,
    /// A GPU build told to keep the model on the CPU (`--n-gpu-layers 0`).
    CpuByChoice,
    /// A CPU build: the flag has no effect (said only if it was set).
    CpuBuild { layers_set: bool },
}

impl Placement {
    pub fn decide(gpu_build: bool, devices: Vec<String>, layers: GpuLayers) -> Self {
        match (gpu_build, layers) {
            (false, _) => Placement::CpuBuild {
                layers_set: layers != GpuLayers::All,
            },
            (true, GpuLayers::Count(0)) => Placement::CpuByChoice,
            (true, _) if devices.is_empty() => Placement::NoGpuFound,
            (true, _) => Placement::Gpu { devices, layers },
        }
    }

    /// Logs the placement: warn where an operator should act, else info.
    pub fn log(&self) {
        match self {
            Placement::Gpu { devices, layers } => tracing::info!(
                gpu_layers = %layers,
                devices = %devices.join(", "),
                "llama: offloading model layers to the GPU"
            ),
            Placement::NoGpuFound => tracing::warn!(
                "llama: this worker is a CUDA build but found no usable GPU (no NVIDIA \
                 device, or no driver: libcuda.so.1 from a driver >= 580 is needed); \
                 the model runs on the CPU"
            ),
            Placement::CpuByChoice => {
                tracing::info!("llama: --n-gpu-layers 0: the model runs on the CPU")
            }
            Placement::CpuBuild { layers_set: true } => tracing::warn!(
                "llama: --n-gpu-layers has no effect: this worker was built without a GPU \
                 backend (the `cuda` feature); the model runs on the CPU"
            ),
            Placement::CpuBuild { layers_set: false } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_and_counts() {
        assert_eq!("all".parse(), Ok(GpuLayers::All));
        assert_eq!("ALL".parse(), Ok(GpuLayers::All));
        assert_eq!("0".parse(), Ok(GpuLayers::Count(0)));
        assert_eq!("33".parse(), Ok(GpuLayers::Count(33)));
        let err = "-1".parse::<GpuLayers>().unwrap_err();
        assert!(err.contains("`all` or a number"), "{err}");
        assert!("auto".parse::<GpuLayers>().is_err());
    }

    #[test]
    fn a_gpu_build_without_a_device_runs_on_the_cpu() {
        assert_eq!(
            Placement::decide(true, vec![], GpuLayers::All),
            Placement::NoGpuFound
        );
        let h100 = vec!["CUDA0 (NVIDIA H100 80GB HBM3)".to_string()];
        assert_eq!(
            Placement::decide(true, h100.clone(), GpuLayers::Count(20)),
            Placement::Gpu {
                devices: h100.clone(),
                layers: GpuLayers::Count(20)
            }
        );
        assert_eq!(
            Placement::decide(true, h100, GpuLayers::Count(0)),
            Placement::CpuByChoice
        );
        assert_eq!(
            Placement::decide(false, vec![], GpuLayers::All),
            Placement::CpuBuild { layers_set: false }
        );
        assert_eq!(
            Placement::decide(false, vec![], GpuLayers::Count(5)),
            Placement::CpuBuild { layers_set: true }
        );
    }
}
