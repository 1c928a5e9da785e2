//! Checks a finished reply against the output format the caller asked for.
//!
//! The worker constrains its output, but the gateway does not take that on
//! trust: a reply that claims to be finished (`stop`) yet does not parse, or
//! does not validate against the requested JSON Schema, is a server-side
//! failure — logged, counted, and reported as a 500, never passed on as a
//! success. A reply cut by a token limit (`length`) is incomplete by nature
//! and is passed on with that finish reason.

use crate::error::ApiError;
use crate::metrics::METRICS;
use serde_json::Value;

/// The output format a request asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum OutputFormat {
    #[default]
    Text,
    JsonObject,
    JsonSchema(Value),
}

/// Validates `text` (the visible reply) when the generation finished normally.
pub fn check(format: &OutputFormat, text: &str, model: &str) -> Result<(), ApiError> {
    let problem = match format {
        OutputFormat::Text => None,
        OutputFormat::JsonObject => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(_)) => None,
            Ok(_) => Some("the reply is JSON but not an object".to_string()),
            Err(e) => Some(format!("the reply is not valid JSON: {e}")),
        },
        OutputFormat::JsonSchema(schema) => match serde_json::from_str::<Value>(text) {
            Err(e) => Some(format!("the reply is not valid JSON: {e}")),
            Ok(instance) => match crate::schema_cache::compiled_schema(schema) {
                // Validation already compiled this schema; failing here is ours.
                Err(e) => Some(format!("the schema could not be compiled: {e}")),
                // Where, not what: the error's own text quotes the output,
                // and this message is logged (with the request's failure).
                Ok(v) => v.validate(&instance).err().map(|e| {
                    tracing::debug!(model, "the reply violates its schema: {e}");
                    format!(
                        "the reply violates the schema at '{}' (rule '{}')",
                        e.instance_path(),
                        e.schema_path()
                    )
                }),
            },
        },
    };
    match problem {
        None => Ok(()),
        Some(detail) => {
            METRICS
                .worker_errors
                .with_label_values(&[model, "output_validation", "fault"])
                .inc();
            // Never the output itself above debug (see above).
            tracing::error!(model, "structured output check failed: {detail}");
            Err(ApiError::new(
                500,
                "output_validation_failed",
                format!("The model's output did not match the requested format ({detail}). Retry the request."),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_never_checked() {
        assert!(check(&OutputFormat::Text, "not json", "base").is_ok());
    }

    #[test]
    fn json_object_must_be_an_object() {
        assert!(check(&OutputFormat::JsonObject, r#"{"a":1}"#, "base").is_ok());
        let e = check(&OutputFormat::JsonObject, "[1]", "base").unwrap_err();
        assert_eq!(
            (e.status, e.code.as_ref()),
            (500, "output_validation_failed")
        );
        assert!(check(&OutputFormat::JsonObject, "{", "base").is_err());
    }

    #[test]
    fn json_schema_violations_are_server_errors() {
        let schema = json!({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false});
        let f = OutputFormat::JsonSchema(schema);
        assert!(check(&f, r#"{"n":3}"#, "base").is_ok());
        let e = check(&f, r#"{"n":"three"}"#, "base").unwrap_err();
        assert_eq!(e.status, 500);
        assert!(e.message.contains("/n"), "{}", e.message);
        // The message is logged with the failure: it never quotes the output.
        assert!(!e.message.contains("three"), "{}", e.message);
        assert!(check(&f, r#"{"n":3,"x":1}"#, "base").is_err());
    }
}
