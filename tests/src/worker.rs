//! One `worker serve` process for one model (synthetic engine by default),
//! and its gRPC `Info` (the worker's own counters, for asserting from the
//! worker's side).

use crate::process::{free_addr, restart_in_place, ChildProcess, Spec};
use anyhow::{Context, Result};
use inference_proto::v1 as pb;
use std::time::Duration;

/// Flags of one worker. `Default` is a zero-delay synthetic worker.
#[derive(Debug, Clone)]
pub struct WorkerOpts {
    /// `synthetic` unless a test needs another engine.
    pub engine: String,
    /// Simulated time to first token (`--ttft-ms`).
    pub ttft_ms: u64,
    /// Simulated decode speed (`--tokens-per-second`); 0 = unpaced.
    pub tokens_per_second: u64,
    pub max_concurrency: Option<u32>,
    pub max_queue: Option<u32>,
    pub context_window: Option<u64>,
    pub grace_period_seconds: Option<u64>,
    /// Anything else, appended to the command line as is.
    pub extra_args: Vec<String>,
    /// Extra environment for the process (for example `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Run on this lab host (its own network namespace and address)
    /// instead of loopback.
    pub host: Option<crate::netlab::Host>,
}

impl Default for WorkerOpts {
    fn default() -> Self {
        Self {
            engine: "synthetic".into(),
            ttft_ms: 0,
            tokens_per_second: 0,
            max_concurrency: None,
            max_queue: None,
            context_window: None,
            grace_period_seconds: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            host: None,
        }
    }
}

impl WorkerOpts {
    /// A real-model worker: the `llama` engine on a GGUF file (see
    /// [`crate::model::model_file`]), `n_ctx` tokens per sequence,
    /// `parallel` sequences decoded together. One decode thread: end-to-end
    /// tests run two at a time on 2 cores, and llama.cpp's spinning thread
    /// pools slow down sharply when oversubscribed.
    pub fn llama(model_file: &std::path::Path, n_ctx: u32, parallel: u32) -> Self {
        Self {
            engine: "llama".into(),
            extra_args: vec![
                "--model-file".into(),
                model_file.display().to_string(),
                "--n-ctx".into(),
                n_ctx.to_string(),
                "--parallel".into(),
                parallel.to_string(),
                "--threads".into(),
                "1".into(),
            ],
            ..Self::default()
        }
    }

    /// An `upstream` worker in front of an OpenAI-compatible engine at
    /// `url` of `kind` (`llama-server`, `vllm`, ...), scraping its load
    /// every 50 ms so tests see the engine's counts quickly.
    pub fn upstream(url: &str, kind: &str) -> Self {
        Self {
            engine: "upstream".into(),
            extra_args: vec![
                "--upstream-url".into(),
                url.into(),
                "--upstream-kind".into(),
                kind.into(),
                "--upstream-scrape-ms".into(),
                "50".into(),
            ],
            ..Self::default()
        }
    }

    /// A worker with realistic pacing: `ttft_ms` before the first token, then
    /// `tokens_per_second`.
    pub fn paced(ttft_ms: u64, tokens_per_second: u64) -> Self {
        Self {
            ttft_ms,
            tokens_per_second,
            ..Self::default()
        }
    }

    fn args(&self, model: &str, addr: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "serve",
            "--model",
            model,
            "--engine",
            &self.engine,
            "--listen",
            addr,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["--ttft-ms".into(), self.ttft_ms.to_string()]);
        args.extend([
            "--tokens-per-second".into(),
            self.tokens_per_second.to_string(),
        ]);
        let optional = [
            ("--max-concurrency", self.max_concurrency.map(u64::from)),
            ("--max-queue", self.max_queue.map(u64::from)),
            ("--context-window", self.context_window),
            ("--grace-period-seconds", self.grace_period_seconds),
        ];
        for (flag, value) in optional {
            if let Some(v) = value {
                args.extend([flag.to_string(), v.to_string()]);
            }
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// A running worker. Dropping it kills the process.
#[derive(Debug)]
pub struct Worker {
    model: String,
    addr: String,
    opts: WorkerOpts,
    process: Option<ChildProcess>,
}

impl Worker {
    /// Starts a worker for `model` on a free loopback port and waits until it
    /// prints `worker listening on ...`.
    pub fn start(model: &str, opts: WorkerOpts) -> Result<Worker> {
        let mut last_err = None;
        for _ in 0..3 {
            let addr = free_addr()?;
            let addr = match &opts.host {
                Some(host) => format!("{}:{}", host.ip, addr.rsplit(':').next().unwrap_or("0")),
                None => addr,
            };
            match Self::start_on(model, &addr, &opts) {
                Ok(process) => {
                    return Ok(Worker {
                        model: model.to_string(),
                        addr,
                        opts,
                        process: Some(process),
                    })
                }
                // Most likely the port was taken meanwhile: try another.
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("worker did not start")))
    }

    fn start_on(model: &str, addr: &str, opts: &WorkerOpts) -> Result<ChildProcess> {
        let (program, args) = crate::netlab::on(
            opts.host.as_ref(),
            crate::bins::bin("worker")?,
            opts.args(model, addr),
        );
        let spec = Spec {
            name: format!("worker-{model}"),
            program,
            args,
            env: opts.env.clone(),
            env_remove: Vec::new(),
            ready_prefix: "worker listening on".into(),
            ready_timeout: Duration::from_secs(30),
        };
        Ok(ChildProcess::start(&spec)?.0)
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// `127.0.0.1:PORT`, as the gateway config wants it.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `http://127.0.0.1:PORT`, for a tonic client.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn opts(&self) -> &WorkerOpts {
        &self.opts
    }

    /// The process id (of the last start; check [`Worker::is_running`]).
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(ChildProcess::pid)
    }

    pub fn is_running(&mut self) -> bool {
        self.process.as_mut().is_some_and(ChildProcess::is_running)
    }

    /// SIGKILL: the worker vanishes mid-whatever (chaos).
    pub fn kill(&mut self) {
        // Keep the handle: its log stays readable for failure messages.
        if let Some(p) = self.process.as_mut() {
            p.kill();
        }
    }

    /// Sends a signal: `libc::SIGTERM` to drain, `SIGSTOP`/`SIGCONT` to hang
    /// and resume.
    pub fn signal(&self, signal: i32) {
        if let Some(p) = &self.process {
            p.signal(signal);
        }
    }

    /// Waits up to `timeout` for the worker to exit on its own (after SIGTERM).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.as_mut()?.wait_exit(timeout)
    }

    /// Kills the worker if it runs, then starts it again on the same port
    /// with the same flags (a restarted pod behind the same address).
    pub fn restart(&mut self) -> Result<()> {
        let (model, addr, opts) = (&self.model, &self.addr, &self.opts);
        restart_in_place(&mut self.process, "worker", || {
            Self::start_on(model, addr, opts)
        })
    }

    /// The tail of the worker's log, for assertion messages.
    pub fn log_tail(&self) -> String {
        self.process
            .as_ref()
            .map(|p| p.log_tail(4000))
            .unwrap_or_else(|| format!("(worker {} is not running)", self.model))
    }

    /// A gRPC client to this worker (loopback, plain HTTP/2).
    pub async fn grpc(&self) -> Result<pb::worker_client::WorkerClient<tonic::transport::Channel>> {
        let channel = tonic::transport::Endpoint::from_shared(self.grpc_url())?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to worker {} at {}", self.model, self.addr))?;
        Ok(pb::worker_client::WorkerClient::new(channel))
    }

    /// The worker's `Info`: model, load, draining and its counters.
    pub async fn info(&self) -> Result<pb::InfoResponse> {
        let mut client = self.grpc().await?;
        Ok(client.info(pb::InfoRequest {}).await?.into_inner())
    }

    /// The worker's load report (running, queued, capacity, cache use).
    pub async fn load(&self) -> Result<pb::Load> {
        Ok(self.info().await?.load.unwrap_or_default())
    }

    /// What the worker reports its engine holds (`Info.prefix_cache`).
    pub async fn prefix_report(&self) -> Result<pb::PrefixCache> {
        self.info()
            .await?
            .prefix_cache
            .ok_or_else(|| anyhow::anyhow!("the worker sent no prefix report"))
    }

    /// The worker's counters (started, completed, cancelled, ...).
    pub async fn counters(&self) -> Result<pb::Counters> {
        Ok(self.info().await?.counters.unwrap_or_default())
    }

    /// Polls the counters until `done` holds or `timeout` passes; returns the
    /// last counters seen either way, so the caller asserts with them.
    pub async fn wait_counters(
        &self,
        timeout: Duration,
        done: impl Fn(&pb::Counters) -> bool,
    ) -> Result<pb::Counters> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let c = self.counters().await?;
            if done(&c) || tokio::time::Instant::now() >= deadline {
                return Ok(c);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Starts one worker of `model` per entry of `opts`, in parallel.
pub fn start_workers(model: &str, opts: &[WorkerOpts]) -> Vec<Worker> {
    std::thread::scope(|s| {
        let handles: Vec<_> = opts
            .iter()
            .map(|o| s.spawn(move || Worker::start(model, o.clone())))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("worker start thread")
                    .expect("worker starts")
            })
            .collect()
    })
}
