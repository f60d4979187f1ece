#!/bin/sh
# Bad input on the command line: each case must exit 1 with exactly one
# line on stderr naming the problem, and never crash (exit >= 128).
set -u
OSPREY=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
G=data/goldens/llama3

expect() { # expect NAME NEEDLE CMD...
    name=$1 needle=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    rc=$?
    lines=$(wc -l <"$T/err")
    if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$needle" "$T/err"; then
        echo "FAIL $name: exit $rc, $lines stderr lines:"; cat "$T/err"; fails=$((fails + 1))
    else
        echo "ok   $name: $(cat "$T/err")"
    fi
}

model() { # model DIR: a copy of the llama3 golden
    rm -rf "$1"; mkdir -p "$1"; cp $G/config.json $G/model.safetensors "$1/"
}

# truncated shard
model "$T/trunc"; head -c 200000 $G/model.safetensors >"$T/trunc/model.safetensors"
expect truncated "past the end" "$OSPREY" inspect "$T/trunc"

# unknown architecture
model "$T/arch"; sed -i 's/LlamaForCausalLM/MysteryForCausalLM/; s/"llama"/"mystery"/' "$T/arch/config.json"
expect architecture "architecture 'MysteryForCausalLM'" "$OSPREY" inspect "$T/arch"

# a header that lies: shape [4] F32 needs 16 bytes, offsets span 8
st() { # st FILE JSON DATA_BYTES
    len=$(printf '%s' "$2" | wc -c)
    printf "$(printf '\\%03o' $((len & 255)) $(((len >> 8) & 255)))\\000\\000\\000\\000\\000\\000" >"$1"
    printf '%s' "$2" >>"$1"
    head -c "$3" /dev/zero >>"$1"
}
model "$T/lie"; st "$T/lie/model.safetensors" '{"model.embed_tokens.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}' 16
expect lying-header "'model.embed_tokens.weight'" "$OSPREY" inspect "$T/lie"

# unknown dtype
model "$T/dtype"; st "$T/dtype/model.safetensors" '{"model.embed_tokens.weight":{"dtype":"Q7","shape":[2],"data_offsets":[0,2]}}' 2
expect dtype "unknown dtype 'Q7'" "$OSPREY" inspect "$T/dtype"

# missing tensor: a valid file holding only the embedding
model "$T/missing"; st "$T/missing/model.safetensors" '{"model.embed_tokens.weight":{"dtype":"BF16","shape":[512,64],"data_offsets":[0,65536]}}' 65536
expect missing "is missing" "$OSPREY" inspect "$T/missing"

# no such folder; logits with a bad input file
expect nofolder "no such model folder" "$OSPREY" inspect "$T/nope"
printf 'garbage' >"$T/in.safetensors"
expect bad-input "in.safetensors" "$OSPREY" logits --model $G --input "$T/in.safetensors" --output "$T/o.safetensors"

# osprey convert: refusals leave nothing behind
expect convert-noinput "no such model folder" "$OSPREY" convert "$T/nope" "$T/c1" -q
mkdir -p "$T/full"; touch "$T/full/x"
expect convert-nonempty "not empty" "$OSPREY" convert $G "$T/full" -q
expect convert-bits "bits must be 2, 3, 4, 5, 6 or 8" "$OSPREY" convert $G "$T/c2" -q --q-bits 7
expect convert-group "group size must be 32, 64 or 128" "$OSPREY" convert $G "$T/c3" -q --q-group-size 48
expect convert-quantized "already quantized" "$OSPREY" convert data/goldens/llama3-q4 "$T/c4" -q
expect convert-dtype "unknown dtype 'f8'" "$OSPREY" convert $G "$T/c5" --dtype f8
expect convert-option "unknown option '--bits'" "$OSPREY" convert $G "$T/c6" --bits 4
for d in c1 c2 c3 c4 c5 c6; do
    if ls -d "$T/$d"* >/dev/null 2>&1; then echo "FAIL convert left $T/$d behind"; fails=$((fails + 1)); fi
done
# Whisper: audio that is not audio, empty, missing; a model that is not Whisper
W=data/goldens/whisper
printf 'not audio at all' >"$T/a.wav"
expect mel-not-audio "not a readable audio file" "$OSPREY" mel "$T/a.wav" --output "$T/m.safetensors"
printf 'RIFF\044\000\000\000WAVEfmt \020\000\000\000\001\000\001\000\200\076\000\000\000\175\000\000\002\000\020\000data\000\000\000\000' >"$T/empty.wav"
expect mel-empty "the audio is empty" "$OSPREY" mel "$T/empty.wav" --output "$T/m.safetensors"
expect mel-missing "no such audio file" "$OSPREY" mel "$T/nope.wav" --output "$T/m.safetensors"
expect transcribe-not-whisper "not a Whisper model" "$OSPREY" transcribe $W/audio.wav --model $G
expect transcribe-no-tokenizer "no tokenizer.json" "$OSPREY" transcribe $W/audio.wav --model $W
expect logits-whisper-bad-audio "not a readable audio file" "$OSPREY" logits --model $W --audio "$T/a.wav" \
    --input $W/golden.safetensors --output "$T/o.safetensors"
expect logits-whisper-no-ids "decoder_ids" "$OSPREY" logits --model $W --audio $W/audio.wav \
    --input $G/golden.safetensors --output "$T/o.safetensors"

echo "$fails failed"
[ "$fails" -eq 0 ]
