#!/bin/sh
# The CUDA backend's figures in one run (the issue's list): batch-1 decode, prefill of 512 tokens and 64
# concurrent streams on the Llama-3.2-1B shape in bf16 and 4-bit, then the Gemma-4-E2B and 26B-A4B shapes
# in 4-bit, each with the device's read bandwidth measured in the same `osprey bench` run (bw_ratio).
# With a second binary, every measurement runs both, interleaved (A B, then B A on the next), so the
# machine's drift favours neither.
#
#   bench/gpu_figures.sh [OLD_OSPREY]
#   env: OSP_BIN (default build/osprey), MODELS (synth folder, default /tmp/osp-gpu-models),
#        SHAPES (default "l1-bf16 l1-q4 e2b-q4 a4b-q4"), ROUNDS (default 1),
#        DEVICE (default cuda; cpu runs the same list on the CPU, to try the script without a GPU),
#        QUICK=1 (decode 32 tokens, 16 streams: a short check of the script itself)
# Prints one line per measurement and a table; the raw JSON lines go to $MODELS/figures.jsonl.
set -u
cd "$(dirname "$0")/.."
NEW=${OSP_BIN:-build/osprey}
OLD=${1:-}
MODELS=${MODELS:-/tmp/osp-gpu-models}
SHAPES=${SHAPES:-l1-bf16 l1-q4 e2b-q4 a4b-q4}
ROUNDS=${ROUNDS:-1}
DEVICE=${DEVICE:-cuda}
if [ "$DEVICE" = cuda ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    echo "gpu_figures: no NVIDIA GPU on this machine (DEVICE=cpu runs the list on the CPU)"
    exit 0
fi
[ -x "$NEW" ] || { echo "gpu_figures: no binary at $NEW (build first, or set OSP_BIN)"; exit 1; }
[ -z "$OLD" ] || [ -x "$OLD" ] || { echo "gpu_figures: no binary at $OLD"; exit 1; }
N=128 C=64
[ "${QUICK:-0}" = 1 ] && N=32 C=16
mkdir -p "$MODELS" || exit 1
out="$MODELS/figures.jsonl"
: >"$out"

# shape name -> synth preset and dtype
preset() {
    case $1 in
    l1-*) echo llama-3.2-1b ;;
    e2b-*) echo gemma-4-e2b ;;
    a4b-*) echo gemma-4-26b-a4b ;;
    qwen-*) echo qwen3-0.6b ;;
    *) return 1 ;;
    esac
}
for s in $SHAPES; do
    p=$(preset "$s") || { echo "gpu_figures: unknown shape $s"; exit 1; }
    [ -f "$MODELS/$s/model.safetensors" ] && continue
    echo "synth $s ($p, ${s#*-})"
    "$NEW" synth --preset "$p" --dtype "${s#*-}" --out "$MODELS/$s" >/dev/null || { echo "gpu_figures: synth $s failed"; exit 1; }
done

# one measurement: label binary shape what -- bench args
one() {
    label=$1 bin=$2 shape=$3 what=$4
    shift 5
    json=$("$bin" bench --model "$MODELS/$shape" --device "$DEVICE" --json "$@" 2>/dev/null | tail -n 1)
    case $json in
    "{"*) ;;
    *) echo "  $label $shape $what: FAILED ($bin bench --model $MODELS/$shape --device $DEVICE $*)"; return ;;
    esac
    echo "{\"binary\":\"$label\",\"shape\":\"$shape\",\"what\":\"$what\",\"bench\":$json}" >>"$out"
    echo "  $label $shape $what: $(echo "$json" | python3 -c 'import json,sys
d=json.load(sys.stdin)
print("prefill %.0f tok/s, decode %.1f tok/s, %.1f GB/s of weights, %.2f of the read bandwidth (%.0f GB/s)" % (
    d["prefill_tok_s"], d["decode_tok_s"], d["decode_gbps"], d["bw_ratio"], d["mem_bw_gbps"]))')"
}
both() { # round shape what -- args
    r=$1 shape=$2 what=$3
    shift 4
    if [ -z "$OLD" ]; then one new "$NEW" "$shape" "$what" -- "$@"; return; fi
    if [ $((r % 2)) -eq 1 ]; then
        one new "$NEW" "$shape" "$what" -- "$@"
        one old "$OLD" "$shape" "$what" -- "$@"
    else
        one old "$OLD" "$shape" "$what" -- "$@"
        one new "$NEW" "$shape" "$what" -- "$@"
    fi
}
r=1
while [ $r -le "$ROUNDS" ]; do
    echo "round $r"
    for s in $SHAPES; do
        both $r "$s" decode -- -p 16 -n $N
        both $r "$s" prefill -- -p 512 -n 1
        both $r "$s" "streams$C" -- -p 16 -n $N --concurrency $C
    done
    r=$((r + 1))
done

# the table: medians over rounds
python3 - "$out" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    b = d["bench"]
    key = (d["shape"], d["what"], d["binary"])
    v = b["prefill_tok_s"] if d["what"] == "prefill" else b["decode_tok_s"]
    rows.setdefault(key, []).append((v, b["bw_ratio"]))
print("\n%-8s %-9s %-4s %12s %9s" % ("shape", "what", "bin", "tok/s", "bw_ratio"))
for (shape, what, binary), vals in sorted(rows.items()):
    tok = statistics.median(v for v, _ in vals)
    ratio = statistics.median(r for _, r in vals)
    print("%-8s %-9s %-4s %12.1f %9.3f" % (shape, what, binary, tok, ratio))
EOF
