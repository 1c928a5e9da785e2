//! A lean pipelined Redis connection for scripts on the hot path (the
//! limiter's admission and settlement).
//!
//! Every admitted request costs one admission and one settlement round
//! trip, so their CPU is the gateway's per-request cost of limits. Through
//! the redis crate's multiplexed connection each one built a generic
//! `Cmd`, went through the connection manager's timeout and parsed a
//! generic `Value` with a parser-combinator: about half of the limiter's
//! CPU. Here a command is encoded once, straight into bytes ([`RespCommand`]); one
//! task owns the socket, writes whatever callers have queued in one write
//! and answers them in order from a minimal RESP2 reader ([`Reply`]).
//! Everything else (keys, the Responses store, the operator CLI) keeps using
//! the redis crate's connection ([`super::RedisConn`]); its URL parsing decides where this connection goes.
//!
//! Failure model: a connection that fails (connect, write, read, or a reply
//! that takes longer than [`RESPONSE_TIMEOUT`]) fails every call waiting on
//! it and ends; the next call opens a new one. Scripts are loaded on every
//! new connection, and a `NOSCRIPT` reply (Redis flushed its scripts) loads
//! them again and retries once.

use super::conn::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use bytes::{Buf, BytesMut};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// A reply, as far as the scripts need one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integers of an array reply (`None` if it is anything else).
    pub fn ints(&self) -> Option<Vec<i64>> {
        match self {
            Reply::Array(Some(items)) => items
                .iter()
                .map(|i| match i {
                    Reply::Int(n) => Some(*n),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    }
}

/// One argument of a command.
#[derive(Debug, Clone, Copy)]
pub enum Arg<'a> {
    Str(&'a str),
    Int(i64),
    UInt(u64),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(s: &'a str) -> Self {
        Arg::Str(s)
    }
}

impl From<i64> for Arg<'_> {
    fn from(n: i64) -> Self {
        Arg::Int(n)
    }
}

impl From<u64> for Arg<'_> {
    fn from(n: u64) -> Self {
        Arg::UInt(n)
    }
}

impl From<u32> for Arg<'_> {
    fn from(n: u32) -> Self {
        Arg::UInt(n.into())
    }
}

/// One command encoded as RESP. The array length comes from the
/// arguments given, so it cannot disagree with them.
pub struct RespCommand {
    bytes: Vec<u8>,
}

impl RespCommand {
    /// A command: its name and arguments.
    pub fn command(args: &[Arg<'_>]) -> Self {
        let mut f = Self::with_len(args.len());
        for arg in args {
            f.push(*arg);
        }
        f
    }

    /// `EVALSHA` of a script with its keys and arguments.
    pub fn evalsha(script: &Script, keys: &[&str], args: &[Arg<'_>]) -> Self {
        let mut f = Self::with_len(3 + keys.len() + args.len());
        f.push(Arg::Str("EVALSHA"));
        f.push(Arg::Str(&script.sha));
        f.push(Arg::UInt(keys.len() as u64));
        for k in keys {
            f.push(Arg::Str(k));
        }
        for arg in args {
            f.push(*arg);
        }
        f
    }

    /// `SCRIPT LOAD` of a script's source.
    fn script_load(source: &str) -> Self {
        Self::command(&["SCRIPT".into(), "LOAD".into(), source.into()])
    }

    fn with_len(len: usize) -> Self {
        let mut bytes = Vec::with_capacity(64 + 24 * len);
        bytes.push(b'*');
        bytes.extend_from_slice(itoa::Buffer::new().format(len).as_bytes());
        bytes.extend_from_slice(b"\r\n");
        Self { bytes }
    }

    fn push(&mut self, arg: Arg<'_>) {
        let mut num = itoa::Buffer::new();
        let data = match arg {
            Arg::Str(s) => s.as_bytes(),
            Arg::Int(n) => num.format(n).as_bytes(),
            Arg::UInt(n) => num.format(n).as_bytes(),
        };
        self.bytes.push(b'$');
        self.bytes
            .extend_from_slice(itoa::Buffer::new().format(data.len()).as_bytes());
        self.bytes.extend_from_slice(b"\r\n");
        self.bytes.extend_from_slice(data);
        self.bytes.extend_from_slice(b"\r\n");
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// A Lua script the connection keeps loaded.
pub struct Script {
    pub source: &'static str,
    pub sha: String,
}

impl Script {
    pub fn new(source: &'static str) -> Self {
        Self {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PipeError {
    #[error("redis connection: {0}")]
    Connection(String),
    #[error("redis error reply: {0}")]
    Server(String),
}

struct Job {
    frame: Vec<u8>,
    /// Replies to drop before the one answered (1 after an `ASKING`).
    skip: u8,
    reply: oneshot::Sender<Result<Reply, PipeError>>,
}

/// A reply owed: when its command was written, replies to drop first, and
/// who waits for it.
type Owed = (Instant, u8, oneshot::Sender<Result<Reply, PipeError>>);

/// The connection: lazily opened, reopened after a failure.
pub struct RedisPipe {
    info: redis::ConnectionInfo,
    /// For a `rediss://` address.
    tls: Option<Arc<rustls::ClientConfig>>,
    scripts: Vec<&'static str>,
    /// The running connection's queue; closed once its task has ended.
    queue: Mutex<Option<mpsc::UnboundedSender<Job>>>,
}

impl RedisPipe {
    /// A connection to where `client` points (over TLS with `tls` for a
    /// `rediss://` address), keeping `scripts` loaded.
    pub fn new(
        client: &redis::Client,
        tls: Option<Arc<rustls::ClientConfig>>,
        scripts: &[&Script],
    ) -> Self {
        Self::to(
            client.get_connection_info().clone(),
            tls,
            scripts.iter().map(|s| s.source).collect(),
        )
    }

    /// A connection to `info`, keeping the scripts of these sources loaded.
    pub fn to(
        info: redis::ConnectionInfo,
        tls: Option<Arc<rustls::ClientConfig>>,
        scripts: Vec<&'static str>,
    ) -> Self {
        Self {
            info,
            tls,
            scripts,
            queue: Mutex::new(None),
        }
    }

    /// Sends the command `encode` builds and waits for its reply. An error
    /// reply is `Err(PipeError::Server)`; `NOSCRIPT` reloads the scripts
    /// and retries once (encoding the command again: cheaper than keeping
    /// a copy of every frame for a rare retry).
    pub async fn call(&self, encode: impl Fn() -> RespCommand) -> Result<Reply, PipeError> {
        self.call_with(encode, false).await
    }

    /// [`Self::call`] preceded by `ASKING` (in the same write): the command
    /// of a slot being migrated to this node (Redis Cluster's `ASK`).
    pub async fn call_asking(&self, encode: impl Fn() -> RespCommand) -> Result<Reply, PipeError> {
        self.call_with(encode, true).await
    }

    async fn call_with(
        &self,
        encode: impl Fn() -> RespCommand,
        asking: bool,
    ) -> Result<Reply, PipeError> {
        let job = || {
            let frame = encode().into_bytes();
            if asking {
                let mut bytes = RespCommand::command(&["ASKING".into()]).into_bytes();
                bytes.extend_from_slice(&frame);
                (bytes, 1)
            } else {
                (frame, 0)
            }
        };
        match self.send(job()).await? {
            Reply::Error(e) if e.starts_with("NOSCRIPT") => {
                for source in &self.scripts {
                    let load = RespCommand::script_load(source);
                    if let Reply::Error(e) = self.send((load.into_bytes(), 0)).await? {
                        return Err(PipeError::Server(e));
                    }
                }
                match self.send(job()).await? {
                    Reply::Error(e) => Err(PipeError::Server(e)),
                    r => Ok(r),
                }
            }
            Reply::Error(e) => Err(PipeError::Server(e)),
            r => Ok(r),
        }
    }

    async fn send(&self, (frame, skip): (Vec<u8>, u8)) -> Result<Reply, PipeError> {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            frame,
            skip,
            reply: tx,
        };
        self.sender().send(job).map_err(|_| {
            PipeError::Connection("the connection ended before the command was sent".into())
        })?;
        rx.await
            .map_err(|_| PipeError::Connection("the connection ended".into()))?
    }

    fn sender(&self) -> mpsc::UnboundedSender<Job> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = queue.as_ref().filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(
            self.info.clone(),
            self.tls.clone(),
            self.scripts.clone(),
            rx,
        ));
        *queue = Some(tx.clone());
        tx
    }
}

/// One connection's life: connect and prepare it, then pipeline until it
/// fails; every waiting call learns why.
async fn run(
    info: redis::ConnectionInfo,
    tls: Option<Arc<rustls::ClientConfig>>,
    scripts: Vec<&'static str>,
    mut rx: mpsc::UnboundedReceiver<Job>,
) {
    let connecting = connect(&info, tls, &scripts);
    let failure = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(conn)) => pipeline(conn, &mut rx).await,
        Ok(Err(e)) => e,
        Err(_) => PipeError::Connection("connect timed out".into()),
    };
    tracing::debug!("limiter redis connection ended: {failure}");
    rx.close();
    while let Ok(job) = rx.try_recv() {
        let _ = job
            .reply
            .send(Err(PipeError::Connection(failure.to_string())));
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

struct Conn {
    io: Box<dyn Stream>,
    read: BytesMut,
}

/// Opens the socket, authenticates, selects the database and loads the
/// scripts, in one round trip after the connect.
async fn connect(
    info: &redis::ConnectionInfo,
    tls: Option<Arc<rustls::ClientConfig>>,
    scripts: &[&str],
) -> Result<Conn, PipeError> {
    let io_err = |e: std::io::Error| PipeError::Connection(e.to_string());
    let tcp = |host: String, port: u16| async move {
        let s = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(io_err)?;
        s.set_nodelay(true).map_err(io_err)?;
        Ok::<_, PipeError>(s)
    };
    let io: Box<dyn Stream> = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => Box::new(tcp(host.clone(), *port).await?),
        redis::ConnectionAddr::TcpTls { host, port, .. } => {
            let Some(tls) = tls else {
                return Err(PipeError::Connection(
                    "a rediss:// address without a TLS configuration".into(),
                ));
            };
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| PipeError::Connection(format!("TLS server name {host}: {e}")))?;
            let s = tcp(host.clone(), *port).await?;
            let s = tokio_rustls::TlsConnector::from(tls)
                .connect(name, s)
                .await
                .map_err(io_err)?;
            Box::new(s)
        }
        #[cfg(unix)]
        redis::ConnectionAddr::Unix(path) => Box::new(
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(io_err)?,
        ),
        other => {
            return Err(PipeError::Connection(format!(
                "unsupported redis address for the limiter: {other}"
            )))
        }
    };
    let mut conn = Conn {
        io,
        read: BytesMut::with_capacity(4096),
    };
    let settings = info.redis_settings();
    let mut hello = Vec::new();
    if let Some(password) = settings.password() {
        let f = match settings.username() {
            Some(user) => RespCommand::command(&["AUTH".into(), user.into(), password.into()]),
            None => RespCommand::command(&["AUTH".into(), password.into()]),
        };
        hello.push(f.into_bytes());
    }
    if settings.db() != 0 {
        hello.push(RespCommand::command(&["SELECT".into(), settings.db().into()]).into_bytes());
    }
    for source in scripts {
        hello.push(RespCommand::script_load(source).into_bytes());
    }
    conn.io.write_all(&hello.concat()).await.map_err(io_err)?;
    // A TLS stream may hold the last record until flushed (a no-op on TCP).
    conn.io.flush().await.map_err(io_err)?;
    for _ in 0..hello.len() {
        if let Reply::Error(e) = conn.next_reply().await? {
            return Err(PipeError::Server(e));
        }
    }
    Ok(conn)
}

impl Conn {
    async fn next_reply(&mut self) -> Result<Reply, PipeError> {
        loop {
            if let Some(reply) = parse(&mut self.read)? {
                return Ok(reply);
            }
            self.fill().await?;
        }
    }

    async fn fill(&mut self) -> Result<(), PipeError> {
        let n = self
            .io
            .read_buf(&mut self.read)
            .await
            .map_err(|e| PipeError::Connection(e.to_string()))?;
        if n == 0 {
            return Err(PipeError::Connection("closed by redis".into()));
        }
        Ok(())
    }
}

/// Writes queued commands in batches and answers them in order.
async fn pipeline(mut conn: Conn, rx: &mut mpsc::UnboundedReceiver<Job>) -> PipeError {
    let mut waiting: VecDeque<Owed> = VecDeque::new();
    let mut batch = Vec::with_capacity(64);
    let mut out = Vec::with_capacity(4096);
    // While replies are owed, one timer bounds how long the oldest waits.
    // It is re-armed only when it fires (or the queue was empty), not per
    // command: a timer registration per command costs more than the rest.
    let timer = tokio::time::sleep(RESPONSE_TIMEOUT);
    tokio::pin!(timer);
    let mut armed = false;
    let failure = loop {
        if !armed {
            if let Some((sent, _, _)) = waiting.front() {
                timer.as_mut().reset((*sent + RESPONSE_TIMEOUT).into());
                armed = true;
            }
        }
        if conn.read.capacity() - conn.read.len() < 1024 {
            conn.read.reserve(4096);
        }
        tokio::select! {
            biased;
            read = conn.io.read_buf(&mut conn.read) => {
                match read {
                    Ok(0) => break PipeError::Connection("closed by redis".into()),
                    Ok(_) => {}
                    Err(e) => break PipeError::Connection(e.to_string()),
                }
                loop {
                    match parse(&mut conn.read) {
                        Ok(Some(_)) if waiting.front().is_some_and(|(_, skip, _)| *skip > 0) => {
                            if let Some((_, skip, _)) = waiting.front_mut() {
                                *skip -= 1;
                            }
                        }
                        Ok(Some(reply)) => match waiting.pop_front() {
                            Some((_, _, tx)) => {
                                let _ = tx.send(Ok(reply));
                            }
                            None => {
                                return fail_all(waiting, PipeError::Connection(
                                    "reply to no command".into(),
                                ))
                            }
                        },
                        Ok(None) => break,
                        Err(e) => return fail_all(waiting, e),
                    }
                }
            }
            n = rx.recv_many(&mut batch, 256) => {
                if n == 0 {
                    break PipeError::Connection("pipe dropped".into());
                }
                let now = Instant::now();
                // A lone command is written from its own buffer; several
                // are gathered into one write.
                let lone = if batch.len() == 1 { batch.pop() } else { None };
                let written = match lone {
                    Some(job) => {
                        waiting.push_back((now, job.skip, job.reply));
                        conn.io.write_all(&job.frame).await
                    }
                    None => {
                        for job in batch.drain(..) {
                            out.extend_from_slice(&job.frame);
                            waiting.push_back((now, job.skip, job.reply));
                        }
                        let written = conn.io.write_all(&out).await;
                        out.clear();
                        written
                    }
                };
                let flushed = match written {
                    Ok(()) => conn.io.flush().await,
                    Err(e) => Err(e),
                };
                if let Err(e) = flushed {
                    break PipeError::Connection(e.to_string());
                }
            }
            _ = &mut timer, if armed => {
                armed = false;
                if waiting.front().is_some_and(|(sent, _, _)| sent.elapsed() >= RESPONSE_TIMEOUT) {
                    break PipeError::Connection("reply timed out".into());
                }
            }
        }
    };
    fail_all(waiting, failure)
}

fn fail_all(waiting: VecDeque<Owed>, failure: PipeError) -> PipeError {
    for (_, _, tx) in waiting {
        let _ = tx.send(Err(PipeError::Connection(failure.to_string())));
    }
    failure
}

/// Takes one complete reply off the front of `buf`, or `None` until more
/// bytes arrive.
fn parse(buf: &mut BytesMut) -> Result<Option<Reply>, PipeError> {
    let mut pos = 0;
    match parse_at(buf, &mut pos)? {
        Some(reply) => {
            buf.advance(pos);
            Ok(Some(reply))
        }
        None => Ok(None),
    }
}

fn parse_at(buf: &[u8], pos: &mut usize) -> Result<Option<Reply>, PipeError> {
    let Some(line) = line_at(buf, *pos) else {
        return Ok(None);
    };
    let (kind, body) = (buf[*pos], &buf[*pos + 1..line]);
    let next = line + 2;
    let text = || String::from_utf8_lossy(body).into_owned();
    let int = || {
        parse_int(body)
            .ok_or_else(|| PipeError::Connection(format!("bad RESP integer {:?}", text())))
    };
    let reply = match kind {
        b'+' => Reply::Status(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Int(int()?),
        b'$' => {
            let len = int()?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let end = next + len as usize;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                *pos = end + 2;
                return Ok(Some(Reply::Bulk(Some(buf[next..end].to_vec()))));
            }
        }
        b'*' => {
            let len = int()?;
            if len < 0 {
                Reply::Array(None)
            } else {
                *pos = next;
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    match parse_at(buf, pos)? {
                        Some(item) => items.push(item),
                        None => return Ok(None),
                    }
                }
                return Ok(Some(Reply::Array(Some(items))));
            }
        }
        other => {
            return Err(PipeError::Connection(format!(
                "unexpected RESP type byte {other:#x}"
            )))
        }
    };
    *pos = next;
    Ok(Some(reply))
}

/// A RESP integer: optional `-`, then decimal digits.
fn parse_int(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() {
        return None;
    }
    let mut n: i64 = 0;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(i64::from(d - b'0'))?;
    }
    Some(if negative { -n } else { n })
}

/// Index of the `\r` ending the line that starts at `from`.
fn line_at(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    let i = rest.iter().position(|b| *b == b'\r')?;
    (rest.get(i + 1) == Some(&b'\n') && i > 0).then_some(from + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(bytes: &[u8]) -> Vec<Reply> {
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(r) = parse(&mut buf).unwrap() {
            out.push(r);
        }
        assert!(buf.is_empty(), "left over: {buf:?}");
        out
    }

    #[test]
    fn frames_are_resp_arrays_of_bulk_strings() {
        let f = RespCommand::command(&["SET".into(), "k".into(), (-42i64).into()]);
        assert_eq!(
            &f.into_bytes()[..],
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n-42\r\n"
        );
        let script = Script::new("return 1");
        let f = RespCommand::evalsha(&script, &["a", "b"], &[7u32.into()]);
        let text = String::from_utf8(f.into_bytes().to_vec()).unwrap();
        assert!(text.starts_with("*6\r\n$7\r\nEVALSHA\r\n$40\r\n"), "{text}");
        assert!(text.ends_with("$1\r\n2\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\n7\r\n"));
    }

    #[test]
    fn replies_parse_whole_and_wait_for_the_rest() {
        assert_eq!(
            parse_all(b"+OK\r\n-ERR no\r\n:12\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n*1\r\n:-2\r\n"),
            vec![
                Reply::Status("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Int(12),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None),
                Reply::Array(Some(vec![
                    Reply::Int(1),
                    Reply::Array(Some(vec![Reply::Int(-2)]))
                ])),
            ]
        );
        // Split anywhere, a reply is returned only once complete.
        let whole = b"*3\r\n:0\r\n$2\r\nhi\r\n:5\r\n";
        for cut in 1..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(parse(&mut buf).unwrap(), None, "cut at {cut}");
            assert_eq!(buf.len(), cut, "nothing consumed");
            buf.extend_from_slice(&whole[cut..]);
            let r = parse(&mut buf).unwrap().unwrap();
            assert_eq!(r.ints(), None);
            assert!(buf.is_empty());
        }
        assert!(parse(&mut BytesMut::from(&b"?x\r\n"[..])).is_err());
    }

    #[tokio::test]
    async fn concurrent_calls_share_the_connection_and_come_back_in_order() {
        let redis = super::super::testing::test_redis();
        let script = Script::new("return {tonumber(ARGV[1]), 2, 3}");
        let super::super::Target::Single(info) = redis.target() else {
            panic!("the test Redis is one server")
        };
        let pipe = RedisPipe::to(info.clone(), None, vec![script.source]);
        let script = &script;
        let call = |n: u32| pipe.call(move || RespCommand::evalsha(script, &[], &[n.into()]));
        let replies = futures::future::join_all((0..100).map(call)).await;
        for (n, r) in replies.into_iter().enumerate() {
            assert_eq!(r.unwrap().ints(), Some(vec![n as i64, 2, 3]));
        }
        // An error reply is an error; the connection goes on.
        let bad = || RespCommand::command(&["NOSUCHCOMMAND".into(), "x".into()]);
        assert!(matches!(pipe.call(bad).await, Err(PipeError::Server(_))));
        assert_eq!(call(1).await.unwrap().ints(), Some(vec![1, 2, 3]));
    }

    /// A one-connection server that answers each command it reads with the
    /// next canned reply and reports the commands' names.
    async fn fake_redis(
        replies: &'static [&'static [u8]],
    ) -> (std::net::SocketAddr, tokio::task::JoinHandle<Vec<String>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = BytesMut::new();
            let mut seen = Vec::new();
            for reply in replies {
                let command = loop {
                    if let Some(c) = parse(&mut buf).unwrap() {
                        break c;
                    }
                    if s.read_buf(&mut buf).await.unwrap() == 0 {
                        return seen;
                    }
                };
                let Reply::Array(Some(args)) = command else {
                    panic!("not a command: {command:?}")
                };
                let words: Vec<String> = args
                    .iter()
                    .take(2)
                    .map(|a| match a {
                        Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
                        other => panic!("not a bulk string: {other:?}"),
                    })
                    .collect();
                seen.push(if words[0] == "SCRIPT" {
                    words.join(" ")
                } else {
                    words[0].clone()
                });
                s.write_all(reply).await.unwrap();
            }
            seen
        });
        (addr, server)
    }

    #[tokio::test]
    async fn a_redis_that_forgot_its_scripts_gets_them_again_and_the_call_succeeds() {
        let (addr, server) = fake_redis(&[
            b"$40\r\n0000000000000000000000000000000000000000\r\n",
            b"-NOSCRIPT No matching script.\r\n",
            b"$40\r\n0000000000000000000000000000000000000000\r\n",
            b"*2\r\n:7\r\n:8\r\n",
        ])
        .await;
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let script = Script::new("return {7, 8}");
        let pipe = RedisPipe::new(&client, None, &[&script]);
        let reply = pipe
            .call(|| RespCommand::evalsha(&script, &[], &[]))
            .await
            .unwrap();
        assert_eq!(reply.ints(), Some(vec![7, 8]));
        drop(pipe);
        assert_eq!(
            server.await.unwrap(),
            ["SCRIPT LOAD", "EVALSHA", "SCRIPT LOAD", "EVALSHA"]
        );
    }

    #[tokio::test]
    async fn an_asking_call_sends_asking_first_and_answers_with_the_command_reply() {
        let (addr, server) = fake_redis(&[
            b"$40\r\n0000000000000000000000000000000000000000\r\n",
            b"+OK\r\n",
            b"*2\r\n:7\r\n:8\r\n",
            b"+PONG\r\n",
        ])
        .await;
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let script = Script::new("return {7, 8}");
        let pipe = RedisPipe::new(&client, None, &[&script]);
        let reply = pipe
            .call_asking(|| RespCommand::evalsha(&script, &[], &[]))
            .await
            .unwrap();
        assert_eq!(reply.ints(), Some(vec![7, 8]));
        // The skipped ASKING reply does not shift the next call's.
        let pong = pipe.call(|| RespCommand::command(&["PING".into()])).await;
        assert_eq!(pong.unwrap(), Reply::Status("PONG".into()));
        drop(pipe);
        assert_eq!(
            server.await.unwrap(),
            ["SCRIPT LOAD", "ASKING", "EVALSHA", "PING"]
        );
    }

    #[tokio::test]
    async fn a_silent_redis_fails_the_calls_waiting_on_it_within_the_timeout() {
        // Answers the connect-time script load, then never again, with the
        // connection held open.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = BytesMut::new();
            while parse(&mut buf).unwrap().is_none() {
                s.read_buf(&mut buf).await.unwrap();
            }
            s.write_all(b"$1\r\nx\r\n").await.unwrap();
            tokio::time::sleep(RESPONSE_TIMEOUT * 10).await;
        });
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let script = Script::new("return 1");
        let pipe = RedisPipe::new(&client, None, &[&script]);
        let started = Instant::now();
        let r = pipe.call(|| RespCommand::evalsha(&script, &[], &[])).await;
        assert!(matches!(r, Err(PipeError::Connection(_))), "{r:?}");
        let waited = started.elapsed();
        assert!(
            waited >= RESPONSE_TIMEOUT && waited < RESPONSE_TIMEOUT * 3,
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_redis_fails_fast_and_a_later_call_reconnects() {
        // A port nothing listens on.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let client = redis::Client::open(format!("redis://{addr}")).unwrap();
        let pipe = RedisPipe::new(&client, None, &[]);
        let started = Instant::now();
        let r = pipe.call(|| RespCommand::command(&["PING".into()])).await;
        assert!(matches!(r, Err(PipeError::Connection(_))), "{r:?}");
        assert!(started.elapsed() < CONNECT_TIMEOUT * 2);
        // Something listens now: the next call opens a new connection.
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"+PONG\r\n").await.unwrap();
            s
        });
        let r = pipe.call(|| RespCommand::command(&["PING".into()])).await;
        assert_eq!(r.unwrap(), Reply::Status("PONG".into()));
        drop(server.await);
    }
}
