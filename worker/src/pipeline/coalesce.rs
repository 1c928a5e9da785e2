//! Merging consecutive deltas of one kind into one event: all of them for a
//! caller that does not relay deltas (`batch_events`), otherwise whatever
//! the engine produced faster than the stream took it.

use inference_proto::v1 as pb;
use pb::generate_event::Event;

/// At most one pending event, grown while the next one can merge into it.
#[derive(Debug, Default)]
pub struct Coalescer {
    pending: Option<Event>,
}

impl Coalescer {
    /// Adds an event; returns the previous one when it cannot merge.
    pub fn push(&mut self, event: Event) -> Option<Event> {
        let Some(pending) = self.pending.as_mut() else {
            self.pending = Some(event);
            return None;
        };
        match (pending, &event) {
            (Event::Text(a), Event::Text(b)) => {
                a.text.push_str(&b.text);
                None
            }
            (Event::Reasoning(a), Event::Reasoning(b)) => {
                a.text.push_str(&b.text);
                None
            }
            (Event::ToolCall(a), Event::ToolCall(b)) if a.index == b.index && b.id.is_empty() => {
                a.arguments_fragment.push_str(&b.arguments_fragment);
                None
            }
            _ => self.pending.replace(event),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_none()
    }

    pub fn take(&mut self) -> Option<Event> {
        self.pending.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_kinds_merge_and_a_new_kind_releases_the_old() {
        let mut c = Coalescer::default();
        let text = |t: &str| Event::Text(pb::TextDelta { text: t.into() });
        assert!(c.push(text("a")).is_none());
        assert!(c.push(text("b")).is_none());
        let call = Event::ToolCall(pb::ToolCallDelta {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments_fragment: String::new(),
        });
        assert_eq!(c.push(call), Some(text("ab")));
        let frag = Event::ToolCall(pb::ToolCallDelta {
            index: 0,
            arguments_fragment: "{}".into(),
            ..Default::default()
        });
        assert!(c.push(frag).is_none());
        match c.take() {
            Some(Event::ToolCall(d)) => {
                assert_eq!(
                    (d.id.as_str(), d.arguments_fragment.as_str()),
                    ("call_1", "{}")
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
