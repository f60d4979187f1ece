// Starts the real `osprey serve` binary on a free port and stops it cleanly.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const ROOT = path.resolve(here, '..', '..');
export const BIN = process.env.OSPREY_BIN || path.join(ROOT, 'build', 'osprey');
export const MODEL = process.env.OSPREY_TEST_MODEL || path.join(ROOT, 'models', 'fortune');

// The servers' cache folder (the prefix cache persists there): one per test
// file, removed when it exits, so tests neither read nor leave a user's cache.
export const CACHE_HOME = fs.mkdtempSync(path.join(os.tmpdir(), 'osp_e2e_cache_'));
process.on('exit', () => fs.rmSync(CACHE_HOME, { recursive: true, force: true }));

export async function startServer(args = [], { model = MODEL, timeoutMs = 60000, env = {} } = {}) {
  const proc = spawn(BIN, ['serve', ...(model ? [model] : []), '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, XDG_CACHE_HOME: CACHE_HOME, ...env },
  });
  let log = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/[^\s]*:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.stdout.on('data', (d) => (log += d.toString()));
    exited.then(({ code, signal }) => reject(new Error(`server exited (${code ?? signal}) before listening:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  const t0 = Date.now();
  for (;;) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) break;
    if (r && r.status !== 503) throw new Error(`/health answered ${r.status}`);
    if (proc.exitCode !== null || proc.signalCode !== null)
      throw new Error(`server exited (${proc.exitCode ?? proc.signalCode}) while loading:\n${log}`);
    if (Date.now() - t0 > timeoutMs) throw new Error(`server not ready:\n${log}`);
    await new Promise((res) => setTimeout(res, 20));
  }
  // OSPREY_EXPECT_DEVICE=cuda|cpu (scripts/test-gpu.sh): the model must have loaded there, not fallen back
  const want = process.env.OSPREY_EXPECT_DEVICE;
  if (want && model) {
    const m = log.match(/loaded .*? on (\w+)/); // the first " on " (a device name may hold another)
    if (!m || m[1] !== want) {
      proc.kill('SIGKILL');
      throw new Error(`the model loaded on ${m ? m[1] : '(no load line)'}, not ${want}:\n${log}`);
    }
  }
  return {
    port,
    base,
    proc,
    exited,
    log: () => log,
    // SIGTERM, then the exit status (it must exit on its own, cleanly)
    async stop(timeout = 30000) {
      if (proc.exitCode !== null) return { code: proc.exitCode };
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), timeout);
      const r = await exited;
      clearTimeout(t);
      return r;
    },
  };
}

// Raw HTTP (node's fetch) returning { status, json, text, headers }.
export async function raw(base, route, { method = 'POST', body, headers = {} } = {}) {
  const r = await fetch(base + route, { method, body, headers: { 'content-type': 'application/json', ...headers } });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: r.status, json, text, headers: r.headers };
}

// Parse an SSE body into its data payloads (objects, and the literal '[DONE]').
export function sseEvents(text) {
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: '))
    .map((e) => e.slice(6))
    .map((d) => (d === '[DONE]' ? d : JSON.parse(d)));
}
