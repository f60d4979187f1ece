#!/usr/bin/env node
// Server overhead: decode speed over HTTP streaming vs `osprey bench`, and
// time to first token over HTTP vs the engine's prefill time, on one model,
// measured in one run.
//
//   node bench/serve_bench.mjs [--model DIR] [-p 512] [-n 128] [--runs 3] [-t THREADS] [--json]
//
// The HTTP side sends a /v1/completions request with the same prompt ids
// as `osprey bench` (token-array prompt), temperature 0, its eos tokens
// biased away so all n tokens are generated, stream: true with usage; it
// times the first and the last chunk on the client. Medians of --runs runs.
// A model without tokenizer.json (osprey synth output) gets one with
// --tokenizer DIR (copied into a temporary folder next to links to the
// weights).
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { startServer, BIN, MODEL } from '../tests/e2e/harness.mjs';

const args = process.argv.slice(2);
const opt = (names, dflt) => {
  for (let i = 0; i < args.length - 1; i++) if (names.includes(args[i])) return args[i + 1];
  return dflt;
};
let model = path.resolve(opt(['--model', '-m'], MODEL));
const P = Number(opt(['-p'], 512)), N = Number(opt(['-n'], 128)), RUNS = Number(opt(['--runs'], 3));
const threads = opt(['-t', '--threads'], null);
const tokDir = opt(['--tokenizer'], null);
const asJson = args.includes('--json');

if (tokDir) {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'osp-serve-bench-'));
  for (const f of fs.readdirSync(model)) fs.symlinkSync(path.join(model, f), path.join(tmp, f));
  for (const f of fs.readdirSync(tokDir)) {
    const src = path.join(tokDir, f);
    if (f.endsWith('.gz')) fs.writeFileSync(path.join(tmp, f.slice(0, -3)), spawnSync('gzip', ['-dc', src], { maxBuffer: 1 << 30 }).stdout);
    else if (!fs.existsSync(path.join(tmp, f))) fs.copyFileSync(src, path.join(tmp, f));
  }
  model = tmp;
}

const cfg = JSON.parse(fs.readFileSync(path.join(model, 'config.json'), 'utf8'));
const tc = cfg.text_config ?? cfg;
const V = tc.vocab_size;
const eos = [tc.eos_token_id ?? cfg.eos_token_id].flat().filter((x) => x !== undefined && x !== null);
const ids = Array.from({ length: P }, (_, i) => (i * 7919 + 13) % V); // osprey bench's prompt
const tflag = threads ? ['-t', String(threads)] : [];
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

function engineBench() {
  const r = spawnSync(BIN, ['bench', '--model', model, '-p', String(P), '-n', String(N), '--json', ...tflag], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`osprey bench failed: ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop());
}

// One streamed request over a plain socket (a lean client: what is timed
// is the server, not an HTTP library), decoding the chunked SSE body.
function httpRun(port) {
  const body = JSON.stringify({
    prompt: ids,
    max_tokens: N,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
    logit_bias: Object.fromEntries(eos.map((e) => [String(e), -100])),
  });
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let raw = Buffer.alloc(0), headerDone = false, sse = '', tFirst = 0, tLast = 0, usage = null, timings = null;
    const t0 = performance.now();
    sock.on('connect', () =>
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`),
    );
    sock.on('data', (d) => {
      const now = performance.now();
      raw = Buffer.concat([raw, d]);
      if (!headerDone) {
        const k = raw.indexOf('\r\n\r\n');
        if (k < 0) return;
        headerDone = true;
        raw = raw.subarray(k + 4);
      }
      for (;;) { // chunked transfer coding
        const k = raw.indexOf('\r\n');
        if (k < 0) break;
        const size = parseInt(raw.subarray(0, k).toString(), 16);
        if (raw.length < k + 2 + size + 2) break;
        sse += raw.subarray(k + 2, k + 2 + size).toString();
        raw = raw.subarray(k + 2 + size + 2);
      }
      let e;
      while ((e = sse.indexOf('\n\n')) >= 0) {
        const ev = sse.slice(0, e);
        sse = sse.slice(e + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const o = JSON.parse(ev.slice(6));
        if (o.error) return reject(new Error(JSON.stringify(o.error)));
        if (o.usage) (usage = o.usage), (timings = o.timings);
        if (o.choices?.[0]?.text) {
          if (!tFirst) tFirst = now;
          tLast = now;
        }
      }
    });
    sock.on('error', reject);
    sock.on('close', () => {
      if (!usage) return reject(new Error('no usage in the stream'));
      const n = usage.completion_tokens;
      resolve({
        ttft_ms: tFirst - t0,
        engine_ttft_ms: timings.ttft_ms,
        decode_tok_s: (n - 1) / ((tLast - tFirst) / 1e3),
        engine_decode_tok_s: timings.predicted_per_second,
        n,
      });
    });
  });
}

const srv = await startServer(tflag, { model });
let engine = [], http = [];
try {
  await httpRun(srv.port); // warm-up: page cache, thread pool
  for (let i = 0; i < RUNS; i++) {
    // alternate so both sides see the same machine state
    engine.push(engineBench());
    http.push(await httpRun(srv.port));
  }
} finally {
  await srv.stop();
  if (tokDir) fs.rmSync(model, { recursive: true, force: true });
}
const eDecode = median(engine.map((e) => e.decode_tok_s));
const ePrefillMs = median(engine.map((e) => (1000 * P) / e.prefill_tok_s));
const hDecode = median(http.map((h) => h.decode_tok_s));
const hTtft = median(http.map((h) => h.ttft_ms));
const hEngineTtft = median(http.map((h) => h.engine_ttft_ms));
if (args.includes('--verbose')) console.error(JSON.stringify({ engine, http }));
const out = {
  model: path.basename(path.resolve(opt(['--model', '-m'], MODEL))),
  prompt_tokens: P,
  decode_tokens: N,
  runs: RUNS,
  bench_decode_tok_s: eDecode,
  http_decode_tok_s: hDecode,
  http_vs_bench_decode: hDecode / eDecode,
  bench_prefill_ms: ePrefillMs,
  http_ttft_ms: hTtft,
  http_ttft_minus_bench_prefill_ms: hTtft - ePrefillMs,
  http_ttft_minus_server_engine_ttft_ms: hTtft - hEngineTtft,
};
if (asJson) console.log(JSON.stringify(out));
else {
  console.log(`model ${out.model}: prompt ${P} tokens, ${N} generated, median of ${RUNS}`);
  console.log(`decode: osprey bench ${eDecode.toFixed(2)} tok/s, HTTP streaming ${hDecode.toFixed(2)} tok/s -> ratio ${out.http_vs_bench_decode.toFixed(4)}`);
  console.log(`first token: HTTP ${hTtft.toFixed(2)} ms; osprey bench prefill ${ePrefillMs.toFixed(2)} ms (+${out.http_ttft_minus_bench_prefill_ms.toFixed(2)} ms); the server's own engine TTFT +${out.http_ttft_minus_server_engine_ttft_ms.toFixed(2)} ms`);
}
