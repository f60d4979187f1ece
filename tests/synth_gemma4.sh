#!/bin/sh
# osprey synth writes Gemma 4 checkpoints the engine loads and runs: tiny
# E-series (per-layer embeddings, KV sharing, double-wide sharer MLPs) and
# MoE (K = V full layers, experts) configs, in bf16 and quantized (q4 group
# 64, q8, and a config asking for group 32), through inspect, generate and
# logits. A quantized model must be mx.quantize of the bf16 one with the same
# seed, so its logits must stay close to the bf16 model's.
set -u
OSPREY=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0

fail() { echo "FAIL $*"; fails=$((fails + 1)); }

cat >"$T/e.json" <<'EOF'
{"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
 "vocab_size": 512, "vocab_size_per_layer_input": 512, "hidden_size": 64,
 "hidden_size_per_layer_input": 64, "intermediate_size": 128, "num_hidden_layers": 6,
 "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
 "per_layer_config": {"2": {"head_dim": 64}, "5": {"head_dim": 64}},
 "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                 "sliding_attention", "sliding_attention", "full_attention"],
 "sliding_window": 8, "num_kv_shared_layers": 2, "use_double_wide_mlp": true,
 "attention_k_eq_v": false, "enable_moe_block": false,
 "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                      "rope_theta": 1000000.0}},
 "final_logit_softcapping": 30.0, "tie_word_embeddings": true,
 "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "dtype": "bfloat16",
 "max_position_embeddings": 2048, "bos_token_id": 2, "eos_token_id": [1, 106]}
EOF
cat >"$T/moe.json" <<'EOF'
{"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
 "vocab_size": 512, "hidden_size": 64, "hidden_size_per_layer_input": 0,
 "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4,
 "num_key_value_heads": 2, "head_dim": 32,
 "per_layer_config": {"5": {"head_dim": 64, "num_key_value_heads": 1}},
 "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
                 "sliding_attention", "sliding_attention", "full_attention"],
 "sliding_window": 8, "num_kv_shared_layers": 0, "attention_k_eq_v": true,
 "enable_moe_block": true, "num_experts": 16, "top_k_experts": 4,
 "moe_intermediate_size": 64,
 "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                      "rope_theta": 1000000.0}},
 "final_logit_softcapping": 30.0, "tie_word_embeddings": true,
 "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "dtype": "bfloat16",
 "max_position_embeddings": 2048, "bos_token_id": 2, "eos_token_id": [1, 106]}
EOF
# the E config asking for 4-bit, group 32
sed 's/"dtype": "bfloat16",/"dtype": "bfloat16", "quantization": {"group_size": 32, "bits": 4},/' \
    "$T/e.json" >"$T/e-g32.json"

# input ids < 512 for logits: the gemma4-e golden's input
IN=data/goldens/gemma4-e/golden.safetensors

# has DIR NAME: the safetensors header names tensor NAME
has() { grep -a -q "\"$2\"" "$1/model.safetensors"; }

run() { # run NAME CONFIG DTYPE-ARGS...
    name=$1 cfg=$2
    shift 2
    d=$T/$name
    if ! "$OSPREY" synth --config "$cfg" --out "$d" --seed 7 --threads 1 "$@" >"$T/log" 2>&1; then
        fail "$name synth"; cat "$T/log"; return
    fi
    if ! "$OSPREY" inspect "$d" >"$T/inspect" 2>&1; then fail "$name inspect"; cat "$T/inspect"; return; fi
    if ! "$OSPREY" generate --model "$d" --ids 1,2,3 -n 4 -t 1 >"$T/gen" 2>"$T/generr"; then
        fail "$name generate"; cat "$T/gen" "$T/generr"; return
    fi
    # 1 to 4 ids (an end-of-sequence id may stop it early)
    if ! grep -E -q '^[0-9]+(,[0-9]+){0,3}$' "$T/gen"; then
        fail "$name generate printed: $(cat "$T/gen")"; return
    fi
    if ! "$OSPREY" logits --model "$d" -t 1 --input $IN --output "$d.logits.safetensors" >"$T/lg" 2>&1; then
        fail "$name logits"; cat "$T/lg"; return
    fi
    echo "ok   $name: $(head -n 1 "$T/log"); generate: $(tr '\n' ' ' <"$T/gen")"
}

run e-bf16 "$T/e.json"
run e-q4 "$T/e.json" --dtype q4
run e-q8 "$T/e.json" --dtype q8
run e-g32 "$T/e-g32.json"
run moe-bf16 "$T/moe.json"
run moe-q4 "$T/moe.json" --dtype q4

# layout checks
E=$T/e-bf16 M=$T/moe-bf16 MQ=$T/moe-q4 EQ=$T/e-q4
has $E model.embed_tokens_per_layer.weight || fail "e: no embed_tokens_per_layer"
has $E model.layers.4.self_attn.k_proj.weight && fail "e: KV-shared layer 4 has k_proj"
has $E model.layers.3.self_attn.v_proj.weight || fail "e: layer 3 has no v_proj"
has $E model.layers.5.layer_scalar || fail "e: no layer_scalar"
has $EQ model.embed_tokens_per_layer.scales || fail "e-q4: embed_tokens_per_layer not quantized"
has $EQ model.layers.0.per_layer_projection.scales || fail "e-q4: per_layer_projection not quantized"
has $M model.layers.5.self_attn.v_proj.weight && fail "moe: K=V full layer 5 has v_proj"
has $M model.layers.4.self_attn.v_proj.weight || fail "moe: sliding layer 4 has no v_proj"
has $M model.layers.0.experts.gate_up_proj || fail "moe: no fused experts"
has $MQ model.layers.0.experts.switch_glu.down_proj.scales || fail "moe-q4: no switch_glu experts"
grep -q '"model.layers.0.router.proj"' $MQ/config.json || fail "moe-q4: no router override"
"$OSPREY" inspect $E | grep -q -i "gemma4" || fail "e: inspect does not say gemma4"

# the quantized MoE tracks the bf16 one (same seed; q8 would be closer)
if [ -f "$M.logits.safetensors" ] && [ -f "$MQ.logits.safetensors" ] && command -v cmp >/dev/null; then
    cmp -s "$M.logits.safetensors" "$MQ.logits.safetensors" && fail "moe: q4 logits identical to bf16"
fi

# the multimodal wrapper's name: the text model under model.language_model., and it loads
sed 's/Gemma4ForCausalLM/Gemma4ForConditionalGeneration/' "$T/moe.json" >"$T/cg.json"
if "$OSPREY" synth --config "$T/cg.json" --out "$T/cg" --threads 1 >/dev/null 2>&1; then
    has "$T/cg" model.language_model.layers.0.router.proj.weight || fail "wrapped: not under model.language_model."
    "$OSPREY" generate --model "$T/cg" --ids 1,2,3 -n 2 -t 1 >/dev/null 2>&1 || fail "wrapped: does not load and run"
else
    fail "Gemma4ForConditionalGeneration refused"
fi
# an unsupported architecture name is refused
sed 's/Gemma4ForCausalLM/FooForCausalLM/' "$T/moe.json" >"$T/bad.json"
"$OSPREY" synth --config "$T/bad.json" --out "$T/bad" >/dev/null 2>&1 && fail "bad architecture accepted"

if [ $fails -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all ok"
