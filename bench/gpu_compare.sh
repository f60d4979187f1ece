#!/bin/sh
# A change checked on a GPU against the binary before it: every golden with the new binary (reference
# precision, prefill / decode / chunk:5, golden_compare), decode logits old vs new byte for byte (both
# precisions), Whisper's goldens, then decode speed (Llama-3.2-1B shape) and Whisper large-v3 (encoder, decoder)
# old and new interleaved, twice. Run from the repository root:
#   bench/gpu_compare.sh OLD_DIR NEW_DIR
# OLD_DIR holds the old `osprey`; NEW_DIR the new `osprey`, `golden_compare` and `tensor_compare`.
set -u
old=$1 new=$2
O=$old/osprey N=$new/osprey GC=$new/golden_compare
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader
bad=0
for g in tests/data/goldens/*/; do
  g=${g%/}; n=$(basename $g)
  [ -f $g/golden.safetensors ] || continue
  case $n in whisper) continue;; esac
  for mode in prefill decode chunk:5; do
    if $N logits --device cuda --model $g --input $g/golden.safetensors --output $tmp/o.st --mode $mode >$tmp/l 2>&1 && $GC $g $tmp/o.st >>$tmp/l 2>&1; then :; else echo "FAIL golden $n $mode"; tail -3 $tmp/l; bad=$((bad+1)); fi
  done
  for prec in "" "--fast"; do
    rm -f $tmp/a.st $tmp/b.st
    $O logits --device cuda $prec --model $g --input $g/golden.safetensors --output $tmp/a.st --mode decode >/dev/null 2>&1
    $N logits --device cuda $prec --model $g --input $g/golden.safetensors --output $tmp/b.st --mode decode >/dev/null 2>&1
    [ -s $tmp/a.st ] && cmp -s $tmp/a.st $tmp/b.st || { echo "DIFF decode $n ${prec:-ref}"; bad=$((bad+1)); }
  done
done
echo "goldens and bitwise: $bad problems"
wg=tests/data/goldens/whisper
for mode in prefill decode chunk:7; do
  $N logits --device cuda --model $wg --audio $wg/audio.wav --input $wg/golden.safetensors --output $tmp/w.st --mode $mode >/dev/null 2>&1 && $new/tensor_compare $wg/golden.safetensors logits $tmp/w.st logits | tail -1
done
$N logits --device cuda --fast --model $wg --audio $wg/audio.wav --input $wg/golden.safetensors --output $tmp/w.st >/dev/null 2>&1 && $new/tensor_compare $wg/golden.safetensors logits $tmp/w.st logits --kl | tail -1
$N synth --preset llama-3.2-1b --out $tmp/l1 >/dev/null 2>&1 || echo "synth llama failed"
$N synth --preset whisper-large-v3 --out $tmp/wl >/dev/null 2>&1 || echo "synth whisper failed"
for r in 1 2; do for v in $old $new; do
  echo "$v: $($v/osprey bench --device cuda --model $tmp/l1 -p 16 -n 128 2>&1 | grep -i 'tok/s' | head -2 | tr '\n' ' ')"
done; done
for r in 1 2; do for v in $old $new; do
  echo "$v whisper: $($v/osprey bench --device cuda --model $tmp/wl -n 64 2>&1 | grep -iE 'encoder|decoder' | head -3 | tr '\n' ' ')"
done; done
