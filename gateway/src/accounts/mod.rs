//! Keys, organisations, plans and permissions: who is calling and what they
//! may do.
//!
//! The request path asks one question here, [`cache::Accounts::authorize`]:
//! the bearer key is hashed and resolved to an [`Account`] (401 if unknown
//! or revoked), the
//! organisation's status is checked (402 when blocked), then the key's scope
//! for the endpoint family (403). Once the body names a model,
//! [`Account::check_model`] applies the key's model allow-list (403).
//!
//! Keys live as sha256 digests only: in the config file (the embedded mode)
//! and in Redis (`gateway keys create`). Redis lookups are cached for
//! `limits.key_cache_ttl_ms`; a revocation is also broadcast over pub/sub so
//! every replica drops the key at once (see [`cache`]).

pub mod cache;
pub mod store;

use crate::auth::Principal;
use crate::config::RatePlanConfig;
use std::sync::Arc;

/// A plan's limits for one organisation and model; 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatePlan {
    pub rpm: u32,
    pub tpm: u64,
    pub max_concurrent: u32,
    /// Output tokens reserved when a request sets no `max_tokens`.
    pub default_max_tokens: u32,
    /// The highest `service_tier` its requests may have (a higher one asked
    /// for is served at this one).
    pub max_service_tier: ServiceTier,
    /// Its organisation's share of a saturated model pool, against other
    /// organisations waiting in the same tier (1 = one share).
    pub weight: u32,
    /// The most bytes of stored responses its organisation may keep (the
    /// store counts them); 0: no cap.
    pub max_stored_bytes: u64,
}

impl Default for RatePlan {
    fn default() -> Self {
        Self {
            rpm: 0,
            tpm: 0,
            max_concurrent: 0,
            default_max_tokens: 0,
            max_service_tier: ServiceTier::Default,
            weight: 1,
            max_stored_bytes: 0,
        }
    }
}

impl RatePlan {
    pub fn is_unlimited(&self) -> bool {
        self.rpm == 0 && self.tpm == 0 && self.max_concurrent == 0
    }

    /// The tier a request is served at: what it asked for (`auto` or none:
    /// `default`), capped by the plan.
    pub fn service_tier(&self, requested: Option<&str>) -> ServiceTier {
        let asked = requested
            .and_then(ServiceTier::parse)
            .unwrap_or(ServiceTier::Default);
        asked.min(self.max_service_tier)
    }
}

impl From<&RatePlanConfig> for RatePlan {
    fn from(p: &RatePlanConfig) -> Self {
        Self {
            rpm: p.rpm,
            tpm: p.tpm,
            max_concurrent: p.max_concurrent,
            default_max_tokens: p.default_max_tokens,
            max_service_tier: p
                .max_service_tier
                .as_deref()
                .and_then(ServiceTier::parse)
                .unwrap_or(ServiceTier::Default),
            weight: p.weight.unwrap_or(1).max(1),
            max_stored_bytes: p.max_stored_bytes,
        }
    }
}

/// The order of service of a saturated pool (`service_tier`, as the
/// public API names it): every waiting `priority` request before any
/// `default` one, every `default` one before any `flex` one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceTier {
    Flex = 0,
    Default = 1,
    Priority = 2,
}

impl ServiceTier {
    /// Highest first, the order queues are served in.
    pub const BY_PRECEDENCE: [ServiceTier; 3] = [
        ServiceTier::Priority,
        ServiceTier::Default,
        ServiceTier::Flex,
    ];

    /// A tier's name; `auto` (and anything else) is not a tier.
    pub fn parse(s: &str) -> Option<ServiceTier> {
        match s {
            "flex" => Some(ServiceTier::Flex),
            "default" => Some(ServiceTier::Default),
            "priority" => Some(ServiceTier::Priority),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ServiceTier::Flex => "flex",
            ServiceTier::Default => "default",
            ServiceTier::Priority => "priority",
        }
    }
}

/// One endpoint family a key may be allowed to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Scope {
    /// `GET /v1/models`, `GET /v1/models/{id}`.
    ModelsRead = 1,
    /// `POST /v1/chat/completions`.
    ChatWrite = 2,
    /// `POST /v1/responses`, and delete and cancel: what writes or destroys.
    ResponsesWrite = 4,
    /// Retrieve (and stream on retrieve) and list input items of stored
    /// responses.
    ResponsesRead = 8,
    /// `planner_mode: true` on chat completions.
    Planner = 16,
}

impl Scope {
    pub const ALL: [Scope; 5] = [
        Scope::ModelsRead,
        Scope::ChatWrite,
        Scope::ResponsesWrite,
        Scope::ResponsesRead,
        Scope::Planner,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::ModelsRead => "models.read",
            Scope::ChatWrite => "chat.write",
            Scope::ResponsesWrite => "responses.write",
            Scope::ResponsesRead => "responses.read",
            Scope::Planner => "planner",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s.trim())
    }
}

/// A set of scopes (a bit per [`Scope`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    /// Every scope: derived from [`Scope::ALL`], so a new scope is in it.
    pub const ALL: Scopes = {
        let mut bits = 0;
        let mut i = 0;
        while i < Scope::ALL.len() {
            bits |= Scope::ALL[i] as u8;
            i += 1;
        }
        Scopes(bits)
    };
    pub const NONE: Scopes = Scopes(0);

    pub fn contains(self, s: Scope) -> bool {
        self.0 & s as u8 != 0
    }

    pub fn with(self, s: Scope) -> Scopes {
        Scopes(self.0 | s as u8)
    }

    /// Parses a comma-separated list; `None` names the first unknown scope.
    pub fn parse_list(list: &str) -> Result<Scopes, String> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .try_fold(Scopes::NONE, |acc, s| {
                Scope::parse(s)
                    .map(|x| acc.with(x))
                    .ok_or_else(|| s.to_owned())
            })
    }

    /// The comma-separated form stored in Redis and printed by `keys list`.
    pub fn to_list(self) -> String {
        Scope::ALL
            .into_iter()
            .filter(|s| self.contains(*s))
            .map(Scope::as_str)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// An organisation's standing, as the request path needs it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrgStatus {
    pub blocked: bool,
    pub blocked_reason: String,
    /// Spending budget in nano-dollars (1e-9 USD); checked atomically
    /// against the org's spend by the limiter on admission.
    pub budget_nano: Option<i64>,
}

/// Everything the gateway knows about a key: its principal, grants, plan
/// and organisation. Shared (`Arc`) from the key cache.
#[derive(Debug, Clone)]
pub struct Account {
    pub principal: Principal,
    pub scopes: Scopes,
    /// Model allow-list; `None` = every model.
    pub models: Option<Box<[Box<str>]>>,
    pub plan_name: Arc<str>,
    pub plan: RatePlan,
    pub org: OrgStatus,
    /// This key's usage metric series, resolved once per model.
    pub series: crate::metrics::AccountSeries,
}

impl Account {
    /// 403 unless the key may call this scope.
    pub fn check_scope(&self, scope: Scope) -> Result<(), AccountError> {
        if self.scopes.contains(scope) {
            Ok(())
        } else {
            Err(AccountError::MissingScope(scope))
        }
    }

    /// 403 unless the key's model allow-list (if any) names `model`.
    pub fn check_model(&self, model: &str) -> Result<(), AccountError> {
        match &self.models {
            Some(list) if !list.iter().any(|m| &**m == model) => {
                Err(AccountError::ModelNotAllowed {
                    model: model.to_owned(),
                })
            }
            _ => Ok(()),
        }
    }

    /// 402 in the blocked-account shape for a blocked organisation.
    pub fn check_org(&self) -> Result<(), AccountError> {
        if self.org.blocked {
            let reason = if self.org.blocked_reason.is_empty() {
                "account_blocked"
            } else {
                &self.org.blocked_reason
            };
            return Err(AccountError::Blocked {
                reason: reason.to_owned(),
            });
        }
        Ok(())
    }
}

/// Why the access check refused a request; `error/map.rs` gives each its status
/// (the one noted here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountError {
    /// 401: a missing, malformed, unknown or revoked key.
    InvalidKey,
    /// 402: the organisation is blocked by the operator.
    Blocked { reason: String },
    /// 403: the key lacks the permission the route needs.
    MissingScope(Scope),
    /// 403: the key's model allow-list leaves the model out.
    ModelNotAllowed { model: String },
    /// 503: the key cannot be looked up (Redis down, nothing cached).
    StoreUnavailable,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(scopes: Scopes, models: Option<&[&str]>, org: OrgStatus) -> Account {
        Account {
            principal: Principal {
                org: "org-a".into(),
                key_name: "k".into(),
                key_id: "0123456789ab".into(),
            },
            scopes,
            models: models.map(|m| m.iter().map(|s| (*s).into()).collect()),
            plan_name: "default".into(),
            plan: RatePlan::default(),
            org,
            series: Default::default(),
        }
    }

    #[test]
    fn scopes_parse_and_print() {
        let s = Scopes::parse_list("chat.write, models.read").unwrap();
        assert!(s.contains(Scope::ChatWrite) && s.contains(Scope::ModelsRead));
        assert!(!s.contains(Scope::Planner));
        assert_eq!(s.to_list(), "models.read,chat.write");
        assert_eq!(Scopes::parse_list("chat.write,admin"), Err("admin".into()));
        assert_eq!(
            Scopes::parse_list(&Scopes::ALL.to_list()).unwrap(),
            Scopes::ALL
        );
    }

    #[test]
    fn missing_scope_or_model_is_refused() {
        let a = account(
            Scopes::NONE.with(Scope::ChatWrite),
            Some(&["base-mini"]),
            OrgStatus::default(),
        );
        assert!(a.check_scope(Scope::ChatWrite).is_ok());
        assert_eq!(
            a.check_scope(Scope::ResponsesWrite),
            Err(AccountError::MissingScope(Scope::ResponsesWrite))
        );
        assert!(a.check_model("base-mini").is_ok());
        assert_eq!(
            a.check_model("base-ultra"),
            Err(AccountError::ModelNotAllowed {
                model: "base-ultra".into()
            })
        );
        assert!(account(Scopes::ALL, None, OrgStatus::default())
            .check_model("base-ultra")
            .is_ok());
    }

    #[test]
    fn blocked_org_is_refused_with_its_reason() {
        let blocked = |reason: &str| {
            account(
                Scopes::ALL,
                None,
                OrgStatus {
                    blocked: true,
                    blocked_reason: reason.into(),
                    budget_nano: None,
                },
            )
        };
        assert_eq!(
            blocked("payment_overdue").check_org(),
            Err(AccountError::Blocked {
                reason: "payment_overdue".into()
            })
        );
        assert_eq!(
            blocked("").check_org(),
            Err(AccountError::Blocked {
                reason: "account_blocked".into()
            })
        );
    }
}
