//! `helm upgrade` of a model pool under steady streaming load, played
//! against the real binaries. The gateway finds the pool the way the chart
//! configures it (`k8s://`, the Service's EndpointSlices, from a stand-in
//! Kubernetes API), and the test plays the Deployment controller and the
//! kubelet with the chart's worker rollout settings: one surge pod at a
//! time (maxSurge 1, maxUnavailable 0); the old pod marked terminating,
//! then a preStop sleep longer than the gateway's endpoint poll, then
//! SIGTERM with a grace period much shorter than the replies in flight.
//! Clients stream all the while: every reply ends whole (`[DONE]`, one
//! finish reason, every token the model was asked for), none sees an
//! error, and the generations the grace period cut moved to a new pod.

use harness::chat;
use harness::kube_api::{port_of, FakeKubeApi};
use harness::prometheus::sample;
use harness::{bounded, json, random_hex, start_workers, Client, SseFrame, Worker, WorkerOpts};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Replies of 400 tokens at 50 tokens a second: 8 s each, far longer than
/// the 1 s grace period.
const REPLY_TOKENS: u64 = 400;
const PACE: u64 = 50;
const GRACE_SECONDS: u64 = 1;
/// Longer than the gateway's 5 s endpoint poll, as the chart's 10 s is: the
/// gateway stops routing to a terminating pod before it is signalled.
const PRE_STOP: Duration = Duration::from_secs(6);
const CLIENTS: usize = 8;

fn worker_opts() -> WorkerOpts {
    WorkerOpts {
        grace_period_seconds: Some(GRACE_SECONDS),
        ..WorkerOpts::paced(0, PACE)
    }
}

/// What one streamed reply came to: `Ok` when whole, else what was wrong.
async fn one_stream(client: &Client, n: usize) -> Result<(), String> {
    let body = json!({
        "model": "base",
        "messages": [{"role": "user", "content": format!("Story {n}. synthetic:reply_tokens={REPLY_TOKENS}")}],
        "seed": n,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let stream = client
        .stream("/chat/completions", &body)
        .await
        .map_err(|e| format!("transport: {e}"))?;
    if stream.status != 200 {
        return Err(format!("status {}", stream.status));
    }
    let frames: Vec<SseFrame> = stream.collect().await.map_err(|e| format!("read: {e}"))?;
    if let Some(error) = frames
        .iter()
        .find(|f| !f.is_done() && f.json().get("error").is_some())
    {
        return Err(format!("error frame: {}", error.data));
    }
    if !frames.last().is_some_and(SseFrame::is_done) {
        return Err("no [DONE]".into());
    }
    let chunks = chat::chunks(&frames);
    let finish: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    let usage = &chunks
        .last()
        .map(|c| c["usage"].clone())
        .unwrap_or_default();
    if finish != ["stop"] || usage["completion_tokens"] != REPLY_TOKENS {
        return Err(format!("not whole: finish {finish:?}, usage {usage}"));
    }
    Ok(())
}

/// The Deployment controller's view: the pods behind the Service, each
/// ready or terminating, published to the stand-in API on every change.
struct Pods {
    api: FakeKubeApi,
    endpoints: Vec<(u16, bool)>,
}

impl Pods {
    fn publish(&self) {
        self.api.serve_endpoints(&self.endpoints);
    }

    fn set(&mut self, port: u16, ready: Option<bool>) {
        self.endpoints.retain(|(p, _)| *p != port);
        if let Some(ready) = ready {
            self.endpoints.push((port, ready));
        }
        self.publish();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_under_streaming_load_cuts_no_reply() {
    bounded(150, async {
        let old = start_workers("base", &[worker_opts(), worker_opts()]);
        let mut pods = Pods {
            api: FakeKubeApi::start().await,
            endpoints: old.iter().map(|w| (port_of(w), true)).collect(),
        };
        pods.publish();
        let token_file = std::env::temp_dir().join(format!("igw-k8s-token-{}", random_hex(8)));
        std::fs::write(&token_file, "token\n").expect("token file");
        let mut opts = harness::GatewayOpts {
            extra_toml: "[models.base]\npolicy = \"least_loaded\"\n".into(),
            ..harness::GatewayOpts::default()
        };
        opts.workers.insert(
            "base".into(),
            vec!["k8s://inference/worker-base:grpc".into()],
        );
        opts.env = vec![
            ("GATEWAY_K8S_API".into(), pods.api.url().to_owned()),
            (
                "GATEWAY_K8S_TOKEN_FILE".into(),
                token_file.display().to_string(),
            ),
        ];
        let gateway = harness::Gateway::start(opts).expect("gateway starts");

        // Steady load: each client streams story after story until the
        // rollout is over, and one more.
        let rolled = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (client, rolled) = (gateway.client(), rolled.clone());
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    let mut n = c;
                    loop {
                        let last_round = rolled.load(Ordering::SeqCst);
                        outcomes.push(one_stream(&client, n).await);
                        n += CLIENTS;
                        if last_round {
                            return outcomes;
                        }
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;

        // The rollout, one pod at a time.
        let started = Instant::now();
        let mut new: Vec<Worker> = Vec::new();
        for mut pod in old {
            let surge = Worker::start("base", worker_opts()).expect("the new pod starts");
            pods.set(port_of(&surge), Some(true));
            new.push(surge);
            pods.set(port_of(&pod), Some(false));
            tokio::time::sleep(PRE_STOP).await;
            pod.signal(libc::SIGTERM);
            let exit = tokio::task::spawn_blocking(move || {
                pod.wait_exit(Duration::from_secs(GRACE_SECONDS + 10))
            })
            .await
            .expect("join");
            assert!(
                exit.is_some_and(|s| s.success()),
                "the old pod drains and exits: {exit:?}"
            );
            pods.endpoints.retain(|(_, ready)| *ready);
            pods.publish();
        }
        println!("rollout took {:.1} s", started.elapsed().as_secs_f64());
        rolled.store(true, Ordering::SeqCst);

        let mut streams = 0;
        let mut failures = Vec::new();
        for c in clients {
            for outcome in c.await.expect("client task") {
                streams += 1;
                if let Err(e) = outcome {
                    failures.push(e);
                }
            }
        }
        assert!(streams >= 3 * CLIENTS, "steady load ({streams} streams)");
        assert!(
            failures.is_empty(),
            "{} of {streams} streams cut: {failures:?}",
            failures.len()
        );

        let (_, page) = gateway.admin_get("/metrics").await.expect("metrics");
        let moved = sample(
            &page,
            "gateway_generation_moves_total",
            &["model=\"base\"", "reason=\"draining\"", "outcome=\"moved\""],
        );
        assert!(
            moved >= 1.0,
            "the cut generations moved to a new pod ({moved})"
        );
        for w in &new {
            let served = w.counters().await.expect("counters").completed;
            assert!(served > 0, "each new pod serves");
        }
        let _ = std::fs::remove_file(&token_file);
    })
    .await;
}
