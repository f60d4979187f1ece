// osprey serve end to end: the real binary on a free port, driven by the
// official `openai` npm client (and raw HTTP where the client cannot go).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, sseEvents, BIN, MODEL, ROOT } from './harness.mjs';

const NO_EOS = { 1: -100, 4: -100 }; // the bundled model's eos ids, biased away
let srv, client;

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
});

const ask = (content, extra = {}) => ({
  model: 'fortune',
  messages: [{ role: 'user', content }],
  temperature: 0,
  max_tokens: 32,
  ...extra,
});

async function collect(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('models and health', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, 'fortune');
  assert.equal(list.data[0].object, 'model');
  const h = await raw(srv.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
  assert.deepEqual(h.json, { status: 'ok' });
});

test('chat: non-streamed answer equals osprey generate (greedy), with usage', async () => {
  const r = await client.chat.completions.create(ask('Tell me a fortune.'));
  assert.equal(r.object, 'chat.completion');
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  assert.ok(m.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.ok(r.usage.completion_tokens <= 32);
  // the prompt the server built is the template's rendering, tokenized
  const tpl = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages: [{ role: 'user', content: 'Tell me a fortune.' }] }) });
  const tok = await raw(srv.base, '/tokenize', { body: JSON.stringify({ content: tpl.json.prompt }) });
  assert.equal(r.usage.prompt_tokens, tok.json.tokens.length);
  // the CLI, same template and greedy, says the same
  const cli = spawnSync(BIN, ['generate', '--model', MODEL, '--ids', tok.json.tokens.join(','), '-n', '32', '--temp', '0'], { encoding: 'utf8' });
  assert.equal(cli.status, 0, cli.stderr);
  const ids = cli.stdout.trim().split(',').map(Number);
  const eos = ids.findIndex((t) => t === 1 || t === 4);
  const det = await raw(srv.base, '/detokenize', { body: JSON.stringify({ tokens: eos >= 0 ? ids.slice(0, eos) : ids }) });
  assert.equal(m.content, det.json.content);
});

test('chat: streamed deltas add up to the non-streamed answer; role first, usage last, [DONE]', async () => {
  const req = ask('Give me some wisdom about computers.');
  const whole = await client.chat.completions.create(req);
  const chunks = await collect(await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }));
  assert.equal(chunks[0].choices[0].delta.role, 'assistant');
  const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  assert.equal(text, whole.choices[0].message.content);
  const fin = chunks.filter((c) => c.choices[0]?.finish_reason);
  assert.equal(fin.length, 1);
  assert.equal(fin[0].choices[0].finish_reason, whole.choices[0].finish_reason);
  const last = chunks[chunks.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(last.usage.prompt_tokens, whole.usage.prompt_tokens);
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  // raw SSE: ends with data: [DONE]
  const r = await raw(srv.base, '/v1/chat/completions', { body: JSON.stringify({ ...req, stream: true }) });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const ev = sseEvents(r.text);
  assert.equal(ev[ev.length - 1], '[DONE]');
});

test('completions: a string prompt and the same prompt as token ids give the same text', async () => {
  const prompt = 'A fortune:';
  const a = await client.completions.create({ model: 'fortune', prompt, max_tokens: 24, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  const tok = await raw(srv.base, '/tokenize', { body: JSON.stringify({ content: prompt, add_special: true }) });
  const b = await client.completions.create({ model: 'fortune', prompt: tok.json.tokens, max_tokens: 24, temperature: 0 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.usage.prompt_tokens, tok.json.tokens.length);
  const s = await collect(await client.completions.create({ model: 'fortune', prompt, max_tokens: 24, temperature: 0, stream: true }));
  assert.equal(s.map((c) => c.choices[0]?.text ?? '').join(''), a.choices[0].text);
});

test('sampling: the same seed gives the same text; temperature 0 ignores the seed', async () => {
  const req = ask('Tell me a joke.', { temperature: 1.0, top_p: 0.9, max_tokens: 24, logit_bias: NO_EOS });
  const a = await client.chat.completions.create({ ...req, seed: 1234 });
  const b = await client.chat.completions.create({ ...req, seed: 1234 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  let differs = false;
  for (const seed of [1, 2, 3, 4]) {
    const c = await client.chat.completions.create({ ...req, seed });
    differs ||= c.choices[0].message.content !== a.choices[0].message.content;
  }
  assert.ok(differs, 'four other seeds all gave the same text');
});

test('logprobs in OpenAI shape', async () => {
  const r = await client.chat.completions.create(ask('Tell me a fortune.', { logprobs: true, top_logprobs: 3, max_tokens: 12, logit_bias: NO_EOS }));
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  assert.equal(lp.map((e) => e.token).join(''), r.choices[0].message.content);
  for (const e of lp) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 3);
    assert.deepEqual(Buffer.from(e.bytes).toString('utf8'), e.token);
    // greedy: the chosen token is the most likely one
    assert.equal(e.top_logprobs[0].token, e.token);
    assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob);
  }
  const c = await client.completions.create({ model: 'fortune', prompt: 'A fortune:', max_tokens: 6, temperature: 0, logprobs: 2, logit_bias: NO_EOS });
  const l = c.choices[0].logprobs;
  assert.equal(l.tokens.length, 6);
  assert.equal(l.token_logprobs.length, 6);
  assert.equal(Object.keys(l.top_logprobs[0]).length, 2);
  assert.equal(l.tokens.join(''), c.choices[0].text);
});

test('stop strings end the answer before the stop string, streamed or not', async () => {
  const base = ask('Tell me a fortune.', { max_tokens: 48, logit_bias: NO_EOS });
  const full = (await client.chat.completions.create(base)).choices[0].message.content;
  assert.ok(full.length > 20, full);
  const stop = full.slice(12, 15);
  const expect = full.slice(0, full.indexOf(stop));
  const r = await client.chat.completions.create({ ...base, stop: [stop, 'zzzz-never'] });
  assert.equal(r.choices[0].message.content, expect);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collect(await client.chat.completions.create({ ...base, stop, stream: true }));
  assert.equal(s.map((c) => c.choices[0]?.delta?.content ?? '').join(''), expect);
});

test('errors have OpenAI shape and status', async () => {
  const expectStatus = async (p, status) => {
    await assert.rejects(p, (e) => {
      assert.equal(e.status, status, String(e));
      assert.equal(typeof e.error?.message ?? e.message, 'string');
      return true;
    });
  };
  await expectStatus(client.chat.completions.create({ model: 'x', messages: [] }), 400);
  await expectStatus(client.chat.completions.create(ask('hi', { temperature: 'hot' })), 400);
  await expectStatus(client.chat.completions.create(ask('hi', { n: 2 })), 400);
  await expectStatus(client.chat.completions.create(ask('hi', { max_tokens: 100000 })), 400);
  await expectStatus(client.chat.completions.create({ model: 'x', messages: [{ role: 'wizard', content: 'hi' }] }), 400);
  const bad = await raw(srv.base, '/v1/chat/completions', { body: '{"messages": [' });
  assert.equal(bad.status, 400);
  assert.equal(typeof bad.json.error.message, 'string');
  assert.equal(bad.json.error.type, 'invalid_request_error');
  assert.equal(bad.json.error.code, 400);
  const nf = await raw(srv.base, '/v1/nothing-here', { method: 'GET' });
  assert.equal(nf.status, 404);
  assert.equal(nf.json.error.code, 404);
  const wm = await raw(srv.base, '/v1/chat/completions', { method: 'GET' });
  assert.equal(wm.status, 405);
  const big = await raw(srv.base, '/v1/chat/completions', { body: 'x'.repeat(10 * 1024 * 1024) });
  assert.equal(big.status, 413);
});

test('a client that disconnects mid-stream frees the server at once', async () => {
  // the speed of this build, to know how long the abandoned request would have run
  const t0 = Date.now();
  const probe = await client.chat.completions.create(ask('Tell me a fortune.', { max_tokens: 32, logit_bias: NO_EOS }));
  const perToken = (Date.now() - t0) / probe.usage.completion_tokens;
  const long = 1500;
  const ac = new AbortController();
  const stream = await client.chat.completions.create(ask('Tell me a fortune.', { max_tokens: long, logit_bias: NO_EOS, stream: true }), { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of stream) {
      if (++n === 4) {
        ac.abort();
        break;
      }
    }
  } catch {
    /* an abort may surface as an error or as the end of the stream */
  }
  assert.equal(n, 4);
  const t1 = Date.now();
  const next = await client.chat.completions.create(ask('Tell me a joke.', { max_tokens: 8 }));
  const waited = Date.now() - t1;
  assert.ok(next.choices[0].message.content.length > 0);
  assert.ok(waited < (long * perToken) / 4, `waited ${waited} ms; the abandoned stream needed ~${Math.round(long * perToken)} ms`);
});

test('16 concurrent clients get exactly what they get one at a time', async () => {
  const prompts = Array.from({ length: 16 }, (_, i) => ask(['Tell me a fortune.', 'Tell me a joke.', 'Give me a quote.', 'Some wisdom, please.'][i % 4] + ' '.repeat(i % 3), { max_tokens: 16 + (i % 5) }));
  const seq = [];
  for (const p of prompts) seq.push((await client.chat.completions.create(p)).choices[0].message.content);
  const par = await Promise.all(
    prompts.map(async (p, i) => {
      if (i % 2) return (await client.chat.completions.create(p)).choices[0].message.content;
      const chunks = await collect(await client.chat.completions.create({ ...p, stream: true }));
      return chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    }),
  );
  assert.deepEqual(par, seq);
});

test('CORS preflight and headers', async () => {
  const r = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'OPTIONS',
    headers: { Origin: 'http://app.example', 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'content-type, authorization' },
  });
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-origin'), '*');
  assert.match(r.headers.get('access-control-allow-methods'), /POST/);
  assert.match(r.headers.get('access-control-allow-headers'), /authorization/);
  const g = await fetch(`${srv.base}/v1/models`, { headers: { Origin: 'http://app.example' } });
  assert.equal(g.headers.get('access-control-allow-origin'), '*');
});
