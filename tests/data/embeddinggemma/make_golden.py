#!/usr/bin/env python3
"""The reference embeddings of an EmbeddingGemma folder (issue 40), as transformers and sentence-transformers compute
them.

Usage (on the device, which has torch, transformers and sentence-transformers):
    python3 tests/data/embeddinggemma/make_golden.py MODEL_DIR [OUT.safetensors]

MODEL_DIR: tests/data/embeddinggemma/embeddinggemma-tiny (`osprey synth --preset embeddinggemma-tiny`: a bare
Gemma3TextModel with use_bidirectional_attention, sliding_window 8, modules.json + 1_Pooling (mean) + 2_Dense +
3_Dense + Normalize; tests/data/embed's tokenizer.json and tokenizer_config.json copied in). OUT (default
MODEL_DIR/golden.safetensors) gets, in float32 math (dtype=torch.float32, eager attention):
    input_ids_{i}   I32 [T_i]      input i's ids (the tokenizer's, <|endoftext|> appended by its post-processor)
    hidden_{i}      F32 [T_i, H]   AutoModel's last_hidden_state (Gemma3TextModel, bidirectional)
    embedding       F32 [N, H]     mean-pooled, through 2_Dense and 3_Dense, L2-normalized (by hand, from hidden)
    st_embedding    F32 [N, H]     SentenceTransformer(MODEL_DIR).encode(texts) (the folder's own modules)
    mrl_{d}         F32 [N, d]     the first d of the vector before the normalization, renormalized, d in 16, 32
Each input runs alone (no padding), so the reference owes nothing to a padding side or mask.
"""
import json
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

TEXTS = ["the cat sat on the mat", "hi", "in the winter there was snow", "x", "theretheretherethere in in in",
         "in the winter there was snow and the cat sat by the fire on the mat, then there was more snow"]


def main():
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else f"{model_dir}/golden.safetensors"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = json.load(open(f"{model_dir}/config.json"))
    # transformers reads a bidirectional Gemma 3's sliding_window as a width and keeps the radius width // 2 + 1
    # (what osprey and numpy_golden.py implement); a version that does not is not the reference
    assert model.config.use_bidirectional_attention, "use_bidirectional_attention was not read"
    assert model.config.sliding_window == cfg["sliding_window"] // 2 + 1, (model.config.sliding_window, transformers.__version__)
    assert type(model).__name__ == "Gemma3TextModel", type(model).__name__
    d2 = load_file(f"{model_dir}/2_Dense/model.safetensors")["linear.weight"].float()
    d3 = load_file(f"{model_dir}/3_Dense/model.safetensors")["linear.weight"].float()
    res, vecs = {}, []
    with torch.no_grad():
        for i, t in enumerate(TEXTS):
            ids = tok(t, return_tensors="pt")["input_ids"]
            assert ids[0, -1].item() == tok.convert_tokens_to_ids("<|endoftext|>"), "the post-processor must append <|endoftext|>"
            h = model(input_ids=ids).last_hidden_state[0]
            res[f"input_ids_{i}"] = ids[0].numpy().astype(np.int32)
            res[f"hidden_{i}"] = h.numpy().astype(np.float32)
            vecs.append(d3 @ (d2 @ h.mean(0)))
    p = torch.stack(vecs)
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
    save_file(res, out, metadata={"texts": json.dumps(TEXTS), "transformers": transformers.__version__})
    print("wrote", out, "with", ", ".join(sorted(res)))


if __name__ == "__main__":
    main()
