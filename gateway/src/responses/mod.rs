//! The request path of a Responses create, whatever the transport: a
//! `POST /v1/responses` body, a WebSocket `response.create` message, a
//! compaction's summary pass, or a background run a peer replica handed
//! over. It sits below `routes/` and knows no HTTP (`http/`) nor any route:
//! a route keeps only its transport (reading the request, the sink its
//! events go to, how a refusal and the end are written).
//!
//! In order:
//! 1. [`check`]: the body parsed and validated, the key allowed its model,
//!    the model served; then [`prepare`]: its conversation assembled and
//!    resolved (`conversation.rs`).
//! 2. [`admit`] under the plan's limits: a reservation or a refusal (a
//!    route answering over HTTP asks either for its rate headers).
//! 3. [`start`]: the worker request and its affinity, the response object,
//!    the stored run when it is stored.
//! 4. [`Run::drive`]: the one generation driver over the transport's
//!    [`ResponseSink`], then the one ending: the end folded (finished,
//!    failed, refused, gone, or cut by the drain), stored first, the
//!    idempotency outcome kept ([`KeepOutcome`]), then the held end
//!    released. Or [`Run::detach`]: a background run, which goes on
//!    without its client; a run adopted from a peer (`adopt.rs`) enters
//!    there, admitted already ([`Admitted::detach`]).

pub mod adopt;
mod conversation;
mod prepare;
mod run;

pub use prepare::{check, check_request, prepare, Checked, Prepared};
pub use run::{
    admit, start, warm_up, Admitted, Ended, KeepOutcome, NoKey, Request, ResponseSink, Run, Started,
};

use crate::catalog::Catalog;
use crate::lifecycle::Shutdown;
use crate::limits::Limiter;
use crate::pool::Pools;
use crate::runs::Runs;
use std::sync::Arc;
use std::time::Duration;

/// What the Responses path uses of the gateway (borrowed from the
/// composition root, which this module does not see).
#[derive(Clone, Copy)]
pub struct Services<'a> {
    pub catalog: &'a Catalog,
    pub pools: &'a Arc<Pools>,
    pub limiter: &'a Arc<Limiter>,
    /// The runs this replica owns, and their store (stored responses).
    pub runs: &'a Arc<Runs>,
    pub shutdown: &'a Arc<Shutdown>,
    /// The largest request body: also what an input's references may copy.
    pub max_body_bytes: usize,
    /// Upper bound on a generation, first event included.
    pub request_timeout: Duration,
}
