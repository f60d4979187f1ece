#!/usr/bin/env node
// Structured output's cost in the server: aggregate decode tokens/s of C
// concurrent streams held to a JSON Schema against the same streams without
// one, on one server, measured in one run.
//
//   node bench/serve_structured.mjs [--model DIR] [-c 8] [-n 256] [--runs 5] [--bin PATH] [--json] [-- SERVER FLAGS...]
//
// Each round sends C /v1/completions requests at once (stream: true), each
// for exactly n tokens: temperature 0.8, the model's eos tokens biased away,
// and a schema whose language has no end (an object holding an unbounded
// array of objects), so that a constrained stream is never forced to stop;
// aggregate tokens/s = all completion tokens / the round's wall time. Rounds
// alternate plain and constrained (one of each per run; the first pair is a
// warm-up: the grammar's compile and its first masks). The server's CPU time
// per token (all threads, /proc) is reported beside. Medians of --runs, and
// the median of each run's ratio (its pair ran back to back: steadier on a
// shared machine).
import fs from 'node:fs';
import path from 'node:path';

const args = process.argv.slice(2);
const dd = args.indexOf('--');
const mine = dd >= 0 ? args.slice(0, dd) : args, serverFlags = dd >= 0 ? args.slice(dd + 1) : [];
const opt = (names, dflt) => {
  for (let i = 0; i < mine.length - 1; i++) if (names.includes(mine[i])) return mine[i + 1];
  return dflt;
};
if (opt(['--bin'], null)) process.env.OSPREY_BIN = path.resolve(opt(['--bin'], null)); // (read by the harness on import)
const { startServer, MODEL } = await import('../tests/e2e/harness.mjs');
const model = path.resolve(opt(['--model', '-m'], MODEL));
const C = Number(opt(['-c'], 8)), N = Number(opt(['-n'], 256)), RUNS = Number(opt(['--runs'], 5));
const asJson = mine.includes('--json');

const schema = {
  type: 'object',
  properties: {
    title: { type: 'string' },
    year: { type: 'integer', minimum: 1900, maximum: 2100 },
    items: {
      type: 'array',
      items: {
        type: 'object',
        properties: { name: { type: 'string' }, qty: { type: 'integer' }, kind: { enum: ['book', 'tool', 'food'] } },
        required: ['name', 'qty', 'kind'],
      },
    },
  },
  required: ['title', 'year', 'items'],
};

function eosIds() {
  const ids = new Set();
  for (const f of ['config.json', 'generation_config.json']) {
    try {
      const e = JSON.parse(fs.readFileSync(path.join(model, f), 'utf8')).eos_token_id;
      for (const x of [e].flat()) if (Number.isInteger(x)) ids.add(x);
    } catch {}
  }
  return [...ids];
}
const bias = Object.fromEntries(eosIds().map((id) => [String(id), -100]));

async function one(base, seed, constrained) {
  const body = { prompt: 'Here is a list of things, as JSON:', max_tokens: N, temperature: 0.8, seed, logit_bias: bias,
                 stream: true, stream_options: { include_usage: true } };
  if (constrained) body.response_format = { type: 'json_schema', json_schema: { name: 'list', schema } };
  const r = await fetch(`${base}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (r.status !== 200) throw new Error(`${r.status}: ${await r.text()}`);
  const text = await r.text();
  let tokens = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: {')) continue;
    const u = JSON.parse(line.slice(6)).usage;
    if (u) tokens = u.completion_tokens;
  }
  return tokens;
}

// the server's CPU time (user + system, all threads) in seconds: on a shared machine the steadier figure
const TICK = 100; // USER_HZ
function cpuSeconds(pid) {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) / TICK;
}

async function round(srv, constrained, seed0) {
  const t0 = performance.now(), c0 = cpuSeconds(srv.proc.pid);
  const toks = await Promise.all(Array.from({ length: C }, (_, i) => one(srv.base, seed0 + i, constrained)));
  const s = (performance.now() - t0) / 1e3, n = toks.reduce((a, b) => a + b, 0);
  return { tokens: n, seconds: s, tok_s: n / s, cpu_us_tok: ((cpuSeconds(srv.proc.pid) - c0) / n) * 1e6 };
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const srv = await startServer(['--parallel', String(C), ...serverFlags], { model });
try {
  await round(srv, false, 1);
  await round(srv, true, 1);
  const plain = [], held = [];
  for (let r = 0; r < RUNS; r++) {
    for (const constrained of r % 2 ? [true, false] : [false, true]) // alternate which goes first
      (constrained ? held : plain).push(await round(srv, constrained, 100 + r * C));
  }
  const p = median(plain.map((x) => x.tok_s)), h = median(held.map((x) => x.tok_s));
  const pair = median(held.map((x, i) => x.tok_s / plain[i].tok_s)); // each run's pair ran back to back
  const out = { model: path.basename(model), streams: C, tokens_each: N, runs: RUNS, plain_tok_s: p, schema_tok_s: h,
                ratio: h / p, pair_ratio: pair, plain_cpu_us_tok: median(plain.map((x) => x.cpu_us_tok)),
                schema_cpu_us_tok: median(held.map((x) => x.cpu_us_tok)), plain: plain.map((x) => x.tok_s), schema: held.map((x) => x.tok_s),
                tokens: { plain: plain.map((x) => x.tokens), schema: held.map((x) => x.tokens) } };
  if (asJson) console.log(JSON.stringify(out));
  else
    console.log(`${out.model}: ${C} streams x ${N} tokens, median of ${RUNS}: plain ${p.toFixed(0)} tok/s, ` +
                `with a schema ${h.toFixed(0)} tok/s (${((h / p - 1) * 100).toFixed(1)}%; ` +
                `median of the runs' own ratios ${((pair - 1) * 100).toFixed(1)}%); server CPU per token: plain ` +
                `${out.plain_cpu_us_tok.toFixed(0)} us, with a schema ${out.schema_cpu_us_tok.toFixed(0)} us`);
} finally {
  await srv.stop();
}
