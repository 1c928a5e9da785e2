// What the CLI conformance harnesses (claude-code/, codex/) share: `gateway
// up` on free ports with a fresh dev key, ready or failed with its log
// within 120 s and stopped after; their children run under a deadline;
// the request counts a test reads from the admin port.

import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');

function gatewayBin() {
  const target = path.resolve(ROOT, process.env.CARGO_TARGET_DIR ?? 'target');
  return path.join(target, 'release', 'gateway');
}

async function freePort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/**
 * Starts `gateway up ARGS` (after its listeners and a `keyPrefix`-named dev
 * key) and waits for `/readyz`. Returns its `origin`, `adminUrl`, `devKey`,
 * `log()` (what it printed so far) and `stop()`.
 */
export async function gatewayUp({ keyPrefix, args = [] }) {
  const [port, adminPort] = [await freePort(), await freePort()];
  const origin = `http://127.0.0.1:${port}`;
  const adminUrl = `http://127.0.0.1:${adminPort}`;
  const devKey = `${keyPrefix}-${randomBytes(8).toString('hex')}`;
  const upArgs = ['up', '--listen', `127.0.0.1:${port}`, '--admin-listen', `127.0.0.1:${adminPort}`, '--dev-key', devKey, ...args];
  const child = spawn(gatewayBin(), upArgs, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const up = {
    origin,
    adminUrl,
    devKey,
    log: () => log,
    async stop() {
      if (child.exitCode !== null) return;
      const exited = new Promise((resolve) => child.once('exit', resolve));
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
  const deadline = Date.now() + 120_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`gateway up exited (${child.exitCode}):\n${log}`);
    try {
      if ((await fetch(`${adminUrl}/readyz`)).ok) return up;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await up.stop();
      throw new Error(`gateway up was not ready in 120 s:\n${log}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/** Runs a child to completion (or kills it at the deadline); collects its output. */
export function run(cmd, args, { env, cwd, deadlineMs }) {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { env, cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, deadlineMs);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, timedOut });
    });
  });
}

/** A finished child's exit and output tails, with the gateway's log's. */
export function explain(r, gatewayLog) {
  return `exit ${r.code} ${r.signal ?? ''}${r.timedOut ? ' (deadline)' : ''}\n--- stdout\n${r.stdout.slice(-4000)}\n--- stderr\n${r.stderr.slice(-4000)}\n--- gateway\n${gatewayLog.slice(-3000)}`;
}

/** `gateway_requests_total` of a route, summed by status. */
export async function requestsByStatus(adminUrl, route) {
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  const byStatus = {};
  for (const line of text.split('\n')) {
    if (!line.startsWith('gateway_requests_total{') || !line.includes(`route="${route}"`)) continue;
    const status = /status="(\d+)"/.exec(line)?.[1];
    byStatus[status] = (byStatus[status] ?? 0) + Number(line.split(' ').at(-1));
  }
  return byStatus;
}
