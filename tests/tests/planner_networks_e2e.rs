//! `[planner] allowed_networks` end to end: an agent on a private address
//! (127.0.0.1, as an in-cluster agent would be on 10.x) is refused by the
//! default address policy, and served once its network, or its host name,
//! is allowed, without `allow_private_addresses` opening every private
//! range. Plans are scripted as in `planner_trust_e2e.rs`.

use harness::a2a_agents::{AgentOptions, Behavior, TestAgent};
use harness::planner;
use harness::{bounded, json, Stack, Value};

/// No `allow_private_addresses`: private agents need `allowed_networks`.
fn planner_toml() -> String {
    planner::config("hedge_after_ms = 2000\nmax_discovered = 0\n")
}

fn stack(allowed_networks: &[&str]) -> Stack {
    Stack::builder()
        .models(&["base-mini"])
        .extra_toml(&format!(
            "{}allowed_networks = {}\n",
            planner_toml(),
            json!(allowed_networks)
        ))
        .start()
        .expect("stack starts")
}

/// A user message whose plan is one step on agent `target` (a re-plan:
/// the model alone), answered by echoing the synthesis prompt.
fn scripted(target: &str) -> String {
    let step = json!({"id": "s1", "kind": "agent", "target": target,
                      "instruction": "Look it up.", "depends_on": [], "alternates": []});
    let plan = json!({"summary": "one agent", "steps": [step]});
    let llm = json!({"id": "m", "kind": "llm", "target": "model", "instruction": "Answer.", "depends_on": []});
    let replan = json!({"summary": "the model alone", "steps": [llm]});
    format!("Find it. synthetic:echo synthetic:json_replies={plan} {replan}")
}

async fn ask(stack: &Stack, target: &str, agent_url: &str) -> Value {
    let body = planner::body("base-mini", &scripted(target), &[agent_url.to_owned()]);
    planner::ask(stack, &body).await.json()
}

/// The `tool_thought` entry of `target`.
fn thought(reply: &Value, target: &str) -> Value {
    planner::tool_thought(reply, target)
        .unwrap_or_else(|| panic!("no tool_thought for {target}: {}", reply["tool_thought"]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_agent_is_served_only_when_its_network_or_name_is_allowed() {
    bounded(120, async {
        let agent = TestAgent::start("inhouse", "An in-cluster helper", Behavior::good()).await;
        let by_address = agent.url();
        assert!(by_address.starts_with("http://127.0.0.1:"), "{by_address}");

        // The default policy (and an allow-list of other ranges): refused
        // before any connection; the agent hears nothing.
        for allowed in [
            &[][..],
            &["10.0.0.0/8", "fd00::/8", "*.svc.cluster.local"][..],
        ] {
            let stack = stack(allowed);
            let reply = ask(&stack, "inhouse", &by_address).await;
            let t = thought(&reply, &by_address);
            assert_eq!(t["outcome"], "no_card", "{allowed:?}: {t}");
            assert!(
                t["detail"]
                    .as_str()
                    .unwrap_or("")
                    .contains("127.0.0.1 is a private address"),
                "{t}"
            );
        }
        assert!(
            agent.card_auth().is_empty(),
            "no card fetch reached the agent"
        );
        assert!(agent.methods().is_empty(), "no call reached the agent");

        // Its network allowed: its card is read and its step completes.
        let cidr = stack(&["127.0.0.0/8"]);
        let reply = ask(&cidr, "inhouse", &by_address).await;
        assert_eq!(
            thought(&reply, "inhouse")["outcome"],
            "completed",
            "{}",
            reply["tool_thought"]
        );
        assert!(!agent.methods().is_empty(), "the agent was called");
        drop(cidr);

        // A host name allowed: an agent reached (and carded) as
        // `localhost` is served; the bare address is not, since a name entry
        // opens only what that name resolves to.
        let named = TestAgent::start_with(
            "named",
            "An in-cluster helper known by name",
            Behavior::good(),
            AgentOptions {
                card_host: Some("localhost".into()),
                ..AgentOptions::default()
            },
        )
        .await;
        let by_name = named.url().replace("127.0.0.1", "localhost");
        let stack = stack(&["localhost"]);
        let reply = ask(&stack, "named", &by_name).await;
        assert_eq!(
            thought(&reply, "named")["outcome"],
            "completed",
            "{}",
            reply["tool_thought"]
        );
        assert!(!named.methods().is_empty(), "the named agent was called");
        let reply = ask(&stack, "inhouse", &by_address).await;
        assert_eq!(thought(&reply, &by_address)["outcome"], "no_card");
    })
    .await
}
