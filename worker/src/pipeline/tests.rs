//! The pipeline over a scripted token source (no model).

use super::*;
use crate::seam::sequence::{ChatMessage, Image, IMAGE_PLACEHOLDER};
use std::sync::Mutex;
use tokio::sync::mpsc;

/// Replays scripted token byte strings, one script per started sequence.
struct Scripted {
    window: u32,
    scripts: Mutex<VecDeque<Vec<Vec<u8>>>>,
    started: Mutex<Vec<Sequence>>,
    /// Its `max_tokens_per_event`.
    per_event: Option<u32>,
    /// Fails each sequence after this many tokens.
    fail_after: Option<usize>,
}

use std::collections::VecDeque;

impl Scripted {
    fn new(window: u32, scripts: Vec<Vec<&[u8]>>) -> Arc<Self> {
        Arc::new(Self {
            window,
            scripts: Mutex::new(
                scripts
                    .into_iter()
                    .map(|s| s.into_iter().map(<[u8]>::to_vec).collect())
                    .collect(),
            ),
            started: Mutex::new(Vec::new()),
            per_event: None,
            fail_after: None,
        })
    }

    fn with(self: Arc<Self>, per_event: Option<u32>, fail_after: Option<usize>) -> Arc<Self> {
        let Ok(mut s) = Arc::try_unwrap(self) else {
            panic!("shared")
        };
        s.per_event = per_event;
        s.fail_after = fail_after;
        Arc::new(s)
    }
}

#[async_trait::async_trait]
impl SequenceEngine for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn description(&self) -> String {
        String::new()
    }
    fn context_window(&self) -> u32 {
        self.window
    }
    fn render(&self, messages: &[ChatMessage]) -> Result<String, Status> {
        Ok(messages.iter().map(|m| m.content.as_str()).collect())
    }
    fn accepts_images(&self) -> bool {
        true
    }
    /// The detail's length, as a cost.
    fn image_tokens(&self, image: &Image) -> u32 {
        image.detail.len() as u32
    }
    fn max_tokens_per_event(&self) -> Option<u32> {
        self.per_event
    }
    /// One token per character.
    fn tokenize(&self, text: &str) -> Result<Vec<TokenId>, Status> {
        Ok(text.chars().map(|c| c as u32).collect())
    }
    async fn start(&self, sequence: Sequence) -> Result<SequenceStream, Status> {
        let script = self.scripts.lock().unwrap().pop_front().unwrap_or_default();
        let max = sequence.max_tokens as usize;
        self.started.lock().unwrap().push(sequence);
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(Ok(SeqEvent::Prefilled {
            cached_tokens: 3,
            slot: None,
        }));
        for (i, bytes) in script.iter().enumerate() {
            if self.fail_after == Some(i) {
                let _ = tx.send(Err(status::engine_failure("scripted failure")));
                return Ok(rx);
            }
            if i == max {
                let _ = tx.send(Ok(SeqEvent::Finished(SeqEnd::MaxTokens)));
                return Ok(rx);
            }
            let _ = tx.send(Ok(SeqEvent::Token {
                id: i as u32,
                bytes: bytes.clone(),
            }));
        }
        let _ = tx.send(Ok(SeqEvent::Finished(SeqEnd::EndOfGeneration)));
        Ok(rx)
    }
}

fn request(text: &str, max_tokens: u32, stop: &[&str]) -> pb::GenerateRequest {
    pb::GenerateRequest {
        request_id: "r1".into(),
        messages: vec![pb::Message {
            role: "user".into(),
            content: vec![pb::ContentPart {
                part: Some(pb::content_part::Part::Text(text.into())),
            }],
            ..Default::default()
        }],
        sampling: Some(pb::Sampling {
            max_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs a request; returns every event and the outcome.
async fn run(engine: Arc<Scripted>, req: pb::GenerateRequest) -> (Vec<Event>, Outcome) {
    let mut p = prepare(engine, req).await.expect("prepare");
    p.check_window().expect("fits");
    let running = p.start(Box::new(|_| {})).await.expect("start");
    let (tx, mut rx) = mpsc::channel(1024);
    let outcome = Box::new(running).run(EventSink::new(tx)).await;
    let mut events = Vec::new();
    while let Ok(Ok(ev)) = rx.try_recv() {
        events.extend(ev.event);
    }
    (events, outcome)
}

fn text_of(events: &[Event]) -> String {
    joined(events, false)
}

fn reasoning_of(events: &[Event]) -> String {
    joined(events, true)
}

/// The text (or the reasoning) of events, joined.
fn joined(events: &[Event], reasoning: bool) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Text(t) if !reasoning => Some(t.text.as_str()),
            Event::Reasoning(r) if reasoning => Some(r.text.as_str()),
            _ => None,
        })
        .collect()
}

/// The text of tokens of the scripted engine (one per character).
fn chars(tokens: &[TokenId]) -> String {
    tokens.iter().filter_map(|t| char::from_u32(*t)).collect()
}

/// A request with a think section of `budget` tokens.
fn thinking(mut req: pb::GenerateRequest, budget: u32) -> pb::GenerateRequest {
    req.reasoning = Some(pb::Reasoning {
        enabled: true,
        budget_tokens: budget,
        effort: String::new(),
    });
    req
}

fn finished(events: &[Event]) -> &pb::Finished {
    match events.last() {
        Some(Event::Finished(f)) => f,
        other => panic!("last event {other:?}"),
    }
}

#[tokio::test]
async fn stop_split_across_tokens_and_utf8_split_across_tokens() {
    let euro = "€".as_bytes();
    let engine = Scripted::new(
        100,
        vec![vec![b"a ", &euro[..1], &euro[1..], b" E", b"N", b"D tail"]],
    );
    let (events, outcome) = run(engine, request("hi", 0, &["nope", "END"])).await;
    assert_eq!(text_of(&events), "a € ");
    let f = finished(&events);
    assert_eq!(f.reason(), Reason::Stop);
    assert_eq!(f.stop_index, Some(1), "the stop string that matched");
    let u = f.usage.as_ref().expect("usage");
    // The engine says 3 reused tokens of a 2-token prompt: cached tokens
    // are prompt tokens, never more than the prompt.
    assert_eq!(
        (u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens),
        (2, 2, 6)
    );
    assert_eq!(outcome, Outcome::Completed { tokens: 6 });
}

#[tokio::test]
async fn max_tokens_cuts_with_length_and_releases_held_text() {
    let engine = Scripted::new(100, vec![vec![b"one", b" two", b" E", b"N", b"D"]]);
    let (events, _) = run(engine, request("hi", 3, &["END"])).await;
    assert_eq!(text_of(&events), "one two E");
    let f = finished(&events);
    assert_eq!(f.reason(), Reason::Length);
    assert_eq!(f.stop_index, None);
    assert_eq!(f.usage.as_ref().map(|u| u.completion_tokens), Some(3));
}

#[tokio::test]
async fn the_window_governs_and_is_the_ceiling_without_max_tokens() {
    let engine = Scripted::new(10, vec![]);
    let mut p = prepare(engine.clone(), request("0123456789", 0, &[]))
        .await
        .expect("prepare");
    let err = p.check_window().expect_err("prompt fills the window");
    assert_eq!(status::reason_of(&err), Some("CONTEXT_LENGTH_EXCEEDED"));
    let mut p = prepare(engine.clone(), request("0123", 7, &[]))
        .await
        .expect("prepare");
    assert!(p.check_window().is_err(), "4 + 7 > 10");
    let mut p = prepare(engine.clone(), request("0123", 0, &[]))
        .await
        .expect("prepare");
    p.check_window().expect("fits");
    let _ = p.start(Box::new(|_| {})).await.expect("start");
    assert_eq!(engine.started.lock().unwrap()[0].max_tokens, 6);
}

#[tokio::test]
async fn a_constrained_tool_call_becomes_tool_call_deltas() {
    let engine = Scripted::new(
        1000,
        vec![vec![
            br#"{"name": "get_"#,
            br#"weather", "argu"#,
            br#"ments": {"city": "#,
            br#""Paris"}}"#,
        ]],
    );
    let mut req = request("weather?", 0, &[]);
    req.tools = vec![pb::FunctionTool {
        name: "get_weather".into(),
        description: "weather".into(),
        parameters_json: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into(),
        strict: true,
    }];
    req.tool_choice = Some(pb::ToolChoice {
        mode: pb::tool_choice::Mode::Required as i32,
        function_name: String::new(),
    });
    let (events, _) = run(engine.clone(), req).await;
    let calls: Vec<&pb::ToolCallDelta> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCall(d) => Some(d),
            _ => None,
        })
        .collect();
    assert!(calls[0].id.starts_with("call_"));
    assert_eq!(calls[0].name, "get_weather");
    assert_eq!(calls.iter().filter(|d| !d.id.is_empty()).count(), 1);
    let args: String = calls
        .iter()
        .map(|d| d.arguments_fragment.as_str())
        .collect();
    assert_eq!(args, r#"{"city": "Paris"}"#);
    assert_eq!(finished(&events).reason(), Reason::ToolCalls);
    assert!(engine.started.lock().unwrap()[0].constraint.is_some());
}

#[tokio::test]
async fn reasoning_is_a_think_section_then_the_answer() {
    let engine = Scripted::new(
        1000,
        vec![vec![b"let me ", b"think</th", b"ink> junk"], vec![b"42"]],
    );
    let mut req = request("q", 0, &[]);
    req.reasoning = Some(pb::Reasoning {
        enabled: true,
        budget_tokens: 50,
        effort: String::new(),
    });
    let (events, _) = run(engine.clone(), req).await;
    let reasoning = reasoning_of(&events);
    assert_eq!(reasoning, "let me think");
    assert_eq!(text_of(&events), "42");
    let u = finished(&events).usage.expect("usage");
    assert_eq!((u.completion_tokens, u.reasoning_tokens), (4, 3));
    let started = engine.started.lock().unwrap();
    assert_eq!(started[0].max_tokens, 50);
    let second = chars(&started[1].prompt);
    assert!(
        second.ends_with("<think>\nlet me think\n</think>\n\n"),
        "{second}"
    );
}

#[tokio::test]
async fn batch_events_send_the_first_output_at_once_then_merge_the_rest() {
    let engine = Scripted::new(100, vec![vec![b"a", b"b", b"c"]]);
    let mut req = request("hi", 0, &[]);
    req.batch_events = true;
    let (events, _) = run(engine, req).await;
    // The first token (the gateway times it), then the rest of the second.
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(text_of(&events[..1]), "a");
    assert_eq!(text_of(&events), "abc");
}

/// Tool calls of the events: (id, name, arguments joined).
fn calls_of(events: &[Event]) -> Vec<(String, String, String)> {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for e in events {
        if let Event::ToolCall(d) = e {
            if !d.id.is_empty() {
                calls.push((d.id.clone(), d.name.clone(), String::new()));
            }
            if let Some(c) = calls.get_mut(d.index as usize) {
                c.2.push_str(&d.arguments_fragment);
            }
        }
    }
    calls
}

fn with_tools(mut req: pb::GenerateRequest) -> pb::GenerateRequest {
    req.tools = vec![pb::FunctionTool {
        name: "get_weather".into(),
        description: "weather".into(),
        parameters_json: r#"{"type":"object"}"#.into(),
        strict: false,
    }];
    req
}

#[tokio::test]
async fn with_tool_choice_auto_a_reply_that_starts_as_a_call_is_one() {
    let engine = Scripted::new(
        1000,
        vec![vec![
            b" {\"na",
            b"me\": \"get_",
            b"weather\", \"arguments\": {\"x",
            b"\": 1}}",
        ]],
    );
    let (events, _) = run(engine.clone(), with_tools(request("weather?", 0, &[]))).await;
    let calls = calls_of(&events);
    assert_eq!(calls.len(), 1, "{events:?}");
    assert_eq!(
        (calls[0].1.as_str(), calls[0].2.as_str()),
        ("get_weather", r#"{"x": 1}"#)
    );
    assert_eq!(finished(&events).reason(), Reason::ToolCalls);
    assert!(engine.started.lock().unwrap()[0].constraint.is_none());

    // Text, even JSON that names no listed tool, stays text (stop strings
    // still apply).
    for script in [
        vec![&b"It is "[..], b"sunny. END"],
        vec![&br#"{"name": "#[..], br#""Alice"}END"#],
        vec![&b"{"[..]],
    ] {
        let expected: String = script.iter().map(|b| String::from_utf8_lossy(b)).collect();
        let expected = expected.split("END").next().unwrap_or("").to_owned();
        let engine = Scripted::new(1000, vec![script]);
        let (events, _) = run(engine, with_tools(request("weather?", 0, &["END"]))).await;
        assert_eq!(text_of(&events), expected);
        assert!(calls_of(&events).is_empty());
        assert_eq!(finished(&events).reason(), Reason::Stop);
    }
}

#[tokio::test]
async fn an_engine_can_ask_for_one_event_per_token() {
    // The whole script is queued at once: merged, unless the engine caps it.
    let script = || vec![vec![&b"a"[..], b"b", b"c"]];
    let (events, _) = run(Scripted::new(100, script()), request("hi", 0, &[])).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let engine = Scripted::new(100, script()).with(Some(1), None);
    let (events, _) = run(engine, request("hi", 0, &[])).await;
    assert_eq!(events.len(), 4, "{events:?}");
    let engine = Scripted::new(100, script()).with(Some(2), None);
    let (events, _) = run(engine, request("hi", 0, &[])).await;
    assert_eq!(text_of(&events[..1]), "ab", "{events:?}");
}

#[tokio::test]
async fn an_engine_failure_still_sends_what_came_before_it() {
    let engine = Scripted::new(100, vec![vec![&b"a"[..], b"b", b"c"]]).with(None, Some(2));
    let mut p = prepare(engine, request("hi", 0, &[]))
        .await
        .expect("prepare");
    p.check_window().expect("fits");
    let running = p.start(Box::new(|_| {})).await.expect("start");
    let (tx, mut rx) = mpsc::channel(16);
    let outcome = Box::new(running).run(EventSink::new(tx)).await;
    assert_eq!(outcome, Outcome::Failed { tokens: 2 });
    let first = rx.try_recv().expect("an event").expect("not the failure");
    assert_eq!(
        first.event,
        Some(Event::Text(pb::TextDelta { text: "ab".into() }))
    );
    assert!(rx.try_recv().expect("the failure").is_err());
}

#[tokio::test]
async fn a_budget_that_takes_the_whole_completion_is_reported_as_reasoning() {
    let engine = Scripted::new(1000, vec![vec![&b"a"[..], b"b", b"c", b"d"]]);
    let mut req = request("q", 3, &[]);
    req.reasoning = Some(pb::Reasoning {
        enabled: true,
        budget_tokens: 50,
        effort: String::new(),
    });
    let (events, _) = run(engine, req).await;
    let f = finished(&events);
    assert_eq!(f.reason(), Reason::Length);
    let u = f.usage.expect("usage");
    assert_eq!((u.completion_tokens, u.reasoning_tokens), (3, 3));
}

#[tokio::test]
async fn image_parts_reach_an_engine_that_takes_them_and_are_counted() {
    let engine = Scripted::new(1000, vec![vec![&b"ok"[..]]]);
    let mut req = request("look", 0, &[]);
    req.messages[0].content.push(pb::ContentPart {
        part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
            url: "https://example.com/a.png".into(),
            detail: "high".into(),
        })),
    });
    let mut p = prepare(engine, req).await.expect("prepare");
    assert!(
        p.prompt_text.ends_with(IMAGE_PLACEHOLDER),
        "{}",
        p.prompt_text
    );
    p.check_window().expect("fits");
    let running = p.start(Box::new(|_| {})).await.expect("start");
    let (tx, mut rx) = mpsc::channel(16);
    Box::new(running).run(EventSink::new(tx)).await;
    let mut events = Vec::new();
    while let Ok(Ok(ev)) = rx.try_recv() {
        events.extend(ev.event);
    }
    assert_eq!(finished(&events).usage.map(|u| u.image_tokens), Some(4));
}

#[tokio::test]
async fn output_events_count_the_tokens_they_carry() {
    let engine = Scripted::new(100, vec![vec![b"a", b"b", b"c", b"d"]]);
    let mut req = request("hi", 0, &[]);
    req.batch_events = true;
    let mut p = prepare(engine, req).await.expect("prepare");
    p.check_window().expect("fits");
    let running = p.start(Box::new(|_| {})).await.expect("start");
    let (tx, mut rx) = mpsc::channel(1024);
    Box::new(running).run(EventSink::new(tx)).await;
    let (mut counted, mut completion) = (0, 0);
    while let Ok(Ok(ev)) = rx.try_recv() {
        counted += ev.output_tokens;
        if let Some(Event::Finished(f)) = ev.event {
            completion = f.usage.map_or(0, |u| u.completion_tokens);
        }
    }
    assert_eq!(completion, 4);
    assert_eq!(
        counted, completion,
        "every generated token is reported once"
    );
}

fn resumed(mut req: pb::GenerateRequest, resume: pb::Resume) -> pb::GenerateRequest {
    req.resume = Some(resume);
    req
}

#[tokio::test]
async fn a_moved_text_answer_continues_after_its_delivered_output() {
    let engine = Scripted::new(100, vec![vec![b" world", b"!"]]);
    let req = resumed(
        request("hi", 10, &[]),
        pb::Resume {
            text: "Hello,".into(),
            completion_tokens: 4,
            ..Default::default()
        },
    );
    let (events, outcome) = run(engine.clone(), req).await;
    assert_eq!(text_of(&events), " world!", "only what follows is sent");
    let u = finished(&events).usage.expect("usage");
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens),
        (2, 6),
        "the prompt once; every token of the generation"
    );
    assert_eq!(outcome, Outcome::Completed { tokens: 6 });
    let started = engine.started.lock().unwrap();
    let resumed = chars(&started[0].resumed);
    assert_eq!(resumed, "Hello,", "the delivered output follows the prompt");
    assert_eq!(started[0].prompt.len(), 2);
    assert_eq!(started[0].max_tokens, 6, "max_tokens counts both parts");
}

#[tokio::test]
async fn a_moved_generation_at_its_limit_ends_with_length_at_once() {
    let engine = Scripted::new(100, vec![vec![b"never"]]);
    let req = resumed(
        request("hi", 4, &[]),
        pb::Resume {
            text: "abcd".into(),
            completion_tokens: 4,
            ..Default::default()
        },
    );
    let (events, _) = run(engine.clone(), req).await;
    assert_eq!(text_of(&events), "");
    assert_eq!(finished(&events).reason(), Reason::Length);
    assert!(
        engine.started.lock().unwrap().is_empty(),
        "no sequence started"
    );
}

#[tokio::test]
async fn a_move_inside_the_think_section_resumes_it_then_answers() {
    let engine = Scripted::new(1000, vec![vec![b" more</think>"], vec![b"42"]]);
    let req = resumed(
        thinking(request("q", 0, &[]), 50),
        pb::Resume {
            reasoning: "let me think".into(),
            completion_tokens: 3,
            reasoning_tokens: 3,
            ..Default::default()
        },
    );
    let (events, _) = run(engine.clone(), req).await;
    let reasoning = reasoning_of(&events);
    assert_eq!(reasoning, " more");
    assert_eq!(text_of(&events), "42");
    let u = finished(&events).usage.expect("usage");
    assert_eq!((u.completion_tokens, u.reasoning_tokens), (5, 4));
    let started = engine.started.lock().unwrap();
    assert_eq!(started[0].max_tokens, 47, "the budget less what was spent");
    let answer = chars(&started[1].prompt);
    assert!(
        answer.ends_with("<think>\nlet me think more\n</think>\n\n"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_move_after_the_think_section_goes_on_with_the_answer() {
    let engine = Scripted::new(1000, vec![vec![b"2"]]);
    let req = resumed(
        thinking(request("q", 0, &[]), 50),
        pb::Resume {
            reasoning: "let me think".into(),
            text: "4".into(),
            completion_tokens: 4,
            reasoning_tokens: 3,
            ..Default::default()
        },
    );
    let (events, _) = run(engine.clone(), req).await;
    assert_eq!(text_of(&events), "2");
    let started = engine.started.lock().unwrap();
    assert_eq!(started.len(), 1, "no think section again");
    let prompt = chars(&started[0].prompt);
    assert!(prompt.ends_with("let me think\n</think>\n\n"), "{prompt}");
    let u = finished(&events).usage.expect("usage");
    assert_eq!((u.completion_tokens, u.reasoning_tokens), (5, 3));
}

#[tokio::test]
async fn a_half_streamed_tool_call_goes_on_without_its_header_again() {
    let engine = Scripted::new(1000, vec![vec![b"is\"}}"]]);
    let mut req = with_tools(request("weather?", 0, &[]));
    req.tool_choice = Some(pb::ToolChoice {
        mode: pb::tool_choice::Mode::Auto as i32,
        function_name: String::new(),
    });
    let req = resumed(
        req,
        pb::Resume {
            tool_calls: vec![pb::ToolCall {
                id: "call_x".into(),
                name: "get_weather".into(),
                arguments: "{\"city\": \"Par".into(),
            }],
            completion_tokens: 9,
            ..Default::default()
        },
    );
    let (events, _) = run(engine, req).await;
    let deltas: Vec<&pb::ToolCallDelta> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolCall(d) => Some(d),
            _ => None,
        })
        .collect();
    assert!(!deltas.is_empty());
    assert!(deltas
        .iter()
        .all(|d| d.index == 0 && d.id.is_empty() && d.name.is_empty()));
    let args: String = deltas
        .iter()
        .map(|d| d.arguments_fragment.as_str())
        .collect();
    assert_eq!(args, "is\"}");
    assert_eq!(finished(&events).reason(), Reason::ToolCalls);
}
