// Claude Code (pinned in package.json) in print mode (`claude -p`) and the
// official Anthropic TypeScript SDK against `gateway up --engine
// synthetic`, configured as README.md's "Claude Code" section says:
// ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY, the gateway's model names, and
// no traffic beyond the gateway (telemetry, auto-update and the other
// non-essential calls off). Every child runs under a deadline.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import Anthropic from '@anthropic-ai/sdk';
import { explain as explainRun, gatewayUp, requestsByStatus as requestsOf, run } from '../gateway-up.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const CLAUDE = path.join(HERE, 'node_modules', '.bin', 'claude');
const TURN_DEADLINE_MS = 120_000;

let up;
let origin;
let adminUrl;
let devKey;
let scratch;

before(async () => {
  up = await gatewayUp({
    keyPrefix: 'sk-claude',
    args: ['--engine', 'synthetic', '--ttft-ms', '20', '--tokens-per-second', '400'],
  });
  ({ origin, adminUrl, devKey } = up);
  scratch = mkdtempSync(path.join(os.tmpdir(), 'igw-claude-'));
});

after(async () => {
  await up?.stop();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

/** `gateway_requests_total` of a route, summed by status. */
function requestsByStatus(route) {
  return requestsOf(adminUrl, route);
}

/** `claude -p PROMPT` with only the README's environment, in `work`. */
async function claude(name, prompt, extraArgs = []) {
  const home = path.join(scratch, name);
  const work = path.join(home, 'work');
  mkdirSync(work, { recursive: true });
  const env = {
    PATH: process.env.PATH,
    HOME: home,
    ANTHROPIC_BASE_URL: origin,
    ANTHROPIC_API_KEY: devKey,
    ANTHROPIC_MODEL: 'base',
    ANTHROPIC_SMALL_FAST_MODEL: 'base-mini',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
    CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY: '1',
    DISABLE_AUTOUPDATER: '1',
    DISABLE_TELEMETRY: '1',
    DISABLE_ERROR_REPORTING: '1',
    NO_COLOR: '1',
  };
  const args = ['-p', prompt, '--output-format', 'json', ...extraArgs];
  const result = await run(CLAUDE, args, { env, cwd: work, deadlineMs: TURN_DEADLINE_MS });
  let reply = null;
  try {
    reply = JSON.parse(result.stdout.trim().split('\n').at(-1));
  } catch {
    // not JSON: the assertion shows the output
  }
  return { ...result, reply, work };
}

function explain(r) {
  return explainRun(r, up.log());
}

test('claude -p answers one turn through the gateway', async () => {
  const before = await requestsByStatus('messages.create');
  const r = await claude('one-turn', 'Say hello. synthetic:reply_tokens=12');
  assert.equal(r.code, 0, explain(r));
  assert.ok(r.reply && r.reply.is_error === false, explain(r));
  assert.ok(typeof r.reply.result === 'string' && r.reply.result.length > 0, explain(r));
  const now = await requestsByStatus('messages.create');
  assert.ok((now['200'] ?? 0) > (before['200'] ?? 0), `messages.create served: ${JSON.stringify(now)}`);
});

// The simulator's `tool_path` control makes the call name the file (and
// leave out the Read tool's optional `offset` and `limit`, which generated
// would read none of it). The file's text must come back three ways: in
// the tool result Claude Code made, at the worker (the simulator answers a
// tool result with "The tool returned: " and its text), and so in the
// answer Claude Code prints.
test('claude -p reads a file with its Read tool, then answers with its text', async () => {
  const name = 'tool-turn';
  const work = path.join(scratch, name, 'work');
  mkdirSync(work, { recursive: true });
  const file = path.join(work, 'notes.txt');
  const secret = `igw-${randomBytes(4).toString('hex')}`;
  writeFileSync(file, `The code word is ${secret}.\n`);
  const r = await claude(
    name,
    `Use the Read tool to read the file. synthetic:tool_path=${file}`,
    ['--allowedTools', 'Read', '--output-format', 'stream-json', '--verbose'],
  );
  assert.equal(r.code, 0, explain(r));
  const events = r.stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
  const uses = events
    .filter((e) => e.type === 'assistant')
    .flatMap((e) => e.message?.content ?? [])
    .filter((c) => c.type === 'tool_use');
  assert.ok(uses.some((u) => u.name === 'Read' && u.input?.file_path === file), explain(r));
  const results = events
    .filter((e) => e.type === 'user')
    .flatMap((e) => e.message?.content ?? [])
    .filter((c) => c.type === 'tool_result');
  assert.ok(JSON.stringify(results).includes(secret), `the tool read the file: ${explain(r)}`);
  const final = events.find((e) => e.type === 'result');
  assert.ok(final && final.is_error === false, explain(r));
  assert.ok(final.result.includes(secret), `the worker got the file's text and answered with it: ${explain(r)}`);
});

test('the TypeScript SDK streams one turn', async () => {
  const client = new Anthropic({ baseURL: origin, apiKey: devKey, maxRetries: 0 });
  const stream = client.messages.stream({
    model: 'base',
    max_tokens: 64,
    messages: [{ role: 'user', content: 'Stream it. synthetic:reply_tokens=10' }],
  });
  const kinds = [];
  stream.on('streamEvent', (e) => kinds.push(e.type));
  const message = await stream.finalMessage();
  assert.equal(message.stop_reason, 'end_turn');
  assert.equal(message.usage.output_tokens, 10);
  assert.ok(message.content[0].type === 'text' && message.content[0].text.length > 0);
  assert.equal(kinds[0], 'message_start');
  assert.equal(kinds.at(-1), 'message_stop');
  assert.ok(kinds.includes('content_block_delta'));
});
