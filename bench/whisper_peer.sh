#!/usr/bin/env bash
# osprey's Whisper beside whisper.cpp on this CPU, interleaved, with the same weights.
#
# usage: bench/whisper_peer.sh [SIZE...]        (SIZE: tiny base small medium large-v3; default tiny base)
# env:   OSPREY (build/osprey), THREADS (2), ROUNDS (5), ROUNDS_LARGE (2: rounds for large-v3),
#        W300_LARGE (1: rounds of large-v3 that also time the 5 minutes), PYTHON (a python3 with numpy),
#        QUIET_WAIT (60: before each run, wait up to this many seconds for the CPU to be near idle, as other
#        jobs share it; 0: do not wait), KINDS (e.g. "w300": only these figures, in rounds added after those
#        already in WORK/raw, which are kept),
#        WORK (/tmp/whisper-peer: models, audio, raw logs), PEER_TAR (../shared/peers/whisper.cpp-233fe1f.tar.xz),
#        PEER_CACHE ($HOME/.cache/osprey-peers/whisper.cpp-233fe1f: the peer's build, reused), STAGES (all)
#
# 1. builds whisper.cpp 233fe1f (CMake Release, GGML_NATIVE, shared lib) and bench/whisper_peer_harness.c
#    against its libwhisper.so, once, in PEER_CACHE;
# 2. per size: bench/whisper_peer_writer.py writes whisper.cpp's ggml f16 file (random weights, decoder scripted
#    to emit the JFK sentence: 25 text tokens per window), then `bench/whisper_peer.py convert` rounds its f16
#    matrices to values that f16 and bf16 both hold exactly, rewrites them in place and writes osprey's
#    Hugging Face folder (bf16 matrices, f32 vectors, multilingual.tiktoken): the same numbers in both files.
#    The 11 s sample is tests/data/goldens/whisper/audio.wav (jfk.wav); 5 minutes is it repeated (+ silence).
# 3. per size and round, in turn (osprey first in odd rounds, whisper.cpp first in even ones):
#    encoder s per 30 s window and decoder ms/token (osprey bench -n 128, "fast" = its production path;
#    whisper_harness bench --ntok 128 --fa 1), and the wall time of the 11 s sample and of 5 minutes of it
#    (osprey transcribe --fast --beam-size 1 --no-fallback --no-context --language en: its time less the file's
#    decoding; whisper_harness full --fa 1 --no-fallback: whisper_full's wall). The 11 s sample after a warm-up
#    in the same process (osprey: the file given twice; whisper.cpp: its warm-up run), 5 minutes without one;
# 4. `bench/whisper_peer.py table` prints medians (and the best run) and osprey/whisper.cpp ratios (> 1: osprey faster).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OSPREY=${OSPREY:-$ROOT/build/osprey}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-5}
ROUNDS_LARGE=${ROUNDS_LARGE:-2}
W300_LARGE=${W300_LARGE:-1}
if [ -z "${PYTHON:-}" ]; then
    for PYTHON in python3 /usr/bin/python3 ""; do "$PYTHON" -c 'import numpy' 2>/dev/null && break; done
    [ -n "$PYTHON" ] || { echo "need a python3 with numpy (apt-get install -y python3-numpy)" >&2; exit 1; }
fi
WORK=${WORK:-/tmp/whisper-peer}
PEER_TAR=${PEER_TAR:-$ROOT/../shared/peers/whisper.cpp-233fe1f.tar.xz}
PEER_CACHE=${PEER_CACHE:-$HOME/.cache/osprey-peers/whisper.cpp-233fe1f}
STAGES=${STAGES:-build,models,time,table}
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(tiny base)
HARNESS=$PEER_CACHE/whisper_harness
mkdir -p "$WORK"
has() { [[ ",$STAGES," == *",$1,"* ]]; }

build_peer() {
    local lib=$PEER_CACHE/build/bin/libwhisper.so
    if [ ! -f "$lib" ]; then
        mkdir -p "$PEER_CACHE"
        [ -d "$PEER_CACHE/whisper.cpp" ] || tar -xJf "$PEER_TAR" -C "$PEER_CACHE"
        # the tarball leaves the bindings out, but its CMakeLists configures the JS package's template
        mkdir -p "$PEER_CACHE/whisper.cpp/bindings/javascript"
        touch "$PEER_CACHE/whisper.cpp/bindings/javascript/package-tmpl.json"
        cmake -S "$PEER_CACHE/whisper.cpp" -B "$PEER_CACHE/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DBUILD_SHARED_LIBS=ON -DWHISPER_BUILD_TESTS=OFF -DWHISPER_BUILD_EXAMPLES=OFF -DWHISPER_SDL2=OFF >/dev/null
        cmake --build "$PEER_CACHE/build" -j2 --target whisper
    fi
    if [ ! -x "$HARNESS" ] || [ "$ROOT/bench/whisper_peer_harness.c" -nt "$HARNESS" ]; then
        local src=$PEER_CACHE/whisper.cpp
        gcc -O2 -o "$HARNESS" "$ROOT/bench/whisper_peer_harness.c" -I"$src/include" -I"$src/ggml/include" \
            -L"$(dirname "$lib")" -lwhisper -Wl,-rpath,"$(dirname "$lib")" -lpthread
    fi
    echo "whisper.cpp: $HARNESS -> $(ldd "$HARNESS" | grep -o 'libwhisper[^ ]* => [^ ]*')"
}

has build && build_peer

make_models() {
    local size=$1 d=$WORK/$1
    mkdir -p "$d"
    if [ ! -f "$d/hf/model.safetensors" ] || [ ! -f "$d/ggml-f16.bin" ]; then
        "$PYTHON" "$ROOT/bench/whisper_peer_writer.py" --preset "$size" --out "$d/ggml-f16.bin"
        "$PYTHON" "$ROOT/bench/whisper_peer.py" convert "$d/ggml-f16.bin" "$d/hf" \
            "$ROOT/tests/data/tokenizers/whisper/multilingual.tiktoken.gz"
    fi
}

if has models; then
    cp "$ROOT/tests/data/goldens/whisper/audio.wav" "$WORK/a11.wav"
    [ -f "$WORK/a300.wav" ] || "$PYTHON" "$ROOT/bench/whisper_peer.py" audio "$WORK/a11.wav" "$WORK/a300.wav" 300
    for size in "${SIZES[@]}"; do make_models "$size"; done
fi

QUIET_WAIT=${QUIET_WAIT:-60}
# Busy share of all cores (%) over 0.5 s, from /proc/stat; niced jobs (other sessions' builds run at nice 10)
# count as idle: they yield to ours.
busy() {
    local a b
    a=($(head -1 /proc/stat)); sleep 0.5; b=($(head -1 /proc/stat))
    local tot=0 idle=$(( (b[2] + b[4] + b[5]) - (a[2] + a[4] + a[5]) ))
    for i in 1 2 3 4 5 6 7 8; do tot=$((tot + b[i] - a[i])); done
    echo $(( tot > 0 ? 100 * (tot - idle) / tot : 0 ))
}
# Waits until the CPU is at most 15% busy (others' un-niced jobs), QUIET_WAIT s at most; prints the last reading.
quiet() {
    local t0=$SECONDS u
    u=$(busy)
    while [ "$u" -gt 15 ] && [ $((SECONDS - t0)) -lt "$QUIET_WAIT" ]; do sleep 1.5; u=$(busy); done
    echo "$u"
}

OFLAGS=(--fast --beam-size 1 --no-fallback --no-context --language en -t "$THREADS" -f txt)
WFLAGS=(--threads "$THREADS" --fa 1 --no-fallback)
# one measurement: run KIND (bench | w11 | w300) of PROG for SIZE in round R into raw/SIZE.PROG.KIND.rR.txt
one() {
    local size=$1 prog=$2 kind=$3 r=$4 d=$WORK/$1 hruns=3
    local out=$WORK/raw/$size.$prog.$kind.r$r.txt
    [ "$size" = large-v3 ] && hruns=1
    local u s0 s1 c0 c1 w0
    u=$(quiet)
    # `times` in this shell (not in a $(...) subshell, whose own counts start at zero)
    times > "$out.t0"; s0=$(head -1 /proc/stat); w0=$EPOCHREALTIME
    case $prog.$kind in
        osprey.bench) "$OSPREY" bench --model "$d/hf" -t "$THREADS" -n 128 --json ;;
        whispercpp.bench) "$HARNESS" bench "$d/ggml-f16.bin" --runs $hruns --threads "$THREADS" --fa 1 --ntok 128 ;;
        osprey.w11) "$OSPREY" transcribe "$WORK/a11.wav" "$WORK/a11.wav" --model "$d/hf" "${OFLAGS[@]}" ;;
        whispercpp.w11) "$HARNESS" full "$d/ggml-f16.bin" "$WORK/a11.wav" --runs 1 "${WFLAGS[@]}" ;;
        osprey.w300) "$OSPREY" transcribe "$WORK/a300.wav" --model "$d/hf" "${OFLAGS[@]}" ;;
        whispercpp.w300) "$HARNESS" full "$d/ggml-f16.bin" "$WORK/a300.wav" --runs 1 --warmup 0 "${WFLAGS[@]}" ;;
    esac > "$out" 2> "$out.err" || { echo "FAILED: $prog $kind $size round $r (see $out.err)" >&2; return 0; }
    # osprey prints its per-file line on stderr; the table reads one file
    [ "$prog" = osprey ] && [ "$kind" != bench ] && cat "$out.err" >> "$out"
    s1=$(head -1 /proc/stat); times > "$out.t1"
    c0=$(tail -1 "$out.t0"); c1=$(tail -1 "$out.t1"); rm -f "$out.t0" "$out.t1"
    # others' share of the cores during the run: all busy (un-niced) time less this run's own CPU time
    echo "#busy_before $u" >> "$out"
    echo "$s0|$s1|$c0|$c1|$w0|$EPOCHREALTIME|$(nproc)" | awk -F'|' '
        function sec(t) { split(t, p, "m"); return p[1] * 60 + p[2] + 0 }
        { split($1, a, " "); split($2, b, " "); split($3, x, " "); split($4, y, " ")
          busy = (b[2] - a[2] + b[4] - a[4] + b[7] - a[7] + b[8] - a[8] + b[9] - a[9]) / 100
          own = sec(y[1]) + sec(y[2]) - sec(x[1]) - sec(x[2]); wall = $6 - $5
          o = wall > 0 ? 100 * (busy - own) / (wall * $7) : 0; if (o < 0) o = 0
          printf "#busy_during %d\n", o }' >> "$out"
    return 0
}

if has time; then
    mkdir -p "$WORK/raw"
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, threads $THREADS; load $(cut -d' ' -f1-3 /proc/loadavg)"
    for size in "${SIZES[@]}"; do
        rounds=$ROUNDS
        [ "$size" = large-v3 ] && rounds=$ROUNDS_LARGE
        r0=0
        if [ -n "${KINDS:-}" ]; then  # more rounds of some figures, after those already there
            r0=$(ls "$WORK"/raw/ | sed -n "s/^$size\..*\.r\([0-9]*\)\.txt\$/\1/p" | sort -n | tail -1)
            r0=${r0:-0}
        else
            rm -f "$WORK"/raw/"$size".*
        fi
        for r in $(seq $((r0 + 1)) $((r0 + rounds))); do
            order=(osprey whispercpp)
            [ $((r % 2)) = 0 ] && order=(whispercpp osprey)
            kinds=(bench w11 w300)
            [ "$size" = large-v3 ] && [ "$r" -gt "$W300_LARGE" ] && kinds=(bench w11)
            [ -n "${KINDS:-}" ] && read -r -a kinds <<< "$KINDS"
            for kind in "${kinds[@]}"; do
                for prog in "${order[@]}"; do one "$size" "$prog" "$kind" "$r"; done
            done
            echo "  $size round $r done ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
        done
    done
fi

if has table; then "$PYTHON" "$ROOT/bench/whisper_peer.py" table "$WORK" "${SIZES[@]}"; fi
