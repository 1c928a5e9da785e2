//! A whole service for one test: workers per model plus one gateway (and,
//! when asked, a private prefix on the test Redis).

use crate::{Client, Gateway, GatewayOpts, RedisScope, Worker, WorkerOpts};
use anyhow::{Context, Result};
use std::collections::BTreeMap;

/// The three model ids the service offers.
pub const MODELS: [&str; 3] = ["base-mini", "base", "base-ultra"];

/// How to build a [`Stack`]. Defaults: every model, one zero-delay
/// synthetic worker each, one random key, the embedded store.
#[derive(Debug, Clone)]
pub struct StackBuilder {
    models: Vec<String>,
    workers_per_model: usize,
    worker_opts: WorkerOpts,
    model_opts: BTreeMap<String, WorkerOpts>,
    gateway: GatewayOpts,
    redis: bool,
    /// Where the gateway reaches the test Redis, when not directly (a
    /// fault proxy in front of it).
    redis_via: Option<String>,
}

impl Default for StackBuilder {
    fn default() -> Self {
        Self {
            models: MODELS.iter().map(|m| m.to_string()).collect(),
            workers_per_model: 1,
            worker_opts: WorkerOpts::default(),
            model_opts: BTreeMap::new(),
            gateway: GatewayOpts::default(),
            redis: false,
            redis_via: None,
        }
    }
}

impl StackBuilder {
    /// Only these models get workers (the others stay out of the config).
    /// Fewer workers start faster.
    pub fn models(mut self, models: &[&str]) -> Self {
        self.models = models.iter().map(|m| m.to_string()).collect();
        self
    }

    pub fn workers_per_model(mut self, n: usize) -> Self {
        self.workers_per_model = n;
        self
    }

    /// Flags of every worker (unless [`StackBuilder::model_opts`] overrides).
    pub fn worker_opts(mut self, opts: WorkerOpts) -> Self {
        self.worker_opts = opts;
        self
    }

    /// Flags of the workers of one model.
    pub fn model_opts(mut self, model: &str, opts: WorkerOpts) -> Self {
        self.model_opts.insert(model.to_string(), opts);
        self
    }

    /// Gateway options; their `workers` are filled in by the stack (models
    /// already listed there keep those addresses in addition).
    pub fn gateway_opts(mut self, opts: GatewayOpts) -> Self {
        self.gateway = opts;
        self
    }

    /// HTTPS on the gateway's public listener ([`GatewayOpts::tls`]).
    pub fn gateway_tls(mut self, files: crate::certs::CertFiles) -> Self {
        self.gateway.tls = Some(files);
        self
    }

    /// Adds a variable to the gateway's environment ([`GatewayOpts::env`]).
    pub fn gateway_env(mut self, (key, value): (String, String)) -> Self {
        self.gateway.env.push((key, value));
        self
    }

    /// Appends to [`GatewayOpts::extra_toml`].
    pub fn extra_toml(mut self, toml: &str) -> Self {
        self.gateway.extra_toml.push('\n');
        self.gateway.extra_toml.push_str(toml);
        self
    }

    /// Puts the gateway on the test Redis under a fresh random prefix,
    /// deleted when the stack is dropped.
    pub fn redis(mut self) -> Self {
        self.redis = true;
        self
    }

    /// [`redis`](Self::redis), with the gateway reaching Redis at `url`
    /// (a [`crate::FaultProxy`] in front of the test Redis).
    pub fn redis_via(mut self, url: &str) -> Self {
        self.redis = true;
        self.redis_via = Some(url.to_owned());
        self
    }

    pub fn start(self) -> Result<Stack> {
        let redis = if self.redis {
            Some(RedisScope::new().context("the test Redis (set TEST_REDIS_URL)")?)
        } else {
            None
        };
        // Start the workers in parallel: each loads a tokenizer.
        let plan: Vec<(String, WorkerOpts)> = self
            .models
            .iter()
            .flat_map(|m| {
                let opts = self.model_opts.get(m).unwrap_or(&self.worker_opts).clone();
                std::iter::repeat_n((m.clone(), opts), self.workers_per_model)
            })
            .collect();
        let started: Vec<Result<Worker>> = std::thread::scope(|s| {
            let handles: Vec<_> = plan
                .iter()
                .map(|(m, o)| s.spawn(move || Worker::start(m, o.clone())))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("worker start panicked")))
                })
                .collect()
        });
        let workers: Vec<Worker> = started.into_iter().collect::<Result<_>>()?;
        let mut gateway_opts = self.gateway;
        for w in &workers {
            gateway_opts
                .workers
                .entry(w.model().to_string())
                .or_default()
                .push(w.addr().to_string());
        }
        if let Some(r) = &redis {
            let url = self.redis_via.as_deref().unwrap_or(r.url());
            gateway_opts.redis = Some((url.to_string(), r.prefix().to_string()));
        }
        let gateway = Gateway::start(gateway_opts)?;
        Ok(Stack {
            gateway,
            workers,
            redis,
        })
    }
}

/// A running service. Dropping it stops the gateway, then the workers, then
/// deletes the test's Redis keys.
#[derive(Debug)]
pub struct Stack {
    pub gateway: Gateway,
    pub workers: Vec<Worker>,
    pub redis: Option<RedisScope>,
}

impl Stack {
    /// Every model with one zero-delay synthetic worker, the embedded store.
    pub fn start() -> Result<Stack> {
        StackBuilder::default().start()
    }

    pub fn builder() -> StackBuilder {
        StackBuilder::default()
    }

    /// One model, `base`, served by one worker with `opts`: the smallest
    /// stack that answers (it starts fastest). Panics if it does not start.
    #[track_caller]
    pub fn single(opts: WorkerOpts) -> Stack {
        StackBuilder::default()
            .models(&["base"])
            .worker_opts(opts)
            .start()
            .expect("stack starts")
    }

    /// A gateway with no worker at all, for routes that need none (the
    /// model list, the OpenAPI document). Panics if it does not start.
    #[track_caller]
    pub fn gateway_only() -> Stack {
        StackBuilder::default()
            .models(&[])
            .start()
            .expect("stack starts")
    }

    /// A client of the public API with the gateway's first key.
    pub fn client(&self) -> Client {
        self.gateway.client()
    }

    /// The first worker of `model`; panics when the stack has none.
    #[track_caller]
    pub fn worker(&self, model: &str) -> &Worker {
        self.workers
            .iter()
            .find(|w| w.model() == model)
            .unwrap_or_else(|| panic!("the stack has no worker for {model}"))
    }

    #[track_caller]
    pub fn worker_mut(&mut self, model: &str) -> &mut Worker {
        self.workers
            .iter_mut()
            .find(|w| w.model() == model)
            .unwrap_or_else(|| panic!("the stack has no worker for {model}"))
    }

    /// Every worker of `model`.
    pub fn workers_of<'a>(&'a self, model: &'a str) -> impl Iterator<Item = &'a Worker> + 'a {
        self.workers.iter().filter(move |w| w.model() == model)
    }

    /// Runs the operator CLI (`gateway <args>`) against this stack's Redis
    /// prefix, straight to Redis; returns stdout. Panics if it fails.
    #[track_caller]
    pub fn cli(&self, args: &[&str]) -> String {
        let redis = self.redis.as_ref().expect("a Redis stack");
        gateway_cli(
            &[
                ("GATEWAY_REDIS_URL", redis.url()),
                ("GATEWAY_KEY_PREFIX", redis.prefix()),
            ],
            args,
        )
    }

    /// The logs of every process, for an assertion message.
    pub fn logs(&self) -> String {
        let mut s = self.gateway.log_tail();
        for w in &self.workers {
            s.push('\n');
            s.push_str(&w.log_tail());
        }
        s
    }
}

/// Runs the operator CLI (`gateway <args>`) with `env`; returns stdout.
/// Panics if it fails.
#[track_caller]
pub fn gateway_cli(env: &[(&str, &str)], args: &[&str]) -> String {
    let out = std::process::Command::new(crate::bins::bin("gateway").expect("gateway binary"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run the gateway CLI");
    assert!(
        out.status.success(),
        "gateway {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
