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
import json, os, sys
import numpy as np
d = sys.argv[1]; out = sys.argv[2]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from numpy_ref import load_st, save_st, qwen3_hidden
W = load_st(d + '/model.safetensors'); c = json.load(open(d + '/config.json'))
def fwd(ids): return qwen3_hidden(W, c, ids)
# ids as osprey's tokenizer gives them (byte-level, no merges hit for most): from a file of JSON lists
idss = json.load(open(sys.argv[3]))
res = {}; pooled = []
for i, ids in enumerate(idss):
    h = fwd(np.array(ids)); res[f'input_ids_{i}'] = np.array(ids, dtype=np.int32); res[f'hidden_{i}'] = h.astype(np.float32); pooled.append(h[-1])
P = np.stack(pooled)
def nz(a): return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)
res['embedding'] = nz(P); res['mrl_16'] = nz(P[:, :16]); res['mrl_32'] = nz(P[:, :32])
# write safetensors
save_st(out, res)
print('ok')
