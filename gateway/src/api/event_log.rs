//! The output a run's event log tells, folded back into output items.
//!
//! A run ended from outside its owner (a cancel, or the sweeper after the
//! owner's lease lapsed) has only its event log to show what was generated:
//! the owner's in-memory object is out of reach. Folding the log keeps the
//! stored object and its replay one story: `GET /responses/{id}` lists the
//! same text that `?stream=true` replays, with the items that never got
//! their `.done` event marked `incomplete`.

use super::responses::{EncodedEvent, OutputItem, OutputText, SummaryPart};
use serde::Deserialize;

/// The payload fields the fold reads; every other field is ignored.
#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    output_index: Option<usize>,
    #[serde(default)]
    content_index: Option<usize>,
    #[serde(default)]
    summary_index: Option<usize>,
    #[serde(default)]
    delta: Option<String>,
    #[serde(default)]
    item: Option<OutputItem>,
}

/// The output items that `events` (a run's log, in order) produced.
/// Events that cannot be read are skipped: the fold shows what it can
/// rather than nothing.
pub fn fold_output(events: &[EncodedEvent]) -> Vec<OutputItem> {
    let (mut output, done) = fold(events);
    for (item, finished) in output.iter_mut().zip(done) {
        if finished {
            continue;
        }
        match item {
            OutputItem::Message { status, .. } | OutputItem::FunctionCall { status, .. } => {
                *status = "incomplete".into();
            }
            OutputItem::Reasoning { status, .. } => *status = Some("incomplete".into()),
        }
    }
    output
}

/// The output of a log that stopped mid-run, to be continued (a run handed
/// to another replica with its output so far): the items as they stand,
/// and whether the last one is still open. `None` when an earlier item
/// never finished, which a log written by one encoder never shows (it
/// closes each item before it opens the next).
pub fn fold_to_continue(events: &[EncodedEvent]) -> Option<(Vec<OutputItem>, bool)> {
    let (output, done) = fold(events);
    let last_open = done.last().is_some_and(|finished| !finished);
    let earlier_open = done.iter().rev().skip(1).any(|finished| !finished);
    (!earlier_open).then_some((output, last_open))
}

/// The items and, for each, whether its `.done` event was seen.
fn fold(events: &[EncodedEvent]) -> (Vec<OutputItem>, Vec<bool>) {
    let mut output: Vec<OutputItem> = Vec::new();
    let mut done: Vec<bool> = Vec::new();
    for event in events {
        let Ok(p) = serde_json::from_str::<Payload>(&event.data) else {
            continue;
        };
        let Some(index) = p.output_index else {
            continue;
        };
        match event.name.as_str() {
            "response.output_item.added" | "response.output_item.done" => {
                let Some(item) = p.item else { continue };
                let finished = event.name == "response.output_item.done";
                if index < output.len() {
                    output[index] = item;
                    done[index] = finished;
                } else if index == output.len() {
                    output.push(item);
                    done.push(finished);
                }
            }
            "response.content_part.added" => {
                if let Some(OutputItem::Message { content, .. }) = output.get_mut(index) {
                    if p.content_index == Some(content.len()) {
                        content.push(OutputText::new(String::new()));
                    }
                }
            }
            "response.reasoning_summary_part.added" => {
                if let Some(OutputItem::Reasoning { summary, .. }) = output.get_mut(index) {
                    if p.summary_index == Some(summary.len()) {
                        summary.push(SummaryPart::new(String::new()));
                    }
                }
            }
            "response.output_text.delta" => {
                if let (Some(OutputItem::Message { content, .. }), Some(delta)) =
                    (output.get_mut(index), &p.delta)
                {
                    if let Some(part) = content.get_mut(p.content_index.unwrap_or(0)) {
                        part.text.push_str(delta);
                    }
                }
            }
            "response.reasoning_summary_text.delta" => {
                if let (Some(OutputItem::Reasoning { summary, .. }), Some(delta)) =
                    (output.get_mut(index), &p.delta)
                {
                    if let Some(part) = summary.get_mut(p.summary_index.unwrap_or(0)) {
                        part.text.push_str(delta);
                    }
                }
            }
            "response.function_call_arguments.delta" => {
                if let (Some(OutputItem::FunctionCall { arguments, .. }), Some(delta)) =
                    (output.get_mut(index), &p.delta)
                {
                    arguments.push_str(delta);
                }
            }
            _ => {}
        }
    }
    (output, done)
}

/// Event logs for tests, as an encoder writes them.
#[cfg(test)]
pub(crate) mod test_log {
    use super::EncodedEvent;
    use serde_json::json;

    pub fn ev(seq: u64, name: &str, data: serde_json::Value) -> EncodedEvent {
        let mut data = data;
        data["type"] = json!(name);
        data["sequence_number"] = json!(seq);
        EncodedEvent {
            seq,
            name: name.into(),
            data: data.to_string(),
        }
    }

    pub fn message_added(seq: u64, index: usize, id: &str) -> EncodedEvent {
        ev(
            seq,
            "response.output_item.added",
            json!({"output_index": index, "item": {"type": "message", "id": id,
                "status": "in_progress", "role": "assistant", "content": []}}),
        )
    }

    /// A log cut while message `msg_1` was being written: the opening
    /// events, the item and its part, then one delta each of `deltas`.
    pub fn open_message(deltas: &[&str]) -> Vec<EncodedEvent> {
        let mut log = vec![
            ev(0, "response.created", json!({"response": {}})),
            ev(1, "response.in_progress", json!({"response": {}})),
            message_added(2, 0, "msg_1"),
            ev(
                3,
                "response.content_part.added",
                json!({"output_index": 0, "content_index": 0, "item_id": "msg_1",
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
            ),
        ];
        for delta in deltas {
            let seq = log.len() as u64;
            log.push(ev(
                seq,
                "response.output_text.delta",
                json!({"output_index": 0, "content_index": 0, "item_id": "msg_1", "delta": delta}),
            ));
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::test_log::{ev, message_added, open_message};
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unfinished_message_keeps_its_text_and_is_incomplete() {
        let events = open_message(&["Hel", "lo"]);
        let output = fold_output(&events);
        assert_eq!(output.len(), 1);
        let OutputItem::Message {
            id,
            status,
            content,
            ..
        } = &output[0]
        else {
            panic!("a message: {output:?}")
        };
        assert_eq!((id.as_str(), status.as_str()), ("msg_1", "incomplete"));
        assert_eq!(content[0].text, "Hello");
        assert!(content[0].annotations.is_empty());
    }

    #[test]
    fn a_log_to_continue_keeps_its_last_item_open() {
        let mut events = open_message(&["Hel"]);
        let (output, last_open) = fold_to_continue(&events).expect("continuable");
        assert!(last_open);
        let OutputItem::Message {
            status, content, ..
        } = &output[0]
        else {
            panic!("a message: {output:?}")
        };
        assert_eq!(status, "in_progress", "still open, not incomplete");
        assert_eq!(content[0].text, "Hel");

        // An item left open before another opened: not one encoder's log.
        events.push(message_added(5, 1, "msg_2"));
        assert!(fold_to_continue(&events).is_none());
    }

    #[test]
    fn finished_items_are_taken_whole_and_later_ones_fold_from_deltas() {
        let done_reasoning = json!({"type": "reasoning", "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "think"}]});
        let events = vec![
            ev(
                0,
                "response.output_item.added",
                json!({"output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            ),
            ev(
                1,
                "response.reasoning_summary_part.added",
                json!({"output_index": 0, "summary_index": 0, "item_id": "rs_1",
                    "part": {"type": "summary_text", "text": ""}}),
            ),
            ev(
                2,
                "response.reasoning_summary_text.delta",
                json!({"output_index": 0, "summary_index": 0, "delta": "thi"}),
            ),
            ev(
                3,
                "response.output_item.done",
                json!({"output_index": 0, "item": done_reasoning}),
            ),
            ev(
                4,
                "response.output_item.added",
                json!({"output_index": 1, "item": {"type": "function_call", "id": "fc_1",
                    "call_id": "call_1", "name": "f", "arguments": "", "status": "in_progress"}}),
            ),
            ev(
                5,
                "response.function_call_arguments.delta",
                json!({"output_index": 1, "item_id": "fc_1", "delta": "{\"a\":"}),
            ),
            ev(
                6,
                "response.output_text.delta",
                json!({"delta": "no index"}),
            ),
            ev(7, "garbage", json!(null)),
        ];
        let output = fold_output(&events);
        assert_eq!(output.len(), 2);
        assert_eq!(
            serde_json::to_value(&output[0]).unwrap(),
            done_reasoning,
            "a finished item as its .done event had it"
        );
        let OutputItem::FunctionCall {
            arguments, status, ..
        } = &output[1]
        else {
            panic!("a call: {output:?}")
        };
        assert_eq!(arguments, "{\"a\":");
        assert_eq!(status, "incomplete");
    }

    #[test]
    fn an_empty_log_has_no_output() {
        assert!(fold_output(&[]).is_empty());
    }
}
