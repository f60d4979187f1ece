#!/usr/bin/env python3
"""The reference outputs of tests/data/bert's encoder folders (issue 40), as Hugging Face tokenizers, transformers
and sentence-transformers compute them.

Usage (on the device, which has torch, transformers, tokenizers and sentence-transformers), from the repository root:
    for m in bert-tiny xlmr-tiny xlmr-reranker-tiny; do python3 tests/data/bert/make_golden.py tests/data/bert/$m; done

Each MODEL_DIR was made by `osprey synth --preset NAME --out MODEL_DIR --seed 40` (bf16 weights, as
sentence-transformers saves them: no "bert."/"roberta." prefix) with make_tokenizers.py's tokenizer files. OUT
(default MODEL_DIR/golden.safetensors) gets, in float32 math (eager attention), each input run alone (no padding):
    input_ids_{i}  I32 [T_i]     tokenizers.Tokenizer.from_file(tokenizer.json).encode(text) (a pair: (query, document))
    hidden_{i}     F32 [T_i, H]  last_hidden_state (BertModel / XLMRobertaModel; the classifier's .roberta)
    embedding      F32 [N, H]    pooled as 1_Pooling/config.json says (cls or mean), L2-normalized, by hand
    st_embedding   F32 [N, H]    SentenceTransformer(MODEL_DIR).encode(texts), when its tokenizer gives the same ids
    score          F32 [N]       XLMRobertaForSequenceClassification's logit (dense, tanh, out_proj on <s>)
The weights are loaded with load_state_dict (the classifier's encoder under "roberta.") and every weight must be
taken, none missing (only the position_ids / token_type_ids buffers may be), so a name mismatch is an error rather
than a random initialization.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoConfig, BertModel, XLMRobertaForSequenceClassification, XLMRobertaModel

# test_bert.c's inputs, in its order
TEXTS = ["The cat sat on the mat.", "hi", "\uff28ello, w\u00f6rld! \u4e2d\u56fd running \ufb01 cats",
         "the the the the the the the the the the cat"]
PAIRS = [("what sat on the mat?", "The cat sat on the mat."), ("hi", "hello"),
         ("where is the cat", "running cats sat in the hall"), ("the", "the the the the the the the the")]


def main():
    d = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else f"{d}/golden.safetensors"
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(d)
    try:
        cfg._attn_implementation = "eager"
    except AttributeError:  # a transformers without the setter: its default attention (the same math)
        print("attention implementation left at", getattr(cfg, "_attn_implementation", "?"))
    arch = cfg.architectures[0]
    sd = {k: v.float() for k, v in load_file(f"{d}/model.safetensors").items()}
    if arch == "XLMRobertaForSequenceClassification":
        model = XLMRobertaForSequenceClassification(cfg)
        sd = {(k if k.startswith("classifier.") else "roberta." + k): v for k, v in sd.items()}
    elif arch == "XLMRobertaModel":
        model = XLMRobertaModel(cfg, add_pooling_layer=False)
    else:
        model = BertModel(cfg, add_pooling_layer=False)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith(("position_ids", "token_type_ids"))]  # buffers, not weights
    assert not missing and not unexpected, f"weights missing {missing}, not taken {unexpected}"
    model = model.float().eval()
    encoder = model.roberta if arch == "XLMRobertaForSequenceClassification" else model
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    pairs = arch == "XLMRobertaForSequenceClassification"
    inputs = PAIRS if pairs else TEXTS
    res, pooled, scores = {}, [], []
    pool_cfg = f"{d}/1_Pooling/config.json"
    mode = json.load(open(pool_cfg)) if os.path.exists(pool_cfg) else None
    with torch.no_grad():
        for i, x in enumerate(inputs):
            ids = tok.encode(*x).ids if pairs else tok.encode(x).ids
            t = torch.tensor([ids])
            h = encoder(input_ids=t).last_hidden_state[0]
            res[f"input_ids_{i}"] = np.array(ids, dtype=np.int32)
            res[f"hidden_{i}"] = h.numpy().astype(np.float32)
            if pairs:
                scores.append(model(input_ids=t).logits[0, 0].item())
            elif mode:
                pooled.append(h[0] if mode["pooling_mode_cls_token"] else h.mean(0))
    if pooled:
        res["embedding"] = torch.nn.functional.normalize(torch.stack(pooled), p=2, dim=-1).numpy()
    if scores:
        res["score"] = np.array(scores, dtype=np.float32)
    if mode:
        try:
            from sentence_transformers import SentenceTransformer
            st = SentenceTransformer(d, device="cpu", model_kwargs={"attn_implementation": "eager"})
            st_ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS]
            if st_ids == [res[f"input_ids_{i}"].tolist() for i in range(len(TEXTS))]:
                st.float()
                res["st_embedding"] = np.stack([st.encode(t, convert_to_numpy=True) for t in TEXTS]).astype(np.float32)
                print("sentence-transformers vs by hand: max |diff|",
                      float(np.abs(res["st_embedding"] - res["embedding"]).max()))
            else:
                print("sentence-transformers: its tokenizer gives other ids, st_embedding left out:", st_ids)
        except Exception as e:  # not installed, or this version cannot load the folder: the rest is the reference
            print("sentence-transformers: st_embedding left out:", repr(e))
    save_file(res, out, metadata={"inputs": json.dumps(inputs)})
    print("wrote", out, "with", ", ".join(sorted(res)))


if __name__ == "__main__":
    main()
