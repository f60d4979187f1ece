#!/bin/sh
# The GPU suite (scripts/test-gpu.sh: its core and fuse parts) on the CUDA emulator (tests/cuemu): the CUDA
# backend's own code, its kernels compiled as C++, run on the CPU as the cuda device. No GPU and no CUDA toolkit
# needed; slow (minutes), and no figure it gives means anything about speed. scripts/test.sh runs it.
#   OSP_GPU_PARTS="core fuse"   the parts to run (test-gpu.sh's; e2e works too, slowly), side by side: each is
#                               one thread of work (the emulator runs one kernel at a time)
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build-cuemu -DOSP_CUDA_EMU=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cuemu -j"$(nproc)" >/dev/null
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=""
for p in ${OSP_GPU_PARTS:-core fuse}; do
    OSP_CUEMU=1 OSP_BIN=build-cuemu OSP_GPU_PARTS=$p sh scripts/test-gpu.sh >"$logs/$p" 2>&1 &
    pids="$pids $p:$!"
done
fails=0
for pp in $pids; do
    if ! wait "${pp#*:}"; then fails=$((fails + 1)); fi
    echo "== test-cuemu: part ${pp%%:*}"
    cat "$logs/${pp%%:*}"
done
[ "$fails" -eq 0 ]
