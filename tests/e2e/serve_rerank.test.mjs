// The rerank API (issue 40): osprey serve --rerank-model, alone and beside a chat model, driven with fetch. The
// model is tests/data/rerank/qwen3-reranker-tiny (a Qwen3-Reranker of random weights, `osprey synth --preset
// qwen3-reranker-tiny`, its scores checked against the references by test_rerank): the tests check the results'
// order and scores (each as alone, as `osprey rerank --fast` gives them), top_n, return_documents, the routes and
// the 400s.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { startServer, raw, BIN, ROOT } from './harness.mjs';

const RR = path.join(ROOT, 'tests', 'data', 'rerank', 'qwen3-reranker-tiny');
const QUERY = 'what is the capital of china';
const DOCS = ['the capital of china is beijing', 'gravity is a force', 'x', 'in the winter there was snow', 'beijing'];
let srv;
before(async () => {
  srv = await startServer(['--rerank-model', RR, '-c', '400', '--parallel', '2'], { model: null });
});
after(async () => {
  const r = await srv.stop();
  assert.equal(r.code, 0, srv.log());
});

const rerank = (body, route = '/v1/rerank') => raw(srv.base, route, { body: JSON.stringify(body) });

test('results: every document once, the highest score first, as the command line scores them', async () => {
  const r = await rerank({ model: 'rr', query: QUERY, documents: DOCS });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.model, 'rr');
  assert.equal(r.json.object, 'list');
  const res = r.json.results;
  assert.deepEqual(res.map((x) => x.index).sort(), [0, 1, 2, 3, 4]);
  for (let i = 1; i < res.length; i++) assert.ok(res[i - 1].relevance_score >= res[i].relevance_score, r.text);
  for (const x of res) {
    assert.ok(x.relevance_score > 0 && x.relevance_score < 1);
    assert.equal(x.document, undefined); // return_documents defaults to false
  }
  assert.ok(r.json.usage.prompt_tokens > 5 * 200 && r.json.usage.total_tokens === r.json.usage.prompt_tokens);
  // the command line, in production precision, one document a row
  const cli = execFileSync(BIN, ['rerank', '--model', RR, '--query', QUERY, '--fast', '--batch', '1', ...DOCS])
    .toString().trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(cli.map((x) => x.index), res.map((x) => x.index));
  for (let k = 0; k < res.length; k++) assert.ok(Math.abs(cli[k].relevance_score - res[k].relevance_score) < 1e-6);
  // each document alone gets the score it got among the others
  for (const x of res) {
    const one = await rerank({ query: QUERY, documents: [DOCS[x.index]] });
    assert.equal(one.status, 200, one.text);
    assert.ok(Math.abs(one.json.results[0].relevance_score - x.relevance_score) < 1e-6);
  }
});

test('top_n, return_documents, {text} documents and the other routes', async () => {
  const all = (await rerank({ query: QUERY, documents: DOCS })).json.results;
  const r = await rerank({ query: QUERY, documents: DOCS.map((text) => ({ text })), top_n: 2, return_documents: true },
                         '/rerank');
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.results.length, 2);
  assert.deepEqual(r.json.results.map((x) => x.index), all.slice(0, 2).map((x) => x.index));
  for (const x of r.json.results) assert.deepEqual(x.document, { text: DOCS[x.index] });
  const big = await rerank({ query: QUERY, documents: DOCS, top_n: 99 }, '/v1/reranking');
  assert.equal(big.status, 200, big.text);
  assert.equal(big.json.results.length, DOCS.length);
  const ins = await rerank({ query: QUERY, documents: DOCS, instruction: 'Rank the document by its length' });
  assert.equal(ins.status, 200, ins.text);
  assert.notEqual(ins.json.results[0].relevance_score, all.find((x) => x.index === ins.json.results[0].index).relevance_score);
});

test('requests at once (batched with each other): each as it is alone', async () => {
  const bodies = DOCS.map((d, i) => ({ query: i % 2 ? QUERY : 'snow', documents: [d, ...DOCS.slice(0, i)] }));
  const solo = [];
  for (const b of bodies) solo.push((await rerank(b)).json.results);
  const many = await Promise.all([...bodies, ...bodies].map((b) => rerank(b)));
  many.forEach((r, k) => {
    assert.equal(r.status, 200, r.text);
    const want = solo[k % bodies.length];
    assert.deepEqual(r.json.results.map((x) => x.index), want.map((x) => x.index));
    r.json.results.forEach((x, j) => assert.ok(Math.abs(x.relevance_score - want[j].relevance_score) < 1e-6));
  });
});

test('malformed requests: a 400 naming the field', async () => {
  const long = 'snow '.repeat(200);
  const cases = [
    [{ documents: DOCS }, 'query'],
    [{ query: '', documents: DOCS }, 'query'],
    [{ query: 7, documents: DOCS }, 'query'],
    [{ query: QUERY }, 'documents'],
    [{ query: QUERY, documents: [] }, 'documents'],
    [{ query: QUERY, documents: 'x' }, 'documents'],
    [{ query: QUERY, documents: ['a', 3] }, 'documents'],
    [{ query: QUERY, documents: [{ title: 'a' }] }, 'documents'],
    [{ query: QUERY, documents: [{ text: 'a', extra: 1 }] }, 'documents'],
    [{ query: QUERY, documents: ['a', long] }, 'documents'],
    [{ query: QUERY, documents: DOCS, top_n: 0 }, 'top_n'],
    [{ query: QUERY, documents: DOCS, top_n: '2' }, 'top_n'],
    [{ query: QUERY, documents: DOCS, top_n: 1.5 }, 'top_n'],
    [{ query: QUERY, documents: DOCS, return_documents: 'yes' }, 'return_documents'],
    [{ query: QUERY, documents: DOCS, model: 3 }, 'model'],
    [{ query: QUERY, documents: DOCS, instruction: [] }, 'instruction'],
    [{ query: QUERY, documents: DOCS, texts: [] }, 'texts'],
  ];
  for (const [body, param] of cases) {
    const r = await rerank(body);
    assert.equal(r.status, 400, `${JSON.stringify(body).slice(0, 80)}: ${r.text}`);
    assert.equal(r.json.error.param, param, r.text);
  }
  const over = await rerank({ query: QUERY, documents: ['a', long] });
  assert.match(over.json.error.message, /documents\[1\] with the query has \d+ tokens, more than the context of 400/);
  const notJson = await raw(srv.base, '/v1/rerank', { body: '{"query": ' });
  assert.equal(notJson.status, 400);
  // the server is still up and scoring
  assert.equal((await rerank({ query: QUERY, documents: DOCS })).status, 200);
});

test('a rerank-only server: no chat or embedding routes', async () => {
  const c = await raw(srv.base, '/v1/chat/completions', { body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] }) });
  assert.equal(c.status, 404);
  assert.match(c.text, /reranks only/);
  const e = await raw(srv.base, '/v1/embeddings', { body: JSON.stringify({ input: 'hi' }) });
  assert.equal(e.status, 404);
});

test('the cross-encoder kind (XLM-R with one label): sigmoid scores in order; no instruction', async () => {
  const xr = path.join(ROOT, 'tests', 'data', 'bert', 'xlmr-reranker-tiny');
  const s = await startServer(['--rerank-model', xr], { model: null });
  try {
    const body = { query: 'where is the cat', documents: ['The cat sat on the mat.', 'hello', 'running cats'] };
    const r = await raw(s.base, '/v1/rerank', { body: JSON.stringify(body) });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.results.length, 3);
    for (let i = 1; i < 3; i++) assert.ok(r.json.results[i - 1].relevance_score >= r.json.results[i].relevance_score);
    for (const x of r.json.results) assert.ok(x.relevance_score > 0 && x.relevance_score < 1);
    const ins = await raw(s.base, '/v1/rerank', { body: JSON.stringify({ ...body, instruction: 'x' }) });
    assert.equal(ins.status, 400, ins.text);
    assert.equal(ins.json.error.param, 'instruction');
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});

test('beside a chat model; a model that is not a reranker is refused at start', async () => {
  const s = await startServer(['--rerank-model', RR, '-c', '400']);
  try {
    const r = await raw(s.base, '/v1/rerank', { body: JSON.stringify({ query: QUERY, documents: DOCS }) });
    assert.equal(r.status, 200, r.text);
    const c = await raw(s.base, '/v1/chat/completions', {
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }) });
    assert.equal(c.status, 200, c.text);
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
  const emb = path.join(ROOT, 'tests', 'data', 'embed', 'qwen3-embedding-tiny');
  const bad = await startServer(['--rerank-model', emb], { model: null }).then(
    async (x) => { await x.stop(); return null; }, (e) => e.message);
  assert.ok(bad && /not a reranker/.test(bad), bad);
});
