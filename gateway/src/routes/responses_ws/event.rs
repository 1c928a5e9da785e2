//! Client events: one text message read into a [`ClientEvent`], and the
//! refusal of a binary one.

use crate::error::ApiError;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

/// A client event, its `type` read (and `generate`, which only this
/// transport has).
#[derive(Debug)]
pub(super) enum ClientEvent {
    /// `response.create`: the create body (without `type` and `generate`).
    Create { body: String, generate: bool },
    /// `response.processed`: the client consumed a response. Nothing to do.
    Processed,
}

/// The head of a client event.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: Option<String>,
    generate: Option<bool>,
}

/// Most top-level fields of one client event: the create body has about
/// fifty; more is a message built to cost work.
const MAX_FIELDS: usize = 256;

impl ClientEvent {
    /// Reads one text message. Failures are the 400s of a create body
    /// (`invalid_json`, `missing_required_parameter`, `invalid_value` with
    /// `param` `type`).
    pub(super) fn parse(text: &str) -> Result<ClientEvent, ApiError> {
        let head: Head = crate::parse::json_body(text.as_bytes())?;
        match head.kind.as_deref() {
            Some("response.create") => {}
            Some("response.processed") => return Ok(ClientEvent::Processed),
            Some(other) => {
                return Err(ApiError::invalid_value(
                    "type",
                    format!(
                    "Unknown client event type '{other}'; this connection takes 'response.create'."
                ),
                ))
            }
            None => return Err(ApiError::missing_parameter("type")),
        }
        let members: Members = serde_json::from_str(text)
            .map_err(|_| ApiError::invalid_value("body", too_many_fields()))?;
        let mut body = String::with_capacity(text.len());
        body.push('{');
        for (name, value) in members
            .0
            .iter()
            .filter(|(n, _)| n != "type" && n != "generate")
        {
            if body.len() > 1 {
                body.push(',');
            }
            // A key read from JSON encodes back to JSON.
            body.push_str(&serde_json::to_string(name).unwrap_or_default());
            body.push(':');
            body.push_str(value.get());
        }
        body.push('}');
        Ok(ClientEvent::Create {
            body,
            generate: head.generate.unwrap_or(true),
        })
    }
}

fn too_many_fields() -> String {
    format!("A client event has at most {MAX_FIELDS} top-level fields.")
}

/// The top-level members of a JSON object, values left as their text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, &'de RawValue>()? {
                    if out.len() == MAX_FIELDS {
                        return Err(serde::de::Error::custom(too_many_fields()));
                    }
                    out.push(entry);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

pub(super) fn binary_refused() -> ApiError {
    ApiError::new(
        400,
        "invalid_message",
        "Client events are JSON text messages; a binary message is not accepted.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn create(text: &str) -> (Value, bool) {
        match ClientEvent::parse(text).unwrap() {
            ClientEvent::Create { body, generate } => {
                (serde_json::from_str(&body).unwrap(), generate)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_create_event_is_the_create_body_with_a_type() {
        let (body, generate) = create(
            r#"{"type":"response.create","model":"base","input":[{"role":"user","content":"hi \"x\""}],"store":false,"stream":true}"#,
        );
        assert_eq!(
            body,
            json!({"model":"base","input":[{"role":"user","content":"hi \"x\""}],"store":false,"stream":true})
        );
        assert!(generate);
        let (body, generate) =
            create(r#"{"generate":false,"type":"response.create","model":"base","input":"x"}"#);
        assert_eq!(body, json!({"model":"base","input":"x"}));
        assert!(!generate);
        // Keys with escapes survive the round trip.
        let (body, _) = create(r#"{"type":"response.create","mo\u0064el":"base"}"#);
        assert_eq!(body, json!({"model":"base"}));
    }

    #[test]
    fn bad_messages_are_400s_naming_what_is_wrong() {
        let e = ClientEvent::parse("{not json").unwrap_err();
        assert_eq!((e.status, e.code.as_ref()), (400, "invalid_json"));
        let e = ClientEvent::parse(r#"{"type":"response.cancel"}"#).unwrap_err();
        assert_eq!(
            (e.code.as_ref(), e.param.as_deref()),
            ("invalid_value", Some("type"))
        );
        let e = ClientEvent::parse(r#"{"model":"base"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("type"));
        let e = ClientEvent::parse(r#"[1]"#).unwrap_err();
        assert_eq!(e.status, 400);
        let e = ClientEvent::parse(r#"{"type":"response.create","generate":"no"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("generate"));
        let many: String = (0..=MAX_FIELDS).map(|i| format!(",\"f{i}\":0")).collect();
        let e = ClientEvent::parse(&format!("{{\"type\":\"response.create\"{many}}}")).unwrap_err();
        assert_eq!(e.code, "invalid_value");
        assert!(matches!(
            ClientEvent::parse(r#"{"type":"response.processed","response_id":"resp_1"}"#),
            Ok(ClientEvent::Processed)
        ));
    }
}
