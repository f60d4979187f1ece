// Usage: node bench/serve_flood.mjs [--bin build/osprey] [--conns 1100] [--kind head|unauth|idle] [--args "..."]
// Starts `osprey serve` on the bundled model, opens --conns connections of one hostile kind and keeps them open,
// and measures /health (a new connection each time) during the flood and after it: latency percentiles, failures,
// the server's threads and RSS; then how long SIGTERM takes with a second flood open. Kinds:
//   head    a complete request head with Content-Length: 100 and no body
//   unauth  the same with a wrong API key (the server runs with --api-key)
//   idle    one GET /health each, then the connection sits idle (kept alive)
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const opt = (name, def) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? process.argv[i + 1] : def;
};
const bin = opt('bin', path.join(root, 'build', 'osprey'));
const conns = Number(opt('conns', '1100'));
const kind = opt('kind', 'head');
const extra = opt('args', '').split(' ').filter(Boolean);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const args = ['serve', path.join(root, 'models', 'fortune'), '--port', '0', '--drain-timeout', '2', ...extra];
if (kind === 'unauth') args.push('--api-key', 'sekrit');
const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
const port = await new Promise((res) => proc.stderr.on('data', (d) => {
  log += d;
  const m = /listening on http:\/\/[^\s]*:(\d+)/.exec(log);
  if (m) res(Number(m[1]));
}));
while (!log.includes('ready')) await sleep(20);

const data = {
  head: 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n',
  unauth: 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Length: 100\r\n\r\n',
  idle: 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n',
}[kind];

function open() {
  return new Promise((res) => {
    const s = net.connect(port, '127.0.0.1', () => { s.write(data); res(s); });
    s.on('error', () => res(s));
  });
}
async function flood() {
  const socks = [];
  for (let i = 0; i < conns; i += 50) socks.push(...(await Promise.all(Array.from({ length: Math.min(50, conns - i) }, open))));
  return socks;
}
async function health() {
  const t0 = performance.now();
  return new Promise((res) => {
    const s = net.connect(port, '127.0.0.1', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
    let text = '';
    s.on('data', (d) => (text += d));
    s.on('close', () => res({ ok: text.startsWith('HTTP/1.1 200'), ms: performance.now() - t0 }));
    s.on('error', () => {});
    setTimeout(() => s.destroy(), 5000);
  });
}
async function probe(label, n = 200) {
  const ms = [];
  let bad = 0;
  for (let i = 0; i < n; i++) {
    const h = await health();
    ms.push(h.ms);
    bad += !h.ok;
  }
  ms.sort((a, b) => a - b);
  const q = (p) => ms[Math.min(ms.length - 1, Math.floor(p * ms.length))].toFixed(2);
  const st = fs.readFileSync(`/proc/${proc.pid}/status`, 'utf8');
  console.log(`${label}: /health p50 ${q(0.5)} ms, p99 ${q(0.99)} ms, max ${q(1)} ms, failed ${bad}/${n}; ` +
    `threads ${/Threads:\s+(\d+)/.exec(st)[1]}, RSS ${(Number(/VmRSS:\s+(\d+)/.exec(st)[1]) / 1024).toFixed(0)} MiB`);
}

console.log(`${path.basename(bin)} ${args.slice(2).join(' ')}: ${conns} connections of kind '${kind}'`);
await probe('before');
let socks = await flood();
await sleep(300);
await probe('during');
const answered = socks.filter((s) => s.bytesRead > 0).length;
for (const s of socks) s.destroy();
await sleep(300);
await probe('after');
socks = await flood();
await sleep(300);
const t0 = Date.now();
proc.kill('SIGTERM');
const done = await Promise.race([new Promise((r) => proc.on('exit', r)).then(() => true), sleep(30000).then(() => false)]);
console.log(`answered during the flood: ${answered}/${conns}; SIGTERM with a flood open: ${done ? `exited after ${Date.now() - t0} ms` : 'still running after 30 s (killed)'}`);
if (!done) proc.kill('SIGKILL');
for (const s of socks) s.destroy();
