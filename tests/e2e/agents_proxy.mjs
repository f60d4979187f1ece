// A recording proxy between an agent and osprey: every request the agent
// sends (method, URL, headers, body) and what osprey answered (status, body,
// SSE included), so a test can check what the agent printed against what the
// server produced. Close it with close().
import http from 'node:http';

export async function startProxy(target) {
  const exchanges = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const x = { method: req.method, url: req.url, headers: req.headers, body: body.toString(), status: 0, response: '' };
      exchanges.push(x);
      const headers = { ...req.headers };
      delete headers.host;
      const up = http.request(new URL(req.url, target), { method: req.method, headers }, (ur) => {
        x.status = ur.statusCode;
        res.writeHead(ur.statusCode, ur.headers);
        ur.on('data', (c) => {
          x.response += c.toString();
          res.write(c);
        });
        ur.on('end', () => res.end());
      });
      up.on('error', (e) => {
        x.status = 502;
        res.writeHead(502).end(String(e));
      });
      up.end(body);
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    exchanges,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

// The SSE frames of a recorded answer: [{ event, data }] (data parsed).
export function sseEvents(text) {
  const out = [];
  for (const frame of text.split(/\n\n/)) {
    let event = null, data = '';
    for (const line of frame.split('\n')) {
      if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data += line.slice(5).trim();
    }
    if (data && data !== '[DONE]') out.push({ event, data: JSON.parse(data) });
  }
  return out;
}
