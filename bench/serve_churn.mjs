#!/usr/bin/env node
// Memory under churn: many clients with varied prompts that cancel at random,
// the server's RSS sampled against the prefix cache's count and the KV budget.
//
//   node bench/serve_churn.mjs [--bin PATH] [--model DIR] [--clients 64] [--seconds 300] [--every 5]
//                              [--seed 1] [--csv FILE] [--log FILE] [--json] [-- SERVER FLAGS...]
//
// Each client loops over requests: chat or completions, a prompt of random
// words (a third of them a longer version of an earlier prompt, as a chat's
// next turn is: so entries are hit, and covered ones replaced), max_tokens
// at random, streamed or not, and about half of them cancelled after a random
// time (the socket closed mid-stream or while waiting); 2% ask for more
// tokens than the context holds (a deliberate 400). The server runs with its
// default flags plus those after `--`, its cache folder in a temporary
// directory. Every --every seconds: the server's RSS (/proc/PID/status), its
// CPU time, the prefix cache's counted bytes and entries (/stats) and the KV
// budget; /health is timed every 100 ms from a worker thread. At the end:
// requests by outcome, failures (anything but a 2xx, a deliberate 400 or a
// cancel of ours: must be 0), /health's p50/p99, RSS's peak and its spread
// over the last half of the run (--csv: the samples; --log: the server's
// log). Exit code 1 on any failure. docs/NOTES.md, "Memory under churn", has
// its figures.
import fs from 'node:fs';
import path from 'node:path';
import { Worker } from 'node:worker_threads';

const args = process.argv.slice(2);
const dd = args.indexOf('--');
const own = dd >= 0 ? args.slice(0, dd) : args, serverFlags = dd >= 0 ? args.slice(dd + 1) : [];
const opt = (names, dflt) => {
  for (let i = 0; i < own.length - 1; i++) if (names.includes(own[i])) return own[i + 1];
  return dflt;
};
if (opt(['--bin'], null)) process.env.OSPREY_BIN = path.resolve(opt(['--bin'], null));
const { startServer, MODEL } = await import('../tests/e2e/harness.mjs');
const model = path.resolve(opt(['--model', '-m'], MODEL));
const CLIENTS = Number(opt(['--clients'], 64));
const SECONDS = Number(opt(['--seconds'], 300));
const EVERY = Number(opt(['--every'], 5));
const csv = opt(['--csv'], null);
const logFile = opt(['--log'], null);
const asJson = own.includes('--json');
let seed = Number(opt(['--seed'], 1)) >>> 0 || 1;

const rand = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
};
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const status = (pid) => fs.readFileSync(`/proc/${pid}/status`, 'utf8');
const kib = (s, key) => Number(new RegExp(`${key}:\\s+(\\d+)`).exec(s)?.[1] ?? 0);
const MiB = (b) => b / 1048576;

const WORDS = ('fortune luck star moon river stone cloud wind light shadow garden road door window friend stranger ' +
  'journey morning evening winter summer autumn spring harvest ocean mountain forest candle letter secret promise ' +
  'dream silver golden quiet bright ancient little gentle patient brave careful sudden distant hidden open wise ' +
  'foolish happy heavy swift slow honest curious tomorrow yesterday today always never often rarely together alone ' +
  'listen wander gather follow remember forget discover believe return arrive leave build carry share answer').split(' ');
const words = (n) => Array.from({ length: n }, () => WORDS[int(0, WORDS.length - 1)]).join(' ');

const srv = await startServer(['--timeout', '30', ...serverFlags], { model });
const pid = srv.proc.pid, base = srv.base;
const budget = /budget ([\d.]+) MiB/.exec(srv.log())?.[1];

const count = {};
const failures = [];
const bump = (k) => (count[k] = (count[k] || 0) + 1);
const fail = (why) => {
  failures.push(why);
  bump('failed');
};

const earlier = []; // prompts to continue, as a chat's next turn does
function prompt() {
  if (earlier.length && rand() < 1 / 3) return earlier[int(0, earlier.length - 1)] + ' ' + words(int(5, 60));
  const p = words(int(4, 400));
  if (earlier.length < 256) earlier.push(p);
  else earlier[int(0, 255)] = p;
  return p;
}

async function one() {
  const chat = rand() < 0.7, stream = rand() < 0.5, bad = rand() < 0.02;
  const cancelMs = rand() < 0.5 ? int(0, 1500) : 0;
  const text = prompt();
  const body = {
    max_tokens: bad ? 100000 : int(1, 200),
    temperature: rand() < 0.5 ? 0 : 0.8,
    seed: int(0, 1e9),
    stream,
    ...(chat ? { messages: [{ role: 'user', content: text }] } : { prompt: text }),
  };
  const ctl = new AbortController();
  const timer = cancelMs ? setTimeout(() => ctl.abort(), cancelMs) : null;
  try {
    const r = await fetch(`${base}/v1/${chat ? 'chat/completions' : 'completions'}`, {
      method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    });
    const t = await r.text();
    if (bad) return r.status === 400 ? bump('bad_400') : fail(`deliberate 400 answered ${r.status}`);
    if (r.status !== 200) return fail(`status ${r.status}: ${t.slice(0, 200)}`);
    if (stream && !t.includes('data: [DONE]')) return fail(`a stream without [DONE]: ${t.slice(-200)}`);
    if (!stream && !JSON.parse(t).usage) return fail(`no usage: ${t.slice(0, 200)}`);
    bump(stream ? 'ok_stream' : 'ok');
  } catch (e) {
    if (e.name === 'AbortError' && ctl.signal.aborted) return bump('cancelled');
    fail(`${e.name}: ${e.message}`);
  } finally {
    clearTimeout(timer);
  }
}

const t0 = Date.now();
const running = () => Date.now() - t0 < SECONDS * 1000 && srv.proc.exitCode === null && srv.proc.signalCode === null;
async function client() {
  while (running()) await one();
}

// /health is timed from a worker thread of its own, so the time the main thread's 64 clients keep its event
// loop busy is not counted as the server's
const health = [];
const PROBE = `
  const { parentPort, workerData } = require('node:worker_threads');
  let stop = false;
  parentPort.on('message', () => (stop = true));
  (async () => {
    while (!stop) {
      const t = performance.now();
      const r = await fetch(workerData + '/health').catch(() => null);
      if (r) await r.arrayBuffer();
      parentPort.postMessage(r && r.status === 200 ? performance.now() - t : -(r ? r.status : 1));
      await new Promise((res) => setTimeout(res, 100));
    }
    parentPort.close();
  })();`;
async function prober() {
  const w = new Worker(PROBE, { eval: true, workerData: base });
  w.on('message', (ms) => (ms >= 0 ? health.push(ms) : fail(`/health ${-ms === 1 ? 'no answer' : -ms}`)));
  while (running()) await sleep(200);
  w.postMessage('stop');
  await new Promise((res) => w.on('exit', res));
}

const samples = [];
async function sample() {
  const st = await fetch(`${base}/stats`).then((r) => r.json()).catch(() => null);
  let s;
  try {
    s = status(pid);
  } catch {
    return;
  }
  const pc = st?.prompt_cache;
  const cpu = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' '); // utime, stime: fields 14, 15
  const row = {
    t: Math.round((Date.now() - t0) / 1000),
    rss_mib: kib(s, 'VmRSS') / 1024,
    anon_mib: kib(s, 'RssAnon') / 1024,
    threads: kib(s, 'Threads'),
    user_s: Number(cpu[11]) / 100,
    sys_s: Number(cpu[12]) / 100,
    cache_mib: pc ? MiB(pc.bytes) : 0,
    entries: pc ? pc.entries : 0,
    reserved_mib: st ? MiB(st.kv.reserved_bytes) : 0,
    budget_mib: st ? MiB(st.kv.budget_bytes) : Number(budget),
    requests: Object.values(count).reduce((a, b) => a + b, 0),
  };
  samples.push(row);
  if (!asJson)
    console.log(`${String(row.t).padStart(5)} s  RSS ${row.rss_mib.toFixed(0).padStart(6)} MiB  cache ${row.cache_mib.toFixed(0).padStart(6)} MiB` +
      ` (${row.entries} entries)  reserved ${row.reserved_mib.toFixed(1)} MiB  budget ${row.budget_mib.toFixed(0)} MiB` +
      `  threads ${row.threads}  requests ${row.requests}  cpu ${row.user_s.toFixed(0)}+${row.sys_s.toFixed(0)} s`);
}
async function sampler() {
  while (running()) {
    await sample();
    await sleep(EVERY * 1000);
  }
}

await sample();
await Promise.all([...Array.from({ length: CLIENTS }, client), prober(), sampler()]);
await sleep(1000);
await sample();
const stats = await fetch(`${base}/stats`).then((r) => r.json()).catch(() => null);
const tStop = Date.now();
const stop = await srv.stop(600000); // a clean shutdown writes every resident cache entry to disk first
const stopS = (Date.now() - tStop) / 1000;
if (stop.code !== 0) fail(`server exit ${stop.code ?? stop.signal}`);
if (logFile) fs.writeFileSync(logFile, srv.log());

const q = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : 0;
};
const tail = samples.filter((x) => x.t >= SECONDS / 2 && x.t <= SECONDS); // under load
const tmin = Math.min(...tail.map((x) => x.rss_mib)), tmax = Math.max(...tail.map((x) => x.rss_mib));
const out = {
  clients: CLIENTS, seconds: SECONDS, server_flags: serverFlags.join(' '), by_outcome: count, failures: failures.length,
  budget_mib: samples.at(-1)?.budget_mib, rss_start_mib: samples[0]?.rss_mib, rss_peak_mib: Math.max(...samples.map((x) => x.rss_mib)),
  rss_end_mib: samples.at(-1)?.rss_mib, rss_last_half_min_mib: tmin, rss_last_half_max_mib: tmax,
  rss_last_half_spread: (tmax - tmin) / tmax, cache_end_mib: samples.at(-1)?.cache_mib,
  health_p50_ms: q(health, 0.5), health_p99_ms: q(health, 0.99), tokens: stats?.tokens ?? null,
  server_cpu_s: samples.at(-1) ? samples.at(-1).user_s + samples.at(-1).sys_s : null, stop_s: stopS,
  failure_list: failures.slice(0, 20), prompt_cache: stats?.prompt_cache ?? null,
};
if (csv) fs.writeFileSync(csv, Object.keys(samples[0]).join(',') + '\n' + samples.map((r) => Object.values(r).map((v) => (typeof v === 'number' && !Number.isInteger(v) ? v.toFixed(1) : v)).join(',')).join('\n') + '\n');
if (asJson) console.log(JSON.stringify(out));
else {
  const f = (x) => x?.toFixed(0);
  console.log(`churn: ${CLIENTS} clients, ${SECONDS} s, flags '${out.server_flags}': ${JSON.stringify(count)}, ${failures.length} failures`);
  console.log(`  RSS ${f(out.rss_start_mib)} MiB at start, peak ${f(out.rss_peak_mib)}, end ${f(out.rss_end_mib)}; last half ` +
    `${f(tmin)}-${f(tmax)} MiB (${(100 * out.rss_last_half_spread).toFixed(1)}%); cache ${f(out.cache_end_mib)} MiB counted; budget ${f(out.budget_mib)} MiB`);
  console.log(`  /health p50 ${out.health_p50_ms.toFixed(1)} ms, p99 ${out.health_p99_ms.toFixed(1)} ms; tokens ${JSON.stringify(out.tokens)}; ` +
    `server CPU ${out.server_cpu_s?.toFixed(0)} s; stopped in ${stopS.toFixed(1)} s`);
  for (const x of failures.slice(0, 20)) console.log(`  failure: ${x}`);
}
process.exit(failures.length ? 1 : 0);
