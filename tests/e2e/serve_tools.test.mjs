// Tool calls and reasoning as a model writes them, end to end: a "copy"
// model (copy_model.mjs) answers with a text placed in the prompt, through a
// Hermes-style (Qwen) template over the bundled model's tokenizer, so the
// server must parse what the model wrote into tool_calls / reasoning_content,
// streamed and not, and take the tool result back for the next turn.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, ROOT, MODEL } from './harness.mjs';
import { buildCopyModel } from './copy_model.mjs';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'osp-copy-model-'));
after(() => fs.rmSync(dir, { recursive: true, force: true }));
for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(MODEL, f), path.join(dir, f));
fs.copyFileSync(path.join(ROOT, 'tests', 'e2e', 'tools_template.jinja'), path.join(dir, 'chat_template.jinja'));
const fortuneCfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
const shape = { vocab: fortuneCfg.vocab_size, bos: fortuneCfg.bos_token_id, eos: fortuneCfg.eos_token_id };

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

// Serve a copy model that answers `answer` to the conversation `messages`.
async function serveAnswering(messages, answer) {
  buildCopyModel(dir, { d: 2, ...shape }); // placeholder weights: the period comes next
  let srv = await startServer([], { model: dir });
  const tpl = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages, tools }) });
  const prompt = (await raw(srv.base, '/tokenize', { body: JSON.stringify({ content: tpl.json.prompt }) })).json.tokens;
  const ans = (await raw(srv.base, '/tokenize', { body: JSON.stringify({ content: answer }) })).json.tokens;
  assert.equal((await srv.stop()).code, 0);
  let at = -1;
  for (let i = prompt.length - ans.length; i >= 0 && at < 0; i--) if (ans.every((t, k) => prompt[i + k] === t)) at = i;
  assert.ok(at >= 0, 'the answer is not tokenized the same inside the prompt');
  buildCopyModel(dir, { d: prompt.length - at, ...shape });
  srv = await startServer([], { model: dir });
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
