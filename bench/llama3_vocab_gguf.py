#!/usr/bin/env python3
"""A vocabulary-only GGUF carrying the real Llama 3 tokenizer, for llama.cpp's grammar engine.

llama.cpp (through node-llama-cpp's `loadModel({modelPath, vocabOnly: true})`) then tokenizes with
and builds its grammar masks over the same 128,256 tokens osprey uses. The file holds key/values only
arch "llama" with its required hyperparameters, tokenizer.ggml.* as convert_hf_to_gguf.py writes them
for Llama 3 (model "gpt2", pre "llama-bpe", byte-level token strings, token types, merges, bos/eos ids),
and the tensors llama.cpp's loader demands even for a vocab-only load, at the smallest shape (one layer,
width 32, zeros: ~8 MB, all of it the embedding table; their values are never read).

Usage:
  /usr/bin/python3 bench/llama3_vocab_gguf.py [--tokenizer DIR] [--out FILE.gguf]
  (defaults: /work/shared/tokenizers/llama3, /tmp/llama3-vocab.gguf; DIR holds tokenizer.json[.gz]
  and tokenizer_config.json)
"""
import argparse
import gzip
import json
import os
import struct

import numpy as np

T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
TOK_NORMAL, TOK_CONTROL, TOK_USER_DEFINED = 1, 3, 4


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        return out + struct.pack("<I", value)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", value)
    if vtype == T_BOOL:
        return out + struct.pack("<B", 1 if value else 0)
    if vtype == T_STRING:
        return out + gstr(value)
    itype, arr = value  # T_ARRAY
    out += struct.pack("<IQ", itype, len(arr))
    if itype == T_STRING:
        return out + b"".join(gstr(x) for x in arr)
    if itype == T_INT32:
        return out + np.asarray(arr, dtype="<i4").tobytes()
    raise ValueError(itype)


def load_tokenizer(d):
    p = os.path.join(d, "tokenizer.json")
    if os.path.exists(p):
        with open(p, "rb") as f:
            tj = json.load(f)
    else:
        with gzip.open(p + ".gz", "rb") as f:
            tj = json.load(f)
    cfg = {}
    cp = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(cp):
        with open(cp) as f:
            cfg = json.load(f)
    return tj, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="/work/shared/tokenizers/llama3")
    ap.add_argument("--out", default="/tmp/llama3-vocab.gguf")
    a = ap.parse_args()
    tj, cfg = load_tokenizer(a.tokenizer)
    model = tj["model"]
    if model["type"] != "BPE":
        raise SystemExit(f"llama3_vocab_gguf: expected a BPE tokenizer, got {model['type']}")
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    n = max(max(model["vocab"].values()), max(added) if added else -1) + 1
    tokens = [None] * n
    types = [TOK_NORMAL] * n
    for s, i in model["vocab"].items():
        tokens[i] = s
    for i, t in added.items():
        tokens[i] = t["content"]
        types[i] = TOK_CONTROL if t.get("special") else TOK_USER_DEFINED
    missing = [i for i, t in enumerate(tokens) if t is None]
    if missing:
        raise SystemExit(f"llama3_vocab_gguf: {len(missing)} token ids have no string (first {missing[0]})")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    by_content = {t["content"]: i for i, t in added.items()}

    def special_id(name):
        v = cfg.get(name)
        if isinstance(v, dict):
            v = v.get("content")
        if v not in by_content:
            raise SystemExit(f"llama3_vocab_gguf: tokenizer_config.json's {name} {v!r} is not an added token")
        return by_content[v]

    # llama.cpp reads the hyperparameters and looks up the tensors even for a vocab-only load
    E, L, H, HK, F = 32, 1, 1, 1, 32
    items = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, "llama3-vocab-only"),
        kv("llama.context_length", T_UINT32, 8192),
        kv("llama.embedding_length", T_UINT32, E),
        kv("llama.block_count", T_UINT32, L),
        kv("llama.feed_forward_length", T_UINT32, F),
        kv("llama.attention.head_count", T_UINT32, H),
        kv("llama.attention.head_count_kv", T_UINT32, HK),
        kv("llama.rope.freq_base", T_FLOAT32, 500000.0),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        kv("llama.vocab_size", T_UINT32, n),
        kv("llama.rope.dimension_count", T_UINT32, E // H),
        kv("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv("tokenizer.ggml.pre", T_STRING, "llama-bpe"),
        kv("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        kv("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        kv("tokenizer.ggml.merges", T_ARRAY, (T_STRING, merges)),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, special_id("bos_token")),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, special_id("eos_token")),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
    ]
    # (name, ggml dims innermost first), f32 zeros; output.weight left out: tied to token_embd
    tensors = [("token_embd.weight", (E, n)), ("output_norm.weight", (E,))]
    for i in range(L):
        p = f"blk.{i}."
        tensors += [(p + "attn_norm.weight", (E,)), (p + "attn_q.weight", (E, E)), (p + "attn_k.weight", (E, E * HK // H)),
                    (p + "attn_v.weight", (E, E * HK // H)), (p + "attn_output.weight", (E, E)),
                    (p + "ffn_norm.weight", (E,)), (p + "ffn_gate.weight", (E, F)), (p + "ffn_up.weight", (E, F)),
                    (p + "ffn_down.weight", (F, E))]
    align = 32
    info, off = bytearray(), 0
    for name, dims in tensors:
        info += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", 0, off)  # GGML_TYPE_F32, offset in the data section
        off += (int(np.prod(dims)) * 4 + align - 1) // align * align
    with open(a.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(items)))
        for it in items:
            f.write(it)
        f.write(info)
        f.write(b"\0" * (-f.tell() % align))
        f.truncate(f.tell() + off)  # the data section: zeros
    print(f"llama3_vocab_gguf: {a.out}: {n} tokens, {len(merges)} merges, bos {special_id('bos_token')}, "
          f"eos {special_id('eos_token')}")


if __name__ == "__main__":
    main()
