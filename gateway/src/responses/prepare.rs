//! Step 1 of the path: a create checked ([`check`]), then its conversation
//! assembled and resolved ([`prepare`]).

use super::conversation::{conversation, Conversation};
use super::Services;
use crate::accounts::Account;
use crate::api::responses::{CreateResponseRequest, InputItem};
use crate::auth::Principal;
use crate::error::ApiError;
use crate::generation;
use crate::limits::estimate_input_tokens;
use crate::validate::responses::ValidResponseRequest;
use crate::{parse, validate};
use inference_proto::v1 as pb;

/// A create body parsed and validated, its model allowed for the key and
/// served by workers.
pub struct Checked {
    pub req: CreateResponseRequest,
    pub valid: ValidResponseRequest,
    /// Input tokens reserved on admission, from the body's size.
    pub input_estimate: u64,
    /// What the model's workers apply to sampling values left unset.
    pub sampling: pb::SamplingDefaults,
}

/// Parses and validates a create body (its model becomes `model_label`, the
/// metrics' label, as soon as it is known).
pub fn check(
    svc: &Services<'_>,
    account: &Account,
    body: &[u8],
    model_label: &mut &'static str,
) -> Result<Checked, ApiError> {
    let req: CreateResponseRequest = parse::json_body(body)?;
    check_request(
        svc,
        account,
        req,
        estimate_input_tokens(body.len()),
        model_label,
    )
}

/// Validates a create request (one parsed from a body, or one a route
/// builds: a compaction's summary pass), `input_estimate` its tokens as
/// the body's size tells.
pub fn check_request(
    svc: &Services<'_>,
    account: &Account,
    req: CreateResponseRequest,
    input_estimate: u64,
    model_label: &mut &'static str,
) -> Result<Checked, ApiError> {
    let valid = validate::responses::validate(svc.catalog, &req)?;
    *model_label = valid.model.id;
    account.check_model(valid.model.id)?;
    if valid.background && svc.shutdown.is_draining() {
        return Err(ApiError::overloaded(
            "This gateway replica is shutting down and takes no new background runs; retry.",
        ));
    }
    // A model without workers is refused before anything is stored.
    let sampling = generation::pool_of(svc.pools, valid.model.id)?.sampling_defaults();
    Ok(Checked {
        req,
        valid,
        input_estimate,
        sampling,
    })
}

/// A checked create with its conversation: ready to admit.
pub struct Prepared {
    pub req: CreateResponseRequest,
    pub valid: ValidResponseRequest,
    /// Input tokens to reserve: the body's estimate, or the resolved
    /// input's when references make it larger.
    pub input_estimate: u64,
    pub sampling: pb::SamplingDefaults,
    /// What the model is given: the chain's items, then this input.
    pub context: Vec<InputItem>,
    /// This request's items as stored and listed (references resolved).
    pub input_items: Vec<InputItem>,
}

/// The conversation of a checked create: the stored chain of its
/// `previous_response_id` (or `known`, the continued response's
/// conversation when the transport holds it: a WebSocket connection's
/// latest), then its input, resolved and bounded.
pub async fn prepare(
    svc: &Services<'_>,
    principal: &Principal,
    checked: Checked,
    known: Option<Vec<InputItem>>,
) -> Result<Prepared, ApiError> {
    let Checked {
        req,
        valid,
        input_estimate,
        sampling,
    } = checked;
    let Conversation {
        context,
        input_items,
        tokens,
    } = conversation(svc, principal, &req, &valid, known).await?;
    Ok(Prepared {
        req,
        valid,
        input_estimate: input_estimate.max(tokens),
        sampling,
        context,
        input_items,
    })
}
