//! Active health checking: every interval, each worker gets a
//! `grpc.health.v1` check and an `Info` call (load and draining state),
//! each bounded by a timeout. A worker that fails the check leaves
//! selection until it passes again.

use super::endpoint::{Resumes, WorkerEndpoint};
use inference_proto::v1 as pb;
use std::time::Duration;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

pub const CHECK_TIMEOUT: Duration = Duration::from_millis(800);

/// Checks one worker and records the outcome on it. `grpc.health.v1` is
/// open on a worker (a kubelet probe cannot authenticate); `Info` carries
/// the worker token.
pub async fn check(endpoint: &WorkerEndpoint, auth: &super::WorkerAuth) {
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
        let mut request = tonic::Request::new(pb::InfoRequest {});
        if let Some(value) = auth {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let reply = pb::worker_client::WorkerClient::new(endpoint.probe_channel())
            .info(request)
            .await
            .ok()?;
        let info = reply.into_inner();
        if let Some(prefixes) = &info.prefix_cache {
            endpoint.prefixes().record_report(prefixes);
        }
        endpoint.record_sampling_defaults(info.sampling_defaults);
        let resumes =
            info.capabilities
                .map_or(Resumes::Nothing, |c| match (c.resume, c.resume_any) {
                    (false, _) => Resumes::Nothing,
                    (true, false) => Resumes::TextAnswers,
                    (true, true) => Resumes::Anything,
                });
        endpoint.record_resumes(resumes);
        endpoint.record_context_window(info.context_window);
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
