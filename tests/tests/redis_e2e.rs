//! The gateway on a Redis it reaches only over TLS (`rediss://`): keys and
//! plans made with the operator CLI, limits counted by the limiter's own
//! connection, stored responses and a background run, all through a real
//! `redis-server` that speaks nothing but TLS; and a gateway that does not
//! trust the server's certificate gets nothing from it.
//!
//! And the same on a real Redis Cluster of three primaries (private
//! `redis-server --cluster-enabled yes` nodes joined by
//! `redis-cli --cluster create`): the CLI, the shared connection, the
//! limiter's per-node connections and the followers' dedicated ones each
//! find the node serving their keys.

use harness::responses;
use harness::stack::gateway_cli;
use harness::{
    bounded, json, start_workers, Gateway, GatewayOpts, RedisCluster, RedisServer, WorkerOpts,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Test-only TLS material: `cluster-ca.pem` signs `apiserver.pem` (SAN IP
/// 127.0.0.1); `other-ca.pem` signs nothing here.
fn testdata(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gateway/src/pool/testdata")
        .join(file)
}

fn tls_redis() -> RedisServer {
    RedisServer::start_tls(
        &testdata("apiserver.pem"),
        &testdata("apiserver.key"),
        &testdata("cluster-ca.pem"),
    )
    .expect("a TLS redis-server")
}

fn ca_toml(ca: &Path) -> String {
    format!("[store]\nredis_ca_file = {:?}\n", ca.to_string_lossy())
}

/// `gateway <args>` against the TLS server; returns stdout.
#[track_caller]
fn cli(url: &str, args: &[&str]) -> String {
    let ca = testdata("cluster-ca.pem");
    let env = [
        ("GATEWAY_REDIS_URL", url),
        ("GATEWAY_KEY_PREFIX", "tls:"),
        ("GATEWAY_REDIS_CA_FILE", ca.to_str().expect("a UTF-8 path")),
    ];
    gateway_cli(&env, args).trim().to_owned()
}

#[tokio::test]
async fn keys_limits_and_runs_live_on_a_redis_reached_over_tls() {
    bounded(90, async {
        let server = tls_redis();
        let url = format!("rediss://127.0.0.1:{}/", server.port());
        cli(&url, &["plans", "set", "tls", "--rpm", "5", "--tpm", "100000"]);
        let key = cli(&url, &["keys", "create", "--org", "org-tls", "--plan", "tls"]);
        assert!(key.starts_with("sk-"), "{key}");

        let mut opts = GatewayOpts {
            redis: Some((url.clone(), "tls:".into())),
            extra_toml: ca_toml(&testdata("cluster-ca.pem")),
            ..GatewayOpts::default()
        };
        let workers = start_workers("base", &[WorkerOpts::default()]);
        let worker = workers[0].addr().to_string();
        opts.workers.insert("base".into(), vec![worker.clone()]);
        let gateway = Gateway::start(opts).expect("gateway on rediss://");
        let client = gateway.client().with_key(Some(&key));

        // The key is found and the request counted in Redis by the
        // limiter's TLS connection.
        let body = json!({"model": "base", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi synthetic:reply_tokens=3"}]});
        let r = client.post_json("/chat/completions", &body).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("4"), "{r}");
        let r = client.post_json("/chat/completions", &body).await.unwrap();
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("3"), "{r}");

        // A background run is stored, driven and read back over TLS.
        let id = responses::id(&responses::create(&client, &json!({"model": "base", "input": "synthetic:reply_tokens=30 go", "background": true})).await);
        let done =
            responses::wait_for_status(&client, &id, &["completed"], Duration::from_secs(20)).await;
        assert_eq!(done["status"], "completed", "not completed: {done}");
        assert_eq!(done["usage"]["output_tokens"], 30, "{done}");

        // The usage the operator reads back went through the same TLS server.
        let usage = cli(&url, &["usage", "--org", "org-tls", "--json"]);
        let tokens: u64 = usage
            .lines()
            .filter_map(|l| serde_json::from_str::<harness::Value>(l).ok())
            .filter_map(|v| v["output_tokens"].as_u64())
            .sum();
        assert_eq!(tokens, 3 + 3 + 30, "{usage}");

        // A gateway that trusts another CA refuses the server's certificate:
        // it cannot look the key up, so it answers 503, never 200.
        let mut opts = GatewayOpts {
            redis: Some((url.clone(), "tls:".into())),
            extra_toml: ca_toml(&testdata("other-ca.pem")),
            ..GatewayOpts::default()
        };
        opts.workers.insert("base".into(), vec![worker]);
        let untrusting = Gateway::start(opts).expect("gateway");
        let r = untrusting
            .client()
            .with_key(Some(&key))
            .post_json("/chat/completions", &body)
            .await
            .unwrap();
        assert_eq!(r.status, 503, "{r}");
    })
    .await;
}

#[tokio::test]
async fn keys_limits_runs_and_usage_live_on_a_redis_cluster() {
    bounded(120, async {
        let cluster = RedisCluster::start(3).expect("a 3-primary Redis Cluster");
        let urls = cluster.urls();
        let env = [
            ("GATEWAY_REDIS_URL", urls.as_str()),
            ("GATEWAY_KEY_PREFIX", "cl:"),
            ("GATEWAY_REDIS_CLUSTER", "true"),
        ];
        let cli = |args: &[&str]| gateway_cli(&env, args).trim().to_owned();
        cli(&["plans", "set", "cl", "--rpm", "5", "--tpm", "100000"]);
        let key = cli(&["keys", "create", "--org", "org-cl", "--plan", "cl"]);
        assert!(key.starts_with("sk-"), "{key}");
        // A key of another org (other slots, likely another node).
        let other = cli(&["keys", "create", "--org", "org-other", "--plan", "cl"]);
        let revoked = cli(&["keys", "create", "--org", "org-rev", "--plan", "cl"]);
        let listed = cli(&["keys", "list"]);
        assert_eq!(listed.matches("org-cl").count(), 1, "{listed}");
        assert_eq!(listed.matches("org-other").count(), 1, "{listed}");
        let revoked_id = listed
            .lines()
            .find(|l| l.contains("org-rev"))
            .and_then(|l| l.split_whitespace().next())
            .expect("org-rev's key listed")
            .to_owned();

        // Paced, so a background run is still going when it is followed.
        let workers = start_workers("base", &[WorkerOpts::paced(0, 100)]);
        let mut opts = GatewayOpts {
            redis: Some((urls.clone(), "cl:".into())),
            // Keys cached for a minute: a revocation seen sooner came by
            // pub/sub.
            extra_toml: "[store]\nredis_cluster = true\n[limits]\nkey_cache_ttl_ms = 60000\n"
                .into(),
            ..GatewayOpts::default()
        };
        opts.workers
            .insert("base".into(), vec![workers[0].addr().to_string()]);
        let gateway = Gateway::start(opts).expect("gateway on a Redis Cluster");
        let client = gateway.client().with_key(Some(&key));

        // A chat completion, its key looked up and its request counted.
        let chat = json!({"model": "base", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi synthetic:reply_tokens=3"}]});
        let r = client.post_json("/chat/completions", &chat).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("4"), "{r}");
        let mut chats = 1;
        let r = gateway
            .client()
            .with_key(Some(&other))
            .post_json("/chat/completions", &chat)
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");

        // A key revoked with the CLI is refused at once: the invalidation
        // published through the cluster reached the gateway's subscription.
        let rev = gateway.client().with_key(Some(&revoked));
        let r = rev.post_json("/chat/completions", &chat).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        cli(&["keys", "revoke", &revoked_id]);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let r = rev.post_json("/chat/completions", &chat).await.unwrap();
            if r.status == 401 {
                break;
            }
            assert_eq!(r.status, 200, "{r}");
            assert!(Instant::now() < deadline, "the revocation did not arrive");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // A stored response, read back with its input items.
        let r = client
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "synthetic:reply_tokens=5 stored"}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        let stored = r.json()["id"].as_str().unwrap().to_owned();
        let r = client.get(&format!("/responses/{stored}")).await.unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.json()["status"], "completed", "{r}");
        let r = client
            .get(&format!("/responses/{stored}/input_items"))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        assert_eq!(r.json()["data"].as_array().map(Vec::len), Some(1), "{r}");

        // A background run (its lease and its response in different slots),
        // followed live from the start of its event log, then read back.
        let id = responses::id(&responses::create(&client, &json!({"model": "base", "input": "synthetic:reply_tokens=30 go", "background": true})).await);
        let live = client
            .open_stream(client.request(
                reqwest::Method::GET,
                &format!("/responses/{id}?stream=true"),
            ))
            .await
            .unwrap();
        assert_eq!(live.status, 200);
        let frames = live.collect().await.unwrap();
        let names: Vec<&str> = frames.iter().filter_map(|f| f.event.as_deref()).collect();
        assert_eq!(names.first(), Some(&"response.created"), "{names:?}");
        assert_eq!(names.last(), Some(&"response.completed"), "{names:?}");
        assert!(names.contains(&"response.output_text.delta"), "{names:?}");
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.json()["sequence_number"], i as u64, "{f:?}");
        }
        let done = client.get(&format!("/responses/{id}")).await.unwrap().json();
        assert_eq!(done["status"], "completed", "{done}");
        assert_eq!(done["usage"]["output_tokens"], 30, "{done}");

        // The plan's 5 requests a minute hold across the cluster: 429 once
        // they are used.
        let refused = loop {
            let r = client.post_json("/chat/completions", &chat).await.unwrap();
            if r.status != 200 {
                break r;
            }
            chats += 1;
            assert!(chats <= 5, "more than the plan's 5 requests admitted");
        };
        assert_eq!(refused.status, 429, "{refused}");
        assert_eq!(refused.json()["error"]["code"], "rate_limit_exceeded", "{refused}");
        assert_eq!(chats, 3, "5 requests: 3 chats, the stored response, the run");

        // Usage, settled by the limiter on the org's node, read back by the CLI.
        let usage = cli(&["usage", "--org", "org-cl", "--json"]);
        let sum = |field: &str| -> u64 {
            usage
                .lines()
                .filter_map(|l| serde_json::from_str::<harness::Value>(l).ok())
                .filter_map(|v| v[field].as_u64())
                .sum()
        };
        assert_eq!(sum("output_tokens"), 3 * chats + 5 + 30, "{usage}");
        assert_eq!(sum("requests"), chats + 2, "{usage}");

        // The keys really are spread over the cluster.
        let counts = cluster.key_counts().unwrap();
        assert!(
            counts.iter().filter(|n| **n > 0).count() >= 2,
            "keys on several nodes: {counts:?}"
        );
        // And no Redis operation failed on the way.
        let (status, metrics) = gateway.admin_get("/metrics").await.unwrap();
        assert_eq!(status, 200);
        assert!(
            !metrics.lines().any(|l| l.starts_with("gateway_redis_errors_total{")),
            "{metrics}"
        );

        // The whole cluster gone: a stored response cannot be created (503),
        // and the failures are counted by component. (The other org's key:
        // org-cl's refusals are now answered locally, without Redis.)
        drop(cluster);
        let r = gateway
            .client()
            .with_key(Some(&other))
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "synthetic:reply_tokens=2 lost"}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 503, "{r}");
        let (_, metrics) = gateway.admin_get("/metrics").await.unwrap();
        for component in ["limiter", "store"] {
            assert!(
                metrics.lines().any(|l| l
                    .starts_with("gateway_redis_errors_total{")
                    && l.contains(&format!("component=\"{component}\""))),
                "no {component} error counted:\n{metrics}"
            );
        }
    })
    .await;
}
