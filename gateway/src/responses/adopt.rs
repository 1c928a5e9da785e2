//! Adopting a background run another replica handed over while draining
//! (`runs/handover.rs`): the sweeper took its record and renewed its lease for
//! this replica; the adopter makes this replica its owner and runs the
//! generation under the key that created it, continuing the run's event
//! log where the first owner stopped. It continues the admitted request:
//! the plan's limits never refuse it (a revoked key or a blocked
//! organisation does), and it is billed as one request with one input
//! (`Limiter::take_over`). It enters the Responses path there, admitted
//! already ([`Admitted::detach`]): the same background run a create
//! detaches.
//!
//! A run handed over before its worker started runs from the start. One
//! handed over mid-generation carries what its log holds (`resume` in the
//! worker request): a worker continues that output, the way a generation
//! moves off a failed worker, and the log goes on from the open item, so a
//! follower reads one reply. Restarting under output a follower may have
//! read would show it two different replies, so a run whose log holds
//! output the record does not account for (a hand-over racing the first
//! event, or a log that disagrees with it) ends `incomplete` with what its
//! log holds, as the drain's cut would have.

use super::{Admitted, Services};
use crate::accounts::cache::Accounts;
use crate::api::event_log::fold_to_continue;
use crate::api::responses::{IncompleteDetails, OutputItem, ResponseObject, ResponseStatus};
use crate::catalog::Catalog;
use crate::lifecycle::Shutdown;
use crate::limits::Limiter;
use crate::metrics::METRICS;
use crate::pool::Pools;
use crate::runs::background::Origin;
use crate::runs::handover::HandOver;
use crate::runs::{Adoption, Runs, REPLICA_SHUTDOWN};
use crate::store::{EndedBy, StoreResult};
use crate::translate::responses::ResponseEncoder;
use std::sync::Arc;
use std::time::Duration;

/// Most events of an opened log read to find where it ends.
const LOG_READ: usize = 10_000;

/// The events a run's log holds before any output.
const OPENING_EVENTS: [&str; 3] = [
    "response.created",
    "response.queued",
    "response.in_progress",
];

/// What an adopted run needs from the rest of the gateway.
pub struct Adopter {
    pub runs: Arc<Runs>,
    pub pools: Arc<Pools>,
    pub accounts: Arc<Accounts>,
    pub limiter: Arc<Limiter>,
    pub catalog: Catalog,
    pub shutdown: Arc<Shutdown>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
}

impl Adopter {
    fn services(&self) -> Services<'_> {
        Services {
            catalog: &self.catalog,
            pools: &self.pools,
            limiter: &self.limiter,
            runs: &self.runs,
            shutdown: &self.shutdown,
            max_body_bytes: self.max_body_bytes,
            request_timeout: self.request_timeout,
        }
    }

    /// Runs every run the sweeper adopts, each on its own task, until the
    /// process ends.
    pub async fn serve(self: Arc<Self>) {
        let Some(mut adoptions) = self.runs.adoptions() else {
            return;
        };
        while let Some(adoption) = adoptions.recv().await {
            tokio::spawn(self.clone().adopt(adoption));
        }
    }

    async fn adopt(self: Arc<Self>, Adoption { id, record }: Adoption) {
        if let Err(e) = self.try_adopt(&id, &record).await {
            // The lease this replica took lapses unrenewed (ownership is
            // dropped) and a sweeper ends the run: nothing stays running.
            tracing::warn!(response_id = %id, "could not adopt a handed-over run: {e}");
        }
    }

    async fn try_adopt(&self, id: &str, record: &str) -> StoreResult<()> {
        let adoptable = HandOver::decode(record);
        let timeout = adoptable
            .as_ref()
            .map(|a| a.timeout)
            .unwrap_or(self.runs.lease);
        let run = self.runs.own(id, timeout);
        let store = &self.runs.store;
        let Some(mut object) = store.object(id).await? else {
            // Deleted meanwhile.
            let _ = store.release_lease(id).await;
            return Ok(());
        };
        if object.is_terminal() {
            let _ = store.release_lease(id).await;
            return Ok(());
        }
        let log = store.read_events(id, None, LOG_READ).await?;
        let has_output = log
            .iter()
            .any(|e| !OPENING_EVENTS.contains(&e.name.as_str()));
        let continued = adoptable.as_ref().ok().and_then(|a| a.work.resume.as_ref());
        let last_open = match (has_output, continued) {
            (false, None) => false,
            (true, Some(resume)) => match continuation(&log, resume) {
                Some((output, last_open)) => {
                    object.output = output;
                    last_open
                }
                None => return self.end_incomplete(id, object).await,
            },
            _ => return self.end_incomplete(id, object).await,
        };
        let next_seq = log.last().map_or(0, |e| e.seq + 1);
        let adoptable = match adoptable {
            Ok(a) => a,
            Err(what) => {
                return self
                    .give_up(id, format!("its hand-over record did not read ({what})"))
                    .await
            }
        };
        // A revoked key or a blocked organisation stops the run, as it
        // stops any request; the plan's limits do not (see below).
        let account = match self.accounts.by_digest(adoptable.key_digest).await {
            Ok(account) => account,
            Err(e) => {
                return self
                    .give_up(id, format!("its key is no longer usable ({e:?})"))
                    .await
            }
        };
        if let Err(e) = account.check_org() {
            return self
                .give_up(id, format!("its organisation is blocked ({e:?})"))
                .await;
        }
        let Some(model) = self.catalog.find(&object.model) else {
            return self
                .give_up(id, format!("model '{}' is not served here", object.model))
                .await;
        };
        // The run goes on as the request that was admitted: one request,
        // its input billed once, never refused by the plan's limits. A
        // request id of its own all the same: the first owner's hold
        // settled under the original one, and a settlement is once per
        // request id.
        let mut work = adoptable.work;
        work.request_id = format!("{}-adopted", work.request_id);
        let request_id = work.request_id.clone();
        let reservation = match self
            .limiter
            .take_over(
                &account,
                model,
                request_id,
                adoptable.input_estimate,
                adoptable.max_output_tokens,
                // Started on the first owner, which billed the request and
                // its input (`resume` is what it delivered).
                work.resume.is_some(),
            )
            .await
        {
            Ok(reservation) => reservation,
            Err(refusal) => {
                return self
                    .give_up(id, format!("its limits could not be held ({refusal:?})"))
                    .await
            }
        };
        METRICS.runs_adopted.inc();
        tracing::info!(
            response_id = %id,
            continued = has_output,
            "adopted a handed-over background run"
        );
        let encoder =
            ResponseEncoder::resume(object, adoptable.format.clone(), next_seq, last_open);
        let origin = Origin {
            key_digest: adoptable.key_digest,
            format: adoptable.format,
            input_estimate: adoptable.input_estimate,
            max_output_tokens: adoptable.max_output_tokens,
        };
        let admitted = Admitted {
            reservation,
            model,
            work,
            tier: adoptable.tier,
            trace: adoptable.trace,
        };
        admitted
            .detach(&self.services(), run, encoder, origin, timeout, true)
            .drive()
            .await;
        Ok(())
    }

    /// Ends the run `incomplete` with what its log holds: its output cannot
    /// be continued.
    async fn end_incomplete(&self, id: &str, mut object: ResponseObject) -> StoreResult<()> {
        let store = &self.runs.store;
        object.end(ResponseStatus::Incomplete);
        object.incomplete_details = Some(IncompleteDetails {
            reason: REPLICA_SHUTDOWN.into(),
        });
        // Folds the log into the object and appends the terminal event.
        store.terminate(id, &mut object, EndedBy::Sweeper).await?;
        let _ = store.release_lease(id).await;
        Ok(())
    }

    /// The run cannot be run here: it fails now (`replica_shutdown`) rather
    /// than wait for a sweep.
    async fn give_up(&self, id: &str, why: String) -> StoreResult<()> {
        tracing::warn!(response_id = %id, "a handed-over run could not be resumed: {why}");
        let message = format!(
            "The gateway replica running this response shut down, and the replica that took \
             it over could not resume it: {why}. Create the response again."
        );
        if self.runs.fail(id, REPLICA_SHUTDOWN, &message).await? {
            let _ = self.runs.store.release_lease(id).await;
        }
        Ok(())
    }
}

/// The output items of a log cut mid-generation, and whether its last item
/// is open, when they are exactly the output `resume` continues: the
/// reasoning, the text and the tool calls the worker will be told were
/// delivered. `None` when they differ (a last write that never landed):
/// continuing would show a follower a reply with a seam in it.
fn continuation(
    log: &[crate::api::responses::EncodedEvent],
    resume: &inference_proto::v1::Resume,
) -> Option<(Vec<OutputItem>, bool)> {
    let (output, last_open) = fold_to_continue(log)?;
    let mut reasoning = String::new();
    let mut text = String::new();
    let mut calls = Vec::new();
    for item in &output {
        match item {
            OutputItem::Reasoning { summary, .. } => {
                summary.iter().for_each(|p| reasoning.push_str(&p.text))
            }
            OutputItem::Message { content, .. } => {
                content.iter().for_each(|p| text.push_str(&p.text))
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => calls.push((call_id.as_str(), name.as_str(), arguments.as_str())),
        }
    }
    let resumed_calls: Vec<(&str, &str, &str)> = resume
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    (reasoning == resume.reasoning && text == resume.text && calls == resumed_calls)
        .then_some((output, last_open))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::event_log::test_log::open_message;
    use inference_proto::v1 as pb;

    #[test]
    fn a_log_continues_when_it_holds_exactly_what_the_record_resumes() {
        let resume = pb::Resume {
            text: "Once upon".into(),
            completion_tokens: 2,
            ..Default::default()
        };
        let log = open_message(&["Once", " upon"]);
        let (output, last_open) = continuation(&log, &resume).expect("continues");
        assert!(last_open);
        assert_eq!(output.len(), 1);
        assert_eq!(output[0].id(), "msg_1", "the open item goes on");
    }

    #[test]
    fn a_log_that_disagrees_with_the_record_is_not_continued() {
        let log = open_message(&["Once", " upon"]);
        for text in ["Once", "Once upon a time", ""] {
            let resume = pb::Resume {
                text: text.into(),
                ..Default::default()
            };
            assert!(continuation(&log, &resume).is_none(), "{text:?}");
        }
    }
}
