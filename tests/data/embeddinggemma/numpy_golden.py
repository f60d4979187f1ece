#!/usr/bin/env python3
"""An independent reference for tests/data/embeddinggemma/embeddinggemma-tiny: EmbeddingGemma (transformers'
Gemma3TextModel with use_bidirectional_attention) written in numpy, in f64, from the safetensors bytes (bf16 and f32
weights widened exactly), then sentence-transformers' modules: mean pooling, 2_Dense, 3_Dense, Normalize. It needs
only numpy (the system python's); make_golden.py is the transformers / sentence-transformers reference.

    /usr/bin/python3 tests/data/embeddinggemma/numpy_golden.py build/osprey tests/data/embeddinggemma/embeddinggemma-tiny \
        tests/data/embeddinggemma/embeddinggemma-tiny/numpy_golden.safetensors

The ids are osprey's tokenizer's (`osprey tokenize --add-special`: the byte-level tokenizer of tests/data/embed,
whose post-processor appends <|endoftext|>); make_golden.py checks the tokenizer. What it implements of transformers:
- the embedding times sqrt(hidden); Gemma's norms x / sqrt(mean(x^2) + eps) * (1 + w), on q and k per head too;
- no causal mask: a full_attention layer sees every position, a sliding_attention layer the positions j with
  |i - j| < sliding_window // 2 + 1 (Gemma3TextConfig turns the window into that radius when
  use_bidirectional_attention is on; the mask is _bidirectional_window_overlay's);
- RoPE (rotate-half) with rope_local_base_freq on sliding layers and rope_theta on full ones; q.k scaled by
  query_pre_attn_scalar ** -0.5; the sandwich norms; the gated MLP with gelu (tanh approximation).
Writes input_ids_i, hidden_i [T_i, H], embedding [N, H] and mrl_16, mrl_32 as make_golden.py does.
"""
import json, os, subprocess, sys
import numpy as np

TEXTS = ["the cat sat on the mat", "hi", "in the winter there was snow", "x", "theretheretherethere in in in",
         "in the winter there was snow and the cat sat by the fire on the mat, then there was more snow"]
osprey, d, out = sys.argv[1], sys.argv[2], sys.argv[3]

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from numpy_ref import load_st, save_st
W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
D2 = load_st(d + '/2_Dense/model.safetensors')['linear.weight']; D3 = load_st(d + '/3_Dense/model.safetensors')['linear.weight']
H, L, nh, nkv, hd, eps = c['hidden_size'], c['num_hidden_layers'], c['num_attention_heads'], c['num_key_value_heads'], c['head_dim'], c['rms_norm_eps']
assert c['use_bidirectional_attention'] is True
types = c['layer_types']; R = c['sliding_window'] // 2 + 1; scale = c['query_pre_attn_scalar'] ** -0.5
def norm(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * (1 + w)
def inv(theta): return 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
def rope(x, theta):
    T = x.shape[0]; f = np.outer(np.arange(T), inv(theta)); cos = np.cos(np.concatenate([f, f], -1)); sin = np.sin(np.concatenate([f, f], -1))
    rot = np.concatenate([-x[..., hd//2:], x[..., :hd//2]], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]
def gelu_tanh(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
def fwd(ids):
    T = len(ids); x = W['embed_tokens.weight'][ids] * np.sqrt(H)
    pos = np.arange(T); far = np.abs(pos[:, None] - pos[None, :]) >= R
    for l in range(L):
        p = f'layers.{l}.'; sliding = types[l] == 'sliding_attention'
        theta = c['rope_local_base_freq'] if sliding else c['rope_theta']
        h = norm(x, W[p+'input_layernorm.weight'])
        q = (h @ W[p+'self_attn.q_proj.weight'].T).reshape(T, nh, hd); k = (h @ W[p+'self_attn.k_proj.weight'].T).reshape(T, nkv, hd); v = (h @ W[p+'self_attn.v_proj.weight'].T).reshape(T, nkv, hd)
        q = rope(norm(q, W[p+'self_attn.q_norm.weight']), theta); k = rope(norm(k, W[p+'self_attn.k_norm.weight']), theta)
        rep = nh // nkv; k = np.repeat(k, rep, 1); v = np.repeat(v, rep, 1)
        s = np.einsum('thd,shd->hts', q, k) * scale
        if sliding: s = np.where(far[None], -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        a = np.einsum('hts,shd->thd', s, v).reshape(T, nh*hd) @ W[p+'self_attn.o_proj.weight'].T
        x = x + norm(a, W[p+'post_attention_layernorm.weight'])
        h = norm(x, W[p+'pre_feedforward_layernorm.weight'])
        m = (gelu_tanh(h @ W[p+'mlp.gate_proj.weight'].T) * (h @ W[p+'mlp.up_proj.weight'].T)) @ W[p+'mlp.down_proj.weight'].T
        x = x + norm(m, W[p+'post_feedforward_layernorm.weight'])
    return norm(x, W['norm.weight'])

res, vecs = {}, []
for i, t in enumerate(TEXTS):
    ids = json.loads(subprocess.check_output([osprey, 'tokenize', '--model', d, '--text', t, '--add-special']))
    h = fwd(np.array(ids))
    res[f'input_ids_{i}'] = np.array(ids, dtype=np.int32); res[f'hidden_{i}'] = h.astype(np.float32)
    vecs.append(D3 @ (D2 @ h.mean(0)))
P = np.stack(vecs)
def nz(a): return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
res['embedding'] = nz(P); res['mrl_16'] = nz(P[:, :16]); res['mrl_32'] = nz(P[:, :32])
save_st(out, res)
print('ok', [len(res[f'input_ids_{i}']) for i in range(len(TEXTS))])
