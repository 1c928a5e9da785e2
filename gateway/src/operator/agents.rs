//! `gateway agents add|list|remove|probe`: the agent directory in Redis,
//! with the same `--redis-url` / `--key-prefix` as the gateways.

use super::StoreArgs;
use crate::planner_mode::sessions::RedisDirectory;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use planner::agents::{valid_allowed_host, valid_id, AgentEntry};
use planner::net::{AddressPolicy, AgentHttp, NetLimits};
use std::time::Duration;

#[derive(Args)]
pub struct AgentsArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: AgentsCommand,
}

#[derive(Subcommand)]
enum AgentsCommand {
    /// Add or replace an agent: its id and its base URL (card at
    /// `/.well-known/agent-card.json`) or its card's URL.
    Add {
        id: String,
        url: String,
        /// A header sent on every call (e.g. `authorization`)...
        #[arg(long, requires = "auth_secret_env")]
        auth_header: Option<String>,
        /// ...whose value the gateways read from this environment variable
        /// (mount the secret there); the value is never stored.
        #[arg(long, requires = "auth_header")]
        auth_secret_env: Option<String>,
        /// A host (`host` or `host:port`) besides the URL's origin that the
        /// agent's card may name as its endpoint; repeatable. Without it,
        /// the card must stay on the URL's scheme, host and port.
        #[arg(long = "allowed-host")]
        allowed_hosts: Vec<String>,
        /// Add it disabled (planning ignores it).
        #[arg(long)]
        disabled: bool,
    },
    /// List the agents in Redis (config-file agents are in the config).
    List,
    /// Remove an agent by id.
    Remove { id: String },
    /// Fetch an agent's card (by directory id or URL) and show what the
    /// planner would see.
    Probe {
        id_or_url: String,
        /// Allow private (loopback, RFC 1918) addresses, as a gateway with
        /// `planner.allow_private_addresses` does.
        #[arg(long)]
        allow_private: bool,
    },
}

impl AgentsArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let store = RedisDirectory::new(self.store.handle()?);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async move {
            match self.command {
                AgentsCommand::Add {
                    id,
                    url,
                    auth_header,
                    auth_secret_env,
                    allowed_hosts,
                    disabled,
                } => {
                    if !valid_id(&id) {
                        bail!("an agent id is 1 to 64 of A-Z a-z 0-9 . _ -");
                    }
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        bail!("the agent's URL must be http:// or https://");
                    }
                    if let Some(h) = allowed_hosts
                        .iter()
                        .find(|h| !valid_allowed_host(h))
                    {
                        bail!("--allowed-host {h}: expected a host or host:port");
                    }
                    store
                        .put(&AgentEntry {
                            id: id.clone(),
                            url,
                            auth_header,
                            auth_secret_env,
                            allowed_hosts,
                            enabled: !disabled,
                        })
                        .await?;
                    println!("agent {id} saved");
                }
                AgentsCommand::List => {
                    let mut entries = store.list().await?;
                    entries.sort_by(|a, b| a.id.cmp(&b.id));
                    for e in entries {
                        println!(
                            "{}\t{}\t{}\t{}\t{}",
                            e.id,
                            e.url,
                            if e.enabled { "enabled" } else { "disabled" },
                            match (&e.auth_header, &e.auth_secret_env) {
                                (Some(h), Some(v)) => format!("{h} from ${v}"),
                                _ => "no auth".into(),
                            },
                            if e.allowed_hosts.is_empty() {
                                "own origin only".to_owned()
                            } else {
                                format!("also {}", e.allowed_hosts.join(","))
                            }
                        );
                    }
                }
                AgentsCommand::Remove { id } => {
                    if store.remove(&id).await? {
                        println!("agent {id} removed");
                    } else {
                        bail!("no agent {id}");
                    }
                }
                AgentsCommand::Probe {
                    id_or_url,
                    allow_private,
                } => {
                    let (url, headers, entry) = if id_or_url.starts_with("http") {
                        (id_or_url.clone(), Vec::new(), None)
                    } else {
                        let e = store
                            .list()
                            .await?
                            .into_iter()
                            .find(|e| e.id == id_or_url)
                            .with_context(|| format!("no agent {id_or_url} in Redis"))?;
                        let headers = e.headers();
                        (e.url.clone(), headers, Some(e))
                    };
                    let roots = crate::tls::native_roots()
                        .unwrap_or_else(|_| rustls::RootCertStore::empty());
                    let http = AgentHttp::new(
                        AddressPolicy {
                            allow_private,
                            ..AddressPolicy::default()
                        },
                        crate::tls::client_config(roots)?,
                        Duration::from_secs(5),
                    );
                    let limits = NetLimits {
                        first_byte: Duration::from_secs(10),
                        idle: Duration::from_secs(10),
                        max_body: 256 * 1024,
                    };
                    match planner::a2a::fetch_card(&http, &url, &headers, limits).await {
                        Ok(card) => {
                            println!(
                                "healthy: {} (A2A {:?}, streaming {})",
                                card.name, card.protocol, card.streaming
                            );
                            println!("endpoint: {}", card.endpoint);
                            if let Some(e) = entry.filter(|e| !e.endpoint_allowed(&card.endpoint)) {
                                println!(
                                    "refused: the endpoint is outside {}'s origin and allowed hosts; the planner will not call it",
                                    e.id
                                );
                            }
                            println!("description: {}", card.description);
                            for s in card.skills {
                                println!(
                                    "skill: {}: {} [{}]",
                                    s.name,
                                    s.description,
                                    s.tags.join(", ")
                                );
                            }
                        }
                        Err(e) => bail!("unhealthy: {e}"),
                    }
                }
            }
            Ok(())
        })
    }
}
