// The Responses API through the official `openai` npm package: create,
// the stream helper, background runs followed with retrieve-stream (and the
// helper's resume by id), cancel, delete and the input item list.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { clientFor, startStack } from '../lib/stack.mjs';

let stack;
let client;
// Workers decoding at 40 tokens/s, so a background run is still going when
// a test cancels or follows it.
let slowStack;
let slow;
before(async () => {
  [stack, slowStack] = await Promise.all([startStack(), startStack(['--tokens-per-second', '40'])]);
  client = clientFor(stack);
  slow = clientFor(slowStack);
});
after(async () => Promise.all([stack?.stop(), slowStack?.stop()]));

async function waitFor(c, id, statuses, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await c.responses.retrieve(id);
    if (statuses.includes(r.status) || Date.now() > deadline) return r;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

async function collect(stream) {
  const events = [];
  for await (const e of stream) events.push(e);
  return events;
}

test('create: a completed response with usage and metadata', async () => {
  const { data: r, request_id } = await client.responses
    .create({
      model: 'base',
      input: 'Hello. synthetic:reply_tokens=6',
      instructions: 'Be brief.',
      metadata: { case: 'plain' },
    })
    .withResponse();
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.status, 'completed');
  assert.ok(r.output_text, 'the SDK derives output_text from the output items');
  assert.deepEqual(r.metadata, { case: 'plain' });
  assert.equal(r.usage.output_tokens, 6);
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.ok(r.usage.input_tokens_details.cached_tokens >= 0);
  assert.ok(request_id);
});

test('create with stream: event order and sequence numbers', async () => {
  const events = await collect(
    await client.responses.create({ model: 'base-mini', input: 'Hi. synthetic:reply_tokens=5', stream: true }),
  );
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(
    events.map((e) => e.sequence_number),
    events.map((_, i) => i),
  );
  const text = events
    .filter((e) => e.type === 'response.output_text.delta')
    .map((e) => e.delta)
    .join('');
  const final = events.at(-1).response;
  assert.equal(final.status, 'completed');
  const message = final.output.find((o) => o.type === 'message');
  assert.equal(text, message.content[0].text);
  assert.deepEqual(message.content[0].annotations, []);
});

test('stream helper: text deltas and the final response', async () => {
  const stream = client.responses.stream({ model: 'base', input: 'Hi. synthetic:reply_tokens=7' });
  const deltas = [];
  stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const final = await stream.finalResponse();
  assert.equal(final.status, 'completed');
  assert.equal(final.output_text, deltas.join(''));
  assert.equal(final.usage.output_tokens, 7);
});

test('stream helper: function call arguments with a strict tool', async () => {
  const tools = [
    {
      type: 'function',
      name: 'get_weather',
      description: 'Weather in a city',
      strict: true,
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' } },
        required: ['city'],
        additionalProperties: false,
      },
    },
  ];
  const stream = client.responses.stream({
    model: 'base',
    input: 'Weather in Paris?',
    tools,
    tool_choice: 'required',
  });
  const argDeltas = [];
  stream.on('response.function_call_arguments.delta', (e) => argDeltas.push(e.delta));
  const final = await stream.finalResponse();
  const calls = final.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.match(calls[0].call_id, /^call_/);
  assert.equal(calls[0].arguments, argDeltas.join(''));
  assert.ok('city' in JSON.parse(calls[0].arguments));
  // The output of the call, chained onto the stored response.
  const second = await client.responses.create({
    model: 'base',
    previous_response_id: final.id,
    tools,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: '{"temp": 21}' }],
  });
  assert.equal(second.status, 'completed');
  assert.equal(second.previous_response_id, final.id);
});

test('json_schema text format: parse() returns the parsed object', async () => {
  const r = await client.responses.parse({
    model: 'base',
    input: 'Weather in Oslo, as JSON.',
    text: {
      format: {
        type: 'json_schema',
        name: 'weather',
        strict: true,
        schema: {
          type: 'object',
          properties: { city: { type: 'string' }, celsius: { type: 'integer' } },
          required: ['city', 'celsius'],
          additionalProperties: false,
        },
      },
    },
  });
  assert.equal(typeof r.output_parsed.city, 'string');
  assert.ok(Number.isInteger(r.output_parsed.celsius));
});

test('background: queued at once, retrieve until completed, then replay with retrieve-stream', async () => {
  const r = await client.responses.create({ model: 'base', input: 'bg synthetic:reply_tokens=8', background: true });
  assert.equal(r.status, 'queued');
  assert.equal(r.background, true);
  const done = await waitFor(client, r.id, ['completed']);
  assert.equal(done.status, 'completed');
  assert.equal(done.usage.output_tokens, 8);
  const events = await collect(await client.responses.retrieve(r.id, { stream: true }));
  assert.equal(events[0].type, 'response.created');
  assert.equal(events.at(-1).type, 'response.completed');
  const later = await collect(await client.responses.retrieve(r.id, { stream: true, starting_after: 4 }));
  assert.deepEqual(
    later.map((e) => e.sequence_number),
    events.slice(5).map((e) => e.sequence_number),
  );
});

test('background: retrieve-stream follows a running response live', async () => {
  const r = await slow.responses.create({ model: 'base', input: 'bg synthetic:reply_tokens=30', background: true });
  const started = Date.now();
  const events = await collect(await slow.responses.retrieve(r.id, { stream: true }));
  assert.ok(Date.now() - started > 300, 'the replay waited for live events');
  assert.equal(events[0].type, 'response.created');
  assert.equal(events.at(-1).type, 'response.completed');
  assert.equal(events.at(-1).response.usage.output_tokens, 30);
});

test('stream helper resumes a background response by id after a sequence number', async () => {
  const r = await slow.responses.create({ model: 'base', input: 'bg synthetic:reply_tokens=20', background: true });
  const stream = slow.responses.stream({ response_id: r.id, starting_after: 3 });
  const seen = [];
  stream.on('event', (e) => seen.push(e.sequence_number));
  const final = await stream.finalResponse();
  assert.ok(seen.length > 0);
  assert.ok(seen.every((n) => n > 3));
  assert.equal(final.id, r.id);
  assert.equal(final.status, 'completed');
  assert.equal(final.usage.output_tokens, 20);
});

test('cancel: a running background response, then cancelling again is a 400', async () => {
  const r = await slow.responses.create({ model: 'base', input: 'bg synthetic:reply_tokens=400', background: true });
  await waitFor(slow, r.id, ['in_progress']);
  const cancelled = await slow.responses.cancel(r.id);
  assert.equal(cancelled.status, 'cancelled');
  await assert.rejects(slow.responses.cancel(r.id), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.code, 'response_not_cancellable');
    return true;
  });
  assert.equal((await slow.responses.retrieve(r.id)).status, 'cancelled');
  const events = await collect(await slow.responses.retrieve(r.id, { stream: true }));
  assert.equal(events.at(-1).response.status, 'cancelled');
});

test('delete: gone afterwards, and deleting again is a 404', async () => {
  const r = await client.responses.create({ model: 'base', input: 'x synthetic:reply_tokens=1' });
  await client.responses.delete(r.id);
  await assert.rejects(client.responses.retrieve(r.id), OpenAI.NotFoundError);
  await assert.rejects(client.responses.delete(r.id), OpenAI.NotFoundError);
});

test('input items: newest first by default, paged in ascending order', async () => {
  const r = await client.responses.create({
    model: 'base',
    input: [
      { role: 'user', content: 'first' },
      { role: 'user', content: [{ type: 'input_text', text: 'second' }] },
    ],
  });
  const texts = [];
  for await (const item of client.responses.inputItems.list(r.id)) texts.push(item.content[0].text);
  assert.deepEqual(texts, ['second', 'first']);
  const page = await client.responses.inputItems.list(r.id, { order: 'asc', limit: 1 });
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].content[0].text, 'first');
  assert.equal(page.has_more, true);
  // The SDK's cursor pagination walks to the end.
  const all = [];
  for await (const item of client.responses.inputItems.list(r.id, { order: 'asc', limit: 1 })) {
    all.push(item.content[0].text);
  }
  assert.deepEqual(all, ['first', 'second']);
});
