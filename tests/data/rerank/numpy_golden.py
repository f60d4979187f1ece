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
import json, os, subprocess, sys
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from numpy_ref import load_st, save_st, qwen3_hidden
W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
head = W['model.embed_tokens.weight'] if c.get('tie_word_embeddings') else W['lm_head.weight']
def fwd(ids): return qwen3_hidden(W, c, ids, 'model.')

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
save_st(out, res)
print('scores', res['score'])
