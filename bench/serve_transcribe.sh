#!/bin/sh
# The transcription batch (issue 36): the wall time of one transcription alone
# against N at once on a running `osprey serve --audio-model ...`, and that the
# N responses (verbose_json: segments, tokens, times) are the alone one, byte
# for byte; then, from /stats, how the N shared the batch's decoder steps.
#   bench/serve_transcribe.sh URL FILE N [FORM FIELD...]
#   bench/serve_transcribe.sh http://127.0.0.1:8080 tests/data/goldens/whisper/audio.wav 8 language=en
set -eu
base=$1 file=$2 n=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
form=""
for f in "$@"; do form="$form -F $f"; done
one() {
    # shellcheck disable=SC2086
    curl -sf -F "file=@$file" -F model=whisper-1 -F response_format=verbose_json $form -o "$1" \
        "$base/v1/audio/transcriptions"
}
now() { date +%s.%N; }
# the batch's counters (GET /stats "transcription"): steps, requests in them, compute and gather seconds
counters() {
    curl -sf "$base/stats" | python3 -c 'import json,sys; t=json.load(sys.stdin).get("transcription",{}); print(t.get("steps",0), t.get("step_requests",0), t.get("compute_s",0), t.get("gather_s",0))'
}
c0=$(counters)
t0=$(now)
one "$tmp/alone"
t1=$(now)
c1=$(counters)
i=0
while [ $i -lt "$n" ]; do
    one "$tmp/r$i" &
    i=$((i + 1))
done
wait
t2=$(now)
c2=$(counters)
same=1
i=0
while [ $i -lt "$n" ]; do
    cmp -s "$tmp/alone" "$tmp/r$i" || same=0
    i=$((i + 1))
done
awk -v a="$t0" -v b="$t1" -v c="$t2" -v n="$n" -v s="$same" -v bytes="$(wc -c <"$tmp/alone")" 'BEGIN {
    printf "alone %.2f s, %d at once %.2f s (%.2fx), identical %s, %d bytes\n", b - a, n, c - b, (c - b) / (b - a),
        s ? "yes" : "NO", bytes }'
echo "$c0 $c1 $c2" | awk '{
    printf "steps: alone %d (%.2f ms computing, %.2f ms gathering a step); at once %d, %.2f requests a step (%.2f ms computing, %.2f ms gathering)\n",
        $5 - $1, ($7 - $3) * 1e3 / ($5 - $1 > 0 ? $5 - $1 : 1), ($8 - $4) * 1e3 / ($5 - $1 > 0 ? $5 - $1 : 1),
        $9 - $5, ($10 - $6) / ($9 - $5 > 0 ? $9 - $5 : 1), ($11 - $7) * 1e3 / ($9 - $5 > 0 ? $9 - $5 : 1),
        ($12 - $8) * 1e3 / ($9 - $5 > 0 ? $9 - $5 : 1) }'
[ $same -eq 1 ]
