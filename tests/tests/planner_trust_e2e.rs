//! The planner's agent trust boundary, end to end through the real
//! gateway with loopback agents (`harness::a2a_agents`): a directory
//! entry's secret goes only to the origin the operator configured (or its
//! `allowed_hosts`); the card cache is not shared between a directory
//! entry and a request naming the same URL; and a tenant sees "agent
//! unreachable", never the network's error, for an agent it cannot reach.
//! Plans are scripted as in `planner_e2e.rs`.

use harness::a2a_agents::{AgentOptions, Behavior, TestAgent};
use harness::planner::{self, outcome_of, tool_thought};
use harness::{bounded, json, Reply, Stack, Value};

/// Loopback agents allowed; no discovery, so each request uses exactly
/// the agents it names.
fn planner_toml() -> String {
    planner::config("allow_private_addresses = true\nhedge_after_ms = 2000\nmax_discovered = 0\n")
}

const SECRET_ENV: &str = "IGW_TRUST_AGENT_TOKEN";
const SECRET: &str = "Bearer trust-s3cret";

/// A `[[planner.agents]]` entry with the auth header from [`SECRET_ENV`].
fn entry(id: &str, url: &str, allowed_hosts: &[String]) -> String {
    format!(
        "\n[[planner.agents]]\nid = \"{id}\"\nurl = \"{url}\"\nauth_header = \"authorization\"\nauth_secret_env = \"{SECRET_ENV}\"\nallowed_hosts = {}\n",
        json!(allowed_hosts)
    )
}

fn stack(entries: &[String]) -> Stack {
    Stack::builder()
        .models(&["base-mini"])
        .extra_toml(&format!("{}{}", planner_toml(), entries.concat()))
        .gateway_env((SECRET_ENV.into(), SECRET.into()))
        .start()
        .expect("stack starts")
}

/// The first (and only) step of a scripted plan, asking `target`.
fn agent_step(target: &str) -> Value {
    json!({"id": 1, "kind": "agent", "target": target, "instruction": "Do part one.",
           "depends_on": [], "alternates": []})
}

fn llm_step() -> Value {
    json!({"id": 1, "kind": "llm", "target": "model", "instruction": "Summarise.", "depends_on": []})
}

/// A user message whose plan call gets a plan of `steps` (a re-plan: one
/// `llm` step) and whose answer echoes the synthesis prompt.
fn scripted(ask: &str, steps: Vec<Value>) -> String {
    let plan = json!({"thought": "a scripted plan", "steps": steps});
    let replan = json!({"thought": "the model alone", "steps": [llm_step()]});
    format!("{ask} synthetic:echo synthetic:json_replies={plan} {replan}")
}

async fn ask(stack: &Stack, text: &str, agents: &[String]) -> Reply {
    planner::ask(stack, &planner::body("base-mini", text, agents)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_secret_goes_only_to_its_configured_origin_or_allowed_hosts() {
    bounded(90, async {
        // `front`'s card sends the planner to `elsewhere`, another port.
        let elsewhere = TestAgent::start("elsewhere", "Collects secrets", Behavior::good()).await;
        let front = TestAgent::start_with(
            "front",
            "Front desk",
            Behavior::good(),
            AgentOptions {
                card_endpoint: Some(format!("{}/rpc", elsewhere.url())),
                ..AgentOptions::default()
            },
        )
        .await;
        // `listed` does the same, but its entry allows the other host.
        let backend = TestAgent::start("backend", "The real worker", Behavior::good()).await;
        let listed = TestAgent::start_with(
            "listed",
            "Front desk with a backend",
            Behavior::good(),
            AgentOptions {
                card_endpoint: Some(format!("{}/rpc", backend.url())),
                ..AgentOptions::default()
            },
        )
        .await;
        let backend_host = backend.url().trim_start_matches("http://").to_owned();
        let stack = stack(&[
            entry("front", &front.url(), &[]),
            entry("listed", &listed.url(), &[backend_host]),
        ]);

        let reply = ask(
            &stack,
            // Were `front` usable, this step would carry the secret to
            // `elsewhere`; unusable, the plan is repaired to the model.
            &scripted("Help me.", vec![agent_step("front")]),
            &["front".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "front"),
            "denied",
            "{}",
            reply["tool_thought"]
        );
        let detail = tool_thought(&reply, "front").unwrap()["detail"].to_string();
        assert!(!detail.contains(&elsewhere.url()), "{detail}");
        // The other server was never called, so never saw the secret.
        assert!(elsewhere.methods().is_empty(), "{:?}", elsewhere.methods());
        assert!(elsewhere.auth().is_empty());
        assert!(elsewhere.card_auth().is_empty());
        // The configured origin did get it, for the card.
        assert_eq!(front.card_auth(), vec![Some(SECRET.to_owned())]);
        assert!(
            !reply.to_string().contains("trust-s3cret"),
            "the secret never reaches the caller"
        );

        // An allowed host is called, with the secret.
        let reply = ask(
            &stack,
            &scripted("Help me.", vec![agent_step("listed")]),
            &["listed".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "listed"),
            "completed",
            "{}",
            reply["tool_thought"]
        );
        assert_eq!(backend.auth(), vec![SECRET.to_owned()]);
        assert!(listed.methods().is_empty());
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_directory_url_neither_poisons_nor_reads_its_cached_card() {
    bounded(90, async {
        let protected = || AgentOptions {
            require_auth: Some(SECRET.to_owned()),
            ..AgentOptions::default()
        };
        let vault =
            TestAgent::start_with("vault", "Protected records", Behavior::good(), protected())
                .await;
        let ledger =
            TestAgent::start_with("ledger", "Protected ledger", Behavior::good(), protected())
                .await;
        let stack = stack(&[
            entry("vault", &vault.url(), &[]),
            entry("ledger", &ledger.url(), &[]),
        ]);

        // A tenant names the vault's URL first: its anonymous fetch fails...
        let reply = ask(
            &stack,
            &scripted("Open it.", vec![llm_step()]),
            &[vault.url()],
        )
        .await
        .json();
        assert_eq!(outcome_of(&reply, &vault.url()), "no_card");
        let detail = tool_thought(&reply, &vault.url()).unwrap()["detail"].to_string();
        assert!(detail.contains("401"), "{detail}");
        // ...and the directory entry is not disabled by it.
        let reply = ask(
            &stack,
            &scripted("Open it.", vec![agent_step("vault")]),
            &["vault".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "vault"),
            "completed",
            "{}",
            reply["tool_thought"]
        );
        assert_eq!(vault.auth(), vec![SECRET.to_owned()]);

        // The other order: the entry's card is cached (fetched with the
        // secret); a tenant naming the URL is not served it.
        let reply = ask(
            &stack,
            &scripted("Read it.", vec![agent_step("ledger")]),
            &["ledger".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "ledger"),
            "completed",
            "{}",
            reply["tool_thought"]
        );
        let reply = ask(
            &stack,
            &scripted("Read it.", vec![llm_step()]),
            &[ledger.url()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, &ledger.url()),
            "no_card",
            "{}",
            reply["tool_thought"]
        );
        assert!(
            !reply["thought"].to_string().contains("Agents: "),
            "{}",
            reply["thought"]
        );
        // It got an anonymous fetch of its own.
        assert_eq!(
            ledger.card_auth().last(),
            Some(&None),
            "{:?}",
            ledger.card_auth()
        );
        assert_eq!(ledger.auth(), vec![SECRET.to_owned()]);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agent_says_only_agent_unreachable() {
    bounded(90, async {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let closed_url = format!("http://127.0.0.1:{closed}");
        // A directory agent whose card is served, but whose endpoint (an
        // allowed host) is the closed port.
        let door = TestAgent::start_with(
            "door",
            "A card without a server",
            Behavior::good(),
            AgentOptions {
                card_endpoint: Some(format!("{closed_url}/rpc")),
                ..AgentOptions::default()
            },
        )
        .await;
        let stack = stack(&[entry("door", &door.url(), &["127.0.0.1".to_owned()])]);

        let reply = ask(
            &stack,
            &scripted("Knock.", vec![agent_step("door")]),
            &[closed_url.clone(), "door".into()],
        )
        .await
        .json();
        // The request's URL: no card, and no word of why beyond that.
        let card = tool_thought(&reply, &closed_url).expect("the closed URL's entry");
        assert_eq!(card["outcome"], "no_card", "{card}");
        assert_eq!(card["detail"], "agent unreachable", "{card}");
        // The directory agent's call.
        let call = tool_thought(&reply, "door").expect("the door's entry");
        assert_eq!(call["outcome"], "unreachable", "{call}");
        assert_eq!(call["detail"], "agent unreachable", "{call}");
        // Nowhere in the reply (thoughts, the echoed synthesis prompt) is
        // the operating system's error.
        let text = reply.to_string().to_ascii_lowercase();
        for leak in ["os error", "connection refused", "tcp connect", "could not connect"] {
            assert!(!text.contains(leak), "{leak} in {text}");
        }
        // The operator keeps the detail: logs and a metrics reason.
        let (_, metrics) = stack.gateway.admin_get("/metrics").await.unwrap();
        assert!(
            metrics.contains(
                "gateway_planner_agent_duration_seconds_count{outcome=\"unreachable\",reason=\"refused\"}"
            ),
            "{metrics}"
        );
        let logs = stack.logs();
        assert!(
            logs.contains("agent call failed") && logs.to_ascii_lowercase().contains("refused"),
            "{logs}"
        );
        assert!(!logs.contains("trust-s3cret"), "the secret is never logged");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_are_managed_with_the_cli() {
    bounded(90, async {
        let backend = TestAgent::start("backend", "The real worker", Behavior::good()).await;
        let relay = TestAgent::start_with(
            "relay",
            "Front desk with a backend",
            Behavior::good(),
            AgentOptions {
                card_endpoint: Some(format!("{}/rpc", backend.url())),
                ..AgentOptions::default()
            },
        )
        .await;
        let stack = Stack::builder()
            .models(&["base-mini"])
            .redis()
            .extra_toml(&planner_toml())
            .gateway_env((SECRET_ENV.into(), SECRET.into()))
            .start()
            .expect("stack");
        let backend_host = backend.url().trim_start_matches("http://").to_owned();
        let auth = [
            "--auth-header",
            "authorization",
            "--auth-secret-env",
            SECRET_ENV,
        ];
        let relay_url = relay.url();
        let mut add = vec!["agents", "add", "relay", relay_url.as_str()];
        add.extend(auth);
        add.extend(["--allowed-host", backend_host.as_str()]);
        stack.cli(&add);
        let mut strict = vec!["agents", "add", "strict", relay_url.as_str()];
        strict.extend(auth);
        stack.cli(&strict);
        let listed = stack.cli(&["agents", "list"]);
        assert!(listed.contains(&format!("also {backend_host}")), "{listed}");
        assert!(listed.contains("own origin only"), "{listed}");
        // The probe says which entry the planner would not call.
        let probe = stack.cli(&["agents", "probe", "strict", "--allow-private"]);
        assert!(probe.contains("refused:"), "{probe}");
        let probe = stack.cli(&["agents", "probe", "relay", "--allow-private"]);
        assert!(!probe.contains("refused:"), "{probe}");

        let reply = ask(
            &stack,
            &scripted("Help me.", vec![agent_step("strict")]),
            &["strict".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "strict"),
            "denied",
            "{}",
            reply["tool_thought"]
        );
        assert!(backend.methods().is_empty());
        let reply = ask(
            &stack,
            &scripted("Help me.", vec![agent_step("relay")]),
            &["relay".into()],
        )
        .await
        .json();
        assert_eq!(
            outcome_of(&reply, "relay"),
            "completed",
            "{}",
            reply["tool_thought"]
        );
        assert_eq!(backend.auth(), vec![SECRET.to_owned()]);
    })
    .await
}
