#!/usr/bin/env python3
"""An independent reference for the encoder folders of tests/data/bert (bert-tiny, xlmr-tiny, xlmr-reranker-tiny):
BERT / XLM-RoBERTa written in numpy, in f64, from the safetensors bytes (bf16 weights widened exactly), following
transformers' modeling_bert.py / modeling_xlm_roberta.py: word + token type 0 + learned absolute position
embeddings (XLM-R: positions padding_idx + 1 + t, create_position_ids_from_input_ids), embedding LayerNorm,
post-LN blocks (attention with biases over the whole input; dense + residual + LayerNorm; erf GELU; dense +
residual + LayerNorm). It needs only numpy (the system python's), so it runs where torch does not;
make_golden.py is the transformers / sentence-transformers reference.

    /usr/bin/python3 tests/data/bert/numpy_golden.py MODEL_DIR OUT.safetensors IDS.json

IDS.json: a list of token-id lists (osprey's tokenizer's, written by tests/data/bert/make_ids.sh; the transformers
golden checks the tokenizer). Writes input_ids_i (I32), hidden_i [T_i, H] (last_hidden_state), and, per the
folder: embedding [N, H] (pooled as 1_Pooling/config.json says, L2-normalized) or, for a sequence classifier,
score [N] (classifier.dense, tanh, classifier.out_proj on the first token).
"""
import json, math, os, sys
import numpy as np

d, out, idsf = sys.argv[1], sys.argv[2], sys.argv[3]


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from numpy_ref import load_st, save_st
W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
arch = c['architectures'][0]
xlmr = arch.startswith('XLMRoberta')
H, L, nh, eps = c['hidden_size'], c['num_hidden_layers'], c['num_attention_heads'], c['layer_norm_eps']
hd = H // nh; pad = c.get('pad_token_id', 1 if xlmr else 0)
pre = next(p for p in ('', 'bert.', 'roberta.') if p + 'embeddings.word_embeddings.weight' in W)
erf = np.vectorize(math.erf)


def ln(x, w, b):
    m = x.mean(-1, keepdims=True); v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def lin(x, name):
    return x @ W[name + '.weight'].T + W[name + '.bias']


def fwd(ids):
    T = len(ids); e = pre + 'embeddings.'
    if xlmr:
        mask = (ids != pad).astype(np.int64); pos = np.cumsum(mask) * mask + pad
    else:
        pos = np.arange(T)
    x = W[e + 'word_embeddings.weight'][ids] + W[e + 'token_type_embeddings.weight'][np.zeros(T, dtype=np.int64)]
    x = x + W[e + 'position_embeddings.weight'][pos]
    x = ln(x, W[e + 'LayerNorm.weight'], W[e + 'LayerNorm.bias'])
    for l in range(L):
        p = f'{pre}encoder.layer.{l}.'
        q = lin(x, p + 'attention.self.query').reshape(T, nh, hd)
        k = lin(x, p + 'attention.self.key').reshape(T, nh, hd)
        v = lin(x, p + 'attention.self.value').reshape(T, nh, hd)
        s = np.einsum('thd,shd->hts', q, k) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True)); s /= s.sum(-1, keepdims=True)
        a = np.einsum('hts,shd->thd', s, v).reshape(T, H)
        x = ln(lin(a, p + 'attention.output.dense') + x, W[p + 'attention.output.LayerNorm.weight'],
               W[p + 'attention.output.LayerNorm.bias'])
        g = lin(x, p + 'intermediate.dense'); g = 0.5 * g * (1 + erf(g / math.sqrt(2)))
        x = ln(lin(g, p + 'output.dense') + x, W[p + 'output.LayerNorm.weight'], W[p + 'output.LayerNorm.bias'])
    return x


idss = json.load(open(idsf))
res = {}; pooled = []; scores = []
pool_cfg = d + '/1_Pooling/config.json'
mode = json.load(open(pool_cfg)) if os.path.exists(pool_cfg) else None
for i, ids in enumerate(idss):
    h = fwd(np.array(ids, dtype=np.int64))
    res[f'input_ids_{i}'] = np.array(ids, dtype=np.int32); res[f'hidden_{i}'] = h.astype(np.float32)
    if mode:
        pooled.append(h[0] if mode['pooling_mode_cls_token'] else h.mean(0))
    if 'classifier.dense.weight' in W:
        t = np.tanh(lin(h[0], 'classifier.dense')); scores.append(lin(t, 'classifier.out_proj')[0])
if pooled:
    P = np.stack(pooled); res['embedding'] = (P / np.linalg.norm(P, axis=-1, keepdims=True)).astype(np.float32)
if scores:
    res['score'] = np.array(scores, dtype=np.float32)
save_st(out, res)
print('wrote', out, 'with', ', '.join(sorted(res)))
