// Chat completions through the official `openai` npm package: plain and
// streamed replies with usage, tool calls accumulated by the SDK's stream
// helper, and `json_schema` response formats.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { clientFor, startStack } from '../lib/stack.mjs';

let stack;
let client;
before(async () => {
  stack = await startStack();
  client = clientFor(stack);
});
after(async () => stack?.stop());

test('create: a completion with usage and the request id', async () => {
  const { data: reply, request_id } = await client.chat.completions
    .create({
      model: 'base',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Hello. synthetic:reply_tokens=8' },
      ],
    })
    .withResponse();
  assert.match(reply.id, /^chatcmpl-/);
  assert.equal(reply.object, 'chat.completion');
  assert.equal(reply.model, 'base');
  assert.equal(typeof reply.created, 'number');
  const [choice] = reply.choices;
  assert.equal(choice.finish_reason, 'stop');
  assert.equal(choice.message.role, 'assistant');
  assert.ok(choice.message.content);
  assert.equal(reply.usage.completion_tokens, 8);
  assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + 8);
  assert.equal(reply.usage.prompt_tokens_details.cached_tokens, 0);
  assert.ok(request_id, 'x-request-id is read by the SDK');
});

test('stream with stream_options.include_usage: one role, text, then a usage chunk', async () => {
  const stream = await client.chat.completions.create({
    model: 'base-mini',
    messages: [{ role: 'user', content: 'Hi. synthetic:reply_tokens=12' }],
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let roles = 0;
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) {
      assert.deepEqual(chunk.choices, []);
      usage = chunk.usage;
    }
    for (const c of chunk.choices) {
      if (c.delta.role) roles += 1;
      text += c.delta.content ?? '';
      finish = c.finish_reason ?? finish;
    }
  }
  assert.ok(chunks > 2);
  assert.equal(roles, 1);
  assert.equal(finish, 'stop');
  assert.ok(text);
  assert.equal(usage.completion_tokens, 12);
  assert.equal(usage.total_tokens, usage.prompt_tokens + 12);
});

test('the stream helper accumulates text into the final completion', async () => {
  const stream = client.chat.completions.stream({
    model: 'base-ultra',
    messages: [{ role: 'user', content: 'Hi. synthetic:reply_tokens=5' }],
    stream_options: { include_usage: true },
  });
  const deltas = [];
  stream.on('content.delta', ({ delta }) => deltas.push(delta));
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].message.content, deltas.join(''));
  assert.equal(final.choices[0].finish_reason, 'stop');
  assert.equal(final.usage.completion_tokens, 5);
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather in a city',
    strict: true,
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const timeTool = {
  type: 'function',
  function: {
    name: 'get_time',
    strict: true,
    parameters: {
      type: 'object',
      properties: { timezone: { type: 'string' } },
      required: ['timezone'],
      additionalProperties: false,
    },
  },
};

test('tools: the stream helper accumulates tool call deltas and parses strict arguments', async () => {
  const stream = client.chat.completions.stream({
    model: 'base',
    messages: [{ role: 'user', content: 'Use get_time in Oslo and get_weather in Rome.' }],
    tools: [timeTool, weatherTool],
  });
  const done = [];
  stream.on('tool_calls.function.arguments.done', (e) => done.push(e));
  const final = await stream.finalChatCompletion();
  const [choice] = final.choices;
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.ok(!choice.message.content);
  const calls = choice.message.tool_calls;
  assert.deepEqual(
    calls.map((c) => c.function.name),
    ['get_time', 'get_weather'],
  );
  assert.equal(new Set(calls.map((c) => c.id)).size, 2);
  for (const c of calls) {
    assert.equal(c.type, 'function');
    // An id repeated on later deltas would be concatenated by the helper.
    assert.match(c.id, /^call_/);
    assert.equal(c.id.split('call_').length, 2);
    // Strict tools: the helper parsed the accumulated arguments.
    assert.deepEqual(c.function.parsed_arguments, JSON.parse(c.function.arguments));
  }
  assert.deepEqual(
    done.map((e) => e.name),
    ['get_time', 'get_weather'],
  );
  done.forEach((e, i) => assert.equal(e.arguments, calls[i].function.arguments));
});

test('tools: a round trip sends the SDK\'s own assistant message back', async () => {
  const messages = [{ role: 'user', content: 'What time is it? Use get_time.' }];
  const first = await client.chat.completions.create({
    model: 'base-mini',
    messages,
    tools: [timeTool],
    tool_choice: { type: 'function', function: { name: 'get_time' } },
  });
  const message = first.choices[0].message;
  assert.equal(first.choices[0].finish_reason, 'tool_calls');
  const [call] = message.tool_calls;
  assert.ok('timezone' in JSON.parse(call.function.arguments));
  messages.push(message, { role: 'tool', tool_call_id: call.id, content: '12:34' });
  const second = await client.chat.completions.create({ model: 'base-mini', messages, tools: [timeTool] });
  assert.equal(second.choices[0].finish_reason, 'stop');
  assert.ok(second.choices[0].message.content);
  assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens);
});

const bookFormat = {
  type: 'json_schema',
  json_schema: {
    name: 'book',
    strict: true,
    schema: {
      type: 'object',
      properties: {
        title: { type: 'string' },
        year: { type: 'integer' },
        tags: { type: 'array', items: { type: 'string' } },
      },
      required: ['title', 'year', 'tags'],
      additionalProperties: false,
    },
  },
};

function assertBook(value) {
  assert.equal(typeof value.title, 'string');
  assert.ok(Number.isInteger(value.year));
  assert.ok(Array.isArray(value.tags));
  assert.deepEqual(Object.keys(value).sort(), ['tags', 'title', 'year']);
}

test('json_schema: parse() returns the parsed object', async () => {
  const reply = await client.chat.completions.parse({
    model: 'base',
    messages: [{ role: 'user', content: 'A book, as JSON.' }],
    response_format: bookFormat,
  });
  assertBook(reply.choices[0].message.parsed);
  assertBook(JSON.parse(reply.choices[0].message.content));
});

test('json_schema: streamed, the accumulated content is valid JSON of the schema', async () => {
  const stream = client.chat.completions.stream({
    model: 'base-mini',
    messages: [{ role: 'user', content: 'A book, as JSON.' }],
    response_format: bookFormat,
  });
  const deltas = [];
  stream.on('content.delta', ({ delta }) => deltas.push(delta));
  const final = await stream.finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, 'stop');
  assert.ok(deltas.length > 1, 'the JSON came in pieces');
  // The helper fills `parsed` only for zod formats; the text is the contract.
  assertBook(JSON.parse(deltas.join('')));
  assert.equal(final.choices[0].message.content, deltas.join(''));
});

test('models: list and retrieve', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids.sort(), ['base', 'base-mini', 'base-ultra']);
  const m = await client.models.retrieve('base');
  assert.deepEqual([m.id, m.object, m.created, m.owned_by], ['base', 'model', 0, 'base']);
});
