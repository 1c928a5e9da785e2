//! The planner's settings (the host's `[planner]` section): deadlines,
//! budgets, safety, the agent directory's config entries, and the rules
//! they must follow.

use crate::agents::{valid_allowed_host, valid_id, AgentEntry};
use anyhow::bail;
use serde::Deserialize;

/// Planner mode (`[planner]`). Every duration is in milliseconds; the
/// defaults are sized for real agents on the internet.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlannerConfig {
    /// Connecting to an agent (TCP and TLS).
    pub connect_timeout_ms: u64,
    /// From sending a request to an agent to the response head.
    pub first_byte_timeout_ms: u64,
    /// Longest silence inside an agent's response body or event stream.
    pub idle_timeout_ms: u64,
    /// One agent call, start to end.
    pub step_timeout_ms: u64,
    /// Soft deadline: a step still running after this starts its alternate
    /// (a hedge); the first good answer wins, the other is cancelled.
    pub hedge_after_ms: u64,
    /// Wall clock of a plan's execution (plan, steps, re-plans); the
    /// synthesis that follows has `synthesis_timeout_ms` more.
    pub run_timeout_ms: u64,
    pub synthesis_timeout_ms: u64,
    /// Steps one run may execute (plans are capped at 8 steps each).
    pub max_steps: u32,
    /// Re-plans after failed steps.
    pub max_replans: u32,
    /// Tokens (input + output) of every model call of one run; past it no
    /// further step or re-plan starts.
    pub max_run_tokens: u64,
    /// Output tokens of one plan or re-plan call (its grammar is sized to
    /// fit).
    pub max_plan_tokens: u32,
    /// Output tokens of one `llm` step: an intermediate result quoted into
    /// later prompts, so far shorter than an answer (a small model left
    /// unbounded runs on to the cap).
    pub max_step_tokens: u32,
    /// Output tokens of the answer when the request sets no `max_tokens`:
    /// a planner answer summarises what was gathered, and a small model
    /// left unbounded can run on until the synthesis deadline.
    pub max_answer_tokens: u32,
    /// Largest agent response body (or event stream) read; beyond, the
    /// step fails.
    pub max_response_bytes: usize,
    /// Largest agent card read.
    pub max_card_bytes: usize,
    /// Bytes of one step's output quoted into later prompts.
    pub max_step_output_bytes: usize,
    /// How long a fetched card is trusted (a failed fetch: a tenth of it,
    /// at most 30 s).
    pub card_ttl_seconds: u64,
    /// How long a paused plan waits for its tool results.
    pub session_ttl_seconds: u64,
    /// Keep-alive comments on a planner stream while nothing else is sent.
    pub keepalive_ms: u64,
    /// Agents on loopback, RFC 1918, CGNAT and unique-local addresses.
    /// Off by default: a request's `agents` could otherwise reach inside
    /// the network.
    pub allow_private_addresses: bool,
    /// Link-local addresses, cloud metadata endpoints included
    /// (169.254.169.254). Off by default; rarely right to turn on.
    pub allow_link_local: bool,
    /// Private addresses allowed without `allow_private_addresses`: CIDRs
    /// or addresses (`10.0.0.0/8`, `fd00::/8`), host names
    /// (`agents.ns.svc.cluster.local`) and `*.domain` patterns
    /// (`*.svc.cluster.local`), whose resolved addresses may be private.
    /// Never opens link-local or metadata addresses (`allow_link_local`)
    /// nor the reserved ranges.
    pub allowed_networks: Vec<String>,
    /// Whether a request's `agents` may name URLs (not only directory ids).
    pub allow_request_urls: bool,
    /// Most agents discovered in the directory for one request.
    pub max_discovered: usize,
    /// Directory entries of this config (besides Redis, `gateway agents`).
    pub agents: Vec<AgentEntry>,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 3_000,
            first_byte_timeout_ms: 30_000,
            idle_timeout_ms: 30_000,
            step_timeout_ms: 120_000,
            hedge_after_ms: 15_000,
            run_timeout_ms: 300_000,
            synthesis_timeout_ms: 120_000,
            max_steps: 16,
            max_replans: 2,
            max_run_tokens: 200_000,
            max_plan_tokens: 2_048,
            max_step_tokens: 512,
            max_answer_tokens: 1_024,
            max_response_bytes: 1024 * 1024,
            max_card_bytes: 256 * 1024,
            max_step_output_bytes: 16 * 1024,
            card_ttl_seconds: 300,
            session_ttl_seconds: 24 * 3600,
            keepalive_ms: 10_000,
            allow_private_addresses: false,
            allow_link_local: false,
            allowed_networks: Vec::new(),
            allow_request_urls: true,
            max_discovered: 4,
            agents: Vec::new(),
        }
    }
}

impl PlannerConfig {
    /// The section's rules: directory entries (id, URL, credentials,
    /// hosts) and deadlines.
    pub fn check(&self) -> anyhow::Result<()> {
        let mut agent_ids = std::collections::BTreeSet::new();
        for a in &self.agents {
            if !valid_id(&a.id) {
                bail!(
                    "planner.agents: id '{}' must be 1 to 64 of A-Z a-z 0-9 . _ -",
                    a.id
                );
            }
            if !agent_ids.insert(a.id.as_str()) {
                bail!("planner.agents: id '{}' appears twice", a.id);
            }
            if !(a.url.starts_with("http://") || a.url.starts_with("https://")) {
                bail!("planner.agents '{}': url must be http:// or https://", a.id);
            }
            if a.auth_header.is_some() != a.auth_secret_env.is_some() {
                bail!(
                    "planner.agents '{}': auth_header and auth_secret_env go together",
                    a.id
                );
            }
            if let Some(h) = a.allowed_hosts.iter().find(|h| !valid_allowed_host(h)) {
                bail!(
                    "planner.agents '{}': allowed_hosts entry '{h}' must be a host or host:port",
                    a.id
                );
            }
        }
        // `planner.allowed_networks` is parsed by the planner when it is
        // built (`net::AddressPolicy::new`), which stops the start
        // on a bad entry with the same message.
        if self.step_timeout_ms == 0 || self.run_timeout_ms == 0 || self.first_byte_timeout_ms == 0
        {
            bail!("planner: step, run and first-byte timeouts must be above 0");
        }
        Ok(())
    }
}
