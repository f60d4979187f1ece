// The OpenAI Responses API (POST /v1/responses, GET and DELETE
// /v1/responses/{id}) end to end, driven by the official `openai` client's
// `responses` resource: the chat route's greedy text, the stream's events in
// their order, the store (retrieve, delete, previous_response_id reusing the
// prefix cache, a restart), a function call and its output fed back and
// reasoning (through a copy model: see copy_model.mjs), hosted tools left
// out and counted, and bad bodies each a 400.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, raw } from './harness.mjs';
import fs from 'node:fs';
import { withCopyModel, copyModelDir, buildCopyModel } from './copy_model.mjs';

let srv, client;

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
});

const instructions = 'You tell fortunes.';
// the SDK adds output_text (the text joined) to what it returns
const stored = ({ output_text, ...o }) => o; // eslint-disable-line no-unused-vars
const ask = (extra = {}) => ({ model: 'fortune', instructions, input: 'Tell me a fortune.', max_output_tokens: 32,
                               temperature: 0, ...extra });

test('responses.create: the chat route\'s greedy text, with usage', async () => {
  const r = await client.responses.create(ask());
  const chat = await client.chat.completions.create({
    model: 'fortune', max_tokens: 32, temperature: 0,
    messages: [{ role: 'system', content: instructions }, { role: 'user', content: 'Tell me a fortune.' }],
  });
  assert.match(r.id, /^resp_/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, 'fortune');
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output_text, chat.choices[0].message.content);
  assert.equal(r.status, chat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.output[0].status, r.status);
  const msg = r.output[0];
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.deepEqual(msg.content[0].annotations, []);
  assert.equal(r.usage.input_tokens, chat.usage.prompt_tokens);
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(typeof r.usage.input_tokens_details.cached_tokens, 'number');
  assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0);
  assert.equal(r.instructions, instructions);
  assert.equal(r.store, true);
  // items: a developer message becomes a system message; input_text parts
  const items = await client.responses.create(ask({ instructions: undefined, input: [
    { type: 'message', role: 'developer', content: instructions },
    { role: 'user', content: [{ type: 'input_text', text: 'Tell me a fortune.' }] }] }));
  assert.equal(items.output_text, r.output_text);
  // logprobs when asked
  const lp = await client.responses.create(ask({ include: ['message.output_text.logprobs'], top_logprobs: 2,
                                                 max_output_tokens: 4 }));
  const lps = lp.output[0].content[0].logprobs;
  assert.equal(lps.length, 4);
  assert.equal(lps[0].top_logprobs.length, 2);
  // hints accepted without effect
  const hints = await client.responses.create(ask({ prompt_cache_key: 'k', truncation: 'auto', metadata: { a: 'b' },
    user: 'u', service_tier: 'auto', store: false, parallel_tool_calls: false, text: { format: { type: 'text' } },
    reasoning: { effort: 'low', summary: 'auto' }, include: ['reasoning.encrypted_content'] }));
  assert.equal(hints.output_text, r.output_text);
  assert.equal(hints.store, false);
  await assert.rejects(client.responses.retrieve(hints.id), (e) => e.status === 404);
});

test('streaming: every event in order with its sequence number; the same text as without', async () => {
  const plain = await client.responses.create(ask());
  const events = [];
  for await (const ev of await client.responses.create(ask({ stream: true }))) events.push(ev);
  events.forEach((e, i) => assert.equal(e.sequence_number, i));
  const types = events.map((e) => e.type);
  const deltas = types.filter((t) => t === 'response.output_text.delta').length;
  assert.ok(deltas > 0);
  const end = plain.status === 'completed' ? 'response.completed' : 'response.incomplete';
  assert.deepEqual(types, ['response.created', 'response.in_progress', 'response.output_item.added',
    'response.content_part.added', ...Array(deltas).fill('response.output_text.delta'), 'response.output_text.done',
    'response.content_part.done', 'response.output_item.done', end]);
  assert.equal(events[0].response.status, 'in_progress');
  assert.equal(events[1].response.id, events[0].response.id);
  const item = events[2].item;
  assert.equal(item.type, 'message');
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  assert.equal(text, plain.output_text);
  for (const e of events.slice(2, -1)) assert.equal(e.output_index, 0);
  for (const e of events.filter((e) => e.item_id)) assert.equal(e.item_id, item.id);
  assert.equal(events.at(-4).text, text);
  assert.equal(events.at(-2).item.content[0].text, text);
  const last = events.at(-1).response;
  assert.equal(last.status, plain.status);
  assert.equal(last.output[0].content[0].text, text);
  assert.equal(last.usage.output_tokens, plain.usage.output_tokens);
  // the stored object is the final one
  assert.deepEqual(stored(await client.responses.retrieve(last.id)), last);
});

test('the store: retrieve, delete (404 after), previous_response_id reusing the prefix cache', async () => {
  const first = await client.responses.create(ask());
  const got = await client.responses.retrieve(first.id);
  assert.deepEqual(stored(got), stored(first));
  // instructions are not carried over (as OpenAI's): sent again, the prompt starts with the first turn's
  const second = await client.responses.create({ model: 'fortune', instructions, input: 'Another one.',
                                                 max_output_tokens: 16, temperature: 0, previous_response_id: first.id });
  assert.equal(second.previous_response_id, first.id);
  assert.ok(second.usage.input_tokens_details.cached_tokens > 0, JSON.stringify(second.usage));
  // the same conversation sent whole renders the same prompt
  const whole = await client.responses.create({ model: 'fortune', instructions, max_output_tokens: 16, temperature: 0, input: [
    { role: 'user', content: 'Tell me a fortune.' }, { role: 'assistant', content: first.output_text },
    { role: 'user', content: 'Another one.' }] });
  assert.equal(whole.usage.input_tokens, second.usage.input_tokens);
  assert.equal(whole.output_text, second.output_text);
  const del = await client.responses.delete(first.id);
  assert.deepEqual(del, { id: first.id, object: 'response.deleted', deleted: true });
  await assert.rejects(client.responses.retrieve(first.id), (e) => e.status === 404);
  await assert.rejects(client.responses.delete(first.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create(ask({ previous_response_id: first.id })),
    (e) => e.status === 404 && e.error?.param === 'previous_response_id');
  await assert.rejects(client.responses.retrieve('resp_nope'), (e) => e.status === 404 && /not found/.test(e.message));
  const s = await raw(srv.base, '/stats', { method: 'GET' });
  assert.ok(s.json.routes.responses >= 8);
});

test('the store survives a restart beside the prefix cache\'s files; --responses-store-size 0 stores nothing', async () => {
  const s1 = await startServer();
  const c1 = new OpenAI({ baseURL: `${s1.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const first = await c1.responses.create(ask());
  assert.equal((await s1.stop()).code, 0);
  const s2 = await startServer();
  try {
    const c2 = new OpenAI({ baseURL: `${s2.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    assert.deepEqual(stored(await c2.responses.retrieve(first.id)), stored(first));
    const next = await c2.responses.create({ model: 'fortune', instructions, input: 'More.', max_output_tokens: 4,
                                             previous_response_id: first.id });
    assert.ok(next.usage.input_tokens_details.cached_tokens > 0);
  } finally {
    assert.equal((await s2.stop()).code, 0);
  }
  const s3 = await startServer(['--responses-store-size', '0']);
  try {
    const c3 = new OpenAI({ baseURL: `${s3.base}/v1`, apiKey: 'unused', maxRetries: 0 });
    const r = await c3.responses.create(ask({ max_output_tokens: 4 }));
    await assert.rejects(c3.responses.retrieve(r.id), (e) => e.status === 404);
  } finally {
    assert.equal((await s3.stop()).code, 0);
  }
});

test('hosted tools (web_search, namespace) are left out of the prompt and counted', async () => {
  const before = await raw(srv.base, '/metrics', { method: 'GET' });
  const count = (t) => Number(/osprey_responses_tools_dropped_total (\d+)/.exec(t)[1]);
  // as Codex sends them: beside tool_choice "auto", which then has nothing to choose from
  const r = await client.responses.create(ask({ tools: [{ type: 'web_search' },
    { type: 'namespace', name: 'mcp__x', tools: [] }], tool_choice: 'auto' }));
  const plain = await client.responses.create(ask());
  assert.equal(r.output_text, plain.output_text);
  assert.equal(r.usage.input_tokens, plain.usage.input_tokens);
  const afterM = await raw(srv.base, '/metrics', { method: 'GET' });
  assert.equal(count(afterM.text) - count(before.text), 2);
  assert.match(afterM.text, /osprey_route_requests_total\{route="responses"\} \d+/);
});

test('a Codex-shaped request: streamed, not stored, developer items, ~18 KB of tools, hints', async () => {
  const fn = (i) => ({ type: 'function', name: `tool_${i}`, description: `Tool ${i}. ${'Does a thing. '.repeat(40)}`,
    strict: false, parameters: { type: 'object', properties: { arg: { type: 'string', description: 'an argument' } },
                                 required: ['arg'], additionalProperties: false } });
  const tools = [...Array.from({ length: 24 }, (_, i) => fn(i)), { type: 'web_search' },
    { type: 'namespace', name: 'mcp__docs', description: 'MCP server', tools: [fn(99)] },
    { type: 'custom', name: 'apply_patch', description: 'Apply a patch', format: { type: 'grammar', syntax: 'lark', definition: 'start: "x"' } }];
  assert.ok(JSON.stringify(tools).length > 16000);
  const body = { model: 'gpt-5-codex', instructions, store: false, stream: true, tool_choice: 'auto',
    parallel_tool_calls: false, reasoning: { effort: 'medium', summary: 'auto' },
    include: ['reasoning.encrypted_content'], prompt_cache_key: 'thread-1', client_metadata: { originator: 'codex' },
    text: { verbosity: 'low' }, tools, max_output_tokens: 8,
    input: [{ type: 'message', role: 'developer', content: [{ type: 'input_text', text: '<permissions>none</permissions>' }] },
            { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Tell me a fortune.' }] }] };
  const events = [];
  for await (const ev of await client.responses.create(body)) events.push(ev);
  events.forEach((e, i) => { assert.equal(e.sequence_number, i); assert.equal(typeof e.type, 'string'); });
  assert.equal(events[0].type, 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type));
  const done = events.at(-1).response;
  assert.equal(done.store, false);
  assert.ok(done.usage.input_tokens > 0);
  await assert.rejects(client.responses.retrieve(done.id), (e) => e.status === 404);
});

test('bad bodies: each a 400 in OpenAI\'s error shape that says why', async () => {
  const bodies = [
    [{ input: 'x', bogus: 1 }, 'bogus'],
    [{}, 'input'],
    [{ input: [] }, 'input'],
    [{ input: 5 }, 'input'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:x' }] }] }, 'input_image'],
    [{ input: [{ role: 'robot', content: 'x' }] }, 'role'],
    [{ input: [{ type: 'function_call', name: 'f' }] }, 'call_id'],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'item_reference'],
    [{ input: 'x', text: { format: { type: 'json_schema', name: 's' } } }, 'json_schema'], // (no schema)
    [{ input: 'x', tools: [{ type: 'function' }] }, 'name'],
    [{ input: 'x', tools: [{ type: 'teleport' }] }, 'teleport'],
    [{ input: 'x', tool_choice: { type: 'web_search' } }, 'tool_choice'],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ input: 'x', temperature: 'hot' }, 'temperature'],
    [{ input: 'x', store: 'yes' }, 'store'],
    [{ input: 'x', reasoning: 'high' }, 'reasoning'],
  ];
  for (const [b, says] of bodies) {
    const r = await raw(srv.base, '/v1/responses', { body: JSON.stringify(b) });
    assert.equal(r.status, 400, JSON.stringify(b));
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.ok(r.json.error.message.includes(says), `${JSON.stringify(b)}: ${r.json.error.message}`);
  }
  const long = await raw(srv.base, '/v1/responses', { body: JSON.stringify({ input: 'word '.repeat(100000) }) });
  assert.equal(long.status, 400);
  assert.equal(long.json.error.code, 'context_length_exceeded');
  const m = await raw(srv.base, '/v1/responses/x', { method: 'PUT', body: '{}' });
  assert.equal(m.status, 405);
  // a browser's DELETE is allowed by the CORS preflight
  const pre = await raw(srv.base, '/v1/responses/x', { method: 'OPTIONS',
    headers: { Origin: 'http://example.com', 'Access-Control-Request-Method': 'DELETE' } });
  assert.match(pre.headers.get('access-control-allow-methods') ?? '', /DELETE/);
});

// A copy model (copy_model.mjs) through a Hermes-style template: it writes what the test placed in its prompt.
const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const chatTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: schema } }];
const tools = [{ type: 'function', name: 'get_weather', description: 'Weather in a city', parameters: schema, strict: true }];

const withCopy = (chatMessages, answer, forced, body) =>
  withCopyModel(chatMessages, chatTools, answer, forced, (s) =>
    body(s, new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0 })));

test('a function call (forced), streamed and not, and its output fed back as function_call_output', async () => {
  const args = '{"city": "Oslo"}}\n</tool_call>';
  let call;
  await withCopy([{ role: 'user', content: args }], args, '<tool_call>\n{"name": "get_weather", "arguments": ',
    async (s, c) => {
      const req = { model: 'copy', max_output_tokens: 64, temperature: 0, tools, input: args,
                    tool_choice: { type: 'function', name: 'get_weather' } };
      const r = await c.responses.create(req);
      call = r.output.find((o) => o.type === 'function_call');
      assert.ok(call, JSON.stringify(r));
      assert.equal(r.status, 'completed');
      assert.equal(call.name, 'get_weather');
      assert.deepEqual(JSON.parse(call.arguments), { city: 'Oslo' });
      assert.match(call.call_id, /^call_/);
      assert.match(call.id, /^fc_/);
      const events = [];
      for await (const ev of await c.responses.create({ ...req, stream: true })) events.push(ev);
      const types = events.map((e) => e.type);
      const i = types.indexOf('response.function_call_arguments.delta');
      assert.ok(i > 0, types.join());
      assert.deepEqual(types.slice(i - 1), ['response.output_item.added', 'response.function_call_arguments.delta',
        'response.function_call_arguments.done', 'response.output_item.done', 'response.completed']);
      assert.equal(events[i + 1].arguments, call.arguments);
      assert.equal(events.at(-1).response.output.find((o) => o.type === 'function_call').arguments, call.arguments);
    });
  // the output goes back: the prompt is the chat route's for the same conversation, so the copy model placed
  // there repeats the tool's answer (then the template's closing tag: no stop strings in this API)
  const answer = 'Sunny, 18 C';
  const chatTurn2 = [{ role: 'user', content: args },
    { role: 'assistant', content: null, tool_calls: [{ id: call.call_id, type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
    { role: 'tool', tool_call_id: call.call_id, content: answer }];
  await withCopy(chatTurn2, answer, '', async (s, c) => {
    const r = await c.responses.create({ model: 'copy', max_output_tokens: 6, temperature: 0, tools, input: [
      { role: 'user', content: args },
      { type: 'function_call', call_id: call.call_id, name: 'get_weather', arguments: '{"city": "Oslo"}' },
      { type: 'function_call_output', call_id: call.call_id, output: answer }] });
    assert.ok(r.output_text.startsWith(answer), r.output_text);
  });
});

test('reasoning: an item with its content and summary, streamed and not; replayed reasoning is accepted', async () => {
  const text = '<think>\nThe user wants a greeting.\n</think>\n\nHello there!';
  const chatMessages = [{ role: 'user', content: text }];
  await withCopy(chatMessages, text, '', async (s, c) => {
    const req = { model: 'copy', max_output_tokens: 64, temperature: 0, tools, input: text,
                  reasoning: { summary: 'auto' } };
    const r = await c.responses.create(req);
    assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(r.output[0].content[0].text, 'The user wants a greeting.');
    assert.equal(r.output[0].summary[0].text, 'The user wants a greeting.');
    assert.ok(r.output_text.startsWith('Hello there!'));
    const events = [];
    for await (const ev of await c.responses.create({ ...req, stream: true })) events.push(ev);
    const rt = events.filter((e) => e.type === 'response.reasoning_text.delta').map((e) => e.delta).join('');
    const st = events.filter((e) => e.type === 'response.reasoning_summary_text.delta').map((e) => e.delta).join('');
    assert.equal(rt, 'The user wants a greeting.');
    assert.equal(st, rt);
    assert.deepEqual(events.at(-1).response.output.map((o) => o.type), ['reasoning', 'message']);
    assert.equal(events.at(-1).response.output[1].content[0].text, r.output_text);
    const replay = await c.responses.create({ ...req, stream: false, input: [
      { role: 'user', content: 'hi' },
      { type: 'reasoning', id: 'rs_1', summary: [{ type: 'summary_text', text: 'x' }], encrypted_content: 'opaque' },
      { role: 'assistant', content: [{ type: 'output_text', text: 'Hello.' }] },
      { role: 'user', content: text }] });
    assert.equal(replay.object, 'response');
  });
});

test('no max_output_tokens: the reply runs to what the context leaves (Codex sends none), or to --max-tokens', async () => {
  // a copy model of period 3 repeats the prompt's last 3 tokens (no end of turn among them) for ever
  const { dir, shape } = copyModelDir();
  try {
    buildCopyModel(dir, { d: 3, ...shape });
    for (const [args, want] of [[['-c', '768'], (r) => 768 - r.usage.input_tokens], [['-c', '768', '--max-tokens', '40'], () => 40]]) {
      const s = await startServer(args, { model: dir });
      try {
        const c = new OpenAI({ baseURL: `${s.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
        const r = await c.responses.create({ model: 'copy', input: 'Go on.' });
        assert.equal(r.status, 'incomplete');
        assert.equal(r.incomplete_details.reason, 'max_output_tokens');
        assert.equal(r.usage.output_tokens, want(r));
      } finally {
        assert.equal((await s.stop()).code, 0);
      }
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
