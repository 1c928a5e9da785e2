//! The worker protocol, generated from `inference/v1/worker.proto`, and
//! the model table both sides read.
//!
//! The gateway is the client, each model worker a server. The package is
//! versioned; changes are additive only.

pub mod codec;
pub mod engine_timing;
pub mod limits;
pub mod models;
pub mod prefix;

pub mod v1 {
    tonic::include_proto!("inference.v1");

    /// gRPC metadata key that carries an [`ErrorReason`] name on a failed call.
    pub const ERROR_REASON_METADATA: &str = "x-error-reason";
}
