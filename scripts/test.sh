#!/bin/sh
# The test command: dependencies, a Release build and its CTest suite (and its library tests again on the AVX2
# tier), the whole suite once more under AddressSanitizer + UBSan, a short run of each libFuzzer harness (fuzz/),
# and beside them all the GPU suite on the CUDA emulator (scripts/test-cuemu.sh). Each part's wall and CPU seconds
# are printed as it ends, and a summary at the end.
#
# The emulator's suite is CPU-bound (one core a job, scripts/test-cuemu.sh runs nproc of them) and independent of
# the rest, so it starts once the Release build is done and runs beside the other parts, its builds and jobs at the
# lowest priority (nice 19) while they run: it takes only the cores they leave idle (the end-to-end suites that run
# alone, link steps, waits), and every core once they are done (then its jobs start at the normal priority, and
# the running ones are set back to it where this user may). The parts keep their speed: a nice-19 process yields
# to them at once.
set -eu
cd "$(dirname "$0")/.."
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
t_start=$(date +%s)
summary=""
failed=""
# part NAME COMMAND...: runs it, prints and records its wall and CPU seconds (the CPU of this shell's children
# that have ended: the background emulator suite is not counted until it is waited for)
cpu_now() { times >"$logs/times" && awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$logs/times"; }
part() {
    name=$1
    shift
    t0=$(date +%s)
    cpu_now >"$logs/c0"
    if "$@"; then r=ok; else r=FAILED failed="$failed $name"; fi
    cpu_now >"$logs/c1"
    line=$(printf '%-7s %-28s %5d s wall %6.0f s CPU' "$r" "$name" $(($(date +%s) - t0)) \
        "$(cat "$logs/c1" "$logs/c0" | awk 'NR == 1 { a = $1 } NR == 2 { print a - $1 }')")
    echo "test.sh: $line"
    summary="$summary$line
"
}
must() { [ -z "$failed" ] || { echo "test.sh: failed:$failed"; exit 1; }; }

part setup env OSP_TEST_PKGS="clang libclang-rt-14-dev" sh scripts/setup.sh
must
npm_e2e() { (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error); }
# the npm `openai` client for the end-to-end server tests (tests/e2e)
part "npm ci (tests/e2e)" npm_e2e
# Claude Code and Codex for tests/e2e/agents.test.mjs, into ~/.cache/osprey-agents (downloaded once, then reused)
part "agents" sh scripts/install-agents.sh
must

# the CUDA backend on the CUDA emulator (tests/cuemu), in the background at the lowest priority: its kernels against
# references, the suites, every golden in every mode on the emulated GPU, the fused paths against the plain ones,
# and every golden again on an emulator build with ASan + UBSan
t_cuemu=$(date +%s)
touch "$logs/others-running"
# (a process group of its own where setsid is here: renice reaches the running jobs through it)
if command -v setsid >/dev/null 2>&1; then group="setsid -w"; else group=env; fi
OSP_CUEMU_NICE_WHILE="$logs/others-running" $group sh scripts/test-cuemu.sh >"$logs/cuemu" 2>&1 &
cuemu=$!

ctest_release() { (cd build && OSP_DEVICE=cpu ctest --output-on-failure -j"$(nproc)"); }
part "ctest (Release)" ctest_release
# the same library tests on the AVX2 tier (no AVX-512: the int8 path through vpmaddubsw): what a CPU without it runs
ctest_avx2() { (cd build && OSP_DEVICE=cpu OSP_ISA=avx2 ctest --output-on-failure -j"$(nproc)" -E e2e); }
part "ctest (AVX2 tier)" ctest_avx2
build_asan() {
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DOSP_SANITIZE=ON >/dev/null &&
        cmake --build build-asan -j"$(nproc)"
}
part "build (ASan + UBSan)" build_asan
ctest_asan() {
    (cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$(nproc)")
}
part "ctest (ASan + UBSan)" ctest_asan
# every parser's fuzzer, briefly (clang, ASan + UBSan + libFuzzer): fuzz/run.sh
build_fuzz() {
    CC=clang cmake -S . -B build-fuzz -DOSP_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
        cmake --build build-fuzz -j"$(nproc)"
}
part "build (fuzz)" build_fuzz
ctest_fuzz() { (cd build-fuzz && ctest --output-on-failure -j"$(nproc)"); }
part "fuzzers" ctest_fuzz

t_fg=$(date +%s)
rm -f "$logs/others-running"
pg=$(ps -o pgid= -p "$cuemu" 2>/dev/null | tr -d ' ') || true
[ -z "$pg" ] || [ "$pg" = "$(ps -o pgid= -p $$ | tr -d ' ')" ] || renice -n 0 -g "$pg" >/dev/null 2>&1 || true
cpu_now >"$logs/c0"
if wait "$cuemu"; then r=ok; else r=FAILED failed="$failed cuemu"; fi
cpu_now >"$logs/c1"
echo "== scripts/test-cuemu.sh (started after setup, beside the other parts)"
cat "$logs/cuemu"
line=$(printf '%-7s %-28s %5d s wall %6.0f s CPU (%d s after the other parts)' "$r" "test-cuemu (background)" \
    $(($(date +%s) - t_cuemu)) "$(cat "$logs/c1" "$logs/c0" | awk 'NR == 1 { a = $1 } NR == 2 { print a - $1 }')" \
    $(($(date +%s) - t_fg)))
summary="$summary$line
"
echo "== test.sh: $(($(date +%s) - t_start)) s in all"
printf '%s' "$summary"
[ -z "$failed" ] || { echo "test.sh: failed:$failed"; exit 1; }
echo "test.sh: all passed"
