//! `worker fetch-weights`'s flags, read into the [`FetchOptions`] of one
//! fetch (S3 and Hub credentials from the environment).

use super::source::{S3Credentials, Source};
use super::FetchOptions;
use std::time::Duration;

// `worker fetch-weights` flags (a plain comment: a doc comment would be
// the subcommand's help).
#[derive(clap::Parser, Debug)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["url", "s3", "hf_repo"])))]
pub struct FetchArgs {
    /// The directory the file goes to (created if missing).
    #[arg(long)]
    dest: std::path::PathBuf,
    /// The file's expected sha256 (64 hex digits).
    #[arg(long)]
    sha256: String,
    /// The file's name in --dest (default: the source's last path segment).
    #[arg(long)]
    file: Option<String>,
    /// An http:// or https:// URL.
    #[arg(long)]
    url: Option<String>,
    /// An object of an S3-compatible bucket: s3://BUCKET/KEY.
    #[arg(long, requires = "s3_endpoint")]
    s3: Option<String>,
    /// The S3 endpoint (`https://s3.eu-west-1.amazonaws.com`, a MinIO URL).
    #[arg(long)]
    s3_endpoint: Option<String>,
    /// The bucket's region (signed into the request).
    #[arg(long, default_value = "us-east-1")]
    s3_region: String,
    /// Address the bucket as BUCKET.ENDPOINT (virtual-host style) instead
    /// of ENDPOINT/BUCKET (path style, what MinIO and most S3-compatible
    /// stores take).
    #[arg(long)]
    s3_virtual_host: bool,
    /// A Hugging Face model repository: ORG/NAME.
    #[arg(long, requires = "hf_file")]
    hf_repo: Option<String>,
    /// The file in the repository (`model-q4_k_m.gguf`, `sub/dir/file`).
    #[arg(long)]
    hf_file: Option<String>,
    /// A branch, tag or commit of the repository.
    #[arg(long, default_value = "main")]
    hf_revision: String,
    /// The Hub (a mirror, or a test server).
    #[arg(long, env = "HF_ENDPOINT", default_value = "https://huggingface.co")]
    hf_endpoint: String,
    /// Attempts in a row without progress before giving up.
    #[arg(long, default_value_t = 8)]
    retries: u32,
    /// The first wait between attempts, in milliseconds (doubling, at most 30 s).
    #[arg(long, default_value_t = 500)]
    retry_backoff_ms: u64,
    #[arg(long, default_value_t = 30)]
    connect_timeout_seconds: u64,
    /// Longest silence of a response (head or body) before the connection
    /// counts as cut.
    #[arg(long, default_value_t = 60)]
    idle_timeout_seconds: u64,
    /// A PEM bundle of further trusted CAs (a private object store).
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
    /// The file's size in bytes, when known: never more is written, and a
    /// server declaring another size is refused.
    #[arg(long)]
    size: Option<u64>,
    /// The longest the whole fetch may take, every attempt and wait included.
    #[arg(long, default_value_t = 86_400)]
    deadline_seconds: u64,
    /// A further host redirects may go to (`cdn.example`, or `.example`
    /// for every host under it); repeatable.
    #[arg(long)]
    allow_redirect_host: Vec<String>,
}

impl FetchArgs {
    /// The fetch these flags ask for: one source, checked, with its
    /// credentials from the environment.
    pub fn into_options(self) -> anyhow::Result<FetchOptions> {
        let args = self;
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let source = if let Some(url) = args.url {
            Source::Url(url)
        } else if let Some(s3) = args.s3 {
            let (bucket, key) = Source::parse_s3_url(&s3)?;
            let credentials = match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(key), Some(secret)) => Some(S3Credentials {
                    key,
                    secret,
                    token: env("AWS_SESSION_TOKEN"),
                }),
                (None, None) => None,
                _ => anyhow::bail!("set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or neither (a public bucket)"),
            };
            Source::S3 {
                bucket,
                key,
                endpoint: args.s3_endpoint.unwrap_or_default(),
                region: args.s3_region,
                virtual_host: args.s3_virtual_host,
                credentials,
            }
        } else if let Some(repo) = args.hf_repo {
            let valid = repo.split('/').count() == 2
                && repo.split('/').all(|p| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                });
            if !valid {
                anyhow::bail!("--hf-repo must be ORG/NAME, got '{repo}'");
            }
            Source::HuggingFace {
                endpoint: args.hf_endpoint,
                repo,
                file: args.hf_file.unwrap_or_default(),
                revision: args.hf_revision,
                token: env("HF_TOKEN"),
            }
        } else {
            anyhow::bail!("give one source: --url, --s3 or --hf-repo");
        };
        Ok(FetchOptions {
            source,
            dest: args.dest,
            file_name: args.file,
            sha256: args.sha256,
            retries: args.retries,
            backoff: Duration::from_millis(args.retry_backoff_ms.max(1)),
            connect_timeout: Duration::from_secs(args.connect_timeout_seconds.max(1)),
            idle_timeout: Duration::from_secs(args.idle_timeout_seconds.max(1)),
            ca_file: args.ca_file,
            expected_size: args.size,
            deadline: Duration::from_secs(args.deadline_seconds.max(1)),
            redirect_hosts: args.allow_redirect_host,
        })
    }
}
