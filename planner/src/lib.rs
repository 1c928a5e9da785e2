//! Planner mode: a chat request with `planner_mode: true` is answered by a
//! plan over A2A agents, the caller's function tools and model calls (see
//! [`run`] for a run's life).
//!
//! The crate stands alone: its host (the gateway) implements the
//! [`ports`] — the model calls, the session store, the stored directory
//! entries — and turns the run's [`Event`]s and [`Ending`] into its wire
//! format. Inside: [`run`] (the outline and its phases), [`agents`] (the
//! directory: entries, cards, discovery), [`a2a`] (the A2A client),
//! [`net`] (the agents' HTTP: address policy, deadlines, size caps).

pub mod a2a;
pub mod agents;
pub mod config;
pub mod ids;
pub mod metrics;
pub mod net;
pub mod ports;
pub mod run;
pub mod text;

pub use config::PlannerConfig;
pub use run::{
    Answer, Begun, Ending, Event, PendingCall, Planner, RunError, RunInput, RunStateBox,
    SessionError, SessionLock, Start, ToolResult, ToolThought, Turn,
};
