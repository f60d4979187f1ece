#!/usr/bin/env node
// Soak: many streaming clients against the real server for a long time, with
// the ways clients misbehave mixed in, checking that nothing is lost or leaks.
//
//   node bench/soak.mjs [--model DIR] [--clients 64] [--seconds 600] [-np 8] [--seed 1] [--json]
//
// Each client loops over requests, each one of (chosen at random):
//   normal      streamed chat, read at full speed: must end with [DONE] and usage
//   nonstream   non-streamed chat: must be a chat.completion with usage
//   slow        streamed, read slowly (pauses between reads): must end with [DONE]
//   halfclose   raw socket that closes its sending side after the request
//               (streamed or not, at random): must get the whole answer
//   disconnect  streamed, the client leaves after a random number of chunks
//               (intended: counted, not a failure)
//   abortwait   non-streamed, the client leaves before the answer (intended)
// A failure is a request of the first four kinds that did not complete
// correctly, or a server that crashed. At the end: requests served by kind,
// failures (must be 0), the server's RSS at start and end, /health, and a
// final request served at once (no row or KV leaked). Exit code 1 on any failure.
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, MODEL } from '../tests/e2e/harness.mjs';

const args = process.argv.slice(2);
const opt = (names, dflt) => {
  for (let i = 0; i < args.length - 1; i++) if (names.includes(args[i])) return args[i + 1];
  return dflt;
};
const model = path.resolve(opt(['--model', '-m'], MODEL));
const CLIENTS = Number(opt(['--clients'], 64));
const SECONDS = Number(opt(['--seconds'], 600));
const NP = opt(['-np', '--parallel'], '8');
let seed = Number(opt(['--seed'], 1)) >>> 0 || 1;
const asJson = args.includes('--json');

const rand = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
};
const pick = (xs) => xs[Math.floor(rand() * xs.length)];
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rss = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024;

const srv = await startServer(['-np', NP, '-c', '2048', '--timeout', '30']);
const port = srv.port;
const body = (stream, extra = {}) =>
  JSON.stringify({
    messages: [{ role: 'user', content: pick(['Tell me a fortune.', 'Tell me a joke about computers.', 'Give me some wisdom about love.']) }],
    max_tokens: 8 + Math.floor(rand() * 120),
    temperature: 0.8,
    seed: Math.floor(rand() * 1e9),
    stream,
    ...(stream ? { stream_options: { include_usage: true } } : {}),
    ...extra,
  });

const count = {};
const failures = [];
const bump = (k) => (count[k] = (count[k] || 0) + 1);
const fail = (kind, why) => {
  failures.push(`${kind}: ${why}`);
  bump(`${kind}_failed`);
};

function checkSse(text) {
  const ev = text.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  if (ev.at(-1) !== '[DONE]') return 'no [DONE]';
  const u = JSON.parse(ev.at(-2));
  if (!u.usage || !(u.usage.completion_tokens >= 1)) return 'no usage';
  return null;
}

async function streamed(kind, { slow = false, leaveAfter = 0 } = {}) {
  const ctl = new AbortController();
  const r = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
    method: 'POST',
    signal: ctl.signal,
    headers: { 'content-type': 'application/json' },
    body: body(true),
  });
  if (r.status !== 200) return fail(kind, `status ${r.status}`);
  const reader = r.body.getReader();
  let text = '', chunks = 0;
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    text += dec.decode(value, { stream: true });
    chunks++;
    if (leaveAfter && chunks >= leaveAfter) {
      ctl.abort();
      return bump(kind);
    }
    if (slow) await sleep(20 + rand() * 200);
  }
  const bad = checkSse(text);
  return bad ? fail(kind, bad) : bump(kind);
}

async function nonstream(kind) {
  const r = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body(false) });
  const j = await r.json().catch(() => null);
  if (r.status !== 200 || j?.object !== 'chat.completion' || !(j.usage?.completion_tokens >= 1)) return fail(kind, `status ${r.status}`);
  bump(kind);
}

function rawRequest(kind, { stream, halfClose, leaveMs = 0 }) {
  const b = body(stream);
  const req = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`;
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const parts = [];
    let done = false;
    const end = (why) => {
      if (done) return;
      done = true;
      clearTimeout(t);
      s.destroy();
      if (leaveMs) return resolve(bump(kind));
      if (why !== 'end') return resolve(fail(kind, why));
      const buf = Buffer.concat(parts);
      const he = buf.indexOf('\r\n\r\n');
      const head = buf.toString('latin1', 0, he);
      if (!/^HTTP\/1\.1 200/.test(head)) return resolve(fail(kind, head.split('\r\n')[0]));
      let rest = buf.subarray(he + 4);
      const pieces = [];
      if (/transfer-encoding: chunked/i.test(head)) {
        for (;;) {
          const nl = rest.indexOf('\r\n');
          const n = parseInt(rest.toString('latin1', 0, nl), 16);
          if (!n) break;
          pieces.push(rest.subarray(nl + 2, nl + 2 + n));
          rest = rest.subarray(nl + 2 + n + 2);
        }
        rest = Buffer.concat(pieces);
      }
      const txt = rest.toString('utf8');
      if (stream) {
        const bad = checkSse(txt);
        return resolve(bad ? fail(kind, bad) : bump(kind));
      }
      try {
        const j = JSON.parse(txt);
        return resolve(j.object === 'chat.completion' ? bump(kind) : fail(kind, 'not a completion'));
      } catch {
        return resolve(fail(kind, 'bad JSON'));
      }
    };
    const t = setTimeout(() => end('timeout'), leaveMs || 120000);
    s.on('data', (d) => parts.push(d));
    s.on('end', () => end('end'));
    s.on('error', (e) => end(`socket ${e.code}`));
    s.on('connect', () => {
      s.write(req);
      if (halfClose) s.end();
    });
  });
}

const rss0 = rss(srv.proc.pid);
const t0 = Date.now();
async function client() {
  while (Date.now() - t0 < SECONDS * 1000) {
    const x = rand();
    try {
      if (x < 0.3) await streamed('normal');
      else if (x < 0.45) await nonstream('nonstream');
      else if (x < 0.6) await streamed('slow', { slow: true });
      else if (x < 0.75) await rawRequest('halfclose', { stream: rand() < 0.5, halfClose: true });
      else if (x < 0.9) await streamed('disconnect', { leaveAfter: 1 + Math.floor(rand() * 10) });
      else await rawRequest('abortwait', { stream: false, halfClose: false, leaveMs: 5 + Math.floor(rand() * 50) });
    } catch (e) {
      if (e.name === 'AbortError') bump('disconnect');
      else fail('client', e.message);
    }
    if (srv.proc.exitCode !== null || srv.proc.signalCode !== null) {
      fail('server', `exited (${srv.proc.exitCode ?? srv.proc.signalCode})`);
      return;
    }
  }
}
await Promise.all(Array.from({ length: CLIENTS }, client));
await sleep(500);
const rss1 = rss(srv.proc.pid);
const h = await fetch(`http://127.0.0.1:${port}/health`).then((r) => r.status).catch(() => 0);
if (h !== 200) fail('server', `/health ${h}`);
const tf = Date.now();
const last = await fetch(`http://127.0.0.1:${port}/v1/chat/completions`, { method: 'POST', body: body(false, { max_tokens: 4 }) }).then((r) => r.status).catch(() => 0);
if (last !== 200) fail('server', `final request ${last}`);
const finalMs = Date.now() - tf;
const stop = await srv.stop();
if (stop.code !== 0) fail('server', `exit code ${stop.code}`);
const served = Object.entries(count).filter(([k]) => !k.endsWith('_failed')).reduce((a, [, v]) => a + v, 0);
const out = { clients: CLIENTS, seconds: SECONDS, parallel: Number(NP), requests: served, by_kind: count, failures: failures.length, rss_start_mib: Math.round(rss0), rss_end_mib: Math.round(rss1), final_request_ms: finalMs };
if (asJson) console.log(JSON.stringify(out));
else {
  console.log(`soak: ${CLIENTS} clients, ${SECONDS} s, -np ${NP}: ${served} requests, ${failures.length} failures`);
  console.log(`  by kind: ${JSON.stringify(count)}`);
  console.log(`  server RSS: ${out.rss_start_mib} MiB at start, ${out.rss_end_mib} MiB at the end; final request ${finalMs} ms`);
  for (const f of failures.slice(0, 20)) console.log(`  failure: ${f}`);
}
process.exit(failures.length ? 1 : 0);
