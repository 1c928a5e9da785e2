//! The agents' HTTP client: hyper's pooled HTTP/1.1 client over rustls,
//! dialling only what the policy allows, with no redirects; and response
//! bodies read under the idle deadline and the size cap.

use super::policy::{AddressPolicy, PolicyResolver, ResolveFailed};
use super::{NetError, NetLimits};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use std::net::IpAddr;
use std::time::Duration;

type Connector = hyper_rustls::HttpsConnector<HttpConnector<PolicyResolver>>;
type Client = hyper_util::client::legacy::Client<Connector, http_body_util::Full<Bytes>>;

/// The agents' HTTP client.
pub struct AgentHttp {
    client: Client,
    policy: AddressPolicy,
}

/// A response head, with its body still to read.
pub struct Response {
    pub status: u16,
    pub content_type: String,
    pub body: BodyReader,
}

impl AgentHttp {
    /// A client whose every connection passes `policy`, over `tls` (the
    /// host's trusted roots) for https agents.
    pub fn new(
        policy: AddressPolicy,
        tls: rustls::ClientConfig,
        connect_timeout: Duration,
    ) -> Self {
        let mut http = HttpConnector::new_with_resolver(PolicyResolver {
            policy: policy.clone(),
        });
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(8)
                .build(connector);
        Self { client, policy }
    }

    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// Checks a URL before it is called: http(s), and an IP literal host
    /// must pass the policy (names are checked as they resolve).
    pub fn check_url(&self, url: &str) -> Result<http::Uri, NetError> {
        check_url(&self.policy, url)
    }

    /// Sends a request and waits for its head (the first-byte deadline).
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(String, String)],
        body: Option<Vec<u8>>,
        limits: NetLimits,
    ) -> Result<Response, NetError> {
        let uri = self.check_url(url)?;
        let mut request = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            request = request.header(k.as_str(), v.as_str());
        }
        let request = request
            .body(http_body_util::Full::new(Bytes::from(
                body.unwrap_or_default(),
            )))
            .map_err(|e| NetError::BadUrl(e.to_string()))?;
        let response = tokio::time::timeout(limits.first_byte, self.client.request(request))
            .await
            .map_err(|_| NetError::FirstByte)?
            .map_err(|e| connect_error(&e))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        Ok(Response {
            status,
            content_type,
            body: BodyReader {
                body: response.into_body(),
                idle: limits.idle,
                max: limits.max_body,
                read: 0,
            },
        })
    }
}

/// The policy's check of a URL (see [`AgentHttp::check_url`]).
pub fn check_url(policy: &AddressPolicy, url: &str) -> Result<http::Uri, NetError> {
    // The message goes to logs: never the URL's credentials.
    let bad = || NetError::BadUrl(super::redact_url(url));
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(bad()),
    }
    let host = uri.host().ok_or_else(bad)?;
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        policy
            .check(ip)
            .map_err(|why| NetError::Denied(format!("{ip} is {why}")))?;
    }
    Ok(uri)
}

/// The error of a request that got no response: a policy refusal from the
/// resolver, or a connection failure with its reason.
fn connect_error(e: &hyper_util::client::legacy::Error) -> NetError {
    let mut text = e.to_string();
    let mut reason = "other";
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = s.to_string();
        if s.downcast_ref::<rustls::Error>().is_some() {
            reason = "tls";
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            let inner = io.get_ref();
            if inner.is_some_and(|i| i.downcast_ref::<ResolveFailed>().is_some()) {
                reason = "dns";
            } else if inner.is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some()) {
                reason = "tls";
            } else {
                match io.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        return NetError::DeniedResolved(io.to_string())
                    }
                    std::io::ErrorKind::ConnectionRefused => reason = "refused",
                    std::io::ErrorKind::TimedOut => reason = "timeout",
                    std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof => reason = "reset",
                    _ => {}
                }
            }
        }
        source = s.source();
    }
    if reason == "other" && text.to_ascii_lowercase().contains("timed out") {
        reason = "timeout";
    }
    NetError::Connect {
        reason,
        detail: text,
    }
}

/// A response body read under the idle deadline and the size cap.
pub struct BodyReader {
    body: hyper::body::Incoming,
    idle: Duration,
    max: usize,
    read: usize,
}

impl BodyReader {
    /// The next chunk of data; `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, NetError> {
        loop {
            let frame = tokio::time::timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| NetError::Idle)?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(NetError::Broken(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.read += data.len();
                        if self.read > self.max {
                            return Err(NetError::TooLarge(self.max));
                        }
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The whole body.
    pub async fn all(mut self) -> Result<Bytes, NetError> {
        let mut out = BytesMut::new();
        while let Some(chunk) = self.chunk().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out.freeze())
    }
}
