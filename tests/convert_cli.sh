#!/bin/sh
# osprey convert from the command line: a 4-bit, group-32 copy of a golden
# with mlx_lm's file layout that osprey loads and runs; the bundled model's
# copy keeps its tokenizer and template, so it chats; a bare embedder (no lm_head) converts and embeds.
set -eu
OSPREY=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$OSPREY" convert data/goldens/llama3 "$T/q4" -q --q-bits 4 --q-group-size 32 >"$T/out"
grep -q "23 modules quantized" "$T/out"
for f in config.json model.safetensors model.safetensors.index.json; do test -f "$T/q4/$f"; done
"$OSPREY" inspect "$T/q4" | grep -q "MLX affine 4-bit, group 32"
"$OSPREY" generate --model "$T/q4" --ids 1,2,3 -n 4 --temp 0 >/dev/null
# mlx_lm's spelling of the same
"$OSPREY" convert --hf-path data/goldens/llama3 --mlx-path "$T/q8" -q --q-bits 8 --q-group-size 64 >/dev/null
"$OSPREY" inspect "$T/q8" | grep -q "MLX affine 8-bit, group 64"
# the bundled model: a draft that keeps the tokenizer and chat template
"$OSPREY" convert ../models/fortune "$T/draft" -q --q-bits 4 >/dev/null
for f in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
    cmp "$T/draft/$f" "../models/fortune/$f"
done
"$OSPREY" generate --model "$T/draft" --prompt "Tell me a fortune." --chat -n 8 --temp 0 >"$T/gen" 2>/dev/null
test -s "$T/gen"
# a dtype conversion of the copy back: codes kept, scales in f32
"$OSPREY" convert "$T/q4" "$T/q4f32" --dtype f32 >/dev/null
"$OSPREY" inspect "$T/q4f32" | grep -q "scales F32"
# a bare embedder (no model. prefix, no lm_head): an 8-bit copy that embeds
"$OSPREY" convert data/embed/qwen3-embedding-tiny "$T/emb8" -q --q-bits 8 --q-group-size 32 >/dev/null
"$OSPREY" embed --model "$T/emb8" --input "the cat" | grep -q '"index": 0, "embedding": \['
echo "convert_cli: ok"
