//! Assembles and runs the Pingora server: the public listener, the admin
//! listener, and a readiness announcer. `run` never returns.

use crate::app::App;
use crate::config::Config;
use crate::http::admin::AdminApp;
use crate::http::app::PublicApp;
use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::{background_service, BackgroundService};
use pingora_core::services::listening::Service;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

pub fn run(config: Config) -> anyhow::Result<()> {
    let conf = ServerConf {
        threads: config.threads,
        // Pingora waits 300 s on SIGTERM by default; ours is configured.
        grace_period_seconds: Some(config.grace_period_seconds),
        graceful_shutdown_timeout_seconds: Some(config.grace_period_seconds),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let listen = config.listen.clone();
    let admin_listen = config.admin_listen.clone();
    let app = Arc::new(App::new(config)?);

    let mut public = Service::new("public".into(), PublicApp(app));
    public.add_tcp(&listen);
    let mut admin = Service::new(
        "admin".into(),
        AdminApp {
            draining: Arc::new(AtomicBool::new(false)),
        },
    );
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
    server.run_forever()
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
