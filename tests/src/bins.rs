//! Where the release binaries are. The harness never builds them: the test
//! command runs `cargo build --release --workspace --bins` once first.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The directory holding `gateway` and `worker`: `$IGW_BIN_DIR` if set, else
/// the release directory this executable runs from (test executables live in
/// `target/release/deps/`, the harness's own binaries in `target/release/`),
/// else `$CARGO_TARGET_DIR/release`, else the workspace's `target/release`.
pub fn bin_dir() -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("IGW_BIN_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(2) {
            candidates.push(dir.to_path_buf());
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_relative() {
            workspace.join(dir)
        } else {
            dir
        };
        candidates.push(dir.join("release"));
    }
    candidates.push(workspace.join("target").join("release"));
    for dir in &candidates {
        if dir.join("gateway").is_file() && dir.join("worker").is_file() {
            return Ok(dir.clone());
        }
    }
    bail!(
        "the gateway and worker binaries were not found (looked in {candidates:?}); \
         build them first with `cargo build --release --workspace --bins`"
    )
}

/// Path of the release binary `name` (`gateway`, `worker`, `stack`, ...).
pub fn bin(name: &str) -> Result<PathBuf> {
    let path = bin_dir()?.join(name);
    if !path.is_file() {
        bail!(
            "{} is missing; build it with `cargo build --release --workspace --bins`",
            path.display()
        );
    }
    Ok(path)
}

/// Where child logs go: `<target>/e2e-logs/`, next to the binaries' release dir.
pub fn log_root() -> PathBuf {
    match bin_dir() {
        Ok(dir) => dir
            .parent()
            .map(|t| t.join("e2e-logs"))
            .unwrap_or_else(|| std::env::temp_dir().join("igw-e2e-logs")),
        Err(_) => std::env::temp_dir().join("igw-e2e-logs"),
    }
}
