//! A loopback HTTP/1.1 file server standing in for an HTTPS origin, an
//! S3-compatible bucket or the Hugging Face Hub in the weights fetcher's
//! tests: it serves one file at every path (with `Range`), records each
//! request's head, can cut the next response mid-body, answer 404 under
//! `/missing`, or redirect every request elsewhere (a Hub's CDN).

use anyhow::Result;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request's head as it arrived.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Header names lowercased, in arrival order.
    pub headers: Vec<(String, String)>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    pub fn query(&self) -> &str {
        self.target.split_once('?').map_or("", |(_, q)| q)
    }
}

struct State {
    file: PathBuf,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Body bytes after which the next GET's connection is closed (0: none).
    cut_next_after: AtomicU64,
    redirect_to: Mutex<Option<String>>,
}

/// A running server; stops when dropped.
pub struct FileServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Serves `file` on a free loopback port.
    pub async fn start(file: PathBuf) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            file,
            requests: Mutex::new(Vec::new()),
            cut_next_after: AtomicU64::new(0),
            redirect_to: Mutex::new(None),
        });
        let serving = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&serving);
                tokio::spawn(async move {
                    let _ = serve(stream, &state).await;
                });
            }
        });
        Ok(Self { addr, state, task })
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next GET sends its full `Content-Length` but closes the
    /// connection after `bytes` bytes of body.
    pub fn cut_next_after(&self, bytes: u64) {
        self.state.cut_next_after.store(bytes, Ordering::SeqCst);
    }

    /// Every request is answered with a 302 to `url` + its own path.
    pub fn redirect_to(&self, url: &str) {
        *lock(&self.state.redirect_to) = Some(url.to_owned());
    }

    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).clone()
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Answers one request and closes the connection.
async fn serve(mut stream: TcpStream, state: &State) -> Result<()> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await? == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut lines = text.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let request = RecordedRequest {
        method: first.next().unwrap_or("").to_owned(),
        target: first.next().unwrap_or("").to_owned(),
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect(),
    };
    lock(&state.requests).push(request.clone());

    let redirect = lock(&state.redirect_to).clone();
    if let Some(to) = redirect {
        let reply = format!(
            "HTTP/1.1 302 Found\r\nlocation: {to}{}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            request.target
        );
        stream.write_all(reply.as_bytes()).await?;
        return Ok(());
    }
    if request.path().starts_with("/missing") {
        stream
            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await?;
        return Ok(());
    }
    let mut file = tokio::fs::File::open(&state.file).await?;
    let len = file.metadata().await?.len();
    let start = request
        .header("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<u64>().ok());
    let (status, start) = match start {
        Some(s) if s >= len => {
            let reply = format!(
                "HTTP/1.1 416 Range Not Satisfiable\r\ncontent-range: bytes */{len}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            stream.write_all(reply.as_bytes()).await?;
            return Ok(());
        }
        Some(s) => (
            format!(
                "206 Partial Content\r\ncontent-range: bytes {s}-{}/{len}",
                len - 1
            ),
            s,
        ),
        None => ("200 OK".to_owned(), 0),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/octet-stream\r\naccept-ranges: bytes\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        len - start
    );
    stream.write_all(reply.as_bytes()).await?;
    let cut = state.cut_next_after.swap(0, Ordering::SeqCst);
    let mut remaining = if cut > 0 {
        cut.min(len - start)
    } else {
        len - start
    };
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let mut buf = vec![0u8; 256 * 1024];
    while remaining > 0 {
        let want = buf
            .len()
            .min(usize::try_from(remaining).unwrap_or(usize::MAX));
        let n = file.read(&mut buf[..want]).await?;
        if n == 0 {
            break;
        }
        stream.write_all(&buf[..n]).await?;
        remaining -= n as u64;
    }
    stream.flush().await?;
    // A cut: the connection closes with the body short of its length.
    Ok(())
}
