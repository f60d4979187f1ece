// Memory under churn (issue 35): clients with varied prompts that cancel at
// random fill the prefix cache and turn it over; the server's RSS must stay
// within the KV budget plus the documented overhead (README, "The server":
// what it holds idle after loading, plus a bound for connections and the
// C library's heaps) and level off. With the cache's KV blocks from the
// heap it did neither: the holes churn leaves between live blocks stayed
// resident and grew with the cache. bench/serve_churn.mjs is the long form.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer } from './harness.mjs';

// Memory bounds are checked on normal builds only (a sanitizer's shadow memory and quarantine grow on their own).
const SANITIZED = process.env.OSPREY_SANITIZED === '1';
const rss = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
const MiB = 1 << 20;
const OVERHEAD = 64 * MiB; // the README's bound for connections and heaps, above the idle RSS

let seed = 7;
const rand = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 4294967296;
};
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const WORDS = 'star moon river stone cloud wind light shadow garden road door window friend journey ocean forest'.split(' ');
const words = (n) => Array.from({ length: n }, () => WORDS[int(0, WORDS.length - 1)]).join(' ');

test('64 clients cancelling at random: RSS stays within the KV budget plus the overhead, and levels off once the cache is full', async () => {
  const srv = await startServer(['--prompt-cache-size', '0.125', '--prompt-cache-disk', '0.25', '--timeout', '30']);
  const pid = srv.proc.pid, base = srv.base;
  const failures = [];
  let done = 0, cancelled = 0;
  try {
    const budget = (await (await fetch(`${base}/stats`)).json()).kv.budget_bytes;
    const idle = rss(pid);
    // The run lasts `seconds`, and on a normal build also until RSS has been
    // sampled for 10 s after the cache first turned over (more evictions than
    // entries): a loaded machine answers fewer requests, and the levelling
    // is judged on a full cache, not on one still filling. At most 120 s.
    const t0 = Date.now(), seconds = SANITIZED ? 10 : 30, cap = 120, window = 10;
    const samples = []; // RSS each second
    let steadyAt = -1; // index of the first sample taken with the cache turned over
    const running = () => {
      const s = (Date.now() - t0) / 1000;
      if (s >= cap) return false;
      if (s < seconds) return true;
      return !SANITIZED && (steadyAt < 0 || samples.length - steadyAt < window);
    };
    const one = async () => {
      const stream = rand() < 0.5, cancelMs = rand() < 0.5 ? int(0, 800) : 0;
      const ctl = new AbortController();
      const timer = cancelMs ? setTimeout(() => ctl.abort(), cancelMs) : null;
      try {
        const r = await fetch(`${base}/v1/chat/completions`, {
          method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ messages: [{ role: 'user', content: words(int(4, 300)) }], max_tokens: int(1, 64), stream }),
        });
        const text = await r.text();
        if (r.status !== 200) failures.push(`status ${r.status}: ${text.slice(0, 200)}`);
        else done++;
      } catch (e) {
        if (ctl.signal.aborted) cancelled++;
        else failures.push(`${e.name}: ${e.message}`);
      } finally {
        clearTimeout(timer);
      }
    };
    const client = async () => {
      while (running()) await one();
    };
    const sampler = async () => {
      while (running()) {
        if (steadyAt < 0) {
          const pc = (await (await fetch(`${base}/stats`)).json()).prompt_cache;
          if (pc.evictions > pc.entries) steadyAt = samples.length;
        }
        samples.push(rss(pid));
        await new Promise((r) => setTimeout(r, 1000));
      }
    };
    await Promise.all([...Array.from({ length: 64 }, client), sampler()]);
    const st = await (await fetch(`${base}/stats`)).json();
    const peak = Math.max(...samples), last = steadyAt >= 0 ? samples.slice(steadyAt) : [];
    const msg = `idle ${(idle / MiB).toFixed(0)} MiB, peak ${(peak / MiB).toFixed(0)} MiB, budget ${(budget / MiB).toFixed(0)} MiB, ` +
      `cache ${(st.prompt_cache.bytes / MiB).toFixed(0)} MiB in ${st.prompt_cache.entries} entries, ` +
      `${st.prompt_cache.evictions} evictions; ${done} answered, ${cancelled} cancelled in ${((Date.now() - t0) / 1000).toFixed(0)} s, ` +
      `${steadyAt >= 0 ? samples.length - steadyAt : 0} samples with the cache turned over`;
    console.log(msg);
    assert.deepEqual(failures, []);
    assert.ok(done > 0 && cancelled > 0, msg);
    if (!SANITIZED) {
      assert.ok(st.prompt_cache.evictions > st.prompt_cache.entries && last.length >= window, `the cache did not turn over in time: ${msg}`);
      assert.ok(peak <= idle + budget + OVERHEAD, msg);
      const lo = Math.min(...last), hi = Math.max(...last);
      assert.ok(hi - lo <= 0.05 * hi, `RSS still moving with the cache full (${(lo / MiB).toFixed(0)}-${(hi / MiB).toFixed(0)} MiB): ${msg}`);
    }
    // /stats and /metrics report the process's resident memory, for a user to hold it to the same bound
    assert.ok(st.resident_bytes > 0, JSON.stringify(st));
    assert.match(await (await fetch(`${base}/metrics`)).text(), /^process_resident_memory_bytes \d+$/m);
    const h = await fetch(`${base}/health`);
    assert.equal(h.status, 200);
  } finally {
    assert.equal((await srv.stop()).code, 0, srv.log());
  }
});
