//! The gateway on a Redis it reaches only over TLS (`rediss://`): keys and
//! plans made with the operator CLI, limits counted by the limiter's own
//! connection, stored responses and a background run, all through a real
//! `redis-server` that speaks nothing but TLS; and a gateway that does not
//! trust the server's certificate gets nothing from it.

use harness::stack::gateway_cli;
use harness::{bounded, json, start_workers, Gateway, GatewayOpts, RedisServer, WorkerOpts};
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
        let r = client
            .post_json(
                "/responses",
                &json!({"model": "base", "input": "synthetic:reply_tokens=30 go", "background": true}),
            )
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{r}");
        let id = r.json()["id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        let done = loop {
            let r = client.get(&format!("/responses/{id}")).await.unwrap();
            assert_eq!(r.status, 200, "{r}");
            let o = r.json();
            if o["status"] == "completed" {
                break o;
            }
            assert!(Instant::now() < deadline, "not completed: {o}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
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
