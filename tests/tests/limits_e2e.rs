//! Keys, organisations, plans, rate limits and usage end to end: real
//! gateways on the test Redis (under a private prefix), real synthetic
//! workers, and the operator CLI (`gateway keys|orgs|plans|usage`) as an
//! operator would run it.

use harness::{assert_error, chat_body, json, Client, Gateway, Stack, Value, WorkerOpts};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A stack with only `base` (and optionally `base-mini`) on Redis.
fn redis_stack(models: &[&str], worker: WorkerOpts, extra_toml: &str) -> Stack {
    Stack::builder()
        .models(models)
        .worker_opts(worker)
        .redis()
        .extra_toml(extra_toml)
        .start()
        .expect("stack starts")
}

/// Runs `gateway <args>` against the stack's Redis prefix; returns stdout.
#[track_caller]
fn cli(stack: &Stack, args: &[&str]) -> String {
    stack.cli(args)
}

/// `gateway keys create ...`: the printed secret.
#[track_caller]
fn create_key(stack: &Stack, org: &str, extra: &[&str]) -> String {
    let mut args = vec!["keys", "create", "--org", org];
    args.extend_from_slice(extra);
    let out = cli(stack, &args);
    let key = out.trim().to_string();
    assert!(key.starts_with("sk-"), "keys create printed {out:?}");
    key
}

fn client_with(stack: &Stack, key: &str) -> Client {
    stack.client().with_key(Some(key))
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Asserts the six `x-ratelimit-*` headers and returns (remaining
/// requests, remaining tokens).
#[track_caller]
fn assert_rate_headers(h: &reqwest::header::HeaderMap, rpm: u64, tpm: u64) -> (u64, u64) {
    let num = |n: &str| -> u64 {
        header(h, n)
            .unwrap_or_else(|| panic!("missing {n} in {h:?}"))
            .parse()
            .unwrap_or_else(|_| panic!("{n} is not a number in {h:?}"))
    };
    assert_eq!(num("x-ratelimit-limit-requests"), rpm);
    assert_eq!(num("x-ratelimit-limit-tokens"), tpm);
    for reset in ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"] {
        let v = header(h, reset).unwrap_or_else(|| panic!("missing {reset} in {h:?}"));
        assert!(is_go_duration(v), "{reset}: {v:?}");
    }
    (
        num("x-ratelimit-remaining-requests"),
        num("x-ratelimit-remaining-tokens"),
    )
}

/// `12ms`, `1s`, `8.64s`, `6m0s`, `1m1.5s`.
fn is_go_duration(v: &str) -> bool {
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.parse::<u64>().is_ok();
    }
    let Some(rest) = v.strip_suffix('s') else {
        return false;
    };
    let secs = match rest.split_once('m') {
        Some((m, s)) => {
            if m.parse::<u64>().is_err() {
                return false;
            }
            s
        }
        None => rest,
    };
    secs.parse::<f64>().is_ok()
}

#[tokio::test]
async fn unknown_key_is_401_missing_permission_403_blocked_org_402() {
    let stack = redis_stack(&["base", "base-mini"], WorkerOpts::default(), "");
    let full = create_key(&stack, "org-a", &[]);
    let models_only = create_key(&stack, "org-a", &["--scopes", "models.read"]);
    let mini_only = create_key(&stack, "org-a", &["--models", "base-mini"]);
    let chat = chat_body("base", "hi synthetic:reply_tokens=2");

    // 401: no key, unknown key.
    let r = stack
        .client()
        .with_key(None)
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_error(&r, 401, "invalid_api_key");
    let r = client_with(&stack, "sk-nope")
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_error(&r, 401, "invalid_api_key");

    // 200 with every scope.
    let r = client_with(&stack, &full)
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");

    // 403: a scope the key lacks; the scope it has works.
    let r = client_with(&stack, &models_only)
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    let e = assert_error(&r, 403, "permission_denied");
    assert_eq!(e["type"], "permission_error");
    let r = client_with(&stack, &models_only)
        .get("/models")
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");

    // A read-only key reads stored responses but cannot destroy or end
    // them: delete and cancel are writes.
    let reader = create_key(&stack, "org-a", &["--scopes", "responses.read"]);
    let r = client_with(&stack, &full)
        .post_json(
            "/responses",
            &json!({"model": "base", "input": "hi synthetic:reply_tokens=2"}),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    let id = r.json()["id"].as_str().unwrap().to_string();
    let read = client_with(&stack, &reader);
    assert_eq!(
        read.get(&format!("/responses/{id}")).await.unwrap().status,
        200
    );
    let r = read.delete(&format!("/responses/{id}")).await.unwrap();
    assert_error(&r, 403, "permission_denied");
    let r = read
        .post_json(&format!("/responses/{id}/cancel"), &json!({}))
        .await
        .unwrap();
    assert_error(&r, 403, "permission_denied");
    assert_eq!(
        client_with(&stack, &full)
            .get(&format!("/responses/{id}"))
            .await
            .unwrap()
            .status,
        200,
        "still stored"
    );

    // 403: a model outside the key's allow-list, named in `param`.
    let r = client_with(&stack, &mini_only)
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    let e = assert_error(&r, 403, "permission_denied");
    assert_eq!(e["param"], "model");
    let r = client_with(&stack, &mini_only)
        .post_json(
            "/chat/completions",
            &chat_body("base-mini", "hi synthetic:reply_tokens=2"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");

    // 402: the organisation is blocked (published to every replica at once).
    cli(
        &stack,
        &["orgs", "block", "org-a", "--reason", "payment_overdue"],
    );
    let r = wait_for_status(&client_with(&stack, &full), &chat, 402).await;
    let body = r.json();
    let obj = body.as_object().expect("a JSON object");
    let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        ["code", "data", "ev", "message"],
        "exact 402 shape: {r}"
    );
    assert!(body.get("error").is_none());
    assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(body["code"], 402);
    assert!(body["ev"].is_i64(), "{r}");
    assert_eq!(body["data"], json!({"reason": "payment_overdue"}));
    // A blocked org is 402 before a permission check.
    let r = client_with(&stack, &models_only)
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_eq!(r.status, 402, "{r}");

    cli(&stack, &["orgs", "unblock", "org-a"]);
    let r = wait_for_status(&client_with(&stack, &full), &chat, 200).await;
    assert_eq!(r.status, 200);

    // 402 again once the org has spent its budget (the requests above
    // cost more than this), with its own `ev` and reason.
    cli(&stack, &["orgs", "budget", "org-a", "--usd", "0.000001"]);
    let r = wait_for_status(&client_with(&stack, &full), &chat, 402).await;
    let body = r.json();
    assert!(body.get("error").is_none());
    assert_eq!(body["code"], 402);
    assert_eq!(body["data"]["reason"], "budget_exceeded");
    assert_ne!(body["ev"], 1, "over budget has its own ev: {r}");
    cli(&stack, &["orgs", "budget", "org-a", "--clear"]);
    wait_for_status(&client_with(&stack, &full), &chat, 200).await;
}

/// Sends `body` until the reply has `status` (at most 3 s).
async fn wait_for_status(client: &Client, body: &Value, status: u16) -> harness::Reply {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let r = client.post_json("/chat/completions", body).await.unwrap();
        if r.status == status || Instant::now() > deadline {
            assert_eq!(r.status, status, "{r}");
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_the_cache_ttl() {
    let stack = redis_stack(
        &["base"],
        WorkerOpts::default(),
        "[limits]\nkey_cache_ttl_ms = 1000\n",
    );
    let key = create_key(&stack, "org-r", &[]);
    let client = client_with(&stack, &key);
    let chat = chat_body("base", "hi synthetic:reply_tokens=1");
    assert_eq!(
        client
            .post_json("/chat/completions", &chat)
            .await
            .unwrap()
            .status,
        200
    );

    let listed = cli(&stack, &["keys", "list", "--org", "org-r"]);
    assert!(!listed.contains(&key), "keys list never shows secrets");
    let id = listed
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .expect("a key row")
        .to_string();
    let revoked_at = Instant::now();
    cli(&stack, &["keys", "revoke", &id]);
    loop {
        let r = client.post_json("/chat/completions", &chat).await.unwrap();
        if r.status == 401 {
            assert_error(&r, 401, "invalid_api_key");
            break;
        }
        assert_eq!(r.status, 200, "{r}");
        assert!(
            revoked_at.elapsed() < Duration::from_millis(1000),
            "still accepted {:?} after revocation",
            revoked_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(revoked_at.elapsed() < Duration::from_millis(1000));
    let listed = cli(&stack, &["keys", "list", "--org", "org-r"]);
    assert!(listed.contains("revoked"), "{listed}");
}

#[tokio::test]
async fn requests_per_minute_limit_gives_429_with_headers() {
    let stack = redis_stack(&["base"], WorkerOpts::default(), "");
    cli(
        &stack,
        &["plans", "set", "rpm3", "--rpm", "3", "--tpm", "100000"],
    );
    let key = create_key(&stack, "org-rpm", &["--plan", "rpm3"]);
    let client = client_with(&stack, &key);
    let chat = chat_body("base", "hi synthetic:reply_tokens=2");

    let mut remaining = Vec::new();
    let r = client.post_json("/chat/completions", &chat).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    remaining.push(assert_rate_headers(&r.headers, 3, 100_000).0);
    // A stream carries them on its SSE response head.
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let s = client.stream("/chat/completions", &streamed).await.unwrap();
    assert_eq!(s.status, 200);
    remaining.push(assert_rate_headers(&s.headers, 3, 100_000).0);
    s.collect().await.unwrap();
    let r = client.post_json("/chat/completions", &chat).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    remaining.push(assert_rate_headers(&r.headers, 3, 100_000).0);
    assert_eq!(remaining, [2, 1, 0]);

    let r = client.post_json("/chat/completions", &chat).await.unwrap();
    let e = assert_error(&r, 429, "rate_limit_exceeded");
    assert_eq!(e["type"], "rate_limit_error");
    let (rem_req, _) = assert_rate_headers(&r.headers, 3, 100_000);
    assert_eq!(rem_req, 0);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
}

/// The Responses API counts against the same plan as chat, in each form
/// (plain, streamed, background), and carries the same headers.
#[tokio::test]
async fn responses_share_the_plan_limits_and_carry_the_headers() {
    let stack = redis_stack(&["base"], WorkerOpts::default(), "");
    cli(
        &stack,
        &["plans", "set", "rpm4", "--rpm", "4", "--tpm", "100000"],
    );
    let key = create_key(&stack, "org-rpm-resp", &["--plan", "rpm4"]);
    let client = client_with(&stack, &key);
    let body = json!({"model": "base", "input": "hi synthetic:reply_tokens=2"});

    let mut remaining = Vec::new();
    let r = client.post_json("/responses", &body).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    remaining.push(assert_rate_headers(&r.headers, 4, 100_000).0);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let s = client.stream("/responses", &streamed).await.unwrap();
    assert_eq!(s.status, 200);
    remaining.push(assert_rate_headers(&s.headers, 4, 100_000).0);
    s.collect().await.unwrap();
    let mut background = body.clone();
    background["background"] = json!(true);
    let r = client.post_json("/responses", &background).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    remaining.push(assert_rate_headers(&r.headers, 4, 100_000).0);
    let r = client
        .post_json(
            "/chat/completions",
            &chat_body("base", "hi synthetic:reply_tokens=2"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{r}");
    remaining.push(assert_rate_headers(&r.headers, 4, 100_000).0);
    assert_eq!(remaining, [3, 2, 1, 0], "one plan across both APIs");

    let r = client.post_json("/responses", &body).await.unwrap();
    let e = assert_error(&r, 429, "rate_limit_exceeded");
    assert_eq!(e["type"], "rate_limit_error");
    assert_rate_headers(&r.headers, 4, 100_000);
    assert!(r.header("retry-after").is_some());
}

#[tokio::test]
async fn tokens_per_minute_limit_gives_429_and_settles_to_real_usage() {
    let stack = redis_stack(&["base"], WorkerOpts::default(), "");
    cli(
        &stack,
        &["plans", "set", "tpm", "--rpm", "1000", "--tpm", "1000"],
    );
    let key = create_key(&stack, "org-tpm", &["--plan", "tpm"]);
    let client = client_with(&stack, &key);

    // Reserves input estimate + 600, really uses about input + 10.
    let mut small = chat_body("base", "hi synthetic:reply_tokens=10");
    small["max_tokens"] = json!(600);
    let r = client.post_json("/chat/completions", &small).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let (_, left_at_admission) = assert_rate_headers(&r.headers, 1000, 1000);
    assert!(
        left_at_admission < 400,
        "600+ reserved: {left_at_admission}"
    );
    let used = r.json()["usage"]["total_tokens"].as_u64().unwrap();

    // The reservation was settled to real usage, so this one fits.
    let r = client.post_json("/chat/completions", &small).await.unwrap();
    assert_eq!(r.status, 200, "{r}");
    let (_, left) = assert_rate_headers(&r.headers, 1000, 1000);
    assert!(
        left <= 1000 - used - 600,
        "{left} after {used} used + 600 reserved"
    );

    // A reservation that fits the plan but not what is left of this
    // minute (about 50 used + 25 estimated + 960): 429.
    let mut big = small.clone();
    big["max_tokens"] = json!(960);
    let r = client.post_json("/chat/completions", &big).await.unwrap();
    let e = assert_error(&r, 429, "rate_limit_exceeded");
    assert_eq!(e["type"], "rate_limit_error");
    assert_rate_headers(&r.headers, 1000, 1000);
    assert!(r.header("retry-after").is_some());
}

#[tokio::test]
async fn concurrency_limit_gives_429_and_a_cancelled_stream_releases_its_reservation() {
    // 50 tokens/s: a 1000-token reply streams for 20 s.
    let stack = redis_stack(&["base"], WorkerOpts::paced(0, 50), "");
    cli(
        &stack,
        &[
            "plans",
            "set",
            "one",
            "--rpm",
            "1000",
            "--tpm",
            "10000",
            "--max-concurrent",
            "1",
        ],
    );
    let key = create_key(&stack, "org-c", &["--plan", "one"]);
    let client = client_with(&stack, &key);
    let mut long = chat_body("base", "Go on. synthetic:reply_tokens=1000");
    long["stream"] = json!(true);
    long["max_tokens"] = json!(8000);
    let quick = chat_body("base", "hi synthetic:reply_tokens=1");

    let mut stream = client.stream("/chat/completions", &long).await.unwrap();
    assert_eq!(stream.status, 200);
    assert_rate_headers(&stream.headers, 1000, 10_000);
    for _ in 0..3 {
        stream.next_frame().await.unwrap().expect("a frame");
    }
    // The one slot is taken, and so are 8000+ of 10000 tokens.
    let r = client.post_json("/chat/completions", &quick).await.unwrap();
    let e = assert_error(&r, 429, "rate_limit_exceeded");
    assert_eq!(e["type"], "rate_limit_error");
    assert_rate_headers(&r.headers, 1000, 10_000);

    // The client goes away: slot and unused tokens come back.
    drop(stream);
    let mut big = chat_body("base", "hi synthetic:reply_tokens=1");
    big["max_tokens"] = json!(8000);
    let r = wait_for_status(&client, &big, 200).await;
    let (_, left) = assert_rate_headers(&r.headers, 1000, 10_000);
    assert!(left < 2000, "8000 reserved again: {left}");

    // Nothing left in flight in Redis once that one is settled.
    let redis = stack.redis.as_ref().unwrap();
    let inflight = format!("{}rl:{{org-c}}:base:inflight", redis.prefix());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut conn = redis.connection().unwrap();
        let n: u64 = redis::cmd("ZCARD").arg(&inflight).query(&mut conn).unwrap();
        if n == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{n} still in flight");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_exact_limits() {
    let stack = redis_stack(&["base"], WorkerOpts::default(), "");
    let replica = |s: &Stack| Gateway::start(s.gateway.opts().clone()).expect("replica starts");
    let (r2, r3) = (replica(&stack), replica(&stack));
    let urls = [stack.gateway.base_url(), r2.base_url(), r3.base_url()];

    // Requests per minute: hammer three replicas with 24 connections.
    let rpm: usize = 40;
    cli(
        &stack,
        &["plans", "set", "rpm40", "--rpm", &rpm.to_string()],
    );
    let key = create_key(&stack, "org-rep-r", &["--plan", "rpm40"]);
    let chat = chat_body("base", "hi synthetic:reply_tokens=1");
    let (ok, limited, _) = hammer(&urls, &key, &chat, 24, 300).await;
    eprintln!("rpm {rpm}: {ok} admitted, {limited} limited across 3 replicas");
    assert_eq!(ok + limited, 300, "every request is 200 or 429");
    assert!(ok as f64 <= rpm as f64 * 1.01, "admitted {ok} > RPM {rpm}");
    assert_eq!(ok, rpm, "the full allowance is usable across replicas");

    // Tokens per minute: each request reserves its estimate + 100 and
    // uses its prompt + 100.
    let tpm: u64 = 3000;
    cli(
        &stack,
        &["plans", "set", "tpm3k", "--tpm", &tpm.to_string()],
    );
    let key = create_key(&stack, "org-rep-t", &["--plan", "tpm3k"]);
    let mut chat = chat_body("base", "hi synthetic:reply_tokens=100");
    chat["max_tokens"] = json!(100);
    let reservation = chat.to_string().len() as u64 / 4 + 1 + 100;
    let (ok, limited, tokens) = hammer(&urls, &key, &chat, 24, 200).await;
    eprintln!("tpm {tpm}: {ok} admitted using {tokens} tokens, {limited} limited; one reservation = {reservation}");
    assert_eq!(ok + limited, 200);
    assert!(ok > 0);
    assert!(
        tokens <= tpm + reservation,
        "{tokens} tokens admitted > {tpm} + one reservation ({reservation})"
    );
    drop((r2, r3));
}

/// Sends `total` requests over `concurrency` workers spread across `urls`;
/// returns (200s, 429s, total tokens of the 200s).
async fn hammer(
    urls: &[String],
    key: &str,
    body: &Value,
    concurrency: usize,
    total: usize,
) -> (usize, usize, u64) {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..concurrency {
        let client = Client::new(&urls[c % urls.len()], Some(key));
        let body = body.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut limited, mut tokens) = (0, 0, 0);
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                let r = client.post_json("/chat/completions", &body).await.unwrap();
                match r.status {
                    200 => {
                        ok += 1;
                        tokens += r.json()["usage"]["total_tokens"].as_u64().unwrap();
                    }
                    429 => limited += 1,
                    s => panic!("unexpected {s}: {r}"),
                }
            }
            (ok, limited, tokens)
        }));
    }
    let mut sum = (0, 0, 0);
    for t in tasks {
        let (a, b, c) = t.await.unwrap();
        sum = (sum.0 + a, sum.1 + b, sum.2 + c);
    }
    sum
}

#[tokio::test]
async fn usage_and_cost_match_hand_computed_values() {
    let stack = redis_stack(&["base", "base-mini"], WorkerOpts::default(), "");
    let key = create_key(&stack, "org-u", &[]);
    let client = client_with(&stack, &key);

    // A known workload: output lengths fixed by the synthetic worker; a
    // long prompt sent twice (the second is served from the worker's prefix
    // cache: cached input at 10% of the input rate), and a reasoning
    // request (reasoning tokens billed at the output rate).
    let long = "Policy handbook, section one: be precise and brief. ".repeat(40);
    let workload: Vec<(&str, Value)> = vec![
        (
            "base",
            chat_body("base", "Count to 10. synthetic:reply_tokens=10"),
        ),
        (
            "base",
            chat_body("base", "Count to 20. synthetic:reply_tokens=20"),
        ),
        (
            "base",
            chat_body("base", &format!("{long} synthetic:reply_tokens=30")),
        ),
        (
            "base",
            chat_body("base", &format!("{long} synthetic:reply_tokens=30")),
        ),
        ("base", {
            let mut b = chat_body("base", "Think first. synthetic:reply_tokens=12");
            b["enable_thinking"] = json!(true);
            b["thinking_budget"] = json!(32);
            b
        }),
        (
            "base-mini",
            chat_body("base-mini", "Count to 7. synthetic:reply_tokens=7"),
        ),
        (
            "base-mini",
            chat_body("base-mini", "Count to 8. synthetic:reply_tokens=8"),
        ),
    ];
    // model -> (requests, input, cached, output, reasoning)
    let mut expected: HashMap<&str, (u64, u64, u64, u64, u64)> = HashMap::new();
    for (model, body) in &workload {
        let r = client.post_json("/chat/completions", body).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        let u = &r.json()["usage"];
        let reasoning = u["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap_or(0);
        let e = expected.entry(model).or_default();
        e.0 += 1;
        e.1 += u["prompt_tokens"].as_u64().unwrap();
        e.2 += u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        // Completion tokens are the visible reply plus the reasoning.
        assert_eq!(
            u["completion_tokens"].as_u64().unwrap(),
            reply_tokens(body) + reasoning,
            "{u}"
        );
        e.3 += reply_tokens(body) + reasoning;
        e.4 += reasoning;
    }
    let base = expected["base"];
    assert!(
        base.2 >= 256,
        "the repeated long prompt was served from cache: {base:?}"
    );
    assert!(
        (20..=32).contains(&base.4),
        "reasoning within its budget of 32: {base:?}"
    );
    // USD per million: input, cached input, output (spec section 8).
    let price = |m: &str| match m {
        "base" => (0.50, 0.05, 1.90),
        "base-mini" => (0.18, 0.018, 0.45),
        _ => unreachable!(),
    };
    let hand_cost = |m: &str, (_, input, cached, output, _): (u64, u64, u64, u64, u64)| {
        let (pi, pc, po) = price(m);
        ((input - cached) as f64 * pi + cached as f64 * pc + output as f64 * po) / 1e6
    };

    // Settling is one round trip after the reply; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    let rows = loop {
        let out = cli(&stack, &["usage", "--org", "org-u", "--json"]);
        let rows: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let requests: u64 = rows.iter().map(|r| r["requests"].as_u64().unwrap()).sum();
        if requests == workload.len() as u64 || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(rows.len(), 2, "one row per model: {rows:?}");
    for row in &rows {
        let model = row["model"].as_str().unwrap();
        let e = expected[model];
        assert_eq!(row["org"], "org-u");
        assert_eq!(row["key_id"].as_str().unwrap().len(), 12);
        assert_eq!(row["requests"], e.0, "{row}");
        assert_eq!(row["input_tokens"], e.1, "{row}");
        assert_eq!(row["cached_input_tokens"], e.2, "{row}");
        assert_eq!(row["output_tokens"], e.3, "{row}");
        assert_eq!(row["reasoning_tokens"], e.4, "{row}");
        let cost = row["cost_usd"].as_f64().unwrap();
        let hand = hand_cost(model, e);
        assert!((cost - hand).abs() < 1e-12, "{model}: {cost} vs {hand}");
    }

    // The table form prints the same totals.
    let table = cli(&stack, &["usage", "--org", "org-u"]);
    assert!(
        table.lines().last().unwrap().starts_with("total"),
        "{table}"
    );

    // Prometheus has the per-org counters too.
    let (status, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("gateway_usage_tokens_total{") && metrics.contains("org=\"org-u\""));
    assert!(metrics.contains("gateway_usage_cost_usd_total{"));
}

#[tokio::test]
async fn redis_down_fails_open_on_local_limits_or_closed_with_503() {
    // Nothing listens on port 1: Redis is unreachable from the start.
    let plan = "[plans.default]\nrpm = 2\n";
    let open = Stack::builder()
        .models(&["base"])
        .extra_toml(&format!(
            "{plan}[store]\nredis_url = \"redis://127.0.0.1:1/\"\n"
        ))
        .start()
        .unwrap();
    let chat = chat_body("base", "hi synthetic:reply_tokens=1");
    for _ in 0..2 {
        let r = open
            .client()
            .post_json("/chat/completions", &chat)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "fail_open_local serves config keys: {r}");
    }
    // The local limits still hold.
    let r = open
        .client()
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_error(&r, 429, "rate_limit_exceeded");
    drop(open);

    let closed = Stack::builder()
        .models(&["base"])
        .extra_toml(&format!(
            "{plan}[store]\nredis_url = \"redis://127.0.0.1:1/\"\n[limits]\non_store_failure = \"fail_closed\"\n"
        ))
        .start()
        .unwrap();
    let r = closed
        .client()
        .post_json("/chat/completions", &chat)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{r}");
    assert!(r.header("retry-after").is_some());
}

/// The reply length a chat body asks of the synthetic worker.
fn reply_tokens(body: &Value) -> u64 {
    let text = body["messages"][0]["content"].as_str().unwrap_or_default();
    text.split("synthetic:reply_tokens=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("a synthetic:reply_tokens control")
}
