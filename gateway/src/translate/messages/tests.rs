use super::stream::{replay, MessagesStreamEncoder};
use super::*;
use crate::catalog::Catalog;
use crate::parse::json_body;
use crate::validate::messages::validate;
use bytes::BytesMut;
use pb::generate_event::Event;

fn validated(body: &str) -> (MessagesRequest, ValidMessagesRequest) {
    let req: MessagesRequest = json_body(body.as_bytes()).unwrap();
    let valid = validate(&Catalog::default(), &req).unwrap();
    (req, valid)
}

fn ev(e: Event) -> pb::GenerateEvent {
    pb::GenerateEvent {
        event: Some(e),
        output_tokens: 0,
    }
}

fn finished(reason: pb::finished::Reason) -> pb::GenerateEvent {
    ev(Event::Finished(pb::Finished {
        reason: reason as i32,
        stop_index: None,
        usage: Some(pb::Usage {
            prompt_tokens: 100,
            cached_prompt_tokens: 60,
            completion_tokens: 7,
            reasoning_tokens: 2,
            image_tokens: 0,
        }),
    }))
}

fn call(index: u32, id: &str, name: &str, frag: &str) -> pb::GenerateEvent {
    ev(Event::ToolCall(pb::ToolCallDelta {
        index,
        id: id.into(),
        name: name.into(),
        arguments_fragment: frag.into(),
    }))
}

/// (event name, data) of each frame.
fn frames(out: &[u8]) -> Vec<(String, serde_json::Value)> {
    std::str::from_utf8(out)
        .unwrap()
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (head, data) = f.split_once("\ndata: ").unwrap();
            let name = head.strip_prefix("event: ").unwrap().to_owned();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect()
}

#[test]
fn the_request_carries_system_turns_tool_calls_results_and_reasoning() {
    let (req, valid) = validated(
        r#"{"model":"base","max_tokens":50,"system":[{"type":"text","text":"be brief"}],
            "messages":[{"role":"user","content":"weather?"},
              {"role":"assistant","content":[{"type":"thinking","thinking":"look it up","signature":"x"},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
              {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"sunny","is_error":true},{"type":"text","text":"thanks"}]}],
            "tools":[{"name":"get_weather","input_schema":{"type":"object"}}],
            "tool_choice":{"type":"tool","name":"get_weather","disable_parallel_tool_use":true},
            "thinking":{"type":"enabled","budget_tokens":2048},"stop_sequences":["END"],"temperature":0.5}"#,
    );
    let g = to_worker(&req, &valid, "req_1");
    let roles: Vec<&str> = g.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    let a = &g.messages[2];
    assert_eq!(a.reasoning, "look it up");
    assert_eq!(a.tool_calls[0].id, "toolu_1");
    assert_eq!(a.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(g.messages[3].tool_call_id, "toolu_1");
    assert_eq!(g.messages[3].content.len(), 2, "the error is said");
    let choice = g.tool_choice.unwrap();
    assert_eq!(choice.mode, pb::tool_choice::Mode::Named as i32);
    assert_eq!(choice.function_name, "get_weather");
    assert!(!g.parallel_tool_calls);
    let r = g.reasoning.unwrap();
    assert_eq!((r.enabled, r.budget_tokens), (true, 2048));
    let s = g.sampling.unwrap();
    assert_eq!(
        (s.max_tokens, s.stop, s.temperature),
        (50, vec!["END".to_string()], Some(0.5))
    );
}

#[test]
fn a_body_has_thinking_text_and_tool_use_blocks_with_anthropic_usage() {
    let (_, valid) = validated(
        r#"{"model":"base","max_tokens":50,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"adaptive"}}"#,
    );
    let mut agg = MessageAggregate::default();
    agg.push(ev(Event::Reasoning(pb::ReasoningDelta {
        text: "hm".into(),
    })));
    agg.push(ev(Event::Text(pb::TextDelta { text: "ok".into() })));
    agg.push(call(0, "call_abc", "f", "{\"a\""));
    agg.push(call(0, "", "", ":1}"));
    agg.push(finished(pb::finished::Reason::ToolCalls));
    let m = serde_json::to_value(agg.into_message("msg_1".into(), &valid)).unwrap();
    assert_eq!(m["type"], "message");
    assert_eq!(m["content"][0]["type"], "thinking");
    assert!(m["content"][0]["signature"]
        .as_str()
        .unwrap()
        .starts_with("igw1."));
    assert_eq!(
        m["content"][1],
        serde_json::json!({"type":"text","text":"ok"})
    );
    assert_eq!(
        m["content"][2],
        serde_json::json!({"type":"tool_use","id":"toolu_abc","name":"f","input":{"a":1}})
    );
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(
        m["usage"],
        serde_json::json!({"input_tokens":40,"output_tokens":7,"cache_read_input_tokens":60,"cache_creation_input_tokens":0})
    );
}

#[test]
fn stop_reasons_map() {
    use pb::finished::Reason;
    let stops = ["zz".to_owned(), "END".to_owned()];
    let of = |reason: Reason, stop_index| {
        let f = pb::Finished {
            reason: reason as i32,
            stop_index,
            usage: None,
        };
        stop_of(&f, &stops)
    };
    assert_eq!(of(Reason::Stop, None), ("end_turn", None));
    assert_eq!(of(Reason::Stop, Some(1)), ("stop_sequence", Some("END")));
    // An index the request does not have names nothing.
    assert_eq!(of(Reason::Stop, Some(7)), ("end_turn", None));
    assert_eq!(of(Reason::Length, None), ("max_tokens", None));
    assert_eq!(of(Reason::ToolCalls, None), ("tool_use", None));
}

#[test]
fn the_stream_has_anthropic_events_in_order() {
    let mut enc = MessagesStreamEncoder::new("msg_1".into(), "base", false);
    let mut out = BytesMut::new();
    enc.start(&mut out);
    for e in [
        ev(Event::Reasoning(pb::ReasoningDelta { text: "a".into() })),
        ev(Event::Reasoning(pb::ReasoningDelta { text: "b".into() })),
        ev(Event::Text(pb::TextDelta { text: "Hi".into() })),
        call(0, "call_1", "f", "{\"x\":"),
        call(0, "", "", "2}"),
        finished(pb::finished::Reason::ToolCalls),
    ] {
        enc.event(&e, &mut out);
    }
    assert!(enc.is_done());
    let f = frames(&out);
    let names: Vec<&str> = f.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert!(f.iter().all(|(n, d)| d["type"] == n.as_str()));
    assert_eq!(f[0].1["message"]["content"], serde_json::json!([]));
    assert_eq!(f[2].1["content_block"]["type"], "thinking");
    assert_eq!(
        f[3].1["delta"],
        serde_json::json!({"type":"thinking_delta","thinking":"a"})
    );
    assert_eq!(f[5].1["delta"]["type"], "signature_delta");
    assert_eq!(
        (f[6].1["index"].as_u64(), f[7].1["index"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(
        f[8].1["delta"],
        serde_json::json!({"type":"text_delta","text":"Hi"})
    );
    assert_eq!(
        f[10].1["content_block"],
        serde_json::json!({"type":"tool_use","id":"toolu_1","name":"f","input":{}})
    );
    assert_eq!(
        f[12].1["delta"],
        serde_json::json!({"type":"input_json_delta","partial_json":"2}"})
    );
    assert_eq!(f[14].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(f[14].1["usage"]["input_tokens"], 40);
    assert_eq!(f[14].1["usage"]["cache_read_input_tokens"], 60);
}

#[test]
fn omitted_thinking_keeps_the_block_and_its_signature_only() {
    let mut enc = MessagesStreamEncoder::new("m".into(), "base", true);
    let mut out = BytesMut::new();
    enc.event(
        &ev(Event::Reasoning(pb::ReasoningDelta {
            text: "secret".into(),
        })),
        &mut out,
    );
    enc.event(&finished(pb::finished::Reason::Stop), &mut out);
    let f = frames(&out);
    assert!(!String::from_utf8_lossy(&out).contains("secret"));
    assert_eq!(f[1].1["delta"]["type"], "signature_delta");
}

#[test]
fn a_replay_says_what_the_stream_said_and_the_signature_matches_the_body() {
    let (_, valid) = validated(
        r#"{"model":"base","max_tokens":50,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"adaptive"}}"#,
    );
    let mut agg = MessageAggregate::default();
    let mut enc = MessagesStreamEncoder::new("m".into(), "base", false);
    let mut live = BytesMut::new();
    enc.start(&mut live);
    for e in [
        ev(Event::Reasoning(pb::ReasoningDelta { text: "th".into() })),
        ev(Event::Reasoning(pb::ReasoningDelta { text: "ink".into() })),
        ev(Event::Text(pb::TextDelta { text: "A".into() })),
        ev(Event::Text(pb::TextDelta { text: "B".into() })),
        finished(pb::finished::Reason::Stop),
    ] {
        enc.event(&e, &mut live);
        agg.push(e);
    }
    let replayed = replay("m".into(), &valid, &agg.folded_events());
    let sig = |out: &[u8]| {
        frames(out)
            .into_iter()
            .find(|(_, d)| d["delta"]["type"] == "signature_delta")
            .map(|(_, d)| d["delta"]["signature"].clone())
    };
    assert_eq!(sig(&live), sig(&replayed));
    let body = serde_json::to_value(agg.into_message("m".into(), &valid)).unwrap();
    assert_eq!(Some(body["content"][0]["signature"].clone()), sig(&live));
    assert_eq!(body["content"][1]["text"], "AB");
}

#[test]
fn an_in_band_error_is_an_error_event() {
    let mut out = BytesMut::new();
    stream::error(&mut out, &crate::error::ApiError::overloaded("busy"));
    let f = frames(&out);
    assert_eq!(f[0].0, "error");
    assert_eq!(f[0].1["error"]["type"], "overloaded_error");
}

/// The stop sequence that ended a reply is named in the body, the stream's
/// `message_delta` and a replay of it (an `Idempotency-Key`'s record).
#[test]
fn the_stop_sequence_is_named_whole_streamed_and_replayed() {
    let (_, valid) = validated(
        r#"{"model":"base","max_tokens":50,"stop_sequences":["zz","HALT"],"messages":[{"role":"user","content":"x"}]}"#,
    );
    let mut agg = MessageAggregate::default();
    let mut enc = MessagesStreamEncoder::of("m".into(), &valid);
    let mut live = BytesMut::new();
    enc.start(&mut live);
    let stopped = ev(Event::Finished(pb::Finished {
        reason: pb::finished::Reason::Stop as i32,
        stop_index: Some(1),
        usage: None,
    }));
    for e in [ev(Event::Text(pb::TextDelta { text: "A".into() })), stopped] {
        enc.event(&e, &mut live);
        agg.push(e);
    }
    let replayed = replay("m".into(), &valid, &agg.folded_events());
    for out in [&live, &replayed] {
        let delta = frames(out)
            .into_iter()
            .find(|(name, _)| name == "message_delta")
            .expect("message_delta")
            .1;
        assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
        assert_eq!(delta["delta"]["stop_sequence"], "HALT", "{delta}");
    }
    let body = serde_json::to_value(agg.into_message("m".into(), &valid)).unwrap();
    assert_eq!(body["stop_reason"], "stop_sequence");
    assert_eq!(body["stop_sequence"], "HALT");
}
