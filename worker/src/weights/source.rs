//! Where weights come from: an HTTP(S) URL, an object of an S3-compatible
//! bucket (SigV4-presigned with `rusty-s3`), or a file of a Hugging Face
//! repository. Each becomes one GET request, built afresh per attempt (a
//! presigned URL expires; a retry an hour later must not reuse it).

use anyhow::{bail, Context};
use http::{HeaderMap, HeaderValue, Uri};
use std::time::Duration;

/// How long a presigned S3 URL stays valid: one attempt's request head.
const PRESIGN_FOR: Duration = Duration::from_secs(3600);

/// AWS credentials (from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
/// `AWS_SESSION_TOKEN`).
#[derive(Clone)]
pub struct S3Credentials {
    pub key: String,
    pub secret: String,
    pub token: Option<String>,
}

/// One source of a weights file.
#[derive(Clone)]
pub enum Source {
    /// A plain `http://` or `https://` URL.
    Url(String),
    /// `s3://bucket/key` on an S3-compatible endpoint, path-style
    /// (`ENDPOINT/bucket/key`) or virtual-host style (`bucket.ENDPOINT/key`).
    S3 {
        bucket: String,
        key: String,
        endpoint: String,
        region: String,
        virtual_host: bool,
        /// `None`: an unsigned request (a public bucket).
        credentials: Option<S3Credentials>,
    },
    /// `ENDPOINT/ORG/NAME/resolve/REVISION/FILE`, with `HF_TOKEN` as a
    /// bearer token when set.
    HuggingFace {
        endpoint: String,
        repo: String,
        file: String,
        revision: String,
        token: Option<String>,
    },
}

impl Source {
    /// Splits `s3://bucket/key`.
    pub fn parse_s3_url(url: &str) -> anyhow::Result<(String, String)> {
        let rest = url
            .strip_prefix("s3://")
            .with_context(|| format!("--s3 must be s3://BUCKET/KEY, got '{url}'"))?;
        match rest.split_once('/') {
            Some((bucket, key)) if !bucket.is_empty() && !key.is_empty() => {
                Ok((bucket.to_owned(), key.to_owned()))
            }
            _ => bail!("--s3 must be s3://BUCKET/KEY, got '{url}'"),
        }
    }

    /// The file name the source names (its last path segment).
    pub fn file_name(&self) -> Option<String> {
        let path = match self {
            Source::Url(url) => {
                let uri: Uri = url.parse().ok()?;
                uri.path().to_owned()
            }
            Source::S3 { key, .. } => key.clone(),
            Source::HuggingFace { file, .. } => file.clone(),
        };
        path.rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
    }

    /// What the source is, for messages: no query string (a presigned URL
    /// carries its signature there) and no credentials.
    pub fn describe(&self) -> String {
        match self {
            Source::Url(url) => url.split(['?', '#']).next().unwrap_or(url).to_owned(),
            Source::S3 {
                bucket,
                key,
                endpoint,
                ..
            } => format!("s3://{bucket}/{key} at {endpoint}"),
            Source::HuggingFace {
                repo,
                file,
                revision,
                ..
            } => format!("Hugging Face {repo}/{file} at revision {revision}"),
        }
    }

    /// Hosts besides its own that the source is known to redirect to: the
    /// Hub's CDN (`cdn-lfs.hf.co`, `cas-bridge.xethub.hf.co`, ...) when
    /// the endpoint is the Hub itself, and AWS's regional S3 endpoints for
    /// a bucket on AWS. A mirror or another store names its own with
    /// `--allow-redirect-host`.
    pub fn redirect_hosts(&self) -> Vec<String> {
        let host_of = |url: &str| {
            url.parse::<Uri>()
                .ok()
                .and_then(|u| u.host().map(str::to_ascii_lowercase))
                .unwrap_or_default()
        };
        let under =
            |host: &str, domain: &str| host == domain || host.ends_with(&format!(".{domain}"));
        match self {
            Source::HuggingFace { endpoint, .. } if under(&host_of(endpoint), "huggingface.co") => {
                vec![".huggingface.co".into(), ".hf.co".into()]
            }
            Source::S3 { endpoint, .. } if under(&host_of(endpoint), "amazonaws.com") => {
                vec![".amazonaws.com".into()]
            }
            _ => Vec::new(),
        }
    }

    /// The request of one attempt: its URL and headers (authorization
    /// included; never logged).
    pub fn request(&self) -> anyhow::Result<(Uri, HeaderMap)> {
        let mut headers = HeaderMap::new();
        let url = match self {
            Source::Url(url) => url.clone(),
            Source::S3 {
                bucket,
                key,
                endpoint,
                region,
                virtual_host,
                credentials,
            } => {
                let endpoint: url::Url = endpoint
                    .parse()
                    .with_context(|| format!("--s3-endpoint '{endpoint}' is not a URL"))?;
                let style = if *virtual_host {
                    rusty_s3::UrlStyle::VirtualHost
                } else {
                    rusty_s3::UrlStyle::Path
                };
                let bucket = rusty_s3::Bucket::new(endpoint, style, bucket.clone(), region.clone())
                    .map_err(|e| anyhow::anyhow!("S3 bucket: {e}"))?;
                let credentials = credentials.as_ref().map(|c| match &c.token {
                    Some(token) => rusty_s3::Credentials::new_with_token(
                        c.key.clone(),
                        c.secret.clone(),
                        token.clone(),
                    ),
                    None => rusty_s3::Credentials::new(c.key.clone(), c.secret.clone()),
                });
                use rusty_s3::S3Action;
                bucket
                    .get_object(credentials.as_ref(), key)
                    .sign(PRESIGN_FOR)
                    .to_string()
            }
            Source::HuggingFace {
                endpoint,
                repo,
                file,
                revision,
                token,
            } => {
                if let Some(token) = token.as_deref().filter(|t| !t.is_empty()) {
                    let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                        .context("HF_TOKEN holds characters a header cannot")?;
                    value.set_sensitive(true);
                    headers.insert(http::header::AUTHORIZATION, value);
                }
                format!(
                    "{}/{repo}/resolve/{}/{}",
                    endpoint.trim_end_matches('/'),
                    encode_path(revision),
                    file.split('/')
                        .map(encode_path)
                        .collect::<Vec<_>>()
                        .join("/")
                )
            }
        };
        let uri: Uri = url
            .parse()
            .with_context(|| format!("'{}' is not a URL", self.describe()))?;
        match uri.scheme_str() {
            Some("http") | Some("https") => Ok((uri, headers)),
            _ => bail!("{} is not an http:// or https:// URL", self.describe()),
        }
    }
}

/// Percent-encodes one path segment (a revision like `refs/pr/1` stays one
/// segment, as the Hub expects it).
fn encode_path(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string()
}

/// Everything but unreserved characters (RFC 3986).
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_requests_are_presigned_with_sigv4() {
        let (bucket, key) = Source::parse_s3_url("s3://weights/llama/model.gguf").unwrap();
        let source = Source::S3 {
            bucket,
            key,
            endpoint: "http://127.0.0.1:9000".into(),
            region: "eu-west-1".into(),
            virtual_host: false,
            credentials: Some(S3Credentials {
                key: "AKIDEXAMPLE".into(),
                secret: "secret".into(),
                token: None,
            }),
        };
        let (uri, headers) = source.request().unwrap();
        assert_eq!(uri.path(), "/weights/llama/model.gguf");
        let query = uri.query().unwrap_or("");
        assert!(
            query.contains("X-Amz-Algorithm=AWS4-HMAC-SHA256"),
            "{query}"
        );
        assert!(query.contains("X-Amz-Credential=AKIDEXAMPLE%2F"), "{query}");
        assert!(
            query.contains("%2Feu-west-1%2Fs3%2Faws4_request"),
            "{query}"
        );
        assert!(query.contains("X-Amz-Signature="), "{query}");
        assert!(headers.is_empty());
        assert_eq!(source.file_name().as_deref(), Some("model.gguf"));
        assert!(
            !source.describe().contains("X-Amz"),
            "{}",
            source.describe()
        );
        assert!(Source::parse_s3_url("s3://bucket").is_err());
        assert!(Source::parse_s3_url("https://bucket/key").is_err());
    }

    #[test]
    fn hugging_face_requests_resolve_a_revision_with_the_token() {
        let source = Source::HuggingFace {
            endpoint: "http://127.0.0.1:8000/".into(),
            repo: "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF".into(),
            file: "gguf/model q4.gguf".into(),
            revision: "refs/pr/1".into(),
            token: Some("hf_secret".into()),
        };
        let (uri, headers) = source.request().unwrap();
        assert_eq!(
            uri.path(),
            "/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/resolve/refs%2Fpr%2F1/gguf/model%20q4.gguf"
        );
        assert_eq!(headers["authorization"], "Bearer hf_secret");
        assert_eq!(source.file_name().as_deref(), Some("model q4.gguf"));
    }

    #[test]
    fn urls_name_their_file_and_hide_their_query() {
        let source = Source::Url("https://cdn.example/m/model.gguf?sig=abc".into());
        assert_eq!(source.file_name().as_deref(), Some("model.gguf"));
        assert_eq!(source.describe(), "https://cdn.example/m/model.gguf");
        assert!(Source::Url("ftp://x/y".into()).request().is_err());
        assert_eq!(Source::Url("https://x/".into()).file_name(), None);
    }
}
