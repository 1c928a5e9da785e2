//! `gateway`: serve the API (`serve`), run everything locally (`up`), and
//! small operator commands.

use clap::{Parser, Subcommand};
use gateway::config::Config;
use std::path::PathBuf;

mod up;

/// mimalloc rather than glibc malloc: profiles of the request path showed
/// about 15% of the gateway's CPU in glibc's allocator (Pingora and tonic
/// allocate and free per request and per frame, across threads). The
/// `system-allocator` feature leaves glibc's, for heaptrack.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "gateway",
    version,
    about = "Inference gateway: an OpenAI-compatible edge in front of GPU worker pools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API with a config file.
    Serve {
        #[arg(long, env = "GATEWAY_CONFIG")]
        config: PathBuf,
    },
    /// Run the whole service locally: the gateway plus one synthetic
    /// (simulated) worker per model over real gRPC, with the embedded store.
    Up(up::UpArgs),
    /// Print the sha256 digest that `keys[].sha256` in the config expects.
    HashKey { key: String },
    /// API keys in Redis: create (printed once), list, revoke.
    Keys(gateway::operator::KeysArgs),
    /// Organisations in Redis: block, unblock, budget, show.
    Orgs(gateway::operator::OrgsArgs),
    /// Plans in Redis: set, show.
    Plans(gateway::operator::PlansArgs),
    /// Token usage and cost of an organisation, per day, key and model.
    Usage(gateway::operator::UsageArgs),
    /// The planner's agent directory in Redis: add, list, remove, probe.
    Agents(gateway::operator::agents::AgentsArgs),
}

/// Log filter when `RUST_LOG` is not set. Request spans (target
/// `gateway::request`) stay out of the logs by default: formatting their
/// fields would cost every request; their ids are in the lines that matter
/// and they are exported when `[telemetry]` names a collector.
const DEFAULT_LOG_FILTER: &str = "info,pingora_core=warn,gateway::request=warn";

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { config } => Config::load(&config).and_then(|config| {
            let mut telemetry = init_telemetry(&config.telemetry)?;
            let result = gateway::server::run(config);
            telemetry.shutdown();
            result
        }),
        Command::Up(args) => {
            let mut settings = gateway::config::TelemetryConfig::default();
            settings.apply_env(|k| std::env::var(k).ok());
            init_telemetry(&settings).and_then(|mut telemetry| {
                let result = up::run(args);
                telemetry.shutdown();
                result
            })
        }
        Command::HashKey { key } => logs_only(|| {
            println!("{}", gateway::auth::hash_key_hex(&key));
            Ok(())
        }),
        Command::Keys(args) => logs_only(|| args.run()),
        Command::Orgs(args) => logs_only(|| args.run()),
        Command::Plans(args) => logs_only(|| args.run()),
        Command::Usage(args) => logs_only(|| args.run()),
        Command::Agents(args) => logs_only(|| args.run()),
    };
    if let Err(e) = result {
        eprintln!("gateway: {e:#}");
        std::process::exit(1);
    }
}

/// Operator commands: logs, never span export.
fn logs_only(command: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let _telemetry = init_telemetry(&Default::default())?;
    command()
}

/// Logs on stderr; request spans exported over OTLP when configured.
fn init_telemetry(
    settings: &gateway::config::TelemetryConfig,
) -> anyhow::Result<telemetry::Telemetry> {
    telemetry::init(&telemetry::Options {
        service_name: &settings.service_name,
        otlp_endpoint: settings.otlp_endpoint.as_deref(),
        default_log_filter: DEFAULT_LOG_FILTER,
        export_targets: &["gateway"],
        // A failed or timed-out TLS handshake (a scanner, a client that
        // gave up, a wrong name) is the client's business, not an error of
        // ours; Pingora logs it at ERROR.
        demoted: &[telemetry::Demoted {
            target: "pingora_core::services::listening",
            message_prefix: "Downstream handshake",
        }],
    })
}
