//! Operator commands against Redis: `gateway keys|orgs|plans|usage ...`,
//! and `gateway agents` (`agents.rs`).
//! Each connects with `--redis-url` / `GATEWAY_REDIS_URL` and the same
//! `--key-prefix` / `GATEWAY_KEY_PREFIX` as the gateways it administers.
//! Above accounts, limits and usage: `orgs show` reads what the limiter
//! counted an organisation's spend to be, and `usage` reads the usage log.

pub mod agents;

use crate::accounts::store::AccountStore;
use crate::accounts::{RatePlan, Scopes, ServiceTier};
use crate::redis::RedisHandle;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::sync::Arc;

#[derive(Args, Clone)]
pub struct StoreArgs {
    /// Redis holding keys, plans, limits and usage.
    #[arg(long, env = "GATEWAY_REDIS_URL")]
    pub redis_url: String,
    /// Key prefix the gateways use.
    #[arg(long, env = "GATEWAY_KEY_PREFIX", default_value = "igw:")]
    pub key_prefix: String,
    /// For `rediss://`: PEM file of the CA that signed the server's
    /// certificate (default: the system's trusted roots).
    #[arg(long, env = "GATEWAY_REDIS_CA_FILE")]
    pub redis_ca_file: Option<std::path::PathBuf>,
    /// The URL names seed nodes of a Redis Cluster (comma-separated), as
    /// `store.redis_cluster = true` in the gateways' config.
    #[arg(long, env = "GATEWAY_REDIS_CLUSTER", value_parser = clap::builder::FalseyValueParser::new())]
    pub redis_cluster: bool,
}

impl StoreArgs {
    pub fn handle(&self) -> anyhow::Result<Arc<RedisHandle>> {
        Ok(Arc::new(RedisHandle::open(
            &self.redis_url,
            &self.key_prefix,
            self.redis_ca_file.as_deref(),
            self.redis_cluster,
        )?))
    }
}

#[derive(Args)]
pub struct KeysArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key and print it (the only time it is shown).
    Create {
        #[arg(long)]
        org: String,
        /// Plan name (`plans set`, or `[plans.NAME]` in the gateway config);
        /// default: the gateway's `limits.default_plan`.
        #[arg(long, default_value = "")]
        plan: String,
        #[arg(long, default_value = "")]
        name: String,
        /// Comma-separated: models.read, chat.write, responses.write,
        /// responses.read, planner. Default: all.
        #[arg(long)]
        scopes: Option<String>,
        /// Comma-separated model allow-list. Default: every model.
        #[arg(long)]
        models: Option<String>,
    },
    /// List keys (ids and grants; never secrets).
    List {
        #[arg(long)]
        org: Option<String>,
    },
    /// Revoke a key by the id `keys list` prints; every gateway drops it at once.
    Revoke { key_id: String },
}

#[derive(Args)]
pub struct OrgsArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: OrgsCommand,
}

#[derive(Subcommand)]
enum OrgsCommand {
    /// Block an organisation: its requests get 402.
    Block {
        org: String,
        #[arg(long, default_value = "account_blocked")]
        reason: String,
    },
    Unblock {
        org: String,
    },
    /// Set (`--usd X`) or clear (`--clear`) a spending budget.
    Budget {
        org: String,
        #[arg(long, conflicts_with = "clear")]
        usd: Option<f64>,
        #[arg(long)]
        clear: bool,
    },
    /// Show an organisation's status and spend.
    Show {
        org: String,
    },
}

#[derive(Args)]
pub struct PlansArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: PlansCommand,
}

#[derive(Subcommand)]
enum PlansCommand {
    /// Create or replace a plan (limits per organisation and model; 0 = unlimited).
    Set {
        name: String,
        #[arg(long, default_value_t = 0)]
        rpm: u32,
        #[arg(long, default_value_t = 0)]
        tpm: u64,
        #[arg(long, default_value_t = 0)]
        max_concurrent: u32,
        #[arg(long, default_value_t = 0)]
        default_max_tokens: u32,
        /// The highest service tier its requests get: priority, default or flex.
        #[arg(long, default_value = "default", value_parser = ["priority", "default", "flex"])]
        max_service_tier: String,
        /// Its organisations' share of a saturated pool within a tier.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        weight: u32,
        /// The most bytes of stored responses an organisation may keep (0 = no cap).
        #[arg(long, default_value_t = 0)]
        max_stored_bytes: u64,
    },
    Show {
        name: String,
    },
}

#[derive(Args)]
pub struct UsageArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[arg(long)]
    org: String,
    /// First day (UTC, YYYY-MM-DD); default: today.
    #[arg(long)]
    since: Option<String>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

impl KeysArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let store = AccountStore::new(self.store.handle()?);
        runtime()?.block_on(async move {
            match self.command {
                KeysCommand::Create {
                    org,
                    plan,
                    name,
                    scopes,
                    models,
                } => {
                    let scopes = match scopes {
                        None => Scopes::ALL,
                        Some(s) => Scopes::parse_list(&s)
                            .map_err(|bad| anyhow::anyhow!("unknown scope '{bad}'"))?,
                    };
                    let models: Option<Vec<String>> = models.map(|m| {
                        m.split(',')
                            .map(|s| s.trim().to_owned())
                            .filter(|s| !s.is_empty())
                            .collect()
                    });
                    // The ids a gateway adds live in its config, which this
                    // command does not read: an id of the right shape is
                    // accepted, one beyond the spec's three with a reminder.
                    for m in models.iter().flatten() {
                        if !crate::catalog::valid_model_id(m) {
                            bail!("'{m}' is not a model id (1 to 64 of a-z 0-9 . _ -)");
                        }
                        if !crate::catalog::is_spec_model(m) {
                            eprintln!("note: '{m}' is not one of base, base-ultra, base-mini; the gateways' config must add it ([models.{m}])");
                        }
                    }
                    let (secret, rec) = store
                        .create_key(&org, &name, &plan, scopes, models.as_deref())
                        .await?;
                    println!("{secret}");
                    eprintln!(
                        "key id {} for org {} (plan {}); the key above is not stored and will not be shown again",
                        rec.key_id(),
                        rec.org,
                        if rec.plan.is_empty() { "default" } else { &rec.plan }
                    );
                }
                KeysCommand::List { org } => {
                    println!(
                        "{:<12}  {:<16}  {:<12}  {:<10}  {:<8}  {:<50}  models",
                        "key_id", "org", "name", "plan", "status", "scopes"
                    );
                    for k in store.list_keys(org.as_deref()).await? {
                        println!(
                            "{:<12}  {:<16}  {:<12}  {:<10}  {:<8}  {:<50}  {}",
                            k.key_id(),
                            k.org,
                            k.name,
                            if k.plan.is_empty() { "-" } else { &k.plan },
                            if k.revoked { "revoked" } else { "active" },
                            k.scopes.to_list(),
                            k.models.as_ref().map(|m| m.join(",")).unwrap_or_else(|| "*".into())
                        );
                    }
                }
                KeysCommand::Revoke { key_id } => {
                    let revoked = store.revoke(&key_id).await?;
                    if revoked.is_empty() {
                        bail!("no key with id '{key_id}'");
                    }
                    for k in revoked {
                        println!("revoked {} (org {})", k.key_id(), k.org);
                    }
                }
            }
            Ok(())
        })
    }
}

impl OrgsArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let redis = self.store.handle()?;
        let store = AccountStore::new(redis.clone());
        runtime()?.block_on(async move {
            match self.command {
                OrgsCommand::Block { org, reason } => {
                    store.set_org_blocked(&org, true, &reason).await?;
                    println!("blocked {org}");
                }
                OrgsCommand::Unblock { org } => {
                    store.set_org_blocked(&org, false, "").await?;
                    println!("unblocked {org}");
                }
                OrgsCommand::Budget { org, usd, clear } => {
                    if usd.is_none() && !clear {
                        bail!("give --usd AMOUNT or --clear");
                    }
                    store.set_org_budget(&org, usd).await?;
                    println!(
                        "budget of {org}: {}",
                        usd.map_or("none".into(), |u| format!("${u}"))
                    );
                }
                OrgsCommand::Show { org } => {
                    let status = store.org(&org).await?.unwrap_or_default();
                    let spent = crate::limits::redis_lua::spent_nano(&redis, &org).await?;
                    println!("org:     {org}");
                    println!(
                        "status:  {}",
                        if status.blocked {
                            format!("blocked ({})", status.blocked_reason)
                        } else {
                            "active".into()
                        }
                    );
                    println!(
                        "budget:  {}",
                        status
                            .budget_nano
                            .map_or("none".into(), |b| format!("${:.9}", b as f64 / 1e9))
                    );
                    println!("spent:   ${:.9}", spent as f64 / 1e9);
                }
            }
            Ok(())
        })
    }
}

impl PlansArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let store = AccountStore::new(self.store.handle()?);
        runtime()?.block_on(async move {
            match self.command {
                PlansCommand::Set {
                    name,
                    rpm,
                    tpm,
                    max_concurrent,
                    default_max_tokens,
                    max_service_tier,
                    weight,
                    max_stored_bytes,
                } => {
                    let plan = RatePlan {
                        rpm,
                        tpm,
                        max_concurrent,
                        default_max_tokens,
                        max_service_tier: ServiceTier::parse(&max_service_tier)
                            .unwrap_or(ServiceTier::Default),
                        weight,
                        max_stored_bytes,
                    };
                    store.set_plan(&name, &plan).await?;
                    println!("plan {name}: {plan:?}");
                }
                PlansCommand::Show { name } => match store.plan(&name).await? {
                    Some(p) => println!("plan {name}: {p:?}"),
                    None => {
                        bail!("no plan '{name}' in Redis (it may be defined in a gateway config)")
                    }
                },
            }
            Ok(())
        })
    }
}

impl UsageArgs {
    pub fn run(self) -> anyhow::Result<()> {
        let redis = self.store.handle()?;
        let today = crate::usage::today();
        let since = match &self.since {
            Some(s) => crate::usage::parse_day(s).context("--since takes a date YYYY-MM-DD")?,
            None => today,
        };
        if since > today {
            bail!("--since is in the future");
        }
        if today - since > 400 {
            bail!("--since reaches back more than 400 days (usage is kept 400 days)");
        }
        let rows = runtime()?
            .block_on(async { crate::usage::read_usage(&redis, &self.org, since, today).await })?;
        let mut total = crate::usage::UsageRow::default();
        if !self.json {
            println!(
                "{:<10}  {:<12}  {:<10}  {:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>14}",
                "day",
                "key_id",
                "model",
                "requests",
                "input",
                "cached_in",
                "output",
                "reasoning",
                "cost_usd"
            );
        }
        for ((day, key_id, model), r) in &rows {
            if self.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "org": self.org, "day": day, "key_id": key_id, "model": model,
                        "requests": r.requests, "input_tokens": r.input,
                        "cached_input_tokens": r.cached_input, "output_tokens": r.output,
                        "reasoning_tokens": r.reasoning, "cost_usd": r.cost_nano as f64 / 1e9,
                        "cost_nano_usd": r.cost_nano,
                    })
                );
            } else {
                println!(
                    "{:<10}  {:<12}  {:<10}  {:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>14.9}",
                    day,
                    key_id,
                    model,
                    r.requests,
                    r.input,
                    r.cached_input,
                    r.output,
                    r.reasoning,
                    r.cost_nano as f64 / 1e9
                );
            }
            total.requests += r.requests;
            total.input += r.input;
            total.cached_input += r.cached_input;
            total.output += r.output;
            total.reasoning += r.reasoning;
            total.cost_nano += r.cost_nano;
        }
        if !self.json {
            println!(
                "{:<10}  {:<12}  {:<10}  {:>8}  {:>12}  {:>12}  {:>12}  {:>12}  {:>14.9}",
                "total",
                "",
                "",
                total.requests,
                total.input,
                total.cached_input,
                total.output,
                total.reasoning,
                total.cost_nano as f64 / 1e9
            );
        }
        Ok(())
    }
}
