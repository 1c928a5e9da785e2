//! Worker pools, one per model: connections, selection, and the call that
//! retries on another worker until the first event arrives.
//!
//! After the first event a generation is committed to its worker: a failure
//! then reaches the client as an error frame, never as a silent retry (the
//! client already saw tokens).

mod endpoint;

pub use endpoint::WorkerEndpoint;

use crate::error::ApiError;
use crate::metrics::METRICS;
use inference_proto::v1 as pb;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Code, Status, Streaming};

/// All pools, by model id.
pub struct Pools {
    by_model: HashMap<String, Arc<WorkerPool>>,
}

impl Pools {
    pub fn new(models: impl IntoIterator<Item = (String, Vec<String>)>) -> anyhow::Result<Self> {
        let mut by_model = HashMap::new();
        for (model, addrs) in models {
            let endpoints = addrs
                .iter()
                .map(|a| WorkerEndpoint::new(a).map(Arc::new))
                .collect::<anyhow::Result<Vec<_>>>()?;
            by_model.insert(model.clone(), Arc::new(WorkerPool { model, endpoints }));
        }
        Ok(Self { by_model })
    }

    pub fn get(&self, model: &str) -> Option<&Arc<WorkerPool>> {
        self.by_model.get(model)
    }
}

/// The workers of one model.
pub struct WorkerPool {
    model: String,
    endpoints: Vec<Arc<WorkerEndpoint>>,
}

/// A running generation: the first event (already received) and the rest.
pub struct WorkerCall {
    pub first: pb::GenerateEvent,
    pub rest: Streaming<pb::GenerateEvent>,
    /// Holds the worker's in-flight slot until the call is dropped.
    _slot: endpoint::InflightSlot,
}

/// How many distinct workers one request may try before the first token.
const MAX_ATTEMPTS: usize = 3;
/// How long to wait for a worker to accept a call and send its first event
/// is bounded by the request deadline; connecting is bounded separately.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

impl WorkerPool {
    /// Starts a generation on the best available worker, retrying elsewhere
    /// on worker faults until the first event has arrived.
    pub async fn generate(&self, request: pb::GenerateRequest) -> Result<WorkerCall, ApiError> {
        let mut tried: Vec<usize> = Vec::with_capacity(MAX_ATTEMPTS);
        let mut last_error: Option<ApiError> = None;
        while tried.len() < MAX_ATTEMPTS.min(self.endpoints.len()) {
            let Some(index) = self.pick(&tried) else {
                break;
            };
            tried.push(index);
            let endpoint = &self.endpoints[index];
            let slot = endpoint.acquire();
            match Self::start(endpoint, request.clone()).await {
                Ok((first, rest)) => {
                    endpoint.record_success();
                    return Ok(WorkerCall {
                        first,
                        rest,
                        _slot: slot,
                    });
                }
                Err(status) => {
                    let failure = classify(&status);
                    METRICS
                        .worker_errors
                        .with_label_values(&[&self.model, failure.reason])
                        .inc();
                    if failure.worker_fault {
                        endpoint.record_failure();
                    }
                    if !failure.try_elsewhere {
                        return Err(failure.error);
                    }
                    tracing::warn!(model = %self.model, worker = %endpoint.addr(), reason = failure.reason, "worker call failed before the first token; trying another");
                    last_error = Some(failure.error);
                }
            }
        }
        Err(match last_error {
            Some(e) if e.status == 502 => e,
            _ => ApiError::overloaded(format!(
                "No worker of model '{}' is available right now; retry shortly.",
                self.model
            )),
        })
    }

    async fn start(
        endpoint: &WorkerEndpoint,
        request: pb::GenerateRequest,
    ) -> Result<(pb::GenerateEvent, Streaming<pb::GenerateEvent>), Status> {
        let mut client = endpoint.client();
        let mut rest = client.generate(request).await?.into_inner();
        match rest.message().await? {
            Some(first) => Ok((first, rest)),
            None => Err(Status::internal("worker ended the stream without an event")),
        }
    }

    /// Power of two choices over in-flight requests, among healthy workers
    /// not yet tried. Ejected workers are used only when nothing else is left.
    fn pick(&self, tried: &[usize]) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.endpoints.len())
            .filter(|i| !tried.contains(i))
            .collect();
        let healthy: Vec<usize> = candidates
            .iter()
            .copied()
            .filter(|&i| self.endpoints[i].is_available())
            .collect();
        let set = if healthy.is_empty() {
            &candidates
        } else {
            &healthy
        };
        match set.len() {
            0 => None,
            1 => Some(set[0]),
            n => {
                use rand::Rng;
                let mut rng = rand::rng();
                let a = set[rng.random_range(0..n)];
                let mut b = set[rng.random_range(0..n - 1)];
                if b == a {
                    b = set[n - 1];
                }
                Some(
                    if self.endpoints[a].inflight() <= self.endpoints[b].inflight() {
                        a
                    } else {
                        b
                    },
                )
            }
        }
    }
}

/// What a failed worker call means for the client and for the worker.
pub struct Failure {
    pub error: ApiError,
    /// Another worker may succeed (overload, draining, connection failure).
    pub try_elsewhere: bool,
    /// Counts against the worker's health. Client errors never do.
    pub worker_fault: bool,
    pub reason: &'static str,
}

/// Maps a worker's gRPC status to the public error and the retry decision.
pub fn classify(status: &Status) -> Failure {
    let reason = status
        .metadata()
        .get(pb::ERROR_REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(pb::ErrorReason::from_str_name);
    match (reason, status.code()) {
        (Some(pb::ErrorReason::ContextLengthExceeded), _) => Failure {
            error: ApiError::new(400, "context_length_exceeded", status.message().to_owned())
                .with_param("messages"),
            try_elsewhere: false,
            worker_fault: false,
            reason: "context_length_exceeded",
        },
        (Some(pb::ErrorReason::InvalidRequest), _) | (None, Code::InvalidArgument) => Failure {
            error: ApiError::invalid_value("messages", status.message().to_owned()),
            try_elsewhere: false,
            worker_fault: false,
            reason: "invalid_request",
        },
        (Some(pb::ErrorReason::Overloaded), _) | (None, Code::ResourceExhausted) => Failure {
            error: ApiError::overloaded("The model is at capacity; retry shortly."),
            try_elsewhere: true,
            worker_fault: false,
            reason: "overloaded",
        },
        (Some(pb::ErrorReason::Draining), _) => Failure {
            error: ApiError::overloaded("The worker is restarting; retry shortly."),
            try_elsewhere: true,
            worker_fault: false,
            reason: "draining",
        },
        (_, Code::Unavailable) | (_, Code::Cancelled) => Failure {
            error: ApiError::overloaded("The model's workers are unreachable; retry shortly."),
            try_elsewhere: true,
            worker_fault: true,
            reason: "unavailable",
        },
        (_, Code::DeadlineExceeded) => Failure {
            error: ApiError::timeout("The worker did not answer in time."),
            try_elsewhere: true,
            worker_fault: true,
            reason: "deadline",
        },
        _ => Failure {
            error: ApiError::upstream("The model worker failed; retry with backoff."),
            try_elsewhere: true,
            worker_fault: true,
            reason: "engine_failure",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn with_reason(code: Code, reason: &'static str) -> Status {
        let mut s = Status::new(code, "x");
        s.metadata_mut().insert(
            pb::ERROR_REASON_METADATA,
            MetadataValue::from_static(reason),
        );
        s
    }

    #[test]
    fn context_length_is_a_client_error_not_retried() {
        let f = classify(&with_reason(
            Code::InvalidArgument,
            "CONTEXT_LENGTH_EXCEEDED",
        ));
        assert_eq!(
            (f.error.status, f.error.code.as_ref()),
            (400, "context_length_exceeded")
        );
        assert!(!f.try_elsewhere && !f.worker_fault);
    }

    #[test]
    fn overload_and_unreachable_try_elsewhere() {
        let f = classify(&with_reason(Code::ResourceExhausted, "OVERLOADED"));
        assert!(f.try_elsewhere && !f.worker_fault);
        assert_eq!(f.error.status, 503);
        let f = classify(&Status::unavailable("connection refused"));
        assert!(f.try_elsewhere && f.worker_fault);
        let f = classify(&Status::internal("boom"));
        assert_eq!(f.error.status, 502);
    }
}
