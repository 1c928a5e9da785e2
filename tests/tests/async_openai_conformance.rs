//! Conformance with the Rust `async-openai` crate: its typed requests and
//! strict response types must work against the live gateway unchanged.

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
    ChatCompletionRequestUserMessage, ChatCompletionStreamOptions, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs, FinishReason, Role,
};
use futures::StreamExt;
use harness::openai;
use harness::Stack;
use std::collections::BTreeSet;

fn request(model: &str, text: &str) -> CreateChatCompletionRequest {
    let messages: Vec<ChatCompletionRequestMessage> = vec![
        ChatCompletionRequestSystemMessage::from("Be brief.").into(),
        ChatCompletionRequestUserMessage::from(text).into(),
    ];
    CreateChatCompletionRequestArgs::default()
        .model(model)
        .messages(messages)
        .build()
        .unwrap()
}

#[tokio::test]
async fn chat_create_and_stream_parse_into_the_typed_responses() {
    let stack = Stack::builder().models(&["base-mini"]).start().unwrap();
    let openai = openai::client(&stack);

    let reply = openai
        .chat()
        .create(request("base-mini", "Hello. synthetic:reply_tokens=6"))
        .await
        .unwrap();
    assert!(reply.id.starts_with("chatcmpl-"));
    assert_eq!(reply.object, "chat.completion");
    assert_eq!(reply.model, "base-mini");
    let choice = &reply.choices[0];
    assert_eq!(choice.message.role, Role::Assistant);
    assert_eq!(choice.finish_reason, Some(FinishReason::Stop));
    let text = choice.message.content.clone().unwrap_or_default();
    assert!(!text.is_empty());
    let usage = reply.usage.expect("usage");
    assert_eq!(usage.completion_tokens, 6);
    assert_eq!(usage.total_tokens, usage.prompt_tokens + 6);
    assert!(usage.prompt_tokens_details.is_some());

    let mut req = request("base-mini", "Hello. synthetic:reply_tokens=6");
    req.stream_options = Some(ChatCompletionStreamOptions {
        include_usage: Some(true),
        ..Default::default()
    });
    let mut stream = openai.chat().create_stream(req).await.unwrap();
    let (mut streamed, mut roles, mut finish, mut usage) = (String::new(), 0, None, None);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert_eq!(chunk.object, "chat.completion.chunk");
        if let Some(u) = chunk.usage {
            assert!(chunk.choices.is_empty(), "the usage chunk has no choices");
            usage = Some(u);
        }
        for c in chunk.choices {
            roles += usize::from(c.delta.role.is_some());
            streamed.push_str(c.delta.content.as_deref().unwrap_or(""));
            if c.finish_reason.is_some() {
                finish = c.finish_reason;
            }
        }
    }
    assert_eq!(roles, 1, "the role comes once");
    assert_eq!(finish, Some(FinishReason::Stop));
    assert_eq!(usage.expect("a usage chunk").completion_tokens, 6);
    assert_eq!(streamed, text, "same prompt, same simulated reply");
}

#[tokio::test]
async fn models_list_and_retrieve() {
    let stack = Stack::builder().models(&[]).start().unwrap();
    let openai = openai::client(&stack);
    let list = openai.models().list().await.unwrap();
    assert_eq!(list.object, "list");
    let ids: BTreeSet<String> = list.data.iter().map(|m| m.id.clone()).collect();
    assert_eq!(
        ids,
        ["base", "base-mini", "base-ultra"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let m = openai.models().retrieve("base-ultra").await.unwrap();
    assert_eq!(
        (m.id.as_str(), m.created, m.owned_by.as_str()),
        ("base-ultra", 0, "base")
    );

    let (status, e) = openai::api_error(openai.models().retrieve("gpt-4o").await);
    assert_eq!(status, 404);
    assert_eq!(e.code.as_deref(), Some("model_not_found"));
}

#[tokio::test]
async fn errors_parse_with_status_code_and_param() {
    let stack = Stack::builder().models(&["base-mini"]).start().unwrap();

    let (status, e) = openai::api_error(
        openai::client_with_key(&stack, "sk-wrong")
            .chat()
            .create(request("base-mini", "hi"))
            .await,
    );
    assert_eq!(status, 401);
    assert_eq!(e.code.as_deref(), Some("invalid_api_key"));
    assert_eq!(e.r#type.as_deref(), Some("authentication_error"));

    let openai = openai::client(&stack);
    let (status, e) = openai::api_error(openai.chat().create(request("no-such-model", "hi")).await);
    assert_eq!(status, 404);
    assert_eq!(e.code.as_deref(), Some("model_not_found"));

    let mut req = request("base-mini", "hi");
    req.temperature = Some(3.0);
    let (status, e) = openai::api_error(openai.chat().create(req).await);
    assert_eq!(status, 400);
    assert_eq!(e.param.as_deref(), Some("temperature"));
    assert_eq!(e.r#type.as_deref(), Some("invalid_request_error"));
    assert!(e.code.is_some_and(|c| !c.is_empty()));
}
