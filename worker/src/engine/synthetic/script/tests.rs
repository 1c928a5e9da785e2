//! The simulator's replies, planned from prompts the pipeline prepared.

use super::*;
use crate::pipeline::request::plan as request_plan;
use crate::pipeline::{THINK_CLOSE, THINK_OPEN};
use crate::seam::sequence::SamplingParams;
use inference_proto::v1 as pb;
use serde_json::{json, Value};

fn text(t: &str) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(t.into())),
    }
}

fn msg(role: &str, t: &str) -> pb::Message {
    pb::Message {
        role: role.into(),
        content: vec![text(t)],
        ..Default::default()
    }
}

fn request(user: &str) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: "req-1".into(),
        model: "base".into(),
        messages: vec![msg("system", "be brief"), msg("user", user)],
        sampling: Some(pb::Sampling::default()),
        ..Default::default()
    }
}

/// The first sequence the pipeline would start for `req` (the reasoning
/// one when reasoning is on), with `max_tokens`.
fn sequence(req: &pb::GenerateRequest, max_tokens: u32) -> Sequence {
    let p = request_plan(req, true).expect("plan");
    let mut text = tokenizer::render(&p.messages);
    let constraint = if p.reasoning_budget.is_some() {
        text.push_str(THINK_OPEN);
        None
    } else {
        p.constraint.clone()
    };
    Sequence {
        prompt: tokenizer::tokenize(&text),
        sampling: p.sampling,
        max_tokens,
        constraint,
        cache_key: String::new(),
        resumed: Vec::new(),
    }
}

fn reply(req: &pb::GenerateRequest, max_tokens: u32) -> ReplyScript {
    write(&sequence(req, max_tokens)).expect("plan")
}

fn text_of(p: &ReplyScript) -> String {
    let bytes: Vec<u8> = p.tokens.iter().flat_map(|t| t.bytes.clone()).collect();
    String::from_utf8(bytes).expect("UTF-8")
}

/// The calls of a reply: (name, arguments).
fn calls(p: &ReplyScript) -> Vec<(String, Value)> {
    let v: Value = match serde_json::from_str(&text_of(p)) {
        Ok(v) => v,
        Err(_) => return Vec::new(),
    };
    let list = match v {
        Value::Array(list) => list,
        one => vec![one],
    };
    list.into_iter()
        .filter_map(|c| {
            Some((
                c.get("name")?.as_str()?.to_owned(),
                c.get("arguments")?.clone(),
            ))
        })
        .collect()
}

fn weather_tools() -> Vec<pb::FunctionTool> {
    vec![
        pb::FunctionTool {
            name: "get_weather".into(),
            parameters_json: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7}
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            })
            .to_string(),
            strict: true,
            ..Default::default()
        },
        pb::FunctionTool {
            name: "get_time".into(),
            parameters_json: json!({"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}).to_string(),
            ..Default::default()
        },
    ]
}

#[test]
fn deterministic_given_prompt_and_seed() {
    let a = reply(&request("tell me a story"), 1000);
    assert_eq!(a, reply(&request("tell me a story"), 1000));
    let c = reply(&request("tell me another story"), 1000);
    assert_ne!(text_of(&a), text_of(&c));
    let mut seeded = request("tell me a story");
    seeded.sampling = Some(pb::Sampling {
        seed: Some(7),
        ..Default::default()
    });
    assert_ne!(text_of(&a), text_of(&reply(&seeded, 1000)));
    assert!((16..=48).contains(&a.tokens.len()), "{}", a.tokens.len());
    assert_eq!(a.end, SeqEnd::EndOfGeneration);
}

#[test]
fn reply_tokens_is_exact_and_max_tokens_cuts() {
    let p = reply(&request("hi synthetic:reply_tokens=100"), 10_000);
    assert_eq!(p.tokens.len(), 100);
    assert_eq!(p.end, SeqEnd::EndOfGeneration);
    // The text is really about 100 o200k tokens.
    let count = tokenizer::count(&text_of(&p));
    assert!((95..=105).contains(&count), "bpe count {count}");

    let p = reply(&request("hi synthetic:reply_tokens=100"), 7);
    assert_eq!(p.tokens.len(), 7);
    assert_eq!(p.end, SeqEnd::MaxTokens);
}

#[test]
fn echo_replies_with_the_last_user_message() {
    let p = reply(&request("synthetic:echo naïve 日本 text"), 1000);
    assert_eq!(text_of(&p), "synthetic:echo naïve 日本 text");
    assert_eq!(
        p.tokens.len() as u32,
        tokenizer::count("synthetic:echo naïve 日本 text")
    );
}

#[test]
fn echo_messages_lists_what_the_worker_received() {
    let mut req = request("first synthetic:echo_messages");
    req.messages.push(pb::Message {
        role: "assistant".into(),
        tool_calls: vec![pb::ToolCall {
            id: "call_1".into(),
            name: "get_time".into(),
            arguments: "{\"tz\":\"UTC\"}".into(),
        }],
        ..Default::default()
    });
    let mut result = msg("tool", "12:00");
    result.tool_call_id = "call_1".into();
    req.messages.push(result);
    req.messages[1].content.push(pb::ContentPart {
        part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
            url: "https://example.com/a.png".into(),
            detail: "low".into(),
        })),
    });
    assert_eq!(
        text_of(&reply(&req, 1000)),
        "system: be brief\nuser: first synthetic:echo_messages [image]\n\
         assistant: get_time({\"tz\":\"UTC\"})\ntool (call_1): 12:00"
    );
}

#[test]
fn reasoning_is_20_to_60_words_cut_by_the_budget_then_the_answer() {
    let mut req = request("think");
    req.reasoning = Some(pb::Reasoning {
        enabled: true,
        budget_tokens: 0,
        effort: "high".into(),
    });
    let think = reply(&req, 4096);
    assert!(think.thinking && !think.after_think);
    assert!((20..=60).contains(&think.tokens.len()));
    assert_eq!(think.end, SeqEnd::EndOfGeneration);
    let cut = reply(&req, 5);
    assert_eq!((cut.tokens.len(), cut.end), (5, SeqEnd::MaxTokens));

    // The answer: the same prompt with the section closed.
    let mut s = sequence(&req, 100);
    let mut text = tokenizer::decode(&s.prompt);
    text.push_str(&format!("{}\n{THINK_CLOSE}\n\n", text_of(&think)));
    s.prompt = tokenizer::tokenize(&text);
    let answer = write(&s).expect("plan");
    assert!(answer.after_think && !answer.thinking);
    assert!((16..=48).contains(&answer.tokens.len()));
}

fn with_tools(user: &str, mode: pb::tool_choice::Mode, name: &str, parallel: bool) -> ReplyScript {
    let mut req = request(user);
    req.tools = weather_tools();
    req.tool_choice = Some(pb::ToolChoice {
        mode: mode as i32,
        function_name: name.into(),
    });
    req.parallel_tool_calls = parallel;
    reply(&req, 10_000)
}

fn names(p: &ReplyScript) -> Vec<String> {
    calls(p).into_iter().map(|c| c.0).collect()
}

#[test]
fn tool_choice_modes() {
    use pb::tool_choice::Mode;
    // AUTO: no mention -> text; mention -> a call.
    assert!(calls(&with_tools("hello there", Mode::Auto, "", true)).is_empty());
    assert_eq!(
        names(&with_tools("use get_weather please", Mode::Auto, "", true)),
        ["get_weather"]
    );
    // A longer identifier is not a mention.
    assert!(calls(&with_tools("get_weather_v2", Mode::Auto, "", true)).is_empty());
    // Parallel: both mentioned tools in mention order; not parallel: first.
    let both = "get_time then get_weather";
    assert_eq!(
        names(&with_tools(both, Mode::Auto, "", true)),
        ["get_time", "get_weather"]
    );
    assert_eq!(
        names(&with_tools(both, Mode::Auto, "", false)),
        ["get_time"]
    );
    // NONE never calls; REQUIRED calls the first tool, or the mentioned
    // ones; NAMED calls it.
    assert!(calls(&with_tools("get_weather", Mode::None, "", true)).is_empty());
    assert_eq!(
        names(&with_tools("hello", Mode::Required, "", true)),
        ["get_weather"]
    );
    assert_eq!(
        names(&with_tools(both, Mode::Required, "", true)),
        ["get_time", "get_weather"]
    );
    assert_eq!(
        names(&with_tools(both, Mode::Required, "", false)),
        ["get_time"]
    );
    assert_eq!(
        names(&with_tools("get_weather", Mode::Named, "get_time", true)),
        ["get_time"]
    );
}

#[test]
fn tool_arguments_validate() {
    let tools = weather_tools();
    let validator = jsonschema::validator_for(
        &serde_json::from_str::<Value>(&tools[0].parameters_json).expect("json"),
    )
    .expect("schema");
    for required in [false, true] {
        for i in 0..20 {
            let mode = if required {
                pb::tool_choice::Mode::Required
            } else {
                pb::tool_choice::Mode::Auto
            };
            let p = with_tools(&format!("call get_weather for city {i}"), mode, "", false);
            let c = calls(&p);
            assert_eq!(c.len(), 1);
            assert!(validator.is_valid(&c[0].1), "{}", c[0].1);
        }
    }
}

#[test]
fn after_a_tool_result_auto_answers_in_text_quoting_it() {
    let mut req = request("what is the weather? use get_weather");
    req.tools = weather_tools();
    req.messages.push(pb::Message {
        role: "assistant".into(),
        tool_calls: vec![pb::ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{}".into(),
        }],
        ..Default::default()
    });
    let mut result = msg("tool", "{\"temp\": 21}");
    result.tool_call_id = "call_1".into();
    req.messages.push(result);
    let p = reply(&req, 10_000);
    assert!(calls(&p).is_empty());
    assert!(text_of(&p).contains("{\"temp\": 21}"), "{}", text_of(&p));
}

#[test]
fn scripted_json_replies_answer_each_json_call_in_turn() {
    let user = msg(
        "user",
        r#"plan it synthetic:json_replies={"n":0} {"n":1} [2] then words"#,
    );
    let at = |extra: Vec<pb::Message>| {
        let mut req = request("");
        req.messages = vec![msg("system", "s"), user.clone()];
        req.messages.extend(extra);
        req.response_format = Some(pb::ResponseFormat {
            kind: pb::response_format::Kind::JsonObject as i32,
            ..Default::default()
        });
        text_of(&reply(&req, 1000))
    };
    assert_eq!(at(vec![]), r#"{"n":0}"#);
    assert_eq!(
        at(vec![msg("assistant", "x"), msg("user", "again")]),
        r#"{"n":1}"#
    );
    let many = vec![
        msg("assistant", "a"),
        msg("user", "b"),
        msg("assistant", "c"),
        msg("user", "d"),
        msg("assistant", "e"),
        msg("user", "f"),
    ];
    assert_eq!(at(many), "[2]");
}

#[test]
fn structured_output_validates_unless_told_to_ignore_it() {
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": false
    });
    let mut req = request("give me a person");
    req.response_format = Some(pb::ResponseFormat {
        kind: pb::response_format::Kind::JsonSchema as i32,
        schema_name: "person".into(),
        schema_json: schema.to_string(),
        strict: true,
    });
    let p = reply(&req, 10_000);
    let v: Value = serde_json::from_str(&text_of(&p)).expect("json");
    assert!(jsonschema::is_valid(&schema, &v));
    assert!(p.tokens.len() > 3);

    req.response_format = Some(pb::ResponseFormat {
        kind: pb::response_format::Kind::JsonObject as i32,
        ..Default::default()
    });
    let v: Value = serde_json::from_str(&text_of(&reply(&req, 10_000))).expect("json");
    assert!(v.is_object() && v.get("answer").is_some(), "{v}");

    req.messages[1] = msg("user", "give me a person synthetic:ignore_format");
    assert!(serde_json::from_str::<Value>(&text_of(&reply(&req, 10_000))).is_err());
}

#[test]
fn sampling_reaches_the_plan_through_the_sequence() {
    let mut s = sequence(&request("hi"), 100);
    let a = write(&s).expect("plan");
    s.sampling = SamplingParams {
        seed: Some(3),
        ..s.sampling
    };
    assert_ne!(a, write(&s).expect("plan"));
}

#[test]
fn calls_are_written_the_way_the_constraint_makes_a_model_write_them() {
    let params = json!({"type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}, "minItems": 2}},
        "required": ["city", "days"]});
    let text = calls_text(
        &[("f", Some(&params))],
        false,
        &Controls::default(),
        &mut Rng::new(7),
    )
    .expect("calls");
    assert!(
        text.starts_with(r#"{"name": "f", "arguments": {"city": ""#),
        "{text}"
    );
    assert!(text.contains(r#"", "days": ["#), "{text}");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(value["name"], "f");
    assert_eq!(spaced_json(&value).expect("JSON"), text, "one spelling");
    let two = calls_text(
        &[("f", None), ("g", None)],
        true,
        &Controls::default(),
        &mut Rng::new(7),
    )
    .expect("calls");
    assert_eq!(
        two,
        r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]"#
    );
    // Under a constraint of parallel calls, one call is an array too.
    let one =
        calls_text(&[("f", None)], true, &Controls::default(), &mut Rng::new(7)).expect("calls");
    assert_eq!(one, r#"[{"name": "f", "arguments": {}}]"#);
}

#[test]
fn a_tool_path_control_names_the_file_a_call_reads() {
    let params = json!({"type": "object",
        "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"},
            "offset": {"type": "integer"}, "pages": {"type": "string"},
            "allow_large": {"type": "boolean"}},
        "required": ["file_path", "limit"]});
    let controls = Controls::parse("Read it. synthetic:tool_path=/tmp/scratch/a.txt");
    let text = calls_text(
        &[("Read", Some(&params))],
        false,
        &controls,
        &mut Rng::new(7),
    )
    .expect("calls");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(value["arguments"]["file_path"], "/tmp/scratch/a.txt");
    assert!(value["arguments"]["limit"].is_i64(), "{text}");
    // Optional arguments are left out, whatever the seed: the file is read
    // whole (Claude Code's Read with a generated `offset` read nothing).
    for seed in 0..32 {
        let text = calls_text(
            &[("Read", Some(&params))],
            false,
            &controls,
            &mut Rng::new(seed),
        )
        .expect("calls");
        let value: Value = serde_json::from_str(&text).expect("JSON");
        let keys: Vec<&String> = value["arguments"]
            .as_object()
            .expect("object")
            .keys()
            .collect();
        assert_eq!(keys, ["file_path", "limit"], "seed {seed}: {text}");
    }
}
