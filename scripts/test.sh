#!/bin/sh
# The test command: dependencies, a Release build and its CTest suite (and its
# library tests again on the AVX2 tier), the GPU suite on the CUDA emulator
# (scripts/test-cuemu.sh), then the whole suite once more under
# AddressSanitizer + UBSan, then a short run of each libFuzzer harness (fuzz/).
set -eu
cd "$(dirname "$0")/.."
OSP_TEST_PKGS="clang libclang-rt-14-dev" sh scripts/setup.sh
# the npm `openai` client for the end-to-end server tests (tests/e2e)
(cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
# Claude Code and Codex for tests/e2e/agents.test.mjs, into ~/.cache/osprey-agents (downloaded once, then reused)
sh scripts/install-agents.sh
(cd build && OSP_DEVICE=cpu ctest --output-on-failure -j"$(nproc)")
# the same library tests on the AVX2 tier (no AVX-512: the int8 path through vpmaddubsw): what a CPU without it runs
(cd build && OSP_DEVICE=cpu OSP_ISA=avx2 ctest --output-on-failure -j"$(nproc)" -E e2e)
# the CUDA backend on the CUDA emulator (tests/cuemu): its kernels against references, every golden in every mode on
# the emulated GPU, the fused paths (OSP_CUDA_FUSE=2), OSP_CUDA_DQ2=0 and OSP_CUDA_ST=0 bitwise against the defaults
sh scripts/test-cuemu.sh
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DOSP_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$(nproc)")
# every parser's fuzzer, briefly (clang, ASan + UBSan + libFuzzer): fuzz/run.sh
CC=clang cmake -S . -B build-fuzz -DOSP_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)"
(cd build-fuzz && ctest --output-on-failure -j"$(nproc)")
