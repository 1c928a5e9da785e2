//! Worker discovery from the Kubernetes API: the ready endpoints of a
//! Service, read from its EndpointSlices (`discovery.k8s.io/v1`).
//!
//! Unlike a headless Service's DNS, the API also says which pods are not
//! ready or are terminating, so a pod leaves the pool as soon as its
//! readiness probe fails or its deletion starts, before it stops answering.
//!
//! Access is the pod's own service account, as every in-cluster client does
//! it: `KUBERNETES_SERVICE_HOST`/`_PORT`, the token and CA mounted under
//! `/var/run/secrets/kubernetes.io/serviceaccount/`. The token file is
//! re-read on every poll (projected tokens rotate). `GATEWAY_K8S_API`,
//! `GATEWAY_K8S_TOKEN_FILE` and `GATEWAY_K8S_CA_FILE` override these, for a
//! gateway outside the cluster (`kubectl proxy`) or a test.

use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// One poll's bound: a stuck API server must not hold discovery up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// `k8s://[namespace/]service:port`: the ready endpoints of a Service.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceRef {
    /// `None`: the gateway's own namespace.
    pub namespace: Option<String>,
    pub service: String,
    pub port: PortRef,
}

/// Which port of the endpoints to call.
#[derive(Debug, Clone, PartialEq)]
pub enum PortRef {
    /// A port number, used with every ready address as it is.
    Number(u16),
    /// A named Service port (`grpc`), looked up in each slice.
    Name(String),
}

impl ServiceRef {
    /// Parses what follows `k8s://`.
    pub fn parse(spec: &str) -> anyhow::Result<ServiceRef> {
        let spec = spec.trim_end_matches('/');
        let (path, port) = spec
            .rsplit_once(':')
            .with_context(|| format!("k8s://{spec}: expected k8s://[namespace/]service:port"))?;
        let (namespace, service) = match path.split_once('/') {
            Some((ns, svc)) => (Some(ns.to_owned()), svc),
            None => (None, path),
        };
        let valid = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !valid(service) || !namespace.as_deref().is_none_or(valid) || !valid(port) {
            bail!("k8s://{spec}: namespace, service and port must be DNS labels or a port number");
        }
        let port = if port.bytes().all(|b| b.is_ascii_digit()) {
            match port.parse::<u16>() {
                Ok(n) if n > 0 => PortRef::Number(n),
                _ => bail!("k8s://{spec}: port {port} is out of range"),
            }
        } else {
            PortRef::Name(port.to_owned())
        };
        Ok(ServiceRef {
            namespace,
            service: service.to_owned(),
            port,
        })
    }
}

/// Discovery's HTTP client: HTTP/1 over TLS (or plain http for an override).
type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<bytes::Bytes>,
>;

/// Largest EndpointSliceList read (a Service of thousands of pods is a few
/// hundred KiB).
const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;

/// A client of the Kubernetes API for discovery.
pub struct KubeApi {
    client: HttpClient,
    /// `https://host:port` (or any base URL given by `GATEWAY_K8S_API`).
    base: String,
    token_file: Option<PathBuf>,
    /// The namespace of `k8s://service:port` targets.
    own_namespace: String,
}

impl KubeApi {
    /// The API as the environment describes it; an error when there is
    /// none (not in a cluster, no override), since a `k8s://` target
    /// cannot work then.
    pub fn from_env() -> anyhow::Result<Arc<KubeApi>> {
        Self::from_lookup(|k| std::env::var(k).ok(), |p| std::fs::read(p).ok())
    }

    fn from_lookup(
        env: impl Fn(&str) -> Option<String>,
        read: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> anyhow::Result<Arc<KubeApi>> {
        let base = match env("GATEWAY_K8S_API") {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => match (env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT")) {
                (Some(host), Some(port)) if host.contains(':') => format!("https://[{host}]:{port}"),
                (Some(host), Some(port)) => format!("https://{host}:{port}"),
                _ => bail!(
                    "k8s:// workers need the Kubernetes API: run in a pod (KUBERNETES_SERVICE_HOST) or set GATEWAY_K8S_API"
                ),
            },
        };
        let token_file = env("GATEWAY_K8S_TOKEN_FILE")
            .or_else(|| Some(format!("{SERVICE_ACCOUNT_DIR}/token")))
            .filter(|p| !p.is_empty())
            .map(PathBuf::from);
        let own_namespace = read(&format!("{SERVICE_ACCOUNT_DIR}/namespace"))
            .and_then(|b| String::from_utf8(b).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let ca = if base.starts_with("https://") {
            let ca_file = env("GATEWAY_K8S_CA_FILE")
                .unwrap_or_else(|| format!("{SERVICE_ACCOUNT_DIR}/ca.crt"));
            Some(read(&ca_file).with_context(|| format!("reading the cluster CA {ca_file}"))?)
        } else {
            None
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(ca.as_deref())?)
            .https_or_http()
            .enable_http1()
            .build();
        // Discovery polls every few seconds: a fresh connection each time
        // costs nothing that matters, and no idle connection outlives the
        // runtime that opened it (the first poll runs before the server's).
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build(connector);
        Ok(Arc::new(KubeApi {
            client,
            base,
            token_file,
            own_namespace,
        }))
    }

    /// The `ip:port` of every ready endpoint of `service`, sorted.
    pub async fn ready_addresses(&self, service: &ServiceRef) -> anyhow::Result<Vec<String>> {
        let namespace = service.namespace.as_deref().unwrap_or(&self.own_namespace);
        let url = format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{}",
            self.base, service.service
        );
        let mut request = http::Request::get(&url).header(http::header::ACCEPT, "application/json");
        if let Some(path) = &self.token_file {
            // A missing token file is normal outside a pod (`kubectl proxy`).
            if let Ok(token) = std::fs::read_to_string(path) {
                request = request.header(
                    http::header::AUTHORIZATION,
                    format!("Bearer {}", token.trim()),
                );
            }
        }
        let request = request
            .body(http_body_util::Empty::new())
            .context("Kubernetes API request")?;
        let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, async {
            use http_body_util::BodyExt;
            let response = self.client.request(request).await?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_LIST_BYTES)
                .collect()
                .await
                .map_err(|e| anyhow::anyhow!("reading the reply: {e}"))?
                .to_bytes();
            anyhow::Ok((status, body))
        })
        .await
        .map_err(|_| anyhow::anyhow!("the Kubernetes API did not answer in {REQUEST_TIMEOUT:?}"))?
        .with_context(|| format!("Kubernetes API request to {}", self.base))?;
        if !status.is_success() {
            bail!(
                "Kubernetes API answered {status} for the EndpointSlices of {namespace}/{}",
                service.service
            );
        }
        let list: wire::EndpointSliceList =
            serde_json::from_slice(&body).context("Kubernetes API: EndpointSliceList")?;
        Ok(ready_addresses(&list, &service.port))
    }
}

/// TLS trusting only the cluster's CA (`None`: trusts nothing, for a plain
/// http API).
fn tls_config(ca_pem: Option<&[u8]>) -> anyhow::Result<rustls::ClientConfig> {
    let roots = match ca_pem {
        Some(pem) => crate::tls::roots_from_pem(pem, "the cluster CA")?,
        None => rustls::RootCertStore::empty(),
    };
    crate::tls::client_config(roots)
}

/// The addresses of the endpoints that may take traffic. An endpoint whose
/// `ready` condition is absent counts as ready (the API's rule); one that
/// is terminating is never ready.
fn ready_addresses(list: &wire::EndpointSliceList, port: &PortRef) -> Vec<String> {
    let mut out = Vec::new();
    for slice in &list.items {
        let number = match port {
            PortRef::Number(n) => *n,
            PortRef::Name(name) => match slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
            {
                Some(n) => n,
                None => continue,
            },
        };
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                if slice.address_type == "IPv6" {
                    out.push(format!("[{address}]:{number}"));
                } else {
                    out.push(format!("{address}:{number}"));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The parts of `discovery.k8s.io/v1` that discovery reads.
mod wire {
    use super::Deserialize;

    #[derive(Deserialize)]
    pub struct EndpointSliceList {
        #[serde(default)]
        pub items: Vec<EndpointSlice>,
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct EndpointSlice {
        #[serde(default)]
        pub address_type: String,
        pub endpoints: Option<Vec<Endpoint>>,
        pub ports: Option<Vec<EndpointPort>>,
    }

    #[derive(Deserialize)]
    pub struct Endpoint {
        #[serde(default)]
        pub addresses: Vec<String>,
        pub conditions: Option<Conditions>,
    }

    #[derive(Deserialize)]
    pub struct Conditions {
        pub ready: Option<bool>,
    }

    #[derive(Deserialize)]
    pub struct EndpointPort {
        pub name: Option<String>,
        pub port: Option<i32>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_service_references() {
        assert_eq!(
            ServiceRef::parse("inference/worker-base:grpc").unwrap(),
            ServiceRef {
                namespace: Some("inference".into()),
                service: "worker-base".into(),
                port: PortRef::Name("grpc".into()),
            }
        );
        assert_eq!(
            ServiceRef::parse("worker-base:50051").unwrap(),
            ServiceRef {
                namespace: None,
                service: "worker-base".into(),
                port: PortRef::Number(50051),
            }
        );
        for bad in [
            "worker-base",
            "Worker:grpc",
            "ns/:grpc",
            "a/b/c:1",
            ":1",
            "svc:",
            "svc:70000",
            "svc:0",
        ] {
            assert!(ServiceRef::parse(bad).is_err(), "{bad}");
        }
    }

    fn list(json: serde_json::Value) -> wire::EndpointSliceList {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn only_ready_endpoints_on_the_named_port() {
        let slices = list(serde_json::json!({"items": [
            {"addressType": "IPv4",
             "ports": [{"name": "metrics", "port": 9000}, {"name": "grpc", "port": 50051}],
             "endpoints": [
                {"addresses": ["10.0.0.2"], "conditions": {"ready": true}},
                {"addresses": ["10.0.0.1"]},
                {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "terminating": true}},
             ]},
            {"addressType": "IPv6", "ports": [{"name": "grpc", "port": 50051}],
             "endpoints": [{"addresses": ["fd00::5"], "conditions": {"ready": true}}]},
            {"addressType": "IPv4", "ports": [{"name": "other", "port": 1}],
             "endpoints": [{"addresses": ["10.0.0.9"]}]},
            {"addressType": "IPv4", "ports": null, "endpoints": null}
        ]}));
        assert_eq!(
            ready_addresses(&slices, &PortRef::Name("grpc".into())),
            vec!["10.0.0.1:50051", "10.0.0.2:50051", "[fd00::5]:50051"]
        );
        assert_eq!(
            ready_addresses(&slices, &PortRef::Number(7000)),
            vec![
                "10.0.0.1:7000",
                "10.0.0.2:7000",
                "10.0.0.9:7000",
                "[fd00::5]:7000"
            ]
        );
        assert!(
            ready_addresses(&list(serde_json::json!({"items": []})), &PortRef::Number(1))
                .is_empty()
        );
    }

    #[test]
    fn in_cluster_settings_come_from_the_environment() {
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
            _ => None,
        };
        // Without the mounted CA an https API cannot be trusted: refuse.
        let err = KubeApi::from_lookup(env, |_| None).err().unwrap();
        assert!(err.to_string().contains("cluster CA"), "{err}");
        // No cluster and no override: refuse with what to do.
        let err = KubeApi::from_lookup(|_| None, |_| None).err().unwrap();
        assert!(err.to_string().contains("GATEWAY_K8S_API"), "{err}");
        // An override, with the namespace file of the pod.
        let api = KubeApi::from_lookup(
            |k| (k == "GATEWAY_K8S_API").then(|| "http://127.0.0.1:8001/".to_owned()),
            |p| p.ends_with("/namespace").then(|| b"inference\n".to_vec()),
        )
        .unwrap();
        assert_eq!(api.base, "http://127.0.0.1:8001");
        assert_eq!(api.own_namespace, "inference");
    }

    /// Serves one HTTPS exchange as the API server would, with a
    /// certificate for 127.0.0.1 signed by `cluster-ca.pem`.
    async fn tls_api_server(body: &'static str) -> u16 {
        use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let certs = CertificateDer::pem_slice_iter(include_bytes!("testdata/apiserver.pem"))
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(include_bytes!("testdata/apiserver.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    continue;
                };
                let mut buf = vec![0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    fn in_cluster(port: u16, ca: &'static [u8]) -> Arc<KubeApi> {
        let port = port.to_string();
        KubeApi::from_lookup(
            move |k| match k {
                "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1".to_owned()),
                "KUBERNETES_SERVICE_PORT" => Some(port.clone()),
                "GATEWAY_K8S_TOKEN_FILE" => Some(String::new()),
                _ => None,
            },
            move |p| p.ends_with("/ca.crt").then(|| ca.to_vec()),
        )
        .unwrap()
    }

    /// In a pod the API server is reached by IP over TLS, trusted through
    /// the mounted cluster CA only.
    #[tokio::test]
    async fn the_api_is_trusted_through_the_cluster_ca_only() {
        let body = r#"{"items":[{"addressType":"IPv4","ports":[{"name":"grpc","port":50051}],"endpoints":[{"addresses":["10.1.2.3"]}]}]}"#;
        let port = tls_api_server(body).await;
        let service = ServiceRef::parse("inference/worker-base:grpc").unwrap();
        let trusted = in_cluster(port, include_bytes!("testdata/cluster-ca.pem"));
        assert_eq!(
            trusted.ready_addresses(&service).await.unwrap(),
            vec!["10.1.2.3:50051"]
        );
        let untrusted = in_cluster(port, include_bytes!("testdata/other-ca.pem"));
        assert!(untrusted.ready_addresses(&service).await.is_err());
        assert!(tls_config(Some(b"not a certificate")).is_err());
    }
}
