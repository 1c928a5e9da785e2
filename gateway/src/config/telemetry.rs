//! `[telemetry]`: where spans are exported.

use serde::Deserialize;

/// Distributed tracing (`[telemetry]`). Every request gets a `tracing`
/// span and a W3C trace context sent to its worker; spans are exported
/// over OTLP/gRPC only when an endpoint is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317`; absent =
    /// export nothing. Env: `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of exported spans. Env: `OTEL_SERVICE_NAME`.
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: default_service_name(),
        }
    }
}

impl TelemetryConfig {
    /// The standard OpenTelemetry variables override the file.
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) {
        if let Some(v) = get(telemetry::OTLP_ENDPOINT_ENV) {
            self.otlp_endpoint = Some(v).filter(|s| !s.trim().is_empty());
        }
        if let Some(v) = get(telemetry::SERVICE_NAME_ENV).filter(|s| !s.trim().is_empty()) {
            self.service_name = v;
        }
    }
}

fn default_service_name() -> String {
    "gateway".into()
}
