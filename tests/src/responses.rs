//! The Responses API as a client sees it: create, wait for a stored run to
//! reach a status, replay a stored run's events, and the text of an object.

use crate::{Client, SseFrame, Value};
use std::time::{Duration, Instant};

/// Posts `body` to `/responses` and returns the object; panics unless it is
/// a 200.
pub async fn create(client: &Client, body: &Value) -> Value {
    let reply = client.post_json("/responses", body).await.expect("create");
    assert_eq!(reply.status, 200, "{reply}");
    reply.json()
}

/// The id of a Responses object.
#[track_caller]
pub fn id(response: &Value) -> String {
    response["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {response}"))
        .to_owned()
}

/// Retrieves `/responses/{id}` (each time a 200) until its status is one of
/// `statuses` or `within` has passed, and returns the last object: the
/// caller asserts on it, so a run that never got there fails with its
/// state.
pub async fn wait_for_status(
    client: &Client,
    id: &str,
    statuses: &[&str],
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let reply = client
            .get(&format!("/responses/{id}"))
            .await
            .expect("retrieve");
        assert_eq!(reply.status, 200, "{reply}");
        let response = reply.json();
        if statuses.contains(&response["status"].as_str().unwrap_or_default())
            || Instant::now() > deadline
        {
            return response;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The events of a stored background run, replayed from the start
/// (`GET /responses/{id}?stream=true`) to its end.
pub async fn replay(client: &Client, id: &str) -> Vec<SseFrame> {
    client
        .open_stream(client.request(
            reqwest::Method::GET,
            &format!("/responses/{id}?stream=true"),
        ))
        .await
        .expect("replay stream")
        .collect()
        .await
        .expect("replayed frames")
}

/// The `delta`s of a stream's `response.output_text.delta` events, joined.
pub fn streamed_text(frames: &[SseFrame]) -> String {
    frames
        .iter()
        .filter(|f| f.event.as_deref() == Some("response.output_text.delta"))
        .filter_map(|f| f.json()["delta"].as_str().map(str::to_owned))
        .collect()
}

/// The text of a Responses object's message items.
pub fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect()
}
