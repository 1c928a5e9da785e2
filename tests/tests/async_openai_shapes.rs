//! `async-openai` parses every shape of the tools, structured-output and
//! reasoning features: chat replies with tool calls and reasoning, stream
//! chunks with tool-call deltas, response objects with function calls and
//! reasoning items, and every stream event of those responses.
//!
//! Two ways in: the crate's own client (typed requests, its HTTP and SSE
//! code), and the crate's response types applied to the exact bytes the
//! gateway sent (what the client does internally), so that every frame of a
//! stream is checked, not only those the client's loop happens to look at.

use async_openai::types::chat::{
    ChatCompletionMessageToolCalls, CreateChatCompletionRequest, CreateChatCompletionResponse,
    CreateChatCompletionStreamResponse, FinishReason,
};
use async_openai::types::responses::{
    CreateResponse, OutputItem, Response, ResponseStreamEvent, Status, SummaryPart,
};
use futures::StreamExt;
use harness::chat;
use harness::{json, SseFrame, Stack, Value};

fn tools_chat() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.", "strict": true,
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
    ])
}

fn tools_responses() -> Value {
    json!([
        {"type": "function", "name": "get_weather", "description": "Weather for a city.", "strict": true,
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false}},
        {"type": "function", "name": "get_time", "strict": false,
         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}
    ])
}

/// Parses `v` as `T`, panicking with the value and serde's complaint.
#[track_caller]
fn parse<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| {
        panic!(
            "async-openai cannot parse {} ({e}): {v}",
            std::any::type_name::<T>()
        )
    })
}

#[tokio::test]
async fn chat_tool_calls_parse_with_the_typed_client() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let req: CreateChatCompletionRequest = parse(&json!({
        "model": "base",
        "messages": [{"role": "user", "content": "Use get_time and get_weather, please."}],
        "tools": tools_chat(),
        "parallel_tool_calls": true,
        "reasoning_effort": "low"
    }));

    let reply = openai.chat().create(req.clone()).await.unwrap();
    let choice = &reply.choices[0];
    assert_eq!(choice.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(choice.message.content, None);
    let calls = choice.message.tool_calls.clone().expect("tool calls");
    let names: Vec<String> = calls
        .iter()
        .map(|c| match c {
            ChatCompletionMessageToolCalls::Function(f) => f.function.name.clone(),
            other => panic!("not a function call: {other:?}"),
        })
        .collect();
    assert_eq!(names, ["get_time", "get_weather"]);
    let usage = reply.usage.expect("usage");
    let details = usage
        .completion_tokens_details
        .expect("completion_tokens_details");
    assert!(
        details.reasoning_tokens.unwrap_or(0) > 0,
        "reasoning counted"
    );

    // Streaming through the client: accumulate the calls the way its users do.
    let mut stream = openai.chat().create_stream(req).await.unwrap();
    let mut acc: Vec<(String, String, String)> = Vec::new();
    let mut finish = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        for choice in chunk.choices {
            for d in choice.delta.tool_calls.unwrap_or_default() {
                let i = d.index as usize;
                if acc.len() <= i {
                    acc.resize(i + 1, Default::default());
                }
                if let Some(id) = d.id {
                    acc[i].0.push_str(&id);
                }
                if let Some(f) = d.function {
                    acc[i].1.push_str(&f.name.unwrap_or_default());
                    acc[i].2.push_str(&f.arguments.unwrap_or_default());
                }
            }
            if choice.finish_reason.is_some() {
                finish = choice.finish_reason;
            }
        }
    }
    assert_eq!(finish, Some(FinishReason::ToolCalls));
    let names: Vec<&str> = acc.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        names,
        ["get_time", "get_weather"],
        "names are not repeated: {acc:?}"
    );
    for (id, _, args) in &acc {
        assert!(
            id.starts_with("call_") && !id[5..].contains("call_"),
            "{id}"
        );
        let _: Value = serde_json::from_str(args).expect("arguments accumulate to JSON");
    }
}

#[tokio::test]
async fn every_chat_shape_parses() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let client = stack.client();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let bodies = [
        json!({"model": "base", "messages": [{"role": "user", "content": "Call get_weather."}], "tools": tools_chat()}),
        json!({"model": "base", "messages": [{"role": "user", "content": "get_time and get_weather"}], "tools": tools_chat(), "tool_choice": "required"}),
        json!({"model": "base", "messages": [{"role": "user", "content": "x"}], "tools": tools_chat(), "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
        json!({"model": "base", "messages": [{"role": "user", "content": "Think."}], "enable_thinking": true}),
        json!({"model": "base", "messages": [{"role": "user", "content": "JSON."}], "response_format": {"type": "json_object"}}),
        json!({"model": "base", "messages": [{"role": "user", "content": "JSON."}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}}}),
        json!({"model": "base", "messages": [
            {"role": "user", "content": "Use get_time."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\":\"UTC\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "noon"}
        ], "tools": tools_chat()}),
        json!({"model": "base", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}
        ]}]}),
    ];
    for body in &bodies {
        let reply = client.post_json("/chat/completions", body).await.unwrap();
        assert_eq!(reply.status, 200, "{reply}");
        let typed: CreateChatCompletionResponse = parse(&reply.json());
        assert_eq!(typed.object, "chat.completion");
        assert!(typed.choices[0].finish_reason.is_some());

        let mut body = body.clone();
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let frames = chat::stream(&client, &body).await;
        assert!(frames.last().unwrap().is_done());
        let chunks: Vec<CreateChatCompletionStreamResponse> = frames[..frames.len() - 1]
            .iter()
            .map(|f| parse(&f.json()))
            .collect();
        assert!(chunks.last().unwrap().usage.is_some(), "usage chunk parses");
    }
}

#[tokio::test]
async fn responses_with_function_calls_and_reasoning_parse() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let client = stack.client();

    // The typed client, non-streaming and streaming.
    let req: CreateResponse = parse(&json!({
        "model": "base",
        "input": "Use get_time and get_weather.",
        "tools": tools_responses(),
        "reasoning": {"effort": "low", "summary": "auto"}
    }));
    let r = openai.responses().create(req.clone()).await.unwrap();
    assert_eq!(r.status, Status::Completed);
    assert!(
        matches!(&r.output[0], OutputItem::Reasoning(item) if matches!(item.summary.first(), Some(SummaryPart::SummaryText(s)) if !s.text.is_empty())),
        "{:?}",
        r.output
    );
    let names: Vec<&str> = r
        .output
        .iter()
        .filter_map(|i| match i {
            OutputItem::FunctionCall(c) => Some(c.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(names, ["get_time", "get_weather"]);
    let usage = r.usage.as_ref().expect("usage");
    assert!(usage.output_tokens_details.reasoning_tokens > 0);

    let mut stream = openai.responses().create_stream(req).await.unwrap();
    let mut kinds = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        let done = matches!(event, ResponseStreamEvent::ResponseCompleted(_));
        kinds.push(event);
        if done {
            break;
        }
    }
    assert!(matches!(
        kinds.first(),
        Some(ResponseStreamEvent::ResponseCreated(_))
    ));
    assert!(kinds.iter().any(|e| matches!(
        e,
        ResponseStreamEvent::ResponseFunctionCallArgumentsDelta(_)
    )));
    assert!(kinds
        .iter()
        .any(|e| matches!(e, ResponseStreamEvent::ResponseFunctionCallArgumentsDone(_))));
    assert!(kinds
        .iter()
        .any(|e| matches!(e, ResponseStreamEvent::ResponseReasoningSummaryTextDelta(_))));
    assert!(matches!(
        kinds.last(),
        Some(ResponseStreamEvent::ResponseCompleted(_))
    ));

    // Every frame of every shape through the crate's types.
    let first = client
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "Call get_time.", "tools": tools_responses()}),
        )
        .await
        .unwrap()
        .json();
    let call_id = first["output"][0]["call_id"].as_str().unwrap().to_owned();
    let schema = json!({"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"], "additionalProperties": false});
    let bodies = [
        json!({"model": "base", "input": "Call get_weather.", "tools": tools_responses(), "tool_choice": "required", "enable_thinking": true}),
        json!({"model": "base", "input": "x", "tools": tools_responses(), "tool_choice": {"type": "function", "name": "get_time"}}),
        json!({"model": "base", "input": "Think.", "reasoning": {"effort": "medium"}}),
        json!({"model": "base", "input": "JSON.", "text": {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": true}}}),
        json!({"model": "base", "previous_response_id": first["id"], "tools": tools_responses(),
               "input": [{"type": "function_call_output", "call_id": call_id, "output": "noon"}]}),
        json!({"model": "base", "input": "Long.", "max_output_tokens": 16, "enable_thinking": true}),
    ];
    for body in &bodies {
        let reply = client.post_json("/responses", body).await.unwrap();
        assert_eq!(reply.status, 200, "{reply}");
        let _: Response = parse(&reply.json());
        let mut body = body.clone();
        body["stream"] = json!(true);
        let frames: Vec<SseFrame> = client
            .stream("/responses", &body)
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        for f in &frames {
            let _: ResponseStreamEvent = parse(&f.json());
        }
    }
}
