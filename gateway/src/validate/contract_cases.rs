//! The request contract as a table: one row per rule, body in, status /
//! `code` / `param` out. Two runners read it: the unit test in
//! `validate::contract_tests` (parser and validators, no network) and the
//! end-to-end test `tests/tests/contract_e2e.rs` (through the real gateway,
//! which includes this file by path). It therefore depends on nothing but
//! `std`.
//!
//! A row with status 200 is a request the contract must *accept*; its
//! end-to-end run expects whatever the worker answers, but never a 4xx.

/// Which endpoint a row is sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Responses,
}

/// One rule of the contract.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub api: Api,
    pub body: Vec<u8>,
    /// `x-session-id` header.
    pub session_id: Option<&'static str>,
    pub status: u16,
    pub code: Option<&'static str>,
    pub param: Option<&'static str>,
}

const USER_HI: &str = r#"[{"role":"user","content":"hi"}]"#;

/// A chat body on `base` with one user message plus `extra` top-level fields.
fn chat(extra: &str) -> Vec<u8> {
    chat_on("base", extra)
}

fn chat_on(model: &str, extra: &str) -> Vec<u8> {
    let sep = if extra.is_empty() { "" } else { "," };
    format!(r#"{{"model":"{model}","messages":{USER_HI}{sep}{extra}}}"#).into_bytes()
}

/// A chat body on `base` with the given messages.
fn chat_messages(model: &str, messages: &str) -> Vec<u8> {
    format!(r#"{{"model":"{model}","messages":{messages}}}"#).into_bytes()
}

/// A valid object schema whose compact JSON is `bytes` long, give or take
/// a few bytes (a long `description`).
fn big_schema(bytes: usize) -> String {
    format!(
        r#"{{"type":"object","description":"{}"}}"#,
        "d".repeat(bytes.saturating_sub(34))
    )
}

fn tool(name: &str, parameters: &str, strict: bool) -> String {
    format!(
        r#"{{"type":"function","function":{{"name":"{name}","description":"d","parameters":{parameters},"strict":{strict}}}}}"#
    )
}

const CLOSED: &str = r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}"#;
const OPEN: &str =
    r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#;
const NESTED_NOT_REQUIRED: &str = r#"{"type":"object","properties":{"when":{"type":"object","properties":{"day":{"type":"string"},"hour":{"type":"integer"}},"required":["day"],"additionalProperties":false}},"required":["when"],"additionalProperties":false}"#;
const IMAGE: &str = r#"[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]"#;
const CALL: &str = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}"#;

macro_rules! row {
    ($name:expr, $api:expr, $body:expr, $status:expr, $code:expr, $param:expr) => {
        Case {
            name: $name,
            api: $api,
            body: $body,
            session_id: None,
            status: $status,
            code: $code,
            param: $param,
        }
    };
}

/// Every chat-completions rule.
pub fn chat_cases() -> Vec<Case> {
    use Api::Chat as C;
    let ok = |name, body| row!(name, C, body, 200, None, None);
    let bad = |name, body, code, param| row!(name, C, body, 400, Some(code), param);
    let iv = |name, body, param| bad(name, body, "invalid_value", Some(param));
    let it = |name, body, param| bad(name, body, "invalid_type", Some(param));
    let missing = |name, body, param| bad(name, body, "missing_required_parameter", Some(param));
    let unsup_p = |name, body, param| bad(name, body, "unsupported_parameter", Some(param));
    let unsup_v = |name, body, param| bad(name, body, "unsupported_value", Some(param));
    let big_input = format!(
        r#"[{{"role":"user","content":"{}"}}]"#,
        "lorem ipsum ".repeat(140_000)
    );
    let mut cases = vec![
        // ---- the body itself -------------------------------------------------
        ok("minimal request", chat("")),
        bad(
            "malformed JSON",
            b"{\"model\": \"base\", \"messages\": [}".to_vec(),
            "invalid_json",
            None,
        ),
        bad("empty body", Vec::new(), "invalid_json", None),
        bad(
            "invalid UTF-8",
            b"{\"model\":\"base\xff\"}".to_vec(),
            "invalid_json",
            None,
        ),
        it("body is an array", b"[]".to_vec(), "body"),
        bad(
            "trailing garbage",
            [chat(""), b" x".to_vec()].concat(),
            "invalid_json",
            None,
        ),
        // ---- top level -------------------------------------------------------
        bad(
            "misspelled top-level field",
            chat(r#""max_token":5"#),
            "unknown_parameter",
            Some("max_token"),
        ),
        bad(
            "unknown top-level field",
            chat(r#""frobnicate":true"#),
            "unknown_parameter",
            Some("frobnicate"),
        ),
        missing(
            "model missing",
            br#"{"messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
            "model",
        ),
        it(
            "model not a string",
            br#"{"model":5,"messages":[{"role":"user","content":"hi"}]}"#.to_vec(),
            "model",
        ),
        row!(
            "unknown model",
            C,
            chat_on("gpt-4o", ""),
            404,
            Some("model_not_found"),
            Some("model")
        ),
        missing(
            "messages missing",
            br#"{"model":"base"}"#.to_vec(),
            "messages",
        ),
        iv(
            "messages empty",
            br#"{"model":"base","messages":[]}"#.to_vec(),
            "messages",
        ),
        it(
            "messages not an array",
            br#"{"model":"base","messages":"hi"}"#.to_vec(),
            "messages",
        ),
        it("stream not a boolean", chat(r#""stream":"yes""#), "stream"),
        iv(
            "stream_options without stream",
            chat(r#""stream_options":{"include_usage":true}"#),
            "stream_options",
        ),
        ok(
            "stream with usage",
            chat(r#""stream":true,"stream_options":{"include_usage":true}"#),
        ),
        // ---- sampling bounds -------------------------------------------------
        iv(
            "temperature above 2",
            chat(r#""temperature":2.5"#),
            "temperature",
        ),
        iv(
            "temperature below 0",
            chat(r#""temperature":-0.1"#),
            "temperature",
        ),
        ok("temperature at 2", chat(r#""temperature":2"#)),
        it(
            "temperature not a number",
            chat(r#""temperature":"hot""#),
            "temperature",
        ),
        iv("top_p above 1", chat(r#""top_p":1.1"#), "top_p"),
        iv("top_p below 0", chat(r#""top_p":-0.5"#), "top_p"),
        iv("max_tokens 0", chat(r#""max_tokens":0"#), "max_tokens"),
        it(
            "max_tokens fractional",
            chat(r#""max_tokens":1.5"#),
            "max_tokens",
        ),
        iv(
            "max_completion_tokens negative",
            chat(r#""max_completion_tokens":-1"#),
            "max_completion_tokens",
        ),
        iv(
            "presence_penalty above 2",
            chat(r#""presence_penalty":3"#),
            "presence_penalty",
        ),
        iv(
            "frequency_penalty below -2",
            chat(r#""frequency_penalty":-2.5"#),
            "frequency_penalty",
        ),
        ok(
            "seed and penalties",
            chat(r#""seed":7,"presence_penalty":0.5,"frequency_penalty":-0.5"#),
        ),
        ok("stop as one string", chat(r#""stop":"END""#)),
        ok("stop with 4 strings", chat(r#""stop":["a","b","c","d"]"#)),
        iv(
            "stop with 5 strings",
            chat(r#""stop":["a","b","c","d","e"]"#),
            "stop",
        ),
        iv("empty stop string", chat(r#""stop":["a",""]"#), "stop.1"),
        it("stop not strings", chat(r#""stop":[1]"#), "stop.0"),
        ok(
            "stop strings of 256 characters",
            chat(&format!(r#""stop":["{}","b"]"#, "é".repeat(256))),
        ),
        iv(
            "stop string over 256 characters",
            chat(&format!(r#""stop":["a","b","{}"]"#, "x".repeat(257))),
            "stop.2",
        ),
        iv(
            "one stop string over 256 characters",
            chat(&format!(r#""stop":"{}""#, "x".repeat(257))),
            "stop",
        ),
        // ---- reasoning -------------------------------------------------------
        ok(
            "thinking budget on base",
            chat(r#""enable_thinking":true,"thinking_budget":1024"#),
        ),
        ok(
            "thinking budget on base-mini is ignored",
            chat_on(
                "base-mini",
                r#""enable_thinking":true,"thinking_budget":1024"#,
            ),
        ),
        ok(
            "thinking budget on base-ultra is ignored",
            chat_on("base-ultra", r#""thinking_budget":0"#),
        ),
        iv(
            "thinking budget above 16384",
            chat(r#""thinking_budget":16385"#),
            "thinking_budget",
        ),
        iv(
            "thinking budget negative",
            chat(r#""thinking_budget":-1"#),
            "thinking_budget",
        ),
        iv(
            "reasoning_effort unknown",
            chat(r#""reasoning_effort":"max""#),
            "reasoning_effort",
        ),
        ok(
            "reasoning_effort none",
            chat(r#""reasoning_effort":"none""#),
        ),
        it(
            "enable_thinking not a boolean",
            chat(r#""enable_thinking":"yes""#),
            "enable_thinking",
        ),
        // ---- parameters that cannot be served --------------------------------
        ok("n = 1", chat(r#""n":1"#)),
        unsup_v("n > 1", chat(r#""n":2"#), "n"),
        iv("n = 0", chat(r#""n":0"#), "n"),
        unsup_p("logprobs", chat(r#""logprobs":true"#), "logprobs"),
        ok(
            "logprobs false",
            chat(r#""logprobs":false,"top_logprobs":0"#),
        ),
        iv(
            "top_logprobs without logprobs",
            chat(r#""top_logprobs":3"#),
            "top_logprobs",
        ),
        iv(
            "top_logprobs above 20",
            chat(r#""logprobs":true,"top_logprobs":21"#),
            "top_logprobs",
        ),
        iv(
            "logit_bias out of range",
            chat(r#""logit_bias":{"50256":150}"#),
            "logit_bias.50256",
        ),
        iv(
            "logit_bias key not a token id",
            chat(r#""logit_bias":{"abc":1}"#),
            "logit_bias.abc",
        ),
        unsup_p(
            "logit_bias",
            chat(r#""logit_bias":{"50256":-100}"#),
            "logit_bias",
        ),
        ok("empty logit_bias", chat(r#""logit_bias":{}"#)),
        unsup_v(
            "audio modality",
            chat(r#""modalities":["text","audio"]"#),
            "modalities.1",
        ),
        unsup_p(
            "audio output",
            chat(r#""audio":{"voice":"alloy","format":"wav"}"#),
            "audio",
        ),
        unsup_p(
            "web search",
            chat(r#""web_search_options":{}"#),
            "web_search_options",
        ),
        unsup_v("verbosity high", chat(r#""verbosity":"high""#), "verbosity"),
        iv(
            "verbosity unknown",
            chat(r#""verbosity":"loud""#),
            "verbosity",
        ),
        unsup_p(
            "deprecated functions",
            chat(r#""functions":[{"name":"f","parameters":{}}]"#),
            "functions",
        ),
        unsup_p(
            "deprecated function_call",
            chat(r#""function_call":"auto""#),
            "function_call",
        ),
        // ---- accepted and ignored --------------------------------------------
        ok(
            "user, store, metadata, service tier",
            chat(
                r#""user":"u1","store":false,"metadata":{"k":"v"},"service_tier":"auto","safety_identifier":"s","prompt_cache_key":"p""#,
            ),
        ),
        iv(
            "service tier unknown",
            chat(r#""service_tier":"gold""#),
            "service_tier",
        ),
        iv(
            "metadata over 16 pairs",
            chat(&format!(
                r#""metadata":{{{}}}"#,
                (0..17)
                    .map(|i| format!(r#""k{i}":"v""#))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            "metadata",
        ),
        it(
            "metadata value not a string",
            chat(r#""metadata":{"a":1}"#),
            "metadata.a",
        ),
        missing(
            "prediction without content",
            chat(r#""prediction":{"type":"content"}"#),
            "prediction.content",
        ),
        // ---- messages ----------------------------------------------------------
        missing(
            "role missing",
            chat_messages("base", r#"[{"content":"hi"}]"#),
            "messages.0.role",
        ),
        iv(
            "role unknown",
            chat_messages("base", r#"[{"role":"wizard","content":"hi"}]"#),
            "messages.0.role",
        ),
        it(
            "content a number",
            chat_messages("base", r#"[{"role":"user","content":5}]"#),
            "messages.0.content",
        ),
        missing(
            "content missing on a user message",
            chat_messages("base", r#"[{"role":"user"}]"#),
            "messages.0.content",
        ),
        ok(
            "developer and system roles",
            chat_messages(
                "base",
                r#"[{"role":"system","content":"s"},{"role":"developer","content":"d"},{"role":"user","content":[{"type":"text","text":"hi"}]}]"#,
            ),
        ),
        ok(
            "tool round trip, assistant content null",
            chat_messages(
                "base",
                &format!(
                    r#"[{{"role":"user","content":"weather?"}},{CALL},{{"role":"tool","tool_call_id":"call_1","content":"sunny"}}]"#
                ),
            ),
        ),
        missing(
            "tool message without tool_call_id",
            chat_messages(
                "base",
                &format!(
                    r#"[{{"role":"user","content":"weather?"}},{CALL},{{"role":"tool","content":"sunny"}}]"#
                ),
            ),
            "messages.2.tool_call_id",
        ),
        iv(
            "tool message answering no call",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"call_9","content":"x"}]"#,
            ),
            "messages.1.tool_call_id",
        ),
        missing(
            "assistant tool call without id",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]"#,
            ),
            "messages.1.tool_calls.0.id",
        ),
        it(
            "assistant tool call arguments not a string",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}]"#,
            ),
            "messages.1.tool_calls.0.function.arguments",
        ),
        missing(
            "assistant tool call without name",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"arguments":"{}"}}]}]"#,
            ),
            "messages.1.tool_calls.0.function.name",
        ),
        iv(
            "tool_calls on a user message",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}]"#,
            ),
            "messages.0.tool_calls",
        ),
        ok(
            "echoed assistant message with extra fields",
            chat_messages(
                "base",
                r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"hello","refusal":null,"annotations":[],"audio":null},{"role":"user","content":"again"}]"#,
            ),
        ),
        iv(
            "unknown content part type",
            chat_messages(
                "base",
                r#"[{"role":"user","content":[{"type":"video","video":{}}]}]"#,
            ),
            "messages.0.content.0.type",
        ),
        missing(
            "content part without type",
            chat_messages("base", r#"[{"role":"user","content":[{"text":"hi"}]}]"#),
            "messages.0.content.0.type",
        ),
        // ---- images ------------------------------------------------------------
        ok(
            "image on base",
            chat_messages("base", &format!(r#"[{{"role":"user","content":{IMAGE}}}]"#)),
        ),
        iv(
            "image on base-mini",
            chat_messages(
                "base-mini",
                &format!(r#"[{{"role":"user","content":{IMAGE}}}]"#),
            ),
            "messages.0.content.1",
        ),
        iv(
            "image on base-ultra",
            chat_messages(
                "base-ultra",
                &format!(
                    r#"[{{"role":"system","content":"s"}},{{"role":"user","content":{IMAGE}}}]"#
                ),
            ),
            "messages.1.content.1",
        ),
        iv(
            "image URL scheme",
            chat_messages(
                "base",
                r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"ftp://x/a.png"}}]}]"#,
            ),
            "messages.0.content.0.image_url.url",
        ),
        iv(
            "image detail unknown",
            chat_messages(
                "base",
                r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png","detail":"ultra"}}]}]"#,
            ),
            "messages.0.content.0.image_url.detail",
        ),
        iv(
            "image on a system message",
            chat_messages(
                "base",
                r#"[{"role":"system","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}}]},{"role":"user","content":"hi"}]"#,
            ),
            "messages.0.content.0.type",
        ),
        unsup_v(
            "audio input part",
            chat_messages(
                "base",
                r#"[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]"#,
            ),
            "messages.0.content.0.type",
        ),
        // ---- tools -------------------------------------------------------------
        ok(
            "function tool",
            chat(&format!(
                r#""tools":[{}]"#,
                tool("get_weather", OPEN, false)
            )),
        ),
        ok(
            "strict function tool",
            chat(&format!(
                r#""tools":[{}],"tool_choice":"required","parallel_tool_calls":false"#,
                tool("get_weather", CLOSED, true)
            )),
        ),
        iv(
            "tool type not function",
            chat(r#""tools":[{"type":"web_search"}]"#),
            "tools.0.type",
        ),
        missing(
            "tool type missing",
            chat(r#""tools":[{"function":{"name":"f"}}]"#),
            "tools.0.type",
        ),
        missing(
            "tool function missing",
            chat(r#""tools":[{"type":"function"}]"#),
            "tools.0.function",
        ),
        missing(
            "function name missing",
            chat(r#""tools":[{"type":"function","function":{"parameters":{}}}]"#),
            "tools.0.function.name",
        ),
        iv(
            "function name with spaces",
            chat(&format!(
                r#""tools":[{}]"#,
                tool("get weather", OPEN, false)
            )),
            "tools.0.function.name",
        ),
        bad(
            "response format that admits no value",
            chat(
                r#""response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"s":{"type":"string","minLength":3,"maxLength":1}},"required":["s"]}}}"#,
            ),
            "invalid_json_schema",
            Some("response_format.json_schema.schema.properties.s.minLength"),
        ),
        bad(
            "response format asking for more items than a reply holds",
            chat(
                r#""response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"array","minItems":18446744073709551616}}}"#,
            ),
            "invalid_json_schema",
            Some("response_format.json_schema.schema.minItems"),
        ),
        bad(
            "response format with a required self-reference",
            chat(
                r##""response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}}}"##,
            ),
            "invalid_json_schema",
            Some("response_format.json_schema.schema.properties.a.$ref"),
        ),
        bad(
            "tool parameters whose allOf types share nothing",
            chat(&format!(
                r#""tools":[{}]"#,
                tool(
                    "f",
                    r#"{"type":"object","properties":{"v":{"allOf":[{"type":"string"},{"type":"integer"}]}},"required":["v"]}"#,
                    false
                )
            )),
            "invalid_function_parameters",
            Some("tools.0.function.parameters.properties.v.allOf"),
        ),
        bad(
            "invalid JSON Schema",
            chat(&format!(
                r#""tools":[{}]"#,
                tool("f", r#"{"type":"objekt"}"#, false)
            )),
            "invalid_function_parameters",
            Some("tools.0.function.parameters"),
        ),
        it(
            "parameters not an object",
            chat(r#""tools":[{"type":"function","function":{"name":"f","parameters":"object"}}]"#),
            "tools.0.function.parameters",
        ),
        bad(
            "parameters over 256 KiB",
            chat(&format!(
                r#""tools":[{},{}]"#,
                tool("a", OPEN, false),
                tool("b", &big_schema((256 << 10) + 1), false)
            )),
            "schema_too_large",
            Some("tools.1.function.parameters"),
        ),
        bad(
            "schemas over 512 KiB together",
            chat(&format!(
                r#""tools":[{},{},{}],"response_format":{{"type":"json_schema","json_schema":{{"name":"a","schema":{}}}}}"#,
                tool("a", &big_schema(200 << 10), false),
                tool("b", &big_schema(200 << 10), false),
                tool("c", OPEN, false),
                big_schema(200 << 10)
            )),
            "schema_too_large",
            Some("response_format.json_schema.schema"),
        ),
        iv(
            "more than 128 tools",
            chat(&format!(
                r#""tools":[{}]"#,
                (0..129)
                    .map(|i| tool(&format!("f{i}"), "{}", false))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            "tools",
        ),
        bad(
            "strict without additionalProperties false",
            chat(&format!(
                r#""tools":[{},{}]"#,
                tool("a", CLOSED, true),
                tool("b", OPEN, true)
            )),
            "invalid_function_parameters",
            Some("tools.1.function.parameters"),
        ),
        bad(
            "strict with a nested property not required",
            chat(&format!(
                r#""tools":[{}]"#,
                tool("f", NESTED_NOT_REQUIRED, true)
            )),
            "invalid_function_parameters",
            Some("tools.0.function.parameters"),
        ),
        iv(
            "duplicate tool names",
            chat(&format!(
                r#""tools":[{},{}]"#,
                tool("f", OPEN, false),
                tool("f", OPEN, false)
            )),
            "tools.1.function.name",
        ),
        iv(
            "tool_choice unknown string",
            chat(r#""tool_choice":"sometimes""#),
            "tool_choice",
        ),
        iv(
            "tool_choice required without tools",
            chat(r#""tool_choice":"required""#),
            "tool_choice",
        ),
        ok(
            "tool_choice none without tools",
            chat(r#""tool_choice":"none""#),
        ),
        ok(
            "tool_choice names a tool",
            chat(&format!(
                r#""tools":[{}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#,
                tool("get_weather", OPEN, false)
            )),
        ),
        iv(
            "tool_choice names a missing function",
            chat(&format!(
                r#""tools":[{}],"tool_choice":{{"type":"function","function":{{"name":"nope"}}}}"#,
                tool("get_weather", OPEN, false)
            )),
            "tool_choice",
        ),
        missing(
            "tool_choice object without function",
            chat(&format!(
                r#""tools":[{}],"tool_choice":{{"type":"function"}}"#,
                tool("f", OPEN, false)
            )),
            "tool_choice.function",
        ),
        iv(
            "tool_choice type not function",
            chat(r#""tool_choice":{"type":"allowed_tools"}"#),
            "tool_choice.type",
        ),
        // ---- response_format ---------------------------------------------------
        ok(
            "json_object format",
            chat(r#""response_format":{"type":"json_object"}"#),
        ),
        ok(
            "strict json_schema format",
            chat(&format!(
                r#""response_format":{{"type":"json_schema","json_schema":{{"name":"weather","strict":true,"schema":{CLOSED}}}}}"#
            )),
        ),
        iv(
            "format type unknown",
            chat(r#""response_format":{"type":"xml"}"#),
            "response_format.type",
        ),
        missing(
            "format type missing",
            chat(r#""response_format":{}"#),
            "response_format.type",
        ),
        missing(
            "json_schema object missing",
            chat(r#""response_format":{"type":"json_schema"}"#),
            "response_format.json_schema",
        ),
        missing(
            "json_schema name missing",
            chat(&format!(
                r#""response_format":{{"type":"json_schema","json_schema":{{"schema":{CLOSED}}}}}"#
            )),
            "response_format.json_schema.name",
        ),
        missing(
            "json_schema schema missing",
            chat(r#""response_format":{"type":"json_schema","json_schema":{"name":"a"}}"#),
            "response_format.json_schema.schema",
        ),
        bad(
            "json_schema invalid schema",
            chat(
                r#""response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","required":"x"}}}"#,
            ),
            "invalid_json_schema",
            Some("response_format.json_schema.schema"),
        ),
        bad(
            "strict json_schema left open",
            chat(&format!(
                r#""response_format":{{"type":"json_schema","json_schema":{{"name":"a","strict":true,"schema":{OPEN}}}}}"#
            )),
            "invalid_json_schema",
            Some("response_format.json_schema.schema"),
        ),
        // ---- planner mode --------------------------------------------------------
        missing(
            "planner mode without a session",
            chat(r#""planner_mode":true"#),
            "x-session-id",
        ),
        iv(
            "agents without planner mode",
            chat(r#""agents":["https://agents.example/a"]"#),
            "agents",
        ),
        Case {
            session_id: Some("sess-1"),
            ..iv(
                "more than 16 agents",
                chat(&format!(
                    r#""planner_mode":true,"agents":[{}]"#,
                    vec!["\"a\""; 17].join(",")
                )),
                "agents.16",
            )
        },
        Case {
            session_id: Some("sess-1"),
            ..iv(
                "agent address neither a URL nor a directory id",
                chat(r#""planner_mode":true,"agents":["weather","ftp://agents.example/a"]"#),
                "agents.1",
            )
        },
        Case {
            session_id: Some("sess-1"),
            ..unsup_p(
                "planner mode with a JSON response format",
                chat(r#""planner_mode":true,"response_format":{"type":"json_object"}"#),
                "response_format",
            )
        },
        Case {
            session_id: Some("sess-1"),
            ..iv(
                "planner mode naming a function that is not in tools",
                chat(
                    r#""planner_mode":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
                ),
                "tool_choice",
            )
        },
        iv("empty agent address", chat(r#""agents":[""]"#), "agents.0"),
        // ---- context window --------------------------------------------------------
        bad(
            "max_tokens fills the window",
            chat(r#""max_tokens":196608"#),
            "context_length_exceeded",
            Some("max_tokens"),
        ),
        ok(
            "max_tokens below the window",
            chat(r#""max_tokens":196000"#),
        ),
        bad(
            "input certainly over the window of base",
            chat_messages("base", &big_input),
            "context_length_exceeded",
            Some("messages"),
        ),
        ok(
            "the same input fits base-ultra",
            chat_messages("base-ultra", &big_input),
        ),
    ];
    for c in &mut cases {
        c.api = C;
    }
    cases
}

/// A responses body on `base` with a string input plus `extra` fields.
fn resp(extra: &str) -> Vec<u8> {
    resp_on("base", r#""hi""#, extra)
}

fn resp_on(model: &str, input: &str, extra: &str) -> Vec<u8> {
    let sep = if extra.is_empty() { "" } else { "," };
    format!(r#"{{"model":"{model}","input":{input}{sep}{extra}}}"#).into_bytes()
}

fn flat_tool(name: &str, parameters: &str, strict: bool) -> String {
    format!(
        r#"{{"type":"function","name":"{name}","description":"d","parameters":{parameters},"strict":{strict}}}"#
    )
}

/// Every responses rule.
pub fn responses_cases() -> Vec<Case> {
    use Api::Responses as R;
    let ok = |name, body| row!(name, R, body, 200, None, None);
    let bad = |name, body, code, param| row!(name, R, body, 400, Some(code), param);
    let iv = |name, body, param| bad(name, body, "invalid_value", Some(param));
    let it = |name, body, param| bad(name, body, "invalid_type", Some(param));
    let missing = |name, body, param| bad(name, body, "missing_required_parameter", Some(param));
    let big_input = format!(r#""{}""#, "lorem ipsum ".repeat(140_000));
    let image_input = r#"[{"role":"user","content":[{"type":"input_text","text":"what is this?"},{"type":"input_image","image_url":"https://example.com/a.png"}]}]"#;
    vec![
        ok("minimal request", resp("")),
        ok(
            "penalties at their bounds",
            resp(r#""presence_penalty":2,"frequency_penalty":-2"#),
        ),
        iv(
            "presence_penalty above 2",
            resp(r#""presence_penalty":2.5"#),
            "presence_penalty",
        ),
        iv(
            "frequency_penalty below -2",
            resp(r#""frequency_penalty":-2.5"#),
            "frequency_penalty",
        ),
        bad(
            "malformed JSON",
            b"{\"model\":\"base\",".to_vec(),
            "invalid_json",
            None,
        ),
        bad("empty body", b"  ".to_vec(), "invalid_json", None),
        it("body is a string", b"\"hi\"".to_vec(), "body"),
        bad(
            "misspelled top-level field",
            resp(r#""max_output_token":5"#),
            "unknown_parameter",
            Some("max_output_token"),
        ),
        missing("model missing", br#"{"input":"hi"}"#.to_vec(), "model"),
        missing("input missing", br#"{"model":"base"}"#.to_vec(), "input"),
        it("input a number", resp_on("base", "5", ""), "input"),
        row!(
            "unknown model",
            R,
            resp_on("base-large", r#""hi""#, ""),
            404,
            Some("model_not_found"),
            Some("model")
        ),
        iv(
            "background without store",
            resp(r#""background":true,"store":false"#),
            "background",
        ),
        ok("service tier", resp(r#""service_tier":"flex""#)),
        iv(
            "service tier unknown",
            resp(r#""service_tier":"AAA""#),
            "service_tier",
        ),
        ok(
            "prompt cache retention",
            resp(r#""prompt_cache_retention":"24h""#),
        ),
        iv(
            "prompt cache retention unknown",
            resp(r#""prompt_cache_retention":"AAA""#),
            "prompt_cache_retention",
        ),
        ok(
            "background stored",
            resp(r#""background":true,"store":true"#),
        ),
        iv(
            "temperature above 2",
            resp(r#""temperature":2.5"#),
            "temperature",
        ),
        iv("top_p above 1", resp(r#""top_p":1.5"#), "top_p"),
        iv(
            "max_output_tokens 0",
            resp(r#""max_output_tokens":0"#),
            "max_output_tokens",
        ),
        iv(
            "thinking budget above 16384",
            resp(r#""thinking_budget":16385"#),
            "thinking_budget",
        ),
        ok(
            "thinking budget on base-mini is ignored",
            resp_on(
                "base-mini",
                r#""hi""#,
                r#""enable_thinking":true,"thinking_budget":2048"#,
            ),
        ),
        iv(
            "reasoning effort unknown",
            resp(r#""reasoning":{"effort":"max"}"#),
            "reasoning.effort",
        ),
        ok(
            "every reasoning effort",
            resp(r#""reasoning":{"effort":"minimal","summary":"auto"}"#),
        ),
        iv(
            "metadata over 16 pairs",
            resp(&format!(
                r#""metadata":{{{}}}"#,
                (0..17)
                    .map(|i| format!(r#""k{i}":"v""#))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            "metadata",
        ),
        it(
            "metadata value not a string",
            resp(r#""metadata":{"a":1}"#),
            "metadata.a",
        ),
        iv(
            "metadata value too long",
            resp(&format!(r#""metadata":{{"a":"{}"}}"#, "x".repeat(513))),
            "metadata.a",
        ),
        missing(
            "flat function tool without parameters",
            resp(r#""tools":[{"type":"function","name":"f"}]"#),
            "tools.0.parameters",
        ),
        iv(
            "include with an unknown value",
            resp(r#""include":["reasoning.encrypted_content","x"]"#),
            "include.1",
        ),
        bad(
            "include asks for log probabilities",
            resp(r#""include":["message.output_text.logprobs"]"#),
            "unsupported_value",
            Some("include.0"),
        ),
        bad(
            "truncation auto (input is never truncated)",
            resp(r#""truncation":"auto""#),
            "unsupported_value",
            Some("truncation"),
        ),
        ok("truncation disabled", resp(r#""truncation":"disabled""#)),
        // ---- stream_options, as on chat -------------------------------------------
        it(
            "stream_options not an object",
            resp(r#""stream":true,"stream_options":"yes""#),
            "stream_options",
        ),
        it(
            "stream_options.include_obfuscation not a boolean",
            resp(r#""stream":true,"stream_options":{"include_obfuscation":1}"#),
            "stream_options.include_obfuscation",
        ),
        it(
            "stream_options.include_usage not a boolean",
            resp(r#""stream":true,"stream_options":{"include_usage":"yes"}"#),
            "stream_options.include_usage",
        ),
        iv(
            "stream_options without stream",
            resp(r#""stream_options":{"include_obfuscation":false}"#),
            "stream_options",
        ),
        ok(
            "stream_options with stream",
            resp(r#""stream":true,"stream_options":{"include_obfuscation":false}"#),
        ),
        ok(
            "Codex-style request",
            resp_on(
                "base",
                r#"[{"type":"message","id":"msg_1","role":"user","content":[{"type":"input_text","text":"hi"}]}]"#,
                r#""instructions":"be brief","store":false,"stream":true,"include":["reasoning.encrypted_content"],"prompt_cache_key":"k","client_metadata":{"x":"y"},"reasoning":{"effort":"low","summary":"auto"},"parallel_tool_calls":false"#,
            ),
        ),
        // ---- input items -----------------------------------------------------------
        iv(
            "image part in input",
            resp_on("base", image_input, ""),
            "input.0.content.1",
        ),
        iv(
            "image part in input, base-mini",
            resp_on("base-mini", image_input, ""),
            "input.0.content.1",
        ),
        iv(
            "input role unknown",
            resp_on("base", r#"[{"role":"wizard","content":"hi"}]"#, ""),
            "input.0.role",
        ),
        iv(
            "input item type unknown",
            resp_on("base", r#"[{"type":"teleport"}]"#, ""),
            "input.0.type",
        ),
        missing(
            "function_call_output without call_id",
            resp_on(
                "base",
                r#"[{"role":"user","content":"hi"},{"type":"function_call_output","output":"sunny"}]"#,
                "",
            ),
            "input.1.call_id",
        ),
        ok(
            "function call round trip",
            resp_on(
                "base",
                r#"[{"role":"user","content":"weather?"},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{}"},{"type":"function_call_output","call_id":"call_1","output":"sunny"}]"#,
                "",
            ),
        ),
        // ---- tools -----------------------------------------------------------------
        ok(
            "flat function tool",
            resp(&format!(
                r#""tools":[{}]"#,
                flat_tool("get_weather", OPEN, false)
            )),
        ),
        ok(
            "nested function tool",
            resp(&format!(
                r#""tools":[{}]"#,
                tool("get_weather", OPEN, false)
            )),
        ),
        iv(
            "tool type not function",
            resp(r#""tools":[{"type":"web_search"}]"#),
            "tools.0.type",
        ),
        iv(
            "tool type not function (Codex namespace)",
            resp(&format!(
                r#""tools":[{},{{"type":"namespace","name":"n"}}]"#,
                flat_tool("f", OPEN, false)
            )),
            "tools.1.type",
        ),
        missing(
            "flat tool without name",
            resp(r#""tools":[{"type":"function","parameters":{}}]"#),
            "tools.0.name",
        ),
        bad(
            "flat strict tool left open",
            resp(&format!(r#""tools":[{}]"#, flat_tool("f", OPEN, true))),
            "invalid_function_parameters",
            Some("tools.0.parameters"),
        ),
        bad(
            "nested strict tool left open",
            resp(&format!(
                r#""tools":[{}]"#,
                tool("f", NESTED_NOT_REQUIRED, true)
            )),
            "invalid_function_parameters",
            Some("tools.0.function.parameters"),
        ),
        ok(
            "strict flat tool",
            resp(&format!(
                r#""tools":[{}],"tool_choice":{{"type":"function","name":"f"}}"#,
                flat_tool("f", CLOSED, true)
            )),
        ),
        iv(
            "tool_choice names a missing function",
            resp(&format!(
                r#""tools":[{}],"tool_choice":{{"type":"function","name":"g"}}"#,
                flat_tool("f", OPEN, false)
            )),
            "tool_choice.name",
        ),
        // ---- text.format -----------------------------------------------------------
        iv(
            "text.format type unknown",
            resp(r#""text":{"format":{"type":"yaml"}}"#),
            "text.format.type",
        ),
        missing(
            "text.format json_schema without name",
            resp(&format!(
                r#""text":{{"format":{{"type":"json_schema","schema":{CLOSED}}}}}"#
            )),
            "text.format.name",
        ),
        bad(
            "text.format schema over 256 KiB",
            resp(&format!(
                r#""text":{{"format":{{"type":"json_schema","name":"a","schema":{}}}}}"#,
                big_schema(300 << 10)
            )),
            "schema_too_large",
            Some("text.format.schema"),
        ),
        bad(
            "flat tool parameters over 256 KiB",
            resp(&format!(
                r#""tools":[{}]"#,
                flat_tool("f", &big_schema((256 << 10) + 1), false)
            )),
            "schema_too_large",
            Some("tools.0.parameters"),
        ),
        bad(
            "text.format schema that admits no value",
            resp(
                r#""text":{"format":{"type":"json_schema","name":"a","schema":{"type":"object","properties":{"n":{"type":"integer","minimum":5,"maximum":1}},"required":["n"]}}}"#,
            ),
            "invalid_json_schema",
            Some("text.format.schema.properties.n.minimum"),
        ),
        bad(
            "text.format schema asking for more items than a reply holds",
            resp(
                r#""text":{"format":{"type":"json_schema","name":"a","schema":{"type":"array","minItems":18446744073709551616}}}"#,
            ),
            "invalid_json_schema",
            Some("text.format.schema.minItems"),
        ),
        bad(
            "text.format schema with a required self-reference",
            resp(
                r##""text":{"format":{"type":"json_schema","name":"a","schema":{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}}}"##,
            ),
            "invalid_json_schema",
            Some("text.format.schema.properties.a.$ref"),
        ),
        bad(
            "text.format schema whose allOf types share nothing",
            resp(
                r#""text":{"format":{"type":"json_schema","name":"a","schema":{"allOf":[{"type":"string"},{"type":"integer"}]}}}"#,
            ),
            "invalid_json_schema",
            Some("text.format.schema.allOf"),
        ),
        bad(
            "flat tool parameters with a required self-reference",
            resp(&format!(
                r#""tools":[{}]"#,
                flat_tool(
                    "f",
                    r##"{"type":"object","properties":{"a":{"$ref":"#"}},"required":["a"]}"##,
                    false
                )
            )),
            "invalid_function_parameters",
            Some("tools.0.parameters.properties.a.$ref"),
        ),
        bad(
            "text.format invalid schema",
            resp(
                r#""text":{"format":{"type":"json_schema","name":"a","schema":{"type":"objekt"}}}"#,
            ),
            "invalid_json_schema",
            Some("text.format.schema"),
        ),
        bad(
            "text.format strict schema left open",
            resp(&format!(
                r#""text":{{"format":{{"type":"json_schema","name":"a","strict":true,"schema":{OPEN}}}}}"#
            )),
            "invalid_json_schema",
            Some("text.format.schema"),
        ),
        ok(
            "text.format strict json_schema",
            resp(&format!(
                r#""text":{{"format":{{"type":"json_schema","name":"a","strict":true,"schema":{CLOSED}}}}}"#
            )),
        ),
        ok(
            "text.format wins over response_format",
            resp(r#""text":{"format":{"type":"json_object"}},"response_format":{"type":"xml"}"#),
        ),
        iv(
            "response_format used without text.format",
            resp(r#""response_format":{"type":"xml"}"#),
            "response_format.type",
        ),
        // ---- context window ----------------------------------------------------------
        bad(
            "max_output_tokens fills the window",
            resp_on("base-mini", r#""hi""#, r#""max_output_tokens":262144"#),
            "context_length_exceeded",
            Some("max_output_tokens"),
        ),
        bad(
            "input certainly over the window of base",
            resp_on("base", &big_input, ""),
            "context_length_exceeded",
            Some("input"),
        ),
        ok(
            "the same input fits base-ultra",
            resp_on("base-ultra", &big_input, ""),
        ),
    ]
}

/// Every row, both APIs.
pub fn all_cases() -> Vec<Case> {
    let mut cases = chat_cases();
    cases.extend(responses_cases());
    cases
}
