//! Wire types of the Responses API (`/v1/responses` and its sub-resources),
//! exactly as the public API spells them. Nothing here knows about workers
//! or the store; `translate::responses` maps these to the worker protocol.
//! `request.rs`: what clients send; `object.rs`: the response object and
//! the other replies; `events.rs`: stream events and their stored frames.

mod events;
mod object;
mod request;

pub use events::*;
pub use object::*;
pub use request::*;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn input_accepts_string_easy_and_typed_items() {
        let r: CreateResponseRequest = serde_json::from_str(
            r#"{"model":"base","input":[
                {"role":"user","content":"hi"},
                {"type":"message","role":"assistant","id":"msg_1","content":[{"type":"output_text","text":"yo","annotations":[]}]},
                {"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"call_1","output":"42"},
                {"type":"item_reference","id":"msg_0"},
                {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"t"}]}
            ]}"#,
        )
        .unwrap();
        let Some(Input::Items(items)) = r.input else {
            panic!("items")
        };
        assert_eq!(items.len(), 6);
        assert_eq!(items[2].call_id.as_deref(), Some("call_1"));
        let r: CreateResponseRequest =
            serde_json::from_str(r#"{"model":"base","input":"hello"}"#).unwrap();
        assert!(matches!(r.input, Some(Input::Text(ref t)) if t == "hello"));
    }

    #[test]
    fn codex_fields_are_accepted_and_typos_are_not() {
        let ok: Result<CreateResponseRequest, _> = serde_json::from_str(
            r#"{"model":"base","input":"x","include":["reasoning.encrypted_content"],"prompt_cache_key":"k",
                "client_metadata":{"a":"b"},"reasoning":{"effort":"low","summary":"auto"},"store":false,
                "truncation":"auto","service_tier":"auto","user":"u","safety_identifier":"s","top_logprobs":0,
                "stream_options":{"include_obfuscation":false},"text":{"verbosity":"low"},"max_tool_calls":3}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
        let bad: Result<CreateResponseRequest, _> =
            serde_json::from_str(r#"{"model":"base","input":"x","max_output_token":3}"#);
        assert!(bad
            .unwrap_err()
            .to_string()
            .contains("unknown field `max_output_token`"));
    }

    #[test]
    fn events_carry_type_and_sequence_number() {
        let part = OutputText::new(String::new());
        let e = Sequenced {
            event: StreamEvent::ContentPartAdded {
                item_id: "msg_1",
                output_index: 0,
                content_index: 0,
                part: &part,
            },
            sequence_number: 3,
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "response.content_part.added");
        assert_eq!(v["sequence_number"], 3);
        assert_eq!(
            v["part"],
            serde_json::json!({"type":"output_text","text":"","annotations":[],"logprobs":[]})
        );
        assert_eq!(e.event.name(), "response.content_part.added");
    }

    #[test]
    fn statuses_are_words_on_the_wire_and_variants_inside() {
        for status in ResponseStatus::ALL {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{status}\""));
            assert_eq!(
                serde_json::from_str::<ResponseStatus>(&json).unwrap(),
                status
            );
            assert_eq!(ResponseStatus::parse(status.as_str()), Some(status));
        }
        assert!(serde_json::from_str::<ResponseStatus>("\"canceled\"").is_err());
        assert_eq!(ResponseStatus::parse("done"), None);
        let ended: Vec<_> = ResponseStatus::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .map(ResponseStatus::as_str)
            .collect();
        assert_eq!(ended, ["completed", "failed", "cancelled", "incomplete"]);
    }

    /// An object stored before `completed_at`, the penalties and the
    /// other Open Responses fields existed reads with their defaults.
    #[test]
    fn objects_stored_by_an_older_gateway_still_read() {
        let old = r#"{"id":"resp_1","object":"response","created_at":5,"status":"completed",
            "background":false,"error":null,"incomplete_details":null,"instructions":null,
            "max_output_tokens":null,"model":"base","output":[],"parallel_tool_calls":true,
            "previous_response_id":null,"reasoning":{"effort":null,"summary":null},"store":true,
            "temperature":null,"text":{"format":{"type":"text"}},"tool_choice":"auto","tools":[],
            "top_p":null,"truncation":"disabled","usage":null,"metadata":{}}"#;
        let o: ResponseObject = serde_json::from_str(old).unwrap();
        assert_eq!(o.completed_at, None);
        assert_eq!((o.presence_penalty, o.frequency_penalty), (0.0, 0.0));
        assert_eq!((o.top_logprobs, o.max_tool_calls), (0, None));
        assert_eq!(o.service_tier, "default");
        let v = serde_json::to_value(&o).unwrap();
        for field in [
            "completed_at",
            "safety_identifier",
            "prompt_cache_key",
            "max_tool_calls",
        ] {
            assert_eq!(v[field], Value::Null, "{field} is present as null");
        }
        assert!(v.get("prompt_cache_key").is_some());
    }

    #[test]
    fn ending_stamps_completed_at_only_for_a_terminal_status() {
        let mut o: ResponseObject = serde_json::from_value(serde_json::json!({
            "id":"r","object":"response","created_at":5,"status":"queued","background":true,
            "error":null,"incomplete_details":null,"instructions":null,"max_output_tokens":null,
            "model":"base","output":[],"parallel_tool_calls":true,"previous_response_id":null,
            "reasoning":{},"store":true,"temperature":1.0,"text":{},"tool_choice":"auto",
            "tools":[],"top_p":1.0,"truncation":"disabled","usage":null,"metadata":{}}))
        .unwrap();
        o.end(ResponseStatus::InProgress);
        assert_eq!(o.completed_at, None);
        o.end(ResponseStatus::Cancelled);
        assert!(o.completed_at.is_some_and(|t| t >= 5));
    }

    #[test]
    fn output_items_round_trip() {
        let item = OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: "completed".into(),
        };
        let v = serde_json::to_value(&item).unwrap();
        assert_eq!(v["type"], "function_call");
        let back: OutputItem = serde_json::from_value(v).unwrap();
        assert_eq!(back, item);
    }
}
