// The prefix cache end to end, with the real `openai` client: a chat's next
// turn and requests sharing a system prompt reuse cached KV (reported as
// usage.prompt_tokens_details.cached_tokens and timings.cache_n) and answer
// exactly what the same requests answer without the cache (tokens and
// logprobs); a restart finds the cache on disk; a changed model file does
// not; /stats and /metrics count it all.
//
// The bundled model runs bf16 weights, whose rows depend on how they are
// chunked: the server reuses prompts at multiples of the prefill chunk
// there, so the chunk is small here (16) to reuse something of short prompts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, MODEL } from './harness.mjs';

const STEP = 16;
const SYSTEM =
  'You are the oracle of the harbour. You answer every question with a fortune, a proverb or a short ' +
  'story about ships, storms, lighthouses and the people who wait for them on the shore at night.';
let tmp, dir;

before(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'osp_cache_e2e_'));
  dir = path.join(tmp, 'cache');
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

function clientOf(srv) {
  return new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
}

async function ask(client, messages, extra = {}) {
  const x = await client.chat.completions.create({
    model: 'fortune',
    messages,
    max_tokens: 24,
    temperature: 0,
    logprobs: true,
    top_logprobs: 2,
    ...extra,
  });
  return {
    text: x.choices[0].message.content,
    lp: x.choices[0].logprobs.content.map((e) => [e.token, e.logprob, e.top_logprobs.map((t) => t.logprob)]),
    cached: x.usage.prompt_tokens_details.cached_tokens,
    cache_n: x.timings.cache_n,
    prompt_n: x.timings.prompt_n,
    prompt: x.usage.prompt_tokens,
  };
}

async function stopped(srv) {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
}

test('a chat turn reuses the previous one, and answers what it answers cold', async () => {
  const srv = await startServer(['--prefill-step-size', String(STEP), '--prompt-cache-dir', dir]);
  try {
    const c = clientOf(srv);
    const turn1 = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'Tell me a fortune.' }];
    const a = await ask(c, turn1);
    assert.equal(a.cached, 0);
    const turn2 = [...turn1, { role: 'assistant', content: a.text }, { role: 'user', content: 'And another one, please.' }];
    const cold = await ask(c, turn2, { cache_prompt: false });
    assert.equal(cold.cached, 0);
    const warm = await ask(c, turn2);
    assert.ok(warm.cached >= 48, `cached ${warm.cached} of ${warm.prompt}`);
    /* chunk-invariant rows (the CPU's int8 path, bf16 on AMX) reuse any prefix, replies too; else prompts on
     * the prefill grid */
    const rule = (await raw(srv.base, '/stats', { method: 'GET' })).json.prompt_cache;
    if (rule.align === 1) assert.ok(warm.cached > a.prompt, `the reply was reused: ${warm.cached} > ${a.prompt}`);
    else assert.equal(warm.cached % STEP, 0);
    assert.ok(rule.align === 1 || rule.align === STEP);
    assert.equal(warm.cache_n, warm.cached);
    assert.equal(warm.prompt_n, warm.prompt - warm.cached);
    assert.deepEqual(warm.lp, cold.lp);
    assert.equal(warm.text, cold.text);
    const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.ok(st.prompt_cache.hits >= 1);
    assert.equal(st.tokens.prompt_cached, warm.cached);
  } finally {
    await stopped(srv);
  }
});

test('concurrent requests sharing a system prompt share its KV, and answer what they answer cold', async () => {
  const srv = await startServer(['--prefill-step-size', String(STEP), '--parallel', '4', '--prompt-cache-size', '1']);
  try {
    const c = clientOf(srv);
    const qs = ['A fortune for a sailor.', 'A proverb about the wind.', 'A story about a lighthouse.', 'Wisdom for the night.'];
    const msgs = (q) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: q }];
    const cold = [];
    for (const q of qs) cold.push(await ask(c, msgs(q), { cache_prompt: false }));
    const warm = await Promise.all(qs.map((q) => ask(c, msgs(q))));
    const shared = warm.filter((w) => w.cached >= 48).length;
    assert.ok(shared >= 3, `cached: ${warm.map((w) => w.cached)}`);
    for (let i = 0; i < qs.length; i++) {
      assert.deepEqual(warm[i].lp, cold[i].lp, `request ${i}`);
      assert.equal(warm[i].text, cold[i].text);
    }
  } finally {
    await stopped(srv);
  }
});

test('a restart finds the cache on disk; a changed model file does not', async () => {
  const mdir = path.join(tmp, 'model');
  fs.cpSync(MODEL, mdir, { recursive: true });
  const cdir = path.join(tmp, 'restart');
  const args = ['--prefill-step-size', String(STEP), '--prompt-cache-dir', cdir];
  const msgs = [{ role: 'system', content: SYSTEM }, { role: 'user', content: 'What does the sea say?' }];
  let srv = await startServer(args, { model: mdir });
  let first;
  try {
    first = await ask(clientOf(srv), msgs);
    assert.equal(first.cached, 0);
  } finally {
    await stopped(srv); // a clean shutdown writes the entries
  }
  srv = await startServer(args, { model: mdir });
  try {
    const st0 = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.ok(st0.prompt_cache.disk_entries >= 1, JSON.stringify(st0.prompt_cache));
    const again = await ask(clientOf(srv), msgs);
    assert.ok(again.cached >= 48, `cached ${again.cached}`);
    assert.deepEqual(again.lp, first.lp);
    const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.equal(st.prompt_cache.disk_loads, 1);
    assert.match(st.model_identity, /^[0-9a-f]{64}$/);
  } finally {
    await stopped(srv);
  }
  // the same numbers in another file: another identity, so none of the old entries
  fs.appendFileSync(path.join(mdir, 'config.json'), '\n');
  srv = await startServer(args, { model: mdir });
  try {
    const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.equal(st.prompt_cache.disk_entries, 0);
    const again = await ask(clientOf(srv), msgs);
    assert.equal(again.cached, 0);
  } finally {
    await stopped(srv);
  }
});

test('/metrics in Prometheus text; cache_prompt checked; the cache can be off', async () => {
  let srv = await startServer(['--prefill-step-size', String(STEP), '--prompt-cache-dir', dir]);
  try {
    const c = clientOf(srv);
    await ask(c, [{ role: 'user', content: 'Tell me a joke.' }]);
    const m = await fetch(`${srv.base}/metrics`);
    assert.equal(m.status, 200);
    assert.match(m.headers.get('content-type'), /^text\/plain/);
    const text = await m.text();
    for (const name of ['requests_total{outcome="ok"} 1', 'prompt_cache_lookups_total 1', 'generated_tokens_total', 'queue_length ', 'rows_in_use ', 'prompt_cache_bytes '])
      assert.ok(text.includes(`osprey_${name}`), `${name} in\n${text}`);
    for (const line of text.split('\n').filter((l) => l && !l.startsWith('#')))
      assert.match(line, /^(osprey|process)_[a-z_]+(\{[a-z_]+="[a-z_]+"\})? -?\d+$/); // a sample: a name, at most one label, an integer
    const bad = await raw(srv.base, '/v1/chat/completions', {
      body: JSON.stringify({ model: 'fortune', messages: [{ role: 'user', content: 'hi' }], cache_prompt: 'yes' }),
    });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'cache_prompt');
    // return_tokens (llama-server's): the reply's ids, in the body or chunk by chunk
    const req = { model: 'fortune', prompt: 'Tell me a fortune.', max_tokens: 12, temperature: 0, return_tokens: true, logit_bias: { 1: -100, 4: -100 } };
    const body = (await raw(srv.base, '/v1/completions', { body: JSON.stringify(req) })).json;
    const ids = body.choices[0].tokens;
    assert.equal(ids.length, body.usage.completion_tokens);
    const sse = await raw(srv.base, '/v1/completions', { body: JSON.stringify({ ...req, stream: true }) });
    const streamed = sse.text.split('\n\n').filter((e) => e.startsWith('data: {')).flatMap((e) => JSON.parse(e.slice(6)).choices[0].tokens);
    assert.deepEqual(streamed, ids);
    const det = (await raw(srv.base, '/detokenize', { body: JSON.stringify({ tokens: ids }) })).json;
    assert.equal(det.content, body.choices[0].text);
  } finally {
    await stopped(srv);
  }
  srv = await startServer(['--prompt-cache', '0']);
  try {
    const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.equal(st.prompt_cache, null);
    const r = await ask(clientOf(srv), [{ role: 'user', content: 'Tell me a joke.' }]);
    assert.equal(r.cached, 0);
  } finally {
    await stopped(srv);
  }
});

test('the cache lives inside the KV budget: entries leave memory when requests need the room', async () => {
  const cdir = path.join(tmp, 'budget');
  // a budget of about three rows at full context: reservations + cached bytes never exceed it
  const srv = await startServer(['--prefill-step-size', String(STEP), '-c', '512', '--parallel', '2', '--kv-budget', '3M',
    '--prompt-cache-dir', cdir]);
  try {
    const c = clientOf(srv);
    for (let i = 0; i < 8; i++) {
      const r = await ask(c, [{ role: 'system', content: SYSTEM }, { role: 'user', content: `Question number ${i}: what now?` }], { max_tokens: 8 });
      assert.ok(r.text.length >= 0);
      const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
      assert.ok(st.prompt_cache.bytes + st.kv.reserved_bytes <= st.kv.budget_bytes, JSON.stringify(st));
    }
    const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
    assert.ok(st.prompt_cache.evictions > 0, JSON.stringify(st.prompt_cache));
    assert.ok(st.prompt_cache.hits > 0, JSON.stringify(st.prompt_cache));
  } finally {
    await stopped(srv);
  }
});

test('two servers on one cache folder: both write, a third reads every entry, none broken', async () => {
  const cdir = path.join(tmp, 'shared');
  const args = ['--prefill-step-size', String(STEP), '--prompt-cache-dir', cdir];
  const [s1, s2] = await Promise.all([startServer(args), startServer(args)]);
  const qs = (k) => [0, 1, 2].map((i) => [{ role: 'system', content: SYSTEM }, { role: 'user', content: `Server ${k}, question ${i}.` }]);
  try {
    await Promise.all([...qs(1).map((m) => ask(clientOf(s1), m)), ...qs(2).map((m) => ask(clientOf(s2), m))]);
    await Promise.all([ask(clientOf(s1), qs(0)[0]), ask(clientOf(s2), qs(0)[0])]); // the same entry from both
  } finally {
    await Promise.all([stopped(s1), stopped(s2)]);
  }
  const s3 = await startServer(args);
  try {
    const st = (await raw(s3.base, '/stats', { method: 'GET' })).json.prompt_cache;
    assert.ok(st.disk_entries >= 7, JSON.stringify(st));
    assert.equal(st.disk_rejects, 0);
    for (const m of [...qs(1), ...qs(2), qs(0)[0]]) assert.ok((await ask(clientOf(s3), m)).cached >= 48);
    const after = (await raw(s3.base, '/stats', { method: 'GET' })).json.prompt_cache;
    assert.equal(after.disk_rejects, 0);
  } finally {
    await stopped(s3);
  }
});
