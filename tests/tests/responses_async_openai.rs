//! The Responses API through the Rust `async-openai` crate: its strict
//! types must parse every object and stream event the gateway produces
//! (text, reasoning, function calls, incomplete, background replay,
//! input items, delete, errors).

use async_openai::error::OpenAIError;
use async_openai::types::responses::{CreateResponse, OutputItem, ResponseStreamEvent, Status};
use futures::StreamExt;
use harness::{json, Stack, Value};
use std::time::{Duration, Instant};

/// A typed request from its JSON form (what a client would send).
fn request(body: Value) -> CreateResponse {
    serde_json::from_value(body).expect("a valid CreateResponse")
}

fn tools() -> Value {
    json!([{"type":"function","name":"get_weather","description":"Weather in a city",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false},
        "strict":true}])
}

/// Every event of a stream, failing on any that does not parse.
async fn collect(
    mut stream: async_openai::types::responses::ResponseStream,
) -> Vec<ResponseStreamEvent> {
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(e) => events.push(e),
            Err(e) => panic!("event did not parse: {e:?} (after {events:?})"),
        }
    }
    events
}

#[tokio::test]
async fn objects_parse_into_the_typed_response() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let responses = openai.responses();

    let r = responses
        .create(request(json!({"model":"base","input":"Hello synthetic:reply_tokens=4",
            "instructions":"be brief","metadata":{"k":"v"},"reasoning":{"effort":"low","summary":"auto"}})))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Completed);
    assert!(matches!(r.output[0], OutputItem::Reasoning(_)));
    assert!(matches!(r.output[1], OutputItem::Message(_)));
    let usage = r.usage.clone().unwrap();
    assert!(usage.output_tokens_details.reasoning_tokens > 0);

    let calls = responses
        .create(request(json!({"model":"base","input":"Weather in Rome?","tools":tools(),"tool_choice":"required"})))
        .await
        .unwrap();
    assert!(calls
        .output
        .iter()
        .any(|o| matches!(o, OutputItem::FunctionCall(c) if c.name == "get_weather")));

    let cut = responses
        .create(request(
            json!({"model":"base","input":"x synthetic:reply_tokens=50","max_output_tokens":3}),
        ))
        .await
        .unwrap();
    assert_eq!(cut.status, Status::Incomplete);
    assert_eq!(cut.incomplete_details.unwrap().reason, "max_output_tokens");

    let again = responses.retrieve(&r.id).await.unwrap();
    assert_eq!(again.id, r.id);
    let items = responses.list_input_items(&r.id).await.unwrap();
    assert_eq!(items.data.len(), 1);
    let deleted = responses.delete(&r.id).await.unwrap();
    assert!(deleted.deleted);
    match responses.retrieve(&r.id).await {
        Err(OpenAIError::ApiError(e)) => assert_eq!(e.status_code.as_u16(), 404),
        other => panic!("expected 404, got {other:?}"),
    }
    match responses.cancel(&calls.id).await {
        Err(OpenAIError::ApiError(e)) => {
            assert_eq!(e.status_code.as_u16(), 400);
            assert_eq!(
                e.api_error.code.as_deref(),
                Some("response_not_cancellable")
            );
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

#[tokio::test]
async fn stream_events_parse() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let responses = openai.responses();

    let events = collect(
        responses
            .create_stream(request(
                json!({"model":"base","input":"Think synthetic:reply_tokens=5",
                "reasoning":{"effort":"low"}}),
            ))
            .await
            .unwrap(),
    )
    .await;
    assert!(matches!(events[0], ResponseStreamEvent::ResponseCreated(_)));
    assert!(events
        .iter()
        .any(|e| matches!(e, ResponseStreamEvent::ResponseReasoningSummaryTextDelta(_))));
    assert!(events
        .iter()
        .any(|e| matches!(e, ResponseStreamEvent::ResponseOutputTextDelta(_))));
    assert!(matches!(
        events.last(),
        Some(ResponseStreamEvent::ResponseCompleted(_))
    ));

    let events = collect(
        responses
            .create_stream(request(
                json!({"model":"base","input":"Weather?","tools":tools(),
                "tool_choice":{"type":"function","name":"get_weather"}}),
            ))
            .await
            .unwrap(),
    )
    .await;
    assert!(events
        .iter()
        .any(|e| matches!(e, ResponseStreamEvent::ResponseFunctionCallArgumentsDone(d) if d.name.as_deref() == Some("get_weather"))));

    let events = collect(
        responses
            .create_stream(request(
                json!({"model":"base","input":"x synthetic:reply_tokens=9","max_output_tokens":2}),
            ))
            .await
            .unwrap(),
    )
    .await;
    assert!(matches!(
        events.last(),
        Some(ResponseStreamEvent::ResponseIncomplete(_))
    ));
}

#[tokio::test]
async fn background_replay_parses() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let responses = openai.responses();
    let r = responses
        .create(request(
            json!({"model":"base","input":"bg synthetic:reply_tokens=6","background":true}),
        ))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Queued);
    let deadline = Instant::now() + Duration::from_secs(10);
    while responses.retrieve(&r.id).await.unwrap().status != Status::Completed {
        assert!(Instant::now() < deadline, "background run did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = collect(responses.retrieve_stream(&r.id).await.unwrap()).await;
    assert!(matches!(events[0], ResponseStreamEvent::ResponseCreated(_)));
    assert!(matches!(
        events.last(),
        Some(ResponseStreamEvent::ResponseCompleted(_))
    ));
}

/// Runs that do not complete parse too: a run that fails mid-stream ends
/// with `response.failed` (typed error), a cancelled background run is
/// `cancelled` on cancel and retrieve and its replay ends with
/// `response.incomplete`, and a follower whose run is deleted under it gets
/// an `error` event.
#[tokio::test]
async fn failed_and_cancelled_runs_parse() {
    let stack = Stack::builder().models(&["base"]).start().unwrap();
    let openai = harness::openai::client(&stack);
    let responses = openai.responses();

    let events = collect(
        responses
            .create_stream(request(
                json!({"model":"base","input":"x synthetic:reply_tokens=20 synthetic:fail_after=3"}),
            ))
            .await
            .unwrap(),
    )
    .await;
    match events.last() {
        Some(ResponseStreamEvent::ResponseFailed(f)) => {
            assert_eq!(f.response.status, Status::Failed);
            assert!(f.response.error.is_some(), "{f:?}");
        }
        other => panic!("expected response.failed, got {other:?}"),
    }

    let slow = json!({"model":"base","input":"bg synthetic:reply_tokens=400 synthetic:slow_ms=20","background":true});
    let r = responses.create(request(slow.clone())).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cancelled = responses.cancel(&r.id).await.unwrap();
    assert_eq!(cancelled.status, Status::Cancelled);
    assert_eq!(
        responses.retrieve(&r.id).await.unwrap().status,
        Status::Cancelled
    );
    let events = collect(responses.retrieve_stream(&r.id).await.unwrap()).await;
    assert!(matches!(events[0], ResponseStreamEvent::ResponseCreated(_)));
    assert!(matches!(
        events.last(),
        Some(ResponseStreamEvent::ResponseIncomplete(_))
    ));

    let r = responses.create(request(slow)).await.unwrap();
    let mut follow = responses.retrieve_stream(&r.id).await.unwrap();
    let first = follow.next().await.expect("an event").expect("parses");
    assert!(matches!(first, ResponseStreamEvent::ResponseCreated(_)));
    assert!(responses.delete(&r.id).await.unwrap().deleted);
    let mut rest = Vec::new();
    while let Some(event) = follow.next().await {
        match event {
            Ok(e) => rest.push(e),
            Err(e) => panic!("event did not parse: {e:?} (after {rest:?})"),
        }
    }
    assert!(
        matches!(rest.last(), Some(ResponseStreamEvent::ResponseError(_))),
        "a deleted run ends its followers with an error event: {rest:?}"
    );
}
