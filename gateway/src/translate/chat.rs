//! Chat completions <-> worker protocol.
//!
//! `to_worker` builds the `GenerateRequest`; `ChatAggregate` folds worker
//! events into one `chat.completion`; `ChatStreamEncoder` turns them into
//! `chat.completion.chunk` SSE frames in the order clients rely on.

use super::{finish_reason, now_unix};
use crate::api::chat::{
    AssistantMessage, ChatChunk, ChatCompletion, ChatCompletionRequest, ChatUsage, Choice,
    ChunkChoice, CompletionTokensDetails, ContentPart, Delta, FunctionCall, FunctionChunk,
    MessageContent, PromptTokensDetails, ToolCall, ToolCallChunk, UsageField,
};
use crate::output_check::{self, OutputFormat};
use crate::sse;
use crate::validate::chat::ValidChatRequest;
use bytes::BytesMut;
use inference_proto::v1 as pb;
use serde_json::Value;

// What the gateway accepts, every worker accepts: a worker refuses stop
// strings over the protocol's bounds (a character is at most 4 bytes).
const _: () = assert!(
    crate::api::bounds::MAX_STOPS <= inference_proto::limits::MAX_STOPS
        && crate::api::bounds::MAX_STOP_CHARS * 4 <= inference_proto::limits::MAX_STOP_BYTES
);

/// Builds the worker request from a validated chat request.
pub fn to_worker(
    req: &ChatCompletionRequest,
    valid: &ValidChatRequest,
    request_id: &str,
) -> pb::GenerateRequest {
    let messages = req
        .messages
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|m| pb::Message {
            role: m.role.clone().unwrap_or_default(),
            content: match &m.content {
                None => Vec::new(),
                Some(MessageContent::Text(t)) => vec![text_part(t.clone())],
                Some(MessageContent::Parts(parts)) => {
                    parts.iter().filter_map(part_to_worker).collect()
                }
            },
            name: m.name.clone().unwrap_or_default(),
            tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
            tool_calls: m
                .tool_calls
                .as_deref()
                .unwrap_or_default()
                .iter()
                .map(|c| pb::ToolCall {
                    id: c.id.clone(),
                    name: c.function.name.clone(),
                    arguments: c.function.arguments.clone(),
                })
                .collect(),
            reasoning: m.reasoning_content.clone().unwrap_or_default(),
        })
        .collect();
    let tools = req
        .tools
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.function.as_ref())
        .map(|f| pb::FunctionTool {
            name: f.name.clone().unwrap_or_default(),
            description: f.description.clone().unwrap_or_default(),
            parameters_json: f
                .parameters
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default(),
            strict: f.strict.unwrap_or(false),
        })
        .collect();
    pb::GenerateRequest {
        request_id: request_id.to_owned(),
        model: valid.model.id.to_owned(),
        messages,
        tools,
        tool_choice: Some(tool_choice(req.tool_choice.as_ref())),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        sampling: Some(pb::Sampling {
            temperature: req.temperature,
            top_p: req.top_p,
            max_tokens: valid.max_tokens,
            stop: valid.stop.clone(),
            seed: req.seed.map(|s| s as u64),
            presence_penalty: req.presence_penalty,
            frequency_penalty: req.frequency_penalty,
            // The worker's model default; no public field sets it.
            repeat_penalty: None,
            top_k: None,
        }),
        response_format: req.response_format.as_ref().map(|f| {
            let schema = f.json_schema.as_ref();
            pb::ResponseFormat {
                kind: match f.kind.as_deref() {
                    Some("json_object") => pb::response_format::Kind::JsonObject,
                    Some("json_schema") => pb::response_format::Kind::JsonSchema,
                    _ => pb::response_format::Kind::Text,
                } as i32,
                schema_name: schema.and_then(|s| s.name.clone()).unwrap_or_default(),
                schema_json: schema
                    .and_then(|s| s.schema.as_ref())
                    .map(Value::to_string)
                    .unwrap_or_default(),
                strict: schema.and_then(|s| s.strict).unwrap_or(false),
            }
        }),
        reasoning: Some(pb::Reasoning {
            enabled: valid.reasoning,
            budget_tokens: valid.reasoning_budget,
            effort: req.reasoning_effort.clone().unwrap_or_default(),
        }),
        cache_key: req.prompt_cache_key.clone().unwrap_or_default(),
        // A non-streaming reply is relayed as one body: no need for
        // token-sized frames.
        batch_events: !valid.stream,
        resume: None,
        // The generation driver sets the tier it serves the request at.
        service_tier: 0,
    }
}

/// The output format to check the finished reply against.
pub fn output_format(req: &ChatCompletionRequest) -> OutputFormat {
    let Some(f) = &req.response_format else {
        return OutputFormat::Text;
    };
    match f.kind.as_deref() {
        Some("json_object") => OutputFormat::JsonObject,
        Some("json_schema") => f
            .json_schema
            .as_ref()
            .and_then(|s| s.schema.clone())
            .map_or(OutputFormat::JsonObject, OutputFormat::JsonSchema),
        _ => OutputFormat::Text,
    }
}

fn text_part(text: String) -> pb::ContentPart {
    pb::ContentPart {
        part: Some(pb::content_part::Part::Text(text)),
    }
}

fn part_to_worker(part: &ContentPart) -> Option<pb::ContentPart> {
    match part {
        ContentPart::Text { text } => Some(text_part(text.clone())),
        ContentPart::ImageUrl { image_url } => Some(pb::ContentPart {
            part: Some(pb::content_part::Part::ImageUrl(pb::ImageUrl {
                url: image_url.url.clone(),
                detail: image_url.detail.clone().unwrap_or_else(|| "auto".into()),
            })),
        }),
        ContentPart::Refusal { refusal } => Some(text_part(refusal.clone())),
        // Validation refuses audio and file parts before translation.
        ContentPart::InputAudio { .. } | ContentPart::File { .. } => None,
    }
}

/// `tool_choice`: `"auto" | "none" | "required"` or `{type:"function", function:{name}}`.
pub fn tool_choice(choice: Option<&Value>) -> pb::ToolChoice {
    use pb::tool_choice::Mode;
    let (mode, name) = match choice {
        Some(Value::String(s)) => match s.as_str() {
            "none" => (Mode::None, String::new()),
            "required" => (Mode::Required, String::new()),
            _ => (Mode::Auto, String::new()),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            (Mode::Named, name.to_owned())
        }
        _ => (Mode::Auto, String::new()),
    };
    pb::ToolChoice {
        mode: mode as i32,
        function_name: name,
    }
}

/// Worker usage in the chat shape.
pub fn usage(u: &pb::Usage) -> ChatUsage {
    ChatUsage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
        total_tokens: u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: u.cached_prompt_tokens,
            audio_tokens: 0,
        },
        completion_tokens_details: CompletionTokensDetails {
            reasoning_tokens: u.reasoning_tokens,
            ..Default::default()
        },
        reasoning_tokens: u.reasoning_tokens,
    }
}

/// Folds a worker stream into one non-streaming reply.
#[derive(Debug, Default)]
pub struct ChatAggregate {
    content: String,
    reasoning: String,
    tool_calls: Vec<ToolCall>,
    finished: Option<pb::Finished>,
}

impl ChatAggregate {
    pub fn push(&mut self, event: pb::GenerateEvent) {
        use pb::generate_event::Event;
        match event.event {
            Some(Event::Text(t)) => self.content.push_str(&t.text),
            Some(Event::Reasoning(r)) => self.reasoning.push_str(&r.text),
            Some(Event::ToolCall(d)) => {
                let i = d.index as usize;
                if i >= self.tool_calls.len() {
                    self.tool_calls.resize_with(i + 1, || ToolCall {
                        id: String::new(),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: String::new(),
                            arguments: String::new(),
                        },
                    });
                }
                let call = &mut self.tool_calls[i];
                if !d.id.is_empty() {
                    call.id = d.id;
                }
                if !d.name.is_empty() {
                    call.function.name = d.name;
                }
                call.function.arguments.push_str(&d.arguments_fragment);
            }
            Some(Event::Finished(f)) => self.finished = Some(f),
            None => {}
        }
    }

    /// Whether the worker's finish was folded in.
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// The reply, or a 500 when a normally finished reply does not match
    /// the requested output format.
    pub fn into_completion(
        self,
        id: String,
        model: &str,
        valid: &ValidChatRequest,
        format: &OutputFormat,
    ) -> Result<ChatCompletion, crate::error::ApiError> {
        let finished = self.finished.unwrap_or_default();
        if finished.reason == pb::finished::Reason::Stop as i32 {
            output_check::check(format, &self.content, model)?;
        }
        let usage = usage(&finished.usage.unwrap_or_default());
        let content = if self.content.is_empty() && !self.tool_calls.is_empty() {
            None
        } else {
            Some(self.content)
        };
        let message = AssistantMessage {
            role: "assistant",
            content,
            refusal: None,
            tool_calls: self.tool_calls,
            reasoning_content: valid.reasoning.then_some(self.reasoning),
            annotations: Vec::new(),
        };
        Ok(completion(
            id,
            model,
            message,
            finish_reason(finished.reason),
            usage,
        ))
    }
}

/// A `chat.completion` of one choice (planner mode adds its fields to it).
pub fn completion(
    id: String,
    model: &str,
    message: AssistantMessage,
    finish_reason: &'static str,
    usage: ChatUsage,
) -> ChatCompletion {
    ChatCompletion {
        id,
        object: "chat.completion",
        created: now_unix(),
        model: model.to_owned(),
        choices: vec![Choice {
            index: 0,
            message,
            logprobs: None,
            finish_reason,
        }],
        usage,
        system_fingerprint: None,
        service_tier: "default",
        conversation_id: None,
        thought: Vec::new(),
        tool_thought: Vec::new(),
        executable_data: Vec::new(),
    }
}

/// The first delta of a streamed tool call: its index, `id`, `type`,
/// `name` and `arguments: ""`.
pub fn call_header<'a>(index: u32, id: &'a str, name: &'a str) -> Delta<'a> {
    Delta {
        tool_calls: vec![ToolCallChunk {
            index,
            id: Some(id),
            kind: Some("function"),
            function: FunctionChunk {
                name: Some(name),
                arguments: "",
            },
        }],
        ..Default::default()
    }
}

/// A later delta of a streamed tool call: its index and a fragment of its
/// arguments.
pub fn call_arguments(index: u32, arguments: &str) -> Delta<'_> {
    Delta {
        tool_calls: vec![ToolCallChunk {
            index,
            id: None,
            kind: None,
            function: FunctionChunk {
                name: None,
                arguments,
            },
        }],
        ..Default::default()
    }
}

/// What every chunk of one stream repeats: its id, creation time, model
/// and service tier, and whether its chunks carry `usage` (`null` until
/// the last).
pub struct ChunkHead<'a> {
    pub id: &'a str,
    pub created: u64,
    pub model: &'a str,
    pub service_tier: &'a str,
    pub include_usage: bool,
}

impl ChunkHead<'_> {
    /// Appends one chunk of the reply's only choice.
    pub fn chunk(&self, out: &mut BytesMut, delta: Delta<'_>, finish: Option<&'static str>) {
        sse::data(out, &self.choice_chunk(delta, finish));
    }

    /// Appends the usage chunk: no choices, the totals.
    pub fn usage(&self, out: &mut BytesMut, usage: &ChatUsage) {
        sse::data(out, &self.usage_chunk(usage));
    }

    /// One chunk of the reply's only choice (`usage` `null` until the
    /// last chunk when the client asked for it).
    pub fn choice_chunk<'c>(
        &'c self,
        delta: Delta<'c>,
        finish: Option<&'static str>,
    ) -> ChatChunk<'c> {
        let choice = ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason: finish,
        };
        let usage = if self.include_usage {
            UsageField::Null
        } else {
            UsageField::Absent
        };
        self.head(vec![choice], usage)
    }

    /// The usage chunk: no choices, the totals.
    pub fn usage_chunk<'c>(&'c self, usage: &'c ChatUsage) -> ChatChunk<'c> {
        self.head(Vec::new(), UsageField::Totals(usage))
    }

    fn head<'c>(&'c self, choices: Vec<ChunkChoice<'c>>, usage: UsageField<'c>) -> ChatChunk<'c> {
        ChatChunk {
            id: self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model,
            service_tier: self.service_tier,
            system_fingerprint: None,
            choices,
            usage,
        }
    }
}

/// Encodes worker events as `chat.completion.chunk` frames.
pub struct ChatStreamEncoder {
    id: String,
    model: String,
    created: u64,
    service_tier: &'static str,
    include_usage: bool,
    /// Tool-call indices whose header (`id`, `type`, `name`) was already sent.
    announced_calls: Vec<u32>,
    /// Structured output is checked at the end, so its text is kept.
    format: OutputFormat,
    text: String,
    failure: Option<crate::error::ApiError>,
    /// Text and reasoning deltas are most of a stream's frames: their
    /// chunk is rendered once around an empty string and each token only
    /// splices in its escaped text (see [`DeltaFrame`]). Index 0 is
    /// `content`, 1 `reasoning_content`.
    delta_frames: [Option<DeltaFrame>; 2],
}

/// The delta of one text (or reasoning) token.
fn text_delta(text: &str, reasoning: bool) -> Delta<'_> {
    if reasoning {
        Delta {
            reasoning_content: Some(text),
            ..Default::default()
        }
    } else {
        Delta {
            content: Some(text),
            ..Default::default()
        }
    }
}

/// A text-delta chunk rendered once, split where its string goes:
/// `data: {...,"delta":{"content":` + JSON string + `},...}\n\n`.
struct DeltaFrame {
    prefix: Vec<u8>,
    suffix: Vec<u8>,
}

impl DeltaFrame {
    /// Splits `rendered` (a frame whose `field` is `""`) around that value.
    fn split(rendered: &[u8], field: &str) -> Option<Self> {
        let marker = format!("\"{field}\":\"\"");
        let at = rendered
            .windows(marker.len())
            .position(|w| w == marker.as_bytes())?;
        let value_at = at + marker.len() - 2;
        Some(Self {
            prefix: rendered[..value_at].to_vec(),
            suffix: rendered[value_at + 2..].to_vec(),
        })
    }

    fn write(&self, out: &mut BytesMut, text: &str) {
        out.extend_from_slice(&self.prefix);
        // Escaping a string into memory cannot fail.
        let _ = serde_json::to_writer(bytes::BufMut::writer(&mut *out), text);
        out.extend_from_slice(&self.suffix);
    }
}

impl ChatStreamEncoder {
    pub fn new(id: String, model: &str, include_usage: bool, format: OutputFormat) -> Self {
        Self {
            id,
            model: model.to_owned(),
            created: now_unix(),
            service_tier: "default",
            include_usage,
            announced_calls: Vec::new(),
            format,
            text: String::new(),
            failure: None,
            delta_frames: [None, None],
        }
    }

    /// Appends a text (or reasoning) delta chunk, through the pre-rendered
    /// frame; byte for byte what [`Self::chunk`] writes.
    fn delta(&mut self, out: &mut BytesMut, text: &str, reasoning: bool) {
        let delta = |text| text_delta(text, reasoning);
        let field = if reasoning {
            "reasoning_content"
        } else {
            "content"
        };
        let i = usize::from(reasoning);
        if self.delta_frames[i].is_none() {
            let mut rendered = BytesMut::new();
            self.chunk(&mut rendered, delta(""), None);
            self.delta_frames[i] = DeltaFrame::split(&rendered, field);
        }
        match &self.delta_frames[i] {
            Some(frame) => frame.write(out, text),
            // Not reached (the rendered chunk always has the field); the
            // frame is written the slow way rather than lost.
            None => self.chunk(out, delta(text), None),
        }
    }

    /// Set when the finished reply failed the output check; the stream then
    /// ended with an error frame instead of a finish.
    pub fn failure(&self) -> Option<&crate::error::ApiError> {
        self.failure.as_ref()
    }

    fn chunk(&self, out: &mut BytesMut, delta: Delta<'_>, finish: Option<&'static str>) {
        self.head().chunk(out, delta, finish);
    }

    fn head(&self) -> ChunkHead<'_> {
        ChunkHead {
            id: &self.id,
            created: self.created,
            model: &self.model,
            service_tier: self.service_tier,
            include_usage: self.include_usage,
        }
    }

    /// The tier the stream's chunks report (`default` unless set).
    pub fn served_at(mut self, tier: &'static str) -> Self {
        self.service_tier = tier;
        self.delta_frames = [None, None];
        self
    }

    /// The first frame: `delta:{role:"assistant", content:""}`.
    pub fn start(&self, out: &mut BytesMut) {
        self.chunk(
            out,
            Delta {
                role: Some("assistant"),
                content: Some(""),
                ..Default::default()
            },
            None,
        );
    }

    pub fn event(&mut self, event: &pb::GenerateEvent, out: &mut BytesMut) {
        use pb::generate_event::Event;
        match &event.event {
            Some(Event::Text(t)) if !t.text.is_empty() => {
                if self.format != OutputFormat::Text {
                    self.text.push_str(&t.text);
                }
                self.delta(out, &t.text, false)
            }
            Some(Event::Reasoning(r)) if !r.text.is_empty() => self.delta(out, &r.text, true),
            Some(Event::ToolCall(d)) => self.tool_call(d, out),
            Some(Event::Finished(f)) => self.finish(f, out),
            _ => {}
        }
    }

    /// The first delta of an index carries `id`, `type`, `name` and
    /// `arguments:""`; later ones only the index and a fragment. Repeating the
    /// header would corrupt the Python SDK's accumulator.
    fn tool_call(&mut self, d: &pb::ToolCallDelta, out: &mut BytesMut) {
        if !self.announced_calls.contains(&d.index) {
            self.announced_calls.push(d.index);
            self.chunk(out, call_header(d.index, &d.id, &d.name), None);
        }
        if !d.arguments_fragment.is_empty() {
            self.chunk(out, call_arguments(d.index, &d.arguments_fragment), None);
        }
    }

    /// `delta:{}` with `finish_reason`, the usage chunk when asked, `[DONE]`;
    /// or, when the reply fails its output check, one error frame.
    fn finish(&mut self, f: &pb::Finished, out: &mut BytesMut) {
        if f.reason == pb::finished::Reason::Stop as i32 {
            if let Err(e) = output_check::check(&self.format, &self.text, &self.model) {
                sse::error(out, &e);
                self.failure = Some(e);
                return;
            }
        }
        self.chunk(out, Delta::default(), Some(finish_reason(f.reason)));
        if self.include_usage {
            self.head().usage(out, &usage(&f.usage.unwrap_or_default()));
        }
        sse::done(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_rendered_delta_frames_match_the_serialized_chunk_byte_for_byte() {
        for include_usage in [false, true] {
            let mut enc = ChatStreamEncoder::new(
                "chatcmpl-x".into(),
                "base-mini",
                include_usage,
                OutputFormat::Text,
            );
            for text in ["Hello", " \"quoted\"\n", "\\ tab\t", "é 漢字 🙂", "\u{1}"] {
                for reasoning in [false, true] {
                    let mut fast = BytesMut::new();
                    enc.delta(&mut fast, text, reasoning);
                    let mut slow = BytesMut::new();
                    enc.chunk(&mut slow, text_delta(text, reasoning), None);
                    assert_eq!(fast, slow, "{text:?} reasoning={reasoning}");
                }
            }
        }
    }
    use crate::parse::json_body;
    use crate::validate::chat::validate;
    use pb::generate_event::Event;

    fn validated(body: &str) -> (ChatCompletionRequest, ValidChatRequest) {
        let req: ChatCompletionRequest = json_body(body.as_bytes()).unwrap();
        let valid = validate(
            &crate::catalog::Catalog::default(),
            &req,
            &Default::default(),
        )
        .unwrap();
        (req, valid)
    }

    fn frames(out: &BytesMut) -> Vec<Value> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    }

    fn ev(e: Event) -> pb::GenerateEvent {
        pb::GenerateEvent {
            event: Some(e),
            output_tokens: 0,
        }
    }

    #[test]
    fn request_carries_messages_tools_and_sampling() {
        let (req, valid) = validated(
            r#"{"model":"base","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}]}],
               "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
               "tool_choice":{"type":"function","function":{"name":"get_weather"}},
               "max_tokens":7,"stop":"END","temperature":0.5,"seed":3}"#,
        );
        let g = to_worker(&req, &valid, "req_1");
        assert_eq!(g.model, "base");
        assert_eq!(g.messages.len(), 2);
        assert_eq!(g.messages[1].content.len(), 2);
        assert_eq!(g.tools[0].name, "get_weather");
        let choice = g.tool_choice.unwrap();
        assert_eq!(choice.mode, pb::tool_choice::Mode::Named as i32);
        assert_eq!(choice.function_name, "get_weather");
        let s = g.sampling.unwrap();
        assert_eq!(
            (s.max_tokens, s.stop, s.seed),
            (7, vec!["END".to_string()], Some(3))
        );
    }

    #[test]
    fn stream_order_role_content_finish_usage_done() {
        let mut enc = ChatStreamEncoder::new("chatcmpl-1".into(), "base", true, OutputFormat::Text);
        let mut out = BytesMut::new();
        enc.start(&mut out);
        enc.event(
            &ev(Event::Text(pb::TextDelta { text: "Hel".into() })),
            &mut out,
        );
        enc.event(
            &ev(Event::Text(pb::TextDelta { text: "lo".into() })),
            &mut out,
        );
        enc.event(
            &ev(Event::Finished(pb::Finished {
                reason: pb::finished::Reason::Stop as i32,
                stop_index: None,
                usage: Some(pb::Usage {
                    prompt_tokens: 5,
                    completion_tokens: 2,
                    ..Default::default()
                }),
            })),
            &mut out,
        );
        assert!(out.ends_with(b"data: [DONE]\n\n"));
        let f = frames(&out);
        assert_eq!(f.len(), 5);
        assert_eq!(
            f[0]["choices"][0]["delta"],
            serde_json::json!({"role":"assistant","content":""})
        );
        assert_eq!(f[1]["choices"][0]["delta"]["content"], "Hel");
        assert!(f[1]["usage"].is_null() && f[1].get("usage").is_some());
        assert_eq!(f[3]["choices"][0]["delta"], serde_json::json!({}));
        assert_eq!(f[3]["choices"][0]["finish_reason"], "stop");
        assert_eq!(f[4]["choices"], serde_json::json!([]));
        assert_eq!(f[4]["usage"]["total_tokens"], 7);
        assert!(f
            .iter()
            .all(|c| c["id"] == "chatcmpl-1" && c["object"] == "chat.completion.chunk"));
    }

    #[test]
    fn tool_call_header_once_then_fragments() {
        let mut enc = ChatStreamEncoder::new("c".into(), "base", false, OutputFormat::Text);
        let mut out = BytesMut::new();
        let delta = |id: &str, name: &str, frag: &str| {
            ev(Event::ToolCall(pb::ToolCallDelta {
                index: 0,
                id: id.into(),
                name: name.into(),
                arguments_fragment: frag.into(),
            }))
        };
        enc.event(&delta("call_1", "f", "{\"a\""), &mut out);
        enc.event(&delta("", "", ":1}"), &mut out);
        let f = frames(&out);
        assert_eq!(f.len(), 3);
        let tc = |i: usize| f[i]["choices"][0]["delta"]["tool_calls"][0].clone();
        assert_eq!(
            tc(0),
            serde_json::json!({"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}})
        );
        assert_eq!(
            tc(1),
            serde_json::json!({"index":0,"function":{"arguments":"{\"a\""}})
        );
        assert_eq!(
            tc(2),
            serde_json::json!({"index":0,"function":{"arguments":":1}"}})
        );
        assert!(f.iter().all(|c| c.get("usage").is_none()));
    }

    #[test]
    fn aggregate_tool_calls_make_content_null() {
        let (_, valid) =
            validated(r#"{"model":"base","messages":[{"role":"user","content":"x"}]}"#);
        let mut agg = ChatAggregate::default();
        agg.push(ev(Event::ToolCall(pb::ToolCallDelta {
            index: 0,
            id: "call_9".into(),
            name: "f".into(),
            arguments_fragment: "{}".into(),
        })));
        agg.push(ev(Event::Finished(pb::Finished {
            stop_index: None,
            reason: pb::finished::Reason::ToolCalls as i32,
            usage: None,
        })));
        let c = serde_json::to_value(
            agg.into_completion("id".into(), "base", &valid, &OutputFormat::Text)
                .unwrap(),
        )
        .unwrap();
        let m = &c["choices"][0]["message"];
        assert!(m["content"].is_null());
        assert!(m["reasoning_content"].is_null());
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{}");
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c["usage"]["reasoning_tokens"], 0);
    }
}
