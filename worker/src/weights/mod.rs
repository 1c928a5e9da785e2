//! `worker fetch-weights`: brings one weights file into a directory before
//! an engine reads it (an init container, or by hand). The file is written
//! to `DIR/NAME.part`; a cut connection resumes with a `Range` request
//! (retries back off, and give up after `retries` attempts in a row that
//! made no progress); the whole file's sha256 is checked before it is
//! renamed into place, so `DIR/NAME` only ever holds verified bytes. A
//! file already there with the right checksum ends the command at once,
//! without a request. One fetch per directory at a time (an advisory lock
//! on the directory), so pods sharing a volume do not write the same file.

pub mod source;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use source::Source;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Redirects followed per attempt (the Hub answers a file with one to its
/// CDN).
const MAX_REDIRECTS: usize = 5;

/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Buffered writes to the part file: a few large writes rather than one
/// per network frame.
const WRITE_BUFFER: usize = 1 << 20;

/// What to fetch, where to, and how patiently.
pub struct FetchOptions {
    pub source: Source,
    pub dest: PathBuf,
    /// The file name in `dest` (default: the source's last path segment).
    pub file_name: Option<String>,
    /// The expected sha256, 64 hex digits.
    pub sha256: String,
    /// Attempts in a row without progress before giving up.
    pub retries: u32,
    /// The first wait between attempts; doubled after each attempt
    /// without progress, at most 30 s.
    pub backoff: Duration,
    pub connect_timeout: Duration,
    /// Longest silence of a response (head or body) before the attempt is
    /// treated as a cut connection.
    pub idle_timeout: Duration,
    /// Extra trusted CAs (PEM), besides the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// How an attempt ended short of the whole file.
enum Failed {
    /// Worth another attempt (a cut connection, a 5xx, a short body).
    Retry(anyhow::Error),
    /// Not: the source refused (401, 403, 404...).
    Fatal(anyhow::Error),
}

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Fetches the file and returns its path in `dest`.
pub async fn fetch(opts: &FetchOptions) -> anyhow::Result<PathBuf> {
    let expected = opts.sha256.to_ascii_lowercase();
    if expected.len() != 64 || !expected.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--sha256 must be 64 hex digits, got '{}'", opts.sha256);
    }
    let name = match &opts.file_name {
        Some(n) => n.clone(),
        None => opts.source.file_name().with_context(|| {
            format!(
                "{} names no file; give one with --file",
                opts.source.describe()
            )
        })?,
    };
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        bail!("'{name}' is not a file name");
    }
    std::fs::create_dir_all(&opts.dest)
        .with_context(|| format!("creating {}", opts.dest.display()))?;
    let _lock = lock_dir(&opts.dest).await?;
    let target = opts.dest.join(&name);
    if target.is_file() {
        if sha256_of(&target).await? == expected {
            eprintln!(
                "fetch-weights: {} is present with the expected sha256",
                target.display()
            );
            return Ok(target);
        }
        eprintln!(
            "fetch-weights: {} is present with another sha256; fetching it again",
            target.display()
        );
    }
    let part = opts.dest.join(format!("{name}.part"));
    download(opts, &part).await?;
    let got = sha256_of(&part).await?;
    if got != expected {
        let _ = std::fs::remove_file(&part);
        bail!(
            "checksum mismatch for {name} from {}: expected sha256 {expected}, got {got}; the download was deleted",
            opts.source.describe()
        );
    }
    std::fs::File::open(&part)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", part.display()))?;
    std::fs::rename(&part, &target)
        .with_context(|| format!("renaming {} into place", part.display()))?;
    if let Ok(dir) = std::fs::File::open(&opts.dest) {
        let _ = dir.sync_all();
    }
    eprintln!(
        "fetch-weights: {} verified (sha256 {expected})",
        target.display()
    );
    Ok(target)
}

/// Holds an exclusive advisory lock on `dir` (released when dropped), so
/// two fetches into one shared volume take turns.
async fn lock_dir(dir: &Path) -> anyhow::Result<std::fs::File> {
    let handle = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    match handle.try_lock() {
        Ok(()) => Ok(handle),
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!(
                "fetch-weights: another fetch holds {}; waiting for it",
                dir.display()
            );
            let display = dir.display().to_string();
            tokio::task::spawn_blocking(move || handle.lock().map(|()| handle))
                .await?
                .with_context(|| format!("locking {display}"))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", dir.display()))
        }
    }
}

/// The sha256 of a file, hex (read off the async threads).
async fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let mut file =
            std::fs::File::open(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; WRITE_BUFFER];
        loop {
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        Ok(hex::encode(hasher.finalize()))
    })
    .await?
}

fn client(opts: &FetchOptions) -> anyhow::Result<HttpClient> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    if let Some(ca) = &opts.ca_file {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        for cert in CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("reading --ca-file {}", ca.display()))?
        {
            roots
                .add(cert.with_context(|| format!("--ca-file {} is not PEM", ca.display()))?)
                .with_context(|| format!("--ca-file {}", ca.display()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(opts.connect_timeout));
    http.set_nodelay(true);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// Downloads into `part` until it holds the whole file.
async fn download(opts: &FetchOptions, part: &Path) -> anyhow::Result<()> {
    let client = client(opts)?;
    let mut failures = 0u32;
    let mut backoff = opts.backoff;
    loop {
        let before = file_len(part);
        let error = match attempt(opts, &client, part).await {
            Ok(()) => return Ok(()),
            Err(Failed::Fatal(e)) => return Err(e),
            Err(Failed::Retry(e)) => e,
        };
        let after = file_len(part);
        if after > before {
            failures = 0;
            backoff = opts.backoff;
        } else {
            failures += 1;
        }
        if failures > opts.retries {
            bail!(
                "giving up on {} after {} attempts in a row without progress: {error:#}",
                opts.source.describe(),
                failures
            );
        }
        eprintln!(
            "fetch-weights: {error:#}; resuming at byte {after} in {} ms",
            backoff.as_millis()
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// One GET: from the part file's length on (a `Range` request), appended
/// to it.
async fn attempt(opts: &FetchOptions, client: &HttpClient, part: &Path) -> Result<(), Failed> {
    let offset = file_len(part);
    let (uri, headers) = opts.source.request().map_err(Failed::Fatal)?;
    let response = send(opts, client, uri, headers, offset).await?;
    let status = response.status();
    let (append, total) = match status {
        StatusCode::PARTIAL_CONTENT => {
            let (start, total) = content_range(response.headers()).ok_or_else(|| {
                Failed::Retry(anyhow::anyhow!(
                    "a 206 reply without a usable Content-Range"
                ))
            })?;
            if start != offset {
                // Not the bytes asked for: start over rather than splice.
                truncate(part)?;
                return Err(Failed::Retry(anyhow::anyhow!(
                    "the server sent bytes from {start}, not {offset}"
                )));
            }
            (true, total)
        }
        StatusCode::OK => (false, content_length(response.headers())),
        StatusCode::RANGE_NOT_SATISFIABLE if offset > 0 => {
            // The part may already be whole (a cut after its last byte).
            let total = content_range_total(response.headers());
            if total == Some(offset) {
                return Ok(());
            }
            truncate(part)?;
            return Err(Failed::Retry(anyhow::anyhow!(
                "the server refused the range from byte {offset}; starting over"
            )));
        }
        s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => {
            return Err(Failed::Retry(anyhow::anyhow!(
                "{} answered {s}",
                opts.source.describe()
            )));
        }
        s => {
            let hint = match s.as_u16() {
                401 | 403 => {
                    " (check the credentials: HF_TOKEN, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)"
                }
                404 => " (check the URL, bucket, key, repository, file and revision)",
                _ => "",
            };
            return Err(Failed::Fatal(anyhow::anyhow!(
                "{} answered {s}{hint}",
                opts.source.describe()
            )));
        }
    };
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(part)
        .await
        .map_err(|e| {
            Failed::Fatal(anyhow::Error::new(e).context(format!("opening {}", part.display())))
        })?;
    let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut body = response.into_body();
    let cut = loop {
        let frame = match tokio::time::timeout(opts.idle_timeout, body.frame()).await {
            Err(_) => break Some(anyhow::anyhow!("no data for {:?}", opts.idle_timeout)),
            Ok(None) => break None,
            Ok(Some(Err(e))) => break Some(anyhow::anyhow!("the connection broke: {e}")),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if let Err(e) = out.write_all(&data).await {
                return Err(Failed::Fatal(
                    anyhow::Error::new(e).context(format!("writing {}", part.display())),
                ));
            }
        }
    };
    out.flush().await.map_err(|e| {
        Failed::Fatal(anyhow::Error::new(e).context(format!("writing {}", part.display())))
    })?;
    if let Some(e) = cut {
        return Err(Failed::Retry(e));
    }
    let len = file_len(part);
    match total {
        Some(total) if len < total => Err(Failed::Retry(anyhow::anyhow!(
            "the body ended at byte {len} of {total}"
        ))),
        Some(total) if len > total => {
            truncate(part)?;
            Err(Failed::Retry(anyhow::anyhow!(
                "the file grew past its length {total}; starting over"
            )))
        }
        _ => Ok(()),
    }
}

/// Sends the GET (following redirects; credentials never follow one to
/// another host) and waits for the response head.
async fn send(
    opts: &FetchOptions,
    client: &HttpClient,
    mut uri: Uri,
    mut headers: HeaderMap,
    offset: u64,
) -> Result<hyper::Response<hyper::body::Incoming>, Failed> {
    for _ in 0..=MAX_REDIRECTS {
        let mut request = hyper::Request::get(uri.clone());
        if let Some(h) = request.headers_mut() {
            h.extend(headers.clone());
            if offset > 0 {
                h.insert(
                    http::header::RANGE,
                    http::HeaderValue::from_str(&format!("bytes={offset}-"))
                        .map_err(|e| Failed::Fatal(e.into()))?,
                );
            }
        }
        let request = request
            .body(Empty::new())
            .map_err(|e| Failed::Fatal(e.into()))?;
        let response = match tokio::time::timeout(opts.idle_timeout, client.request(request)).await
        {
            Err(_) => {
                return Err(Failed::Retry(anyhow::anyhow!(
                    "no response from {} within {:?}",
                    opts.source.describe(),
                    opts.idle_timeout
                )))
            }
            Ok(Err(e)) => {
                return Err(Failed::Retry(anyhow::anyhow!(
                    "requesting {}: {}",
                    opts.source.describe(),
                    error_chain(&e)
                )))
            }
            Ok(Ok(r)) => r,
        };
        if !response.status().is_redirection() {
            return Ok(response);
        }
        let location = response
            .headers()
            .get(http::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| Failed::Fatal(anyhow::anyhow!("a redirect without a Location")))?;
        let next = resolve(&uri, location).map_err(Failed::Fatal)?;
        if next.authority() != uri.authority() || next.scheme() != uri.scheme() {
            headers.remove(http::header::AUTHORIZATION);
        }
        uri = next;
    }
    Err(Failed::Fatal(anyhow::anyhow!(
        "{} redirected more than {MAX_REDIRECTS} times",
        opts.source.describe()
    )))
}

/// A `Location` (absolute, or a path on the same origin) against `base`.
fn resolve(base: &Uri, location: &str) -> anyhow::Result<Uri> {
    let uri: Uri = location
        .parse()
        .with_context(|| format!("a redirect to '{location}'"))?;
    if uri.scheme().is_some() {
        return Ok(uri);
    }
    let mut parts = base.clone().into_parts();
    parts.path_and_query = uri.path_and_query().cloned();
    Ok(Uri::from_parts(parts)?)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn truncate(part: &Path) -> Result<(), Failed> {
    match std::fs::OpenOptions::new().write(true).open(part) {
        Ok(f) => f
            .set_len(0)
            .map_err(|e| Failed::Fatal(anyhow::Error::new(e).context("truncating the part file"))),
        Err(_) => Ok(()),
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(http::header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `Content-Range: bytes START-END/TOTAL` → (START, TOTAL when known).
fn content_range(h: &HeaderMap) -> Option<(u64, Option<u64>)> {
    let v = h.get(http::header::CONTENT_RANGE)?.to_str().ok()?;
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (start, _end) = range.split_once('-')?;
    Some((start.trim().parse().ok()?, total.trim().parse().ok()))
}

/// `Content-Range: bytes */TOTAL` (a 416's) → TOTAL.
fn content_range_total(h: &HeaderMap) -> Option<u64> {
    let v = h.get(http::header::CONTENT_RANGE)?.to_str().ok()?;
    v.trim().strip_prefix("bytes */")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse() {
        let mut h = HeaderMap::new();
        h.insert("content-range", "bytes 100-199/1000".parse().unwrap());
        assert_eq!(content_range(&h), Some((100, Some(1000))));
        h.insert("content-range", "bytes 100-199/*".parse().unwrap());
        assert_eq!(content_range(&h), Some((100, None)));
        h.insert("content-range", "bytes */1000".parse().unwrap());
        assert_eq!(content_range_total(&h), Some(1000));
        assert_eq!(content_range(&h), None);
    }

    #[test]
    fn redirects_resolve_against_their_origin() {
        let base: Uri = "https://hub.example/org/m/resolve/main/f.gguf"
            .parse()
            .unwrap();
        assert_eq!(
            resolve(&base, "/api/blob/abc?x=1").unwrap().to_string(),
            "https://hub.example/api/blob/abc?x=1"
        );
        assert_eq!(
            resolve(&base, "https://cdn.example/abc")
                .unwrap()
                .to_string(),
            "https://cdn.example/abc"
        );
    }
}
