//! HTTP/1.1 at the byte level, for what a high-level client hides:
//! keep-alive on one socket, exact framing, malformed requests.

use anyhow::{bail, Context, Result};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One TCP connection to a listener.
#[derive(Debug)]
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
    pub timeout: Duration,
}

/// A response read off a [`RawConn`].
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    /// Header names in lower case, in order.
    pub headers: Vec<(String, String)>,
    /// The body with chunked framing removed.
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The bytes of a request: `method path`, `Host`, the bearer key if any, a
/// JSON body with its length if any.
pub fn request(method: &str, path: &str, key: Option<&str>, json_body: Option<&str>) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
    if let Some(k) = key {
        head.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    if let Some(b) = json_body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if let Some(b) = json_body {
        bytes.extend_from_slice(b.as_bytes());
    }
    bytes
}

impl RawConn {
    pub async fn connect(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::new(),
            timeout: Duration::from_secs(30),
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Reads more bytes; `false` when the peer closed.
    async fn fill(&mut self) -> Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = tokio::time::timeout(self.timeout, self.stream.read(&mut chunk))
            .await
            .context("timed out reading the response")??;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    async fn read_line(&mut self) -> Result<String> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.buf.drain(..i + 2).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            if !self.fill().await? {
                bail!("connection closed mid-line");
            }
        }
    }

    async fn read_exact_body(&mut self, n: usize) -> Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await? {
                bail!("connection closed mid-body");
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Reads one response (content-length, chunked, or until close).
    pub async fn read_response(&mut self) -> Result<RawResponse> {
        let status_line = self.read_line().await?;
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("bad status line {status_line:?}"))?;
        let mut headers = Vec::new();
        loop {
            let line = self.read_line().await?;
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let mut resp = RawResponse {
            status,
            headers,
            body: Vec::new(),
        };
        if status == 304 || status == 204 || (100..200).contains(&status) {
            return Ok(resp);
        }
        if resp
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            loop {
                let size_line = self.read_line().await?;
                let size =
                    usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                        .with_context(|| format!("bad chunk size {size_line:?}"))?;
                if size == 0 {
                    // Trailers, then the blank line.
                    while !self.read_line().await?.is_empty() {}
                    break;
                }
                let data = self.read_exact_body(size).await?;
                resp.body.extend_from_slice(&data);
                self.read_line().await?;
            }
        } else if let Some(len) = resp.header("content-length") {
            let len: usize = len.parse().context("content-length")?;
            resp.body = self.read_exact_body(len).await?;
        } else {
            while self.fill().await? {}
            resp.body = std::mem::take(&mut self.buf);
        }
        Ok(resp)
    }

    /// Whether the peer closes the connection within `wait`.
    pub async fn closed_within(&mut self, wait: Duration) -> bool {
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(wait, self.stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(_) => false,
        }
    }
}
