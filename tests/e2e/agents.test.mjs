// The real coding agents against osprey (issue 37): Claude Code (`claude -p`,
// the Anthropic Messages API) and Codex (`codex exec`, the OpenAI Responses
// API), the npm packages at the versions agents.json pins, installed by
// scripts/install-agents.sh into a cache outside the clone. A missing install
// fails these tests: they never skip.
//
// Each agent talks to osprey through a recording proxy (agents_proxy.mjs), so
// a test checks what the agent printed against what the server produced.
//
// - claude -p with a short --system-prompt and no tools, on the bundled model
//   (greedy): prints the reply; the recorded request, sent again directly,
//   gets the same text.
// - claude -p with its full prompt on the bundled model: Claude Code's own
//   "Prompt is too long".
// - claude -p and codex exec with their full default prompts and tools (about
//   12K and 6K tokens) on a "copy" model (copy_model.mjs) over the Qwen 3
//   tokenizer and template with a 32K context: it answers the last few tokens
//   of the user's turn, then ends it, so the reply is known to be a suffix of
//   what the agent sent.
// - A tool round trip for each, with reasoning: the agent runs the call the
//   copy model makes and sends back the reasoning, the call and its output.
// - Qwen 3's template takes an assistant turn of tool calls only.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { startServer, raw, ROOT } from './harness.mjs';
import { buildCopyModel } from './copy_model.mjs';
import { startProxy, sseEvents } from './agents_proxy.mjs';

const AGENTS = JSON.parse(fs.readFileSync(path.join(ROOT, 'tests', 'e2e', 'agents.json'), 'utf8'));
// where scripts/install-agents.sh put them
const CACHE = process.env.OSP_AGENTS_DIR ||
  path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'osprey-agents');
const AGENT_MS = 180000; // one agent run, at most

function agentBin(name) {
  const a = AGENTS[name];
  const dir = path.join(CACHE, `${a.package}@${a.version}`.replace('/', '+'));
  const bin = path.join(dir, a.bin);
  assert.ok(fs.existsSync(path.join(dir, '.complete')) && fs.existsSync(bin),
    `${a.package}@${a.version} is not installed in ${CACHE}: run scripts/install-agents.sh (scripts/test.sh does)`);
  return bin;
}

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'osp-agents-'));
let copyDir;

// The environment of an agent: the caller's, less any agent or API settings
// it holds, with HOME in a temporary folder (the agents write their
// configuration and sessions there) and no network traffic but the model's.
function agentEnv(extra) {
  const env = {};
  for (const [k, v] of Object.entries(process.env))
    if (!/^(ANTHROPIC_|CLAUDE_|CODEX_|OPENAI_)/.test(k)) env[k] = v;
  const home = fs.mkdtempSync(path.join(tmp, 'home-'));
  const xdg = { XDG_CONFIG_HOME: '.config', XDG_CACHE_HOME: '.cache', XDG_DATA_HOME: '.local/share', XDG_STATE_HOME: '.local/state' };
  for (const [k, v] of Object.entries(xdg)) env[k] = path.join(home, v);
  return { ...env, HOME: home, ...extra };
}

// Run an agent to its end: { code, stdout, stderr }; killed after AGENT_MS, with what it started (its own
// process group: codex.js starts the native binary, which starts shells).
function runAgent(bin, args, env) {
  const cwd = fs.mkdtempSync(path.join(tmp, 'cwd-'));
  return new Promise((resolve, reject) => {
    const p = spawn(bin, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => (stdout += d));
    p.stderr.on('data', (d) => (stderr += d));
    const t = setTimeout(() => {
      try {
        process.kill(-p.pid, 'SIGKILL');
      } catch {
        p.kill('SIGKILL');
      }
    }, AGENT_MS);
    p.on('error', reject);
    p.on('close', (code, signal) => {
      clearTimeout(t);
      resolve({ code: code ?? signal, stdout, stderr });
    });
  });
}

// The text a recorded Messages or Responses stream carried.
function streamedText(x) {
  let text = '';
  for (const { data } of sseEvents(x.response)) {
    if (data.type === 'content_block_delta' && data.delta.type === 'text_delta') text += data.delta.text;
    if (data.type === 'response.output_text.delta') text += data.delta;
  }
  return text;
}

const claude = (base, args) => runAgent(agentBin('claude'), ['-p', ...args], agentEnv({
  ANTHROPIC_BASE_URL: base,
  ANTHROPIC_API_KEY: 'osprey-test-key',
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  DISABLE_AUTOUPDATER: '1',
  DISABLE_TELEMETRY: '1',
  DISABLE_ERROR_REPORTING: '1',
}));

// A fast normal generator for the copy model's 151,936 x 256 embeddings
// (copy_model.mjs' BigInt one takes about 30 s there): xorshift32, both
// values of each Box-Muller pair.
function fastRandn(seed) {
  let s = seed >>> 0 || 1, spare = null;
  const u = () => {
    s ^= s << 13, s >>>= 0, s ^= s >>> 17, s ^= s << 5, s >>>= 0;
    return (s + 0.5) / 4294967296;
  };
  return () => {
    if (spare !== null) {
      const v = spare;
      spare = null;
      return v;
    }
    const r = Math.sqrt(-2 * Math.log(u())), a = 2 * Math.PI * u();
    spare = r * Math.sin(a);
    return r * Math.cos(a);
  };
}
let copyE; // the copy models' embeddings, made once

// The copy model answers the last M tokens of the user's turn (copy period
// M + 5: the five tokens `<|im_end|>\n<|im_start|>assistant\n` end the
// prompt), then the turn's <|im_end|>, which ends its reply.
const M = 6;
const CTX = 32768;

before(() => {
  agentBin('claude');
  agentBin('codex');
  copyDir = path.join(tmp, 'copy-qwen3');
  fs.mkdirSync(copyDir);
  const tk = path.join(ROOT, 'tests', 'data', 'tokenizers', 'qwen3');
  fs.writeFileSync(path.join(copyDir, 'tokenizer.json'), zlib.gunzipSync(fs.readFileSync(path.join(tk, 'tokenizer.json.gz'))));
  fs.copyFileSync(path.join(tk, 'tokenizer_config.json'), path.join(copyDir, 'tokenizer_config.json'));
  copyE = buildCopyModel(copyDir, { d: M + 5, vocab: 151936, bos: 151643, eos: 151645, maxPos: CTX, randn: fastRandn(7) });
});

after(() => fs.rmSync(tmp, { recursive: true, force: true }));

// Start osprey and a proxy in front of it; run body(proxy, server); stop both.
async function withServer(args, model, body) {
  const srv = await startServer(args, { model });
  const proxy = await startProxy(srv.base);
  try {
    await body(proxy, srv);
  } finally {
    await proxy.close();
    const r = await srv.stop();
    assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
  }
}

const fail = (what, r, proxy) =>
  `${what}: exit ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr.slice(-4000)}\nrequests: ` +
  proxy.exchanges.map((x) => `${x.method} ${x.url} ${x.status} ${x.status === 200 ? '' : x.response}`).join('\n');

test('claude -p, a short --system-prompt and no tools, on the bundled model: prints the greedy reply', async (t) => {
  await withServer(['--temp', '0'], undefined, async (proxy, srv) => {
    const r = await claude(proxy.base, ['Tell me a fortune.', '--system-prompt', 'You tell fortunes.', '--tools', '']);
    assert.equal(r.code, 0, fail('claude', r, proxy));
    const turns = proxy.exchanges.filter((x) => x.url.startsWith('/v1/messages'));
    assert.ok(turns.length >= 1 && turns.every((x) => x.status === 200), fail('claude', r, proxy));
    assert.equal(turns.length, proxy.exchanges.length, 'only /v1/messages was asked');
    const last = turns[turns.length - 1], sent = JSON.parse(last.body);
    assert.equal(sent.stream, true);
    assert.ok(sent.system.some((b) => b.text === 'You tell fortunes.'));
    const text = streamedText(last);
    assert.ok(text.trim().length > 0);
    assert.equal(r.stdout.trim(), text.trim());
    t.diagnostic(`${turns.length} request(s); printed ${JSON.stringify(r.stdout.trim())}`);
    // the same body, not streamed, straight to osprey: the same greedy text
    const direct = await raw(srv.base, '/v1/messages', { body: JSON.stringify({ ...sent, stream: false }) });
    assert.equal(direct.status, 200, direct.text);
    assert.equal(direct.json.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), text);
  });
});

test('claude -p with its full prompt on the bundled model (2,048 tokens): Claude Code\'s own "Prompt is too long"', async () => {
  await withServer([], undefined, async (proxy) => {
    const r = await claude(proxy.base, ['Say hi.']);
    // the 400 in Anthropic's words ("prompt is too long: N tokens > M maximum"), which Claude Code parses
    assert.notEqual(r.code, 0);
    assert.match(r.stdout + r.stderr, /Prompt is too long.*limit 2047/, fail('claude', r, proxy));
    assert.ok(proxy.exchanges.length >= 1 && proxy.exchanges.every((x) => x.status === 400));
  });
});

// The user's last turn as text: Messages (a system message in `messages` is
// part of it: anthropic.c) or Responses input items.
function lastUserText(items, isUser) {
  let i = items.length - 1;
  while (i >= 0 && !isUser(items[i])) i--;
  const c = items[i].content;
  return typeof c === 'string' ? c : c.map((b) => b.text ?? '').join('\n\n');
}

test('claude -p with its full default prompt and tools: completes the turn', async (t) => {
  await withServer(['-c', String(CTX)], copyDir, async (proxy) => {
    const r = await claude(proxy.base, ['Reply with the last words of your context and nothing else.']);
    assert.equal(r.code, 0, fail('claude', r, proxy));
    const turns = proxy.exchanges.filter((x) => x.url.startsWith('/v1/messages'));
    assert.ok(turns.length >= 1 && turns.every((x) => x.status === 200), fail('claude', r, proxy));
    assert.equal(turns.length, proxy.exchanges.length, 'only /v1/messages was asked');
    const last = turns[turns.length - 1], sent = JSON.parse(last.body);
    assert.ok(sent.tools.length >= 5, `tools offered: ${sent.tools.length}`);
    const text = streamedText(last);
    assert.ok(text.length > 0);
    assert.equal(r.stdout.trim(), text.trim());
    const start = sseEvents(last.response)[0].data.message.usage;
    t.diagnostic(`${turns.length} request(s), ${start.input_tokens} prompt tokens, ${sent.tools.length} tools; ` +
      `printed ${JSON.stringify(r.stdout.trim())}`);
    assert.ok(lastUserText(sent.messages, (m) => m.role !== 'assistant').endsWith(text), text);
    const done = sseEvents(last.response).find((e) => e.event === 'message_delta');
    assert.equal(done.data.delta.stop_reason, 'end_turn');
  });
});

// codex exec with a custom provider: osprey (through the proxy) over the Responses API, no update check, no
// analytics, no retries
function codex(base, args) {
  const env = agentEnv({ OSPREY_API_KEY: 'osprey-test-key' });
  env.CODEX_HOME = path.join(env.HOME, '.codex');
  fs.mkdirSync(env.CODEX_HOME);
  fs.writeFileSync(path.join(env.CODEX_HOME, 'config.toml'), [
    'model = "copy"',
    'model_provider = "osprey"',
    'check_for_update_on_startup = false',
    '[model_providers.osprey]',
    'name = "osprey"',
    `base_url = "${base}/v1"`,
    'wire_api = "responses"',
    'env_key = "OSPREY_API_KEY"',
    'request_max_retries = 0',
    'stream_max_retries = 0',
    '[analytics]',
    'enabled = false',
    '',
  ].join('\n'));
  return runAgent(agentBin('codex'), ['exec', '--skip-git-repo-check', ...args], env);
}

test('codex exec with a custom Responses provider, its full prompt and tools: completes the turn', async (t) => {
  await withServer(['-c', String(CTX)], copyDir, async (proxy) => {
    const r = await codex(proxy.base, ['--sandbox', 'read-only', 'Reply with the last words of this sentence and nothing else.']);
    assert.equal(r.code, 0, fail('codex', r, proxy));
    const turns = proxy.exchanges.filter((x) => x.url === '/v1/responses');
    assert.ok(turns.length >= 1 && turns.every((x) => x.status === 200), fail('codex', r, proxy));
    assert.equal(turns.length, proxy.exchanges.length, 'only /v1/responses was asked');
    const last = turns[turns.length - 1], sent = JSON.parse(last.body);
    assert.equal(sent.stream, true);
    assert.ok(sent.tools.length >= 5, `tools offered: ${sent.tools.length}`);
    const events = sseEvents(last.response);
    events.forEach((e, i) => assert.equal(e.data.sequence_number, i));
    assert.equal(events[events.length - 1].data.type, 'response.completed');
    const text = streamedText(last);
    assert.ok(text.length > 0);
    assert.equal(r.stdout.trim(), text.trim());
    const usage = events[events.length - 1].data.response.usage;
    t.diagnostic(`${turns.length} request(s), ${usage.input_tokens} prompt tokens, ${sent.tools.length} tools; ` +
      `printed ${JSON.stringify(r.stdout.trim())}`);
    const items = sent.input.filter((x) => x.type === 'message' || x.role);
    assert.ok(lastUserText(items, (m) => m.role === 'user').endsWith(text), text);
  });
});

// A copy model in its own folder (the Qwen 3 files of copyDir) whose copy period is d.
function copyModelWithPeriod(d) {
  const dir = fs.mkdtempSync(path.join(tmp, 'copy-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(copyDir, f), path.join(dir, f));
  buildCopyModel(dir, { d, vocab: 151936, bos: 151643, eos: 151645, maxPos: CTX, E: copyE });
  return dir;
}

// The number of tokens of text in the Qwen 3 tokenizer.
async function tokenCount(text) {
  const srv = await startServer([], { model: copyDir });
  try {
    return (await raw(srv.base, '/tokenize', { body: JSON.stringify({ content: text }) })).json.tokens.length;
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
}

// A tool call round trip: the user's turn ends with a Qwen 3 thought and tool call, which a copy model of their
// length answers (reasoning, then the call); the agent runs it and sends its output back in a second request, whose reply is the output's last
// tokens (its turn rendered as `<tool_response>\n...\n</tool_response>`). Returns the proxy's record.
const THOUGHT = 'The user wants seq run.';
async function toolRoundTrip(run, name, args, t, lead = `<think>\n${THOUGHT}\n</think>\n\n`) {
  const call = `${lead}<tool_call>\n{"name": "${name}", "arguments": ${JSON.stringify(args)}}\n</tool_call>`;
  const dir = copyModelWithPeriod((await tokenCount(call)) + 5);
  let rec;
  await withServer(['-c', String(CTX)], dir, async (proxy) => {
    const r = await run(proxy.base, `Run this:\n${call}`);
    assert.equal(r.code, 0, fail(name, r, proxy));
    rec = { r, turns: proxy.exchanges };
    assert.ok(rec.turns.every((x) => /^\/v1\/(messages|responses)\b/.test(x.url)), fail(name, r, proxy));
    assert.equal(rec.turns.length, 2, fail(name, r, proxy));
    assert.ok(rec.turns.every((x) => x.status === 200), fail(name, r, proxy));
    const text = streamedText(rec.turns[1]);
    assert.ok(/30\n/.test(text), text); // the end of `seq 1 30`'s output
    assert.equal(r.stdout.trim(), text.trim());
    t.diagnostic(`printed ${JSON.stringify(r.stdout.trim())}`);
  });
  fs.rmSync(dir, { recursive: true, force: true });
  return rec;
}

test('codex exec: a tool call round trip (reasoning, exec_command, its output and the reasoning fed back)', async (t) => {
  const { turns } = await toolRoundTrip((base, prompt) => codex(base, ['--dangerously-bypass-approvals-and-sandbox', prompt]),
    'exec_command', { cmd: 'seq 1 30' }, t);
  // the call, streamed: its arguments' deltas add up to what .done and the item carry
  const ev = sseEvents(turns[0].response).map((e) => e.data);
  const item = ev.find((e) => e.type === 'response.output_item.done' && e.item.type === 'function_call').item;
  assert.equal(item.name, 'exec_command');
  assert.deepEqual(JSON.parse(item.arguments), { cmd: 'seq 1 30' });
  const deltas = ev.filter((e) => e.type === 'response.function_call_arguments.delta').map((e) => e.delta).join('');
  assert.equal(deltas, item.arguments);
  assert.equal(ev.find((e) => e.type === 'response.function_call_arguments.done').arguments, item.arguments);
  assert.equal(ev.find((e) => e.type === 'response.output_item.done' && e.item.type === 'reasoning').item.content[0].text,
    THOUGHT);
  // fed back: the reasoning, the call and its output, by call_id
  const input = JSON.parse(turns[1].body).input;
  assert.equal(input.find((x) => x.type === 'reasoning').content[0].text, THOUGHT);
  const fc = input.find((x) => x.type === 'function_call'), out = input.find((x) => x.type === 'function_call_output');
  assert.equal(fc.call_id, item.call_id);
  assert.equal(out.call_id, item.call_id);
  assert.match(typeof out.output === 'string' ? out.output : JSON.stringify(out.output), /29\n30/);
});

test('claude -p --bare: a tool call round trip (thinking, Bash, its result and the thinking fed back)', async (t) => {
  const { turns } = await toolRoundTrip((base, prompt) => claude(base, [prompt, '--bare', '--allowedTools', 'Bash']),
    'Bash', { command: 'seq 1 30' }, t);
  const ev = sseEvents(turns[0].response).map((e) => e.data);
  const start = ev.find((e) => e.type === 'content_block_start' && e.content_block.type === 'tool_use');
  assert.equal(start.content_block.name, 'Bash');
  const json = ev.filter((e) => e.type === 'content_block_delta' && e.index === start.index).map((e) => e.delta.partial_json).join('');
  assert.deepEqual(JSON.parse(json), { command: 'seq 1 30' });
  assert.equal(ev.find((e) => e.type === 'message_delta').delta.stop_reason, 'tool_use');
  const thinking = ev.filter((e) => e.type === 'content_block_delta' && e.delta.type === 'thinking_delta');
  assert.equal(thinking.map((e) => e.delta.thinking).join(''), THOUGHT);
  const msgs = JSON.parse(turns[1].body).messages;
  // replayed: the thinking block with its signature, the call, its result by id
  const back = msgs.flatMap((m) => (Array.isArray(m.content) ? m.content : []));
  assert.equal(back.find((b) => b.type === 'thinking').thinking, THOUGHT);
  const result = msgs.flatMap((m) => (Array.isArray(m.content) ? m.content : [])).find((b) => b.type === 'tool_result');
  assert.equal(result.tool_use_id, start.content_block.id);
  assert.match(JSON.stringify(result.content), /29\\n30/);
});

test('an assistant turn of tool calls only (content null) renders through Qwen 3\'s template', async () => {
  // the template tests '</think>' in the content: null was a 400 (a template error) on the second turn of both agents
  const srv = await startServer([], { model: copyDir });
  try {
    const r = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages: [
      { role: 'user', content: 'Run it.' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{"a":1}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'done' },
    ] }) });
    assert.equal(r.status, 200, r.text);
    assert.match(r.json.prompt, /<\|im_start\|>assistant\n<tool_call>\n\{"name": "f", "arguments": \{"a": ?1\}\}\n<\/tool_call>/);
  } finally {
    assert.equal((await srv.stop()).code, 0);
  }
});

