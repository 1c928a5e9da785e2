//! Many clients at once: every stream must finish, none may be cut short by
//! another's traffic (issue 6 asks for 10,000 open streams per gateway).

use futures::future::join_all;
use harness::{chat_body, json, Stack, WorkerOpts};

/// 300 paced streams in flight together on one worker connection: each gets
/// all its tokens, its finish and `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_concurrent_paced_streams_all_complete() {
    const STREAMS: usize = 300;
    const TOKENS: u32 = 40;
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts {
            max_concurrency: Some(1024),
            ..WorkerOpts::default()
        })
        .start()
        .unwrap();
    let client = stack.client();
    let mut body = chat_body(
        "base",
        &format!("Go on. synthetic:reply_tokens={TOKENS} synthetic:slow_ms=25"),
    );
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let runs = (0..STREAMS).map(|_| {
        let (client, body) = (client.clone(), body.clone());
        async move {
            let stream = client.stream("/chat/completions", &body).await?;
            anyhow::ensure!(stream.status == 200, "status {}", stream.status);
            let frames = stream.collect().await?;
            let mut tokens = None;
            for f in &frames {
                if f.is_done() {
                    continue;
                }
                let v = f.json();
                anyhow::ensure!(v.get("error").is_none(), "error frame {}", f.data);
                if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                    tokens = Some(n);
                }
            }
            anyhow::ensure!(frames.last().is_some_and(|f| f.is_done()), "no [DONE]");
            anyhow::ensure!(tokens == Some(u64::from(TOKENS)), "usage {tokens:?}");
            Ok(())
        }
    });
    let results: Vec<anyhow::Result<()>> = join_all(runs).await;
    let failures: Vec<String> = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {STREAMS} streams failed, first: {:?}\n{}",
        failures.len(),
        failures.first(),
        stack.gateway.log_tail()
    );
    let c = stack.worker("base").counters().await.unwrap();
    assert_eq!(c.completed, STREAMS as u64, "{c:?}");
}
