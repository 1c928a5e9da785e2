//! TLS end to end, with certificates made by the test (`harness::certs`):
//! the public listener over HTTPS and its certificate renewed the way
//! Kubernetes updates a mounted Secret (a symlink swap) while a stream is
//! open; and gateway → worker gRPC over mutual TLS, where a gateway with a
//! client certificate of another CA, or none, is refused by the worker at
//! the handshake. The OpenAI SDK over HTTPS is in
//! tests/conformance/python/test_tls.py.

use harness::certs::{CertFiles, TestCa};
use harness::{
    assert_error, chat_body, gateway_over, json, raw, Gateway, GatewayOpts, Worker, WorkerOpts,
};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// An HTTPS connection trusting only `ca`, and the certificate it was served.
async fn connect(addr: &str, ca: &Path) -> (TlsStream<TcpStream>, Vec<u8>) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(cert.expect("CA PEM")).expect("CA certificate");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("TCP connect");
    let name = ServerName::try_from("localhost").expect("server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("TLS handshake with the gateway");
    let served = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| c.to_vec())
        .expect("a server certificate");
    (tls, served)
}

/// Reads until `needle` has arrived (or `within` passes); all read so far.
async fn read_until(
    tls: &mut TlsStream<TcpStream>,
    seen: &mut Vec<u8>,
    needle: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 16 * 1024];
    while !String::from_utf8_lossy(seen).contains(needle) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, tls.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("reading the stream: {e}"),
        }
    }
}

/// `GET /v1/models` on a fresh connection: the status line and the
/// certificate served.
async fn models_over_new_connection(gateway: &Gateway, ca: &Path) -> (String, Vec<u8>) {
    let (mut tls, served) = connect(gateway.addr(), ca).await;
    tls.write_all(&raw::request(
        "GET",
        "/v1/models",
        Some(gateway.api_key()),
        None,
    ))
    .await
    .expect("send");
    let mut seen = Vec::new();
    read_until(&mut tls, &mut seen, "\r\n", Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    (text.lines().next().unwrap_or("").to_owned(), served)
}

/// Kubernetes' update of a mounted Secret: the files are links through
/// `..data` to a versioned directory, and an update writes a new directory
/// and swaps `..data` to it in one rename.
fn publish(dir: &Path, version: &str, cert: &Path, key: &Path) {
    let versioned = dir.join(version);
    std::fs::create_dir_all(&versioned).expect("version dir");
    std::fs::copy(cert, versioned.join("tls.crt")).expect("copy cert");
    std::fs::copy(key, versioned.join("tls.key")).expect("copy key");
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(version, &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("file link");
        }
    }
}

/// Opens new connections until one is served `want` (the gateway polls
/// its files every 2 s); how long that took.
async fn wait_for_certificate(gateway: &Gateway, ca: &Path, want: &CertFiles) -> Duration {
    let started = Instant::now();
    loop {
        let (status, served) = models_over_new_connection(gateway, ca).await;
        if served == want.der {
            assert_eq!(
                status, "HTTP/1.1 200 OK",
                "a request on the new certificate"
            );
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the new certificate was not served within 15 s\n{}",
            gateway.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn https_listener_renews_its_certificate_without_dropping_an_open_stream() {
    let ca = TestCa::new("edge").expect("CA");
    let names = ["localhost", "127.0.0.1"];
    let first = ca.server("first", &names).expect("cert");
    let second = ca.server("second", &names).expect("cert");
    let third = ca.server("third", &names).expect("cert");
    let secret = ca.dir().join("secret");
    std::fs::create_dir_all(&secret).expect("secret dir");
    publish(&secret, "v1", &first.cert_file, &first.key_file);

    // 20 tokens a second: a 160-token reply streams for about 8 s.
    let worker = Worker::start("base", WorkerOpts::paced(0, 20)).expect("worker");
    let gateway = Gateway::start(GatewayOpts {
        workers: [("base".to_string(), vec![worker.addr().to_string()])].into(),
        tls: Some(CertFiles {
            cert_file: secret.join("tls.crt"),
            key_file: secret.join("tls.key"),
            der: first.der.clone(),
        }),
        ..GatewayOpts::default()
    })
    .expect("gateway with [tls]");
    assert!(gateway.base_url().starts_with("https://"));

    let (mut stream, served) = connect(gateway.addr(), ca.ca_file()).await;
    assert!(served == first.der, "the first certificate is served");
    let mut body = chat_body("base", "synthetic:reply_tokens=160");
    body["stream"] = json!(true);
    body["max_tokens"] = json!(400);
    let body = body.to_string();
    stream
        .write_all(&raw::request(
            "POST",
            "/v1/chat/completions",
            Some(gateway.api_key()),
            Some(&body),
        ))
        .await
        .expect("send");
    let mut received = Vec::new();
    read_until(
        &mut stream,
        &mut received,
        "data: {",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&received).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&received)
    );

    // Renewal: new connections get the new certificate...
    publish(&secret, "v2", &second.cert_file, &second.key_file);
    let took = wait_for_certificate(&gateway, ca.ca_file(), &second).await;
    assert!(took < Duration::from_secs(6), "renewal seen after {took:?}");
    // ...while the stream opened before it is still going...
    read_until(
        &mut stream,
        &mut received,
        "[DONE]",
        Duration::from_millis(200),
    )
    .await;
    assert!(
        !String::from_utf8_lossy(&received).contains("[DONE]"),
        "the stream should outlast the renewal (make the reply longer)"
    );
    // ...and completes on its old session.
    read_until(
        &mut stream,
        &mut received,
        "data: [DONE]",
        Duration::from_secs(30),
    )
    .await;
    let text = String::from_utf8_lossy(&received);
    assert!(
        text.contains("data: [DONE]"),
        "the open stream completes: {text}"
    );
    assert!(text.contains(r#""finish_reason":"stop""#), "{text}");

    // A pair that does not belong together is refused: the old one stays.
    publish(&secret, "v3", &third.cert_file, &second.key_file);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, served) = models_over_new_connection(&gateway, ca.ca_file()).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        served == second.der,
        "a bad pair keeps the previous certificate"
    );
    let log = gateway.log_tail();
    assert!(
        log.contains("were refused") && log.contains("still serving the previous certificate"),
        "the refused pair is logged:\n{log}"
    );
    // The watcher is still at work after a bad pair.
    publish(&secret, "v4", &third.cert_file, &third.key_file);
    wait_for_certificate(&gateway, ca.ca_file(), &third).await;

    // An expired certificate (issue 41) is refused too: every client would
    // refuse it, while the one served is still good.
    let expired = ca.expired_server("expired", &names).expect("cert");
    publish(&secret, "v5", &expired.cert_file, &expired.key_file);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, served) = models_over_new_connection(&gateway, ca.ca_file()).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        served == third.der,
        "an expired pair keeps the previous certificate"
    );
    let log = gateway.log_tail();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("expired")),
        "the expired pair is logged at warn:\n{log}"
    );
}

/// Issue 41: a client that connects and never finishes its TLS handshake
/// is dropped after `[tls] handshake_timeout_seconds` (Pingora's own limit
/// is 60 s), and failed handshakes are not logged as errors.
#[tokio::test]
async fn an_unfinished_handshake_is_dropped_in_time_and_not_logged_as_an_error() {
    let ca = TestCa::new("slow").expect("CA");
    let cert = ca
        .server("edge", &["localhost", "127.0.0.1"])
        .expect("cert");
    let gateway = Gateway::start(GatewayOpts {
        tls: Some(cert),
        extra_toml: "[tls]\nhandshake_timeout_seconds = 1\n".into(),
        ..GatewayOpts::default()
    })
    .expect("gateway with [tls]");
    // Silent: not a byte of a ClientHello.
    let started = Instant::now();
    let mut silent = TcpStream::connect(gateway.addr()).await.expect("connect");
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(
        matches!(ended, Ok(Ok(0)) | Ok(Err(_))),
        "the connection is closed: {ended:?}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "closed after {took:?}");
    // A handshake that fails (not TLS at all).
    let mut junk = TcpStream::connect(gateway.addr()).await.expect("connect");
    junk.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("send");
    let _ = tokio::time::timeout(Duration::from_secs(5), junk.read(&mut buf)).await;
    // The listener still serves a real client.
    let (status, _) = models_over_new_connection(&gateway, ca.ca_file()).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let log = gateway.log_tail();
    assert!(
        !log.lines()
            .any(|l| l.contains("ERROR") && l.contains("handshake")),
        "failed handshakes are not errors:\n{log}"
    );
}

/// `[worker_tls]` naming `ca`, the workers' certificate name, and the
/// gateway's client certificate if any.
fn worker_tls_toml(ca: &TestCa, client: Option<&CertFiles>) -> String {
    let mut toml = format!(
        "[worker_tls]\nca_file = {:?}\nserver_name = \"worker.test\"\n",
        ca.ca_file().display().to_string()
    );
    if let Some(c) = client {
        toml.push_str(&format!(
            "cert_file = {:?}\nkey_file = {:?}\n",
            c.cert_file.display().to_string(),
            c.key_file.display().to_string()
        ));
    }
    toml
}

#[tokio::test]
async fn workers_over_mutual_tls_refuse_a_gateway_without_a_certificate_of_their_ca() {
    let ca = TestCa::new("workers").expect("CA");
    // Named for `server_name`, not the address: as behind dns:// or k8s://.
    let worker_cert = ca.server("worker", &["worker.test"]).expect("cert");
    let gateway_cert = ca.client("gateway", "gateway").expect("cert");
    let other = TestCa::new("other").expect("CA");
    let stranger = other.client("gateway", "gateway").expect("cert");

    let path = |p: &Path| p.display().to_string();
    let worker = Worker::start(
        "base",
        WorkerOpts {
            extra_args: vec![
                "--tls-cert".into(),
                path(&worker_cert.cert_file),
                "--tls-key".into(),
                path(&worker_cert.key_file),
                "--tls-client-ca".into(),
                path(ca.ca_file()),
            ],
            ..WorkerOpts::default()
        },
    )
    .expect("worker with TLS");

    let trusted = gateway_over(&[&worker], &worker_tls_toml(&ca, Some(&gateway_cert)));
    let reply = trusted
        .client()
        .post_json("/chat/completions", &chat_body("base", "hello over mTLS"))
        .await
        .expect("HTTP exchange");
    assert_eq!(reply.status, 200, "{reply}");
    assert!(
        reply.json()["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{reply}"
    );

    for (what, toml) in [
        (
            "another CA's certificate",
            worker_tls_toml(&ca, Some(&stranger)),
        ),
        ("no client certificate", worker_tls_toml(&ca, None)),
        ("plain h2c", String::new()),
    ] {
        let refused = gateway_over(&[&worker], &toml);
        let reply = refused
            .client()
            .post_json("/chat/completions", &chat_body("base", "let me in"))
            .await
            .expect("HTTP exchange");
        // Which retryable error the client gets depends on whether the
        // pool's health check met the refusal before the request did: a 503
        // (no worker left) once it has, a 502 (the worker failed) if the
        // request's own connection was the first refused. Never a 200.
        if reply.status == 502 {
            assert_error(&reply, 502, "upstream_error");
        } else {
            assert_error(&reply, 503, "server_overloaded");
            assert!(
                reply.text().contains("No worker of model 'base'")
                    || reply.text().contains("unreachable"),
                "{what}: {reply}"
            );
        }
    }
    let log = worker.log_tail();
    assert!(
        log.matches("TLS handshake refused").count() >= 3,
        "the worker logs each refused handshake:\n{log}"
    );
    // The trusted gateway still gets through after the refusals.
    let reply = trusted
        .client()
        .post_json("/chat/completions", &chat_body("base", "still here"))
        .await
        .expect("HTTP exchange");
    assert_eq!(reply.status, 200, "{reply}");
}

/// Responses over WebSocket on the HTTPS listener (`wss://`, as a client
/// behind TLS termination-free ingress reaches it): the upgrade over TLS,
/// a whole response, and a clean close.
#[tokio::test]
async fn responses_over_websocket_run_on_the_https_listener() {
    use futures::{SinkExt, StreamExt};
    use harness::websocket::{self, Message};
    let ca = TestCa::new("wss").expect("CA");
    let cert = ca
        .server("edge", &["localhost", "127.0.0.1"])
        .expect("cert");
    let worker = Worker::start("base", WorkerOpts::default()).expect("worker");
    let gateway = Gateway::start(GatewayOpts {
        workers: [("base".to_string(), vec![worker.addr().to_string()])].into(),
        tls: Some(cert),
        ..GatewayOpts::default()
    })
    .expect("gateway with [tls]");
    let (tls, _) = connect(gateway.addr(), ca.ca_file()).await;
    let request = websocket::request(&gateway.base_url(), Some(gateway.api_key()), &[])
        .expect("an upgrade request");
    assert!(
        request.uri().to_string().starts_with("wss://"),
        "{}",
        request.uri()
    );
    let (mut ws, upgraded) = tokio_tungstenite::client_async(request, tls)
        .await
        .expect("the upgrade over TLS");
    assert_eq!(upgraded.status(), 101);
    let create = json!({"type": "response.create", "model": "base",
        "input": "Hello over TLS. synthetic:reply_tokens=5", "store": false});
    ws.send(Message::text(create.to_string()))
        .await
        .expect("send");
    let mut types = Vec::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("events in time")
    {
        let Message::Text(text) = message.expect("a message") else {
            continue;
        };
        let event: harness::Value = serde_json::from_str(text.as_str()).expect("JSON");
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        types.push(kind.clone());
        if kind == "response.completed" {
            assert_eq!(event["response"]["usage"]["output_tokens"], 5, "{event}");
            break;
        }
        assert_ne!(kind, "error", "{event}");
    }
    assert_eq!(types.first().map(String::as_str), Some("response.created"));
    assert_eq!(types.last().map(String::as_str), Some("response.completed"));
    ws.close(None).await.expect("a clean close");
}
