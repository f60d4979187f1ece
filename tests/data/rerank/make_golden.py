#!/usr/bin/env python3
"""The reference scores of a Qwen3-Reranker folder (issue 40), as the model card computes them with transformers.

Usage (on the device, which has torch and transformers):
    python3 tests/data/rerank/make_golden.py MODEL_DIR [OUT.safetensors]

MODEL_DIR: tests/data/rerank/qwen3-reranker-tiny (`osprey synth --preset qwen3-reranker-tiny` with tests/data/rerank's
tokenizer.json and tokenizer_config.json copied in). The pairs are tests/data/rerank/pairs.json. OUT (default
MODEL_DIR/golden.safetensors) gets, in float32 math (dtype=torch.float32, eager attention), for pair i:
    input_ids_{i}    I32 [T_i]   the card's ids: prefix (no special tokens) + the formatted pair (the tokenizer's
                                 special tokens, as the card's tokenizer(pairs) call) + suffix (no special tokens)
    hidden_last_{i}  F32 [H]     AutoModelForCausalLM's body's last_hidden_state at the last position
and logit_yes, logit_no, score F32 [N]: the logits of "yes" and "no" (convert_tokens_to_ids) at the last position,
and exp(log_softmax([no, yes]))[1], the card's compute_logits. Each pair runs alone (no padding).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

PREFIX = ('<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct '
          'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
SUFFIX = '<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n'
DEFAULT = 'Given a web search query, retrieve relevant passages that answer the query'


def format_instruction(instruction, query, doc):
    if instruction is None:
        instruction = DEFAULT
    return "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}".format(instruction=instruction, query=query, doc=doc)


def main():
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else f"{model_dir}/golden.safetensors"
    pairs = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "pairs.json")))
    tok = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    yes, no = tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no")
    pre = tok.encode(PREFIX, add_special_tokens=False)
    suf = tok.encode(SUFFIX, add_special_tokens=False)
    res, ly, ln, sc = {}, [], [], []
    with torch.no_grad():
        for i, p in enumerate(pairs):
            mid = tok(format_instruction(p.get("instruction"), p["query"], p["document"]))["input_ids"]
            ids = torch.tensor([pre + mid + suf])
            h = model.model(input_ids=ids).last_hidden_state[0, -1]
            logits = model(input_ids=ids).logits[0, -1]
            res[f"input_ids_{i}"] = ids[0].numpy().astype(np.int32)
            res[f"hidden_last_{i}"] = h.numpy().astype(np.float32)
            two = torch.stack([logits[no], logits[yes]])
            ly.append(float(logits[yes])), ln.append(float(logits[no]))
            sc.append(float(torch.nn.functional.log_softmax(two, dim=0)[1].exp()))
            print(i, "lm_head(h) vs logits:", float((model.lm_head(h) - logits).abs().max()))
    res["logit_yes"] = np.array(ly, dtype=np.float32)
    res["logit_no"] = np.array(ln, dtype=np.float32)
    res["score"] = np.array(sc, dtype=np.float32)
    save_file(res, out, metadata={"pairs": json.dumps(pairs)})
    print("wrote", out, "scores", res["score"])


if __name__ == "__main__":
    main()
