//! Plan limits per organisation and model: requests per minute, tokens per
//! minute (input plus output) and concurrent requests.
//!
//! Two stages:
//! 1. [`local`]: what this process already knows: the request window's
//!    reset from the global stage's last refusal, and an in-flight counter
//!    sized at the plan's full allowance; so it never refuses what the
//!    global stage would admit (one replica may legitimately take
//!    everything), and its refusals carry the global stage's reset.
//! 2. The global truth, a [`LimitStore`]: atomic Lua scripts in Redis
//!    ([`redis_lua`]), one round trip to admit and one to settle, exact
//!    across replicas; or, without Redis, the in-process [`memory`] store
//!    with the same semantics.
//!
//! Tokens are reserved on admission (input estimate plus `max_tokens`, or
//! the plan's default) and settled to real usage when the request ends. The
//! [`Reservation`] guard settles on drop, so a request abandoned anywhere
//! (client gone, task dropped) cannot leak its reservation or its
//! concurrency slot. A slot is also a lease its replica renews while the
//! request runs ([`slots`]): a replica that dies frees its slots within
//! one lease.
//!
//! When Redis cannot be reached, `limits.on_store_failure` decides:
//! `fail_open_local` (default) admits under this replica's in-process
//! limits; `fail_closed` answers 503.
//!
//! One file per job: `store.rs` is the stores' contract (what they are
//! asked and answer, and a settlement retried until it lands);
//! `limiter.rs` the [`Limiter`], which asks them and keeps the slot
//! heartbeat; `gate.rs` admission ([`Limiter::admit_request`]);
//! `reservation.rs` an admitted request's hold and its settlement;
//! `refusal.rs` what a refused one is told (each keeps the window state
//! its `x-ratelimit-*` headers are made of); `connections.rs` the cap on
//! a key's open WebSocket connections. Cost is
//! [`crate::usage::cost_nano`]'s.

pub mod connections;
mod gate;
pub mod headers;
mod limiter;
pub mod local;
pub mod memory;
pub mod redis_lua;
mod refusal;
mod reservation;
pub mod slots;
mod store;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod tests_shared;

pub use crate::accounts::RatePlan;
pub use crate::usage::TokenUsage;
pub use connections::{Connections, OpenConnection, TooManyConnections};
pub use gate::{estimate_input_tokens, FALLBACK_MAX_TOKENS};
pub use limiter::Limiter;
pub use refusal::{RateLimited, Refusal, Refused};
pub use reservation::{Outcome, Reservation};
pub use store::{Admission, AdmitRequest, LimitStore, Settlement, Verdict, WINDOW_MS};
