#!/usr/bin/env python3
"""An independent reference for tests/data/rerank/qwen3-reranker-tiny: Qwen3-Reranker's score of each pair of
pairs.json, the Qwen3 causal LM written in numpy, in f64, from the safetensors bytes (bf16 widened exactly). It needs
only numpy (the system python's); make_golden.py is the transformers reference (it checks the tokenizer too).

    /usr/bin/python3 tests/data/rerank/numpy_golden.py build/osprey tests/data/rerank/qwen3-reranker-tiny \
        tests/data/rerank/qwen3-reranker-tiny/numpy_golden.safetensors

The ids are osprey's tokenizer's (`osprey tokenize`), built as the model card builds them: the prefix and the suffix
without special tokens, "<Instruct>: {instruction}\\n<Query>: {query}\\n<Document>: {doc}" with them. Writes, for pair
i, input_ids_i and hidden_last_i (the final normed state at the last position), and logit_yes, logit_no and score
[N] (P(yes) = softmax(no, yes)[1]) as make_golden.py does.
"""
import json, os, struct, subprocess, sys
import numpy as np

PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct '
          'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = '<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
DEFAULT = 'Given a web search query, retrieve relevant passages that answer the query'
osprey, d, out = sys.argv[1], sys.argv[2], sys.argv[3]
pairs = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'pairs.json')))

def tokenize(text, special):
    a = [osprey, 'tokenize', '--model', d, '--text', text] + (['--add-special'] if special else [])
    return json.loads(subprocess.check_output(a))

def load_st(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); base = 8+n; r = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']; raw = b[base+s:base+e]
        if v['dtype'] == 'BF16': a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v['dtype'] == 'F32': a = np.frombuffer(raw, dtype=np.float32)
        else: raise SystemExit('unexpected dtype ' + v['dtype'])
        r[k] = a.reshape(v['shape']).astype(np.float64)
    return r

W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
H, L, nh, nkv, hd, eps = c['hidden_size'], c['num_hidden_layers'], c['num_attention_heads'], c['num_key_value_heads'], c['head_dim'], c['rms_norm_eps']
theta = c.get('rope_theta', 10000.0)
head = W['model.embed_tokens.weight'] if c.get('tie_word_embeddings') else W['lm_head.weight']
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
def rope(x, T):
    f = np.outer(np.arange(T), inv); cos = np.cos(np.concatenate([f, f], -1)); sin = np.sin(np.concatenate([f, f], -1))
    x1, x2 = x[..., :hd//2], x[..., hd//2:]; rot = np.concatenate([-x2, x1], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]
def fwd(ids):
    T = len(ids); x = W['model.embed_tokens.weight'][ids]
    for l in range(L):
        p = f'model.layers.{l}.'
        xn = rms(x, W[p+'input_layernorm.weight'])
        q = (xn @ W[p+'self_attn.q_proj.weight'].T).reshape(T, nh, hd); k = (xn @ W[p+'self_attn.k_proj.weight'].T).reshape(T, nkv, hd); v = (xn @ W[p+'self_attn.v_proj.weight'].T).reshape(T, nkv, hd)
        q = rope(rms(q, W[p+'self_attn.q_norm.weight']), T); k = rope(rms(k, W[p+'self_attn.k_norm.weight']), T)
        rep = nh // nkv; k = np.repeat(k, rep, 1); v = np.repeat(v, rep, 1)
        s = np.einsum('thd,shd->hts', q, k) / np.sqrt(hd); s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        x = x + np.einsum('hts,shd->thd', s, v).reshape(T, nh*hd) @ W[p+'self_attn.o_proj.weight'].T
        xn = rms(x, W[p+'post_attention_layernorm.weight'])
        g = xn @ W[p+'mlp.gate_proj.weight'].T; u = xn @ W[p+'mlp.up_proj.weight'].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[p+'mlp.down_proj.weight'].T
    return rms(x, W['model.norm.weight'])

yes, no = tokenize('yes', False), tokenize('no', False)
assert len(yes) == 1 and len(no) == 1, (yes, no)
pre, suf = tokenize(PREFIX, False), tokenize(SUFFIX, False)
res, ly, ln = {}, [], []
for i, p in enumerate(pairs):
    mid = tokenize('<Instruct>: %s\n<Query>: %s\n<Document>: %s' % (p.get('instruction', DEFAULT), p['query'], p['document']), True)
    ids = np.array(pre + mid + suf)
    h = fwd(ids)[-1]
    res[f'input_ids_{i}'] = ids.astype(np.int32); res[f'hidden_last_{i}'] = h.astype(np.float32)
    ly.append(h @ head[yes[0]]); ln.append(h @ head[no[0]])
ly, ln = np.array(ly), np.array(ln)
res['logit_yes'] = ly.astype(np.float32); res['logit_no'] = ln.astype(np.float32)
res['score'] = (1 / (1 + np.exp(ln - ly))).astype(np.float32)
hdr = {}; off = 0; blobs = []
for k, a in res.items():
    a = np.ascontiguousarray(a); b = a.tobytes(); hdr[k] = {'dtype': 'I32' if a.dtype == np.int32 else 'F32', 'shape': list(a.shape), 'data_offsets': [off, off + len(b)]}; off += len(b); blobs.append(b)
hj = json.dumps(hdr).encode(); hj += b' ' * ((8 - len(hj) % 8) % 8)
open(out, 'wb').write(struct.pack('<Q', len(hj)) + hj + b''.join(blobs))
print('scores', res['score'])
