//! `worker fetch-weights` end to end: the real binary against a loopback
//! HTTP server serving the SmolLM2 GGUF, as an origin, an S3-compatible
//! bucket and the Hugging Face Hub; then a `llama` worker on the fetched
//! file serves a real completion.

use harness::chat;
use harness::file_server::FileServer;
use harness::model::model_file;
use harness::{Stack, WorkerOpts};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

const NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The GGUF and its sha256.
fn gguf() -> (PathBuf, String) {
    static SUM: OnceLock<(PathBuf, String)> = OnceLock::new();
    SUM.get_or_init(|| {
        let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
        let sum = sha256_of(&file);
        (file, sum)
    })
    .clone()
}

fn sha256_of(path: &Path) -> String {
    let bytes = std::fs::read(path).expect("read");
    hex::encode(Sha256::digest(&bytes))
}

/// A fresh directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("igw-weights-{}", harness::random_hex(8)));
        Self(dir)
    }

    fn entries(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `worker fetch-weights ARGS` with `env` (and nothing of the
/// test's own AWS / HF environment).
async fn fetch(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd =
        tokio::process::Command::new(harness::bins::bin("worker").expect("worker binary"));
    cmd.arg("fetch-weights")
        .args(args)
        .args(["--retry-backoff-ms", "50"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .envs(env.iter().copied());
    cmd.output().await.expect("run worker fetch-weights")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn a_url_download_is_verified_then_left_alone() {
    let (file, sum) = gguf();
    let server = FileServer::start(file).await.unwrap();
    let dest = TempDir::new();
    let url = format!("{}/models/{NAME}", server.base_url());
    let dest_arg = dest.0.to_string_lossy().into_owned();
    let args = ["--url", &url, "--dest", &dest_arg, "--sha256", &sum];
    let out = fetch(&args, &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let target = dest.0.join(NAME);
    assert_eq!(text(&out.stdout).trim(), target.display().to_string());
    assert_eq!(sha256_of(&target), sum);
    assert_eq!(dest.entries(), vec![NAME.to_owned()], "no part file left");
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path(), format!("/models/{NAME}"));
    assert_eq!(requests[0].header("range"), None);

    // Present with the right checksum: done at once, no request.
    let out = fetch(&args, &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("present with the expected sha256"));
    assert_eq!(server.requests().len(), 1, "no second request");
}

#[tokio::test]
async fn a_cut_connection_resumes_with_a_range_request_and_the_file_serves() {
    let (file, sum) = gguf();
    let server = FileServer::start(file).await.unwrap();
    let dest = TempDir::new();
    let cut_at: u64 = 10 * 1024 * 1024;
    server.cut_next_after(cut_at);
    let url = format!("{}/w/{NAME}", server.base_url());
    let dest_arg = dest.0.to_string_lossy().into_owned();
    let out = fetch(&["--url", &url, "--dest", &dest_arg, "--sha256", &sum], &[]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("resuming at byte {cut_at}")),
        "{}",
        text(&out.stderr)
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].header("range"), None);
    assert_eq!(
        requests[1].header("range"),
        Some(format!("bytes={cut_at}-").as_str())
    );
    let target = dest.0.join(NAME);
    assert_eq!(sha256_of(&target), sum);
    assert_eq!(dest.entries(), vec![NAME.to_owned()]);

    // The fetched file is a model a worker serves.
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::llama(&target, 512, 1))
        .start()
        .expect("a llama worker on the fetched file");
    let r = chat::create(&stack, &chat::greedy("Say hello.", 8)).await;
    assert!(!chat::content(&r).trim().is_empty(), "{r}");
    assert!(
        r["usage"]["completion_tokens"].as_u64().unwrap_or(0) >= 1,
        "{r}"
    );
}

#[tokio::test]
async fn a_wrong_checksum_or_a_missing_file_is_refused_and_leaves_nothing() {
    let (file, sum) = gguf();
    let server = FileServer::start(file).await.unwrap();
    let dest = TempDir::new();
    let dest_arg = dest.0.to_string_lossy().into_owned();
    let url = format!("{}/w/{NAME}", server.base_url());
    let wrong = "0".repeat(64);
    let out = fetch(
        &["--url", &url, "--dest", &dest_arg, "--sha256", &wrong],
        &[],
    )
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(
        err.contains(&format!("expected sha256 {wrong}, got {sum}")),
        "{err}"
    );
    assert!(err.contains("the download was deleted"), "{err}");
    assert!(dest.entries().is_empty(), "{:?}", dest.entries());

    let missing = format!("{}/missing/{NAME}", server.base_url());
    let out = fetch(
        &["--url", &missing, "--dest", &dest_arg, "--sha256", &sum],
        &[],
    )
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("answered 404 Not Found"), "{err}");
    assert_eq!(server.requests().len(), 2, "a 404 is not retried");
    assert!(dest.entries().iter().all(|e| !e.ends_with(".gguf")));
}

#[tokio::test]
async fn an_s3_object_is_fetched_with_a_sigv4_signed_request() {
    let (file, sum) = gguf();
    let server = FileServer::start(file).await.unwrap();
    let dest = TempDir::new();
    let dest_arg = dest.0.to_string_lossy().into_owned();
    let s3 = format!("s3://weights/smollm2/{NAME}");
    let endpoint = server.base_url();
    let out = fetch(
        &[
            "--s3",
            &s3,
            "--s3-endpoint",
            &endpoint,
            "--s3-region",
            "eu-west-1",
            "--dest",
            &dest_arg,
            "--sha256",
            &sum,
        ],
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDTESTKEY"),
            ("AWS_SECRET_ACCESS_KEY", "test-secret"),
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sha256_of(&dest.0.join(NAME)), sum);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(
        r.path(),
        format!("/weights/smollm2/{NAME}"),
        "path-style addressing"
    );
    let query = r.query();
    for part in [
        "X-Amz-Algorithm=AWS4-HMAC-SHA256",
        "X-Amz-Credential=AKIDTESTKEY%2F",
        "%2Feu-west-1%2Fs3%2Faws4_request",
        "X-Amz-SignedHeaders=host",
        "X-Amz-Date=",
        "X-Amz-Expires=",
        "X-Amz-Signature=",
    ] {
        assert!(query.contains(part), "{part} in {query}");
    }
    assert!(!query.contains("test-secret"));
    assert!(
        !text(&out.stderr).contains("X-Amz-Signature"),
        "no signed URL in the logs"
    );
}

#[tokio::test]
async fn a_hugging_face_file_is_fetched_with_the_token_which_stays_off_the_cdn() {
    let (file, sum) = gguf();
    let hub = FileServer::start(file.clone()).await.unwrap();
    let cdn = FileServer::start(file).await.unwrap();
    hub.redirect_to(&format!("{}/cdn", cdn.base_url()));
    let dest = TempDir::new();
    let dest_arg = dest.0.to_string_lossy().into_owned();
    let endpoint = hub.base_url();
    let out = fetch(
        &[
            "--hf-repo",
            "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF",
            "--hf-file",
            NAME,
            "--hf-revision",
            "v1.0",
            "--hf-endpoint",
            &endpoint,
            "--dest",
            &dest_arg,
            "--sha256",
            &sum,
        ],
        &[("HF_TOKEN", "hf_testtoken")],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(sha256_of(&dest.0.join(NAME)), sum);
    let asked = hub.requests();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        asked[0].path(),
        format!("/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/v1.0/{NAME}")
    );
    assert_eq!(
        asked[0].header("authorization"),
        Some("Bearer hf_testtoken")
    );
    let served = cdn.requests();
    assert_eq!(served.len(), 1);
    assert!(
        served[0].path().starts_with("/cdn/HuggingFaceTB/"),
        "{served:?}"
    );
    assert_eq!(
        served[0].header("authorization"),
        None,
        "the token does not follow a redirect to another host"
    );
}
