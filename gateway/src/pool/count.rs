//! What a Messages request asks of the pool besides a generation: the
//! workers' context window, and `CountTokens` on a worker of the pool: the prompt of a request as the
//! model's own tokenizer and template count it, without generating
//! (`POST /v1/messages/count_tokens`). Cheap and stateless on the worker,
//! so it takes no queue turn and no slot; a worker that fails is skipped
//! as a generation's start skips it.

use super::{call_metadata, classify, PoolError, WorkerPool, MAX_ATTEMPTS};
use crate::metrics::METRICS;
use inference_proto::v1 as pb;
use rand::seq::SliceRandom;
use telemetry::TraceParent;

impl WorkerPool {
    /// The smallest context window the pool's workers reported: a small
    /// real model's window is below the catalogue's (the Messages route
    /// clamps `max_tokens` to it).
    pub fn context_window(&self) -> Option<u32> {
        self.snapshot()
            .iter()
            .filter_map(|e| e.context_window())
            .min()
    }

    /// The prompt tokens `request` would be billed for.
    pub async fn count_tokens(
        &self,
        request: &pb::GenerateRequest,
        trace: &TraceParent,
    ) -> Result<u32, PoolError> {
        let metadata = call_metadata(request, trace, &self.auth);
        let endpoints = self.snapshot();
        let mut candidates: Vec<usize> = (0..endpoints.len())
            .filter(|i| endpoints[*i].is_available())
            .collect();
        candidates.shuffle(&mut rand::rng());
        let mut last_error = None;
        for &i in candidates.iter().take(MAX_ATTEMPTS) {
            let endpoint = &endpoints[i];
            let mut call = tonic::Request::new(request.clone());
            *call.metadata_mut() = metadata.clone();
            match endpoint.client().count_tokens(call).await {
                Ok(reply) => return Ok(reply.into_inner().prompt_tokens),
                Err(status) => {
                    let failure = classify(&status);
                    METRICS
                        .worker_errors
                        .with_label_values(&[&self.model, failure.reason, failure.class()])
                        .inc();
                    if failure.worker_fault {
                        endpoint.record_failure();
                    }
                    if !failure.try_elsewhere {
                        return Err(failure.error);
                    }
                    last_error = Some(failure.error);
                }
            }
        }
        Err(match last_error {
            Some(e @ (PoolError::WorkerTimeout | PoolError::WorkerFailed)) => e,
            _ => PoolError::NoWorkerAvailable {
                model: self.model.clone(),
            },
        })
    }
}
