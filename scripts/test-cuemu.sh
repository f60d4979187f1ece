#!/bin/sh
# The GPU suite (scripts/test-gpu.sh: its core and fuse parts) on the CUDA emulator (tests/cuemu): the CUDA
# backend's own code, its kernels compiled as C++, run on the CPU as the cuda device. No GPU and no CUDA toolkit
# needed; slow (minutes), and no figure it gives means anything about speed. scripts/test.sh runs it.
#   OSP_GPU_PARTS="core fuse"   the parts to run (test-gpu.sh's; e2e works too, slowly)
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build-cuemu -DOSP_CUDA_EMU=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-cuemu -j"$(nproc)" >/dev/null
OSP_CUEMU=1 OSP_BIN=build-cuemu OSP_GPU_PARTS="${OSP_GPU_PARTS:-core fuse}" sh scripts/test-gpu.sh
