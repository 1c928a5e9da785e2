//! Where a pool's workers are: static addresses, DNS names re-resolved
//! periodically (a Kubernetes headless Service answers with one A record per
//! ready pod, so scale-ups and restarts show up without a gateway restart),
//! or a Service's ready endpoints read from the Kubernetes API.

use super::kubernetes::{KubeApi, ServiceRef};
use crate::metrics::METRICS;
use std::sync::Arc;

/// One configured worker address.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// `host:port` or `http://host:port`: one worker.
    Static(String),
    /// `dns://name:port`: every address the name resolves to.
    Dns(String),
    /// `k8s://[namespace/]service:port`: the Service's ready endpoints.
    Kubernetes(ServiceRef),
}

impl Target {
    pub fn parse(addr: &str) -> anyhow::Result<Target> {
        if let Some(name) = addr.strip_prefix("dns://") {
            return Ok(Target::Dns(name.trim_end_matches('/').to_owned()));
        }
        if let Some(spec) = addr.strip_prefix("k8s://") {
            return Ok(Target::Kubernetes(ServiceRef::parse(spec)?));
        }
        Ok(Target::Static(addr.to_owned()))
    }

    /// Whether the members behind it change over time (re-resolved).
    pub fn is_dynamic(&self) -> bool {
        !matches!(self, Target::Static(_))
    }

    /// The `source` label of discovery failures.
    fn source(&self) -> &'static str {
        match self {
            Target::Static(_) => "static",
            Target::Dns(_) => "dns",
            Target::Kubernetes(_) => "kubernetes",
        }
    }
}

/// The addresses one target stands for right now. `kube` is the API for
/// `k8s://` targets (`Pools::new` sets it whenever one is configured).
async fn resolve_target(target: &Target, kube: Option<&KubeApi>) -> anyhow::Result<Vec<String>> {
    match target {
        Target::Static(a) => Ok(vec![a.clone()]),
        Target::Dns(name) => Ok(tokio::net::lookup_host(name.as_str())
            .await?
            .map(|a| a.to_string())
            .collect()),
        Target::Kubernetes(service) => match kube {
            Some(api) => api.ready_addresses(service).await,
            None => anyhow::bail!("no Kubernetes API configured"),
        },
    }
}

/// A failed lookup of one target of `model`'s pool, logged and counted the
/// same way for every kind.
fn lookup_failed(model: &str, target: &Target, e: &anyhow::Error) {
    METRICS
        .discovery_failures
        .with_label_values(&[model, target.source()])
        .inc();
    tracing::warn!(model, target = ?target, "worker discovery failed; keeping the current members: {e:#}");
}

/// The worker addresses `targets` stand for right now, or `None` when a
/// name failed to resolve. A failed lookup (a DNS server restarting, a
/// timeout) says nothing about the workers, so the caller keeps the members
/// it has rather than emptying the pool; workers that are really gone fail
/// their health checks and leave selection that way.
pub async fn resolve(
    model: &str,
    targets: &[Target],
    kube: Option<&KubeApi>,
) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for t in targets {
        match resolve_target(t, kube).await {
            Ok(addrs) => out.extend(addrs),
            Err(e) => {
                lookup_failed(model, t, &e);
                return None;
            }
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// The first membership, at startup, before the server's runtimes exist:
/// on a runtime and thread of its own (the caller may or may not be inside
/// a runtime). A target that fails is left out (logged); the periodic
/// re-resolution adds it once it answers.
pub fn resolve_blocking(
    model: &str,
    targets: &[Target],
    kube: Option<&Arc<KubeApi>>,
) -> Vec<String> {
    let (model, targets, kube) = (model.to_owned(), targets.to_vec(), kube.cloned());
    let first = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut out = Vec::new();
        for t in &targets {
            match runtime.block_on(resolve_target(t, kube.as_deref())) {
                Ok(addrs) => out.extend(addrs),
                Err(e) => lookup_failed(&model, t, &e),
            }
        }
        out.sort();
        out.dedup();
        anyhow::Ok(out)
    })
    .join();
    match first {
        Ok(Ok(addrs)) => addrs,
        Ok(Err(e)) => {
            tracing::warn!("worker discovery could not start a runtime: {e:#}");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!("the worker discovery thread panicked");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_static_and_dns_targets() {
        assert_eq!(
            Target::parse("127.0.0.1:5").unwrap(),
            Target::Static("127.0.0.1:5".into())
        );
        assert_eq!(
            Target::parse("dns://worker-base.inference.svc:50051").unwrap(),
            Target::Dns("worker-base.inference.svc:50051".into())
        );
        assert!(matches!(
            Target::parse("k8s://inference/worker-base:grpc").unwrap(),
            Target::Kubernetes(_)
        ));
        assert!(Target::parse("k8s://worker-base").is_err());
    }

    #[tokio::test]
    async fn a_failed_lookup_keeps_the_members_and_a_good_one_replaces_them() {
        // No port: the lookup fails at once, without the network.
        let failures = || {
            METRICS
                .discovery_failures
                .with_label_values(&["discovery-test", "dns"])
                .get()
        };
        assert_eq!(failures(), 0);
        assert_eq!(
            resolve(
                "discovery-test",
                &[
                    Target::Static("127.0.0.1:5".into()),
                    Target::Dns("localhost".into())
                ],
                None
            )
            .await,
            None
        );
        assert_eq!(failures(), 1, "a failed lookup is counted");
        let members = resolve(
            "discovery-test",
            &[
                Target::Static("127.0.0.1:5".into()),
                Target::Dns("localhost:50051".into()),
            ],
            None,
        )
        .await
        .expect("resolves");
        assert!(members.contains(&"127.0.0.1:5".to_string()), "{members:?}");
        assert!(members.len() >= 2, "{members:?}");
    }

    #[test]
    fn localhost_resolves_to_loopback_addresses() {
        let addrs = resolve_blocking("base", &[Target::Dns("localhost:50051".into())], None);
        assert!(
            addrs
                .iter()
                .any(|a| a == "127.0.0.1:50051" || a == "[::1]:50051"),
            "{addrs:?}"
        );
    }
}
