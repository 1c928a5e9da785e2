//! Which engine is upstream, and how each field travels to it. The table
//! below is the one in `docs/upstream-engines.md`; the methods of [`Kind`]
//! are what the code does with it.

use clap::ValueEnum;
use inference_proto::v1::ServiceTier;

/// The engine behind `--upstream-url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Vllm,
    Sglang,
    #[value(name = "llama-server")]
    LlamaServer,
    /// Any other OpenAI-compatible server: chat fields only, no tokenizer,
    /// no metrics.
    Openai,
}

/// How each request field travels, per kind (vLLM, SGLang, llama-server,
/// OpenAI). Rendered into `docs/upstream-engines.md`; a unit test keeps the
/// two equal.
pub const FIELD_TABLE: &[(&str, [&str; 4])] = &[
    ("messages, tools, tool_choice, parallel_tool_calls", ["chat fields (engine template + tool parser)"; 4]),
    ("temperature, top_p, seed, stop", ["chat fields"; 4]),
    ("top_k (Anthropic Messages)", ["`top_k`", "`top_k`", "`top_k`", "not sent (not in OpenAI's API)"]),
    ("which stop string ended the reply (`stop_sequence`)", ["`stop_reason`", "`matched_stop`", "not said (null)", "not said (null)"]),
    ("max_tokens (or the rest of the window)", ["`max_tokens`", "`max_tokens`", "`max_tokens`", "`max_completion_tokens`"]),
    ("context window", ["`/v1/models` `max_model_len`", "`/v1/models` `max_model_len`", "`/props` per-slot `n_ctx`", "`--context-window`"]),
    ("prompt token count (400 before generating)", ["`POST /tokenize` with messages", "`POST /tokenize` with messages", "`/apply-template` then `/tokenize`", "none: the engine's own 400"]),
    ("response_format json_object / json_schema", ["`response_format` (never `guided_*`: removed in v0.12, silently ignored)", "`response_format`", "`response_format`", "`response_format`"]),
    ("tool_choice required / named", ["chat fields", "chat fields", "enforced: `response_format` json_schema of the call, parsed into tool calls", "chat fields"]),
    ("reasoning on/off", ["`chat_template_kwargs.enable_thinking`", "`chat_template_kwargs.enable_thinking`", "`chat_template_kwargs.enable_thinking`", "`reasoning_effort`"]),
    ("reasoning budget", ["`thinking_token_budget`", "none", "server flag `--reasoning-budget`", "none"]),
    ("reasoning deltas read", ["`reasoning`, `reasoning_content`"; 4]),
    ("usage", ["`stream_options.include_usage`; cached tokens need `--enable-prompt-tokens-details`", "`stream_options.include_usage`; cached tokens need `--enable-cache-report`", "`stream_options.include_usage` (cached tokens always)", "`stream_options.include_usage`"]),
    ("service tier (with `--upstream-priority`)", ["`priority`: priority -1, default 0, flex 1 (lower first; needs `--scheduling-policy priority`)", "`priority`: priority 1, default 0, flex -1 (higher first, SGLang's default order; needs `--enable-priority-scheduling`)", "none: the gateway's queue alone", "none: the gateway's queue alone"]),
    ("cancellation", ["close the connection", "close the connection + `POST /abort_request {rid}`", "close the connection", "close the connection"]),
    ("readiness", ["`GET /health`", "`GET /health`", "`GET /health`", "`GET /v1/models`"]),
    ("load", ["`/metrics` `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc` (old `vllm:gpu_cache_usage_perc`)", "`/metrics` `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`", "`/metrics` `llamacpp:requests_processing`, `llamacpp:requests_deferred` (needs `--metrics`); slots from `/props`", "none: the worker's own admission"]),
];

/// The engine's running/waiting/KV metric names in its Prometheus text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricNames {
    pub running: &'static [&'static str],
    pub waiting: &'static [&'static str],
    /// KV cache use, 0..=1 (first name present wins).
    pub kv_usage: &'static [&'static str],
}

/// How the prompt's tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// `POST /tokenize {model, messages, add_generation_prompt}` (vLLM, SGLang).
    ChatTokenize,
    /// `POST /apply-template {messages}` then `POST /tokenize {content}`
    /// (llama-server).
    TemplateThenTokenize,
    /// The engine cannot count: rely on its own 400.
    None,
}

/// How an engine is asked to continue a final assistant message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// `continue_final_message: true, add_generation_prompt: false`.
    Flag,
    /// The final assistant message is continued as it is.
    Prefill,
}

/// How `max_tokens` is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    MaxTokens,
    MaxCompletionTokens,
}

/// How reasoning is switched on and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningField {
    /// `chat_template_kwargs: {enable_thinking}`, and the budget field when
    /// the engine has a per-request one.
    TemplateKwargs { budget: bool },
    /// `reasoning_effort`.
    Effort,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Vllm => "vllm",
            Kind::Sglang => "sglang",
            Kind::LlamaServer => "llama-server",
            Kind::Openai => "openai",
        }
    }

    pub fn counting(self) -> Counting {
        match self {
            Kind::Vllm | Kind::Sglang => Counting::ChatTokenize,
            Kind::LlamaServer => Counting::TemplateThenTokenize,
            Kind::Openai => Counting::None,
        }
    }

    pub fn max_tokens_field(self) -> MaxTokensField {
        match self {
            Kind::Openai => MaxTokensField::MaxCompletionTokens,
            Kind::Vllm | Kind::Sglang | Kind::LlamaServer => MaxTokensField::MaxTokens,
        }
    }

    pub fn reasoning(self) -> ReasoningField {
        match self {
            Kind::Vllm => ReasoningField::TemplateKwargs { budget: true },
            Kind::Sglang | Kind::LlamaServer => ReasoningField::TemplateKwargs { budget: false },
            Kind::Openai => ReasoningField::Effort,
        }
    }

    /// Whether the engine takes `top_k` (OpenAI's API has none, and an
    /// OpenAI-compatible server may refuse a field it does not know).
    pub fn takes_top_k(self) -> bool {
        !matches!(self, Kind::Openai)
    }

    /// Whether `required` / named tool choices are enforced by the worker
    /// (a JSON schema of the call) rather than left to the engine's tool
    /// parser. llama-server's parser depends on the model's template and
    /// produced no call at all on SmolLM2; vLLM and SGLang constrain tool
    /// choices themselves. `--upstream-enforce-tools` overrides.
    pub fn enforces_tools_by_default(self) -> bool {
        matches!(self, Kind::LlamaServer)
    }

    /// SGLang keeps generating for a closed connection at times (zombie
    /// requests): it also gets `rid` and `POST /abort_request`.
    pub fn aborts_by_request_id(self) -> bool {
        matches!(self, Kind::Sglang)
    }

    /// How the engine continues a final assistant message (a moved
    /// generation's text), if it does: vLLM and SGLang with
    /// `continue_final_message` (and no generation prompt), llama-server by
    /// itself (a final assistant message is a prefill). An OpenAI-compatible
    /// server promises neither.
    pub fn continues_final_message(self) -> Option<Continuation> {
        match self {
            Kind::Vllm | Kind::Sglang => Some(Continuation::Flag),
            Kind::LlamaServer => Some(Continuation::Prefill),
            Kind::Openai => None,
        }
    }

    /// Whether a request's reasoning budget (`reasoning.budget_tokens`)
    /// reaches the engine: only through a per-request budget field (vLLM's
    /// `thinking_token_budget`, the table's "reasoning budget" row).
    pub fn reasoning_budget(self) -> bool {
        matches!(
            self.reasoning(),
            ReasoningField::TemplateKwargs { budget: true }
        )
    }

    /// Whether a prefix the engine holds serves concurrent sequences too:
    /// llama-server's slots each hold one sequence's cells; vLLM and SGLang
    /// page theirs and share a prefix across sequences.
    pub fn concurrent_reuse(self) -> bool {
        !matches!(self, Kind::LlamaServer)
    }

    /// The `priority` field a tier travels as, on an engine that
    /// schedules by priority itself: vLLM serves lower values first, SGLang
    /// (in its default order) higher ones; `default` is both engines' own
    /// default, 0. llama-server and other servers have no such field.
    pub fn priority(self, tier: ServiceTier) -> Option<i64> {
        let rank = match tier {
            ServiceTier::Priority => 1,
            ServiceTier::Default | ServiceTier::Unspecified => 0,
            ServiceTier::Flex => -1,
        };
        match self {
            Kind::Vllm => Some(-rank),
            Kind::Sglang => Some(rank),
            Kind::LlamaServer | Kind::Openai => None,
        }
    }

    /// The readiness probe path.
    pub fn health_path(self) -> &'static str {
        match self {
            Kind::Openai => "/v1/models",
            Kind::Vllm | Kind::Sglang | Kind::LlamaServer => "/health",
        }
    }

    pub fn metrics(self) -> Option<MetricNames> {
        match self {
            Kind::Vllm => Some(MetricNames {
                running: &["vllm:num_requests_running"],
                waiting: &["vllm:num_requests_waiting"],
                kv_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            }),
            Kind::Sglang => Some(MetricNames {
                running: &["sglang:num_running_reqs"],
                waiting: &["sglang:num_queue_reqs"],
                kv_usage: &["sglang:token_usage"],
            }),
            Kind::LlamaServer => Some(MetricNames {
                running: &["llamacpp:requests_processing"],
                waiting: &["llamacpp:requests_deferred"],
                kv_usage: &["llamacpp:kv_cache_usage_ratio"],
            }),
            Kind::Openai => None,
        }
    }
}

/// The table as Markdown (the block between the markers in
/// `docs/upstream-engines.md`).
pub fn markdown_table() -> String {
    let mut s =
        String::from("| field | vLLM | SGLang | llama-server | openai |\n|---|---|---|---|---|\n");
    for (field, cells) in FIELD_TABLE {
        s.push_str(&format!("| {field} | {} |\n", cells.join(" | ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_travel_in_each_engine_s_own_priority_order() {
        use ServiceTier::*;
        assert_eq!(Kind::Vllm.priority(Priority), Some(-1));
        assert_eq!(Kind::Vllm.priority(Flex), Some(1));
        assert_eq!(Kind::Sglang.priority(Priority), Some(1));
        assert_eq!(Kind::Sglang.priority(Flex), Some(-1));
        assert_eq!(Kind::Sglang.priority(Default), Some(0));
        assert_eq!(Kind::LlamaServer.priority(Priority), None);
        assert_eq!(Kind::Openai.priority(Flex), None);
    }

    #[test]
    fn the_docs_carry_the_table_of_the_code() {
        let doc = include_str!("../../../../docs/upstream-engines.md");
        let start = doc.find("<!-- table:start -->\n").expect("start marker") + 21;
        let end = doc.find("<!-- table:end -->").expect("end marker");
        assert_eq!(
            &doc[start..end],
            markdown_table(),
            "regenerate the table in docs/upstream-engines.md from kind::markdown_table()"
        );
    }

    #[test]
    fn fields_per_kind() {
        assert_eq!(
            Kind::Openai.max_tokens_field(),
            MaxTokensField::MaxCompletionTokens
        );
        assert_eq!(Kind::LlamaServer.counting(), Counting::TemplateThenTokenize);
        assert!(Kind::Sglang.aborts_by_request_id());
        assert!(!Kind::Vllm.aborts_by_request_id());
        assert!(Kind::LlamaServer.enforces_tools_by_default());
        let vllm = Kind::Vllm.metrics().expect("vllm metrics");
        assert_eq!(vllm.kv_usage[1], "vllm:gpu_cache_usage_perc");
    }
}
