#!/bin/sh
# fuzz/run.sh NAME SECONDS [BINARY]: run one libFuzzer harness from the
# repository root for SECONDS, starting from its seed corpus (fuzz/seeds/NAME
# plus inputs taken from the test data). Set FUZZ_CORPUS=DIR to keep the
# corpus it grows (long runs), FUZZ_RUNS=N to stop after N executions
# instead (SECONDS stays the cap), FUZZ_JOBS=N to run N processes. A crash or
# sanitizer report fails the run; the input is printed (base64) and kept in
# FUZZ_ARTIFACTS (default: build-fuzz/artifacts).
set -eu
name=$1
secs=$2
bin=${3:-build-fuzz/fuzz/fuzz_$name}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=${FUZZ_CORPUS:-$work/corpus}
art=${FUZZ_ARTIFACTS:-build-fuzz/artifacts}
mkdir -p "$corpus" "$work/seeds" "$art"
cp fuzz/seeds/"$name"/* "$work/seeds/" 2>/dev/null || true
case $name in
config)
    for f in tests/data/goldens/*/config.json tests/data/bert/*/config.json models/fortune/config.json; do
        cp "$f" "$work/seeds/$(echo "$f" | tr / _)"
    done ;;
safetensors)
    cp tests/data/goldens/llama3-q4/model.safetensors "$work/seeds/llama3-q4" ;;
tokenizer) # job 0 (a tokenizer.json): the WordPiece and Unigram ones
    for f in tests/data/bert/bert-tiny/tokenizer.json tests/data/bert/xlmr-tiny/tokenizer.json; do
        { printf '\000'; cat "$f"; } > "$work/seeds/$(echo "$f" | tr / _)"
    done ;;
jinja)
    for f in models/fortune/chat_template.jinja tests/data/templates/gemma4/chat_template.jinja \
        tests/e2e/tools_template.jinja; do
        cp "$f" "$work/seeds/$(echo "$f" | tr / _)"
    done ;;
esac
status=0
jobs=""
# -jobs forks workers that log to fuzz-N.log in the current folder: only when asked for
[ "${FUZZ_JOBS:-1}" -gt 1 ] && jobs="-jobs=$FUZZ_JOBS -workers=$FUZZ_JOBS"
# shellcheck disable=SC2086
"$bin" -max_total_time="$secs" -runs="${FUZZ_RUNS:--1}" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 $jobs \
    -artifact_prefix="$art/$name-" "$corpus" "$work/seeds" >"$work/log" 2>&1 || status=$?
grep -E "^(stat::|Done|INFO: Running|#[0-9]+[[:space:]]+(DONE|INITED))" "$work/log" | tail -n 12 || true
if [ $status -ne 0 ]; then
    tail -n 60 "$work/log"
    for a in "$art/$name"-*; do
        [ -f "$a" ] && { echo "input $a (base64):"; base64 "$a" | head -c 4000; echo; }
    done
    exit $status
fi
