#!/usr/bin/env bash
# Embedding speed, osprey against its own prefill and against llama.cpp's embedding path (issue 40's speed bullets).
#
# On a random-weight Llama-3.2-1B-shaped model (`osprey synth --preset llama-3.2-1b --dtype D`) and a GGUF of the same
# shape and bytes per weight (../shared/peers/gguf_writer.py: q8 <-> Q8_0, q4 <-> Q4_0, bf16 <-> BF16), each round
# times, in an order that rotates every round so that drift favours none:
#   embed    osprey bench --embed --inputs N -p T  (N inputs of T tokens, last-token pooling, rows of one forward)
#            -> embed_tok_s, and its prefill_tok_s: the same model's hidden states of one input alone (median of 5)
#   prefill  osprey bench -p T -n 1                (the plain prefill of one T-token prompt, with its head)
#   llama    bench/embed_peer_llamacpp.mjs         (node-llama-cpp's createEmbeddingContext + getEmbeddingFor, one
#            input after another, N inputs of T tokens)
# Then prints min / median / max of each and the ratios of the medians: embed / prefill (issue 40: >= 0.95) and
# osprey embed / llama.cpp embed (>= 1.5).
#
# Usage: bench/embed_peer.sh [ROUNDS (default 3)]; on a shared machine raise its priority over the others' builds
#        (nice -n -10 bench/embed_peer.sh): every engine runs at that priority alike. llama.cpp at ~50-150 tok/s takes
#        30-90 minutes a round for N=1000.
# env: OSPREY (build-cpu/osprey), DTYPE (q8), N (1000 inputs, as the issue; fewer for a quick look), T (256),
#      THREADS (2), NLC_DIR (/tmp/nlc: node-llama-cpp 3.22.1, see ../shared/peers/README.md), WORK (/tmp/embed-peer:
#      the models, made once, and results-DTYPE.tsv), PEERS (../shared/peers)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROUNDS="${1:-3}"
OSPREY="${OSPREY:-build-cpu/osprey}" DTYPE="${DTYPE:-q8}" N="${N:-1000}" T="${T:-256}" THREADS="${THREADS:-2}"
export NLC_DIR="${NLC_DIR:-/tmp/nlc}"
WORK="${WORK:-/tmp/embed-peer}"
PEERS="${PEERS:-$HERE/../../shared/peers}"
declare -A GTYPE=([q8]=q8_0 [q4]=q4_0 [bf16]=bf16)
[ -n "${GTYPE[$DTYPE]:-}" ] || { echo "DTYPE is q8, q4 or bf16" >&2; exit 2; }
OSP="$WORK/llama1b-$DTYPE" GGUF="$WORK/llama1b-${GTYPE[$DTYPE]}.gguf"
mkdir -p "$WORK"
[ -f "$OSP/model.safetensors" ] || "$OSPREY" synth --preset llama-3.2-1b --dtype "$DTYPE" --out "$OSP" --threads "$THREADS" >&2
[ -f "$GGUF" ] || /usr/bin/python3 "$PEERS/gguf_writer.py" --type "${GTYPE[$DTYPE]}" --out "$GGUF" >&2

RES="$WORK/results-$DTYPE.tsv"
: > "$RES"
echo "# $(date -Is) $(nproc) cpus,$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $OSPREY; $DTYPE; N=$N T=$T" >&2
num() { grep -o "\"$1\": *[0-9.]*" | head -n 1 | sed 's/.*: *//'; }
embed() {
    local j; j=$("$OSPREY" bench --model "$OSP" --embed --inputs "$N" -p "$T" -t "$THREADS" --json | tail -n 1)
    printf '%s\tosprey_embed\t%s\n%s\tosprey_prefill1\t%s\n' "$1" "$(num embed_tok_s <<<"$j")" "$1" "$(num prefill_tok_s <<<"$j")" >>"$RES"
}
prefill() {
    local j; j=$("$OSPREY" bench --model "$OSP" -p "$T" -n 1 -t "$THREADS" --json | tail -n 1)
    printf '%s\tosprey_prefill\t%s\n' "$1" "$(num prefill_tok_s <<<"$j")" >>"$RES"
}
llama() {
    local j; j=$(/usr/bin/node "$HERE/embed_peer_llamacpp.mjs" --model "$GGUF" -n "$N" -p "$T" -t "$THREADS" | tail -n 1)
    printf '%s\tllama_embed\t%s\n' "$1" "$(num embed_tok_s <<<"$j")" >>"$RES"
}
order=(embed prefill llama)
for r in $(seq 1 "$ROUNDS"); do
    for k in 0 1 2; do
        f=${order[$(((k + r - 1) % 3))]}
        "$f" "$r"
        echo "round $r: $f: $(grep "^$r	" "$RES" | cut -f2,3 | tr '\n\t' ' =' | sed "s/ $//") (load $(cut -d' ' -f1 /proc/loadavg))" >&2
    done
done
/usr/bin/python3 - "$RES" <<'EOF'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    r, k, x = line.split("\t")
    v.setdefault(k, []).append(float(x))
med = {k: statistics.median(x) for k, x in v.items()}
names = {"osprey_embed": "osprey embed", "osprey_prefill": "osprey prefill (bench -p T -n 1)",
         "osprey_prefill1": "osprey prefill, in the embed run", "llama_embed": "llama.cpp embed"}
for k in names:
    print(f"{names[k]:34s} tok/s  median {med[k]:8.1f}  min {min(v[k]):8.1f}  max {max(v[k]):8.1f}  (n={len(v[k])})")
print(f"embed / prefill                   {med['osprey_embed'] / med['osprey_prefill']:.3f}  (>= 0.95)")
print(f"embed / prefill in the embed run  {med['osprey_embed'] / med['osprey_prefill1']:.3f}")
print(f"osprey embed / llama.cpp embed    {med['osprey_embed'] / med['llama_embed']:.2f}x (>= 1.5)")
EOF
