//! Planner mode end to end: the real gateway and synthetic workers, and
//! hand-written A2A agents on loopback that answer, stall, refuse or
//! break (`harness::a2a_agents`). The plan calls are scripted through the
//! synthetic engine's `synthetic:json_replies=` control (one JSON value per
//! plan call of the conversation), and `synthetic:echo` makes the answer
//! the synthesis prompt itself, so a test can see what was gathered.

use harness::a2a_agents::{Behavior, TestAgent};
use harness::planner::{self, body, outcomes, post, resume_messages, scripted, session, time_tool};
use harness::{bounded, chat, hash_key, json, GatewayOpts, Stack, TestKey, Value, MODELS};
use std::time::{Duration, Instant};

/// Deadlines small enough for tests; loopback agents allowed.
fn planner_toml() -> String {
    planner::config("allow_private_addresses = true\nhedge_after_ms = 400\n")
}

fn stack(models: &[&str], toml: &str) -> Stack {
    Stack::builder()
        .models(models)
        .extra_toml(toml)
        .start()
        .expect("stack starts")
}

fn agent_step(id: &str, target: &str, deps: &[&str], alternates: &[&str]) -> Value {
    json!({"id": id, "kind": "agent", "target": target, "instruction": format!("Do part {id}."),
           "depends_on": deps, "alternates": alternates})
}

fn llm_step(id: &str, deps: &[&str]) -> Value {
    json!({"id": id, "kind": "llm", "target": "model", "instruction": "Summarise.", "depends_on": deps})
}

/// A plan of `steps` written with names for readability, as the model
/// writes it: steps are identified by position (`id` 1, 2, ...), and
/// `depends_on` names earlier positions.
fn plan(steps: Vec<Value>) -> Value {
    let names: Vec<String> = steps
        .iter()
        .map(|s| s["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let position = |name: &Value| {
        names
            .iter()
            .position(|n| Some(n.as_str()) == name.as_str())
            .map(|i| i + 1)
            .expect("a dependency on a step of the plan")
    };
    let steps: Vec<Value> = steps
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let deps: Vec<usize> = s["depends_on"]
                .as_array()
                .map(|d| d.iter().map(position).collect())
                .unwrap_or_default();
            s["id"] = json!(i + 1);
            s["depends_on"] = json!(deps);
            s
        })
        .collect();
    json!({"thought": "a scripted plan", "steps": steps})
}

/// Warms the gateway's worker channels so timings measure the planner.
async fn warm(stack: &Stack, model: &str) {
    let r = stack
        .client()
        .post_json("/chat/completions", &harness::chat_body(model, "hi"))
        .await
        .expect("warm-up");
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_three_models_answer_with_agents_of_both_protocol_versions() {
    bounded(120, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let old = TestAgent::start("old", "Speaks A2A 0.3", Behavior::V03Only).await;
        let stack = stack(&MODELS, &planner_toml());
        for model in MODELS {
            let s = session();
            let p = plan(vec![
                agent_step("s1", "good", &[], &[]),
                agent_step("s2", "old", &[], &[]),
                llm_step("s3", &["s1", "s2"]),
            ]);
            let reply = post(
                &stack.client(),
                &s,
                &body(
                    model,
                    &scripted("Plan a trip.", &[p]),
                    &[good.url(), old.url()],
                ),
            )
            .await;
            assert_eq!(
                reply.status,
                200,
                "{model}: {}\n{}",
                reply.text(),
                stack.logs()
            );
            let r = reply.json();
            assert_eq!(r["model"], model);
            assert_eq!(r["conversation_id"], s.as_str());
            assert_eq!(r["choices"][0]["finish_reason"], "stop");
            let text = chat::content(&r);
            assert!(text.contains("good says: done"), "{model}: {text}");
            assert!(
                text.contains("old says: done"),
                "{model}: the v0.3 agent's answer: {text}"
            );
            let thought: Vec<String> = serde_json::from_value(r["thought"].clone()).unwrap();
            assert!(
                thought.iter().any(|t| t.starts_with("Plan (")),
                "{thought:?}"
            );
            let o = outcomes(&r);
            for want in [
                ("good", "completed"),
                ("old", "completed"),
                ("model", "completed"),
            ] {
                assert!(
                    o.contains(&(want.0.into(), want.1.into())),
                    "{model}: {o:?}"
                );
            }
            let data = r["executable_data"].as_array().unwrap();
            assert!(
                data.iter().any(|d| d["agent"] == "good"
                    && d["step"] == "s1"
                    && d["type"] == "data"
                    && d["data"]["value"] == 42),
                "{data:?}"
            );
            assert!(r["usage"]["total_tokens"].as_u64().unwrap() > 0);
        }
        // v1.0 calls carry the version header; the v0.3 agent got its own method.
        assert!(
            good.methods().iter().all(|m| m == "SendMessage"),
            "{:?}",
            good.methods()
        );
        assert!(good.versions().iter().all(|v| v == "1.0") && !good.versions().is_empty());
        assert_eq!(old.methods(), vec!["message/send"; 3]);
        // Agent output reaches later steps as quoted data.
        let (_, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
        assert!(
            metrics.contains("gateway_planner_steps_total{kind=\"agent\",outcome=\"completed\"} 6"),
            "{metrics}"
        );
        assert!(metrics.contains("gateway_planner_agent_duration_seconds_bucket"));
        // Without planner_mode, `agents` is refused; a plain reply has the
        // extra fields empty and conversation_id null.
        let plain = stack
            .client()
            .post_json("/chat/completions", &harness::chat_body("base", "hi"))
            .await
            .unwrap()
            .json();
        assert!(plain["conversation_id"].is_null());
        assert_eq!(plain["thought"], json!([]));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_steps_run_in_parallel() {
    bounded(90, async {
        let delay = Duration::from_millis(800);
        let mut agents = Vec::new();
        for name in ["p1", "p2", "p3", "p4"] {
            agents.push(
                TestAgent::start(name, "A slow but good agent", Behavior::Good { delay }).await,
            );
        }
        // Agents slower than the suite's first-byte deadline.
        let toml = planner_toml().replace(
            "first_byte_timeout_ms = 1500",
            "first_byte_timeout_ms = 5000",
        );
        let stack = stack(&["base-mini"], &toml);
        warm(&stack, "base-mini").await;
        let steps = agents
            .iter()
            .map(|a| agent_step(&format!("s-{}", a.name), &a.name, &[], &[]))
            .collect();
        let urls: Vec<String> = agents.iter().map(TestAgent::url).collect();
        let began = Instant::now();
        let reply = post(
            &stack.client(),
            &session(),
            &body(
                "base-mini",
                &scripted("Four things.", &[plan(steps)]),
                &urls,
            ),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        let o = outcomes(&r);
        assert_eq!(
            o.iter().filter(|(_, out)| out == "completed").count(),
            4,
            "{o:?}"
        );
        // One agent's time plus the model calls, far below the sum (3.2 s).
        assert!(
            took < Duration::from_millis(1900),
            "4 × 800 ms agents (3.2 s in sequence) took {took:?}"
        );
        for a in &agents {
            assert_eq!(a.methods(), vec!["SendMessage"], "{}", a.name);
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_agent_is_hedged_and_the_loser_receives_cancel_task() {
    bounded(90, async {
        let slow = TestAgent::start(
            "slow",
            "Slow",
            Behavior::Slow {
                delay: Duration::from_secs(5),
            },
        )
        .await;
        let quick = TestAgent::start("quick", "Quick", Behavior::good()).await;
        let stack = stack(&["base-mini"], &planner_toml());
        warm(&stack, "base-mini").await;
        let p = plan(vec![agent_step("s1", "slow", &[], &["quick"])]);
        let began = Instant::now();
        let reply = post(
            &stack.client(),
            &session(),
            &body(
                "base-mini",
                &scripted("Hedge me.", &[p]),
                &[slow.url(), quick.url()],
            ),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert!(
            took < Duration::from_secs(3),
            "the hedge answered, not the slow agent: {took:?}"
        );
        let thought = r["thought"].to_string();
        assert!(thought.contains("Hedge: step 's1' (slow)"), "{thought}");
        let o = outcomes(&r);
        assert!(o.contains(&("quick".into(), "completed".into())), "{o:?}");
        assert!(o.iter().any(|(_, out)| out == "canceled"), "{o:?}");
        assert!(chat::content(&r).contains("quick says: done"));
        // The loser gets CancelTask for the task it announced.
        let deadline = Instant::now() + Duration::from_secs(3);
        while slow.cancels().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cancels = slow.cancels();
        assert_eq!(cancels.len(), 1, "{:?}", slow.methods());
        assert!(cancels[0].starts_with("slow-task-"), "{cancels:?}");
        assert_eq!(slow.methods()[0], "SendStreamingMessage");

        // A client that goes away cancels the agent tasks still running.
        let p = plan(vec![agent_step("s1", "slow", &[], &[])]);
        let mut b = body("base-mini", &scripted("Then leave.", &[p]), &[slow.url()]);
        b["stream"] = json!(true);
        let client = stack.client();
        let mut stream = client
            .open_stream(
                client
                    .request(reqwest::Method::POST, "/chat/completions")
                    .header("x-session-id", session())
                    .json(&b),
            )
            .await
            .unwrap();
        assert_eq!(stream.status, 200);
        // Read until the plan is announced, then hang up.
        loop {
            let f = stream.next_frame().await.unwrap().expect("a frame");
            if f.data.contains("Plan: ") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(stream);
        let deadline = Instant::now() + Duration::from_secs(3);
        while slow.cancels().len() < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            slow.cancels().len(),
            2,
            "the abandoned task was cancelled: {:?}",
            slow.methods()
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_agent_bad_the_reply_is_still_an_answer_that_says_why() {
    bounded(90, async {
        let rejecting = TestAgent::start("rejecter", "Rejects", Behavior::Rejecting).await;
        let refusing = TestAgent::start("refuser", "Refuses", Behavior::Refusing).await;
        let silent = TestAgent::start("silent", "Never answers", Behavior::Silent).await;
        let sse =
            TestAgent::start("sse", "Starts a stream and stops", Behavior::SseThenNothing).await;
        let broken = TestAgent::start("broken", "Returns 500", Behavior::ServerError).await;
        let malformed = TestAgent::start("malformed", "Bad card", Behavior::MalformedCard).await;
        let huge = TestAgent::start(
            "huge",
            "Answers at length",
            Behavior::Huge { bytes: 200_000 },
        )
        .await;
        let stack = stack(
            &["base"],
            &format!("{}max_response_bytes = 65536\n", planner_toml()),
        );
        warm(&stack, "base").await;
        let first = plan(vec![
            agent_step("a", "rejecter", &[], &[]),
            agent_step("b", "refuser", &[], &[]),
            agent_step("c", "silent", &[], &[]),
            agent_step("d", "sse", &[], &[]),
            agent_step("e", "broken", &[], &["refuser"]),
            agent_step("g", "huge", &[], &[]),
            llm_step("f", &["a", "b"]),
        ]);
        let urls = [
            &rejecting, &refusing, &silent, &sse, &broken, &malformed, &huge,
        ]
        .map(|a| a.url());
        let began = Instant::now();
        let reply = post(
            &stack.client(),
            &session(),
            &body("base", &scripted("Do it all.", &[first]), &urls),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert!(!chat::content(&r).is_empty());
        assert!(
            chat::content(&r).contains("Could not be done"),
            "{}",
            chat::content(&r)
        );
        let o = outcomes(&r);
        for want in [
            ("rejecter", "rejected"),
            ("refuser", "refused"),
            ("silent", "silent"),
            ("sse", "silent"),
            ("broken", "http_error"),
            ("huge", "too_large"),
        ] {
            assert!(
                o.contains(&(want.0.into(), want.1.into())),
                "{want:?} in {o:?}"
            );
        }
        assert!(
            o.iter()
                .any(|(t, out)| t == &malformed.url() && out == "no_card"),
            "{o:?}"
        );
        assert!(
            o.contains(&("model".into(), "skipped".into())),
            "f depends on failed steps: {o:?}"
        );
        let thought = r["thought"].to_string();
        assert!(thought.contains("Re-plan 1"), "{thought}");
        // Every agent is excluded and there are no tools: no plan call,
        // the synthesis answers from what was gathered.
        assert!(
            thought.contains("no agents or tools to plan with"),
            "{thought}"
        );
        // Silent agents are abandoned at their deadlines (1.5 s here).
        assert!(took < Duration::from_secs(5), "{took:?}");
        let details = r["tool_thought"].to_string();
        assert!(
            details.contains("does not take such tasks"),
            "the rejection's reason: {details}"
        );
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_agents_do_not_stretch_the_run_past_its_deadline() {
    bounded(90, async {
        let silent = TestAgent::start("silent", "Never answers", Behavior::Silent).await;
        let sse =
            TestAgent::start("sse", "Starts a stream and stops", Behavior::SseThenNothing).await;
        // Agent deadlines far beyond the run's own.
        let toml = r#"
[planner]
allow_private_addresses = true
first_byte_timeout_ms = 30000
idle_timeout_ms = 30000
step_timeout_ms = 30000
hedge_after_ms = 30000
run_timeout_ms = 1200
"#;
        let stack = stack(&["base-mini"], toml);
        warm(&stack, "base-mini").await;
        let p = plan(vec![
            agent_step("a", "silent", &[], &[]),
            agent_step("b", "sse", &[], &[]),
        ]);
        let began = Instant::now();
        let reply = post(
            &stack.client(),
            &session(),
            &body(
                "base-mini",
                &scripted("Wait.", &[p]),
                &[silent.url(), sse.url()],
            ),
        )
        .await;
        let took = began.elapsed();
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(
            took < Duration::from_millis(3000),
            "the run ends at its 1.2 s deadline: {took:?}"
        );
        let r = reply.json();
        let o = outcomes(&r);
        assert!(o.contains(&("silent".into(), "timeout".into())), "{o:?}");
        assert!(o.contains(&("sse".into(), "timeout".into())), "{o:?}");
        assert!(
            r["thought"].to_string().contains("wall clock"),
            "{}",
            r["thought"]
        );
        assert!(!chat::content(&r).is_empty());
    })
    .await
}

fn tool_plan() -> Value {
    planner::tool_pause_plan("good")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_pause_and_resume_across_replicas_and_a_restart() {
    bounded(120, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let other = TestKey::random("org-other");
        let mut stack = Stack::builder()
            .models(&["base-mini"])
            .redis()
            .gateway_opts(GatewayOpts {
                keys: vec![TestKey::random("org-test"), other.clone()],
                ..GatewayOpts::default()
            })
            .extra_toml(&planner_toml())
            .start()
            .expect("stack");
        let mut b_gateway =
            harness::Gateway::start(stack.gateway.opts().clone()).expect("a second replica");
        let a = stack.client();
        let b = b_gateway.client();
        let b_other = b.with_key(Some(&other.key));
        let s = session();
        let text = scripted("What time is it where the agent is?", &[tool_plan()]);
        let mut first = body("base-mini", &text, &[good.url()]);
        first["tools"] = time_tool();
        let paused = post(&a, &s, &first).await;
        assert_eq!(paused.status, 200, "{}", paused.text());
        let p = paused.json();
        assert_eq!(p["choices"][0]["finish_reason"], "tool_calls");
        assert!(p["choices"][0]["message"]["content"].is_null());
        let call = &p["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_time");
        assert_eq!(
            serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
            json!({"tz": "UTC"})
        );
        let call_id = call["id"].as_str().unwrap().to_owned();
        assert!(call_id.starts_with("call_"));
        assert!(outcomes(&p).contains(&("get_time".into(), "awaiting_caller".into())));
        assert_eq!(p["conversation_id"], s.as_str());

        let resume = |id: &str| {
            let mut r = body("base-mini", &text, &[]);
            r["messages"] = resume_messages(&text, &p, id, "12:00 UTC");
            r["tools"] = time_tool();
            r
        };
        // A result for a call nobody waits for is a 400 naming it.
        let wrong = post(&b, &s, &resume("call_unknown")).await;
        harness::assert_error(&wrong, 400, "invalid_value");
        assert_eq!(wrong.json()["error"]["param"], "messages.2.tool_call_id");
        // Another organisation sees nothing of the session.
        let foreign = post(&b_other, &s, &resume(&call_id)).await;
        harness::assert_error(&foreign, 400, "invalid_value");
        assert_eq!(foreign.json()["error"]["param"], "messages.2.tool_call_id");
        // The other replica resumes it.
        let done = post(&b, &s, &resume(&call_id)).await;
        assert_eq!(done.status, 200, "{}", done.text());
        let d = done.json();
        assert_eq!(d["choices"][0]["finish_reason"], "stop");
        assert!(
            chat::content(&d).contains("12:00 UTC"),
            "{}",
            chat::content(&d)
        );
        assert!(
            chat::content(&d).contains("good says: done"),
            "{}",
            chat::content(&d)
        );
        assert!(outcomes(&d).contains(&("model".into(), "completed".into())));
        // Finished: the same result again answers nothing.
        let again = post(&b, &s, &resume(&call_id)).await;
        harness::assert_error(&again, 400, "invalid_value");

        // A new user message starts a new plan in the same session; it
        // pauses on B, and A resumes it after a restart.
        let paused = post(&b, &s, &first).await;
        assert_eq!(paused.status, 200, "{}", paused.text());
        let p2 = paused.json();
        let call_id = p2["choices"][0]["message"]["tool_calls"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        stack.gateway.restart().expect("restart");
        let mut r = body("base-mini", &text, &[]);
        r["messages"] = resume_messages(&text, &p2, &call_id, "13:00 UTC");
        r["tools"] = time_tool();
        let done = post(&stack.client(), &s, &r).await;
        assert_eq!(done.status, 200, "{}\n{}", done.text(), stack.logs());
        assert!(chat::content(&done.json()).contains("13:00 UTC"));
        b_gateway.kill();
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_request_on_a_busy_session_gets_409() {
    bounded(60, async {
        let slowish = TestAgent::start(
            "slowish",
            "Takes a while",
            Behavior::Good {
                delay: Duration::from_millis(1200),
            },
        )
        .await;
        let stack = stack(&["base-mini"], &planner_toml());
        let s = session();
        let b = body(
            "base-mini",
            &scripted(
                "Slowly.",
                &[plan(vec![agent_step("s1", "slowish", &[], &[])])],
            ),
            &[slowish.url()],
        );
        let client = stack.client();
        let first = {
            let (client, s, b) = (client.clone(), s.clone(), b.clone());
            tokio::spawn(async move { post(&client, &s, &b).await })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = post(&client, &s, &b).await;
        harness::assert_error(&second, 409, "session_busy");
        // When to come back: at most the lock's lease.
        let retry_after: u64 = second
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("a retry-after on the 409");
        assert!((1..=15).contains(&retry_after), "{retry_after}");
        let first = first.await.unwrap();
        assert_eq!(first.status, 200, "{}", first.text());
        // Free again once the first request ended.
        let third = post(&client, &s, &b).await;
        assert_eq!(third.status, 200, "{}", third.text());
    })
    .await
}

/// A replica that dies mid-request cannot unlock its session (neither can
/// one whose Redis was away at the end, and the lock survives a restart on
/// AOF): the lock is a lease its holder renews, so the session is free
/// again within the lease (15 s), not after the run's whole deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_replica_died_mid_request_is_free_within_the_lease() {
    bounded(90, async {
        let slow = TestAgent::start(
            "slow",
            "Takes a long while",
            Behavior::Good {
                delay: Duration::from_secs(30),
            },
        )
        .await;
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let toml = planner::config("allow_private_addresses = true\nhedge_after_ms = 60000\n")
            .replace("step_timeout_ms = 4000", "step_timeout_ms = 60000")
            .replace("run_timeout_ms = 6000", "run_timeout_ms = 60000")
            .replace(
                "first_byte_timeout_ms = 1500",
                "first_byte_timeout_ms = 60000",
            );
        let mut stack = Stack::builder()
            .models(&["base-mini"])
            .redis()
            .extra_toml(&toml)
            .start()
            .expect("stack");
        let mut b_gateway =
            harness::Gateway::start(stack.gateway.opts().clone()).expect("a second replica");
        let (a, b) = (stack.client(), b_gateway.client());
        let s = session();
        let slow_body = body(
            "base-mini",
            &scripted("Slowly.", &[plan(vec![agent_step("s1", "slow", &[], &[])])]),
            &[slow.url()],
        );
        let held = {
            let (a, s) = (a.clone(), s.clone());
            tokio::spawn(async move { post(&a, &s, &slow_body).await })
        };
        let quick = body(
            "base-mini",
            &scripted(
                "Quickly.",
                &[plan(vec![agent_step("s1", "good", &[], &[])])],
            ),
            &[good.url()],
        );
        // (Polling with requests of the same session would race the first
        // for the lock.)
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let busy = post(&b, &s, &quick).await;
        harness::assert_error(&busy, 409, "session_busy");
        stack.gateway.kill();
        let killed = Instant::now();
        held.abort();
        harness::wait_until(
            "the session to be free on the other replica",
            Duration::from_secs(25),
            || async { post(&b, &s, &quick).await.status == 200 },
        )
        .await;
        let freed = killed.elapsed();
        assert!(
            freed <= Duration::from_secs(17),
            "free {freed:?} after its holder died (lease 15 s)"
        );
        b_gateway.kill();
    })
    .await
}

/// The frames of a whole SSE body, keep-alive comments included.
fn raw_frames(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

fn frame_json(frame: &str) -> Option<Value> {
    frame
        .strip_prefix("data: ")
        .and_then(|d| serde_json::from_str(d).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_keeps_its_event_order_for_answers_and_pauses() {
    bounded(90, async {
        let good = TestAgent::start(
            "good",
            "Answers anything",
            Behavior::Good {
                delay: Duration::from_millis(700),
            },
        )
        .await;
        let stack = stack(&["base-mini"], &planner_toml());
        let mut b = body(
            "base-mini",
            &scripted(
                "Stream it.",
                &[plan(vec![agent_step("s1", "good", &[], &[])])],
            ),
            &[good.url()],
        );
        b["stream"] = json!(true);
        b["stream_options"] = json!({"include_usage": true});
        let s = session();
        let reply = post(&stack.client(), &s, &b).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        let frames = raw_frames(&reply.text());
        let pos = |pred: &dyn Fn(&str, &Value) -> bool| {
            frames
                .iter()
                .position(|f| frame_json(f).is_some_and(|v| pred(f, &v)))
        };
        let role = pos(&|_, v| v["choices"][0]["delta"]["role"] == "assistant").unwrap();
        let thought = pos(&|_, v| v.get("thought").is_some()).unwrap();
        let tool = pos(&|_, v| v.get("tool_thought").is_some()).unwrap();
        let content = pos(&|_, v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .unwrap();
        let finish = pos(&|_, v| v["choices"][0]["finish_reason"] == "stop").unwrap();
        let usage = pos(&|_, v| v["usage"]["total_tokens"].as_u64().is_some()).unwrap();
        assert_eq!(role, 0, "{frames:?}");
        assert!(
            role < thought
                && thought < tool
                && tool < content
                && content < finish
                && finish < usage,
            "{frames:?}"
        );
        assert_eq!(frames.last().unwrap(), "data: [DONE]");
        assert!(usage + 1 == frames.len() - 1);
        let last_tool = frames
            .iter()
            .rposition(|f| frame_json(f).is_some_and(|v| v.get("tool_thought").is_some()))
            .unwrap();
        assert!(
            last_tool < content,
            "every step is reported before the answer"
        );
        let keepalives = frames
            .iter()
            .filter(|f| f.as_str() == ": keep-alive")
            .count();
        assert!(
            keepalives >= 1,
            "keep-alive comments during the 700 ms step: {frames:?}"
        );
        assert!(frames
            .iter()
            .filter_map(|f| frame_json(f))
            .all(|v| v["conversation_id"] == s.as_str()));
        assert!(frames
            .iter()
            .filter_map(|f| frame_json(f))
            .any(|v| v["executable_data"][0]["agent"] == "good"));

        // A pause streams as tool calls.
        let mut b = body(
            "base-mini",
            &scripted("Pause it.", &[tool_plan()]),
            &[good.url()],
        );
        b["stream"] = json!(true);
        b["tools"] = time_tool();
        let reply = post(&stack.client(), &session(), &b).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let frames = raw_frames(&reply.text());
        let json_frames: Vec<Value> = frames.iter().filter_map(|f| frame_json(f)).collect();
        let header = json_frames
            .iter()
            .position(|v| v["choices"][0]["delta"]["tool_calls"][0]["id"].is_string())
            .unwrap();
        assert_eq!(
            json_frames[header]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
            "get_time"
        );
        let args = &json_frames[header + 1]["choices"][0]["delta"]["tool_calls"][0];
        assert!(args.get("id").is_none());
        assert_eq!(args["function"]["arguments"], "{\"tz\":\"UTC\"}");
        assert_eq!(
            json_frames[header + 2]["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert_eq!(frames.last().unwrap(), "data: [DONE]");
        assert!(!json_frames
            .iter()
            .any(|v| v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_is_managed_with_the_cli_and_agents_are_discovered_from_it() {
    bounded(90, async {
        let weather = TestAgent::start(
            "weather",
            "Daily weather forecast for any city",
            Behavior::good(),
        )
        .await;
        let stack = Stack::builder()
            .models(&["base-mini"])
            .redis()
            .extra_toml(&planner_toml())
            .gateway_env((
                "IGW_TEST_WEATHER_TOKEN".into(),
                "Bearer s3cret-token".into(),
            ))
            .start()
            .expect("stack");
        stack.cli(&[
            "agents",
            "add",
            "weather-eu",
            &weather.url(),
            "--auth-header",
            "authorization",
            "--auth-secret-env",
            "IGW_TEST_WEATHER_TOKEN",
        ]);
        let listed = stack.cli(&["agents", "list"]);
        assert!(
            listed.contains("weather-eu") && listed.contains(&weather.url()),
            "{listed}"
        );
        assert!(
            listed.contains("$IGW_TEST_WEATHER_TOKEN") && !listed.contains("s3cret"),
            "{listed}"
        );
        let probe = stack.cli(&["agents", "probe", "weather-eu", "--allow-private"]);
        assert!(probe.contains("healthy: weather"), "{probe}");
        // No `agents`: the planner finds the agent by its card.
        let p = plan(vec![agent_step("s1", "weather-eu", &[], &[])]);
        let reply = post(
            &stack.client(),
            &session(),
            &body(
                "base-mini",
                &scripted(
                    "What is the weather forecast for Paris?",
                    std::slice::from_ref(&p),
                ),
                &[],
            ),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert!(
            outcomes(&r).contains(&("weather-eu".into(), "completed".into())),
            "{}",
            r["tool_thought"]
        );
        // Named by directory id.
        let reply = post(
            &stack.client(),
            &session(),
            &body(
                "base-mini",
                &scripted("Anything.", &[p]),
                &["weather-eu".into()],
            ),
        )
        .await;
        assert!(outcomes(&reply.json()).contains(&("weather-eu".into(), "completed".into())));
        // The directory's auth header, its value from the gateway's environment.
        assert_eq!(weather.auth(), vec!["Bearer s3cret-token"; 2]);
        assert!(stack
            .cli(&["agents", "remove", "weather-eu"])
            .contains("removed"));
        assert!(!stack.cli(&["agents", "list"]).contains("weather-eu"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_addresses_are_refused_by_default_and_the_scope_can_forbid_the_planner() {
    bounded(60, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let no_planner = "sk-test-no-planner-scope";
        let toml = format!(
            "[[keys]]\nsha256 = \"{}\"\norg = \"org-test\"\nscopes = [\"chat.write\", \"models.read\"]\n",
            hash_key(no_planner)
        );
        let stack = stack(&["base-mini"], &toml);
        let p = plan(vec![llm_step("s1", &[])]);
        let reply = post(&stack.client(), &session(), &body("base-mini", &scripted("Call it.", &[p]), &[good.url()])).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        let denied = r["tool_thought"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["target"] == good.url().as_str())
            .cloned()
            .unwrap_or_default();
        assert_eq!(denied["outcome"], "no_card", "{}", r["tool_thought"]);
        assert!(denied["detail"].as_str().unwrap().contains("not allowed"), "{denied}");
        assert!(good.methods().is_empty());
        let forbidden = post(&stack.client().with_key(Some(no_planner)), &session(), &body("base-mini", "x", &[])).await;
        assert_eq!(forbidden.status, 403, "{}", forbidden.text());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_calls_fit_a_worker_whose_window_is_below_the_output_cap() {
    bounded(60, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        // A real engine's small context: the planner's 8192-token output cap
        // cannot fit, so the calls ask for what fits instead of failing.
        let stack = Stack::builder()
            .models(&["base-mini"])
            .worker_opts(harness::WorkerOpts {
                context_window: Some(8192),
                ..Default::default()
            })
            .extra_toml(&format!("{}max_plan_tokens = 8192\n", planner_toml()))
            .start()
            .expect("stack");
        let p = plan(vec![
            agent_step("s1", "good", &[], &[]),
            llm_step("s2", &["s1"]),
        ]);
        let reply = post(
            &stack.client(),
            &session(),
            &body("base-mini", &scripted("Small window.", &[p]), &[good.url()]),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        let thought = r["thought"].to_string();
        assert!(
            thought.contains("output tokens): a scripted plan"),
            "{thought}"
        );
        assert!(!thought.contains("Fallback"), "{thought}");
        assert!(outcomes(&r).contains(&("model".into(), "completed".into())));
        assert!(chat::content(&r).contains("good says: done"));
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_and_token_budgets_end_execution_early_with_an_answer() {
    bounded(60, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let p = plan(vec![
            agent_step("s1", "good", &[], &[]),
            agent_step("s2", "good", &["s1"], &[]),
        ]);
        // One step allowed: the second is skipped, and said so.
        let stack_steps = stack(
            &["base-mini"],
            &format!("{}max_steps = 1\n", planner_toml()),
        );
        let reply = post(
            &stack_steps.client(),
            &session(),
            &body(
                "base-mini",
                &scripted("Two steps.", std::slice::from_ref(&p)),
                &[good.url()],
            ),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        let o = outcomes(&r);
        assert!(o.contains(&("good".into(), "completed".into())), "{o:?}");
        assert!(o.contains(&("good".into(), "skipped".into())), "{o:?}");
        assert!(
            r["thought"].to_string().contains("step budget (1)"),
            "{}",
            r["thought"]
        );
        assert_eq!(good.methods().len(), 1);
        drop(stack_steps);
        // The plan call alone spends the token budget: no step runs.
        let stack_tokens = stack(
            &["base-mini"],
            &format!("{}max_run_tokens = 1\n", planner_toml()),
        );
        let reply = post(
            &stack_tokens.client(),
            &session(),
            &body("base-mini", &scripted("No tokens.", &[p]), &[good.url()]),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert!(
            r["thought"].to_string().contains("token budget (1)"),
            "{}",
            r["thought"]
        );
        assert!(!chat::content(&r).is_empty());
        assert_eq!(good.methods().len(), 1, "no agent was called");
    })
    .await
}

/// An answer the request set no `max_tokens` for ends at the planner's
/// `max_answer_tokens` (a small model left unbounded ran on to the
/// synthesis deadline, two minutes); a request's own `max_tokens` wins.
/// The reply echoes the tier its model calls were queued at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_max_tokens_ends_at_the_planner_s_cap() {
    bounded(60, async {
        let good = TestAgent::start("good", "Answers anything", Behavior::good()).await;
        let p = plan(vec![agent_step("s1", "good", &[], &[])]);
        let stack = stack(
            &["base-mini"],
            &format!("{}max_answer_tokens = 16
", planner_toml()),
        );
        let ask = |reply_tokens: u32| {
            format!(
                "Tell me everything. synthetic:reply_tokens={reply_tokens} synthetic:json_replies={p}"
            )
        };
        let reply = post(
            &stack.client(),
            &session(),
            &body("base-mini", &ask(400), &[good.url()]),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert_eq!(r["choices"][0]["finish_reason"], "length", "{r}");
        let words = chat::content(&r).split_whitespace().count();
        assert!((1..=16).contains(&words), "{words} words: {r}");

        let mut own = body("base-mini", &ask(30), &[good.url()]);
        own["max_tokens"] = json!(100);
        own["service_tier"] = json!("flex");
        let reply = post(&stack.client(), &session(), &own).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let r = reply.json();
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert!(chat::content(&r).split_whitespace().count() > 16, "{r}");
        assert_eq!(r["service_tier"], "flex", "{r}");
    })
    .await
}

/// Without a scripted plan the simulator writes what the plan's grammar
/// offers (one step per target), so the agents a request names are asked:
/// each receives the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unscripted_plans_on_the_simulator_ask_the_named_agents() {
    bounded(90, async {
        let good = || Behavior::good();
        let first = TestAgent::start("first", "Answers anything", good()).await;
        let second = TestAgent::start("second", "Answers anything too", good()).await;
        let stack = stack(&MODELS, &planner_toml());
        for model in MODELS {
            let asked = (first.texts().len(), second.texts().len());
            let reply = post(
                &stack.client(),
                &session(),
                &body(
                    model,
                    "Plan a trip to Lisbon.",
                    &[first.url(), second.url()],
                ),
            )
            .await;
            assert_eq!(reply.status, 200, "{model}: {}", reply.text());
            let r = reply.json();
            let thought: Vec<String> = serde_json::from_value(r["thought"].clone()).unwrap();
            assert!(
                thought.iter().any(|t| t.starts_with("Plan (")),
                "{model}: a valid plan at the first call: {thought:?}"
            );
            let o = outcomes(&r);
            for agent in ["first", "second"] {
                assert!(
                    o.contains(&(agent.into(), "completed".into())),
                    "{model}: {o:?}"
                );
            }
            for (agent, before) in [(&first, asked.0), (&second, asked.1)] {
                let texts = agent.texts();
                assert!(texts.len() > before, "{model}: {} got nothing", agent.name);
                assert!(
                    texts[before..]
                        .iter()
                        .any(|t| t.contains("Plan a trip to Lisbon.")),
                    "{model}: the request reaches {}: {texts:?}",
                    agent.name
                );
            }
            assert_eq!(r["choices"][0]["finish_reason"], "stop");
        }
    })
    .await
}

fn two_tools() -> Value {
    let tool = |name: &str| {
        json!({"type": "function", "function": {"name": name, "description": "A caller's tool",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"], "additionalProperties": false}}})
    };
    json!([tool("get_time"), tool("get_weather")])
}

/// `tool_choice` in planner mode: `required` makes the plan call one of the
/// caller's tools (the reply pauses for it), a named function makes it
/// call that one, `none` keeps the tools out; naming a function that is
/// not among `tools` is the only 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_choice_shapes_the_plan() {
    bounded(90, async {
        let stack = stack(&["base-mini"], &planner_toml());
        let ask = |choice: Value| {
            let mut b = body("base-mini", "What should I pack?", &[]);
            b["tools"] = two_tools();
            b["tool_choice"] = choice;
            b
        };
        let called = |r: &Value| -> Vec<String> {
            r["choices"][0]["message"]["tool_calls"]
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .filter_map(|c| c["function"]["name"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let required = post(&stack.client(), &session(), &ask(json!("required"))).await;
        assert_eq!(required.status, 200, "{}", required.text());
        let r = required.json();
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
        assert!(!called(&r).is_empty(), "{r}");

        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let named = post(&stack.client(), &session(), &ask(named)).await;
        assert_eq!(named.status, 200, "{}", named.text());
        let r = named.json();
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
        let names = called(&r);
        assert!(
            names.iter().all(|n| n == "get_weather") && !names.is_empty(),
            "{r}"
        );

        let none = post(&stack.client(), &session(), &ask(json!("none"))).await;
        assert_eq!(none.status, 200, "{}", none.text());
        let r = none.json();
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        assert!(called(&r).is_empty());

        let ghost = json!({"type": "function", "function": {"name": "get_ghost"}});
        let refused = post(&stack.client(), &session(), &ask(ghost)).await;
        harness::assert_error(&refused, 400, "invalid_value");
        assert_eq!(refused.json()["error"]["param"], "tool_choice");
    })
    .await
}
