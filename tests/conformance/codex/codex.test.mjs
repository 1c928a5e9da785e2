// The Codex CLI (pinned in package.json) in `codex exec` mode against
// `gateway up`, configured as README.md's "Codex CLI" section says: a custom
// provider with `wire_api = "responses"` and `supports_websockets = true`
// (Responses over WebSocket; one run turns it off for HTTP and SSE), in a
// temporary CODEX_HOME.
//
// IGW_CODEX_ENGINE picks the engine of `gateway up` (default `synthetic`;
// `llama` runs the real SmolLM2 model, see tests/README.md for why CI does
// not). Every child runs under a deadline, so nothing here can hang.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { explain as explainRun, gatewayUp, requestsByStatus as requestsOf, run } from '../gateway-up.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../../..');
const CODEX = path.join(HERE, 'node_modules', '.bin', 'codex');
const ENGINE = process.env.IGW_CODEX_ENGINE ?? 'synthetic';
const TURN_DEADLINE_MS = 120_000;

/**
 * The `config.toml` of README.md's "Codex CLI" section (its first toml
 * block), pointed at this gateway: the README shows what this test runs.
 */
function readmeConfig(baseUrl) {
  const readme = readFileSync(path.join(ROOT, 'README.md'), 'utf8');
  const section = readme.split(/^## Codex CLI$/m)[1];
  assert.ok(section, 'README.md has a "## Codex CLI" section');
  const block = /```toml\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(block && block.includes('[model_providers.igw]'), 'the section shows the provider block');
  const pointed = block.replace(/^base_url = ".*"$/m, `base_url = "${baseUrl}"`);
  assert.notEqual(pointed, block, 'the block sets base_url');
  return pointed;
}

/**
 * What the README's configuration turns off: Codex's web search (a
 * `web_search` tool) and multi-agent tools (a `namespace` tool), tool types
 * the spec refuses (2.6). Turned back on, Codex's first request is refused.
 */
const REFUSED_TOOLS = ['-c', 'agents.enabled=true', '-c', 'web_search="cached"'];

let up;
let baseUrl;
let adminUrl;
let devKey;
let scratch;

before(async () => {
  const args = ENGINE === 'synthetic' ? ['--engine', 'synthetic', '--ttft-ms', '20', '--tokens-per-second', '400'] : [];
  up = await gatewayUp({ keyPrefix: 'sk-codex', args });
  baseUrl = `${up.origin}/v1`;
  ({ adminUrl, devKey } = up);
  scratch = mkdtempSync(path.join(os.tmpdir(), 'igw-codex-'));
});

after(async () => {
  await up?.stop();
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

/** `codex exec PROMPT` in a fresh CODEX_HOME and working directory. */
async function codexExec(name, prompt, overrides, topLevel = '') {
  const home = path.join(scratch, name, 'codex-home');
  const work = path.join(scratch, name, 'work');
  mkdirSync(home, { recursive: true });
  mkdirSync(work, { recursive: true });
  writeFileSync(path.join(home, 'config.toml'), topLevel + readmeConfig(baseUrl));
  const lastMessage = path.join(scratch, name, 'last-message.txt');
  // Only what Codex needs: no OPENAI_API_KEY or proxies of the caller.
  const env = {
    PATH: process.env.PATH,
    HOME: path.join(scratch, name),
    CODEX_HOME: home,
    IGW_API_KEY: devKey,
    RUST_LOG: 'error',
    NO_COLOR: '1',
  };
  const args = [
    'exec',
    // A key this version does not know is an error, not silently ignored.
    '--strict-config',
    '--skip-git-repo-check',
    '--ephemeral',
    '--sandbox',
    'read-only',
    '--color',
    'never',
    '--json',
    '--output-last-message',
    lastMessage,
    ...overrides,
    prompt,
  ];
  const result = await run(CODEX, args, { env, cwd: work, deadlineMs: TURN_DEADLINE_MS });
  let last = null;
  try {
    last = readFileSync(lastMessage, 'utf8');
  } catch {
    // no final message written
  }
  const events = result.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l));
  return { ...result, last, events };
}

/** `gateway_requests_total` samples for a route, summed by status. */
function requestsByStatus(route) {
  return requestsOf(adminUrl, route);
}

function explain(r) {
  return explainRun(r, up.log());
}

/** Waits (up to 3 s) until `route`'s samples satisfy `done`; returns the last. */
async function waitRequests(route, done) {
  const deadline = Date.now() + 3000;
  for (;;) {
    const now = await requestsByStatus(route);
    if (done(now) || Date.now() > deadline) return now;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

test('codex exec completes a turn through the gateway with the README configuration (over WebSocket)', async () => {
  const before = await requestsByStatus('responses.create');
  const sockets = await requestsByStatus('responses.websocket');
  const r = await codexExec('turn', 'Say hello in one short sentence.', []);
  assert.equal(r.timedOut, false, explain(r));
  assert.equal(r.code, 0, explain(r));
  assert.ok(r.last && r.last.trim(), `a final message: ${explain(r)}`);
  const types = r.events.map((e) => e.type);
  assert.ok(types.includes('turn.completed'), `turn.completed among ${types}: ${explain(r)}`);
  const messages = r.events.filter((e) => e.type === 'item.completed' && e.item?.type === 'agent_message');
  assert.equal(messages.at(-1)?.item.text.trim(), r.last.trim());
  const usage = r.events.find((e) => e.type === 'turn.completed').usage;
  assert.ok(usage.input_tokens > 0 && usage.output_tokens > 0, JSON.stringify(usage));
  const afterTurn = await requestsByStatus('responses.create');
  assert.ok((afterTurn['200'] ?? 0) > (before['200'] ?? 0), `a 200 response (route responses.create): ${JSON.stringify(afterTurn)}`);
  // The README's provider has `supports_websockets = true`: the turn went
  // over `GET /v1/responses` upgraded (the connection is counted, status
  // 101, once Codex closed it).
  const afterSockets = await waitRequests('responses.websocket', (n) => (n['101'] ?? 0) > (sockets['101'] ?? 0));
  assert.ok((afterSockets['101'] ?? 0) > (sockets['101'] ?? 0), `a WebSocket connection: ${JSON.stringify(afterSockets)}\n${explain(r)}`);
});

test('a tool call and its result are two turns on one WebSocket, the second chained and cached', { skip: ENGINE !== 'synthetic' && 'the simulator makes the tool call; a small real model may not' }, async () => {
  const before = await requestsByStatus('responses.create');
  const sockets = await requestsByStatus('responses.websocket');
  // The simulator answers a message that names an offered tool with a call
  // to it: Codex runs it (here its arguments do not parse, which Codex
  // reports as the tool's output) and sends the output back as the next
  // turn on the same connection, chained to the first response.
  const r = await codexExec('tool-turns', 'Call exec_command now.', []);
  assert.equal(r.timedOut, false, explain(r));
  assert.equal(r.code, 0, explain(r));
  assert.ok(r.events.some((e) => e.type === 'turn.completed'), explain(r));
  // The second turn's reply quotes the tool output it was sent.
  assert.match(r.last ?? '', /^The tool returned: /, explain(r));
  const afterTurn = await requestsByStatus('responses.create');
  const turns = (afterTurn['200'] ?? 0) - (before['200'] ?? 0);
  assert.ok(turns >= 2, `two responses or more: ${JSON.stringify(afterTurn)}\n${explain(r)}`);
  const afterSockets = await waitRequests('responses.websocket', (n) => (n['101'] ?? 0) > (sockets['101'] ?? 0));
  assert.equal((afterSockets['101'] ?? 0) - (sockets['101'] ?? 0), 1, `one WebSocket for both turns: ${JSON.stringify(afterSockets)}`);
  // The connection's turns went to the engine holding its prefix: the
  // second turn's prompt (the first's plus the call and its output) was
  // served from its cache.
  const usage = r.events.find((e) => e.type === 'turn.completed').usage;
  assert.ok(usage.cached_input_tokens > usage.input_tokens / 3, `cached tokens: ${JSON.stringify(usage)}`);
});

test('codex exec over HTTP and SSE when the provider does not support WebSockets', async () => {
  const before = await requestsByStatus('responses.create');
  const sockets = await requestsByStatus('responses.websocket');
  const r = await codexExec('sse', 'Say hello in one short sentence.', ['-c', 'model_providers.igw.supports_websockets=false']);
  assert.equal(r.timedOut, false, explain(r));
  assert.equal(r.code, 0, explain(r));
  assert.ok(r.last && r.last.trim(), `a final message: ${explain(r)}`);
  assert.ok(r.events.some((e) => e.type === 'turn.completed'), explain(r));
  const afterTurn = await requestsByStatus('responses.create');
  assert.ok((afterTurn['200'] ?? 0) > (before['200'] ?? 0), JSON.stringify(afterTurn));
  const afterSockets = await requestsByStatus('responses.websocket');
  assert.equal(afterSockets['101'] ?? 0, sockets['101'] ?? 0, `no WebSocket: ${JSON.stringify(afterSockets)}`);
});

test("with web search and sub-agent tools on, Codex is refused with the gateway's 400", async () => {
  const r = await codexExec('refused', 'Say hello.', REFUSED_TOOLS);
  assert.equal(r.timedOut, false, explain(r));
  assert.notEqual(r.code, 0, explain(r));
  // A 400 is not retried: the gateway's error (code and param) reaches the user.
  assert.match(r.stdout + r.stderr, /invalid_value/, explain(r));
  assert.match(r.stdout + r.stderr, /tools\.\d+\.type/, explain(r));
});

test("Codex loads the gateway's catalogue (spec 4.7) as its model_catalog_json", async () => {
  // Fetched as README.md says: the catalogue format answers a Codex originator.
  const reply = await fetch(`${baseUrl}/models`, {
    headers: { authorization: `Bearer ${devKey}`, originator: 'codex_exec' },
  });
  assert.equal(reply.status, 200);
  assert.ok(reply.headers.get('etag'));
  const catalogue = path.join(scratch, 'catalogue.json');
  writeFileSync(catalogue, await reply.text());
  const r = await codexExec('catalogue', 'Say hello in one short sentence.', [], `model_catalog_json = ${JSON.stringify(catalogue)}\n`);
  assert.equal(r.timedOut, false, explain(r));
  assert.equal(r.code, 0, `Codex accepts the catalogue: ${explain(r)}`);
  assert.doesNotMatch(r.stdout + r.stderr, /Model metadata for `base` not found/, explain(r));
  assert.ok(r.events.some((e) => e.type === 'turn.completed'), explain(r));
  assert.ok(r.last && r.last.trim(), explain(r));
});
