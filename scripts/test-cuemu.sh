#!/bin/sh
# The GPU suite on the CUDA emulator (tests/cuemu): the CUDA backend's own code, its kernels compiled as C++, run on
# the CPU as the cuda device. No GPU and no CUDA toolkit needed; slow (minutes), and no figure it gives means
# anything about speed. scripts/test.sh runs it. Two lines of work side by side (the emulator runs one kernel at a
# time):
#   - scripts/test-gpu.sh's core part (test_cuda, the suites, every golden in every mode, Whisper);
#   - its fuse part (OSP_CUDA_FUSE=2, OSP_CUDA_DQ2=0 and OSP_CUDA_ST=0 bitwise against the defaults), then every golden in every
#     mode and both precisions with OSP_CUDA_FUSE=2, on an emulator build with ASan + UBSan (build-cuemu-asan):
#     an out-of-bounds or misaligned access in a kernel or the backend is a failure.
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
cmake -S . -B build-cuemu -DOSP_CUDA_EMU=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cuemu -j"$(nproc)" >/dev/null
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
OSP_CUEMU=1 OSP_BIN=build-cuemu OSP_GPU_PARTS=core sh scripts/test-gpu.sh >"$logs/core" 2>&1 &
core=$!
sanitized() {
    cmake -S . -B build-cuemu-asan -DOSP_CUDA_EMU=ON -DOSP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
    cmake --build build-cuemu-asan --target osprey golden_compare >/dev/null
    bad=0
    cd tests
    for g in data/goldens/*/; do
        g=${g%/}
        [ -f "$g/golden.safetensors" ] || continue
        case $g in *whisper*) continue ;; esac
        for mode in prefill decode chunk:5; do
            for prec in "" "--fast"; do
                out="$logs/asan.safetensors"
                if OSP_DEVICE=cuda OSP_CUDA_FUSE=2 ASAN_OPTIONS=detect_leaks=1 \
                    UBSAN_OPTIONS=print_stacktrace=1 "$root/build-cuemu-asan/osprey" logits --device cuda $prec \
                    --model "$g" --input "$g/golden.safetensors" --output "$out" --mode $mode >"$logs/asan.log" 2>&1 &&
                    { [ -n "$prec" ] || "$root/build-cuemu-asan/tests/golden_compare" "$g" "$out" >>"$logs/asan.log" 2>&1; }; then
                    echo "ok    asan $(basename "$g") $mode ${prec:-reference}"
                else
                    echo "FAIL  asan $(basename "$g") $mode ${prec:-reference}"
                    tail -30 "$logs/asan.log"
                    bad=$((bad + 1))
                fi
            done
        done
    done
    [ "$bad" -eq 0 ]
}
fails=0
OSP_CUEMU=1 OSP_BIN=build-cuemu OSP_GPU_PARTS=fuse sh scripts/test-gpu.sh >"$logs/fuse" 2>&1 || fails=$((fails + 1))
(sanitized) >"$logs/asan" 2>&1 || fails=$((fails + 1))
wait "$core" || fails=$((fails + 1))
for p in core fuse asan; do
    echo "== test-cuemu: $p"
    cat "$logs/$p"
done
echo "test-cuemu: $fails part(s) failed"
[ "$fails" -eq 0 ]
