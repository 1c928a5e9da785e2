//! The reference model for real-engine tests: `IGW_MODEL_FILE`, else the
//! path `scripts/fetch-model.sh` prints (it fetches and verifies the
//! SmolLM2 GGUF once, then answers from its cache).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The GGUF file, located once per test process.
pub fn model_file() -> Result<PathBuf> {
    static FILE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FILE.get_or_init(|| locate().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn locate() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("IGW_MODEL_FILE").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("IGW_MODEL_FILE={} is not a file", path.display());
        }
        return Ok(path);
    }
    script_path("fetch-model.sh")
}

/// Runs `scripts/NAME` (a script that caches what it fetches or builds)
/// and returns the path it prints.
pub(crate) fn script_path(name: &str) -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name);
    let out = std::process::Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    Ok(PathBuf::from(path))
}
