#!/bin/sh
# Attention in token tiles (backend/cpu/attention.c): 700 random tokens
# through small goldens (windowed and full layers, GQA, Gemma 4's shared KV
# and experts) in prefill, decode and chunks, in reference and production
# precision; the logits must be bitwise those of one token at a time
# without the tiles' scratch (OSP_ATT_NOSCRATCH).
set -u
OSPREY=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
for g in gemma3 llama3 gemma4-e gemma4-moe; do
    for mode in prefill decode chunk:37; do
        for fast in "" --fast; do
            "$OSPREY" logits $fast --model data/goldens/$g --input data/attn_700.safetensors --output "$T/a.st" \
                --mode $mode >/dev/null 2>"$T/err" || { cat "$T/err"; fails=$((fails + 1)); continue; }
            OSP_ATT_NOSCRATCH=1 "$OSPREY" logits $fast --model data/goldens/$g --input data/attn_700.safetensors \
                --output "$T/b.st" --mode $mode >/dev/null 2>"$T/err" || { cat "$T/err"; fails=$((fails + 1)); continue; }
            if cmp -s "$T/a.st" "$T/b.st"; then echo "ok   $g $mode $fast"; else echo "FAIL $g $mode $fast: tiles differ"; fails=$((fails + 1)); fi
        done
    done
done
[ "$fails" -eq 0 ]
