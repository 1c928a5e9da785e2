//! What a connection may do, as of now. The upgrade's key check is not
//! kept for the connection's life: the key is held by digest and
//! authorized again for every `response.create` (a revoked key, a blocked
//! organisation, a budget set to zero refuse the next turn as `POST`
//! would), and every invalidation the accounts apply (`gateway keys
//! revoke`, `orgs block`, ..., pushed to every replica over Redis) is a
//! prompt to check again while the connection idles: a key no longer
//! valid or an organisation blocked ends the connection with 1008.

use crate::accounts::cache::{Accounts, Invalidation};
use crate::accounts::{Account, AccountError, Scope};
use crate::app::App;
use crate::auth::{bearer_token, hash_key};
use crate::error::ApiError;
use crate::http::Exchange;
use crate::limits::OpenConnection;
use crate::metrics::METRICS;
use prometheus::IntGauge;
use rand::Rng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::{error::RecvError, Receiver};

/// Over how long the connections re-check after a change that concerns
/// every key (an organisation blocked): spread, so that thousands of open
/// connections do not ask the store at the same instant.
const SPREAD: Duration = Duration::from_millis(250);

pub(super) struct Rights {
    /// The sha256 of the connection's key.
    digest: [u8; 32],
    /// The account as last authorized.
    account: Arc<Account>,
    changes: Receiver<Invalidation>,
    /// Its place under the key's connection cap.
    _open: OpenConnection,
}

impl Rights {
    /// The rights of a connection about to be upgraded: `account` is the
    /// upgrade request's, already authorized; its key takes a place under
    /// `[websocket] max_connections_per_key` (429 past it).
    pub fn open(app: &App, ex: &Exchange, account: Arc<Account>) -> Result<Self, ApiError> {
        // Subscribed first: a change from now on is seen.
        let changes = app.accounts.changes();
        let token = bearer_token(ex.header("authorization")).ok_or(AccountError::InvalidKey)?;
        let open = app.limiter.connections.open(&account.principal)?;
        Ok(Self {
            digest: hash_key(token),
            account,
            changes,
            _open: open,
        })
    }

    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// Authorizes the key again, as the route's check does (401, 402, 403).
    pub async fn current(&mut self, accounts: &Accounts) -> Result<Arc<Account>, AccountError> {
        let account = accounts
            .authorize_digest(self.digest, Scope::ResponsesWrite)
            .await?;
        self.account = account.clone();
        Ok(account)
    }

    /// Resolves when a change may concern this key, with how long to wait
    /// before checking again (0 for this key's own; up to [`SPREAD`] for
    /// one that concerns every key). Cancel-safe.
    pub async fn changed(&mut self) -> Duration {
        loop {
            match self.changes.recv().await {
                Ok(Invalidation::Key(digest)) if digest == self.digest => return Duration::ZERO,
                Ok(Invalidation::Key(_)) => {}
                // A holder that fell behind may have missed its own.
                Ok(Invalidation::All) | Err(RecvError::Lagged(_)) => {
                    return rand::rng().random_range(Duration::ZERO..SPREAD)
                }
                // No more changes (the process is ending).
                Err(RecvError::Closed) => std::future::pending().await,
            }
        }
    }
}

/// The close reason when a refusal ends the connection (1008): the key is
/// no longer valid, or its organisation is blocked. Other refusals (a
/// store outage, a missing permission) refuse the turn only.
pub(super) fn ends_connection(e: &AccountError) -> Option<&'static str> {
    match e {
        AccountError::InvalidKey => Some("api key no longer valid"),
        AccountError::Blocked { .. } => Some("organization blocked"),
        _ => None,
    }
}

/// The connection's conversation on the operator's gauges
/// (`gateway_websocket_conversations`, `..._items`, by organisation).
pub(super) struct HeldConversation {
    conversations: IntGauge,
    items: IntGauge,
    held: Option<usize>,
}

impl HeldConversation {
    pub fn new(org: &str) -> Self {
        Self {
            conversations: METRICS.websocket_conversations.with_label_values(&[org]),
            items: METRICS
                .websocket_conversation_items
                .with_label_values(&[org]),
            held: None,
        }
    }

    /// The connection now holds a conversation of `items` input items.
    pub fn hold(&mut self, items: usize) {
        match self.held.replace(items) {
            None => self.conversations.inc(),
            Some(before) => self.items.sub(before as i64),
        }
        self.items.add(items as i64);
    }
}

impl Drop for HeldConversation {
    fn drop(&mut self) {
        if let Some(items) = self.held {
            self.conversations.dec();
            self.items.sub(items as i64);
        }
    }
}
