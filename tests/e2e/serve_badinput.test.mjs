// Hostile and malformed requests: each gets a 4xx in OpenAI's error shape,
// and the server keeps serving (health and a real answer afterwards).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, raw } from './harness.mjs';

let srv;
before(async () => {
  srv = await startServer(['-c', '512']);
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, srv.log());
});

const chat = (extra) => JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0, ...extra });

const cases = [
  ['truncated JSON', '/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"'],
  ['empty body', '/v1/chat/completions', ''],
  ['a JSON array, not an object', '/v1/chat/completions', '[1, 2, 3]'],
  ['the literal null', '/v1/chat/completions', 'null'],
  ['10,000-deep nesting', '/v1/chat/completions', '['.repeat(10000) + ']'.repeat(10000)],
  ['10,000-deep nesting inside a field', '/v1/chat/completions', '{"messages": ' + '{"a":'.repeat(10000) + '1' + '}'.repeat(10000) + '}'],
  ['invalid UTF-8 in a string', '/v1/chat/completions', Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')])],
  ['an unpaired surrogate escape', '/v1/chat/completions', '{"messages":[{"role":"user","content":"\\ud800"}]}'],
  ['duplicate keys', '/v1/chat/completions', '{"messages": [], "messages": []}'],
  ['negative max_tokens', '/v1/chat/completions', chat({ max_tokens: -5 })],
  ['zero max_tokens', '/v1/chat/completions', chat({ max_tokens: 0 })],
  ['max_tokens as a string', '/v1/chat/completions', chat({ max_tokens: '12' })],
  ['max_tokens beyond the context', '/v1/chat/completions', chat({ max_tokens: 5000 })],
  ['a prompt longer than the context', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'fortune '.repeat(2000) }] })],
  ['huge logit_bias (value)', '/v1/chat/completions', chat({ logit_bias: { 5: 1e308 } })],
  ['huge logit_bias (100,000 entries)', '/v1/chat/completions', chat({ logit_bias: Object.fromEntries(Array.from({ length: 100000 }, (_, i) => [String(i), 1])) })],
  ['logit_bias with a non-numeric key', '/v1/chat/completions', chat({ logit_bias: { abc: 1 } })],
  ['logit_bias token out of range', '/v1/chat/completions', chat({ logit_bias: { 999999: 1 } })],
  ['temperature negative', '/v1/chat/completions', chat({ temperature: -1 })],
  ['top_p above 1', '/v1/chat/completions', chat({ top_p: 1.5 })],
  ['top_logprobs above 20', '/v1/chat/completions', chat({ logprobs: true, top_logprobs: 50 })],
  ['stop as a number', '/v1/chat/completions', chat({ stop: 42 })],
  ['stream as a string', '/v1/chat/completions', chat({ stream: 'yes' })],
  ['n = 3', '/v1/chat/completions', chat({ n: 3 })],
  ['messages not a list', '/v1/chat/completions', JSON.stringify({ messages: 'hi' })],
  ['empty messages', '/v1/chat/completions', JSON.stringify({ messages: [] })],
  ['a message without a role', '/v1/chat/completions', JSON.stringify({ messages: [{ content: 'hi' }] })],
  ['content of the wrong type', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 42 }] })],
  ['an image part', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'data:,' } }] }] })],
  ['a template error (roles out of order)', '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'assistant', content: 'a' }, { role: 'assistant', content: 'b' }] })],
  ['tools not a list', '/v1/chat/completions', chat({ tools: 'get_weather' })],
  ['response_format json_schema', '/v1/chat/completions', chat({ response_format: { type: 'json_schema' } })],
  ['completions: prompt missing', '/v1/completions', JSON.stringify({ max_tokens: 4 })],
  ['completions: token id out of range', '/v1/completions', JSON.stringify({ prompt: [1, 2, 999999], max_tokens: 4 })],
  ['completions: two prompts', '/v1/completions', JSON.stringify({ prompt: ['a', 'b'], max_tokens: 4 })],
  ['completions: logprobs as a boolean', '/v1/completions', JSON.stringify({ prompt: 'a', logprobs: true })],
  ['tokenize: content missing', '/tokenize', '{}'],
  ['detokenize: ids out of range', '/detokenize', JSON.stringify({ tokens: [-1, 5] })],
];

for (const [name, route, body] of cases) {
  test(`bad input: ${name} → 4xx, and the server keeps serving`, async () => {
    const r = await raw(srv.base, route, { body });
    assert.ok(r.status >= 400 && r.status < 500, `status ${r.status}: ${r.text.slice(0, 300)}`);
    assert.equal(typeof r.json?.error?.message, 'string', r.text.slice(0, 300));
    assert.equal(r.json.error.code, r.status);
    const h = await raw(srv.base, '/health', { method: 'GET' });
    assert.equal(h.status, 200);
  });
}

test('bad input: a 10 MB body gets a 413', async () => {
  const r = await raw(srv.base, '/v1/chat/completions', { body: '{"messages": "' + 'a'.repeat(10 << 20) + '"}' });
  assert.equal(r.status, 413);
  assert.equal(r.json.error.code, 413);
});

test('bad input: a chunked 10 MB body (no Content-Length) gets a 413', async () => {
  const stream = new ReadableStream({
    start(c) {
      for (let i = 0; i < 10; i++) c.enqueue(new TextEncoder().encode('a'.repeat(1 << 20)));
      c.close();
    },
  });
  const r = await fetch(`${srv.base}/v1/chat/completions`, { method: 'POST', body: stream, duplex: 'half', headers: { 'content-type': 'application/json' } });
  assert.equal(r.status, 413);
});

test('bad input: a connection that sends half a request and hangs up', async () => {
  await new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1', () => {
      s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"messages":');
      setTimeout(() => s.destroy(), 50);
    });
    s.on('close', resolve);
    s.on('error', resolve);
  });
  const h = await raw(srv.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
});

test('bad input: garbage instead of HTTP', async () => {
  await new Promise((resolve) => {
    const s = net.connect(srv.port, '127.0.0.1', () => s.write('\x00\x01\x02 not http at all\r\n\r\n'));
    s.on('data', () => s.destroy());
    s.on('close', resolve);
    s.on('error', resolve);
    setTimeout(() => s.destroy(), 500);
  });
  assert.equal((await raw(srv.base, '/health', { method: 'GET' })).status, 200);
});

test('after all of it, a real request is answered', async () => {
  const r = await raw(srv.base, '/v1/chat/completions', { body: chat({ max_tokens: 8 }) });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.role, 'assistant');
});
