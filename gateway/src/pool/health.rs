//! Active health checking: every interval, each worker gets a
//! `grpc.health.v1` check and an `Info` call (load and draining state),
//! each bounded by a timeout. A worker that fails the check leaves
//! selection until it passes again.

use super::endpoint::WorkerEndpoint;
use inference_proto::v1 as pb;
use std::time::Duration;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

pub const CHECK_TIMEOUT: Duration = Duration::from_millis(800);

/// Checks one worker and records the outcome on it.
pub async fn check(endpoint: &WorkerEndpoint) {
    let health = async {
        let mut client = HealthClient::new(endpoint.probe_channel());
        let reply = client
            .check(HealthCheckRequest {
                service: "inference.v1.Worker".into(),
            })
            .await
            .ok()?;
        Some(reply.into_inner().status == ServingStatus::Serving as i32)
    };
    let info = async {
        let reply = pb::worker_client::WorkerClient::new(endpoint.probe_channel())
            .info(pb::InfoRequest {})
            .await
            .ok()?;
        let info = reply.into_inner();
        let load = info.load.unwrap_or_default();
        Some((load.running, load.queued, load.capacity, info.draining))
    };
    let (serving, load) = tokio::join!(
        tokio::time::timeout(CHECK_TIMEOUT, health),
        tokio::time::timeout(CHECK_TIMEOUT, info)
    );
    let serving = serving.ok().flatten().unwrap_or(false);
    endpoint.record_check(serving, load.ok().flatten());
}
