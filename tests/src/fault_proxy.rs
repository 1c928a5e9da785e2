//! A TCP fault proxy for chaos tests: put it between the gateway and Redis,
//! or between the gateway and a worker, and change how the link behaves
//! while traffic flows.
//!
//! Faults, each settable at run time and healed with [`FaultProxy::heal`]:
//! - [`latency`](FaultProxy::set_latency): every chunk is delivered this
//!   much later (a delay line: throughput is kept, only time shifts);
//! - [`bandwidth`](FaultProxy::set_bandwidth): bytes per second, per
//!   direction and connection;
//! - [`stall`](FaultProxy::stall): accept bytes, deliver none, for a while;
//!   then deliver what was held, in order (a stalled peer or a congested
//!   link);
//! - [`partition`](FaultProxy::partition): deliver nothing until healed,
//!   then reset the connections that lived through it (a peer that vanished
//!   without FIN or RST: the half-open case);
//! - [`drop_connections`](FaultProxy::drop_connections): reset every open
//!   connection now;
//! - [`refuse`](FaultProxy::refuse): reset new connections as they arrive.
//!
//! The proxy runs on a runtime of its own, so it keeps working whatever the
//! test's runtime does; it stops when dropped.

use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How the link behaves now.
#[derive(Debug, Clone, Default, PartialEq)]
struct Faults {
    latency: Duration,
    /// Bytes per second; 0 is unlimited.
    bandwidth: u64,
    /// Nothing is delivered before this instant.
    stalled_until: Option<Instant>,
    /// Nothing is delivered until healed; survivors are reset then.
    partitioned: bool,
    refuse: bool,
    /// Bumped to reset every open connection.
    epoch: u64,
}

/// A running proxy; dropping it stops it and closes its connections.
pub struct FaultProxy {
    addr: SocketAddr,
    faults: Arc<watch::Sender<Faults>>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy> {
        Self::start_at(std::net::Ipv4Addr::LOCALHOST.into(), upstream)
    }

    /// Listens on a free port of `ip` (a lab's bridge, which its hosts
    /// reach) and forwards to `upstream`.
    pub fn start_at(ip: std::net::IpAddr, upstream: SocketAddr) -> Result<FaultProxy> {
        let std_listener = std::net::TcpListener::bind(SocketAddr::new(ip, 0))
            .context("binding the fault proxy")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (faults, faults_rx) = watch::channel(Faults::default());
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("fault proxy runtime")?;
        std::thread::Builder::new()
            .name(format!("fault-proxy-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            eprintln!("fault proxy: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        _ = accept_loop(listener, upstream, faults_rx) => {}
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime here aborts every connection task.
            })?;
        Ok(FaultProxy {
            addr,
            faults: Arc::new(faults),
            _shutdown: shutdown,
        })
    }

    /// The proxy's own address, to give the client instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://<addr>`, for a proxy in front of Redis.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn set_latency(&self, latency: Duration) {
        self.faults.send_modify(|f| f.latency = latency);
    }

    /// Caps each direction of each connection at `bytes_per_second`.
    pub fn set_bandwidth(&self, bytes_per_second: u64) {
        self.faults.send_modify(|f| f.bandwidth = bytes_per_second);
    }

    /// Holds every byte for `duration` from now, then delivers it.
    pub fn stall(&self, duration: Duration) {
        self.faults
            .send_modify(|f| f.stalled_until = Some(Instant::now() + duration));
    }

    /// Delivers nothing until [`heal`](Self::heal); the connections that
    /// lived through the partition are reset when it heals.
    pub fn partition(&self) {
        self.faults.send_modify(|f| f.partitioned = true);
    }

    /// Resets every open connection now.
    pub fn drop_connections(&self) {
        self.faults.send_modify(|f| f.epoch += 1);
    }

    /// Resets new connections as they arrive (or accepts them again).
    pub fn refuse(&self, refuse: bool) {
        self.faults.send_modify(|f| f.refuse = refuse);
    }

    /// Back to a clean link. A partition's survivors are reset.
    pub fn heal(&self) {
        heal(&self.faults);
    }

    /// [`heal`](Self::heal) as a function that outlives this borrow, for a
    /// fault that heals itself later.
    pub fn healer(&self) -> impl Fn() + Send + 'static {
        let faults = self.faults.clone();
        move || heal(&faults)
    }
}

fn heal(faults: &watch::Sender<Faults>) {
    faults.send_modify(|f| {
        let epoch = if f.partitioned { f.epoch + 1 } else { f.epoch };
        *f = Faults {
            epoch,
            ..Faults::default()
        };
    });
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, faults: watch::Receiver<Faults>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if faults.borrow().refuse {
            reset(client);
            continue;
        }
        let faults = faults.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(upstream).await else {
                reset(client);
                return;
            };
            connection(client, server, faults).await;
        });
    }
}

/// Closes with RST rather than FIN, as a refusing or vanished peer does.
fn reset(stream: TcpStream) {
    reset_on_close(&stream);
    drop(stream);
}

/// SO_LINGER 0: closing sends RST. (Deprecated in tokio because a non-zero
/// linger blocks the thread on drop; a zero one never waits.)
#[allow(deprecated)]
fn reset_on_close(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

async fn connection(client: TcpStream, server: TcpStream, mut faults: watch::Receiver<Faults>) {
    for s in [&client, &server] {
        let _ = s.set_nodelay(true);
        // A connection the proxy ends is reset, as a vanished peer's is.
        reset_on_close(s);
    }
    let epoch = faults.borrow().epoch;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, faults.clone());
    let down = pump(server_read, client_write, faults.clone());
    let reset_now = async {
        while faults.changed().await.is_ok() {
            if faults.borrow().epoch != epoch {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {}
        _ = reset_now => {}
    }
}

/// One direction: a reader feeding a delay line, a writer draining it under
/// the current faults.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    faults: watch::Receiver<Faults>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader_faults = faults.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let latency = reader_faults.borrow().latency;
                    if tx
                        .send((Instant::now() + latency, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            wait_until_deliverable(faults.clone()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
            let bandwidth = faults.borrow().bandwidth;
            if bandwidth > 0 {
                let secs = chunk.len() as f64 / bandwidth as f64;
                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
            }
        }
        // The reader saw EOF: pass the FIN on.
        let _ = to.shutdown().await;
    };
    // The writer finishes the queue after the reader stops, unless reset.
    let (_, _) = tokio::join!(reader, writer);
}

/// Waits while the link is stalled or partitioned.
async fn wait_until_deliverable(mut faults: watch::Receiver<Faults>) {
    loop {
        let (stalled_until, partitioned) = {
            let f = faults.borrow_and_update();
            (f.stalled_until, f.partitioned)
        };
        if partitioned {
            if faults.changed().await.is_err() {
                return;
            }
            continue;
        }
        match stalled_until {
            Some(until) if until > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = faults.changed() => {}
                }
            }
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream) -> Duration {
        let t = Instant::now();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        t.elapsed()
    }

    #[tokio::test]
    async fn latency_stall_partition_and_drop_behave() {
        let proxy = FaultProxy::start(echo().await).unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut s).await < Duration::from_millis(50));

        proxy.set_latency(Duration::from_millis(40));
        let rt = round_trip(&mut s).await;
        assert!(rt >= Duration::from_millis(80), "two delayed hops: {rt:?}");
        proxy.heal();

        proxy.stall(Duration::from_millis(300));
        let rt = round_trip(&mut s).await;
        assert!(
            rt >= Duration::from_millis(250),
            "held for the stall: {rt:?}"
        );

        proxy.partition();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        let held = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut buf)).await;
        assert!(held.is_err(), "nothing crosses a partition");
        proxy.heal();
        // The partition's survivor is reset when it heals.
        let after = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
        assert!(matches!(after, Ok(Ok(0)) | Ok(Err(_))), "{after:?}");

        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(round_trip(&mut fresh).await < Duration::from_millis(50));
        proxy.drop_connections();
        let gone = tokio::time::timeout(Duration::from_secs(2), fresh.read(&mut buf)).await;
        assert!(matches!(gone, Ok(Ok(0)) | Ok(Err(_))), "{gone:?}");

        // Refused: the reset may reach the client during the connect or on
        // its first read.
        proxy.refuse(true);
        if let Ok(mut refused) = TcpStream::connect(proxy.addr()).await {
            let r = tokio::time::timeout(Duration::from_secs(2), refused.read(&mut buf)).await;
            assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{r:?}");
        }
    }
}
