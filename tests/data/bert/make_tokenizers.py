#!/usr/bin/env python3
"""Writes the hand-built tokenizers of tests/data/bert's folders (needs nothing but python3):
bert-tiny: WordPiece with BertNormalizer (lowercase, accents stripped, CJK padded), BertPreTokenizer and the
[CLS] $A [SEP] template; xlmr-tiny and xlmr-reranker-tiny: Unigram with Precompiled (a hand-built charsmap: fullwidth H, the fi ligature, ö, the ideographic space) +
Replace(" {2,}", " "), Metaspace
and XLM-R's <s> $A </s> / <s> $A </s> </s> $B </s> templates. Vocabularies of at most 64 ids (the presets' size).

    python3 tests/data/bert/make_tokenizers.py tests/data/bert
"""
import base64, json, os, string, sys

root = sys.argv[1]


def added(tok, i):
    return {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
            "special": True}


def special(tok, i):
    return {"id": tok, "ids": [i], "tokens": [tok]}


def seq(x, type_id=0):
    return {"Sequence": {"id": x, "type_id": type_id}}


def sp(x, type_id=0):
    return {"SpecialToken": {"id": x, "type_id": type_id}}


def write(d, tok, cfg):
    os.makedirs(d, exist_ok=True)
    json.dump(tok, open(f"{d}/tokenizer.json", "w"), ensure_ascii=False, indent=1)
    json.dump(cfg, open(f"{d}/tokenizer_config.json", "w"), ensure_ascii=False, indent=1)


# ---- WordPiece ----
wp = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", ".", ",", "!", "?", "hello",
      "hi", "wo", "##r", "##ld", "run", "##ning", "##s", "中", "国"] + list(string.ascii_lowercase) + \
     ["##e", "##t", "##n", "##g", "in", "where", "is", "hall", "what", "##x"]
assert len(wp) == len(set(wp)) and len(wp) <= 64
bert = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [added(t, i) for i, t in enumerate(wp[:5])],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
                   "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "TemplateProcessing", "single": [sp("[CLS]"), seq("A"), sp("[SEP]")],
                       "pair": [sp("[CLS]"), seq("A"), sp("[SEP]"), seq("B", 1), sp("[SEP]", 1)],
                       "special_tokens": {"[CLS]": special("[CLS]", 2), "[SEP]": special("[SEP]", 3)}},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(wp)}},
}
write(f"{root}/bert-tiny", bert, {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "strip_accents": None,
                                  "tokenize_chinese_chars": True, "unk_token": "[UNK]", "sep_token": "[SEP]",
                                  "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]",
                                  "model_max_length": 64, "clean_up_tokenization_spaces": True})

# ---- Precompiled: a darts-clone double-array trie of a few keys, as spm_precompiled reads it ----
def charsmap(pairs):
    """[u32 trie bytes][units][NUL-terminated replacements]: unit = offset << 10 | has_leaf << 8 | label; a key's
    value (its replacement's offset) in the unit at its node's base (label 0), bit 31 set."""
    blob = b""; trie = {}
    for k, v in pairs:
        node = trie
        for b in k.encode():
            node = node.setdefault(b, {})
        node[None] = len(blob); blob += v.encode() + b"\0"
    units = [0] * 1024; used = {0}

    def place(node, pos):  # the node's unit is at pos; find its base
        labels = [0 if k is None else k for k in node]
        base = 1
        while any((base ^ c) in used for c in labels): base += 1
        for c in labels: used.add(base ^ c)
        leaf = None in node
        units[pos] = units[pos] & 0xFF | (pos ^ base) << 10 | (leaf << 8 if pos else 0)
        if leaf: units[base] = node[None] | 1 << 31
        for c, child in node.items():
            if c is None: continue
            units[base ^ c] = c
            place(child, base ^ c)
    place(trie, 0)
    n = max(used) + 1
    data = b"".join(u.to_bytes(4, "little") for u in units[:n])
    return base64.b64encode(len(data).to_bytes(4, "little") + data + blob).decode()


# ---- Unigram ----
M = "\u2581"
pieces = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), (M, -3.0), (M + "the", -2.0),
          (M + "cat", -2.5), (M + "sat", -3.0), (M + "on", -2.2), (M + "mat", -3.5), (".", -1.5), (",", -1.6),
          ("!", -2.0), ("?", -2.0), (M + "hi", -3.0), (M + "hello", -3.2), (M + "he", -2.5), ("llo", -3.0),
          (M + "T", -4.0), ("he", -2.6), (M + "ca", -3.1), (M + "run", -3.0), ("ning", -3.3), ("ing", -2.4),
          (M + "w", -3.5), ("\u00f6", -4.5), ("ld", -3.0), (M + "where", -3.4), (M + "is", -2.3), (M + "in", -2.4),
          (M + "hall", -3.8), (M + "what", -3.3), ("ts", -2.9), ("at", -2.8)]
pieces += [(ch, -3.0 - 0.01 * i) for i, ch in enumerate(string.ascii_lowercase)] + [("H", -4.2), ("<mask>", 0.0)]
names = [p for p, _ in pieces]
assert len(names) == len(set(names)) and len(names) <= 64, len(names)
mask = len(pieces) - 1
xlmr = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [added(t, i) for i, t in enumerate(names[:4])] + [added("<mask>", mask)],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Precompiled", "precompiled_charsmap": charsmap([("\uff28", "H"), ("\ufb01", "fi"), ("\u00f6", "o"),
                                                                  ("\u3000", " "), ("\u00f6\u00f6", "oe")])},
        {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
    "pre_tokenizer": {"type": "Metaspace", "replacement": M, "prepend_scheme": "always", "split": True},
    "post_processor": {"type": "TemplateProcessing", "single": [sp("<s>"), seq("A"), sp("</s>")],
                       "pair": [sp("<s>"), seq("A"), sp("</s>"), sp("</s>"), seq("B"), sp("</s>")],
                       "special_tokens": {"<s>": special("<s>", 0), "</s>": special("</s>", 2)}},
    "decoder": {"type": "Metaspace", "replacement": M, "prepend_scheme": "always", "split": True},
    "model": {"type": "Unigram", "unk_id": 3, "vocab": [[p, s] for p, s in pieces], "byte_fallback": False},
}
cfg = {"tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
       "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>", "model_max_length": 64,
       "clean_up_tokenization_spaces": True}
for name in ("xlmr-tiny", "xlmr-reranker-tiny"):
    write(f"{root}/{name}", xlmr, cfg)
print("wrote", root, "bert-tiny (", len(wp), "ids ), xlmr (", len(pieces), "ids )")
