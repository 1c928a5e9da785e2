// The error classes the `openai` npm package raises, provoked for real: the
// stack gets a key on a 1-request-per-minute plan for the 429; the 409 is a
// chain onto a background response that is still running.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import OpenAI from 'openai';
import { clientFor, sha256, startStack } from '../lib/stack.mjs';

const limitedKey = `sk-limited-${randomBytes(8).toString('hex')}`;
let stack;
let client;
before(async () => {
  const extra = `
[[keys]]
sha256 = "${sha256(limitedKey)}"
org = "org-limited"
name = "limited"
plan = "one-rpm"

[plans.one-rpm]
rpm = 1
`;
  stack = await startStack(['--tokens-per-second', '400', '--extra-toml', extra]);
  client = clientFor(stack);
});
after(async () => stack?.stop());

const FAST = 'hi synthetic:reply_tokens=1';
const chat = (c, extra = {}) =>
  c.chat.completions.create({ model: 'base-mini', messages: [{ role: 'user', content: FAST }], ...extra });

/** Asserts the SDK raised `cls` with this status, code and (optionally) param. */
function expectError(cls, status, code, param) {
  return (e) => {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e?.constructor?.name}: ${e?.message}`);
    assert.ok(e instanceof OpenAI.APIError);
    assert.equal(e.status, status);
    assert.equal(e.code, code);
    if (param !== undefined) assert.equal(e.param, param);
    assert.equal(e.error.status, status, 'the envelope repeats the status');
    assert.ok(e.requestID, 'x-request-id');
    return true;
  };
}

test('400: BadRequestError with code and param (chat and responses)', async () => {
  await assert.rejects(
    chat(client, { temperature: 2.5 }),
    expectError(OpenAI.BadRequestError, 400, 'invalid_value', 'temperature'),
  );
  await assert.rejects(
    chat(client, { max_token: 5 }),
    expectError(OpenAI.BadRequestError, 400, 'unknown_parameter', 'max_token'),
  );
  await assert.rejects(
    chat(client, { tools: [{ type: 'web_search' }] }),
    expectError(OpenAI.BadRequestError, 400, 'invalid_value', 'tools.0.type'),
  );
  await assert.rejects(
    client.responses.create({ model: 'base', input: FAST, reasoning: { effort: 'max' } }),
    expectError(OpenAI.BadRequestError, 400, 'invalid_value', 'reasoning.effort'),
  );
  await assert.rejects(
    client.responses.create({ model: 'base', input: FAST, background: true, store: false }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'background',
  );
});

test('401: AuthenticationError for a wrong key, on every route', async () => {
  const bad = clientFor(stack, 'sk-not-a-key');
  await assert.rejects(chat(bad), expectError(OpenAI.AuthenticationError, 401, 'invalid_api_key'));
  await assert.rejects(
    bad.responses.create({ model: 'base', input: FAST }),
    expectError(OpenAI.AuthenticationError, 401, 'invalid_api_key'),
  );
  await assert.rejects(bad.models.list(), expectError(OpenAI.AuthenticationError, 401, 'invalid_api_key'));
});

test('404: NotFoundError for an unknown model and an unknown response', async () => {
  await assert.rejects(
    chat(client, { model: 'base-maxi' }),
    expectError(OpenAI.NotFoundError, 404, 'model_not_found', 'model'),
  );
  await assert.rejects(
    client.responses.create({ model: 'gpt-4o', input: FAST }),
    expectError(OpenAI.NotFoundError, 404, 'model_not_found'),
  );
  await assert.rejects(
    client.models.retrieve('gpt-4o'),
    expectError(OpenAI.NotFoundError, 404, 'model_not_found'),
  );
  await assert.rejects(client.responses.retrieve('resp_does_not_exist'), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError);
    assert.equal(e.status, 404);
    assert.equal(typeof e.code, 'string');
    return true;
  });
});

test('409: ConflictError when chaining onto a running background response', async () => {
  // About 10 s of simulated decoding at 400 tokens per second.
  const running = await client.responses.create({
    model: 'base',
    input: 'long synthetic:reply_tokens=4000',
    background: true,
  });
  try {
    await assert.rejects(
      client.responses.create({ model: 'base', input: FAST, previous_response_id: running.id }),
      (e) => {
        assert.ok(e instanceof OpenAI.ConflictError, `got ${e?.constructor?.name}`);
        assert.equal(e.status, 409);
        assert.equal(e.param, 'previous_response_id');
        assert.equal(typeof e.code, 'string');
        assert.ok(e.code);
        return true;
      },
    );
  } finally {
    await client.responses.cancel(running.id);
  }
});

test('429: RateLimitError with retry-after past the plan\'s limit', async () => {
  const limited = clientFor(stack, limitedKey);
  // At 1 request per minute, at most two of three requests in a row are
  // admitted, even if a minute boundary falls between them.
  await assert.rejects(
    (async () => {
      for (let i = 0; i < 3; i += 1) await chat(limited);
    })(),
    (e) => {
      expectError(OpenAI.RateLimitError, 429, 'rate_limit_exceeded')(e);
      assert.equal(e.type, 'rate_limit_error');
      assert.ok(Number(e.headers.get('retry-after')) >= 1);
      return true;
    },
  );
});

test('with retries on, the SDK gives up on a 400 at once (x-should-retry: false)', async () => {
  const retrying = new OpenAI({ baseURL: stack.base_url, apiKey: stack.api_key, maxRetries: 2 });
  const started = Date.now();
  await assert.rejects(chat(retrying, { temperature: 9 }), OpenAI.BadRequestError);
  assert.ok(Date.now() - started < 500, 'a 400 carries x-should-retry: false');
});
