//! Planner mode on the real model: the real gateway in front of a real
//! `llama` worker (llama.cpp in process) on the SmolLM2-135M GGUF, with
//! hand-written A2A agents on loopback. Nothing is scripted: the model
//! writes its plan under the plan's grammar. SmolLM2 is a weak planner;
//! the asserts are on what the grammar, the guard and the default plan
//! guarantee whatever it writes: a valid plan at the first call, the named
//! agent asked, an answer, a pause for a required tool.

use harness::a2a_agents::{Behavior, TestAgent};
use harness::model::model_file;
use harness::planner::{self, outcomes, post, session, thoughts};
use harness::{bounded, chat, json, Stack, Value, WorkerOpts};
use std::time::Instant;

/// Room for the plan prompt and the longest plan the grammar admits.
const N_CTX: u32 = 4096;

const PLANNER_TOML: &str = r#"
[planner]
allow_private_addresses = true
connect_timeout_ms = 1000
first_byte_timeout_ms = 5000
idle_timeout_ms = 5000
step_timeout_ms = 10000
hedge_after_ms = 8000
run_timeout_ms = 60000
synthesis_timeout_ms = 60000
"#;

fn llama_stack() -> Stack {
    let file = model_file().expect("the SmolLM2 GGUF (scripts/fetch-model.sh)");
    Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts::llama(&file, N_CTX, 2))
        .extra_toml(PLANNER_TOML)
        .start()
        .expect("stack starts")
}

/// A planner request on `base` with short answers; `agents` is always
/// sent, empty or not.
fn body(text: &str, agents: &[String]) -> Value {
    let mut b = planner::body("base", text, agents);
    b["max_tokens"] = json!(48);
    b["agents"] = json!(agents);
    b
}

/// The reply is an answer (not a pause): `stop`, or `length` where the
/// request's `max_tokens` cut it.
fn answered(reply: &Value) -> bool {
    matches!(
        reply["choices"][0]["finish_reason"].as_str(),
        Some("stop" | "length")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_good_agent_is_asked_and_the_model_answers() {
    bounded(180, async {
        let weather = TestAgent::start(
            "weather",
            "Weather forecasts for any city",
            Behavior::good(),
        )
        .await;
        let stack = llama_stack();
        let began = Instant::now();
        let reply = post(
            &stack.client(),
            &session(),
            &body("What is the weather in Paris?", &[weather.url()]),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(reply.status, 200, "{}\n{}", reply.text(), stack.logs());
        let r = reply.json();
        println!(
            "one planner request with one agent: {took:?}; usage {}; thought {}",
            r["usage"], r["thought"]
        );
        let thought = thoughts(&r);
        assert!(
            thought.iter().any(|t| t.starts_with("Plan (")),
            "the first plan call wrote a valid plan: {thought:?}"
        );
        assert!(
            outcomes(&r).contains(&("weather".into(), "completed".into())),
            "{}",
            r["tool_thought"]
        );
        assert!(
            weather
                .texts()
                .iter()
                .any(|t| t.contains("What is the weather in Paris?")),
            "the agent got the request: {:?}",
            weather.texts()
        );
        assert!(!chat::content(&r).trim().is_empty(), "{r}");
        // An answer: ended by the model or cut at the request's max_tokens.
        assert!(answered(&r), "{r}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_bad_agents_it_answers_and_says_what_went_wrong() {
    bounded(180, async {
        let rejecting = TestAgent::start("rejecter", "Books flights", Behavior::Rejecting).await;
        let broken = TestAgent::start("broken", "Books hotels", Behavior::ServerError).await;
        let stack = llama_stack();
        let reply = post(
            &stack.client(),
            &session(),
            &body("Book me a trip to Rome.", &[rejecting.url(), broken.url()]),
        )
        .await;
        assert_eq!(reply.status, 200, "{}\n{}", reply.text(), stack.logs());
        let r = reply.json();
        let o = outcomes(&r);
        assert!(o.contains(&("rejecter".into(), "rejected".into())), "{o:?}");
        assert!(o.contains(&("broken".into(), "http_error".into())), "{o:?}");
        let details = r["tool_thought"].to_string();
        assert!(details.contains("does not take such tasks"), "{details}");
        assert!(!chat::content(&r).trim().is_empty(), "{r}");
        // An answer: ended by the model or cut at the request's max_tokens.
        assert!(answered(&r), "{r}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_required_pauses_for_the_tool_and_the_session_resumes() {
    bounded(180, async {
        let stack = llama_stack();
        let params = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"], "additionalProperties": false});
        let tools = json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather of a city", "parameters": params}}]);
        let ask = "What is the weather in Paris?";
        let mut first = body(ask, &[]);
        first["tools"] = tools.clone();
        first["tool_choice"] = json!("required");
        let s = session();
        let paused = post(&stack.client(), &s, &first).await;
        assert_eq!(paused.status, 200, "{}\n{}", paused.text(), stack.logs());
        let p = paused.json();
        assert_eq!(p["choices"][0]["finish_reason"], "tool_calls", "{p}");
        let call = &p["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather", "{p}");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or(""))
            .expect("arguments are JSON");
        assert!(
            jsonschema::validator_for(&params).unwrap().is_valid(&args),
            "{args}"
        );
        let call_id = call["id"].as_str().expect("a call id").to_owned();

        let mut resume = body(ask, &[]);
        resume["tools"] = tools;
        resume["messages"] = json!([
            {"role": "user", "content": ask},
            {"role": "assistant", "content": null, "tool_calls": p["choices"][0]["message"]["tool_calls"]},
            {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 24 C"}
        ]);
        let done = post(&stack.client(), &s, &resume).await;
        assert_eq!(done.status, 200, "{}\n{}", done.text(), stack.logs());
        let d = done.json();
        assert!(answered(&d), "{d}");
        assert!(
            outcomes(&d).contains(&("get_weather".into(), "completed".into())),
            "{}",
            d["tool_thought"]
        );
        assert!(!chat::content(&d).trim().is_empty(), "{d}");
    })
    .await
}
