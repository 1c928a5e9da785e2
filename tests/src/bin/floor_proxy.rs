//! The floor under the gateway's CPU per non-streaming request: the least a
//! Pingora HTTP/1 front with a tonic client must do per request, measured on
//! the same machine and workload (`loadgen --floor`).
//!
//! Per request it reads the HTTP request and its JSON body, takes the
//! messages' text, makes the worker's `Generate` call (merged events, as the
//! gateway asks for non-streaming replies), collects the text and writes a
//! minimal chat completion. No keys, limits, validation, metrics, tracing,
//! retries or health: not a product, only a yardstick. Whatever the real
//! gateway costs above it is the price of its features.

use anyhow::{Context, Result};
use async_trait::async_trait;
use clap::Parser;
use inference_proto::v1 as pb;
use pingora_core::apps::{HttpPersistentSettings, HttpServerApp, ReusedHttpStream};
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::listening::Service;
use pingora_http::ResponseHeader;
use std::sync::{Arc, OnceLock};
use tonic::transport::{Channel, Endpoint};

#[derive(Parser)]
struct Args {
    /// Address to listen on.
    #[arg(long)]
    listen: String,
    /// The worker's gRPC URL.
    #[arg(long)]
    worker: String,
    /// Threads of the listener (as the gateway's `threads`).
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

struct FloorApp {
    endpoint: Endpoint,
    /// Created by the first request, so its tasks run on the listener's
    /// runtime (as the gateway's generation channel).
    channel: OnceLock<Channel>,
}

#[async_trait]
impl HttpServerApp for FloorApp {
    async fn process_new_http(
        self: &Arc<Self>,
        mut session: ServerSession,
        _shutdown: &ShutdownWatch,
    ) -> Option<ReusedHttpStream> {
        if !matches!(session.read_request().await, Ok(true)) {
            return None;
        }
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = session.read_request_body().await {
            body.extend_from_slice(&chunk);
        }
        let (status, reply) = match self.complete(&body).await {
            Ok(reply) => (200, reply),
            Err(e) => (
                502,
                serde_json::json!({"error": {"message": e.to_string()}}),
            ),
        };
        let reply = serde_json::to_vec(&reply).ok()?;
        let mut head = ResponseHeader::build(status, Some(2)).ok()?;
        head.insert_header("content-type", "application/json")
            .ok()?;
        head.insert_header("content-length", reply.len()).ok()?;
        session.write_response_header(Box::new(head)).await.ok()?;
        session.write_response_body(reply.into(), true).await.ok()?;
        let settings = HttpPersistentSettings::for_session(&session);
        match session.finish().await {
            Ok(Some(stream)) => Some(ReusedHttpStream::from_reusable_stream(stream, settings)),
            _ => None,
        }
    }
}

impl FloorApp {
    async fn complete(&self, body: &[u8]) -> Result<serde_json::Value> {
        let request: serde_json::Value = serde_json::from_slice(body)?;
        let model = request["model"].as_str().context("model")?.to_owned();
        let messages = request["messages"]
            .as_array()
            .context("messages")?
            .iter()
            .map(|m| pb::Message {
                role: m["role"].as_str().unwrap_or("user").to_owned(),
                content: vec![pb::ContentPart {
                    part: Some(pb::content_part::Part::Text(
                        m["content"].as_str().unwrap_or_default().to_owned(),
                    )),
                }],
                ..Default::default()
            })
            .collect();
        let call = pb::GenerateRequest {
            request_id: "floor".into(),
            model: model.clone(),
            messages,
            sampling: Some(pb::Sampling::default()),
            batch_events: true,
            ..Default::default()
        };
        let channel = self
            .channel
            .get_or_init(|| self.endpoint.clone().connect_lazy())
            .clone();
        let mut events = pb::worker_client::WorkerClient::new(channel)
            .generate(call)
            .await?
            .into_inner();
        let mut text = String::new();
        let mut usage = pb::Usage::default();
        while let Some(event) = events.message().await? {
            match event.event {
                Some(pb::generate_event::Event::Text(t)) => text.push_str(&t.text),
                Some(pb::generate_event::Event::Finished(f)) => usage = f.usage.unwrap_or_default(),
                _ => {}
            }
        }
        Ok(serde_json::json!({
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
        }))
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let conf = ServerConf {
        threads: args.threads,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let app = FloorApp {
        endpoint: Endpoint::from_shared(args.worker.clone())?.tcp_nodelay(true),
        channel: OnceLock::new(),
    };
    let mut service = Service::new("floor".into(), app);
    service.add_tcp(&args.listen);
    server.add_service(service);
    let listen = args.listen.clone();
    std::thread::spawn(move || {
        for _ in 0..500 {
            if std::net::TcpStream::connect(&listen).is_ok() {
                println!("floor listening on {listen}");
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    });
    server.run_forever()
}
