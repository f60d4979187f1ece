// The Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// end to end, driven by the official `@anthropic-ai/sdk` client unchanged:
// the same greedy reply as the chat route, the stream's events in their
// order, count_tokens, stop sequences, a forced tool call and its result fed
// back (through a Hermes-style template: see serve_tools.test.mjs), and bad
// bodies answered in Anthropic's error shape.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, raw } from './harness.mjs';
import { withCopyModel } from './copy_model.mjs';

let srv, client, openai;

before(async () => {
  srv = await startServer();
  client = new Anthropic({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
  openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
});

const system = 'You tell fortunes.';
const messages = [{ role: 'user', content: 'Tell me a fortune.' }];
const ask = (extra = {}) => ({ model: 'fortune', system, messages, max_tokens: 32, temperature: 0, ...extra });

const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

test('messages.create: the chat route\'s greedy text, in a message with usage', async () => {
  const m = await client.messages.create(ask());
  const chat = await openai.chat.completions.create({
    model: 'fortune', messages: [{ role: 'system', content: system }, ...messages], max_tokens: 32, temperature: 0,
  });
  assert.match(m.id, /^msg_/);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.model, 'fortune');
  assert.ok(textOf(m).length > 0);
  assert.equal(textOf(m), chat.choices[0].message.content);
  assert.equal(m.stop_reason, chat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  assert.equal(m.stop_sequence, null);
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
  assert.equal(m.usage.output_tokens, chat.usage.completion_tokens);
  // max_tokens far past the context is cut to what it leaves, not refused
  const big = await client.messages.create(ask({ max_tokens: 1000000 }));
  assert.ok(['end_turn', 'max_tokens'].includes(big.stop_reason));
  // the query string Claude Code adds is ignored; billing headers and cache_control leave the prompt as it was
  const cc = await raw(srv.base, '/v1/messages?beta=true', {
    headers: { 'anthropic-version': '2023-06-01', 'anthropic-beta': 'x', 'x-api-key': 'k' },
    body: JSON.stringify(ask({
      system: [{ type: 'text', text: 'x-anthropic-billing-header: cc_version=2.0; cch=1' },
               { type: 'text', text: system, cache_control: { type: 'ephemeral' } }],
      metadata: { user_id: 'u' }, service_tier: 'auto', thinking: { type: 'disabled' },
    })),
  });
  assert.equal(cc.status, 200, cc.text);
  assert.equal(textOf(cc.json), textOf(m));
  assert.equal(cc.json.usage.input_tokens + cc.json.usage.cache_read_input_tokens, chat.usage.prompt_tokens);
});

test('messages.stream: events in order, the same text as not streamed', async () => {
  const whole = await client.messages.create(ask());
  const stream = client.messages.stream(ask());
  const events = [];
  for await (const ev of stream) events.push(ev);
  const final = await stream.finalMessage();
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'message_start');
  assert.equal(events[0].message.role, 'assistant');
  assert.match(events[0].message.id, /^msg_/);
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
  let open = -1, next = 0, text = '';
  for (const e of events.slice(1, -2)) { // per block: start, deltas, stop
    if (e.type === 'content_block_start') {
      assert.equal(open, -1);
      assert.equal(e.index, next);
      open = e.index;
    } else if (e.type === 'content_block_delta') {
      assert.equal(e.index, open);
      if (e.delta.type === 'text_delta') text += e.delta.text;
    } else {
      assert.equal(e.type, 'content_block_stop');
      assert.equal(e.index, open);
      open = -1;
      next++;
    }
  }
  assert.equal(open, -1);
  assert.ok(next >= 1);
  assert.equal(text, textOf(whole));
  assert.equal(textOf(final), textOf(whole));
  assert.equal(events.at(-2).delta.stop_reason, whole.stop_reason);
  assert.equal(events.at(-2).usage.output_tokens, whole.usage.output_tokens);
  // on the wire: "event: NAME\ndata: {...}\n\n", the name matching the data's type
  const r = await raw(srv.base, '/v1/messages', { body: JSON.stringify(ask({ stream: true })) });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const frames = r.text.split('\n\n').filter((f) => f.length);
  assert.ok(frames.length >= 5);
  for (const f of frames) {
    const m = f.match(/^event: (\w+)\ndata: (.*)$/s);
    assert.ok(m, `frame: ${JSON.stringify(f)}`);
    assert.equal(JSON.parse(m[2]).type, m[1]);
  }
});

test('messages.countTokens: the prompt\'s tokens, no generation', async () => {
  const n = await client.messages.countTokens({ model: 'fortune', system, messages });
  const m = await client.messages.create(ask());
  assert.equal(n.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  const longer = await client.messages.countTokens({
    model: 'fortune', system, messages: [...messages, { role: 'assistant', content: 'Soon.' }, { role: 'user', content: 'When?' }],
  });
  assert.ok(longer.input_tokens > n.input_tokens);
  // a deferred tool (Claude Code's DeferredToolPlaceholder) stays out of the prompt
  const tool = { name: 'w', description: 'Weather.', input_schema: { type: 'object', properties: {} } };
  const one = await client.messages.countTokens({ model: 'fortune', system, messages, tools: [tool] });
  const two = await client.messages.countTokens({ model: 'fortune', system, messages,
    tools: [tool, { ...tool, name: 'later', defer_loading: true }] });
  assert.equal(two.input_tokens, one.input_tokens);
  // a prompt longer than the context (2048) is counted, not refused: a count is no generation, and an agent asks
  // it to learn how far over it is; a generation of it is still a 400
  const huge = [{ role: 'user', content: 'Tell me a fortune. '.repeat(1500) }];
  const over = await client.messages.countTokens({ model: 'fortune', system, messages: huge });
  assert.ok(over.input_tokens > 2048, String(over.input_tokens));
  // in Anthropic's words, which Claude Code parses
  await assert.rejects(client.messages.create(ask({ messages: huge })), (e) => e.status === 400 &&
    e.error?.error?.message === `prompt is too long: ${over.input_tokens} tokens > 2047 maximum`);
  assert.equal((await raw(srv.base, '/health', { method: 'GET' })).status, 200);
});

test('stop_sequences: stop_reason stop_sequence, the text cut before it', async () => {
  const whole = textOf(await client.messages.create(ask()));
  assert.ok(whole.length > 8, whole);
  const stop = whole.slice(4, 7);
  const want = whole.slice(0, whole.indexOf(stop));
  const m = await client.messages.create(ask({ stop_sequences: ['never-there', stop] }));
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(textOf(m), want);
  const s = client.messages.stream(ask({ stop_sequences: [stop] }));
  const final = await s.finalMessage();
  assert.equal(final.stop_reason, 'stop_sequence');
  assert.equal(final.stop_sequence, stop);
  assert.equal(textOf(final), want);
  const none = await client.messages.create(ask({ stop_sequences: ['never-there'] }));
  assert.notEqual(none.stop_reason, 'stop_sequence');
  assert.equal(none.stop_sequence, null);
});

test('bad bodies: a 400 in Anthropic\'s error shape', async () => {
  const bodies = [
    ['{"messages": [', 'malformed JSON'],
    ['[1]', 'JSON object'],
    [JSON.stringify({ model: 'fortune', messages }), 'max_tokens'],
    [JSON.stringify(ask({ frequency_penalty: 1 })), 'frequency_penalty'],
    [JSON.stringify(ask({ messages: [] })), 'messages'],
    [JSON.stringify(ask({ messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] })), 'image'],
    [JSON.stringify(ask({ messages: [{ role: 'user', content: [{ type: 'document', source: { type: 'text', media_type: 'text/plain', data: 'x' } }] }] })), 'document'],
    [JSON.stringify(ask({ temperature: 'hot' })), 'temperature'],
    [JSON.stringify(ask({ tool_choice: { type: 'tool', name: 'x' } })), 'tool_choice'],
  ];
  for (const [body, says] of bodies) {
    const r = await raw(srv.base, '/v1/messages', { body });
    assert.equal(r.status, 400, body);
    assert.equal(r.json.type, 'error', body);
    assert.equal(r.json.error.type, 'invalid_request_error', body);
    assert.ok(r.json.error.message.includes(says), `${body}: ${r.json.error.message}`);
  }
  await assert.rejects(client.messages.create(ask({ messages: [{ role: 'tool', content: 'x' }] })),
    (e) => e.status === 400 && e.error?.type === 'error' && e.error?.error?.type === 'invalid_request_error');
  const c = await raw(srv.base, '/v1/messages/count_tokens', { body: JSON.stringify({ messages: 'x' }) });
  assert.equal(c.status, 400);
  assert.equal(c.json.error.type, 'invalid_request_error');
});

// A copy model (copy_model.mjs) through a Hermes-style template: it writes what the test placed in its prompt.
const schema = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };
const chatTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: schema } }];
const tools = [{ name: 'get_weather', description: 'Weather in a city', input_schema: schema }];

const withCopy = (chatMessages, answer, forced, body) =>
  withCopyModel(chatMessages, chatTools, answer, forced, (s) =>
    body(s, new Anthropic({ baseURL: s.base, apiKey: 'unused', maxRetries: 0 })));

test('a forced tool call (tool_choice: tool) and its result fed back', async () => {
  // the model writes the call's arguments after the forced opening
  const args = '{"city": "Oslo"}}\n</tool_call>';
  const chatMessages = [{ role: 'user', content: args }];
  let use;
  await withCopy(chatMessages, args, '<tool_call>\n{"name": "get_weather", "arguments": ', async (s, c) => {
    const req = { model: 'copy', max_tokens: 64, temperature: 0, tools, messages: chatMessages,
                  tool_choice: { type: 'tool', name: 'get_weather' } };
    const m = await c.messages.create(req);
    assert.equal(m.stop_reason, 'tool_use');
    use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m));
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, 'get_weather');
    assert.deepEqual(use.input, { city: 'Oslo' });
    const streamed = await c.messages.stream(req).finalMessage(); // input_json_delta, put together by the SDK
    assert.equal(streamed.stop_reason, 'tool_use');
    assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, { city: 'Oslo' });
    const auto = await c.messages.create({ ...req, tool_choice: { type: 'auto' }, max_tokens: 16 });
    assert.equal(auto.content.find((b) => b.type === 'tool_use'), undefined);
  });
  // the result goes back: the next turn's prompt is the chat route's for the same conversation, so the copy
  // model placed there repeats the tool's answer (a stop sequence cuts the template's closing tag)
  const answer = 'Sunny, 18 C';
  const turn2 = [{ role: 'user', content: args },
    { role: 'assistant', content: [{ type: 'tool_use', id: use.id, name: 'get_weather', input: { city: 'Oslo' } }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: answer }] }] }];
  const chatTurn2 = [{ role: 'user', content: args },
    { role: 'assistant', content: null, tool_calls: [{ id: use.id, type: 'function', function: { name: 'get_weather', arguments: '{"city": "Oslo"}' } }] },
    { role: 'tool', tool_call_id: use.id, content: answer }];
  await withCopy(chatTurn2, answer, '', async (s, c) => {
    const r = await c.messages.create({ model: 'copy', max_tokens: 64, temperature: 0, tools, messages: turn2,
                                        stop_sequences: ['\n</tool_response>'] });
    assert.equal(textOf(r), answer);
    assert.equal(r.stop_reason, 'stop_sequence');
    assert.equal(r.stop_sequence, '\n</tool_response>');
    const n = await c.messages.countTokens({ model: 'copy', tools, messages: turn2 });
    assert.equal(r.usage.input_tokens + r.usage.cache_read_input_tokens, n.input_tokens);
    const e = await c.messages.create({ model: 'copy', max_tokens: 8, tools, messages: [...turn2.slice(0, 2),
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'no such city', is_error: true }] }] });
    assert.equal(e.type, 'message');
  });
});

test('thinking: the model\'s reasoning as a thinking block with its signature, streamed and not', async () => {
  const text = '<think>\nThe user wants a greeting.\n</think>\n\nHello there!';
  const chatMessages = [{ role: 'user', content: text }];
  await withCopy(chatMessages, text, '', async (s, c) => {
    const req = { model: 'copy', max_tokens: 64, temperature: 0, tools, messages: chatMessages };
    const m = await c.messages.create(req);
    assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(m.content[0].thinking, 'The user wants a greeting.');
    assert.equal(typeof m.content[0].signature, 'string');
    assert.equal(m.content[1].text, 'Hello there!');
    const events = [];
    for await (const ev of c.messages.stream(req)) events.push(ev);
    const deltas = events.filter((e) => e.type === 'content_block_delta');
    assert.equal(deltas.filter((e) => e.index === 0 && e.delta.type === 'thinking_delta').map((e) => e.delta.thinking).join(''),
      'The user wants a greeting.');
    assert.ok(deltas.some((e) => e.index === 0 && e.delta.type === 'signature_delta'));
    assert.equal(deltas.filter((e) => e.index === 1).map((e) => e.delta.text).join(''), 'Hello there!');
  });
});

test('refusals at the head in Anthropic\'s shape: the key (x-api-key or Bearer), the method, the size', async () => {
  const s = await startServer(['--api-key', 'sekrit', '--max-body', '2000']);
  try {
    const body = JSON.stringify(ask({ max_tokens: 2 }));
    const none = await raw(s.base, '/v1/messages', { body });
    assert.equal(none.status, 401);
    assert.deepEqual([none.json.type, none.json.error.type], ['error', 'authentication_error']);
    assert.equal((await raw(s.base, '/v1/messages?beta=true', { body, headers: { 'x-api-key': 'sekrit' } })).status, 200);
    assert.equal((await raw(s.base, '/v1/messages', { body, headers: { authorization: 'Bearer sekrit' } })).status, 200);
    const c = new Anthropic({ baseURL: s.base, apiKey: 'sekrit', maxRetries: 0 });
    assert.equal((await c.messages.create(ask({ max_tokens: 2 }))).type, 'message');
    await assert.rejects(new Anthropic({ baseURL: s.base, apiKey: 'wrong', maxRetries: 0 }).messages.create(ask()),
      (e) => e.status === 401 && e.error?.error?.type === 'authentication_error');
    const get = await raw(s.base, '/v1/messages', { method: 'GET', headers: { 'x-api-key': 'sekrit' } });
    assert.equal(get.status, 405);
    assert.equal(get.json.error.type, 'invalid_request_error');
    const big = await raw(s.base, '/v1/messages', { body: JSON.stringify(ask({ system: 'x'.repeat(3000) })), headers: { 'x-api-key': 'sekrit' } });
    assert.equal(big.status, 413);
    assert.equal(big.json.error.type, 'request_too_large');
    // the chat route keeps OpenAI's shape
    const chat = await raw(s.base, '/v1/chat/completions', { body });
    assert.equal(chat.status, 401);
    assert.equal(typeof chat.json.error.code, 'number');
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});

test('a stream waiting in the queue gets ping events', async (t) => {
  // one row, keep-alives every quarter of a 1 s --timeout: a stream queued behind a long reply waits silent
  const s = await startServer(['--parallel', '1', '--timeout', '1']);
  try {
    const long = raw(s.base, '/v1/chat/completions', {
      body: JSON.stringify({ messages, max_tokens: 150, temperature: 0, logit_bias: { 1: -100, 4: -100 } }),
    });
    await new Promise((res) => setTimeout(res, 50));
    const t0 = Date.now();
    const r = await raw(s.base, '/v1/messages', { body: JSON.stringify(ask({ stream: true, max_tokens: 4 })) });
    const waited = Date.now() - t0;
    assert.equal((await long).status, 200);
    assert.equal(r.status, 200);
    const names = [...r.text.matchAll(/^event: (\w+)$/gm)].map((m) => m[1]);
    assert.equal(names[0], 'message_start');
    assert.equal(names.at(-1), 'message_stop');
    // a fast device may answer the long reply before a keep-alive is due: then there is nothing to check
    if (waited > 400) assert.ok(names.includes('ping'), `${waited} ms without a ping: ${names}`);
    else t.diagnostic(`the stream waited only ${waited} ms: no ping was due`);
    assert.ok(!r.text.includes(': keep-alive'));
  } finally {
    assert.equal((await s.stop()).code, 0);
  }
});
