//! `worker fetch-weights`: brings one weights file into a directory before
//! an engine reads it (an init container, or by hand). The file is written
//! to `DIR/NAME.part`; a cut connection resumes with a `Range` request
//! (retries back off, and give up after `retries` attempts in a row that
//! made no progress, or at the deadline); the whole file's sha256 is
//! checked before it is renamed into place, so `DIR/NAME` only ever holds
//! verified bytes. A file already there with the right checksum ends the
//! command at once, without a request. One fetch per directory at a time
//! (an advisory lock on the directory), so pods sharing a volume do not
//! write the same file.
//!
//! The command runs with write access to the weights volume, next to
//! whatever else the pod can reach, so neither the volume's other writers
//! nor the server get to steer it: the part file is never opened through a
//! symbolic link (one planted as `NAME.part` would send the bytes outside
//! `DIR`); no more is written than the server declared and `--size` says;
//! an attempt that brings less than [`MIN_PROGRESS`] counts as one without
//! progress (one byte per attempt would otherwise go on for ever); and
//! redirects are followed only within the rules of [`redirect`].

pub mod args;
pub mod redirect;
pub mod source;

use anyhow::{bail, Context};
use bytes::Bytes;
use http::{HeaderMap, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redirect::RedirectPolicy;
use sha2::{Digest, Sha256};
use source::Source;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Redirects followed per attempt (the Hub answers a file with one to its
/// CDN).
const MAX_REDIRECTS: usize = 5;

/// Longest wait between attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Buffered writes to the part file: a few large writes rather than one
/// per network frame.
const WRITE_BUFFER: usize = 1 << 20;

/// What an attempt must add to the part file to count as progress (and
/// reset the count of failed attempts). A server that sends a few bytes
/// per connection must run out of retries, not be retried for ever.
pub const MIN_PROGRESS: u64 = 1 << 20;

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
    /// The file's size when known (`--size`): never more is written, and a
    /// server declaring another size is refused.
    pub expected_size: Option<u64>,
    /// The longest the whole fetch may take, attempts and waits included.
    pub deadline: Duration,
    /// Hosts a redirect may go to besides the source's own and those the
    /// source names (`Source::redirect_hosts`): `name`, or `.suffix` for
    /// every host under it.
    pub redirect_hosts: Vec<String>,
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
    // A link in the target's place is not a file we verified: it is
    // fetched again, and the rename replaces the link, not what it names.
    let present = std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_file());
    if present {
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
    refuse_link(&part)?;
    download(opts, &part).await?;
    let got = sha256_of(&part).await?;
    if got != expected {
        let _ = std::fs::remove_file(&part);
        bail!(
            "checksum mismatch for {name} from {}: expected sha256 {expected}, got {got}; the download was deleted",
            opts.source.describe()
        );
    }
    open_part(&part, false)
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

/// Refuses a part file that is a symbolic link or not a file: written
/// through, it would put the download wherever the link points.
fn refuse_link(part: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(part) {
        Ok(m) if m.file_type().is_symlink() => bail!(
            "{} is a symbolic link; refusing to write through it (remove it and run again)",
            part.display()
        ),
        Ok(m) if !m.is_file() => bail!("{} is not a regular file", part.display()),
        _ => Ok(()),
    }
}

/// Opens the part file without following a symbolic link (`O_NOFOLLOW`:
/// one planted between [`refuse_link`] and this open fails it too).
fn open_part(part: &Path, write: bool) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW)
        .open(part)
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
            open_part(&path, false).with_context(|| format!("reading {}", path.display()))?;
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
    let (origin, _) = opts.source.request()?;
    let mut hosts = opts.source.redirect_hosts();
    hosts.extend(opts.redirect_hosts.iter().cloned());
    let policy = RedirectPolicy::for_origin(&origin, &hosts).await;
    let started = Instant::now();
    let mut failures = 0u32;
    let mut backoff = opts.backoff;
    loop {
        let before = file_len(part);
        let left = opts.deadline.saturating_sub(started.elapsed());
        let error = match tokio::time::timeout(left, attempt(opts, &client, &policy, part)).await {
            Err(_) => bail!(
                "giving up on {} after {:?} (the deadline) at byte {}",
                opts.source.describe(),
                opts.deadline,
                file_len(part)
            ),
            Ok(Ok(())) => return Ok(()),
            Ok(Err(Failed::Fatal(e))) => return Err(e),
            Ok(Err(Failed::Retry(e))) => e,
        };
        let after = file_len(part);
        if after >= before.saturating_add(MIN_PROGRESS) {
            failures = 0;
            backoff = opts.backoff;
        } else {
            failures += 1;
        }
        if failures > opts.retries {
            bail!(
                "giving up on {} after {} attempts in a row without progress (less than {MIN_PROGRESS} bytes each): {error:#}",
                opts.source.describe(),
                failures
            );
        }
        if started.elapsed() + backoff >= opts.deadline {
            bail!(
                "giving up on {} at the deadline ({:?}): {error:#}",
                opts.source.describe(),
                opts.deadline
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

/// The part file's length (of the link itself, were one planted: never of
/// what it points to).
fn file_len(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).map_or(0, |m| m.len())
}

/// One GET: from the part file's length on (a `Range` request), appended
/// to it.
async fn attempt(
    opts: &FetchOptions,
    client: &HttpClient,
    policy: &RedirectPolicy,
    part: &Path,
) -> Result<(), Failed> {
    let offset = file_len(part);
    if opts.expected_size.is_some_and(|size| offset > size) {
        truncate(part)?;
        return Err(Failed::Retry(anyhow::anyhow!(
            "the part file was longer than --size; starting over"
        )));
    }
    let (uri, headers) = opts.source.request().map_err(Failed::Fatal)?;
    let response = send(opts, client, policy, uri, headers, offset).await?;
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
    // What this reply may bring the file to: what the server declared,
    // and what `--size` says (a server declaring another size is wrong).
    let limit = match (total, opts.expected_size) {
        (Some(declared), Some(size)) if declared != size => {
            return Err(Failed::Fatal(anyhow::anyhow!(
                "{} declares {declared} bytes; --size says {size}",
                opts.source.describe()
            )))
        }
        (declared, size) => declared.or(size),
    };
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .custom_flags(libc::O_NOFOLLOW)
        .open(part)
        .await
        .map_err(|e| {
            Failed::Fatal(anyhow::Error::new(e).context(format!("opening {}", part.display())))
        })?;
    let mut out = tokio::io::BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut body = response.into_body();
    let mut len = if append { offset } else { 0 };
    let write_error = |e: std::io::Error| {
        Failed::Fatal(anyhow::Error::new(e).context(format!("writing {}", part.display())))
    };
    let cut = loop {
        let frame = match tokio::time::timeout(opts.idle_timeout, body.frame()).await {
            Err(_) => break Some(anyhow::anyhow!("no data for {:?}", opts.idle_timeout)),
            Ok(None) => break None,
            Ok(Some(Err(e))) => break Some(anyhow::anyhow!("the connection broke: {e}")),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            let end = len.saturating_add(data.len() as u64);
            if let Some(limit) = limit.filter(|&limit| end > limit) {
                // Keep what fits (a rerun resumes from it; the checksum
                // judges it) and stop listening to this server.
                let fits = limit.saturating_sub(len) as usize;
                out.write_all(&data[..fits]).await.map_err(write_error)?;
                out.flush().await.map_err(write_error)?;
                return Err(Failed::Fatal(anyhow::anyhow!(
                    "{} sent more than the {limit} bytes of the file; stopped writing at byte {limit}",
                    opts.source.describe()
                )));
            }
            out.write_all(&data).await.map_err(write_error)?;
            len = end;
        }
    };
    out.flush().await.map_err(write_error)?;
    if let Some(e) = cut {
        return Err(Failed::Retry(e));
    }
    // The whole file is what the server declared, else what `--size` says.
    let len = file_len(part);
    match limit {
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
    policy: &RedirectPolicy,
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
        policy.check(&uri, &next).await.map_err(Failed::Fatal)?;
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
    match open_part(part, true) {
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
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A hand-written HTTP server on 127.0.0.1: `reply` answers each
    /// request (its head as text) on its connection. Returns the base URL
    /// and the count of requests.
    async fn serve<F, Fut>(reply: F) -> (String, Arc<AtomicUsize>)
    where
        F: Fn(String, TcpStream) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let (reply, counted) = (Arc::new(reply), count.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (reply, counted) = (reply.clone(), counted.clone());
                tokio::spawn(async move {
                    let head = read_head(&mut stream).await;
                    counted.fetch_add(1, Ordering::SeqCst);
                    reply(head, stream).await;
                });
            }
        });
        (base, count)
    }

    async fn read_head<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte).await {
                Ok(1) => head.push(byte[0]),
                _ => break,
            }
        }
        String::from_utf8_lossy(&head).into_owned()
    }

    /// The first byte asked for (`Range: bytes=N-`), 0 without one.
    fn range_start(head: &str) -> u64 {
        head.lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("range: bytes=")
                    .map(str::to_owned)
            })
            .and_then(|r| r.trim_end_matches('-').parse().ok())
            .unwrap_or(0)
    }

    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "fetch-{tag}-{}-{}",
                std::process::id(),
                rand_suffix()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn rand_suffix() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    }

    fn options(url: &str, dest: &Path) -> FetchOptions {
        FetchOptions {
            source: Source::Url(url.to_owned()),
            dest: dest.to_owned(),
            file_name: None,
            sha256: hex::encode(Sha256::digest(b"weights")),
            retries: 3,
            backoff: Duration::from_millis(1),
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(5),
            ca_file: None,
            expected_size: None,
            deadline: Duration::from_secs(60),
            redirect_hosts: Vec::new(),
        }
    }

    /// The fetch, which must end (with an error) well within `limit`.
    async fn fetch_within(opts: &FetchOptions, limit: Duration) -> anyhow::Result<PathBuf> {
        tokio::time::timeout(limit, fetch(opts))
            .await
            .expect("the fetch ends instead of going on")
    }

    #[tokio::test]
    async fn a_planted_part_symlink_is_not_written_through() {
        let (base, asked) = serve(|_, mut s: TcpStream| async move {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nweights")
                .await;
        })
        .await;
        let dest = Dir::new("link");
        let outside = Dir::new("outside");
        let victim = outside.0.join("victim");
        std::fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, dest.0.join("m.gguf.part")).unwrap();
        let e = fetch_within(
            &options(&format!("{base}/m.gguf"), &dest.0),
            Duration::from_secs(10),
        )
        .await
        .unwrap_err();
        assert!(format!("{e:#}").contains("symbolic link"), "{e:#}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(
            asked.load(Ordering::SeqCst),
            0,
            "refused before any request"
        );
        // The same link made between the check and the open fails the open.
        let e = open_part(&dest.0.join("m.gguf.part"), true).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    #[tokio::test]
    async fn a_reply_longer_than_it_declared_is_cut_off() {
        const TOTAL: u64 = 1 << 20;
        // A 206 declaring a 1 MiB file, close-delimited, that never stops.
        let (base, _) = serve(|head, mut s: TcpStream| async move {
            let start = range_start(&head);
            let reply = format!(
                "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {start}-{}/{TOTAL}\r\nconnection: close\r\n\r\n",
                TOTAL - 1
            );
            if s.write_all(reply.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 64 << 10];
            while s.write_all(&chunk).await.is_ok() {}
        })
        .await;
        let dest = Dir::new("long");
        std::fs::write(dest.0.join("m.gguf.part"), vec![b'x'; 100]).unwrap();
        let e = fetch_within(
            &options(&format!("{base}/m.gguf"), &dest.0),
            Duration::from_secs(20),
        )
        .await
        .unwrap_err();
        assert!(format!("{e:#}").contains("sent more than"), "{e:#}");
        let len = file_len(&dest.0.join("m.gguf.part"));
        assert_eq!(len, TOTAL, "the part file stops at the declared size");

        // `--size` bounds it too, below what the server declares.
        let mut opts = options(&format!("{base}/m.gguf"), &dest.0);
        opts.expected_size = Some(1000);
        std::fs::remove_file(dest.0.join("m.gguf.part")).unwrap();
        let e = fetch_within(&opts, Duration::from_secs(20))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("--size says 1000"), "{e:#}");
    }

    #[tokio::test]
    async fn a_server_sending_one_byte_per_attempt_runs_out_of_retries() {
        const TOTAL: u64 = 1 << 20;
        let (base, asked) = serve(|head, mut s: TcpStream| async move {
            let start = range_start(&head);
            let reply = format!(
                "HTTP/1.1 206 Partial Content\r\ncontent-range: bytes {start}-{}/{TOTAL}\r\ncontent-length: {}\r\n\r\nx",
                TOTAL - 1,
                TOTAL - start
            );
            let _ = s.write_all(reply.as_bytes()).await;
            // ...and closes: one byte of progress per attempt.
        })
        .await;
        let dest = Dir::new("drip");
        let e = fetch_within(
            &options(&format!("{base}/m.gguf"), &dest.0),
            Duration::from_secs(20),
        )
        .await
        .unwrap_err();
        assert!(format!("{e:#}").contains("without progress"), "{e:#}");
        assert_eq!(asked.load(Ordering::SeqCst), 4, "retries + 1 attempts");

        // The deadline ends a fetch whatever its progress.
        let mut opts = options(&format!("{base}/m.gguf"), &dest.0);
        opts.retries = u32::MAX;
        opts.deadline = Duration::from_millis(300);
        let e = fetch_within(&opts, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("deadline"), "{e:#}");
    }

    #[tokio::test]
    async fn a_redirect_to_the_metadata_service_is_refused() {
        let (base, _) = serve(|_, mut s: TcpStream| async move {
            let _ = s
                .write_all(b"HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest/meta-data/\r\ncontent-length: 0\r\n\r\n")
                .await;
        })
        .await;
        let dest = Dir::new("imds");
        let mut opts = options(&format!("{base}/m.gguf"), &dest.0);
        // Allowed by name, still refused by its address range.
        opts.redirect_hosts = vec!["169.254.169.254".into()];
        let e = fetch_within(&opts, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("link-local"), "{e:#}");
    }

    #[tokio::test]
    async fn a_redirect_from_https_to_http_is_refused() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = harness::certs::TestCa::new("fetch").unwrap();
        let server = ca.server("origin", &["127.0.0.1"]).unwrap();
        let (plain, served) = serve(|_, mut s: TcpStream| async move {
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nweights")
                .await;
        })
        .await;
        let config = crate::tls::server_config(&crate::tls::TlsFiles {
            cert: &server.cert_file,
            key: &server.key_file,
            client_ca: None,
        })
        .unwrap();
        // HTTP/1.1, which is what the fetch speaks (gRPC's config says h2).
        let mut config = (*config).clone();
        config.alpn_protocols.clear();
        let key = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("https://{}", listener.local_addr().unwrap());
        let location = format!("{plain}/m.gguf");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (key, location) = (key.clone(), location.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = key.accept(stream).await else {
                        return;
                    };
                    read_head(&mut tls).await;
                    let reply = format!(
                        "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
                    );
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        let dest = Dir::new("downgrade");
        let mut opts = options(&format!("{origin}/m.gguf"), &dest.0);
        opts.ca_file = Some(ca.ca_file().to_owned());
        let e = fetch_within(&opts, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("https to http"), "{e:#}");
        assert_eq!(served.load(Ordering::SeqCst), 0);
    }

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
