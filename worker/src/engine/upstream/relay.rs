//! The engine's stream → `inference.v1` events: SSE framing ([`SseDecoder`]),
//! then each chunk's deltas ([`Relay`]): content, reasoning (both
//! `reasoning` and `reasoning_content`), tool calls (id and name once per
//! index, as the proto wants), the finish reason and usage.

use super::wire::{Chunk, Usage};
use crate::pipeline::tool_calls::ToolCallParser;
use crate::status;
use inference_proto::v1 as pb;
use pb::finished::Reason;
use pb::generate_event::Event;
use tonic::Status;

/// What one SSE `data:` payload was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Data(String),
    /// `data: [DONE]`.
    Done,
}

/// Splits a byte stream into SSE events' data. Bytes may arrive cut
/// anywhere (mid-line, mid-UTF-8 character).
#[derive(Debug, Default)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseDecoder {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Payload> {
        let mut out = Vec::new();
        for &b in bytes {
            if b != b'\n' {
                self.line.push(b);
                continue;
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out);
        }
        out
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Payload>) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(if data == "[DONE]" {
                    Payload::Done
                } else {
                    Payload::Data(data)
                });
            }
            return;
        }
        // Comments (`: ping`), `event:`, `id:` and `retry:` carry nothing here.
        let Some(rest) = line.strip_prefix(b"data:") else {
            return;
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        let text = String::from_utf8_lossy(rest);
        match &mut self.data {
            Some(d) => {
                d.push('\n');
                d.push_str(&text);
            }
            None => self.data = Some(text.into_owned()),
        }
    }
}

/// State of one relayed reply.
#[derive(Debug)]
pub struct Relay {
    /// Enforced tool choice: the content is the call's JSON.
    parser: Option<ToolCallParser>,
    request_id: String,
    /// Native tool calls whose header went out, by index.
    headed: Vec<u32>,
    /// Argument text that came before a call's name.
    early_args: Vec<(u32, String)>,
    native_calls: u32,
    finish: Option<String>,
    usage: Option<Usage>,
    /// Deltas seen: the completion count when the engine reports no usage.
    deltas: u32,
}

impl Relay {
    pub fn new(request_id: &str, enforced_tools: bool) -> Self {
        Self {
            parser: enforced_tools.then(|| ToolCallParser::new(request_id)),
            request_id: request_id.to_owned(),
            headed: Vec::new(),
            early_args: Vec::new(),
            native_calls: 0,
            finish: None,
            usage: None,
            deltas: 0,
        }
    }

    /// Whether the engine said how the reply ended.
    pub fn finished(&self) -> bool {
        self.finish.is_some()
    }

    /// The events of one chunk; an error frame fails the reply.
    pub fn chunk(&mut self, chunk: Chunk) -> Result<Vec<Event>, Status> {
        if let Some(err) = chunk.error {
            return Err(status::engine_failure(format!(
                "the upstream engine failed mid-stream: {}",
                err.message
            )));
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        let mut out = Vec::new();
        for choice in chunk.choices {
            let d = choice.delta;
            for reasoning in [d.reasoning, d.reasoning_content].into_iter().flatten() {
                if !reasoning.is_empty() {
                    self.deltas += 1;
                    out.push(Event::Reasoning(pb::ReasoningDelta { text: reasoning }));
                }
            }
            if let Some(text) = d.content.filter(|t| !t.is_empty()) {
                self.deltas += 1;
                match &mut self.parser {
                    Some(parser) => out.extend(parser.push(&text).into_iter().map(Event::ToolCall)),
                    None => out.push(Event::Text(pb::TextDelta { text })),
                }
            }
            for call in d.tool_calls {
                self.deltas += 1;
                self.native_call(call, &mut out);
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(reason);
            }
        }
        Ok(out)
    }

    fn native_call(&mut self, call: super::wire::ToolCallDelta, out: &mut Vec<Event>) {
        let index = call.index;
        let (name, args) = call
            .function
            .map(|f| (f.name.unwrap_or_default(), f.arguments.unwrap_or_default()))
            .unwrap_or_default();
        if !self.headed.contains(&index) {
            if name.is_empty() {
                // Arguments before the name: held until it comes.
                match self.early_args.iter_mut().find(|(i, _)| *i == index) {
                    Some((_, held)) => held.push_str(&args),
                    None => self.early_args.push((index, args)),
                }
                return;
            }
            self.headed.push(index);
            self.native_calls += 1;
            let id = call
                .id
                .filter(|id| !id.is_empty())
                .unwrap_or_else(|| format!("call_{}_{index}", self.request_id));
            out.push(Event::ToolCall(pb::ToolCallDelta {
                index,
                id,
                name,
                arguments_fragment: String::new(),
            }));
            let held = self
                .early_args
                .iter()
                .position(|(i, _)| *i == index)
                .map(|p| self.early_args.remove(p).1)
                .unwrap_or_default();
            let args = held + &args;
            if !args.is_empty() {
                out.push(Event::ToolCall(pb::ToolCallDelta {
                    index,
                    arguments_fragment: args,
                    ..Default::default()
                }));
            }
            return;
        }
        // Later deltas repeat neither id nor name (some engines do).
        if !args.is_empty() {
            out.push(Event::ToolCall(pb::ToolCallDelta {
                index,
                arguments_fragment: args,
                ..Default::default()
            }));
        }
    }

    /// The engine's reused prompt tokens, once usage arrived.
    pub fn cached_tokens(&self) -> Option<u32> {
        self.usage
            .and_then(|u| u.prompt_tokens_details)
            .and_then(|d| d.cached_tokens)
    }

    pub fn completion_tokens(&self) -> u32 {
        self.usage.map_or(self.deltas, |u| u.completion_tokens)
    }

    /// The last event. `counted`: the worker's own prompt count, used when
    /// the engine reports no usage.
    pub fn finish(&self, counted: Option<u32>) -> pb::Finished {
        let calls = self.native_calls + self.parser.as_ref().map_or(0, ToolCallParser::calls);
        let reason = match self.finish.as_deref() {
            Some("length") => Reason::Length,
            Some("tool_calls" | "function_call") => Reason::ToolCalls,
            // A call parsed from enforced JSON, or a parser that said
            // `stop` after calls.
            _ if calls > 0 => Reason::ToolCalls,
            _ => Reason::Stop,
        };
        let usage = self.usage.unwrap_or_default();
        pb::Finished {
            reason: reason as i32,
            usage: Some(pb::Usage {
                prompt_tokens: if self.usage.is_some() {
                    usage.prompt_tokens
                } else {
                    counted.unwrap_or(0)
                },
                cached_prompt_tokens: self.cached_tokens().unwrap_or(0),
                completion_tokens: self.completion_tokens(),
                reasoning_tokens: usage
                    .completion_tokens_details
                    .and_then(|d| d.reasoning_tokens)
                    .unwrap_or(0),
                image_tokens: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(json: &str) -> Chunk {
        serde_json::from_str(json).expect("chunk")
    }

    #[test]
    fn sse_frames_split_anywhere_decode_the_same() {
        let stream = "data: {\"a\":1}\r\n\r\n: ping\n\ndata: {\"b\":\"é\"}\n\ndata: [DONE]\n\n";
        let bytes = stream.as_bytes();
        for cut in 1..8 {
            let mut d = SseDecoder::default();
            let mut got = Vec::new();
            for piece in bytes.chunks(cut) {
                got.extend(d.push(piece));
            }
            assert_eq!(
                got,
                vec![
                    Payload::Data("{\"a\":1}".into()),
                    Payload::Data("{\"b\":\"é\"}".into()),
                    Payload::Done
                ],
                "cut {cut}"
            );
        }
    }

    #[test]
    fn content_and_both_reasoning_fields_become_events() {
        let mut r = Relay::new("r", false);
        let ev = r
            .chunk(chunk(
                r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            ))
            .expect("ok");
        assert!(ev.is_empty());
        let ev = r
            .chunk(chunk(r#"{"choices":[{"delta":{"reasoning":"think"}}]}"#))
            .expect("ok");
        assert_eq!(
            ev,
            vec![Event::Reasoning(pb::ReasoningDelta {
                text: "think".into()
            })]
        );
        let ev = r
            .chunk(chunk(
                r#"{"choices":[{"delta":{"reasoning_content":"more"}}]}"#,
            ))
            .expect("ok");
        assert_eq!(
            ev,
            vec![Event::Reasoning(pb::ReasoningDelta {
                text: "more".into()
            })]
        );
        let ev = r
            .chunk(chunk(
                r#"{"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}"#,
            ))
            .expect("ok");
        assert_eq!(ev, vec![Event::Text(pb::TextDelta { text: "Hi".into() })]);
        r.chunk(chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#,
        ))
        .expect("ok");
        r.chunk(chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,
               "prompt_tokens_details":{"cached_tokens":8},
               "completion_tokens_details":{"reasoning_tokens":2}}}"#,
        ))
        .expect("ok");
        let f = r.finish(Some(99));
        assert_eq!(f.reason(), Reason::Length);
        let u = f.usage.expect("usage");
        assert_eq!(
            (
                u.prompt_tokens,
                u.cached_prompt_tokens,
                u.completion_tokens,
                u.reasoning_tokens
            ),
            (12, 8, 3, 2)
        );
    }

    #[test]
    fn without_usage_the_counts_fall_back() {
        let mut r = Relay::new("r", false);
        for t in ["a", "b", "c"] {
            r.chunk(chunk(&format!(
                r#"{{"choices":[{{"delta":{{"content":"{t}"}}}}]}}"#
            )))
            .expect("ok");
        }
        let u = r.finish(Some(20)).usage.expect("usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (20, 3));
    }

    #[test]
    fn native_tool_calls_send_id_and_name_once() {
        let mut r = Relay::new("r", false);
        let mut ev = Vec::new();
        for c in [
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_x","type":"function","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_x","function":{"name":"f","arguments":"{\"a\":"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"name":"g"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ] {
            ev.extend(r.chunk(chunk(c)).expect("ok"));
        }
        let deltas: Vec<pb::ToolCallDelta> = ev
            .into_iter()
            .map(|e| match e {
                Event::ToolCall(d) => d,
                other => panic!("{other:?}"),
            })
            .collect();
        let headers: Vec<_> = deltas.iter().filter(|d| !d.id.is_empty()).collect();
        assert_eq!(headers.len(), 2);
        assert_eq!(
            (headers[0].id.as_str(), headers[0].name.as_str()),
            ("call_x", "f")
        );
        assert_eq!(headers[1].name, "g");
        assert!(headers[1].id.starts_with("call_"));
        let args = |i: u32| -> String {
            deltas
                .iter()
                .filter(|d| d.index == i)
                .map(|d| d.arguments_fragment.as_str())
                .collect()
        };
        assert_eq!(args(0), "{\"a\":1}");
        assert_eq!(args(1), "{}");
        assert!(deltas
            .iter()
            .filter(|d| d.id.is_empty())
            .all(|d| d.name.is_empty()));
        // Calls were made: tool_calls, even though the engine said stop.
        assert_eq!(r.finish(None).reason(), Reason::ToolCalls);
    }

    #[test]
    fn enforced_tool_json_is_parsed_into_calls() {
        let mut r = Relay::new("r", true);
        let mut ev = Vec::new();
        for piece in [
            r#"{"name": "get_"#,
            r#"weather", "arguments": {"city"#,
            r#"": "Paris"}}"#,
        ] {
            let c = Chunk {
                choices: vec![super::super::wire::Choice {
                    delta: super::super::wire::Delta {
                        content: Some(piece.into()),
                        ..Default::default()
                    },
                    finish_reason: None,
                }],
                ..Default::default()
            };
            ev.extend(r.chunk(c).expect("ok"));
        }
        r.chunk(chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ))
        .expect("ok");
        let mut name = String::new();
        let mut args = String::new();
        for e in ev {
            let Event::ToolCall(d) = e else {
                panic!("text leaked")
            };
            name.push_str(&d.name);
            args.push_str(&d.arguments_fragment);
        }
        assert_eq!(name, "get_weather");
        assert_eq!(args, r#"{"city": "Paris"}"#);
        assert_eq!(r.finish(None).reason(), Reason::ToolCalls);
    }

    #[test]
    fn an_error_frame_fails_the_reply() {
        let mut r = Relay::new("r", false);
        let err = r
            .chunk(chunk(
                r#"{"error":{"message":"boom","type":"server_error"}}"#,
            ))
            .expect_err("error frame");
        assert_eq!(status::reason_of(&err), Some("ENGINE_FAILURE"));
        assert!(err.message().contains("boom"));
    }
}
