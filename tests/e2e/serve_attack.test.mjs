// The server under attack, round two (issue 35): each test is one finding of a hostile-client probe against the
// real binary, over raw sockets: floods at the connection limit, slow and stalled readers, slow and over-limit
// bodies, the API key at the head, the drain's deadline, refusals before the body.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, sseEvents } from './harness.mjs';

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
const NO_EOS = { 1: -100, 4: -100 }; // the bundled model's eos tokens: long answers on demand

// A raw connection that records what the server sends, when its first byte came, and when it closed.
function connect(port, data) {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    s.chunks = [];
    s.on('data', (d) => {
      if (!s.chunks.length) s.firstAt = Date.now();
      s.chunks.push(d);
    });
    s.on('close', () => (s.closedAt = Date.now()));
    s.on('error', () => {});
    s.text = () => Buffer.concat(s.chunks).toString('latin1');
    s.on('connect', () => {
      s.sentAt = Date.now();
      if (data) s.write(data);
      resolve(s);
    });
    s.once('error', reject);
  });
}

// GET /health on a new connection: its status and how long it took.
async function health(port) {
  const t0 = Date.now();
  const s = await connect(port, 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  while (!s.closedAt && Date.now() - t0 < 10000) await sleep(2);
  const m = /^HTTP\/1\.1 (\d+)/.exec(s.text());
  s.destroy();
  return { status: m ? Number(m[1]) : 0, ms: Date.now() - t0 };
}

// /health answers 200 within 100 ms (the best of three tries: a shared CI machine may stall one).
async function healthFast(port, what) {
  let best = Infinity;
  for (let i = 0; i < 3; i++) {
    const h = await health(port);
    assert.equal(h.status, 200, what);
    best = Math.min(best, h.ms);
  }
  assert.ok(best < 100, `${what}: /health took ${best} ms`);
}

async function flood(port, n, data) {
  const socks = [];
  for (let i = 0; i < n; i += 50)
    socks.push(...(await Promise.all(Array.from({ length: Math.min(50, n - i) }, () => connect(port, data)))));
  return socks;
}

const headOnly = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n';

async function exitsWithin(s, ms) {
  const t0 = Date.now();
  s.proc.kill('SIGTERM');
  const r = await Promise.race([s.exited, sleep(ms).then(() => null)]);
  if (!r) s.proc.kill('SIGKILL');
  assert.ok(r, `still running ${ms} ms after SIGTERM:\n${s.log().slice(-2000)}`);
  return { ...r, ms: Date.now() - t0 };
}

for (const [name, args, n] of [
  ['100 head-only connections at --max-connections 64', ['--max-connections', '64'], 100],
  ['1,100 head-only connections at the default limit', [], 1100],
]) {
  test(`1: ${name}: /health answers within 100 ms during and after; no connection closed unanswered; SIGTERM exits`, async () => {
    const s = await startServer([...args, '--drain-timeout', '2']);
    try {
      const socks = await flood(s.port, n, headOnly);
      await sleep(200);
      await healthFast(s.port, 'during the flood');
      // the server closed some to make room: each of them was answered (a 503), none cut silently
      await sleep(200);
      const closed = socks.filter((x) => x.closedAt);
      assert.ok(closed.length > 0, 'room was made');
      for (const x of closed) assert.match(x.text(), /^HTTP\/1\.1 503 /, 'an evicted connection is answered');
      for (const x of socks) x.destroy();
      await sleep(100);
      await healthFast(s.port, 'after the flood');
      // SIGTERM with a flood still open ends the process within the drain timeout
      const again = await flood(s.port, n, headOnly);
      await sleep(200);
      const r = await exitsWithin(s, 2000 + 3000);
      assert.equal(r.code, 0, s.log());
      for (const x of again) x.destroy();
    } finally {
      if (s.proc.exitCode === null) s.proc.kill('SIGKILL');
    }
  });
}

test('1: 1,100 idle kept-alive connections do not lock new clients out', async () => {
  const s = await startServer(['--max-connections', '256']);
  try {
    const socks = await flood(s.port, 1100, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    await sleep(300);
    await healthFast(s.port, 'with 1,100 kept-alive connections idle');
    for (const x of socks) x.destroy();
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});

test('3: with --api-key, 1,100 unauthenticated heads with unsent bodies get their 401 at once; /health stays fast', async () => {
  const s = await startServer(['--api-key', 'sekrit', '--drain-timeout', '2']);
  try {
    // one alone: a 401 within 100 ms of its head, Connection: close
    const one = await connect(s.port, headOnly.replace('Host: x', 'Host: x\r\nAuthorization: Bearer wrong'));
    while (!one.firstAt && Date.now() - one.sentAt < 5000) await sleep(1);
    assert.ok(one.firstAt && one.firstAt - one.sentAt < 100, `401 after ${one.firstAt - one.sentAt} ms`);
    assert.match(one.text(), /^HTTP\/1\.1 401 [^]*Connection: close/);
    one.destroy();
    const socks = await flood(s.port, 1100, headOnly);
    await sleep(500);
    await healthFast(s.port, 'during 1,100 unauthenticated uploads');
    for (const x of socks) assert.match(x.text(), /^HTTP\/1\.1 401 /, 'every one answered');
    const r = await exitsWithin(s, 2000 + 3000);
    assert.equal(r.code, 0, s.log());
    for (const x of socks) x.destroy();
  } finally {
    if (s.proc.exitCode === null) s.proc.kill('SIGKILL');
  }
});

// A streamed answer of a few MB (top logprobs make each token's event large): more than the sockets' buffers.
const bigStream = JSON.stringify({
  messages: [{ role: 'user', content: 'Tell me a fortune.' }], max_tokens: 1500, temperature: 0.7, seed: 3,
  logit_bias: NO_EOS, stream: true, logprobs: true, top_logprobs: 20,
});
const post = (body, route = '/v1/chat/completions') =>
  `POST ${route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;

test('2: a reader that pauses for 15 s gets its whole stream', async () => {
  const s = await startServer(['-c', '2048', '--timeout', '5']);
  try {
    const sock = await connect(s.port, post(bigStream));
    while (!sock.chunks.length) await sleep(5);
    sock.pause();
    await sleep(15000);
    sock.resume();
    const t0 = Date.now();
    while (!sock.text().includes('data: [DONE]') && !sock.closedAt && Date.now() - t0 < 60000) await sleep(20);
    const text = sock.text();
    assert.ok(text.length > 2 << 20, `${text.length} bytes`);
    const body = text.slice(text.indexOf('\r\n\r\n') + 4);
    // the chunked framing's size lines sit between events; the events themselves are whole
    const events = body.split('\r\n').filter((l) => l.startsWith('data: ') || l.startsWith(': ')).join('\r\n');
    assert.match(events, /data: \[DONE\]/);
    const n = sseEvents(body.replace(/\r\n[0-9a-f]+\r\n/g, '')).filter((e) => e !== '[DONE]' && e.choices[0].delta.content !== undefined);
    assert.ok(n.length > 100, `${n.length} content events`);
    sock.destroy();
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});

test('2: a reader stalled past --write-timeout is cancelled, logged and counted; its row is free again', async () => {
  const s = await startServer(['-c', '2048', '-np', '1', '--write-timeout', '2', '--log-level', 'info']);
  try {
    const sock = await connect(s.port, post(bigStream));
    while (!sock.chunks.length) await sleep(5);
    sock.pause(); // and never reads again
    const t0 = Date.now();
    while (!/read nothing for --write-timeout/.test(s.log()) && Date.now() - t0 < 60000) await sleep(50);
    assert.match(s.log(), /cancelled: the client read nothing for --write-timeout 2 s/);
    const m = await (await fetch(`${s.base}/metrics`)).text();
    assert.match(m, /osprey_write_timeouts_total 1\n/);
    // the one row is free: a new request is answered
    const r = await fetch(`${s.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }) });
    assert.equal(r.status, 200);
    sock.destroy();
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});

test('4: a slow body and a stalled one are answered 408 at --body-timeout', async () => {
  const s = await startServer(['--body-timeout', '2']);
  try {
    const slow = await connect(s.port, headOnly);
    const drip = setInterval(() => slow.closedAt || slow.write('{'), 300);
    const stalled = await connect(s.port, headOnly);
    const t0 = Date.now();
    while ((!slow.closedAt || !stalled.closedAt) && Date.now() - t0 < 10000) await sleep(20);
    clearInterval(drip);
    for (const x of [slow, stalled]) {
      assert.match(x.text(), /^HTTP\/1\.1 408 [^]*--body-timeout/);
      assert.ok(x.firstAt - x.sentAt >= 1900 && x.firstAt - x.sentAt < 5000, `answered after ${x.firstAt - x.sentAt} ms`);
      x.destroy();
    }
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});

for (const [size, status] of [['800001', 413], ['ffffffffffffffff', 413], ['10000000000000000', 413], ['zz', 400], ['5;\x01', 400]]) {
  test(`5: a chunk size of ${JSON.stringify(size)} is answered at once with a JSON ${status}`, async () => {
    const s = await startServer([]);
    try {
      const sock = await connect(s.port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${size}\r\n`);
      while (!sock.closedAt && Date.now() - sock.sentAt < 5000) await sleep(5);
      const t = sock.text();
      assert.match(t, new RegExp(`^HTTP/1\\.1 ${status} `));
      assert.ok(sock.firstAt - sock.sentAt < 1000);
      const j = JSON.parse(t.slice(t.indexOf('\r\n\r\n') + 4));
      assert.equal(j.error.code, status);
      if (status === 413) assert.match(j.error.message, /larger than the limit of 8388608 bytes/);
      sock.destroy();
    } finally {
      assert.equal((await s.stop()).code, 0, s.log());
    }
  });
}

test('7: --drain-timeout bounds the whole drain: a running stream ends with an error event, a queued request gets a 503', async () => {
  // half a second: well before the 1,900 tokens (about 2 s here, more under ASan) are done
  const s = await startServer(['-c', '2048', '-np', '1', '--drain-timeout', '0.5']);
  try {
    const long = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 1900, temperature: 0.7,
      logit_bias: NO_EOS, stream: true, logprobs: true, top_logprobs: 20 });
    const running = await connect(s.port, post(long));
    while (!running.text().includes('"content":"')) await sleep(5);
    const queued = await connect(s.port, post(long.replace('"stream":true', '"stream":false')));
    await sleep(100);
    const r = await exitsWithin(s, 500 + 4000);
    assert.equal(r.code, 1, s.log()); // work was cut
    assert.ok(r.ms >= 450, `exited after ${r.ms} ms`);
    // the process's exit can be seen before the sockets' last bytes are read: wait for both to close
    for (let i = 0; i < 250 && (!running.closedAt || !queued.closedAt); i++) await sleep(20);
    assert.match(running.text(), /data: \{"error":\{"message":"the server is shutting down \(--drain-timeout\)"/);
    assert.match(queued.text(), /^HTTP\/1\.1 503 [^]*shutting down/);
    running.destroy(), queued.destroy();
  } finally {
    if (s.proc.exitCode === null) s.proc.kill('SIGKILL');
  }
});

test('8: a request no route can serve is refused at its head, its body unsent: audio without an audio model, an unknown route', async () => {
  const s = await startServer([]);
  try {
    for (const [route, len, status] of [['/v1/audio/transcriptions', 30 << 20, 404], ['/v1/nothing', 20 << 20, 404],
      ['/v1/chat/completions', 9 << 20, 413]]) {
      const sock = await connect(s.port, `POST ${route} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: ${len}\r\n\r\n`);
      while (!sock.firstAt && Date.now() - sock.sentAt < 5000) await sleep(2);
      assert.ok(sock.firstAt - sock.sentAt < 500, `${route}: answered after ${sock.firstAt - sock.sentAt} ms`);
      assert.match(sock.text(), new RegExp(`^HTTP/1\\.1 ${status} `), route);
      sock.destroy();
    }
  } finally {
    assert.equal((await s.stop()).code, 0, s.log());
  }
});
