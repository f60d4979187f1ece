// osprey serve end to end, per-server settings: tools through a template,
// the API key, CORS origins, draining on SIGTERM, the loading phase.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, ROOT } from './harness.mjs';

const ask = (content, extra = {}) => ({ model: 'fortune', messages: [{ role: 'user', content }], temperature: 0, max_tokens: 16, ...extra });

test('tools: a tool call and its result go through the template; the answer is served', async () => {
  const srv = await startServer(['--chat-template', path.join(ROOT, 'tests', 'e2e', 'tools_template.jinja')]);
  const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temperature": 18}' },
  ];
  const tpl = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages, tools }) });
  assert.equal(tpl.status, 200, tpl.text);
  assert.ok(tpl.json.prompt.includes('"name": "get_weather"'), tpl.json.prompt);
  assert.ok(tpl.json.prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'), tpl.json.prompt);
  assert.ok(tpl.json.prompt.includes('<tool_response>\n{"temperature": 18}\n</tool_response>'), tpl.json.prompt);
  const r = await client.chat.completions.create({ model: 'fortune', messages, tools, temperature: 0, max_tokens: 16 });
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  // tool_choice "none" renders without the tools
  const none = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages: messages.slice(0, 1), tools, tool_choice: 'none' }) });
  assert.ok(!none.json.prompt.includes('get_weather'));
  assert.equal((await srv.stop()).code, 0);
});

test('--api-key: 401 without or with a wrong key, served with the right one; /health stays public', async () => {
  const srv = await startServer(['--api-key', 'sekrit']);
  const bad = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create(ask('hi')), (e) => e.status === 401);
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
  const none = await raw(srv.base, '/v1/chat/completions', { body: JSON.stringify(ask('hi')) });
  assert.equal(none.status, 401);
  assert.equal(none.json.error.type, 'authentication_error');
  const good = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'sekrit', maxRetries: 0 });
  const r = await good.chat.completions.create(ask('hi'));
  assert.ok(r.choices[0].message.content.length > 0);
  assert.equal((await raw(srv.base, '/health', { method: 'GET' })).status, 200);
  assert.equal((await srv.stop()).code, 0);
});

test('--allowed-origins: only the listed origins get CORS headers', async () => {
  const srv = await startServer(['--allowed-origins', 'http://good.example, http://also.example']);
  const hdr = async (origin) => (await fetch(`${srv.base}/v1/models`, { headers: { Origin: origin } })).headers.get('access-control-allow-origin');
  assert.equal(await hdr('http://good.example'), 'http://good.example');
  assert.equal(await hdr('http://also.example'), 'http://also.example');
  assert.equal(await hdr('http://evil.example'), null);
  assert.equal((await srv.stop()).code, 0);
});

test('SIGTERM drains: the running request completes, then a clean exit', async () => {
  const srv = await startServer();
  const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  const p = client.chat.completions.create(ask('Tell me a fortune.', { max_tokens: 200, logit_bias: { 1: -100, 4: -100 } }));
  await new Promise((res) => setTimeout(res, 150));
  const stopped = srv.stop();
  const r = await p;
  assert.equal(r.usage.completion_tokens, 200);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal((await stopped).code, 0);
});

test('a model that cannot be loaded: a clear error and a non-zero exit', async () => {
  await assert.rejects(startServer([], { model: path.join(ROOT, 'no-such-model') }), /exited \(1\)/);
});
