//! What a generation's consumer has been given so far: the tokens to bill
//! if it never finishes, and the output a worker continues when the
//! generation moves off a failed one (`pb::Resume`).

use inference_proto::v1 as pb;
use pb::generate_event::Event;

/// The output relayed to the consumer, across every worker that served it.
#[derive(Debug, Default)]
pub struct Delivered {
    output: OutputSeen,
    reasoning_output: OutputSeen,
    reasoning: String,
    text: String,
    tool_calls: Vec<pb::ToolCall>,
    /// Output a worker generated that never reached the consumer (it left
    /// while the worker held a batch or had events in flight): billed,
    /// never resumed from.
    undelivered: u64,
}

impl Delivered {
    /// What a generation that starts as a continuation (a run adopted from
    /// another replica) had delivered before it started here.
    pub fn from_resume(resume: &pb::Resume) -> Self {
        let seen = |tokens: u32| OutputSeen {
            before: u64::from(tokens),
            ..OutputSeen::default()
        };
        Self {
            output: seen(resume.completion_tokens),
            reasoning_output: seen(resume.reasoning_tokens),
            reasoning: resume.reasoning.clone(),
            text: resume.text.clone(),
            tool_calls: resume.tool_calls.clone(),
            undelivered: 0,
        }
    }

    /// Records one worker event as the consumer gets it; true when it
    /// carries generated output.
    pub fn record(&mut self, event: &pb::GenerateEvent) -> bool {
        let tokens = event.output_tokens;
        match &event.event {
            Some(Event::Text(t)) => self.text.push_str(&t.text),
            Some(Event::Reasoning(r)) => {
                self.reasoning.push_str(&r.text);
                self.reasoning_output.add(tokens);
            }
            Some(Event::ToolCall(d)) => self.tool_call(d),
            Some(Event::Finished(_)) | None => return false,
        }
        self.output.add(tokens);
        true
    }

    fn tool_call(&mut self, delta: &pb::ToolCallDelta) {
        let index = delta.index as usize;
        if self.tool_calls.len() <= index {
            self.tool_calls
                .resize_with(index + 1, pb::ToolCall::default);
        }
        let call = &mut self.tool_calls[index];
        if !delta.id.is_empty() {
            call.id.clone_from(&delta.id);
        }
        if !delta.name.is_empty() {
            call.name.clone_from(&delta.name);
        }
        call.arguments.push_str(&delta.arguments_fragment);
    }

    /// Whether an engine that continues text answers only (an engine
    /// server) could continue from here: answer text delivered, no tool
    /// call.
    pub fn continues_as_text(&self) -> bool {
        !self.text.is_empty() && self.tool_calls.is_empty()
    }

    /// Generated tokens delivered.
    pub fn tokens(&self) -> u64 {
        self.output.tokens()
    }

    /// The consumer left a call whose worker said it generated `generated`
    /// tokens, `relayed` of which reached the consumer.
    pub fn left_behind(&mut self, generated: u64, relayed: u64) {
        self.undelivered += generated.saturating_sub(relayed);
    }

    /// Generated tokens to bill: those delivered, and those a worker
    /// generated for a consumer that left before they reached it.
    pub fn billable_tokens(&self) -> u64 {
        self.tokens() + self.undelivered
    }

    /// What a worker continuing the generation is told was delivered.
    pub fn resume(&self) -> pb::Resume {
        let clamp = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        pb::Resume {
            reasoning: self.reasoning.clone(),
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
            completion_tokens: clamp(self.output.tokens()),
            reasoning_tokens: clamp(self.reasoning_output.tokens()),
        }
    }
}

/// Generated tokens in a run of output events. Workers that count tokens
/// per event are summed; events of a worker that does not (an engine
/// server's deltas, about one token each) count one each.
#[derive(Debug, Default, Clone, Copy)]
struct OutputSeen {
    /// Delivered before this generation started (a continuation's).
    before: u64,
    counted: u64,
    events: u64,
}

impl OutputSeen {
    fn add(&mut self, output_tokens: u32) {
        self.counted += u64::from(output_tokens);
        self.events += 1;
    }

    fn tokens(self) -> u64 {
        self.before
            + if self.counted > 0 {
                self.counted
            } else {
                self.events
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event: Event, output_tokens: u32) -> pb::GenerateEvent {
        pb::GenerateEvent {
            event: Some(event),
            output_tokens,
        }
    }

    #[test]
    fn output_is_counted_in_tokens_where_the_worker_counts_them() {
        let mut counted = OutputSeen::default();
        counted.add(1);
        counted.add(40);
        counted.add(0);
        assert_eq!(counted.tokens(), 41, "merged events carry their tokens");
        let mut uncounted = OutputSeen::default();
        uncounted.add(0);
        uncounted.add(0);
        assert_eq!(uncounted.tokens(), 2, "one token per event otherwise");
    }

    #[test]
    fn output_generated_after_the_consumer_left_is_billed_not_resumed() {
        let mut d = Delivered::default();
        d.record(&event(Event::Text(pb::TextDelta { text: "ab".into() }), 21));
        d.left_behind(40, 21);
        assert_eq!((d.tokens(), d.billable_tokens()), (21, 40));
        assert_eq!(d.resume().completion_tokens, 21);
        // A worker that counted less than arrived adds nothing.
        d.left_behind(3, 10);
        assert_eq!(d.billable_tokens(), 40);
    }

    #[test]
    fn the_resume_holds_every_kind_of_output_delivered() {
        let mut d = Delivered::default();
        let think = |t: &str| Event::Reasoning(pb::ReasoningDelta { text: t.into() });
        assert!(d.record(&event(think("Let me"), 2)));
        assert!(d.record(&event(think(" see."), 2)));
        assert!(d.record(&event(
            Event::Text(pb::TextDelta {
                text: "Calling.".into()
            }),
            1
        )));
        let header = pb::ToolCallDelta {
            index: 0,
            id: "call_1".into(),
            name: "f".into(),
            arguments_fragment: String::new(),
        };
        let args = pb::ToolCallDelta {
            index: 0,
            arguments_fragment: "{\"a\": ".into(),
            ..Default::default()
        };
        assert!(d.record(&event(Event::ToolCall(header), 3)));
        assert!(d.record(&event(Event::ToolCall(args), 2)));
        assert!(!d.record(&event(Event::Finished(pb::Finished::default()), 0)));
        let r = d.resume();
        assert_eq!(r.reasoning, "Let me see.");
        assert_eq!(r.text, "Calling.");
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].name, "f");
        assert_eq!(r.tool_calls[0].id, "call_1");
        assert_eq!(r.tool_calls[0].arguments, "{\"a\": ");
        assert_eq!((r.completion_tokens, r.reasoning_tokens), (10, 4));
        assert_eq!(d.tokens(), 10);

        // A continuation starts from what was delivered before it.
        let mut again = Delivered::from_resume(&r);
        assert_eq!(again.resume(), r);
        assert!(again.record(&event(
            Event::Text(pb::TextDelta {
                text: " Done.".into()
            }),
            2
        )));
        assert_eq!(again.resume().text, "Calling. Done.");
        assert_eq!(again.tokens(), 12);
    }
}
