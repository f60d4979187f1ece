/* `osprey synth`: write a model folder with random weights.
 *
 * The output is what a real checkpoint looks like: an HF-style config.json
 * and one model.safetensors with HF tensor names, either all-BF16 or MLX
 * affine-quantized (every Linear, the embedding and an untied lm_head as
 * U32 codes + BF16 scales/biases; norms and additive biases stay BF16).
 * Values: Irwin-Hall(4) "normal-ish" noise, std 0.02 for matrices and
 * biases, 1 ± 0.02 for norms (0 ± 0.02 for Gemma 3, whose norms use 1 + w;
 * Gemma 4's norms, layer scalars and router scales are multipliers, 1 ± 0.02).
 * Gemma 4 (gemma4_text) follows the engine's reading of the config: per-layer
 * head sizes, no K/V on KV-shared layers, no v_proj on K = V full layers,
 * double-wide sharer MLPs, per-layer embeddings, MoE experts (HF fused
 * gate_up_proj in bf16, MLX switch_glu stacks when quantized); router.proj is
 * quantized 8-bit/group 64 with a config override, as mlx-lm does.
 *
 * Every row of every tensor has its own random stream, seeded from
 * (--seed, tensor name, row), so the output does not depend on the thread
 * count, and a quantized model is exactly mx.quantize of the bf16 model
 * written with the same seed. The safetensors file is streamed: two
 * 64 MiB chunks (one being filled, one being written) plus one tensor's
 * scales and biases are in memory at a time.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "cli.h"
#include "encoder_tools.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/st_write.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"

int osp_cmd_synth(int argc, char **argv);

#define SYNTH_NAME_MAX 200

typedef enum { SYN_MAT, SYN_VEC } synth_kind;

/* One logical weight: a matrix [rows, cols], a vector [rows], or a stack
 * of nexp matrices [nexp, rows, cols] (MoE experts). */
typedef struct synth_entry {
    char name[SYNTH_NAME_MAX]; /* dense tensor name, e.g. "...q_proj.weight" */
    synth_kind kind;
    float mean;                /* values are drawn around it: 1 for norms, 0 for the rest */
    int64_t nexp;              /* 0 = not stacked */
    int64_t rows, cols;        /* rows per stacked matrix; cols = 0 for vectors */
    int quant, bits, group;    /* quant: bits > 0 (MLX affine, this tensor's own bits/group) */
    /* Row streams: row r of matrix e is row e·split + r of stream `hash`,
     * or, for r >= split, row e·(rows - split) + r - split of stream
     * `hash2` (split = rows: one stream). A fused gate_up_proj thus holds
     * exactly the rows of the separate gate_proj and up_proj streams. */
    uint64_t hash, hash2;
    int64_t split;
    uint16_t *scales, *biases; /* [nexp·rows, cols/group], filled with the codes */
} synth_entry;

/* Writer tensor i is part `part` (0 weight, 1 scales, 2 biases) of entry. */
typedef struct synth_slot {
    int entry, part;
} synth_slot;

typedef struct synth_plan {
    synth_entry *e;
    int n_e, cap;
    synth_slot *slot;
    int n_slot;
    int bits, group; /* bits 0 = bf16 */
    uint64_t seed;
    json_t *qover;   /* per-module quantization overrides for config.json, or NULL */
} synth_plan;

/* ---------- random values ---------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* out[n] = bf16-representable mean + std·z, z ≈ N(0,1): the sum of four
 * 16-bit uniforms from one xorshift64* draw (Irwin-Hall, sd 37837.23). */
static void synth_gen(uint64_t seed, uint64_t hash, int64_t row, float mean, float std,
                      float *out, int64_t n) {
    uint64_t s = splitmix64(seed ^ splitmix64(hash ^ splitmix64((uint64_t)row))) | 1;
    const float k = std / 37837.23f;
    for (int64_t i = 0; i < n; i++) {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        uint64_t r = s * 0x2545f4914f6cdd1dull;
        int32_t sum = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) +
                      (int32_t)((r >> 32) & 0xffff) + (int32_t)(r >> 48);
        out[i] = osp_bf16_to_f32(osp_f32_to_bf16(mean + (float)(sum - 131070) * k));
    }
}

static osp_status synth_mkdir(const char *dir);

/* ---------- presets: data ---------- */

static const struct {
    const char *name, *json;
} PRESETS[] = {
    {"llama-3.2-1b",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\","
     " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
     " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
     " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, \"pretraining_tp\": 1,"
     " \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
     " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
     " \"rope_theta\": 500000.0, \"rope_parameters\": {\"factor\": 32.0, \"high_freq_factor\": 4.0,"
     " \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\","
     " \"rope_theta\": 500000.0}, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
     " \"use_cache\": true, \"vocab_size\": 128256}"},
    {"qwen3-0.6b",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
     " \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
     " \"max_position_embeddings\": 40960, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
     " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
     " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"rope_parameters\": {\"rope_type\": \"default\","
     " \"rope_theta\": 1000000.0}, \"sliding_window\": null, \"tie_word_embeddings\": true,"
     " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}"},
    {"gemma-3-1b",
     "{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"eos_token_id\": [1, 106],"
     " \"final_logit_softcapping\": null, \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
     " \"hidden_size\": 1152, \"initializer_range\": 0.02, \"intermediate_size\": 6912,"
     " \"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\", \"num_attention_heads\": 4,"
     " \"num_hidden_layers\": 26, \"num_key_value_heads\": 1, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 256,"
     " \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000.0, \"rope_scaling\": null,"
     " \"rope_theta\": 1000000.0, \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\","
     " \"rope_theta\": 10000.0}, \"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}},"
     " \"sliding_window\": 512, \"sliding_window_pattern\": 6, \"tie_word_embeddings\": true,"
     " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 262144}"},
    /* E2B-like: per-layer embeddings, KV sharing, double-wide sharer MLPs; every 5th layer full (head 512) */
    {"gemma-4-e2b",
     "{\"architectures\": [\"Gemma4ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"attention_k_eq_v\": false, \"bos_token_id\": 2, \"dtype\": \"bfloat16\", \"enable_moe_block\": false,"
     " \"eos_token_id\": [1, 106], \"final_logit_softcapping\": 30.0, \"global_head_dim\": 512, \"head_dim\": 256,"
     " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 1536, \"hidden_size_per_layer_input\": 256,"
     " \"initializer_range\": 0.02, \"intermediate_size\": 6144, \"max_position_embeddings\": 131072,"
     " \"model_type\": \"gemma4_text\", \"num_attention_heads\": 8, \"num_hidden_layers\": 35,"
     " \"num_key_value_heads\": 1, \"num_kv_shared_layers\": 20, \"pad_token_id\": 0, \"rms_norm_eps\": 1e-06,"
     " \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
     " \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25,"
     " \"rope_theta\": 1000000.0}}, \"sliding_window\": 512, \"sliding_window_pattern\": 5,"
     " \"tie_word_embeddings\": true, \"use_cache\": true, \"use_double_wide_mlp\": true,"
     " \"vocab_size\": 262144, \"vocab_size_per_layer_input\": 262144}"},
    /* 26B-A4B-like: mixture of experts, K = V on the full layers (head 512, 2 KV heads); every 6th layer full */
    {"gemma-4-26b-a4b",
     "{\"architectures\": [\"Gemma4ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"attention_k_eq_v\": true, \"bos_token_id\": 2, \"dtype\": \"bfloat16\", \"enable_moe_block\": true,"
     " \"eos_token_id\": [1, 106], \"final_logit_softcapping\": 30.0, \"global_head_dim\": 512, \"head_dim\": 256,"
     " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2816, \"hidden_size_per_layer_input\": 0,"
     " \"initializer_range\": 0.02, \"intermediate_size\": 2112, \"max_position_embeddings\": 262144,"
     " \"model_type\": \"gemma4_text\", \"moe_intermediate_size\": 704, \"num_attention_heads\": 16,"
     " \"num_experts\": 128, \"num_global_key_value_heads\": 2, \"num_hidden_layers\": 30,"
     " \"num_key_value_heads\": 8, \"num_kv_shared_layers\": 0, \"pad_token_id\": 0, \"rms_norm_eps\": 1e-06,"
     " \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
     " \"full_attention\": {\"rope_type\": \"proportional\", \"partial_rotary_factor\": 0.25,"
     " \"rope_theta\": 1000000.0}}, \"sliding_window\": 1024, \"sliding_window_pattern\": 6,"
     " \"tie_word_embeddings\": true, \"top_k_experts\": 8, \"use_cache\": true, \"use_double_wide_mlp\": false,"
     " \"vocab_size\": 262144}"},
    /* Qwen3-Embedding-0.6B's config (Qwen3ForCausalLM's name over a bare Qwen3Model) */
    {"qwen3-embedding-0.6b",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"head_dim\": 128, \"hidden_act\": \"silu\","
     " \"hidden_size\": 1024, \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
     " \"max_position_embeddings\": 32768, \"max_window_layers\": 28, \"model_type\": \"qwen3\","
     " \"num_attention_heads\": 16, \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
     " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null, \"tie_word_embeddings\": true,"
     " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151669}"},
    /* the same kind at the goldens' size (tests/data/embed) */
    {"qwen3-embedding-tiny",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"bos_token_id\": null, \"eos_token_id\": null, \"head_dim\": 16, \"hidden_act\": \"silu\","
     " \"hidden_size\": 64, \"initializer_range\": 0.02, \"intermediate_size\": 128,"
     " \"max_position_embeddings\": 2048, \"model_type\": \"qwen3\", \"num_attention_heads\": 4,"
     " \"num_hidden_layers\": 3, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0,"
     " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false,"
     " \"vocab_size\": 512}"},
    /* a Qwen3-Reranker at the goldens' size (tests/data/rerank): a causal LM with its head, untied so that the
     * scores read the head's rows, not the embedding's */
    {"qwen3-reranker-tiny",
     "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"bos_token_id\": null, \"eos_token_id\": 266, \"head_dim\": 16, \"hidden_act\": \"silu\","
     " \"hidden_size\": 64, \"initializer_range\": 0.02, \"intermediate_size\": 128,"
     " \"max_position_embeddings\": 2048, \"model_type\": \"qwen3\", \"num_attention_heads\": 4,"
     " \"num_hidden_layers\": 3, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0,"
     " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"use_sliding_window\": false,"
     " \"vocab_size\": 512}"},
    /* EmbeddingGemma-300M's config: a bare Gemma 3 body with bidirectional attention */
    {"embeddinggemma-300m",
     "{\"architectures\": [\"Gemma3TextModel\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"attn_logit_softcapping\": null, \"bos_token_id\": 2, \"eos_token_id\": 1,"
     " \"final_logit_softcapping\": null, \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
     " \"hidden_size\": 768, \"initializer_range\": 0.02, \"intermediate_size\": 1152,"
     " \"sliding_window_pattern\": 6, \"max_position_embeddings\": 2048, \"model_type\": \"gemma3_text\","
     " \"num_attention_heads\": 3, \"num_hidden_layers\": 24, \"num_key_value_heads\": 1, \"pad_token_id\": 0,"
     " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000.0,"
     " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"sliding_window\": 512,"
     " \"use_bidirectional_attention\": true, \"vocab_size\": 262144}"},
    /* the same kind at the goldens' size (tests/data/embeddinggemma): a window of 8 (|q - k| < 5) that short
     * inputs outgrow, a query scale other than the head's */
    {"embeddinggemma-tiny",
     "{\"architectures\": [\"Gemma3TextModel\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
     " \"attn_logit_softcapping\": null, \"bos_token_id\": null, \"eos_token_id\": null,"
     " \"final_logit_softcapping\": null, \"head_dim\": 16, \"hidden_activation\": \"gelu_pytorch_tanh\","
     " \"hidden_size\": 64, \"initializer_range\": 0.02, \"intermediate_size\": 128,"
     " \"layer_types\": [\"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
     " \"max_position_embeddings\": 2048, \"model_type\": \"gemma3_text\", \"num_attention_heads\": 4,"
     " \"num_hidden_layers\": 3, \"num_key_value_heads\": 2, \"pad_token_id\": 0, \"query_pre_attn_scalar\": 32,"
     " \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000.0, \"rope_scaling\": null,"
     " \"rope_theta\": 1000000.0, \"sliding_window\": 8, \"use_bidirectional_attention\": true,"
     " \"vocab_size\": 512}"},
    /* untied, so the lm_head path is exercised too */
    {"tiny-llama",
     "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"bos_token_id\": 1,"
     " \"eos_token_id\": 2, \"head_dim\": 16, \"hidden_act\": \"silu\", \"hidden_size\": 64,"
     " \"intermediate_size\": 128, \"max_position_embeddings\": 2048, \"mlp_bias\": false, \"model_type\": \"llama\","
     " \"num_attention_heads\": 4, \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-05,"
     " \"rope_theta\": 10000.0, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0},"
     " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 256}"},
};

/* embedders as sentence-transformers saves them: the bare model's weights (no "model.", no lm_head), modules.json
 * and 1_Pooling/config.json (last token, normalized) */
static const char *const BARE[] = {"qwen3-embedding-0.6b", "qwen3-embedding-tiny"};
/* ... and EmbeddingGemma's: mean pooling, 2_Dense (hidden -> 4·hidden) and 3_Dense (back), no biases, Normalize */
static const char *const BARE_DENSE[] = {"embeddinggemma-300m", "embeddinggemma-tiny"};

static json_t *preset_config(const char *name, int *bare) {
    for (size_t i = 0; i < sizeof BARE / sizeof *BARE; i++) *bare |= !strcmp(name, BARE[i]);
    for (size_t i = 0; i < sizeof BARE_DENSE / sizeof *BARE_DENSE; i++) *bare |= 2 * !strcmp(name, BARE_DENSE[i]);
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (!strcmp(name, PRESETS[i].name)) return json_loads(PRESETS[i].json, 0, NULL);
    return NULL;
}

/* a Dense module's folder, as sentence-transformers saves one: config.json and model.safetensors (linear.weight
 * [out, in] in f32, N(0, 1/in), no bias, Identity) */
static osp_status write_dense(const char *dir, const char *sub, int in, int out, uint64_t seed) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    OSP_TRY(synth_mkdir(path));
    json_t *cfg = json_pack("{s:i, s:i, s:b, s:s}", "in_features", in, "out_features", out, "bias", 0,
                            "activation_function", "torch.nn.modules.linear.Identity");
    snprintf(path, sizeof path, "%s/%s/config.json", dir, sub);
    osp_status st = cfg ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    if (st == OSP_OK && json_dump_file(cfg, path, JSON_INDENT(2))) st = osp_err(OSP_ERR_IO, "cannot write %s", path);
    json_decref(cfg);
    float *w = st == OSP_OK ? malloc(sizeof(float) * (size_t)in * (size_t)out) : NULL;
    osp_st_writer *sw = w ? osp_st_writer_new() : NULL;
    if (st == OSP_OK && !sw) st = osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int r = 0; st == OSP_OK && r < out; r++) /* (drawn as bf16 values, kept in f32) */
        synth_gen(seed, fnv1a(sub), r, 0, 1.0f / sqrtf((float)in), w + (int64_t)r * in, in);
    int64_t shape[2] = {out, in};
    if (st == OSP_OK) st = osp_st_writer_add(sw, "linear.weight", OSP_DT_F32, 2, shape, w, sizeof(float) * (size_t)in * (size_t)out);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
    if (st == OSP_OK) st = osp_st_writer_write(sw, path, NULL, NULL);
    osp_st_writer_free(sw);
    free(w);
    return st;
}

/* an embedder's sentence-transformers files: last-token pooling, then Normalize (Qwen3-Embedding's); dense: mean
 * pooling, 2_Dense, 3_Dense, then Normalize (EmbeddingGemma's) */
static osp_status write_st_files(const char *dir, int hidden, int dense, uint64_t seed) {
    char path[4200];
    json_t *mods = json_pack("[{s:i, s:s, s:s, s:s}, {s:i, s:s, s:s, s:s}]", "idx", 0, "name", "0", "path", "",
                             "type", "sentence_transformers.models.Transformer", "idx", 1, "name", "1", "path",
                             "1_Pooling", "type", "sentence_transformers.models.Pooling");
    for (int k = 2; mods && dense && k < 4; k++)
        json_array_append_new(mods, json_pack("{s:i, s:s, s:s, s:s}", "idx", k, "name", k == 2 ? "2" : "3", "path",
                                              k == 2 ? "2_Dense" : "3_Dense", "type",
                                              "sentence_transformers.models.Dense"));
    if (mods)
        json_array_append_new(mods, json_pack("{s:i, s:s, s:s, s:s}", "idx", dense ? 4 : 2, "name", dense ? "4" : "2",
                                              "path", dense ? "4_Normalize" : "2_Normalize", "type",
                                              "sentence_transformers.models.Normalize"));
    json_t *pool = json_pack("{s:i, s:b, s:b, s:b, s:b, s:b, s:b, s:b}", "word_embedding_dimension", hidden,
                             "pooling_mode_cls_token", 0, "pooling_mode_mean_tokens", dense, "pooling_mode_max_tokens", 0,
                             "pooling_mode_mean_sqrt_len_tokens", 0, "pooling_mode_weightedmean_tokens", 0,
                             "pooling_mode_lasttoken", !dense, "include_prompt", 1);
    osp_status st = mods && pool ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/modules.json", dir);
    if (st == OSP_OK && json_dump_file(mods, path, JSON_INDENT(2))) st = osp_err(OSP_ERR_IO, "cannot write %s", path);
    snprintf(path, sizeof path, "%s/1_Pooling", dir);
    if (st == OSP_OK) st = synth_mkdir(path);
    snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
    if (st == OSP_OK && json_dump_file(pool, path, JSON_INDENT(2))) st = osp_err(OSP_ERR_IO, "cannot write %s", path);
    json_decref(mods);
    json_decref(pool);
    if (st == OSP_OK && dense) st = write_dense(dir, "2_Dense", hidden, 4 * hidden, seed);
    if (st == OSP_OK && dense) st = write_dense(dir, "3_Dense", 4 * hidden, hidden, seed);
    return st;
}

/* ---------- the tensor plan: the architecture's layout, walked ---------- */

/* Append an entry; matrices are quantized with (bits, group) when bits > 0.
 * Columns that do not split into groups are an error, or, with `optional`,
 * leave the matrix dense (mlx-lm's predicate). */
static osp_status plan_push(synth_plan *p, synth_kind kind, float mean, int64_t nexp, int64_t rows, int64_t cols,
                            int bits, int group, int optional, const char *name, uint64_t hash, uint64_t hash2,
                            int64_t split) {
    if (p->n_e == p->cap) {
        int cap = p->cap ? 2 * p->cap : 256;
        synth_entry *e = realloc(p->e, (size_t)cap * sizeof *e);
        synth_slot *sl = realloc(p->slot, (size_t)cap * 3 * sizeof *sl);
        if (e) p->e = e;
        if (sl) p->slot = sl;
        if (!e || !sl) return osp_err(OSP_ERR_NOMEM, "out of memory");
        p->cap = cap;
    }
    synth_entry *e = &p->e[p->n_e++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->mean = mean;
    e->nexp = nexp;
    e->rows = rows;
    e->cols = cols;
    e->bits = kind == SYN_MAT ? bits : 0;
    e->group = group;
    e->hash = hash ? hash : fnv1a(e->name);
    e->hash2 = hash2 ? hash2 : e->hash;
    e->split = split ? split : rows;
    if (e->bits && cols % group) {
        if (!optional)
            return osp_err(OSP_ERR_INVALID, "%s: %lld input columns are not a multiple of the group size %d", e->name,
                           (long long)cols, group);
        e->bits = 0;
    }
    e->quant = e->bits > 0;
    return OSP_OK;
}

static uint64_t fnv1af(const char *fmt, const char *a) {
    char s[SYNTH_NAME_MAX + 32];
    snprintf(s, sizeof s, fmt, a);
    return fnv1a(s);
}

/* The layout's visitor. Linears are quantized with the plan's bits (the
 * router 8-bit, group 64, recorded as a per-module override); vectors stay
 * bf16. Experts: the HF fused layout (gate_up_proj [E, 2·Im, H], down_proj
 * [E, H, Im]) in bf16, MLX's switch_glu layout when quantized; both draw the
 * same rows. */
static osp_status plan_visit(void *ctx, const osp_tdesc *d) {
    synth_plan *p = ctx;
    char n[SYNTH_NAME_MAX + 32];
    if (d->kind == OSP_T_VEC)
        return plan_push(p, SYN_VEC, d->flags & OSP_TF_ZERO_MEAN ? 0.0f : 1.0f, 0, d->rows, 0, 0, 0, 0, d->name, 0, 0,
                         0);
    if (d->kind == OSP_T_LINEAR) {
        int bits = p->bits, group = p->group, router = d->flags & OSP_TF_Q8_ROUTER;
        if (router) bits = bits ? 8 : 0, group = 64;
        snprintf(n, sizeof n, "%s.weight", d->name);
        OSP_TRY(plan_push(p, SYN_MAT, 0, 0, d->rows, d->cols, bits, group, (d->flags & OSP_TF_Q_IF_FITS) || router, n,
                          0, 0, 0));
        if (router && p->e[p->n_e - 1].quant) {
            if (!p->qover && !(p->qover = json_object())) return osp_err(OSP_ERR_NOMEM, "out of memory");
            json_object_set_new(p->qover, d->name, json_pack("{s:i, s:i}", "bits", 8, "group_size", 64));
        }
        return OSP_OK;
    }
    const int64_t E = d->n_exp, Im = d->rows, H = d->cols;
    uint64_t hg = fnv1af("%sexperts.gate_proj", d->name), hu = fnv1af("%sexperts.up_proj", d->name),
             hd = fnv1af("%sexperts.down_proj", d->name);
    if (p->bits) {
        snprintf(n, sizeof n, "%sexperts.switch_glu.gate_proj.weight", d->name);
        OSP_TRY(plan_push(p, SYN_MAT, 0, E, Im, H, p->bits, p->group, 0, n, hg, hg, 0));
        snprintf(n, sizeof n, "%sexperts.switch_glu.up_proj.weight", d->name);
        OSP_TRY(plan_push(p, SYN_MAT, 0, E, Im, H, p->bits, p->group, 0, n, hu, hu, 0));
        snprintf(n, sizeof n, "%sexperts.switch_glu.down_proj.weight", d->name);
        return plan_push(p, SYN_MAT, 0, E, H, Im, p->bits, p->group, 0, n, hd, hd, 0);
    }
    snprintf(n, sizeof n, "%sexperts.gate_up_proj", d->name);
    OSP_TRY(plan_push(p, SYN_MAT, 0, E, 2 * Im, H, 0, 0, 0, n, hg, hu, Im));
    snprintf(n, sizeof n, "%sexperts.down_proj", d->name);
    return plan_push(p, SYN_MAT, 0, E, H, Im, 0, 0, 0, n, hd, hd, 0);
}

/* Names as transformers saves them: a multimodal wrapper
 * (...ForConditionalGeneration) keeps the text model under
 * model.language_model. */
static osp_status plan_build(const osp_config *c, synth_plan *p) {
    const char *suffix = "ForConditionalGeneration";
    size_t n = strlen(c->architecture), k = strlen(suffix);
    int wrapped = n > k && !strcmp(c->architecture + n - k, suffix);
    osp_tnames names = {c->no_head ? "" : wrapped ? "model.language_model." : "model.", "lm_head"};
    return c->arch->layout(c, NULL, &names, plan_visit, p);
}

/* "x.weight" → "x.scales" / "x.biases". */
static void part_name(const synth_entry *e, int part, char *out, size_t n) {
    static const char *suffix[3] = {"weight", "scales", "biases"};
    size_t len = strlen(e->name), base = len - strlen("weight");
    OSP_ASSERT(len > strlen("weight") && !strcmp(e->name + base, "weight"));
    snprintf(out, n, "%.*s%s", (int)base, e->name, suffix[part]);
}

static osp_status plan_declare(synth_plan *p, osp_st_writer *w) {
    for (int i = 0; i < p->n_e; i++) {
        synth_entry *e = &p->e[i];
        int parts = e->quant ? 3 : 1;
        for (int part = 0; part < parts; part++) {
            char name[SYNTH_NAME_MAX];
            int64_t cols = e->cols;
            osp_dtype dt = OSP_DT_BF16;
            if (part == 0 && e->quant) {
                dt = OSP_DT_U32;
                cols = e->cols * e->bits / 32;
            } else if (part > 0) {
                cols = e->cols / e->group;
            }
            if (e->quant) part_name(e, part, name, sizeof name);
            else snprintf(name, sizeof name, "%s", e->name);
            int64_t shape[3];
            int ndim = 0;
            if (e->nexp) shape[ndim++] = e->nexp;
            shape[ndim++] = e->rows;
            if (e->cols) shape[ndim++] = cols;
            size_t nbytes = (size_t)((e->nexp ? e->nexp : 1) * e->rows * (e->cols ? cols : 1)) *
                            osp_dtype_size(dt);
            OSP_TRY(osp_st_writer_add(w, name, dt, ndim, shape, NULL, nbytes));
            p->slot[p->n_slot++] = (synth_slot){i, part};
        }
    }
    return OSP_OK;
}

/* ---------- filling ---------- */

typedef struct synth_job {
    const synth_plan *p;
    synth_entry *e;
    int64_t r0, nr, rows_per_task;
    unsigned char *buf; /* rows [r0, r0+nr) of the part being written */
    _Atomic int failed;
} synth_job;

static void synth_task(void *ctx, int64_t t) {
    synth_job *j = ctx;
    const synth_entry *e = j->e;
    int64_t a = t * j->rows_per_task, b = a + j->rows_per_task;
    if (b > j->nr) b = j->nr;
    float *row = osp_malloc(OSP_POOL_SCRATCH, (size_t)e->cols * sizeof(float));
    if (!row) {
        atomic_store(&j->failed, 1);
        return;
    }
    const float mean = e->mean, std = 0.02f;
    const int bits = e->bits, group = e->group;
    for (int64_t i = a; i < b; i++) {
        int64_t r = j->r0 + i; /* row of the [nexp·rows, cols] view */
        int64_t x = r / e->rows, y = r % e->rows;
        if (y < e->split) synth_gen(j->p->seed, e->hash, x * e->split + y, mean, std, row, e->cols);
        else synth_gen(j->p->seed, e->hash2, x * (e->rows - e->split) + y - e->split, mean, std,
                       row, e->cols);
        if (e->quant) {
            int64_t ng = e->cols / group;
            osp_quantize_row(row, e->cols, bits, group, j->buf + i * (e->cols * bits / 8),
                             e->scales + r * ng, e->biases + r * ng);
        } else {
            unsigned char *o = j->buf + i * e->cols * 2;
            for (int64_t c = 0; c < e->cols; c++) {
                uint16_t h = osp_f32_to_bf16(row[c]);
                memcpy(o + 2 * c, &h, 2);
            }
        }
    }
    osp_free(row);
}

typedef struct synth_fill_ctx {
    synth_plan *p;
} synth_fill_ctx;

static osp_status synth_fill(void *ctx, int64_t index, int64_t row0, int64_t nrows, void *buf,
                             size_t nbytes) {
    synth_fill_ctx *c = ctx;
    synth_plan *p = c->p;
    synth_slot s = p->slot[index];
    synth_entry *e = &p->e[s.entry];
    if (e->cols == 0) { /* a vector: one stream, sliced */
        float *v = osp_malloc(OSP_POOL_SCRATCH, (size_t)e->rows * sizeof(float));
        if (!v) return osp_err(OSP_ERR_NOMEM, "out of memory");
        synth_gen(p->seed, e->hash, 0, e->mean, 0.02f, v, e->rows);
        for (int64_t i = 0; i < nrows; i++) {
            uint16_t h = osp_f32_to_bf16(v[row0 + i]);
            memcpy((unsigned char *)buf + 2 * i, &h, 2);
        }
        osp_free(v);
        return OSP_OK;
    }
    if (e->nexp) { /* dim-0 slices are whole matrices: work on the [nexp·rows, cols] view */
        row0 *= e->rows;
        nrows *= e->rows;
    }
    const int64_t total = (e->nexp ? e->nexp : 1) * e->rows;
    if (s.part > 0) { /* scales/biases were made with the codes */
        uint16_t *src = s.part == 1 ? e->scales : e->biases;
        OSP_ASSERT(src);
        memcpy(buf, src + row0 * (e->cols / e->group), nbytes);
        if (s.part == 2 && row0 + nrows == total) {
            osp_free(e->scales);
            osp_free(e->biases);
            e->scales = e->biases = NULL;
        }
        return OSP_OK;
    }
    if (e->quant && row0 == 0) {
        size_t sb = (size_t)(total * (e->cols / e->group)) * sizeof(uint16_t);
        e->scales = osp_malloc(OSP_POOL_SCRATCH, sb);
        e->biases = osp_malloc(OSP_POOL_SCRATCH, sb);
        if (!e->scales || !e->biases) return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    synth_job j = {.p = p, .e = e, .r0 = row0, .nr = nrows, .buf = buf};
    j.rows_per_task = (1 << 18) / e->cols;
    if (j.rows_per_task < 1) j.rows_per_task = 1;
    atomic_init(&j.failed, 0);
    osp_parallel_for((nrows + j.rows_per_task - 1) / j.rows_per_task, synth_task, &j);
    if (atomic_load(&j.failed)) return osp_err(OSP_ERR_NOMEM, "out of memory");
    return OSP_OK;
}

static void plan_free(synth_plan *p) {
    for (int i = 0; p->e && i < p->n_e; i++) {
        osp_free(p->e[i].scales);
        osp_free(p->e[i].biases);
    }
    free(p->e);
    free(p->slot);
    json_decref(p->qover);
}

/* ---------- command line ---------- */

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: osprey synth (--preset NAME | --config FILE) --out DIR\n"
            "                    [--dtype bf16|q2|q3|q4|q5|q6|q8] [--seed S] [--threads N]\n"
            "Writes DIR/config.json and DIR/model.safetensors with random weights.\n"
            "presets: llama-3.2-1b, qwen3-0.6b, gemma-3-1b, gemma-4-e2b, gemma-4-26b-a4b,\n"
            "         whisper-tiny, whisper-base, whisper-small, whisper-large-v3 (bf16),\n"
            "         tiny-llama, qwen3-embedding-0.6b, qwen3-embedding-tiny (embedders: no lm_head),\n"
            "         qwen3-reranker-tiny, embeddinggemma-300m, embeddinggemma-tiny,\n"
            "         all-minilm-l6-v2, bge-m3, bert-tiny, xlmr-tiny, xlmr-reranker-tiny (encoders)\n"
            "--dtype defaults to bf16 (or to the quantization of --config's file);\n"
            "quantized models use MLX affine quantization, group size 64.\n");
}

static int synth_fail(const char *fmt, const char *arg) {
    fprintf(stderr, "osprey synth: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    return 1;
}

/* mkdir -p */
static osp_status synth_mkdir(const char *dir) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return osp_err(OSP_ERR_INVALID, "output path too long");
    for (char *s = tmp + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        struct stat st;
        if (mkdir(tmp, 0755) != 0 && !(errno == EEXIST && stat(tmp, &st) == 0 &&
                                        S_ISDIR(st.st_mode)))
            return osp_err(OSP_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
        *s = c;
        if (!c) break;
    }
    return OSP_OK;
}

typedef struct synth_args {
    const char *preset, *config, *out, *dtype;
    uint64_t seed;
    int threads;
} synth_args;

static int synth_parse_args(int argc, char **argv, synth_args *a) {
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) {
            synth_usage(stdout);
            return -1;
        }
        const char *v = NULL;
        const char *eq = strchr(k, '=');
        size_t klen = eq ? (size_t)(eq - k) : strlen(k);
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        if (!v) return synth_fail("%s needs a value", k);
#define SYNTH_KEY(s) (klen == strlen(s) && !strncmp(k, s, klen))
        char *end;
        if (SYNTH_KEY("--preset")) a->preset = v;
        else if (SYNTH_KEY("--config")) a->config = v;
        else if (SYNTH_KEY("--out")) a->out = v;
        else if (SYNTH_KEY("--dtype")) a->dtype = v;
        else if (SYNTH_KEY("--seed")) {
            errno = 0;
            a->seed = strtoull(v, &end, 0);
            if (errno || *end || !*v) return synth_fail("bad --seed '%s'", v);
        } else if (SYNTH_KEY("--threads")) {
            long n = strtol(v, &end, 10);
            if (*end || !*v || n < 0 || n > 1024) return synth_fail("bad --threads '%s'", v);
            a->threads = (int)n;
        } else {
            return synth_fail("unknown option '%s' (see osprey synth --help)", k);
        }
#undef SYNTH_KEY
    }
    if (!a->preset == !a->config) return synth_fail("%s", "give exactly one of --preset and --config");
    if (!a->out) return synth_fail("%s", "--out DIR is required");
    return 0;
}

/* bits 0 = bf16; group from the input config when it has one. */
static int synth_dtype(const char *dtype, json_t *cfg, int *bits, int *group) {
    *bits = 0;
    *group = 64;
    if (!dtype) {
        json_t *q = json_object_get(cfg, "quantization");
        if (!json_is_object(q)) return 0;
        *bits = (int)json_integer_value(json_object_get(q, "bits"));
        json_t *g = json_object_get(q, "group_size");
        if (g) *group = (int)json_integer_value(g);
        return osp_quant_check(*group, *bits, *group) == OSP_OK
                   ? 0
                   : synth_fail("config.json quantization: %s", osp_last_error());
    }
    if (!strcmp(dtype, "bf16")) return 0;
    if (dtype[0] == 'q' && dtype[1] >= '2' && dtype[1] <= '8' && !dtype[2]) *bits = dtype[1] - '0';
    if (!*bits || osp_quant_check(64, *bits, 64) != OSP_OK)
        return synth_fail("unknown --dtype '%s' (bf16, q2, q3, q4, q5, q6 or q8)", dtype);
    return 0;
}

static osp_status synth_write_config(json_t *cfg, int bits, int group, json_t *qover,
                                     const char *dir) {
    json_object_del(cfg, "quantization");
    json_object_del(cfg, "quantization_config");
    json_object_set_new(cfg, "torch_dtype", json_string("bfloat16"));
    if (bits) {
        static const char *keys[2] = {"quantization", "quantization_config"};
        for (int k = 0; k < 2; k++) {
            json_t *q = json_pack("{s:i, s:i}", "group_size", group, "bits", bits);
            if (qover) json_object_update(q, qover);
            json_object_set_new(cfg, keys[k], q);
        }
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (json_dump_file(cfg, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0)
        return osp_err(OSP_ERR_IO, "cannot write %s", path);
    return OSP_OK;
}

int osp_cmd_synth(int argc, char **argv) {
    synth_args a = {0};
    int rc = synth_parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : 2;
    if (a.preset && osp_whisper_preset_known(a.preset)) return osp_whisper_synth(a.preset, a.dtype, a.out, a.seed);

    json_t *cfg = NULL;
    int bare = 0, enc = 0;
    if (a.preset) {
        cfg = preset_config(a.preset, &bare);
        if (!cfg && (cfg = osp_encoder_preset_config(a.preset))) bare = enc = 1;
        if (!cfg)
            return synth_fail("unknown preset '%s' (llama-3.2-1b, qwen3-0.6b, gemma-3-1b, "
                              "gemma-4-e2b, gemma-4-26b-a4b, tiny-llama, qwen3-embedding-0.6b, qwen3-embedding-tiny, "
                              "qwen3-reranker-tiny, embeddinggemma-300m, embeddinggemma-tiny, all-minilm-l6-v2, bge-m3, "
                              "bert-tiny, xlmr-tiny, xlmr-reranker-tiny, whisper-tiny|base|small|large-v3)", a.preset);
    } else {
        json_error_t je;
        cfg = json_load_file(a.config, 0, &je);
        if (!cfg || !json_is_object(cfg)) {
            json_decref(cfg);
            if (je.line > 0)
                fprintf(stderr, "osprey synth: %s:%d: %s\n", a.config, je.line, je.text);
            else
                fprintf(stderr, "osprey synth: %s\n", je.text);
            return 1;
        }
    }
    int bits, group;
    if (synth_dtype(a.dtype, cfg, &bits, &group)) {
        json_decref(cfg);
        return 1;
    }
    if (a.threads) osp_threads_init(a.threads);

    double t0 = osp_now_s();
    osp_config c;
    memset(&c, 0, sizeof c);
    synth_plan p = {.bits = bits, .group = group, .seed = a.seed};
    osp_st_writer *w = osp_st_writer_new();
    char path[4200];
    osp_status st = w ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    if (st == OSP_OK) st = osp_config_parse(cfg, "config", &c); /* the engine's own parser: the layout it binds */
    c.no_head = bare || c.no_head; /* an encoder's configure says it has none */
    if (st == OSP_OK) st = plan_build(&c, &p);
    if (st == OSP_OK) st = plan_declare(&p, w);
    if (st == OSP_OK) st = osp_st_writer_set_meta(w, "format", bits ? "mlx" : "pt");
    if (st == OSP_OK) st = synth_mkdir(a.out);
    if (st == OSP_OK) st = synth_write_config(cfg, bits, group, p.qover, a.out);
    if (st == OSP_OK && bare)
        st = enc ? osp_encoder_synth_files(a.preset, a.out) : write_st_files(a.out, c.hidden, bare == 2, a.seed);
    if (st == OSP_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", a.out);
        synth_fill_ctx fc = {&p};
        st = osp_st_writer_write(w, path, synth_fill, &fc);
    }
    if (st == OSP_OK)
        printf("wrote %s: %s %s%d, %lld tensors, %.1f MB in %.1f s\n", a.out, c.model_type,
               bits ? "q" : "bf", bits ? bits : 16, (long long)osp_st_writer_count(w), osp_st_writer_data_bytes(w) / 1e6,
               osp_now_s() - t0);
    else
        fprintf(stderr, "osprey synth: %s\n", osp_last_error());
    plan_free(&p);
    osp_config_free(&c);
    osp_st_writer_free(w);
    json_decref(cfg);
    return st == OSP_OK ? 0 : 1;
}
