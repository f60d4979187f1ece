// Continuous batching end to end: 16 clients at once on a server decoding
// 16 rows together (prompts prefilled in small chunks between decode steps)
// get exactly, token for token, what each request gets alone; the KV budget
// makes requests wait instead of failing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, raw } from './harness.mjs';

const NO_EOS = { 1: -100, 4: -100 }; // the bundled model's eos ids, biased away
let srv, client;

before(async () => {
  srv = await startServer(['--parallel', '16', '--prefill-step-size', '7']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
});

after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
});

const TOPICS = ['Tell me a fortune.', 'Tell me a joke.', 'Give me a quote about the sea and the wind.', 'Some wisdom, please.'];

function request(i) {
  const r = {
    model: 'fortune',
    messages: [{ role: 'user', content: TOPICS[i % 4] + ' Again.'.repeat(i % 5) }],
    max_tokens: 24 + 3 * (i % 7),
    logit_bias: NO_EOS,
    temperature: 0,
    logprobs: true, // compared too: the numbers, not only the tokens, must not depend on the batch
    top_logprobs: 2,
  };
  if (i % 4 === 3) Object.assign(r, { temperature: 0.9, top_p: 0.95, seed: 1000 + i }); // seeded sampling too
  return r;
}

async function run(r, stream) {
  if (!stream) {
    const x = await client.chat.completions.create(r);
    const lp = (x.choices[0].logprobs?.content ?? []).map((e) => [e.token, e.logprob, e.top_logprobs.map((t) => t.logprob)]);
    return { text: x.choices[0].message.content, batch: x.timings.batch_max, n: x.usage.completion_tokens, lp };
  }
  let text = '', batch = 0, n = 0;
  const lp = [];
  for await (const c of await client.chat.completions.create({ ...r, stream: true, stream_options: { include_usage: true } })) {
    text += c.choices[0]?.delta?.content ?? '';
    for (const e of c.choices[0]?.logprobs?.content ?? []) lp.push([e.token, e.logprob, e.top_logprobs.map((t) => t.logprob)]);
    if (c.usage) (batch = c.timings.batch_max), (n = c.usage.completion_tokens);
  }
  return { text, batch, n, lp };
}

test('16 concurrent requests, decoded together, equal the same requests one at a time', async () => {
  const reqs = Array.from({ length: 16 }, (_, i) => request(i));
  const alone = [];
  for (const r of reqs) alone.push(await run(r, false));
  for (const a of alone) assert.equal(a.batch, 1);
  const together = await Promise.all(reqs.map((r, i) => run(r, i % 2 === 1)));
  for (let i = 0; i < 16; i++) {
    assert.equal(together[i].text, alone[i].text, `request ${i} differs under load`);
    assert.equal(together[i].n, alone[i].n);
    assert.deepEqual(together[i].lp, alone[i].lp, `request ${i}: logprobs differ under load`);
    if (reqs[i].logprobs) assert.equal(alone[i].lp.length, alone[i].n);
  }
  const most = Math.max(...together.map((t) => t.batch));
  assert.ok(most >= 8, `the rows were not batched (largest batch ${most})`);
});

test('a request that leaves mid-stream frees its row; the others are unaffected', async () => {
  const reqs = Array.from({ length: 6 }, (_, i) => request(i));
  const alone = [];
  for (const r of reqs) alone.push(await run(r, false));
  const ac = new AbortController();
  const quitter = (async () => {
    let n = 0;
    try {
      const s = await client.chat.completions.create({ ...request(9), max_tokens: 200, stream: true }, { signal: ac.signal });
      for await (const c of s) if (c.choices[0]?.delta?.content && ++n === 3) ac.abort();
    } catch {
      /* aborted */
    }
  })();
  const together = await Promise.all(reqs.map((r) => run(r, true)));
  await quitter;
  for (let i = 0; i < 6; i++) assert.equal(together[i].text, alone[i].text);
  const h = await raw(srv.base, '/health', { method: 'GET' });
  assert.equal(h.status, 200);
});

test('a small KV budget queues requests instead of failing them', async () => {
  const small = await startServer(['--parallel', '8', '--kv-budget', '1.5M']);
  try {
    const c = new OpenAI({ baseURL: `${small.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
    const reqs = Array.from({ length: 8 }, (_, i) => ({ ...request(i), temperature: 0, max_tokens: 40 }));
    const alone = [];
    for (const r of reqs) alone.push((await c.chat.completions.create(r)).choices[0].message.content);
    const res = await Promise.all(reqs.map((r) => c.chat.completions.create(r)));
    res.forEach((x, i) => assert.equal(x.choices[0].message.content, alone[i]));
    const most = Math.max(...res.map((x) => x.timings.batch_max));
    assert.ok(most < 8, `the budget should have kept some requests waiting (largest batch ${most})`);
    // one that can never fit is refused at once, with a reason
    const big = await raw(small.base, '/v1/chat/completions', {
      body: JSON.stringify({ ...reqs[0], max_tokens: 1500 }),
    });
    assert.equal(big.status, 400);
    assert.match(big.json.error.message, /kv-budget/);
  } finally {
    const r = await small.stop();
    assert.equal(r.code, 0);
  }
});

test('quantized and 16-bit KV (-ctk q8_0, --kv-bits 4, -ctk bf16): batched equals alone, and bad cache types are refused', async () => {
  for (const flags of [['-ctk', 'q8_0', '-ctv', 'q8_0'], ['--kv-bits', '4', '--kv-group-size', '32'], ['-ctk', 'bf16', '-ctv', 'f16']]) {
    const q = await startServer(['--parallel', '6', '--prefill-step-size', '16', ...flags]);
    try {
      const c = new OpenAI({ baseURL: `${q.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
      const reqs = Array.from({ length: 6 }, (_, i) => ({ ...request(i), max_tokens: 30 }));
      const alone = [];
      for (const r of reqs) alone.push((await c.chat.completions.create(r)).choices[0]);
      const res = await Promise.all(reqs.map((r) => c.chat.completions.create(r)));
      res.forEach((x, i) => {
        assert.equal(x.choices[0].message.content, alone[i].message.content);
        assert.deepEqual(x.choices[0].logprobs, alone[i].logprobs);
      });
      assert.ok(Math.max(...res.map((x) => x.timings.batch_max)) >= 3);
    } finally {
      assert.equal((await q.stop()).code, 0);
    }
  }
  const { spawnSync } = await import('node:child_process');
  const { BIN, MODEL } = await import('./harness.mjs');
  const bad = spawnSync(BIN, ['serve', MODEL, '-ctk', 'q5_1'], { encoding: 'utf8' });
  assert.equal(bad.status, 2);
  assert.match(bad.stderr, /q4_0, q8_0/);
  const mixed = spawnSync(BIN, ['serve', MODEL, '-ctk', 'q8_0', '-ctv', 'q4_0'], { encoding: 'utf8' });
  assert.equal(mixed.status, 2);
  assert.match(mixed.stderr, /alike/);
});
