#!/bin/sh
# The GPU suite on the CUDA emulator (tests/cuemu): the CUDA backend's own code, its kernels compiled as C++, run on
# the CPU as the cuda device. No GPU and no CUDA toolkit needed; slow (minutes), and no figure it gives means
# anything about speed. scripts/test.sh runs it. What it runs (the emulator runs one kernel at a time, so a process
# uses one core; the jobs below go to $OSP_CUEMU_JOBS workers, default nproc, longest first):
#   - scripts/test-gpu.sh's core part, job by job (the list below follows it): test_cuda, the suites (the long
#     ones on fewer cases when built on the emulator: each test says how), the embedders and rerankers, test_batch
#     and test_ids_out again without CUDA graphs, every golden in every mode, Whisper;
#   - its fuse part (scripts/test-gpu.sh with OSP_GPU_PARTS=fuse), as one job;
#   - every golden in every mode and both precisions on an emulator build with ASan + UBSan (build-cuemu-asan):
#     an out-of-bounds or misaligned access in a kernel or the backend is a failure.
# A real GPU runs the full suites: scripts/test-gpu.sh.
# OSP_CUEMU_NICE_WHILE=FILE: while FILE exists, the builds and each job start at nice 19 (scripts/test.sh: while its
# other parts run, this suite takes only the cores they leave idle)
set -eu
cd "$(dirname "$0")/.."
root=$(pwd)
workers=${OSP_CUEMU_JOBS:-$(nproc)}
lowly() { if [ -n "${OSP_CUEMU_NICE_WHILE:-}" ] && [ -e "$OSP_CUEMU_NICE_WHILE" ]; then nice -n 19 "$@"; else "$@"; fi; }
lowly cmake -S . -B build-cuemu -DOSP_CUDA_EMU=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
lowly cmake --build build-cuemu -j"$(nproc)" >/dev/null
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
b=$root/build-cuemu
a=$root/build-cuemu-asan
# the jobs, "name|command" a line, run in tests/ with OSP_DEVICE=cuda; longest first (CPU seconds on the emulator
# in brackets, measured on a 2-core machine)
{
    # the ASan build, on one core while the other starts the suites; its goldens wait for it (asan.built)
    echo "build-cuemu-asan|cmake -S .. -B '$a' -DOSP_CUDA_EMU=ON -DOSP_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null && cmake --build '$a' --target osprey golden_compare && touch '$logs/asan.built'"
    for t in test_kv_quant test_ids_out test_spec test_cuda test_parity test_prefix_cache test_batch test_shapes \
        test_fast_path test_whisper test_generate test_fortune test_mixed_quant test_gemma4_layouts test_rerank \
        test_embed test_embeddinggemma test_encdec test_bert; do
        echo "$t|'$b/tests/$t'"
        # eager steps only (no CUDA graphs): the same numbers
        case $t in test_ids_out | test_batch) echo "$t (no graphs)|OSP_CUDA_GRAPHS=0 '$b/tests/$t'" ;; esac
    done
    echo "fuse part|cd .. && OSP_CUEMU=1 OSP_BIN=build-cuemu OSP_GPU_PARTS=fuse sh scripts/test-gpu.sh"
    # the command line, every golden in every mode (the reference precision against the golden)
    for g in tests/data/goldens/*/; do
        g=${g%/}
        g=${g#tests/}
        [ -f "tests/$g/golden.safetensors" ] || continue
        case $g in *whisper*) continue ;; esac
        for mode in prefill decode chunk:5; do
            echo "logits $(basename "$g") $mode|'$b/osprey' logits --device cuda --model $g --input $g/golden.safetensors --output \"\$tmp/out.safetensors\" --mode $mode && '$b/tests/golden_compare' $g \"\$tmp/out.safetensors\""
        done
    done
    # Whisper: the goldens (reference precision, the CPU's bound) in every mode, the production path within the
    # KL tier (on the emulator, transcribing real speech takes a quarter of an hour: its GPU path is
    # test_whisper's and these)
    wg=data/goldens/whisper
    for mode in prefill decode chunk:7; do
        echo "logits whisper $mode|'$b/osprey' logits --device cuda --model $wg --audio $wg/audio.wav --input $wg/golden.safetensors --output \"\$tmp/w.safetensors\" --mode $mode && '$b/tests/tensor_compare' $wg/golden.safetensors encoder_out \"\$tmp/w.safetensors\" encoder_out && '$b/tests/tensor_compare' $wg/golden.safetensors logits \"\$tmp/w.safetensors\" logits"
    done
    echo "logits whisper fast (KL tier)|'$b/osprey' logits --device cuda --fast --model $wg --audio $wg/audio.wav --input $wg/golden.safetensors --output \"\$tmp/wf.safetensors\" && '$b/tests/tensor_compare' $wg/golden.safetensors logits \"\$tmp/wf.safetensors\" logits --kl"
    # the ASan build: every golden, every mode, both precisions
    for g in tests/data/goldens/*/; do
        g=${g%/}
        g=${g#tests/}
        [ -f "tests/$g/golden.safetensors" ] || continue
        case $g in *whisper*) continue ;; esac
        cmd="while [ ! -e '$logs/asan.built' ]; do [ -e '$logs/asan.failed' ] && exit 1; sleep 2; done"
        for mode in prefill decode chunk:5; do
            for prec in "" "--fast"; do
                cmd="$cmd && echo '$mode ${prec:-reference}' && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 '$a/osprey' logits --device cuda $prec --model $g --input $g/golden.safetensors --output \"\$tmp/asan.safetensors\" --mode $mode"
                [ -n "$prec" ] || cmd="$cmd && '$a/tests/golden_compare' $g \"\$tmp/asan.safetensors\""
            done
        done
        echo "asan $(basename "$g") (prefill, decode, chunk:5; reference, --fast)|$cmd"
    done
} >"$logs/all"
# OSP_CUEMU_ONLY: an extended regular expression: only the jobs whose names match it (and the ASan build for theirs)
if [ -n "${OSP_CUEMU_ONLY:-}" ]; then
    grep -E "^[^|]*(${OSP_CUEMU_ONLY})[^|]*\|" "$logs/all" | grep -v '^build-cuemu-asan|' >"$logs/some" || true
    { ! grep -q '^asan ' "$logs/some" || grep '^build-cuemu-asan|' "$logs/all"; cat "$logs/some"; } >"$logs/jobs"
else
    mv "$logs/all" "$logs/jobs"
fi

# A worker takes the jobs in order, each that no other worker has claimed (mkdir is atomic), and writes its result
# line (ok or FAIL, wall and CPU seconds) to result.N, its output to out.N.
# (times, in the worker's own shell: its children's user and system time so far)
cpu_now() { times >"$logs/times.$i" && awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$logs/times.$i"; }
worker() {
    i=0
    while IFS='|' read -r name cmd; do
        i=$((i + 1))
        mkdir "$logs/claim.$i" 2>/dev/null || continue
        cpu_now >"$logs/c0.$i"
        t0=$(date +%s)
        mkdir "$logs/tmp.$i"
        if (cd tests && export OSP_DEVICE=cuda tmp="$logs/tmp.$i" && lowly sh -c "$cmd") >"$logs/out.$i" 2>&1; then
            r=ok
        else
            r=FAIL
            [ "$name" = build-cuemu-asan ] && touch "$logs/asan.failed"
        fi
        rm -rf "$logs/tmp.$i"
        cpu_now >"$logs/c1.$i"
        printf '%-5s %s (%d s, %.0f s CPU)\n' "$r" "$name" $(($(date +%s) - t0)) \
            "$(cat "$logs/c1.$i" "$logs/c0.$i" | awk 'NR == 1 { a = $1 } NR == 2 { print a - $1 }')" >"$logs/result.$i"
    done <"$logs/jobs"
}
t0=$(date +%s)
w=0
while [ "$w" -lt "$workers" ]; do
    worker &
    w=$((w + 1))
done
wait
n=$(wc -l <"$logs/jobs")
fails=0
i=1
while [ "$i" -le "$n" ]; do
    if [ ! -f "$logs/result.$i" ]; then
        echo "FAIL  job $i: no result"
        fails=$((fails + 1))
    else
        cat "$logs/result.$i"
        case $(cat "$logs/result.$i") in *"fuse part"*) sed 's/^/      /' "$logs/out.$i" ;; esac
        if grep -q '^FAIL' "$logs/result.$i"; then
            fails=$((fails + 1))
            # a TAP or test-gpu.sh log: its failing blocks, else the log's end
            if grep -q "^not ok\|^FAIL" "$logs/out.$i"; then grep -A40 "^not ok\|^FAIL" "$logs/out.$i" | head -120; else tail -40 "$logs/out.$i"; fi
        fi
    fi
    i=$((i + 1))
done
echo "test-cuemu: $n jobs on $workers workers in $(($(date +%s) - t0)) s, $fails failed"
[ "$fails" -eq 0 ]
