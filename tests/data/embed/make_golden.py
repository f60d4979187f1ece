#!/usr/bin/env python3
"""The reference embeddings of an embedder folder (issue 40), as transformers and sentence-transformers compute them.

Usage (on the device, which has torch, transformers and sentence-transformers):
    python3 tests/data/embed/make_golden.py MODEL_DIR [OUT.safetensors]

MODEL_DIR: a folder made by `osprey synth --preset qwen3-embedding-tiny --out MODEL_DIR` (a bare Qwen3 body, no
lm_head, modules.json + 1_Pooling: last token, Normalize) with tests/data/embed's tokenizer.json and
tokenizer_config.json copied in. OUT (default MODEL_DIR/golden.safetensors) gets, in float32 math
(dtype=torch.float32, eager attention, as the goldens of tests/data/goldens):
    input_ids_{i}   I32 [T_i]      input i's ids (the tokenizer's, <|endoftext|> appended by its post-processor)
    hidden_{i}      F32 [T_i, H]   AutoModel's last_hidden_state
    embedding       F32 [N, H]     last-token pooled, L2-normalized (by hand, from hidden)
    st_embedding    F32 [N, H]     SentenceTransformer(MODEL_DIR).encode(texts) (the folder's own modules)
    mrl_{d}         F32 [N, d]     the first d of the pooled vector, renormalized (Matryoshka), d in 16, 32
Each input runs alone (no padding), so the reference owes nothing to a padding side or mask.
"""
import json
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import AutoModel, AutoTokenizer

TEXTS = ["the cat sat on the mat", "hi", "in the winter there was snow", "x", "theretheretherethere in in in"]


def main():
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else f"{model_dir}/golden.safetensors"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    res, pooled = {}, []
    with torch.no_grad():
        for i, t in enumerate(TEXTS):
            ids = tok(t, return_tensors="pt")["input_ids"]
            assert ids[0, -1].item() == tok.convert_tokens_to_ids("<|endoftext|>"), "the post-processor must append <|endoftext|>"
            h = model(input_ids=ids).last_hidden_state[0]
            res[f"input_ids_{i}"] = ids[0].numpy().astype(np.int32)
            res[f"hidden_{i}"] = h.numpy().astype(np.float32)
            pooled.append(h[-1])
    p = torch.stack(pooled)
    res["embedding"] = torch.nn.functional.normalize(p, p=2, dim=-1).numpy()
    for d in (16, 32):
        res[f"mrl_{d}"] = torch.nn.functional.normalize(p[:, :d], p=2, dim=-1).numpy()
    try:
        from sentence_transformers import SentenceTransformer
        st = SentenceTransformer(model_dir, device="cpu", model_kwargs={"dtype": torch.float32, "attn_implementation": "eager"})
        res["st_embedding"] = np.stack([st.encode(t, convert_to_numpy=True) for t in TEXTS]).astype(np.float32)
        print("sentence-transformers vs by hand: max |diff|", float(np.abs(res["st_embedding"] - res["embedding"]).max()))
    except Exception as e:  # not installed, or this version cannot load the folder: the rest is still the reference
        print("sentence-transformers: st_embedding left out:", repr(e))
    save_file(res, out, metadata={"texts": json.dumps(TEXTS)})
    print("wrote", out, "with", ", ".join(sorted(res)))


if __name__ == "__main__":
    main()
