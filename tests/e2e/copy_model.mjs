// A "copy" model for end-to-end tests of what a real model writes (tool
// calls, reasoning): a one-layer Llama whose greedy continuation repeats the
// prompt with period d, x[t+1] = x[t+1-d]. Put a text S in the prompt so
// that it starts d tokens before the end, follow it by an eos token (the
// chat template's end of turn), and the model answers exactly S.
//
// How: embeddings are random unit-RMS vectors (nearly orthogonal in 256
// dims) with one constant coordinate; q and k read only that coordinate, so
// they are the same at every position and RoPE alone makes the score
// sum_i B cos(((m - n) - (d - 1)) theta_i): largest at distance d - 1, by a
// margin scaled to dominate the softmax. v = the token's embedding, o = 8x,
// the MLP is zero, the head is tied: the logits pick the attended token.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, raw, ROOT, MODEL } from './harness.mjs';

const H = 256, I = 8;

function writeSafetensors(file, tensors) {
  const header = {};
  let off = 0;
  for (const [name, shape, data] of tensors) {
    header[name] = { dtype: 'F32', shape, data_offsets: [off, off + data.byteLength] };
    off += data.byteLength;
  }
  let h = Buffer.from(JSON.stringify(header));
  h = Buffer.concat([h, Buffer.alloc((8 - (h.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  fs.writeFileSync(file, Buffer.concat([len, h, ...tensors.map(([, , d]) => Buffer.from(d.buffer, d.byteOffset, d.byteLength))]));
}

// xorshift-based normal generator (deterministic)
function rng(seed) {
  let s = BigInt(seed) | 1n;
  const next = () => {
    s ^= (s << 13n) & 0xffffffffffffffffn;
    s ^= s >> 7n;
    s ^= (s << 17n) & 0xffffffffffffffffn;
    return Number(s & 0xfffffffffffffn) / 2 ** 52;
  };
  return () => Math.sqrt(-2 * Math.log(next() + 1e-300)) * Math.cos(2 * Math.PI * next());
}

// Random unit-RMS rows with one constant coordinate (c, the first).
function makeEmbeddings(V, randn, c = 4) {
  const E = new Float32Array(V * H);
  for (let t = 0; t < V; t++) {
    let ss = 0;
    for (let j = 1; j < H; j++) ss += (E[t * H + j] = randn()) ** 2;
    const scale = Math.sqrt((H - c * c) / ss); // row RMS exactly 1
    for (let j = 1; j < H; j++) E[t * H + j] *= scale;
    E[t * H] = c;
  }
  return E;
}

// vocab, eos ids and bos from the tokenizer folder's files; d = copy period;
// maxPos = the context; randn = the embeddings' normal generator (a faster
// one for a large vocabulary: agents.test.mjs). Returns the embeddings, which
// E = reuses (they do not depend on d).
export function buildCopyModel(dir, { d, vocab, bos, eos, theta = 10000, maxPos = 2048, randn = rng(12345), E = null }) {
  fs.mkdirSync(dir, { recursive: true });
  const V = vocab, D = H, half = D / 2;
  const c = 4; // the constant coordinate
  if (!E) E = makeEmbeddings(V, randn, c);
  const inv = Array.from({ length: half }, (_, i) => theta ** (-(2 * i) / D));
  // smallest gap between the peak and any other distance within the context
  const delta = d - 1;
  let margin = Infinity;
  for (let x = -4096; x <= 4096; x++) {
    if (x === 0) continue;
    let s = 0;
    for (const w of inv) s += 1 - Math.cos(x * w);
    margin = Math.min(margin, s);
  }
  const B = (80 * Math.sqrt(D)) / margin; // the runner-up 80 nats below the peak
  const beta = Math.sqrt(B);
  const Wq = new Float32Array(D * H), Wk = new Float32Array(D * H);
  for (let i = 0; i < half; i++) {
    // k: (beta, 0) in pair (i, i + D/2); q: the same rotated by -delta * theta_i
    Wk[i * H] = beta / c;
    Wq[i * H] = (beta * Math.cos(delta * inv[i])) / c;
    Wq[(i + half) * H] = (-beta * Math.sin(delta * inv[i])) / c;
  }
  const eye = (s) => {
    const m = new Float32Array(H * H);
    for (let j = 0; j < H; j++) m[j * H + j] = s;
    return m;
  };
  const ones = new Float32Array(H).fill(1);
  writeSafetensors(path.join(dir, 'model.safetensors'), [
    ['model.embed_tokens.weight', [V, H], E],
    ['model.layers.0.input_layernorm.weight', [H], ones],
    ['model.layers.0.self_attn.q_proj.weight', [D, H], Wq],
    ['model.layers.0.self_attn.k_proj.weight', [D, H], Wk],
    ['model.layers.0.self_attn.v_proj.weight', [D, H], eye(1)],
    ['model.layers.0.self_attn.o_proj.weight', [H, D], eye(8)],
    ['model.layers.0.post_attention_layernorm.weight', [H], ones],
    ['model.layers.0.mlp.gate_proj.weight', [I, H], new Float32Array(I * H)],
    ['model.layers.0.mlp.up_proj.weight', [I, H], new Float32Array(I * H)],
    ['model.layers.0.mlp.down_proj.weight', [H, I], new Float32Array(H * I)],
    ['model.norm.weight', [H], ones],
  ]);
  fs.writeFileSync(
    path.join(dir, 'config.json'),
    JSON.stringify({
      architectures: ['LlamaForCausalLM'],
      model_type: 'llama',
      hidden_size: H,
      intermediate_size: I,
      num_hidden_layers: 1,
      num_attention_heads: 1,
      num_key_value_heads: 1,
      head_dim: D,
      vocab_size: V,
      max_position_embeddings: maxPos,
      rms_norm_eps: 1e-6,
      rope_theta: theta,
      tie_word_embeddings: true,
      hidden_act: 'silu',
      bos_token_id: bos,
      eos_token_id: eos,
      torch_dtype: 'float32',
    }),
  );
  return E;
}

// A folder for a copy model over the bundled model's tokenizer with the
// Hermes-style (Qwen) tools template; { dir, shape } (shape: buildCopyModel's
// vocab, bos, eos). The caller removes dir.
export function copyModelDir() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'osp-copy-model-'));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(MODEL, f), path.join(dir, f));
  fs.copyFileSync(path.join(ROOT, 'tests', 'e2e', 'tools_template.jinja'), path.join(dir, 'chat_template.jinja'));
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
  return { dir, shape: { vocab: cfg.vocab_size, bos: cfg.bos_token_id, eos: cfg.eos_token_id } };
}

// Serve the copy model in dir so that it answers `answer` to the chat
// conversation `messages` (with `tools`); with `forced`, the reply is taken
// to start with that text (a forced tool call's opening, appended to the
// prompt) and `answer` to follow it. Returns the running server.
export async function serveCopyAnswering(dir, shape, messages, tools, answer, forced = '') {
  buildCopyModel(dir, { d: 2, ...shape }); // placeholder weights: only the tokenizer and template are used
  let srv = await startServer([], { model: dir });
  const tok = async (content) => (await raw(srv.base, '/tokenize', { body: JSON.stringify({ content }) })).json.tokens;
  const tpl = await raw(srv.base, '/apply-template', { body: JSON.stringify({ messages, tools }) });
  const prompt = await tok(tpl.json.prompt), ans = await tok(answer), withForced = await tok(tpl.json.prompt + forced);
  assert.equal((await srv.stop()).code, 0);
  let at = -1;
  for (let i = prompt.length - ans.length; i >= 0 && at < 0; i--) if (ans.every((t, k) => prompt[i + k] === t)) at = i;
  assert.ok(at >= 0, 'the answer is not tokenized the same inside the prompt');
  buildCopyModel(dir, { d: withForced.length - at, ...shape });
  return startServer([], { model: dir });
}

// Run body(server) against a copy model answering `answer` to the chat
// conversation `messages` (with `tools`; `forced` as serveCopyAnswering's),
// then stop the server and remove the folder.
export async function withCopyModel(messages, tools, answer, forced, body) {
  const { dir, shape } = copyModelDir();
  try {
    const s = await serveCopyAnswering(dir, shape, messages, tools, answer, forced);
    try {
      await body(s);
    } finally {
      assert.equal((await s.stop()).code, 0);
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
