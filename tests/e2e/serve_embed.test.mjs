// The embeddings API (issue 40): osprey serve --embedding-model beside the chat model and alone, driven by the
// openai client's embeddings.create unchanged. The model is `osprey synth --preset qwen3-embedding-tiny` (a bare
// Qwen3 body, no lm_head, last-token pooling, normalized) with tests/data/embed's byte-level tokenizer, whose
// post-processor appends <|endoftext|> (id 261): the tests check the vectors' agreement (float and base64, one
// input and many, text and token ids, the command line), Matryoshka widths, usage and the 400s.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, BIN, ROOT } from './harness.mjs';

let srv, client, tmp, emb;
before(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'osp_embed_'));
  emb = path.join(tmp, 'qwen3-embedding-tiny');
  execFileSync(BIN, ['synth', '--preset', 'qwen3-embedding-tiny', '--out', emb], { stdio: 'ignore' });
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    fs.copyFileSync(path.join(ROOT, 'tests', 'data', 'embed', f), path.join(emb, f));
  srv = await startServer(['--embedding-model', emb, '-c', '64']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  const r = await srv.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
  assert.equal(r.code, 0, srv.log());
});

const norm = (v) => Math.sqrt(v.reduce((a, x) => a + x * x, 0));
const maxDiff = (a, b) => a.reduce((m, x, i) => Math.max(m, Math.abs(x - b[i])), 0);

test('float and base64 (the client default) give the same vectors, bit for bit', async () => {
  const f = await client.embeddings.create({ model: 'any', input: 'the cat sat', encoding_format: 'float' });
  const b = await client.embeddings.create({ model: 'any', input: 'the cat sat' }); // base64, decoded by the client
  assert.equal(f.object, 'list');
  assert.equal(f.data.length, 1);
  assert.equal(f.data[0].object, 'embedding');
  assert.equal(f.data[0].index, 0);
  assert.equal(f.data[0].embedding.length, 64);
  assert.deepEqual(Array.from(Float32Array.from(f.data[0].embedding)), Array.from(b.data[0].embedding));
  assert.ok(Math.abs(norm(f.data[0].embedding) - 1) < 1e-5);
  assert.equal(f.model, 'any');
  // raw base64: little-endian f32
  const r = await raw(srv.base, '/v1/embeddings', { body: JSON.stringify({ input: 'the cat sat', encoding_format: 'base64' }) });
  assert.equal(r.status, 200, r.text);
  const buf = Buffer.from(r.json.data[0].embedding, 'base64');
  assert.equal(buf.length, 64 * 4);
  for (let i = 0; i < 64; i++) assert.equal(buf.readFloatLE(i * 4), Math.fround(f.data[0].embedding[i]));
  assert.equal(r.json.model, 'qwen3-embedding-tiny'); // no model named: the served one
});

test('a batch of inputs: in order, each as it is alone; usage counts the tokens', async () => {
  const inputs = ['a', 'the cat sat on the mat', 'hi', 'in the winter there'];
  const all = await client.embeddings.create({ model: 'm', input: inputs, encoding_format: 'float' });
  assert.deepEqual(all.data.map((d) => d.index), [0, 1, 2, 3]);
  let tokens = 0;
  for (let i = 0; i < inputs.length; i++) {
    const one = await client.embeddings.create({ model: 'm', input: inputs[i], encoding_format: 'float' });
    assert.ok(maxDiff(one.data[0].embedding, all.data[i].embedding) < 1e-5, `input ${i}`);
    tokens += one.usage.prompt_tokens;
  }
  assert.equal(all.usage.prompt_tokens, tokens);
  assert.equal(all.usage.total_tokens, tokens);
  const hi = await client.embeddings.create({ model: 'm', input: 'hi', encoding_format: 'float' });
  assert.equal(hi.usage.prompt_tokens, 3); // h, i, <|endoftext|>
});

test('token ids: the text\'s ids with <|endoftext|> give the text\'s vector; lists of lists', async () => {
  const text = await client.embeddings.create({ model: 'm', input: 'hi', encoding_format: 'float' });
  const ids = await client.embeddings.create({ model: 'm', input: [104, 105, 261], encoding_format: 'float' });
  assert.deepEqual(ids.data[0].embedding, text.data[0].embedding);
  const bare = await client.embeddings.create({ model: 'm', input: [104, 105], encoding_format: 'float' });
  assert.ok(maxDiff(bare.data[0].embedding, text.data[0].embedding) > 1e-3); // the post-processor's token matters
  const two = await client.embeddings.create({ model: 'm', input: [[104, 105, 261], [104, 105]], encoding_format: 'float' });
  assert.equal(two.data.length, 2);
  assert.ok(maxDiff(two.data[0].embedding, text.data[0].embedding) < 1e-5);
  assert.ok(maxDiff(two.data[1].embedding, bare.data[0].embedding) < 1e-5);
  assert.equal(two.usage.prompt_tokens, 5);
});

test('dimensions: the first N, renormalized', async () => {
  const full = await client.embeddings.create({ model: 'm', input: 'the cat', encoding_format: 'float' });
  const d = await client.embeddings.create({ model: 'm', input: 'the cat', dimensions: 16, encoding_format: 'float' });
  assert.equal(d.data[0].embedding.length, 16);
  const head = full.data[0].embedding.slice(0, 16), n = norm(head);
  assert.ok(maxDiff(d.data[0].embedding, head.map((x) => x / n)) < 1e-6);
  const b = await client.embeddings.create({ model: 'm', input: 'the cat', dimensions: 16 });
  assert.deepEqual(Array.from(b.data[0].embedding), Array.from(Float32Array.from(d.data[0].embedding)));
});

test('osprey embed --fast prints the vectors the server gives', async () => {
  const out = execFileSync(BIN, ['embed', '--model', emb, '--input', 'the cat sat', '--input', 'hi', '--dimensions', '16', '--fast'],
                           { encoding: 'utf8' });
  const lines = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(lines.map((l) => l.index), [0, 1]);
  const s = await client.embeddings.create({ model: 'm', input: ['the cat sat', 'hi'], dimensions: 16, encoding_format: 'float' });
  for (let i = 0; i < 2; i++) {
    assert.equal(lines[i].embedding.length, 16);
    assert.ok(maxDiff(lines[i].embedding, s.data[i].embedding) < 1e-6, `input ${i}`);
  }
});

test('bad requests: 400 naming the field', async () => {
  const cases = [
    [{ input: '' }, 'input'],
    [{ input: [] }, 'input'],
    [{ input: [''] }, 'input'],
    [{ input: [[]] }, 'input'],
    [{ input: 42 }, 'input'],
    [{ input: [1, 'a'] }, 'input'],
    [{ input: ['a', 7] }, 'input'],
    [{ input: [[1, 2], 'a', {}] }, 'input'],
    [{ input: [1, 99999] }, 'input'],
    [{ input: [-1] }, 'input'],
    [{ input: [1.5] }, 'input'],
    [{}, 'input'],
    [{ input: 'x'.repeat(100) }, 'input'], // 101 tokens > the context of 64
    [{ input: 'a', encoding_format: 'hex' }, 'encoding_format'],
    [{ input: 'a', encoding_format: 3 }, 'encoding_format'],
    [{ input: 'a', dimensions: 0 }, 'dimensions'],
    [{ input: 'a', dimensions: 65 }, 'dimensions'],
    [{ input: 'a', dimensions: '16' }, 'dimensions'],
    [{ input: 'a', model: 5 }, 'model'],
    [{ input: 'a', truncate: true }, 'truncate'],
  ];
  for (const [body, param] of cases) {
    const r = await raw(srv.base, '/v1/embeddings', { body: JSON.stringify(body) });
    assert.equal(r.status, 400, `${JSON.stringify(body).slice(0, 80)}: ${r.text}`);
    assert.equal(r.json.error.param, param, `${JSON.stringify(body).slice(0, 80)}: ${r.text}`);
  }
  await assert.rejects(client.embeddings.create({ model: 'm', input: '' }), (e) => e.status === 400);
  // the chat model still answers beside it
  const c = await raw(srv.base, '/v1/completions', { body: JSON.stringify({ prompt: 'Once', max_tokens: 3 }) });
  assert.equal(c.status, 200, c.text);
});

test('embeddings and chat at once (they share the thread pool, call by call): each as it is alone', async () => {
  const chat = () => raw(srv.base, '/v1/completions', { body: JSON.stringify({ prompt: 'Once upon', max_tokens: 24, temperature: 0 }) });
  const inputs = ['the cat sat on the mat', 'in the winter there', 'hi'];
  const embed = () => client.embeddings.create({ model: 'm', input: inputs, encoding_format: 'float' });
  const soloChat = (await chat()).json.choices[0].text, soloEmb = await embed();
  const jobs = [];
  for (let i = 0; i < 4; i++) jobs.push(chat(), embed(), embed());
  const res = await Promise.all(jobs);
  for (let i = 0; i < res.length; i++) {
    if (i % 3 === 0) {
      assert.equal(res[i].status, 200, res[i].text);
      assert.equal(res[i].json.choices[0].text, soloChat);
    } else {
      for (let k = 0; k < inputs.length; k++)
        assert.deepEqual(res[i].data[k].embedding, soloEmb.data[k].embedding);
    }
  }
});

test('an embedding model alone: embeddings served, chat routes 404', async () => {
  const s = await startServer(['--embedding-model', emb], { model: null });
  try {
    const r = await raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: 'hi' }) });
    assert.equal(r.status, 200, r.text);
    const c = await raw(s.base, '/v1/chat/completions', { body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }] }) });
    assert.equal(c.status, 404);
    assert.match(c.json.error.message, /embeds only/);
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
  // a model without lm_head is refused as the chat model
  const bad = await startServer([], { model: emb }).then(
    (x) => { x.stop(); return null; },
    (e) => e);
  assert.ok(bad && /no lm_head/.test(bad.message), String(bad));
});

test('EmbeddingGemma (bidirectional, mean pooling, two Dense modules): a batch of lengths as each alone', async () => {
  const eg = path.join(ROOT, 'tests', 'data', 'embeddinggemma', 'embeddinggemma-tiny');
  const s = await startServer(['--embedding-model', eg, '--parallel', '3'], { model: null });
  try {
    const inputs = ['hi', 'the cat sat on the mat by the fire, then there was snow', 'x', 'in the winter'];
    const all = await raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: inputs }) });
    assert.equal(all.status, 200, all.text);
    for (let i = 0; i < inputs.length; i++) {
      const one = await raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: inputs[i] }) });
      const a = all.json.data[i].embedding, b = one.json.data[0].embedding;
      assert.equal(a.length, 64);
      assert.ok(Math.abs(norm(a) - 1) < 1e-5);
      assert.ok(maxDiff(a, b) < 1e-5, `input ${i}: ${maxDiff(a, b)}`); // padding unseen by the bidirectional rows
    }
    // requests at once are batched with each other (rows of the same forward calls): each as it is alone
    const solo = [];
    for (const x of inputs) solo.push((await raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: x }) })).json);
    const many = await Promise.all([...inputs, ...inputs].map((x) =>
      raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: x }) })));
    many.forEach((r, k) => {
      assert.equal(r.status, 200, r.text);
      assert.ok(maxDiff(r.json.data[0].embedding, solo[k % inputs.length].data[0].embedding) < 1e-5, `request ${k}`);
    });
    const mrl = await raw(s.base, '/v1/embeddings', { body: JSON.stringify({ input: 'hi', dimensions: 32 }) });
    assert.equal(mrl.status, 200, mrl.text);
    assert.equal(mrl.json.data[0].embedding.length, 32);
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});
