"""What the numpy references (tests/data/*/numpy_golden.py) share: safetensors read into f64 (bf16 and f32 widened
exactly, i32 kept), safetensors written from f32 and i32 arrays, and the Qwen3 body in f64 (the embedder's and the
reranker's). numpy only, so it runs with the system python. A script imports it from its parent folder:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
"""
import json, struct
import numpy as np


def load_st(p):
    """{name: array} of the file at p: bf16 and f32 as f64, i32 as int32."""
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n]); base = 8 + n; r = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']; raw = b[base + s:base + e]
        if v['dtype'] == 'BF16': a = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif v['dtype'] == 'F32': a = np.frombuffer(raw, dtype=np.float32)
        elif v['dtype'] == 'I32': r[k] = np.frombuffer(raw, dtype=np.int32).reshape(v['shape']); continue
        else: raise SystemExit(f'{k}: dtype {v["dtype"]} not read here')
        r[k] = a.reshape(v['shape']).astype(np.float64)
    return r


def save_st(p, res):
    """res's arrays (int32, or anything else as f32 already converted by the caller) written to p in order."""
    hdr = {}; off = 0; blobs = []
    for k, a in res.items():
        a = np.ascontiguousarray(a); bts = a.tobytes()
        hdr[k] = {'dtype': 'I32' if a.dtype == np.int32 else 'F32', 'shape': list(a.shape), 'data_offsets': [off, off + len(bts)]}
        off += len(bts); blobs.append(bts)
    hj = json.dumps(hdr).encode(); hj += b' ' * ((8 - len(hj) % 8) % 8)
    open(p, 'wb').write(struct.pack('<Q', len(hj)) + hj + b''.join(blobs))


def qwen3_hidden(W, c, ids, pre=''):
    """The final normed states [T, H] of Qwen3's causal body on ids; weights named pre + 'layers.0...'."""
    L, nh, nkv, hd, eps = c['num_hidden_layers'], c['num_attention_heads'], c['num_key_value_heads'], c['head_dim'], c['rms_norm_eps']
    theta = c.get('rope_theta', 10000.0)
    def rms(x, w): return x / np.sqrt((x*x).mean(-1, keepdims=True) + eps) * w
    inv = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    def rope(x, T):
        f = np.outer(np.arange(T), inv); cos = np.cos(np.concatenate([f, f], -1)); sin = np.sin(np.concatenate([f, f], -1))
        x1, x2 = x[..., :hd//2], x[..., hd//2:]; rot = np.concatenate([-x2, x1], -1)
        return x * cos[:, None, :] + rot * sin[:, None, :]
    T = len(ids); x = W[pre + 'embed_tokens.weight'][ids]
    for l in range(L):
        p = f'{pre}layers.{l}.'
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
    return rms(x, W[pre + 'norm.weight'])
