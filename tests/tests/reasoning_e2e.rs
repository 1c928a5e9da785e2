//! Reasoning and image input end to end, on both APIs, streaming and not.
//!
//! Reasoning: off (`reasoning_content` null, `reasoning_tokens` 0 in every
//! usage field), on (`enable_thinking`, `reasoning_effort` /
//! `reasoning.effort`; the effort wins, `none` turns it off) and capped
//! (`thinking_budget` N on `base`: at most N reasoning tokens). On
//! `base-mini` and `base-ultra` the budget is not configurable: a valid
//! `thinking_budget` is accepted and ignored (the model's fixed budget
//! applies), so a request stays valid when only `model` changes — the rule of
//! `gateway/src/validate/chat.rs`, tested here so it stays so.
//!
//! The synthetic worker reasons min(budget, 20..=60) tokens, one token per
//! streamed piece, before answering (docs/process-contract.md).
//!
//! Images: `image_url` parts (https and `data:` URLs) on chat with `base`
//! cost 85 prompt tokens at `detail: low` and 765 at `high`/`auto`; on the
//! other models they are a 400 naming `messages.I.content.J`, and on the
//! responses API always a 400 naming `input.I.content.J`.

use harness::{assert_envelope, json, Client, SseFrame, Stack, Value};

fn stack(models: &[&str]) -> Stack {
    Stack::builder()
        .models(models)
        .start()
        .expect("stack starts")
}

/// A chat turn's reasoning, text and usage as a client sees it.
#[derive(Debug)]
struct Turn {
    reasoning: Option<String>,
    /// Reasoning pieces streamed (each a token); 0 when not streaming.
    reasoning_deltas: usize,
    content: String,
    finish: String,
    usage: Value,
}

impl Turn {
    /// The reasoning count, asserted equal in both usage places.
    #[track_caller]
    fn reasoning_tokens(&self) -> u64 {
        let top = self.usage["reasoning_tokens"]
            .as_u64()
            .expect("usage.reasoning_tokens");
        let details = self.usage["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .expect("completion_tokens_details.reasoning_tokens");
        assert_eq!(top, details, "both reasoning counts agree: {}", self.usage);
        assert!(
            top <= self.usage["completion_tokens"].as_u64().unwrap(),
            "reasoning is part of the completion: {}",
            self.usage
        );
        top
    }
}

async fn chat(client: &Client, body: &Value, stream: bool) -> Turn {
    if !stream {
        let reply = client.post_json("/chat/completions", body).await.unwrap();
        assert_eq!(reply.status, 200, "{reply}");
        let c = reply.json();
        let m = &c["choices"][0]["message"];
        assert!(
            m.get("reasoning_content").is_some(),
            "reasoning_content present: {m}"
        );
        return Turn {
            reasoning: m["reasoning_content"].as_str().map(str::to_owned),
            reasoning_deltas: 0,
            content: m["content"].as_str().unwrap_or_default().to_owned(),
            finish: c["choices"][0]["finish_reason"]
                .as_str()
                .unwrap()
                .to_owned(),
            usage: c["usage"].clone(),
        };
    }
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let s = client.stream("/chat/completions", &body).await.unwrap();
    assert_eq!(s.status, 200);
    let frames = s.collect().await.unwrap();
    assert!(frames.last().unwrap().is_done());
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(SseFrame::json)
        .collect();
    let (mut reasoning, mut deltas, mut content, mut finish) =
        (None::<String>, 0, String::new(), None);
    for c in &chunks {
        let Some(choice) = c["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        if let Some(r) = delta.get("reasoning_content").and_then(Value::as_str) {
            assert!(content.is_empty(), "reasoning comes before the answer: {c}");
            assert_eq!(
                delta.as_object().unwrap().len(),
                1,
                "a reasoning delta carries only reasoning: {c}"
            );
            reasoning.get_or_insert_with(String::new).push_str(r);
            deltas += 1;
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str) {
            content.push_str(t);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = Some(f.to_owned());
        }
    }
    let usage = chunks.last().unwrap()["usage"].clone();
    Turn {
        reasoning,
        reasoning_deltas: deltas,
        content,
        finish: finish.expect("a finish reason"),
        usage,
    }
}

fn body(model: &str, extra: Value) -> Value {
    let mut b = json!({"model": model, "seed": 5, "messages": [{"role": "user", "content": "Think, then answer."}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[track_caller]
fn assert_off(t: &Turn) {
    assert_eq!(
        t.reasoning, None,
        "reasoning_content is null when not requested: {t:?}"
    );
    assert_eq!(t.reasoning_tokens(), 0, "{t:?}");
    assert!(!t.content.is_empty());
}

/// Asserts reasoning happened; returns its token count.
#[track_caller]
fn assert_on(t: &Turn, stream: bool) -> u64 {
    let r = t.reasoning_tokens();
    assert!(r > 0, "{t:?}");
    assert!(
        t.reasoning.as_deref().is_some_and(|s| !s.is_empty()),
        "{t:?}"
    );
    if stream {
        assert_eq!(
            t.reasoning_deltas as u64, r,
            "one streamed piece per reasoning token: {t:?}"
        );
    }
    assert!(
        !t.content.is_empty(),
        "an answer follows the reasoning: {t:?}"
    );
    assert_eq!(t.finish, "stop");
    r
}

#[tokio::test]
async fn chat_reasoning_off_on_and_capped() {
    let stack = stack(&["base"]);
    let client = stack.client();
    for stream in [false, true] {
        // Off: not requested, disabled, or `reasoning_effort: none` (which
        // wins over `enable_thinking`).
        assert_off(&chat(&client, &body("base", json!({})), stream).await);
        assert_off(
            &chat(
                &client,
                &body("base", json!({"enable_thinking": false})),
                stream,
            )
            .await,
        );
        assert_off(
            &chat(
                &client,
                &body(
                    "base",
                    json!({"enable_thinking": true, "reasoning_effort": "none"}),
                ),
                stream,
            )
            .await,
        );
        // A budget alone does not turn reasoning on.
        assert_off(
            &chat(
                &client,
                &body("base", json!({"thinking_budget": 100})),
                stream,
            )
            .await,
        );

        // On: enable_thinking, or any effort (which wins over enable_thinking: false).
        let r = assert_on(
            &chat(
                &client,
                &body("base", json!({"enable_thinking": true})),
                stream,
            )
            .await,
            stream,
        );
        assert!((20..=60).contains(&r), "default budget: {r}");
        for effort in ["minimal", "low", "medium", "high"] {
            let t = chat(
                &client,
                &body(
                    "base",
                    json!({"reasoning_effort": effort, "enable_thinking": false}),
                ),
                stream,
            )
            .await;
            assert_on(&t, stream);
        }

        // Capped: thinking_budget N on base is a hard cap.
        for n in [1u64, 7, 19] {
            let t = chat(
                &client,
                &body(
                    "base",
                    json!({"enable_thinking": true, "thinking_budget": n}),
                ),
                stream,
            )
            .await;
            let r = assert_on(&t, stream);
            assert!(r <= n, "thinking_budget {n} caps reasoning: {r}");
        }
        let t = chat(
            &client,
            &body(
                "base",
                json!({"reasoning_effort": "high", "thinking_budget": 3}),
            ),
            stream,
        )
        .await;
        assert!(
            assert_on(&t, stream) <= 3,
            "the budget also caps an effort: {t:?}"
        );
        // A budget of 0 allows no reasoning at all.
        let t = chat(
            &client,
            &body(
                "base",
                json!({"enable_thinking": true, "thinking_budget": 0}),
            ),
            stream,
        )
        .await;
        assert_eq!(t.reasoning_tokens(), 0, "thinking_budget 0: {t:?}");
        assert!(t.reasoning.as_deref().is_none_or(str::is_empty), "{t:?}");

        // max_tokens counts reasoning too.
        let t = chat(
            &client,
            &body("base", json!({"enable_thinking": true, "max_tokens": 5})),
            stream,
        )
        .await;
        assert_eq!(t.finish, "length", "{t:?}");
        assert_eq!(
            (t.reasoning_tokens(), t.usage["completion_tokens"].as_u64()),
            (5, Some(5))
        );
    }
    // Streamed and whole replies agree for the same seed.
    let b = body("base", json!({"enable_thinking": true}));
    let (a, s) = (
        chat(&client, &b, false).await,
        chat(&client, &b, true).await,
    );
    assert_eq!(a.reasoning, s.reasoning);
    assert_eq!(a.content, s.content);
    assert_eq!(a.reasoning_tokens(), s.reasoning_tokens());
}

#[tokio::test]
async fn thinking_budget_is_accepted_and_ignored_where_not_configurable() {
    let stack = stack(&["base-mini", "base-ultra"]);
    let client = stack.client();
    for model in ["base-mini", "base-ultra"] {
        for stream in [false, true] {
            let t = chat(
                &client,
                &body(
                    model,
                    json!({"enable_thinking": true, "thinking_budget": 3}),
                ),
                stream,
            )
            .await;
            let r = assert_on(&t, stream);
            assert!(
                r > 3 && r <= 60,
                "{model}: the fixed budget applies, not 3: {r}"
            );
            assert_off(&chat(&client, &body(model, json!({"thinking_budget": 3})), stream).await);
        }
        // Out of range is still a 400 on every model.
        let reply = client
            .post_json(
                "/chat/completions",
                &body(model, json!({"thinking_budget": 16385})),
            )
            .await
            .unwrap();
        let e = assert_envelope(&reply, 400);
        assert_eq!(e["param"], "thinking_budget");
    }
}

// ---- responses --------------------------------------------------------------

async fn response(client: &Client, body: &Value) -> Value {
    let reply = client.post_json("/responses", body).await.unwrap();
    assert_eq!(reply.status, 200, "{reply}");
    reply.json()
}

/// Streams a response: the event list (names checked against `type`, the
/// sequence from 0) and the terminal response.
async fn response_events(client: &Client, body: &Value) -> (Vec<Value>, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let s = client.stream("/responses", &body).await.unwrap();
    assert_eq!(s.status, 200);
    let frames = s.collect().await.unwrap();
    let events: Vec<Value> = frames.iter().map(SseFrame::json).collect();
    for (i, (f, e)) in frames.iter().zip(&events).enumerate() {
        assert_eq!(f.event.as_deref(), e["type"].as_str());
        assert_eq!(e["sequence_number"], i as u64);
    }
    let last = events.last().unwrap().clone();
    assert_eq!(last["type"], "response.completed", "{last}");
    (events, last["response"].clone())
}

fn reasoning_tokens(r: &Value) -> u64 {
    r["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .expect("output_tokens_details.reasoning_tokens")
}

/// Asserts the output is `[reasoning, message]` with a non-empty summary;
/// returns the reasoning tokens.
#[track_caller]
fn assert_reasoned(r: &Value) -> u64 {
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 2, "reasoning then message: {r}");
    assert_eq!(out[0]["type"], "reasoning");
    assert!(out[0]["id"].as_str().unwrap().starts_with("rs_"));
    let summary = out[0]["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 1, "{r}");
    assert_eq!(summary[0]["type"], "summary_text");
    assert!(summary[0]["text"].as_str().is_some_and(|t| !t.is_empty()));
    assert_eq!(out[1]["type"], "message");
    let n = reasoning_tokens(r);
    assert!(
        n > 0 && n <= r["usage"]["output_tokens"].as_u64().unwrap(),
        "{r}"
    );
    n
}

#[track_caller]
fn assert_unreasoned(r: &Value) {
    let out = r["output"].as_array().unwrap();
    assert!(
        out.iter().all(|i| i["type"] != "reasoning"),
        "no reasoning item: {r}"
    );
    assert_eq!(reasoning_tokens(r), 0, "{r}");
}

#[tokio::test]
async fn responses_reasoning_item_comes_first_with_its_summary_events() {
    let stack = stack(&["base", "base-mini"]);
    let client = stack.client();
    let b = |extra: Value| {
        let mut b = json!({"model": "base", "input": "Think, then answer."});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };

    // Non-streaming: on, off, effort over enable_thinking, budget cap.
    assert_unreasoned(&response(&client, &b(json!({}))).await);
    assert_unreasoned(
        &response(
            &client,
            &b(json!({"reasoning": {"effort": "none"}, "enable_thinking": true})),
        )
        .await,
    );
    let n = assert_reasoned(&response(&client, &b(json!({"enable_thinking": true}))).await);
    assert!((20..=60).contains(&n), "{n}");
    for effort in ["minimal", "low", "medium", "high"] {
        assert_reasoned(&response(&client, &b(json!({"reasoning": {"effort": effort}}))).await);
    }
    let n = assert_reasoned(
        &response(
            &client,
            &b(json!({"enable_thinking": true, "thinking_budget": 6})),
        )
        .await,
    );
    assert!(n <= 6, "thinking_budget caps reasoning: {n}");
    assert_unreasoned(
        &response(
            &client,
            &b(json!({"reasoning": {"effort": "high"}, "thinking_budget": 0})),
        )
        .await,
    );
    let mini = response(
        &client,
        &json!({"model": "base-mini", "input": "Think.", "enable_thinking": true, "thinking_budget": 6}),
    )
    .await;
    assert!(assert_reasoned(&mini) > 6, "ignored on base-mini: {mini}");

    // Streaming: the reasoning item's events, then the message at index 1.
    let (events, r) = response_events(&client, &b(json!({"reasoning": {"effort": "low"}}))).await;
    let n = assert_reasoned(&r);
    let names: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.reasoning_summary_text.delta")
        .count();
    assert_eq!(deltas as u64, n, "one summary delta per reasoning token");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
    ];
    expected.extend(std::iter::repeat_n(
        "response.reasoning_summary_text.delta",
        deltas,
    ));
    expected.extend([
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
    ]);
    assert_eq!(&names[..expected.len()], expected.as_slice(), "{names:?}");
    let tail = &names[names.len() - 4..];
    assert_eq!(
        tail,
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let rs_id = &r["output"][0]["id"];
    let mut summary = String::new();
    for e in &events {
        match e["type"].as_str().unwrap() {
            "response.reasoning_summary_text.delta" => {
                assert_eq!(
                    (&e["item_id"], &e["output_index"], &e["summary_index"]),
                    (rs_id, &json!(0), &json!(0))
                );
                summary.push_str(e["delta"].as_str().unwrap());
            }
            "response.reasoning_summary_text.done" => assert_eq!(e["text"], summary),
            "response.output_text.delta" => {
                assert_eq!(e["output_index"], 1);
                assert_eq!(e["item_id"], r["output"][1]["id"]);
            }
            _ => {}
        }
    }
    assert_eq!(r["output"][0]["summary"][0]["text"], summary);

    // Streaming off: no reasoning events at all.
    let (events, r) = response_events(&client, &b(json!({"reasoning": {"effort": "none"}}))).await;
    assert_unreasoned(&r);
    assert!(events
        .iter()
        .all(|e| !e["type"].as_str().unwrap().contains("reasoning")));
    // Streaming capped.
    let (_, r) = response_events(
        &client,
        &b(json!({"enable_thinking": true, "thinking_budget": 4})),
    )
    .await;
    assert!(assert_reasoned(&r) <= 4);
}

// ---- images -----------------------------------------------------------------

const PNG_DATA_URL: &str = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn image_body(model: &str, url: &str, detail: Option<&str>) -> Value {
    let mut image = json!({"url": url});
    if let Some(d) = detail {
        image["detail"] = json!(d);
    }
    json!({
        "model": model,
        "seed": 1,
        "messages": [
            {"role": "system", "content": "Describe images."},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": image}
            ]}
        ]
    })
}

async fn prompt_tokens(client: &Client, body: &Value, stream: bool) -> u64 {
    let t = chat(client, body, stream).await;
    assert_eq!(t.finish, "stop");
    t.usage["prompt_tokens"].as_u64().unwrap()
}

#[tokio::test]
async fn images_are_accepted_on_base_with_their_documented_token_cost() {
    let stack = stack(&["base"]);
    let client = stack.client();
    for stream in [false, true] {
        let text_only = json!({
            "model": "base",
            "seed": 1,
            "messages": [
                {"role": "system", "content": "Describe images."},
                {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}
            ]
        });
        let base = prompt_tokens(&client, &text_only, stream).await;
        let https = "https://example.com/cat.png";
        let low = prompt_tokens(&client, &image_body("base", https, Some("low")), stream).await;
        let high = prompt_tokens(&client, &image_body("base", https, Some("high")), stream).await;
        let auto = prompt_tokens(&client, &image_body("base", https, Some("auto")), stream).await;
        let unset = prompt_tokens(&client, &image_body("base", https, None), stream).await;
        let data_low = prompt_tokens(
            &client,
            &image_body("base", PNG_DATA_URL, Some("low")),
            stream,
        )
        .await;
        let data_high =
            prompt_tokens(&client, &image_body("base", PNG_DATA_URL, None), stream).await;
        assert_eq!(low - base, 85, "detail low costs 85 tokens");
        assert_eq!(high - base, 765, "detail high costs 765 tokens");
        assert_eq!((auto, unset), (high, high), "auto and unset cost as high");
        assert_eq!(
            (data_low, data_high),
            (low, high),
            "a data: URL costs the same"
        );
    }
}

#[tokio::test]
async fn images_are_rejected_on_the_other_models_and_on_responses() {
    let stack = stack(&["base", "base-mini", "base-ultra"]);
    let client = stack.client();
    for model in ["base-mini", "base-ultra"] {
        for url in ["https://example.com/cat.png", PNG_DATA_URL] {
            for stream in [false, true] {
                let mut b = image_body(model, url, Some("low"));
                b["stream"] = json!(stream);
                let reply = client.post_json("/chat/completions", &b).await.unwrap();
                let e = assert_envelope(&reply, 400);
                assert_eq!(e["param"], "messages.1.content.1", "{reply}");
                assert!(e["message"].as_str().unwrap().contains(model), "{reply}");
            }
        }
    }
    // The responses API takes no image input, not even on base.
    for model in ["base", "base-mini"] {
        for stream in [false, true] {
            let b = json!({
                "model": model,
                "stream": stream,
                "input": [
                    {"role": "user", "content": "Hi."},
                    {"role": "user", "content": [
                        {"type": "input_text", "text": "What is this?"},
                        {"type": "input_image", "image_url": "https://example.com/cat.png"}
                    ]}
                ]
            });
            let reply = client.post_json("/responses", &b).await.unwrap();
            let e = assert_envelope(&reply, 400);
            assert_eq!(e["param"], "input.1.content.1", "{reply}");
        }
    }
    // Nothing reached a worker.
    for w in &stack.workers {
        assert_eq!(w.counters().await.unwrap().started, 0, "{}", w.model());
    }
}
