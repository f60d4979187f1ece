// Speculative decoding in the server, with the real `openai` client: with a
// draft model (a 4-bit copy made by `osprey convert`) or n-gram lookup, 8
// concurrent greedy requests get exactly (tokens and logprobs) what a server
// without speculation gives them; timings and /metrics report the drafts;
// "speculative": false opts out; a draft with another tokenizer is refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { startServer, raw, BIN, MODEL, ROOT } from './harness.mjs';

let tmp, draft;
before(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'osp_spec_e2e_'));
  draft = path.join(tmp, 'draft');
  execFileSync(BIN, ['convert', MODEL, draft, '-q', '--q-bits', '4'], { stdio: 'ignore' });
});
after(() => fs.rmSync(tmp, { recursive: true, force: true }));

const NO_EOS = { 1: -100, 4: -100 };
const PROMPTS = [
  'Repeat after me: the sea, the sea, the sea, the sea.',
  'Tell me a fortune.',
  'Tell me a joke about computers.',
  'Say it twice: all hands on deck, all hands on deck.',
  'Some wisdom, please.',
  'A proverb about the wind.',
  'Count: one, two, three, one, two, three, one, two.',
  'What does the lighthouse keeper say?',
];

async function all(srv, extra = {}) {
  const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
  return Promise.all(
    PROMPTS.map(async (p) => {
      const x = await c.chat.completions.create({
        model: 'fortune', messages: [{ role: 'user', content: p }], max_tokens: 40, temperature: 0,
        logit_bias: NO_EOS, logprobs: true, top_logprobs: 2, ...extra,
      });
      return {
        text: x.choices[0].message.content,
        lp: x.choices[0].logprobs.content.map((e) => [e.token, e.logprob, e.top_logprobs.map((t) => t.logprob)]),
        draft_n: x.timings.draft_n, accepted: x.timings.draft_n_accepted,
      };
    }),
  );
}

async function stopped(srv) {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit: ${JSON.stringify(r)}\n${srv.log()}`);
}

test('8 concurrent greedy requests: the same tokens and logprobs with a draft model, with n-grams, and without', async () => {
  const plainSrv = await startServer(['--parallel', '8', '--prompt-cache', '0']);
  let plain;
  try {
    plain = await all(plainSrv);
  } finally {
    await stopped(plainSrv);
  }
  for (const args of [['--draft-model', draft], ['--spec-ngram', '--num-draft-tokens', '6']]) {
    const srv = await startServer(['--parallel', '8', '--prompt-cache', '0', ...args]);
    try {
      const spec = await all(srv);
      let drafted = 0, accepted = 0;
      for (let i = 0; i < PROMPTS.length; i++) {
        assert.equal(spec[i].text, plain[i].text, `${args[0]} request ${i}`);
        assert.deepEqual(spec[i].lp, plain[i].lp, `${args[0]} request ${i}`);
        drafted += spec[i].draft_n;
        accepted += spec[i].accepted;
        assert.ok(spec[i].accepted <= spec[i].draft_n);
      }
      assert.ok(drafted > 0 && accepted > 0, `${args[0]}: drafted ${drafted}, accepted ${accepted}`);
      const m = await (await fetch(`${srv.base}/metrics`)).text();
      assert.match(m, new RegExp(`osprey_draft_tokens_total ${drafted}\\n`));
      assert.match(m, new RegExp(`osprey_draft_tokens_accepted_total ${accepted}\\n`));
      const st = (await raw(srv.base, '/stats', { method: 'GET' })).json;
      assert.equal(st.speculative.drafted, drafted);
      // a request may opt out
      const [off] = await Promise.all([all(srv, { speculative: false })]);
      assert.equal(off[0].draft_n, 0);
      assert.deepEqual(off[1].lp, plain[1].lp);
      // sampling with speculation: a seeded request runs
      const c = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
      const r = await c.chat.completions.create({ model: 'fortune', messages: [{ role: 'user', content: PROMPTS[0] }],
        max_tokens: 30, temperature: 0.8, top_p: 0.95, seed: 5 });
      assert.equal(r.choices[0].finish_reason === 'length' || r.choices[0].finish_reason === 'stop', true);
    } finally {
      await stopped(srv);
    }
  }
});

test('a draft model with another tokenizer (or none) is refused at start', async () => {
  const other = path.join(ROOT, 'tests', 'data', 'goldens', 'llama3');
  await assert.rejects(startServer(['--draft-model', other]), /draft model .* tokenizer/);
});
