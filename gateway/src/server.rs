//! Assembles and runs the Pingora server: the public listener, the admin
//! listener, and a readiness announcer. `run` never returns.

use crate::app::App;
use crate::config::Config;
use crate::lifecycle::Shutdown;
use crate::listener::admin::AdminApp;
use crate::listener::public::PublicApp;
use crate::tls::listener::ReloadingCert;
use async_trait::async_trait;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora_core::services::background::{background_service, BackgroundService};
use pingora_core::services::listening::Service;
use std::sync::Arc;
use std::time::Duration;

pub fn run(config: Config) -> anyhow::Result<()> {
    let conf = ServerConf {
        threads: config.threads,
        // Pingora would sleep the whole grace period (300 s by default) after
        // SIGTERM. `DrainingSignal` waits for in-flight work itself, so
        // Pingora only needs a short tail to flush the last bytes.
        grace_period_seconds: Some(1),
        graceful_shutdown_timeout_seconds: Some(2),
        ..ServerConf::default()
    };
    let readiness_delay = Duration::from_millis(config.readiness_drain_millis);
    let grace = Duration::from_secs(config.grace_period_seconds);
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let listen = config.listen.clone();
    let admin_listen = config.admin_listen.clone();
    // A certificate that does not load stops the gateway here, before it
    // listens: never a plain-text fallback.
    let config_tls_timeout = config
        .tls
        .as_ref()
        .map(|t| Duration::from_secs(t.handshake_timeout_seconds.max(1)));
    let certificate = match &config.tls {
        Some(tls) => Some(Arc::new(ReloadingCert::load(
            &tls.cert_file,
            &tls.key_file,
        )?)),
        None => None,
    };
    let app = Arc::new(App::new(config)?);
    let adopter = Arc::new(crate::responses::adopt::Adopter {
        runs: app.runs.clone(),
        pools: app.pools.clone(),
        accounts: app.accounts.clone(),
        limiter: app.limiter.clone(),
        catalog: app.catalog.clone(),
        shutdown: app.shutdown.clone(),
        max_body_bytes: app.config.max_body_bytes,
        request_timeout: app.request_timeout(),
    });
    let drain = DrainingSignal {
        readiness_delay,
        grace,
        runs: app.runs.clone(),
        pools: app.pools.clone(),
        shutdown: app.shutdown.clone(),
    };
    let pool_maintainer = background_service("worker pools", PoolMaintainer(app.pools.clone()));
    let runs_maintainer = background_service("response runs", RunsMaintainer(app.runs.clone()));
    let run_adopter = background_service("run adoption", RunAdopter(adopter));
    let slots_maintainer = background_service("limit slots", SlotsMaintainer(app.limiter.clone()));
    let key_invalidations =
        background_service("key invalidations", KeyInvalidations(app.accounts.clone()));

    let admin_app = AdminApp(app.shutdown.clone());
    let handshakes = config_tls_timeout.map(crate::tls::handshake::HandshakeDeadline::new);
    let mut public = Service::new(
        "public".into(),
        PublicApp {
            app,
            handshakes: handshakes.clone(),
        },
    );
    public.add_listener(public_listener(&listen, certificate.clone())?);
    if let Some(handshakes) = handshakes {
        public
            .endpoints()
            .set_pre_tls_callback(Arc::new(crate::tls::handshake::Hook(handshakes)));
    }
    let mut admin = Service::new("admin".into(), admin_app);
    admin.threads = Some(1);
    admin.add_tcp(&admin_listen);
    let announcer = background_service(
        "ready announcer",
        ReadyAnnouncer {
            listen: listen.clone(),
            admin: admin_listen.clone(),
        },
    );
    server.add_service(public);
    server.add_service(admin);
    server.add_service(announcer);
    server.add_service(pool_maintainer);
    server.add_service(runs_maintainer);
    server.add_service(run_adopter);
    server.add_service(slots_maintainer);
    server.add_service(key_invalidations);
    if let Some(certificate) = certificate {
        server.add_service(background_service(
            "tls certificate",
            CertificateWatcher(certificate),
        ));
    }
    server.run(RunArgs {
        shutdown_signal: Box::new(drain),
    });
    Ok(())
}

/// The public listener. Pingora's default 64 KiB L4 read buffer per
/// connection would sit allocated for the whole life of every open stream
/// (thousands of mostly idle SSE connections); its HTTP/1 layer already
/// reads headers and bodies into buffers of its own, so reads go straight
/// to those. Writes keep the default small buffer (one MSS), flushed per
/// event. With `[tls]` it serves HTTPS (HTTP/1.1), the certificate taken
/// from `certificate` at each handshake.
fn public_listener(
    addr: &str,
    certificate: Option<Arc<ReloadingCert>>,
) -> anyhow::Result<ListenerConfig> {
    let listener = ListenerConfig::tcp(addr).l4_buffer(L4BufferSettings::default().read(0));
    Ok(match certificate {
        Some(cert) => listener.tls(crate::tls::listener::settings(cert)?),
        None => listener,
    })
}

/// How long the cut at the end of the grace period may take: every reply
/// still open ends in band, settles its reservation and records its stored
/// response within it (a few round trips each).
const CUT_TAIL: Duration = Duration::from_secs(5);

/// SIGTERM: fail readiness, keep serving until in-flight work is done (or
/// the grace period ends), then cut what is left in band, then hand over to
/// Pingora's graceful close. SIGINT stops at once.
///
/// In order: (1) draining: readiness fails, keep-alive ends, new
/// background runs are refused, requests waiting in a pool's queue are
/// answered 503 `replica_shutdown` (their clients retry on a peer), and
/// background runs whose worker has not started are handed to the peers
/// (`runs::background`); (2) the grace
/// period, in which open replies finish; (3) the cut (`Shutdown::cutting`):
/// a chat stream ends with an error frame, a Responses stream with
/// `response.incomplete`, a body not yet sent with a 503, a background run
/// `incomplete`, each billed for what it delivered, within [`CUT_TAIL`];
/// (4) whatever run is still owned then fails `replica_shutdown`.
struct DrainingSignal {
    /// How long readiness fails before we stop waiting for new traffic to
    /// dry up (load balancers poll readiness every few seconds).
    readiness_delay: Duration,
    grace: Duration,
    runs: Arc<crate::runs::Runs>,
    pools: Arc<crate::pool::Pools>,
    shutdown: Arc<Shutdown>,
}

#[async_trait]
impl ShutdownSignalWatch for DrainingSignal {
    async fn recv(&self) -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; shutting down");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        tracing::info!(in_flight = self.shutdown.in_flight(), "SIGTERM: draining");
        self.runs.stop_adopting();
        self.shutdown.start_draining();
        // Requests still waiting for a worker go to a peer now rather than
        // wait out the grace period here.
        self.pools.drain();
        let started = tokio::time::Instant::now();
        tokio::time::sleep(self.readiness_delay.min(self.grace)).await;
        let left = self.grace.saturating_sub(started.elapsed());
        let mut idle = self.shutdown.wait_idle(left).await;
        if !idle {
            tracing::info!(
                in_flight = self.shutdown.in_flight(),
                "grace period over: ending the replies still open in band"
            );
            self.shutdown.start_cutting();
            idle = self.shutdown.wait_idle(CUT_TAIL).await;
        }
        if !idle {
            self.runs.fail_owned().await;
        }
        tracing::info!(
            idle,
            in_flight = self.shutdown.in_flight(),
            "drain finished; closing"
        );
        ShutdownSignal::GracefulTerminate
    }
}

/// Runs the background runs that draining peers handed over and this
/// replica's sweeper adopted.
struct RunAdopter(Arc<crate::responses::adopt::Adopter>);

#[async_trait]
impl BackgroundService for RunAdopter {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.clone().serve() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Discovery and active health checks of every worker pool.
struct PoolMaintainer(Arc<crate::pool::Pools>);

#[async_trait]
impl BackgroundService for PoolMaintainer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.maintain() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Lease heartbeat and sweeper of stored response runs.
struct RunsMaintainer(Arc<crate::runs::Runs>);

#[async_trait]
impl BackgroundService for RunsMaintainer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.maintain() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Renewal heartbeat of this replica's concurrency slots (`limits::slots`).
struct SlotsMaintainer(Arc<crate::limits::Limiter>);

#[async_trait]
impl BackgroundService for SlotsMaintainer {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.maintain() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Applies key revocations and org/plan changes published by the admin CLI.
struct KeyInvalidations(Arc<crate::accounts::cache::Accounts>);

#[async_trait]
impl BackgroundService for KeyInvalidations {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.listen_for_invalidations() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Re-reads the public listener's certificate files when they change.
struct CertificateWatcher(Arc<ReloadingCert>);

#[async_trait]
impl BackgroundService for CertificateWatcher {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        tokio::select! {
            _ = self.0.watch() => {}
            _ = shutdown.changed() => {}
        }
    }
}

/// Prints `gateway listening on ADDR admin=ADDR` once the public port
/// accepts connections, so scripts and tests know when to start.
struct ReadyAnnouncer {
    listen: String,
    admin: String,
}

#[async_trait]
impl BackgroundService for ReadyAnnouncer {
    async fn start(&self, _shutdown: ShutdownWatch) {
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(&self.listen).await.is_ok() {
                println!("gateway listening on {} admin={}", self.listen, self.admin);
                use std::io::Write;
                let _ = std::io::stdout().flush();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::error!(listen = %self.listen, "public listener did not come up");
    }
}
