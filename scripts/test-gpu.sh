#!/bin/sh
# The GPU suite: the CUDA backend's kernels against scalar references, every
# golden in every mode on the GPU (reference precision, the CPU's bound),
# the production path's KL tier, batch invariance and ids out (the device's
# greedy tokens) with and without CUDA graphs, and the end-to-end server suite, on this machine's NVIDIA GPU.
# Without a GPU it says so and exits 0 (scripts/test.sh is the CPU suite).
#   scripts/test-gpu.sh                builds build/ (scripts/setup.sh) and runs it
#   OSP_BIN=DIR scripts/test-gpu.sh    runs prebuilt binaries from DIR (osprey,
#                                      golden_compare, test_*; also DIR/tests/)
#   OSP_GPU_PARTS="core fuse e2e"      the parts to run (the default: all; see want below)
#   OSP_CUEMU=1 OSP_BIN=build-cuemu    runs them on the CUDA emulator's build (scripts/test-cuemu.sh)
set -u
cd "$(dirname "$0")/.."
root=$(pwd)
# OSP_CUEMU=1: the binaries in OSP_BIN are a build on the CUDA emulator (-DOSP_CUDA_EMU=ON, tests/cuemu): no GPU needed
if [ -z "${OSP_CUEMU:-}" ] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; }; then
    echo "test-gpu: no NVIDIA GPU on this machine: skipped"
    exit 0
fi
if [ -z "${OSP_BIN:-}" ]; then
    sh scripts/setup.sh || exit 1
    OSP_BIN=build
fi
case "$OSP_BIN" in /*) ;; *) OSP_BIN="$root/$OSP_BIN" ;; esac
bin() { if [ -x "$OSP_BIN/$1" ]; then echo "$OSP_BIN/$1"; else echo "$OSP_BIN/tests/$1"; fi; }
export OSP_DEVICE=cuda
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
run() {
    name=$1
    shift
    t0=$(date +%s)
    if "$@" >"$tmp/log" 2>&1; then
        echo "ok    $name ($(($(date +%s) - t0)) s)"
    else
        echo "FAIL  $name"
        # a TAP log (the e2e suites): the failing tests' blocks, else the log's end
        if grep -q "^not ok" "$tmp/log"; then grep -A40 "^not ok" "$tmp/log" | head -120; else tail -40 "$tmp/log"; fi
        fails=$((fails + 1))
    fi
}
# OSP_GPU_PARTS: the parts to run (default all): core (kernels, suites, goldens, Whisper), fuse (the fused
# launches against OSP_CUDA_FUSE=0), e2e (the server with the openai client)
want() { case " ${OSP_GPU_PARTS:-core fuse e2e} " in *" $1 "*) return 0 ;; esac; return 1; }
cd tests
if want core; then
run test_cuda "$(bin test_cuda)"
for t in test_parity test_shapes test_batch test_ids_out test_fast_path test_kv_quant test_generate test_fortune \
    test_mixed_quant test_gemma4_layouts test_prefix_cache test_spec; do
    run "$t" "$(bin "$t")"
done
# the embedders and rerankers (BERT and XLM-R encoders, EmbeddingGemma's bidirectional attention, the rerankers,
# Qwen3-Embedding): their goldens at the CPU's bound, in reference precision, batched and alone
for t in test_bert test_embeddinggemma test_rerank test_embed; do
    run "$t" "$(bin "$t")"
done
# eager steps only (no CUDA graphs): the same numbers
OSP_CUDA_GRAPHS=0 run "test_batch (no graphs)" "$(bin test_batch)"
OSP_CUDA_GRAPHS=0 run "test_ids_out (no graphs)" "$(bin test_ids_out)"
# the command line, every golden in every mode
for g in data/goldens/*/; do
    g=${g%/}
    [ -f "$g/golden.safetensors" ] || continue
    case $g in *whisper*) continue ;; esac # an audio model: its own check
    for mode in prefill decode chunk:5; do
        run "logits $(basename "$g") $mode" sh -c "'$(bin osprey)' logits --device cuda --model $g \
            --input $g/golden.safetensors --output '$tmp/out.safetensors' --mode $mode && \
            '$(bin golden_compare)' $g '$tmp/out.safetensors'"
    done
done
fi
if want fuse; then
# The fused launches (the default: head norms into the RoPE, and in steps of up to 8 tokens the KV store into the RoPE launch or RoPE and store into attention, gate and up with their activation)
# against every launch on its own (OSP_CUDA_FUSE=0): every golden's decode-mode logits bitwise the same, in both
# precisions
for g in data/goldens/*/; do
    g=${g%/}
    [ -f "$g/golden.safetensors" ] || continue
    case $g in *whisper*) continue ;; esac
    for prec in "" "--fast"; do
        run "fuse=0 $(basename "$g") decode ${prec:-reference}" sh -c "for f in 0 1; do \
            env OSP_CUDA_FUSE=\$f \
            '$(bin osprey)' logits --device cuda $prec --model $g --input $g/golden.safetensors \
            --output '$tmp/fuse'\$f.safetensors --mode decode || exit 1; done; \
            cmp '$tmp/fuse0.safetensors' '$tmp/fuse1.safetensors'"
    done
done
fi
if want core; then
# Whisper on the GPU: its operations against double references, the goldens (reference precision, the
# CPU's bound) in every mode, the production path (bf16 GEMMs) within the KL tier, the speech suites
run test_encdec "$(bin test_encdec)"
run test_whisper "$(bin test_whisper)"
# (on the emulator, transcribing real speech takes a quarter of an hour: its GPU path is test_whisper's and the
# goldens' below)
[ -n "${OSP_CUEMU:-}" ] || run test_transcribe "$(bin test_transcribe)"
wg=data/goldens/whisper
for mode in prefill decode chunk:7; do
    run "logits whisper $mode" sh -c "'$(bin osprey)' logits --device cuda --model $wg --audio $wg/audio.wav \
        --input $wg/golden.safetensors --output '$tmp/w.safetensors' --mode $mode && \
        '$(bin tensor_compare)' $wg/golden.safetensors encoder_out '$tmp/w.safetensors' encoder_out && \
        '$(bin tensor_compare)' $wg/golden.safetensors logits '$tmp/w.safetensors' logits"
done
run "logits whisper fast (KL tier)" sh -c "'$(bin osprey)' logits --device cuda --fast --model $wg \
    --audio $wg/audio.wav --input $wg/golden.safetensors --output '$tmp/wf.safetensors' && \
    '$(bin tensor_compare)' $wg/golden.safetensors logits '$tmp/wf.safetensors' logits --kl"
fi
if want e2e; then
# the server end to end with the real openai client, where node and the client are here
if command -v node >/dev/null 2>&1 && [ -d e2e/node_modules/openai ]; then
    # OSPREY_EXPECT_DEVICE: every server the suites start must have loaded its model on the GPU
    for s in serve serve_config serve_badinput serve_tools serve_batch serve_edges serve_cache serve_spec serve_audio; do
        run "e2e $s" sh -c "cd e2e && OSPREY_BIN='$(bin osprey)' OSPREY_EXPECT_DEVICE=cuda node --test $s.test.mjs"
    done
else
    echo "skip  e2e (no node or no tests/e2e/node_modules: npm ci there)"
fi
fi
echo "test-gpu: $fails failed"
[ "$fails" -eq 0 ]
