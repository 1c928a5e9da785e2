// Starts a test stack (real gateway + simulated workers) from the harness's
// `stack` binary, as the Python suite's conftest.py does: it prints its
// address and key as one JSON line and runs until its stdin closes.

import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');

function stackBin() {
  if (process.env.STACK_BIN) return process.env.STACK_BIN;
  const target = path.resolve(ROOT, process.env.CARGO_TARGET_DIR ?? 'target');
  return path.join(target, 'release', 'stack');
}

/** The hex SHA-256 of a key, as `[[keys]] sha256` wants it. */
export function sha256(key) {
  return createHash('sha256').update(key).digest('hex');
}

/**
 * Runs `stack ARGS`; resolves to its info line (`base_url`, `api_key`, ...)
 * plus `stop()`, which closes its stdin and waits for it to exit.
 */
export async function startStack(args = []) {
  const child = spawn(stackBin(), args, { stdio: ['pipe', 'pipe', 'inherit'] });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  const lines = createInterface({ input: child.stdout });
  const first = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the test stack did not start in 60 s')), 60_000);
    lines.once('line', (line) => {
      clearTimeout(timer);
      resolve(line);
    });
    child.once('error', reject);
    child.once('exit', (code) => reject(new Error(`the test stack exited (${code}) before its info line`)));
  }).catch((err) => {
    child.kill('SIGKILL');
    throw err;
  });
  const info = JSON.parse(first);
  info.stop = async () => {
    child.stdin.end(); // the stack stops when its stdin closes
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await exited;
    clearTimeout(timer);
  };
  return info;
}

/** A client with no retries: a test must see the first answer. */
export function clientFor(stack, apiKey = stack.api_key) {
  return new OpenAI({ baseURL: stack.base_url, apiKey, maxRetries: 0, timeout: 30_000 });
}
