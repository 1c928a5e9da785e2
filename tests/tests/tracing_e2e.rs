//! Distributed tracing end to end: the client's W3C `traceparent` reaches
//! the worker (in the gRPC metadata of `Generate`), a request without one
//! still gets a trace id the worker sees, and with an OTLP endpoint the
//! gateway's request span and the worker's generation span arrive at a
//! collector (an in-test OTLP/gRPC `TraceService`) in one trace.

use harness::{chat_body, json, Stack, StackBuilder, Value, WorkerOpts};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use reqwest::Method;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

async fn post(
    stack: &Stack,
    path: &str,
    body: &Value,
    traceparent: Option<&str>,
) -> harness::Reply {
    let client = stack.client();
    let mut rb = client.request(Method::POST, path).json(body);
    if let Some(tp) = traceparent {
        rb = rb.header("traceparent", tp);
    }
    client.send(rb).await.expect("request")
}

async fn last_trace_id(stack: &Stack) -> String {
    stack
        .worker("base")
        .info()
        .await
        .expect("worker info")
        .last_trace_id
}

#[tokio::test]
async fn client_traceparent_reaches_the_worker() {
    let stack = Stack::builder()
        .models(&["base"])
        .worker_opts(WorkerOpts {
            env: vec![("RUST_LOG".into(), "info".into())],
            ..WorkerOpts::default()
        })
        .start()
        .expect("stack starts");
    assert_eq!(last_trace_id(&stack).await, "", "no generation yet");

    let tp = traceparent();
    let reply = post(
        &stack,
        "/chat/completions",
        &chat_body("base", "Say hello."),
        Some(&tp),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(last_trace_id(&stack).await, TRACE_ID);
    // The worker's log line for the generation carries the trace id.
    let expected = format!("trace_id={TRACE_ID}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !stack.worker("base").log_tail().contains(&expected) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker log lacks {expected}:\n{}",
            stack.worker("base").log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Streaming, and the Responses API, carry it too.
    let mut body = chat_body("base", "Say hello.");
    body["stream"] = json!(true);
    let other = "0af7651916cd43dd8448eb211c80319c";
    let tp = format!("00-{other}-b7ad6b7169203331-01");
    let reply = post(&stack, "/chat/completions", &body, Some(&tp)).await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(last_trace_id(&stack).await, other);

    let reply = post(
        &stack,
        "/responses",
        &json!({"model": "base", "input": "Say hello.", "store": false}),
        Some(&traceparent()),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(last_trace_id(&stack).await, TRACE_ID);
}

#[tokio::test]
async fn without_a_valid_traceparent_the_gateway_starts_a_trace() {
    let stack = Stack::builder()
        .models(&["base"])
        .start()
        .expect("stack starts");
    let body = chat_body("base", "Say hello.");
    let mut seen = Vec::new();
    for header in [
        None,
        Some("garbage"),
        Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
    ] {
        let reply = post(&stack, "/chat/completions", &body, header).await;
        assert_eq!(reply.status, 200, "{reply}");
        let id = last_trace_id(&stack).await;
        assert_eq!(id.len(), 32, "{id:?}");
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(id, "0".repeat(32));
        assert!(
            !seen.contains(&id),
            "a new trace per request: {id} in {seen:?}"
        );
        seen.push(id);
    }
}

/// An OTLP/gRPC collector that keeps every span with its `service.name`.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.spans.lock().expect("collector lock");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    kept.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Listens on a free loopback port; returns its `http://` URL.
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind collector");
        let addr = listener.local_addr().expect("collector addr");
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(self.clone()))
            .serve_with_incoming(incoming);
        tokio::spawn(server);
        format!("http://{addr}")
    }

    fn find(&self, service: &str, trace_id: &[u8]) -> Option<Span> {
        let spans = self.spans.lock().expect("collector lock");
        spans
            .iter()
            .find(|(s, span)| s == service && span.trace_id == trace_id)
            .map(|(_, span)| span.clone())
    }

    async fn wait_for(&self, service: &str, trace_id: &[u8]) -> Option<Span> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(span) = self.find(service, trace_id) {
                return Some(span);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn summary(&self) -> String {
        let spans = self.spans.lock().expect("collector lock");
        spans
            .iter()
            .map(|(s, span)| format!("{s}:{}:{}", span.name, hex(&span.trace_id)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn string_attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| match &v.value {
            Some(any_value::Value::StringValue(s)) => Some(s.clone()),
            Some(any_value::Value::IntValue(i)) => Some(i.to_string()),
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_of_gateway_and_worker_reach_an_otlp_collector_in_one_trace() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    // Export batches every 100 ms rather than every 5 s.
    let fast_batches = ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "100".to_string());
    let worker = WorkerOpts {
        extra_args: vec!["--otlp-endpoint".into(), endpoint.clone()],
        env: vec![fast_batches.clone()],
        ..WorkerOpts::default()
    };
    let mut builder: StackBuilder = Stack::builder()
        .models(&["base"])
        .worker_opts(worker)
        .extra_toml(&format!(
            "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"gw-test\""
        ));
    builder = builder.gateway_env(fast_batches);
    let stack = builder.start().expect("stack starts");

    let tp = traceparent();
    let secret = "sk-do-not-export this prompt";
    let reply = post(
        &stack,
        "/chat/completions",
        &chat_body("base", secret),
        Some(&tp),
    )
    .await;
    assert_eq!(reply.status, 200, "{reply}");
    assert_eq!(last_trace_id(&stack).await, TRACE_ID);

    let trace_id = unhex(TRACE_ID);
    let Some(gateway_span) = collector.wait_for("gw-test", &trace_id).await else {
        panic!(
            "no gateway span arrived; got [{}]\n{}",
            collector.summary(),
            stack.logs()
        );
    };
    assert_eq!(gateway_span.name, "chat.completions");
    assert_eq!(
        hex(&gateway_span.parent_span_id),
        PARENT_ID,
        "continues the client's span"
    );
    assert_eq!(
        string_attr(&gateway_span, "http.route").as_deref(),
        Some("chat.completions")
    );
    assert_eq!(
        string_attr(&gateway_span, "gen_ai.request.model").as_deref(),
        Some("base")
    );
    assert_eq!(
        string_attr(&gateway_span, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert!(string_attr(&gateway_span, "request_id").is_some_and(|id| id.starts_with("req_")));

    let Some(worker_span) = collector.wait_for("worker", &trace_id).await else {
        panic!(
            "no worker span arrived; got [{}]\n{}",
            collector.summary(),
            stack.logs()
        );
    };
    assert_eq!(worker_span.name, "generate");
    assert_eq!(
        worker_span.parent_span_id, gateway_span.span_id,
        "the worker's span is a child of the gateway's request span"
    );

    // Neither the prompt nor the key is exported.
    let everything = format!("{:?}", collector.spans.lock().expect("collector lock"));
    assert!(!everything.contains("do-not-export"), "{everything}");
    assert!(
        !everything.contains(stack.gateway.api_key()),
        "{everything}"
    );
}
