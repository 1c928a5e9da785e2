//! A child process of the harness: started with `PR_SET_PDEATHSIG` so it
//! never outlives the test, its output kept in a log file, and its ready line
//! awaited before anyone talks to it.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What to run and how to know it is ready.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Short label for logs and messages (`worker-base`, `gateway`).
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Variables removed from the inherited environment (so a developer's
    /// `GATEWAY_LISTEN` cannot redirect a test gateway).
    pub env_remove: Vec<String>,
    /// The process is ready once it prints a stdout line containing this
    /// (at its start for our binaries; inside a log line for redis-server).
    pub ready_prefix: String,
    pub ready_timeout: Duration,
}

/// A running child. Dropping it kills the process (SIGKILL) and reaps it.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

/// PDEATHSIG fires when the *thread* that forked the child exits, not the
/// process. Test threads and tokio's blocking threads come and go, so every
/// child is forked from one thread that lives as long as the process.
fn on_spawner_thread<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> T {
    type Job = Box<dyn FnOnce() + Send>;
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("harness-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("the harness cannot start its spawner thread");
        Mutex::new(tx)
    });
    let (tx, rx) = mpsc::sync_channel(1);
    sender
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(Box::new(move || {
            let _ = tx.send(job());
        }))
        .expect("the harness spawner thread is gone");
    rx.recv().expect("the harness spawner thread dropped a job")
}

impl ChildProcess {
    /// Starts `spec` and waits for its ready line, which is returned.
    pub fn start(spec: &Spec) -> Result<(ChildProcess, String)> {
        let dir = crate::bins::log_root();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log_path = dir.join(format!(
            "{}-{}-{}.log",
            spec.name,
            std::process::id(),
            crate::random_hex(8)
        ));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log.try_clone()?));
        for k in &spec.env_remove {
            cmd.env_remove(k);
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        // SAFETY: prctl is async-signal-safe and only asks the kernel to
        // SIGKILL the child when the spawner thread (alive as long as this
        // process) goes away, so children never leak past a crashed test.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let program = spec.program.clone();
        let mut child = on_spawner_thread(move || cmd.spawn())
            .with_context(|| format!("starting {}", program.display()))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let (ready_tx, ready_rx) = mpsc::channel();
        let prefix = spec.ready_prefix.clone();
        let mut log_out = log;
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(log_out, "{line}");
                if line.contains(&prefix) {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        let mut process = ChildProcess {
            name: spec.name.clone(),
            child,
            log_path,
        };
        let deadline = Instant::now() + spec.ready_timeout;
        loop {
            match ready_rx.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => return Ok((process, line)),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // stdout closed without the ready line: it exited.
                    let status = process.wait_exit(Duration::from_secs(2));
                    bail!(
                        "{} exited ({status:?}) before printing '{}'\n{}",
                        spec.name,
                        spec.ready_prefix,
                        process.log_tail(4000)
                    );
                }
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                bail!(
                    "{} exited ({status}) before printing '{}'\n{}",
                    spec.name,
                    spec.ready_prefix,
                    process.log_tail(4000)
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} printed no '{}' within {:?}\n{}",
                    spec.name,
                    spec.ready_prefix,
                    spec.ready_timeout,
                    process.log_tail(4000)
                );
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file that holds the child's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `max_bytes` of the child's log, labelled, for failure messages.
    pub fn log_tail(&self, max_bytes: u64) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log_path) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(max_bytes)));
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            text = String::from_utf8_lossy(&buf).into_owned();
        }
        format!(
            "---- last output of {} ({}) ----\n{text}\n---- end of {} ----",
            self.name,
            self.log_path.display(),
            self.name
        )
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (for example `libc::SIGTERM`, `libc::SIGSTOP`).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail(6000));
        } else if !keep_logs() {
            let _ = std::fs::remove_file(&self.log_path);
        }
    }
}

/// `IGW_KEEP_LOGS=1` keeps child logs (and configs) of passing tests too;
/// by default only a failing test's files stay in `target/e2e-logs/`.
pub fn keep_logs() -> bool {
    std::env::var_os("IGW_KEEP_LOGS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Kills the process in `slot` if it runs and starts it again on the
/// address it had (a restarted pod behind the same address). The old socket
/// may linger a moment, so `start` is retried for about two seconds; on
/// failure the old handle stays, its log readable.
pub fn restart_in_place(
    slot: &mut Option<ChildProcess>,
    what: &str,
    mut start: impl FnMut() -> Result<ChildProcess>,
) -> Result<()> {
    if let Some(p) = slot.as_mut() {
        p.kill();
    }
    let mut last_err = None;
    for _ in 0..20 {
        match start() {
            Ok(process) => {
                *slot = Some(process);
                return Ok(());
            }
            Err(e) => last_err = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("{what} did not restart")))
}

/// A free loopback address (`127.0.0.1:PORT`). Another process may take the
/// port before the child binds it; starters retry on a fresh port then.
///
/// The kernel may hand the same ephemeral port to two consecutive binds
/// once the first is released, and Pingora listens with `SO_REUSEPORT`, so
/// two listeners given one port would both start and share its
/// connections. A port is therefore never handed out twice per process.
pub fn free_addr() -> Result<String> {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
        if handed_out.insert(addr.port()) {
            return Ok(addr.to_string());
        }
    }
}

/// A free loopback port, as [`free_addr`] hands them out.
pub fn free_port() -> Result<u16> {
    let addr = free_addr()?;
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .context("free_addr gave no port")
}
