//! A background run handed from a draining replica to a live one: the
//! record the owner leaves in the store beside the run, so that a peer can
//! run the same generation without the request that created it.
//!
//! The record is a store format (internal, never on the wire): the worker
//! request as the owner translated it (protobuf, hex), and what admission,
//! billing and the run's encoder need. A run handed over before its worker
//! started has no output and runs from the start; one handed over when the
//! grace period ran out carries the output its log holds as the request's
//! `resume` (billed by the owner), and the adopter's worker continues it
//! (`adopt.rs`).

use crate::accounts::ServiceTier;
use crate::output_check::OutputFormat;
use inference_proto::v1 as pb;
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// What a peer needs to run a handed-over background run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandOver {
    /// The creating key's sha256 (hex, as the key store keys it): the
    /// adopter admits and bills the run under the same account.
    pub key_digest: String,
    /// The worker request (`GenerateRequest`, protobuf, hex).
    pub work: String,
    /// `text.format` as the run's output check applies it.
    pub format: FormatRecord,
    /// Admission's input estimate and output allowance.
    pub input_estimate: u64,
    pub max_output_tokens: u32,
    /// The service tier the run was admitted at.
    pub tier: String,
    /// The whole run's time bound.
    pub timeout_ms: u64,
    /// The creating request's trace context (`traceparent`).
    pub traceparent: String,
}

/// [`OutputFormat`] as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FormatRecord {
    Text,
    JsonObject,
    JsonSchema { schema: Value },
}

impl From<&OutputFormat> for FormatRecord {
    fn from(f: &OutputFormat) -> Self {
        match f {
            OutputFormat::Text => Self::Text,
            OutputFormat::JsonObject => Self::JsonObject,
            OutputFormat::JsonSchema(schema) => Self::JsonSchema {
                schema: schema.clone(),
            },
        }
    }
}

impl From<FormatRecord> for OutputFormat {
    fn from(f: FormatRecord) -> Self {
        match f {
            FormatRecord::Text => Self::Text,
            FormatRecord::JsonObject => Self::JsonObject,
            FormatRecord::JsonSchema { schema } => Self::JsonSchema(schema),
        }
    }
}

/// What the adopter makes of a record; the run fails with the reason when
/// it cannot be read (a record of another version, a corrupt store).
pub struct Adoptable {
    pub key_digest: [u8; 32],
    pub work: pb::GenerateRequest,
    pub format: OutputFormat,
    pub input_estimate: u64,
    pub max_output_tokens: u32,
    pub tier: ServiceTier,
    pub timeout: Duration,
    pub trace: telemetry::TraceParent,
}

impl HandOver {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        key_digest: [u8; 32],
        work: &pb::GenerateRequest,
        format: &OutputFormat,
        input_estimate: u64,
        max_output_tokens: u32,
        tier: ServiceTier,
        timeout: Duration,
        trace: telemetry::TraceParent,
    ) -> Self {
        Self {
            key_digest: hex::encode(key_digest),
            work: hex::encode(work.encode_to_vec()),
            format: format.into(),
            input_estimate,
            max_output_tokens,
            tier: tier.as_str().to_owned(),
            timeout_ms: timeout.as_millis() as u64,
            traceparent: trace.to_string(),
        }
    }

    pub fn encode(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// Reads a stored record; `Err` names what did not read.
    pub fn decode(record: &str) -> Result<Adoptable, &'static str> {
        let r: HandOver = serde_json::from_str(record).map_err(|_| "record")?;
        let mut key_digest = [0u8; 32];
        hex::decode_to_slice(&r.key_digest, &mut key_digest).map_err(|_| "key digest")?;
        let bytes = hex::decode(&r.work).map_err(|_| "worker request")?;
        let work = pb::GenerateRequest::decode(bytes.as_slice()).map_err(|_| "worker request")?;
        Ok(Adoptable {
            key_digest,
            work,
            format: r.format.into(),
            input_estimate: r.input_estimate,
            max_output_tokens: r.max_output_tokens,
            tier: ServiceTier::parse(&r.tier).ok_or("tier")?,
            timeout: Duration::from_millis(r.timeout_ms),
            trace: telemetry::TraceParent::parse(r.traceparent.as_bytes()).ok_or("traceparent")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let work = pb::GenerateRequest {
            request_id: "req_1".into(),
            model: "base".into(),
            ..Default::default()
        };
        let trace = telemetry::TraceParent {
            trace_id: 0x1234,
            span_id: 0x56,
            flags: 1,
        };
        let format = OutputFormat::JsonSchema(serde_json::json!({"type": "object"}));
        let record = HandOver::new(
            [7; 32],
            &work,
            &format,
            11,
            7,
            ServiceTier::Default,
            Duration::from_secs(60),
            trace,
        );
        let read = HandOver::decode(&record.encode().unwrap()).unwrap();
        assert_eq!(read.key_digest, [7; 32]);
        assert_eq!(read.work, work);
        assert_eq!(read.format, format);
        assert_eq!((read.input_estimate, read.max_output_tokens), (11, 7));
        assert_eq!(read.tier, ServiceTier::Default);
        assert_eq!(read.timeout, Duration::from_secs(60));
        assert_eq!(read.trace, trace);
        assert!(HandOver::decode("{}").is_err());
    }
}
