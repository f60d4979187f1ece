#!/usr/bin/env python3
"""An independent reference for tests/data/embed/qwen3-embedding-tiny: the Qwen3 body written in numpy, in f64,
from the safetensors bytes (bf16 weights widened exactly), last-token pooled and L2-normalized. It needs only numpy
(the system python's), so it runs where torch does not; make_golden.py is the transformers reference.

    python3 -c 'import json,subprocess; T=["the cat sat on the mat","hi","in the winter there was snow","x",
        "theretheretherethere in in in"]; json.dump([json.loads(subprocess.check_output(["build/osprey","tokenize",
        "--model","tests/data/embed/qwen3-embedding-tiny","--text",t,"--add-special"])) for t in T],
        open("/tmp/ids.json","w"))'
    /usr/bin/python3 tests/data/embed/numpy_golden.py tests/data/embed/qwen3-embedding-tiny \
        tests/data/embed/qwen3-embedding-tiny/numpy_golden.safetensors /tmp/ids.json

The ids are osprey's tokenizer's (the byte-level ids are easy to check by eye: "hi" = [104, 105, 261]); the
transformers golden checks the tokenizer too. Writes input_ids_i, hidden_i, embedding, mrl_16, mrl_32 as
make_golden.py does.
"""
import json, struct, sys
import numpy as np
d = sys.argv[1]; out = sys.argv[2]
def load_st(p):
    b = open(p,'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); base = 8+n; r = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']; raw = b[base+s:base+e]
        if v['dtype'] == 'BF16':
            a = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16; a = a.view(np.float32)
        elif v['dtype'] == 'F32': a = np.frombuffer(raw, dtype=np.float32)
        elif v['dtype'] == 'I32': a = np.frombuffer(raw, dtype=np.int32)
        r[k] = a.reshape(v['shape']).astype(np.float64) if v['dtype'] != 'I32' else a.reshape(v['shape'])
    return r
W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
H, L, nh, nkv, hd, eps = c['hidden_size'], c['num_hidden_layers'], c['num_attention_heads'], c['num_key_value_heads'], c['head_dim'], c['rms_norm_eps']
theta = c.get('rope_theta', 10000.0)
def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
def rope(x, T):
    f = np.outer(np.arange(T), inv); cos = np.cos(np.concatenate([f, f], -1)); sin = np.sin(np.concatenate([f, f], -1))
    x1, x2 = x[..., :hd//2], x[..., hd//2:]; rot = np.concatenate([-x2, x1], -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]
def fwd(ids):
    T = len(ids); x = W['embed_tokens.weight'][ids]
    for l in range(L):
        p = f'layers.{l}.'
        xn = rms(x, W[p+'input_layernorm.weight'])
        q = (xn @ W[p+'self_attn.q_proj.weight'].T).reshape(T, nh, hd); k = (xn @ W[p+'self_attn.k_proj.weight'].T).reshape(T, nkv, hd); v = (xn @ W[p+'self_attn.v_proj.weight'].T).reshape(T, nkv, hd)
        q = rope(rms(q, W[p+'self_attn.q_norm.weight']), T); k = rope(rms(k, W[p+'self_attn.k_norm.weight']), T)
        rep = nh // nkv; k = np.repeat(k, rep, 1); v = np.repeat(v, rep, 1)
        s = np.einsum('thd,shd->hts', q, k) / np.sqrt(hd); s = s + np.triu(np.full((T, T), -np.inf), 1)[None]
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        a = np.einsum('hts,shd->thd', s, v).reshape(T, nh*hd)
        x = x + a @ W[p+'self_attn.o_proj.weight'].T
        xn = rms(x, W[p+'post_attention_layernorm.weight'])
        g = xn @ W[p+'mlp.gate_proj.weight'].T; u = xn @ W[p+'mlp.up_proj.weight'].T
        x = x + ((g / (1 + np.exp(-g))) * u) @ W[p+'mlp.down_proj.weight'].T
    return rms(x, W['norm.weight'])
# ids as osprey's tokenizer gives them (byte-level, no merges hit for most): from a file of JSON lists
idss = json.load(open(sys.argv[3]))
res = {}; pooled = []
for i, ids in enumerate(idss):
    h = fwd(np.array(ids)); res[f'input_ids_{i}'] = np.array(ids, dtype=np.int32); res[f'hidden_{i}'] = h.astype(np.float32); pooled.append(h[-1])
P = np.stack(pooled)
def nz(a): return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
res['embedding'] = nz(P); res['mrl_16'] = nz(P[:, :16]); res['mrl_32'] = nz(P[:, :32])
# write safetensors
hdr = {}; off = 0; blobs = []
for k, a in res.items():
    a = np.ascontiguousarray(a); bts = a.tobytes(); hdr[k] = {'dtype': 'I32' if a.dtype == np.int32 else 'F32', 'shape': list(a.shape), 'data_offsets': [off, off + len(bts)]}; off += len(bts); blobs.append(bts)
hj = json.dumps(hdr).encode(); hj += b' ' * ((8 - len(hj) % 8) % 8)
open(out, 'wb').write(struct.pack('<Q', len(hj)) + hj + b''.join(blobs))
print('ok')
