// Tool calls and reasoning as a model writes them, end to end: a "copy"
// model (copy_model.mjs) answers with a text placed in the prompt, through a
// Hermes-style (Qwen) template over the bundled model's tokenizer, so the
// server must parse what the model wrote into tool_calls / reasoning_content,
// streamed and not, and take the tool result back for the next turn.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import OpenAI from 'openai';
import { raw } from './harness.mjs';
import { copyModelDir, serveCopyAnswering } from './copy_model.mjs';

const { dir, shape } = copyModelDir();
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather in a city',
      parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] },
    },
  },
];

// Serve a copy model that answers `answer` to the conversation `messages`;
// with `forced`, the reply is taken to start with that text (a forced tool
// call's opening, appended to the prompt) and `answer` to follow it.
async function serveAnswering(messages, answer, forced = '') {
  const srv = await serveCopyAnswering(dir, shape, messages, tools, answer, forced);
  return { srv, client: new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 }) };
}

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('the copy model answers what it is shown (the tool is sound)', async () => {
  const answer = 'Paris is sunny today, 18 degrees.';
  const messages = [{ role: 'user', content: answer }];
  const { srv, client } = await serveAnswering(messages, answer);
  const r = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 64 });
  assert.equal(r.choices[0].message.content, answer);
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal((await srv.stop()).code, 0);
});

test('tool calls: parsed into tool_calls (streamed and not), then the result goes back for the next turn', async () => {
  const call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>';
  const messages = [{ role: 'user', content: call }];
  let { srv, client } = await serveAnswering(messages, call);
  const r = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 64 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, null);
  assert.equal(m.tool_calls.length, 1);
  const tc = m.tool_calls[0];
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /^call_/);
  assert.equal(tc.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(tc.function.arguments), { city: 'Paris', unit: 'celsius' });

  const chunks = await collect(await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 64, stream: true }));
  const deltas = chunks.flatMap((c) => c.choices[0]?.delta?.tool_calls ?? []);
  assert.equal(deltas.length, 1);
  assert.equal(deltas[0].index, 0);
  assert.equal(deltas[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(deltas[0].function.arguments), { city: 'Paris', unit: 'celsius' });
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), '');
  assert.equal(chunks.find((c) => c.choices[0]?.finish_reason).choices[0].finish_reason, 'tool_calls');

  // tool_choice "none": the same text is plain content
  const none = await client.chat.completions.create({ model: 'copy', messages, tools, tool_choice: 'none', temperature: 0, max_tokens: 64 });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal((await srv.stop()).code, 0);

  // the round trip: the assistant's call (as the client got it) and the tool's result
  const answer = 'It is 18 degrees in Paris.';
  const turn2 = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: tc.id, type: 'function', function: tc.function }] },
    { role: 'tool', tool_call_id: tc.id, content: answer },
  ];
  ({ srv, client } = await serveAnswering(turn2, answer));
  const tpl = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages: turn2, tools }) });
  assert.ok(tpl.json.prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'), tpl.json.prompt);
  assert.ok(tpl.json.prompt.includes(`<tool_response>\n${answer}\n</tool_response>`));
  // the copy model repeats up to the end of the tool's turn: a stop string cuts the closing tag
  const r2 = await client.chat.completions.create({ model: 'copy', messages: turn2, tools, temperature: 0, max_tokens: 64, stop: '\n</tool_response>' });
  assert.equal(r2.choices[0].message.content, answer);
  assert.equal(r2.choices[0].finish_reason, 'stop');
  assert.equal((await srv.stop()).code, 0);
});

test('reasoning: <think> ... </think> goes to reasoning_content, streamed and not', async () => {
  const text = '<think>\nThe user wants a greeting.\n</think>\n\nHello there!';
  const messages = [{ role: 'user', content: text }];
  const { srv, client } = await serveAnswering(messages, text);
  const r = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 64 });
  assert.equal(r.choices[0].message.reasoning_content, 'The user wants a greeting.');
  assert.equal(r.choices[0].message.content, 'Hello there!');
  const chunks = await collect(await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 64, stream: true }));
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.reasoning_content ?? '').join(''), 'The user wants a greeting.');
  assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), 'Hello there!');
  assert.equal((await srv.stop()).code, 0);
});

test('tool_choice "required" and a named function force a tool call; parallel_tool_calls: false keeps the first', async () => {
  // the model is shown only what follows the opening: unforced it would not write a call at all
  const rest = '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
  let messages = [{ role: 'user', content: rest }];
  let { srv, client } = await serveAnswering(messages, rest, '<tool_call>\n');
  for (const stream of [false, true]) {
    const req = { model: 'copy', messages, tools, tool_choice: 'required', temperature: 0, max_tokens: 64, stream };
    const calls = stream
      ? (await collect(await client.chat.completions.create(req))).flatMap((c) => c.choices[0]?.delta?.tool_calls ?? [])
      : (await client.chat.completions.create(req)).choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris' });
  }
  const auto = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 16 });
  assert.equal(auto.choices[0].message.tool_calls, undefined);
  assert.equal((await srv.stop()).code, 0);

  const args = '{"city": "Oslo"}}\n</tool_call>';
  messages = [{ role: 'user', content: args }];
  ({ srv, client } = await serveAnswering(messages, args, '<tool_call>\n{"name": "get_weather", "arguments": '));
  const named = await client.chat.completions.create({
    model: 'copy', messages, tools, temperature: 0, max_tokens: 64,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
  });
  assert.equal(named.choices[0].finish_reason, 'tool_calls');
  assert.deepEqual(JSON.parse(named.choices[0].message.tool_calls[0].function.arguments), { city: 'Oslo' });
  const bad = await raw(srv.base, '/v1/chat/completions', {
    body: JSON.stringify({ messages, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
  });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'tool_choice');
  assert.equal((await srv.stop()).code, 0);

  const two = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call>';
  messages = [{ role: 'user', content: two }];
  ({ srv, client } = await serveAnswering(messages, two));
  const both = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 96 });
  assert.equal(both.choices[0].message.tool_calls.length, 2);
  const first = await client.chat.completions.create({ model: 'copy', messages, tools, temperature: 0, max_tokens: 96, parallel_tool_calls: false });
  assert.equal(first.choices[0].message.tool_calls.length, 1);
  assert.deepEqual(JSON.parse(first.choices[0].message.tool_calls[0].function.arguments), { city: 'Rome' });
  assert.equal((await srv.stop()).code, 0);
});
