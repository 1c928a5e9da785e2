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
use serde_json::Value;
use tonic::Status;

/// What one SSE `data:` payload was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    Data(String),
    /// `data: [DONE]`.
    Done,
}

/// Default bound on one SSE event (its line being read plus the data
/// lines gathered so far). A chunk of an OpenAI-compatible stream is a few
/// hundred bytes; the largest legitimate ones (a tool call's whole
/// arguments from a non-streaming tool parser) stay far below 1 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Splits a byte stream into SSE events' data. Bytes may arrive cut
/// anywhere (mid-line, mid-UTF-8 character). An event longer than its
/// bound fails the stream instead of growing the buffer: an engine that
/// never sends the newline must not take the worker's memory with it.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
    max_event_bytes: usize,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseDecoder {
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            line: Vec::new(),
            data: None,
            max_event_bytes: max_event_bytes.max(1),
        }
    }

    /// The payloads completed by `bytes`; an `ENGINE_FAILURE` status once
    /// an event outgrows the bound (nothing past it is buffered).
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<Payload>, Status> {
        let mut out = Vec::new();
        let mut rest = bytes;
        while let Some(at) = rest.iter().position(|&b| b == b'\n') {
            self.extend_line(&rest[..at])?;
            rest = &rest[at + 1..];
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, &mut out)?;
        }
        self.extend_line(rest)?;
        Ok(out)
    }

    /// Bytes held for the event being read.
    fn held(&self) -> usize {
        self.line.len() + self.data.as_ref().map_or(0, String::len)
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), Status> {
        if self.held() + bytes.len() > self.max_event_bytes {
            return Err(self.too_long());
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn too_long(&mut self) -> Status {
        // Let the buffers go now; the stream is over.
        self.line = Vec::new();
        self.data = None;
        status::engine_failure(format!(
            "the upstream engine sent an SSE event over {} bytes (a line without its \
             newline?); the stream was dropped",
            self.max_event_bytes
        ))
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Payload>) -> Result<(), Status> {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(if data == "[DONE]" {
                    Payload::Done
                } else {
                    Payload::Data(data)
                });
            }
            return Ok(());
        }
        // Comments (`: ping`), `event:`, `id:` and `retry:` carry nothing here.
        let Some(rest) = line.strip_prefix(b"data:") else {
            return Ok(());
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        // Many short `data:` lines without the blank line that ends the
        // event grow it too.
        if self.held() + rest.len() + 1 > self.max_event_bytes {
            return Err(self.too_long());
        }
        let text = String::from_utf8_lossy(rest);
        match &mut self.data {
            Some(d) => {
                d.push('\n');
                d.push_str(&text);
            }
            None => self.data = Some(text.into_owned()),
        }
        Ok(())
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
    /// The request's stop strings, and the one the engine said ended the
    /// reply (its index), if it said.
    stops: Vec<String>,
    stopped_by: Option<u32>,
    usage: Option<Usage>,
    /// Deltas relayed: the completion count when the engine reports no
    /// usage (one token each, as the engines stream them).
    deltas: u32,
    /// `max_tokens` (or the rest of the window): the most the reply may
    /// hold, whatever the engine sends.
    limit: Option<u32>,
    /// Deltas past `limit`, dropped.
    over: u32,
    /// The engine kept going past `limit`: the reply ended there.
    cut: bool,
    /// Tokens a moved generation had delivered before this engine
    /// continued it: in its completion, not in its prompt.
    resumed: u32,
}

/// Deltas past the limit dropped while waiting for the engine's own finish
/// and usage, before the worker ends the reply itself. Counting deltas
/// overcounts by one or two where an engine splits one token's output
/// (llama-server sends reasoning and content, or a tool call's name and
/// arguments, as separate chunks), so a well-behaved engine may look a
/// delta or two over and still deserves its usage chunk; one that ignores
/// `max_tokens` is cut after these.
const OVERRUN_GRACE: u32 = 16;

impl Relay {
    pub fn new(request_id: &str, enforced_tools: bool) -> Self {
        Self {
            parser: enforced_tools.then(|| ToolCallParser::new(request_id)),
            request_id: request_id.to_owned(),
            headed: Vec::new(),
            early_args: Vec::new(),
            native_calls: 0,
            finish: None,
            stops: Vec::new(),
            stopped_by: None,
            usage: None,
            deltas: 0,
            limit: None,
            over: 0,
            cut: false,
            resumed: 0,
        }
    }

    /// The reply continues a moved generation that had delivered `tokens`.
    pub fn resuming(mut self, tokens: u32) -> Self {
        self.resumed = tokens;
        self
    }

    /// The request's stop strings, to name the one that ended the reply
    /// when the engine says which (vLLM's `stop_reason`, SGLang's
    /// `matched_stop`; llama-server and others do not).
    pub fn with_stops(mut self, stops: Vec<String>) -> Self {
        self.stops = stops;
        self
    }

    /// Ends the reply with `length` once the engine sends more than
    /// `limit` completion tokens (an engine that ignores `max_tokens`).
    pub fn with_limit(mut self, limit: Option<u32>) -> Self {
        self.limit = limit;
        self
    }

    /// Whether the engine said how the reply ended, or the worker ended it
    /// at the limit.
    pub fn finished(&self) -> bool {
        self.finish.is_some()
    }

    /// Whether the worker ended the reply at the limit: the engine's stream
    /// is to be dropped, not read on.
    pub fn cut(&self) -> bool {
        self.cut
    }

    /// Takes one completion token for a delta; `false` when the delta is
    /// past the limit and dropped (the reply then ends with `length`, and
    /// is cut after [`OVERRUN_GRACE`] such deltas).
    fn take_token(&mut self) -> bool {
        if self.limit.is_some_and(|l| self.deltas >= l) {
            self.over += 1;
            self.finish = Some("length".into());
            if self.over > OVERRUN_GRACE {
                self.cut = true;
            }
            return false;
        }
        self.deltas += 1;
        true
    }

    /// The events of one chunk; an error frame fails the reply. After the
    /// cut, nothing more is relayed.
    pub fn chunk(&mut self, chunk: Chunk) -> Result<Vec<Event>, Status> {
        if self.cut {
            return Ok(Vec::new());
        }
        if let Some(err) = chunk.error {
            return Err(status::engine_failure(format!(
                "the upstream engine failed mid-stream: {}",
                err.message
            )));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage);
            // The engine's own count (per chunk with vLLM's continuous usage
            // stats) says this chunk goes past the limit: drop it.
            if self.limit.is_some_and(|l| usage.completion_tokens > l) {
                self.cut = true;
                self.finish = Some("length".into());
                return Ok(Vec::new());
            }
        }
        let mut out = Vec::new();
        for choice in chunk.choices {
            let d = choice.delta;
            for reasoning in [d.reasoning, d.reasoning_content].into_iter().flatten() {
                if !reasoning.is_empty() && self.take_token() {
                    out.push(Event::Reasoning(pb::ReasoningDelta { text: reasoning }));
                }
            }
            if let Some(text) = d.content.filter(|t| !t.is_empty() && self.take_token()) {
                match &mut self.parser {
                    Some(parser) => out.extend(parser.push(&text).into_iter().map(Event::ToolCall)),
                    None => out.push(Event::Text(pb::TextDelta { text })),
                }
            }
            for call in d.tool_calls {
                if self.take_token() {
                    self.native_call(call, &mut out);
                }
            }
            // Past the limit the reply ends with `length`, whatever the
            // engine says.
            if let Some(reason) = choice.finish_reason.filter(|_| self.over == 0) {
                self.finish = Some(reason);
                let matched = choice.stop_reason.or(choice.matched_stop);
                if let Some(Value::String(stop)) = matched {
                    self.stopped_by = (0u32..)
                        .zip(&self.stops)
                        .find(|(_, s)| **s == stop)
                        .map(|(i, _)| i);
                }
            }
            if self.cut {
                return Ok(out);
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

    /// The engine's count when it sent one, else the deltas relayed; never
    /// more than the limit once the worker cut the reply there.
    pub fn completion_tokens(&self) -> u32 {
        let n = self.usage.map_or(self.deltas, |u| u.completion_tokens);
        match self.limit {
            Some(limit) if self.cut || self.over > 0 => n.min(limit),
            _ => n,
        }
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
        // The engine counts a moved generation's delivered text as prompt:
        // the generation's prompt is the worker's own count of the request,
        // else the engine's less that text.
        let prompt_tokens = match (self.usage.is_some(), counted) {
            (_, Some(counted)) if self.resumed > 0 => counted,
            (true, _) => usage.prompt_tokens.saturating_sub(self.resumed),
            (false, counted) => counted.unwrap_or(0),
        };
        pb::Finished {
            reason: reason as i32,
            stop_index: self.stopped_by.filter(|_| reason == Reason::Stop),
            usage: Some(pb::Usage {
                prompt_tokens,
                cached_prompt_tokens: self.cached_tokens().unwrap_or(0).min(prompt_tokens),
                completion_tokens: self.completion_tokens().saturating_add(self.resumed),
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
                got.extend(d.push(piece).expect("within the bound"));
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
    fn an_event_past_the_bound_fails_without_growing_the_buffer() {
        let mut d = SseDecoder::new(64);
        // Within the bound, across pushes.
        assert_eq!(d.push(b"data: {\"a\":").expect("ok"), Vec::<Payload>::new());
        assert_eq!(
            d.push(b"1}\n\n").expect("ok"),
            vec![Payload::Data("{\"a\":1}".into())]
        );
        // A line that never ends: refused at the bound, in any slicing.
        let endless = vec![b'x'; 50];
        let mut d = SseDecoder::new(64);
        d.push(b"data: ").expect("ok");
        d.push(&endless).expect("56 bytes held");
        let err = d.push(&endless).expect_err("over 64");
        assert_eq!(status::reason_of(&err), Some("ENGINE_FAILURE"));
        assert!(err.message().contains("over 64 bytes"), "{}", err.message());
        assert!(d.line.capacity() <= 64 && d.data.is_none());
        // One huge read is refused as a whole, before it is copied.
        let mut d = SseDecoder::new(1024);
        assert!(d.push(&vec![b'x'; 1 << 20]).is_err());
        assert_eq!(d.line.capacity(), 0);
        // Many short data lines with no blank line between grow one event.
        let mut d = SseDecoder::new(64);
        let lines = "data: 0123456789\n".repeat(8);
        assert!(d.push(lines.as_bytes()).is_err());
        // Comments and other fields are bounded by the line cap too.
        let mut d = SseDecoder::new(64);
        assert!(d.push(format!(": {}", "p".repeat(100)).as_bytes()).is_err());
    }

    fn content(t: &str) -> Chunk {
        chunk(&format!(
            r#"{{"choices":[{{"delta":{{"content":"{t}"}}}}]}}"#
        ))
    }

    fn texts(events: &[Event]) -> String {
        events
            .iter()
            .map(|e| match e {
                Event::Text(t) => t.text.as_str(),
                Event::Reasoning(t) => t.text.as_str(),
                Event::ToolCall(t) => t.arguments_fragment.as_str(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_engine_past_max_tokens_is_cut_at_the_limit() {
        let mut r = Relay::new("r", false).with_limit(Some(4));
        let mut out = Vec::new();
        let mut read = 0;
        for i in 0..2000 {
            read = i;
            out.extend(r.chunk(content("t")).expect("ok"));
            if r.cut() {
                break;
            }
        }
        assert_eq!(texts(&out), "tttt", "exactly the limit is relayed");
        assert!(
            read < 4 + OVERRUN_GRACE + 2,
            "cut after the grace, at {read}"
        );
        // Nothing after the cut, not even the engine's own ending.
        assert!(r.chunk(content("t")).expect("ok").is_empty());
        let f = r.finish(Some(7));
        assert_eq!(f.reason(), Reason::Length);
        assert_eq!(f.usage.expect("usage").completion_tokens, 4);
    }

    #[test]
    fn reasoning_and_tool_call_deltas_count_against_the_limit() {
        let mut r = Relay::new("r", false).with_limit(Some(3));
        let mut out = Vec::new();
        for c in [
            r#"{"choices":[{"delta":{"reasoning_content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"b"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":"{"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"content":"late"}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            out.extend(r.chunk(chunk(c)).expect("ok"));
        }
        assert_eq!(texts(&out), "ab{", "{out:?}");
        assert!(!r.cut(), "two deltas over: still within the grace");
        assert_eq!(r.finish(None).reason(), Reason::Length);
        assert_eq!(r.completion_tokens(), 3);
    }

    #[test]
    fn the_stop_string_the_engine_names_is_reported() {
        let stops = vec!["zz".to_owned(), "END".to_owned()];
        for field in ["stop_reason", "matched_stop"] {
            let mut r = Relay::new("r", false).with_stops(stops.clone());
            r.chunk(content("a")).expect("ok");
            let end = format!(
                r#"{{"choices":[{{"delta":{{}},"finish_reason":"stop","{field}":"END"}}]}}"#
            );
            r.chunk(chunk(&end)).expect("ok");
            let f = r.finish(None);
            assert_eq!(
                (f.reason(), f.stop_index),
                (Reason::Stop, Some(1)),
                "{field}"
            );
        }
        // A token id (vLLM's stop_reason for a stop token) or nothing: none.
        let mut r = Relay::new("r", false).with_stops(stops);
        r.chunk(chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"stop","stop_reason":2}]}"#,
        ))
        .expect("ok");
        assert_eq!(r.finish(None).stop_index, None);
    }

    #[test]
    fn a_continued_reply_reports_the_whole_generation() {
        let usage = r#"{"choices":[],"usage":{"prompt_tokens":25,"completion_tokens":4}}"#;
        let mut r = Relay::new("r", false).resuming(10);
        r.chunk(content("a")).expect("ok");
        r.chunk(chunk(usage)).expect("ok");
        let u = r.finish(Some(15)).usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens),
            (15, 14),
            "counted prompt"
        );
        let mut r = Relay::new("r", false).resuming(10);
        r.chunk(chunk(usage)).expect("ok");
        let u = r.finish(None).usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens),
            (15, 14),
            "the engine's prompt less the delivered text"
        );
    }

    #[test]
    fn a_well_behaved_engine_keeps_its_finish_and_usage() {
        // Exactly the limit, then the engine's own ending.
        let mut r = Relay::new("r", false).with_limit(Some(2));
        for c in ["a", "b"] {
            r.chunk(content(c)).expect("ok");
        }
        r.chunk(chunk(
            r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#,
        ))
        .expect("ok");
        r.chunk(chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,
               "prompt_tokens_details":{"cached_tokens":3}}}"#,
        ))
        .expect("ok");
        assert!(!r.cut());
        let u = r.finish(None).usage.expect("usage");
        assert_eq!(
            (u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens),
            (5, 3, 2)
        );
        // No limit: nothing is counted against one.
        let mut r = Relay::new("r", false);
        for _ in 0..100 {
            r.chunk(content("a")).expect("ok");
        }
        assert!(!r.cut() && !r.finished());
    }

    #[test]
    fn the_engines_own_count_past_the_limit_cuts_at_once() {
        // vLLM's continuous usage stats: usage on every chunk.
        let mut r = Relay::new("r", false).with_limit(Some(2));
        let ev = r
            .chunk(chunk(
                r#"{"choices":[{"delta":{"content":"abc"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#,
            ))
            .expect("ok");
        assert!(ev.is_empty() && r.cut());
        let f = r.finish(None);
        assert_eq!(f.reason(), Reason::Length);
        let u = f.usage.expect("usage");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (5, 2));
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
                    ..Default::default()
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
