//! A stand-in for the Kubernetes API server (Kubernetes is not part of the
//! product; the gateway's client of it is): answers every request with the
//! current status and EndpointSliceList, and records what it was asked.
//! Tests play the controller with it: pods turning ready, terminating,
//! replaced in a rollout.

use crate::{json, Value, Worker};
use std::sync::{Arc, Mutex};

pub struct FakeKubeApi {
    url: String,
    reply: Arc<Mutex<(u16, String)>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl FakeKubeApi {
    pub async fn start() -> FakeKubeApi {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let reply = Arc::new(Mutex::new((200, String::new())));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (r, q) = (reply.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let (r, q) = (r.clone(), q.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    if let Ok(mut q) = q.lock() {
                        q.push(String::from_utf8_lossy(&head).into_owned());
                    }
                    let (status, body) = r.lock().map(|r| r.clone()).unwrap_or_default();
                    let response = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                });
            }
        });
        FakeKubeApi {
            url,
            reply,
            requests,
        }
    }

    /// The API's base URL (`GATEWAY_K8S_API`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What every request from now on is answered.
    pub fn answer(&self, status: u16, body: &Value) {
        if let Ok(mut r) = self.reply.lock() {
            *r = (status, body.to_string());
        }
    }

    /// Service `worker-base`'s endpoints from now on: `(port, ready)` each.
    pub fn serve_endpoints(&self, endpoints: &[(u16, bool)]) {
        let items: Vec<Value> = endpoints
            .iter()
            .map(|&(port, ready)| endpoint_slice(port, ready))
            .collect();
        self.answer(200, &json!({"kind": "EndpointSliceList", "items": items}));
    }

    /// The heads of the requests received so far.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// One EndpointSlice of Service `worker-base`: `port` as the named port
/// `grpc`, one loopback endpoint that is ready or terminating.
pub fn endpoint_slice(port: u16, ready: bool) -> Value {
    json!({
        "metadata": {"labels": {"kubernetes.io/service-name": "worker-base"}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{
            "addresses": ["127.0.0.1"],
            "conditions": {"ready": ready, "serving": ready, "terminating": !ready}
        }]
    })
}

/// A worker's loopback port.
pub fn port_of(w: &Worker) -> u16 {
    w.addr()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("worker port")
}
