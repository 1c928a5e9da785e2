//! The worker's layers import one way: service → engine → pipeline → seam
//! (ARCHITECTURE.md). Read from the sources' `crate::` paths, test code
//! and comments left out.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The `crate::` paths a layer's non-test code names.
fn imports(layer: &str) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer);
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            for (at, _) in line.match_indices("crate::") {
                let path: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                out.push((file.clone(), path));
            }
        }
    }
    out
}

#[track_caller]
fn assert_not_above(layer: &str, above: &[&str]) {
    let bad: Vec<_> = imports(layer)
        .into_iter()
        .filter(|(_, module)| above.contains(&module.as_str()))
        .collect();
    assert!(
        bad.is_empty(),
        "`{layer}` imports a layer above it: {bad:?}"
    );
}

#[test]
fn the_seam_is_below_everything() {
    assert_not_above("seam", &["service", "engine", "pipeline"]);
}

#[test]
fn the_pipeline_never_imports_an_engine() {
    assert_not_above("pipeline", &["service", "engine"]);
}

#[test]
fn engines_never_import_the_service() {
    assert_not_above("engine", &["service"]);
}
