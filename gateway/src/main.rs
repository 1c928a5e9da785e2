//! `gateway`: serve the API (`serve`), run everything locally (`up`), and
//! small operator commands.

use clap::{Parser, Subcommand};
use gateway::config::Config;
use std::path::PathBuf;

mod up;

/// mimalloc rather than glibc malloc: profiles of the request path showed
/// about 15% of the gateway's CPU in glibc's allocator (Pingora and tonic
/// allocate and free per request and per frame, across threads).
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
    Keys(gateway::accounts::admin::KeysArgs),
    /// Organisations in Redis: block, unblock, budget, show.
    Orgs(gateway::accounts::admin::OrgsArgs),
    /// Plans in Redis: set, show.
    Plans(gateway::accounts::admin::PlansArgs),
    /// Token usage and cost of an organisation, per day, key and model.
    Usage(gateway::accounts::admin::UsageArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,pingora_core=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve { config } => Config::load(&config).and_then(gateway::server::run),
        Command::Up(args) => up::run(args),
        Command::HashKey { key } => {
            println!("{}", gateway::auth::hash_key_hex(&key));
            Ok(())
        }
        Command::Keys(args) => args.run(),
        Command::Orgs(args) => args.run(),
        Command::Plans(args) => args.run(),
        Command::Usage(args) => args.run(),
    };
    if let Err(e) = result {
        eprintln!("gateway: {e:#}");
        std::process::exit(1);
    }
}
