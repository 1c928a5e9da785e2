//! scripts/cuda-build.sh and scripts/gpu-check.sh up to the device, here,
//! without CUDA: their arguments, gpu-check's device detection (against a
//! fake `nvidia-smi`), and its report from saved results
//! (tests/testdata/gpu-check). Each runs in well under a second.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn run(script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("scripts").join(script)).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running bash")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Exit status and stderr, for the failure cases.
fn fails(out: &Output) -> (i32, String) {
    (out.status.code().unwrap_or(-1), text(&out.stderr))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("igw-{name}-{}", harness::random_hex(8)));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// An executable `nvidia-smi` that prints `stdout` and exits with `code`.
fn fake_nvidia_smi(dir: &Path, stdout: &str, code: i32) -> String {
    std::fs::create_dir_all(dir).expect("fake nvidia-smi dir");
    let path = dir.join("nvidia-smi");
    std::fs::write(
        &path,
        format!("#!/bin/sh\nprintf '%s' '{stdout}'\nexit {code}\n"),
    )
    .expect("write fake nvidia-smi");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

#[test]
fn cuda_build_explains_itself_and_refuses_bad_arguments() {
    let help = run("cuda-build.sh", &["--help"], &[]);
    assert!(help.status.success());
    let help = text(&help.stdout);
    assert!(help.contains("scripts/cuda-build.sh [ARCH]"), "{help}");
    assert!(help.contains("GGML_CUDA_NO_VMM"), "{help}");
    assert!(help.contains("libcublas.so.13"), "{help}");

    let (code, err) = fails(&run("cuda-build.sh", &["sm_x"], &[]));
    assert_eq!(code, 2);
    assert!(err.contains("bad architecture 'x'"), "{err}");
    let (code, err) = fails(&run("cuda-build.sh", &["sm_90", "sm_80"], &[]));
    assert_eq!(code, 2);
    assert!(err.contains("one ARCH only"), "{err}");
    let (code, err) = fails(&run("cuda-build.sh", &["--bogus"], &[]));
    assert_eq!(code, 2);
    assert!(err.contains("unknown option --bogus"), "{err}");
    let (code, err) = fails(&run("cuda-build.sh", &["--target-dir"], &[]));
    assert_eq!(code, 2);
    assert!(err.contains("--target-dir needs a DIR"), "{err}");
}

#[test]
fn gpu_check_explains_itself_and_refuses_bad_arguments() {
    let help = run("gpu-check.sh", &["--help"], &[]);
    assert!(help.status.success());
    let help = text(&help.stdout);
    assert!(help.contains("--fake-results DIR"), "{help}");
    assert!(help.contains("exit 3"), "{help}");

    for (args, message) in [
        (&["--bogus"][..], "unknown argument '--bogus'"),
        (&["--arch", "banana"][..], "bad --arch 'sm_banana'"),
        (&["--out"][..], "--out needs a value"),
        (
            &["--fake-results", "/nonexistent/igw"][..],
            "is not a directory",
        ),
    ] {
        let (code, err) = fails(&run("gpu-check.sh", args, &[]));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: {err}");
    }
}

#[test]
fn gpu_check_without_a_usable_gpu_says_why_and_exits_3() {
    let dir = scratch("gpu-check-smi");
    let cases = [
        (
            "/nonexistent/nvidia-smi".to_string(),
            "nvidia-smi is not installed",
        ),
        (
            fake_nvidia_smi(
                &dir.join("a"),
                "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.",
                9,
            ),
            "nvidia-smi failed: NVIDIA-SMI has failed",
        ),
        (
            fake_nvidia_smi(&dir.join("b"), "", 0),
            "nvidia-smi lists no GPU",
        ),
        (
            fake_nvidia_smi(
                &dir.join("c"),
                "NVIDIA H100 80GB HBM3, 9.0, 570.86.15, 81559 MiB",
                0,
            ),
            "the driver is 570.86.15; the CUDA 13 worker needs 580 or newer",
        ),
    ];
    for (smi, message) in &cases {
        let (code, err) = fails(&run("gpu-check.sh", &[], &[("NVIDIA_SMI", smi)]));
        assert_eq!(code, 3, "{smi}: {err}");
        assert!(err.contains(message), "{smi}: {err}");
        assert!(
            err.contains("needs one NVIDIA GPU and its driver >= 580"),
            "{err}"
        );
    }

    // A GPU of another architecture than the build's.
    let h100 = fake_nvidia_smi(
        &dir.join("d"),
        "NVIDIA H100 80GB HBM3, 9.0, 580.65.06, 81559 MiB",
        0,
    );
    let (code, err) = fails(&run(
        "gpu-check.sh",
        &["--arch", "sm_80", "--detect-only"],
        &[("NVIDIA_SMI", &h100)],
    ));
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("the GPU is sm_90 (compute capability 9.0) but --arch is sm_80"),
        "{err}"
    );

    // The same GPU found: its architecture is the build's.
    let ok = run("gpu-check.sh", &["--detect-only"], &[("NVIDIA_SMI", &h100)]);
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    assert!(
        text(&ok.stdout)
            .contains("GPU NVIDIA H100 80GB HBM3, 9.0, 580.65.06, 81559 MiB; architecture sm_90"),
        "{}",
        text(&ok.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn fixtures() -> PathBuf {
    repo().join("tests/testdata/gpu-check")
}

#[test]
fn gpu_check_report_puts_both_builds_side_by_side() {
    let out = scratch("gpu-check-report");
    let fixtures = fixtures().display().to_string();
    let run = run(
        "gpu-check.sh",
        &[
            "--fake-results",
            &fixtures,
            "--out",
            &out.display().to_string(),
        ],
        &[],
    );
    assert!(
        run.status.success(),
        "{}{}",
        text(&run.stdout),
        text(&run.stderr)
    );
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    for line in [
        "- GPU (nvidia-smi: name, compute capability, driver, memory): NVIDIA H100 80GB HBM3, 9.0, 580.65.06, 81559 MiB",
        "- ok: ready in 4 s; chat completion HTTP 200: \"Red, blue and green.\"",
        "- the workers offloaded their layers to the GPU:",
        "| llama_e2e | ok: 14 passed | ok: 14 passed |",
        "| planner_llama_e2e | ok: 3 passed | ok: 3 passed |",
        "| cold prompt, tokens | 537 | 537 | |",
        "| prefill tokens/s (cold prompt / TTFT) | 1678.1 | 33562.5 | 20.00x |",
        "| time to first token, ms | 320.0 | 16.0 | 20.00x faster |",
        "| decode tokens/s, one stream | 100.0 | 400.0 | 4.00x |",
        "| completion tokens/s, 8 streams | 340.0 | 1700.0 | 5.00x |",
        "Verdict: PASS",
    ] {
        assert!(report.lines().any(|l| l == line), "missing {line:?} in:\n{report}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn gpu_check_report_fails_on_a_failed_suite_or_a_cpu_fallback() {
    let results = scratch("gpu-check-failing");
    for entry in std::fs::read_dir(fixtures()).expect("fixtures") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, results.join(path.file_name().expect("name"))).expect("copy");
    }
    std::fs::write(
        results.join("e2e-cuda-llama_e2e.log"),
        "test result: FAILED. 12 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out\n",
    )
    .expect("write");
    std::fs::write(results.join("e2e-cuda-llama_e2e.rc"), "101\n").expect("write");
    std::fs::write(
        results.join("up-cuda.log"),
        " WARN llama: this worker is a CUDA build but found no usable GPU (...); the model runs on the CPU\n",
    )
    .expect("write");
    std::fs::remove_file(results.join("realbench-cuda.txt")).expect("rm");
    let out = scratch("gpu-check-failing-out");
    let run = run(
        "gpu-check.sh",
        &[
            "--fake-results",
            &results.display().to_string(),
            "--out",
            &out.display().to_string(),
        ],
        &[],
    );
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stdout));
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    for line in [
        "| llama_e2e | ok: 14 passed | FAILED: 12 passed, 2 failed (exit 101) |",
        "- NO worker said it offloaded its layers to the GPU",
        "- a worker found no usable GPU (it ran on the CPU)",
        "| decode tokens/s, one stream | 100.0 | - | - |",
        "Verdict: FAIL (GPU offload, e2e llama_e2e (CUDA), realbench (CUDA))",
    ] {
        assert!(
            report.lines().any(|l| l == line),
            "missing {line:?} in:\n{report}"
        );
    }
    let _ = std::fs::remove_dir_all(&results);
    let _ = std::fs::remove_dir_all(&out);
}
