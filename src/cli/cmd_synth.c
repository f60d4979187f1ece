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
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/core.h"
#include "core/threadpool.h"
#include "model/config.h"
#include "model/st_write.h"
#include "tensor/quant.h"
#include "tensor/tensor.h"

int osp_cmd_synth(int argc, char **argv);

#define SYNTH_NAME_MAX 128

/* What the weight layout depends on. */
typedef struct synth_model {
    char model_type[32];
    int64_t hidden, inter, layers, heads, kv_heads, head_dim, vocab;
    int tied, qkv_bias, o_bias, mlp_bias, qk_norm, gemma;
    /* Gemma 4: the engine's own reading of the config (per-layer head
     * sizes, KV sharing, PLE, MoE), so the layout is what it binds. */
    int gemma4, double_wide;
    osp_config g4;
} synth_model;

typedef enum { SYN_MAT, SYN_NORM, SYN_BIAS } synth_kind;

/* One logical weight: a matrix [rows, cols], a vector [rows], or a stack
 * of nexp matrices [nexp, rows, cols] (MoE experts). */
typedef struct synth_entry {
    char name[SYNTH_NAME_MAX]; /* dense tensor name, e.g. "...q_proj.weight" */
    synth_kind kind;
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
    int n_e;
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

static void synth_params(const synth_model *m, synth_kind kind, float *mean, float *std) {
    *mean = (kind == SYN_NORM && !m->gemma) ? 1.0f : 0.0f; /* Gemma 3: 1 + w; Gemma 4: w */
    *std = 0.02f;
}

/* ---------- presets and config ---------- */

static json_t *synth_rope_default(double theta) {
    return json_pack("{s:s, s:f}", "rope_type", "default", "rope_theta", theta);
}

/* Gemma 4 text presets: E2B-like (per-layer embeddings, KV sharing,
 * double-wide sharer MLPs) and 26B-A4B-like (MoE, K = V on full layers). */
static json_t *preset_gemma4(int moe) {
    const int layers = moe ? 30 : 35, period = moe ? 6 : 5;
    json_t *c = json_object(), *types = json_array(), *plc = json_object();
    for (int i = 0; i < layers; i++) {
        int full = (i + 1) % period == 0 || i == layers - 1;
        json_array_append_new(types, json_string(full ? "full_attention" : "sliding_attention"));
        char k[16];
        snprintf(k, sizeof k, "%d", i);
        if (full)
            json_object_set_new(plc, k, moe ? json_pack("{s:i, s:i}", "head_dim", 512,
                                                        "num_key_value_heads", 2)
                                            : json_pack("{s:i}", "head_dim", 512));
    }
    json_t *rope = json_pack(
        "{s:{s:s, s:f}, s:{s:s, s:f, s:f}}", "sliding_attention", "rope_type", "default",
        "rope_theta", 10000.0, "full_attention", "rope_type", "proportional",
        "partial_rotary_factor", 0.25, "rope_theta", 1000000.0);
    json_object_set_new(c, "architectures", json_pack("[s]", "Gemma4ForCausalLM"));
    json_object_set_new(c, "attention_bias", json_false());
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "attention_k_eq_v", json_boolean(moe));
    json_object_set_new(c, "bos_token_id", json_integer(2));
    json_object_set_new(c, "dtype", json_string("bfloat16"));
    json_object_set_new(c, "enable_moe_block", json_boolean(moe));
    json_object_set_new(c, "eos_token_id", json_pack("[i,i]", 1, 106));
    json_object_set_new(c, "final_logit_softcapping", json_real(30.0));
    json_object_set_new(c, "head_dim", json_integer(256));
    json_object_set_new(c, "hidden_activation", json_string("gelu_pytorch_tanh"));
    json_object_set_new(c, "hidden_size", json_integer(moe ? 2816 : 1536));
    json_object_set_new(c, "hidden_size_per_layer_input", json_integer(moe ? 0 : 256));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(moe ? 2112 : 6144));
    json_object_set_new(c, "layer_types", types);
    json_object_set_new(c, "max_position_embeddings", json_integer(moe ? 262144 : 131072));
    json_object_set_new(c, "model_type", json_string("gemma4_text"));
    json_object_set_new(c, "moe_intermediate_size", moe ? json_integer(704) : json_null());
    json_object_set_new(c, "num_attention_heads", json_integer(moe ? 16 : 8));
    json_object_set_new(c, "num_experts", moe ? json_integer(128) : json_null());
    json_object_set_new(c, "num_hidden_layers", json_integer(layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(moe ? 8 : 1));
    json_object_set_new(c, "num_kv_shared_layers", json_integer(moe ? 0 : 20));
    json_object_set_new(c, "pad_token_id", json_integer(0));
    json_object_set_new(c, "per_layer_config", plc);
    json_object_set_new(c, "rms_norm_eps", json_real(1e-6));
    json_object_set_new(c, "rope_parameters", rope);
    json_object_set_new(c, "sliding_window", json_integer(moe ? 1024 : 512));
    json_object_set_new(c, "tie_word_embeddings", json_true());
    json_object_set_new(c, "top_k_experts", moe ? json_integer(8) : json_null());
    json_object_set_new(c, "use_bidirectional_attention", json_null());
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "use_double_wide_mlp", json_boolean(!moe));
    json_object_set_new(c, "vocab_size", json_integer(262144));
    json_object_set_new(c, "vocab_size_per_layer_input", json_integer(262144));
    return c;
}

static json_t *preset_config(const char *name) {
    json_t *c = NULL;
    if (strcmp(name, "gemma-4-e2b") == 0) return preset_gemma4(0);
    if (strcmp(name, "gemma-4-26b-a4b") == 0) return preset_gemma4(1);
    if (strcmp(name, "llama-3.2-1b") == 0) {
        json_t *scaling = json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", 32.0,
                                    "high_freq_factor", 4.0, "low_freq_factor", 1.0,
                                    "original_max_position_embeddings", 8192, "rope_type", "llama3");
        json_t *params = json_deep_copy(scaling);
        json_object_set_new(params, "rope_theta", json_real(500000.0));
        c = json_pack("{s:[s], s:b, s:f, s:i, s:i, s:i, s:s, s:i, s:f, s:i, s:i, s:b, s:s, s:i,"
                      " s:i, s:i, s:i, s:f, s:o, s:f, s:o, s:b, s:s, s:b, s:i}",
                      "architectures", "LlamaForCausalLM", "attention_bias", 0,
                      "attention_dropout", 0.0, "bos_token_id", 128000, "eos_token_id", 128001,
                      "head_dim", 64, "hidden_act", "silu", "hidden_size", 2048,
                      "initializer_range", 0.02, "intermediate_size", 8192,
                      "max_position_embeddings", 131072, "mlp_bias", 0, "model_type", "llama",
                      "num_attention_heads", 32, "num_hidden_layers", 16,
                      "num_key_value_heads", 8, "pretraining_tp", 1, "rms_norm_eps", 1e-5,
                      "rope_scaling", scaling, "rope_theta", 500000.0, "rope_parameters", params,
                      "tie_word_embeddings", 1, "torch_dtype", "bfloat16", "use_cache", 1,
                      "vocab_size", 128256);
    } else if (strcmp(name, "qwen3-0.6b") == 0) {
        c = json_pack("{s:[s], s:b, s:f, s:i, s:i, s:i, s:s, s:i, s:f, s:i, s:i, s:i, s:s, s:i,"
                      " s:i, s:i, s:f, s:n, s:f, s:o, s:n, s:b, s:s, s:b, s:b, s:i}",
                      "architectures", "Qwen3ForCausalLM", "attention_bias", 0,
                      "attention_dropout", 0.0, "bos_token_id", 151643, "eos_token_id", 151645,
                      "head_dim", 128, "hidden_act", "silu", "hidden_size", 1024,
                      "initializer_range", 0.02, "intermediate_size", 3072,
                      "max_position_embeddings", 40960, "max_window_layers", 28,
                      "model_type", "qwen3", "num_attention_heads", 16, "num_hidden_layers", 28,
                      "num_key_value_heads", 8, "rms_norm_eps", 1e-6, "rope_scaling",
                      "rope_theta", 1000000.0, "rope_parameters", synth_rope_default(1e6),
                      "sliding_window", "tie_word_embeddings", 1, "torch_dtype", "bfloat16",
                      "use_cache", 1, "use_sliding_window", 0, "vocab_size", 151936);
    } else if (strcmp(name, "gemma-3-1b") == 0) {
        const int layers = 26;
        json_t *types = json_array();
        for (int i = 0; i < layers; i++)
            json_array_append_new(types, json_string((i + 1) % 6 ? "sliding_attention"
                                                                 : "full_attention"));
        json_t *params = json_pack("{s:o, s:o}", "sliding_attention", synth_rope_default(1e4),
                                   "full_attention", synth_rope_default(1e6));
        c = json_pack("{s:[s], s:b, s:f, s:n, s:i, s:[i,i], s:n, s:i, s:s, s:i, s:f, s:i,"
                      " s:o, s:i, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:n, s:f, s:o, s:i,"
                      " s:i, s:b, s:s, s:b, s:i}",
                      "architectures", "Gemma3ForCausalLM", "attention_bias", 0,
                      "attention_dropout", 0.0, "attn_logit_softcapping", "bos_token_id", 2,
                      "eos_token_id", 1, 106, "final_logit_softcapping", "head_dim", 256,
                      "hidden_activation", "gelu_pytorch_tanh", "hidden_size", 1152,
                      "initializer_range", 0.02, "intermediate_size", 6912, "layer_types", types,
                      "max_position_embeddings", 32768, "model_type", "gemma3_text",
                      "num_attention_heads", 4, "num_hidden_layers", layers,
                      "num_key_value_heads", 1, "pad_token_id", 0, "query_pre_attn_scalar", 256,
                      "rms_norm_eps", 1e-6, "rope_local_base_freq", 10000.0, "rope_scaling",
                      "rope_theta", 1000000.0, "rope_parameters", params, "sliding_window", 512,
                      "sliding_window_pattern", 6, "tie_word_embeddings", 1, "torch_dtype",
                      "bfloat16", "use_cache", 1, "vocab_size", 262144);
    } else if (strcmp(name, "tiny-llama") == 0) {
        /* Untied, so the lm_head path is exercised too. */
        c = json_pack("{s:[s], s:b, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:b, s:s, s:i, s:i, s:i,"
                      " s:f, s:f, s:o, s:b, s:s, s:i}",
                      "architectures", "LlamaForCausalLM", "attention_bias", 0, "bos_token_id", 1,
                      "eos_token_id", 2, "head_dim", 16, "hidden_act", "silu", "hidden_size", 64,
                      "intermediate_size", 128, "max_position_embeddings", 2048, "mlp_bias", 0,
                      "model_type", "llama", "num_attention_heads", 4, "num_hidden_layers", 2,
                      "num_key_value_heads", 2, "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
                      "rope_parameters", synth_rope_default(1e4), "tie_word_embeddings", 0,
                      "torch_dtype", "bfloat16", "vocab_size", 256);
    }
    return c;
}

/* Integer key; `def` < 0 means required. Accepts integral reals. */
static osp_status cfg_int(json_t *o, const char *key, int64_t def, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return osp_err(OSP_ERR_FORMAT, "config has no %s", key);
        *out = def;
        return OSP_OK;
    }
    double d = json_number_value(v);
    if (!json_is_number(v) || d != (double)(int64_t)d || d <= 0 || d > (double)(1ll << 40))
        return osp_err(OSP_ERR_FORMAT, "config %s must be a positive integer", key);
    *out = (int64_t)d;
    return OSP_OK;
}

/* Gemma 4: read the config as the engine does; it validates head sizes,
 * KV sharing, MoE and PLE keys. */
static osp_status parse_gemma4(json_t *root, synth_model *m) {
    json_t *arch = json_array_get(json_object_get(root, "architectures"), 0);
    if (arch && (!json_is_string(arch) || strcmp(json_string_value(arch), "Gemma4ForCausalLM")))
        return osp_err(OSP_ERR_UNSUPPORTED, "gemma4_text config: architecture must be "
                       "Gemma4ForCausalLM");
    OSP_TRY(osp_config_parse(root, "config", &m->g4));
    const osp_config *c = &m->g4;
    m->hidden = c->hidden;
    m->inter = c->intermediate;
    m->layers = c->n_layers;
    m->heads = c->n_heads;
    m->kv_heads = c->n_kv_heads;
    m->head_dim = c->head_dim;
    m->vocab = c->vocab;
    m->tied = c->tie_embeddings;
    m->qk_norm = 1;
    m->double_wide = json_is_true(json_object_get(root, "use_double_wide_mlp"));
    return OSP_OK;
}

static osp_status parse_model(json_t *root, synth_model *m) {
    memset(m, 0, sizeof *m);
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    if (!mt) return osp_err(OSP_ERR_FORMAT, "config has no model_type");
    int llama = !strcmp(mt, "llama") || !strcmp(mt, "mistral");
    int qwen2 = !strcmp(mt, "qwen2"), qwen3 = !strcmp(mt, "qwen3");
    m->gemma = !strcmp(mt, "gemma3_text");
    m->gemma4 = !strcmp(mt, "gemma4_text");
    if (!llama && !qwen2 && !qwen3 && !m->gemma && !m->gemma4)
        return osp_err(OSP_ERR_UNSUPPORTED,
                       "model_type '%s' is not supported (llama, mistral, qwen2, qwen3, "
                       "gemma3_text, gemma4_text)", mt);
    snprintf(m->model_type, sizeof m->model_type, "%s", mt);
    if (m->gemma4) return parse_gemma4(root, m);
    OSP_TRY(cfg_int(root, "hidden_size", -1, &m->hidden));
    OSP_TRY(cfg_int(root, "intermediate_size", -1, &m->inter));
    OSP_TRY(cfg_int(root, "num_hidden_layers", -1, &m->layers));
    OSP_TRY(cfg_int(root, "num_attention_heads", -1, &m->heads));
    OSP_TRY(cfg_int(root, "num_key_value_heads", m->heads, &m->kv_heads));
    OSP_TRY(cfg_int(root, "head_dim", m->hidden / m->heads, &m->head_dim));
    OSP_TRY(cfg_int(root, "vocab_size", -1, &m->vocab));
    if (m->heads % m->kv_heads)
        return osp_err(OSP_ERR_FORMAT, "num_attention_heads %lld is not a multiple of "
                       "num_key_value_heads %lld", (long long)m->heads, (long long)m->kv_heads);
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    m->tied = tie ? json_is_true(tie) : m->gemma;
    int attn_bias = json_is_true(json_object_get(root, "attention_bias"));
    m->qkv_bias = qwen2 || ((llama || qwen3) && attn_bias);
    m->o_bias = (llama || qwen3) && attn_bias;
    m->mlp_bias = llama && json_is_true(json_object_get(root, "mlp_bias"));
    m->qk_norm = qwen3 || m->gemma;
    return OSP_OK;
}

/* ---------- the tensor plan ---------- */

/* Append an entry named `name`; matrices are quantized with (bits, group)
 * when bits > 0. Columns that do not split into groups are an error, or,
 * with `optional`, leave the matrix dense (mlx-lm's predicate). */
static osp_status plan_push(synth_plan *p, int cap, synth_kind kind, int64_t nexp, int64_t rows,
                            int64_t cols, int bits, int group, int optional, const char *name) {
    OSP_ASSERT(p->n_e < cap);
    synth_entry *e = &p->e[p->n_e++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->nexp = nexp;
    e->rows = rows;
    e->cols = cols;
    e->bits = kind == SYN_MAT ? bits : 0;
    e->group = group;
    e->hash = e->hash2 = fnv1a(e->name);
    e->split = rows;
    if (e->bits && cols % group) {
        if (!optional)
            return osp_err(OSP_ERR_INVALID, "%s: %lld input columns are not a multiple of the "
                           "group size %d", e->name, (long long)cols, group);
        e->bits = 0;
    }
    e->quant = e->bits > 0;
    return OSP_OK;
}

static osp_status plan_add(synth_plan *p, int cap, synth_kind kind, int64_t rows, int64_t cols,
                           const char *fmt, int layer) {
    char name[SYNTH_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    return plan_push(p, cap, kind, 0, rows, cols, p->bits, p->group, 0, name);
}

enum { G4_OPT = 1, G4_ROUTER = 2 };

/* A Gemma 4 entry named by printf(fmt, ...). G4_OPT: stays dense when its
 * columns do not split into groups; G4_ROUTER: 8-bit, group 64 (mlx-lm's
 * Gemma 4 predicate), recorded as a per-module override. */
static osp_status g4_add(synth_plan *p, int cap, synth_kind kind, int64_t nexp, int64_t rows,
                         int64_t cols, int flags, const char *fmt, ...) {
    char name[SYNTH_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int bits = p->bits, group = p->group;
    if (flags & G4_ROUTER) bits = bits ? 8 : 0, group = 64;
    OSP_TRY(plan_push(p, cap, kind, nexp, rows, cols, bits, group, flags & (G4_OPT | G4_ROUTER),
                      name));
    const synth_entry *e = &p->e[p->n_e - 1];
    if ((flags & G4_ROUTER) && e->quant) {
        if (!p->qover && !(p->qover = json_object())) return osp_err(OSP_ERR_NOMEM, "out of memory");
        char mod[SYNTH_NAME_MAX];
        snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - strlen(".weight")), name);
        json_object_set_new(p->qover, mod, json_pack("{s:i, s:i}", "bits", 8, "group_size", 64));
    }
    return OSP_OK;
}

/* The tensors osp_gemma4_bind binds, with HF names. Experts: the HF fused
 * layout (gate_up_proj [E, 2·Im, H], down_proj [E, H, Im]) in bf16, MLX's
 * switch_glu layout when quantized; both draw the same rows. */
static osp_status plan_build_gemma4(const synth_model *m, synth_plan *p) {
    const osp_config *c = &m->g4;
    const int cap = 8 + 40 * c->n_layers;
    p->e = osp_calloc(OSP_POOL_MISC, (size_t)cap * sizeof *p->e);
    p->slot = osp_calloc(OSP_POOL_MISC, (size_t)cap * 3 * sizeof *p->slot);
    if (!p->e || !p->slot) return osp_err(OSP_ERR_NOMEM, "out of memory");
    const int64_t H = c->hidden, L = c->n_layers, P = c->ple_dim, E = c->n_experts,
                  Im = c->moe_intermediate;
    OSP_TRY(g4_add(p, cap, SYN_MAT, 0, c->vocab, H, 0, "model.embed_tokens.weight"));
    if (P) {
        OSP_TRY(g4_add(p, cap, SYN_MAT, 0, c->ple_vocab, L * P, G4_OPT,
                       "model.embed_tokens_per_layer.weight"));
        OSP_TRY(g4_add(p, cap, SYN_MAT, 0, L * P, H, G4_OPT,
                       "model.per_layer_model_projection.weight"));
        OSP_TRY(g4_add(p, cap, SYN_NORM, 0, P, 0, 0, "model.per_layer_projection_norm.weight"));
    }
    for (int i = 0; i < (int)L; i++) {
        const int64_t D = c->layer_head_dim[i], Q = c->n_heads * D, KV = c->layer_kv_heads[i] * D;
        const int own_kv = c->layer_kv_donor[i] < 0, full = !c->layer_sliding[i];
        const int64_t I = m->double_wide && !own_kv ? 2 * c->intermediate : c->intermediate;
#define G4(kind, nexp, rows, cols, flags, what) \
    OSP_TRY(g4_add(p, cap, kind, nexp, rows, cols, flags, "model.layers.%d." what, i))
        G4(SYN_NORM, 0, H, 0, 0, "input_layernorm.weight");
        G4(SYN_MAT, 0, Q, H, 0, "self_attn.q_proj.weight");
        G4(SYN_NORM, 0, D, 0, 0, "self_attn.q_norm.weight");
        if (own_kv) {
            G4(SYN_MAT, 0, KV, H, 0, "self_attn.k_proj.weight");
            G4(SYN_NORM, 0, D, 0, 0, "self_attn.k_norm.weight");
            if (!(c->k_eq_v && full)) G4(SYN_MAT, 0, KV, H, 0, "self_attn.v_proj.weight");
        }
        G4(SYN_MAT, 0, H, Q, 0, "self_attn.o_proj.weight");
        G4(SYN_NORM, 0, H, 0, 0, "post_attention_layernorm.weight");
        G4(SYN_NORM, 0, H, 0, 0, "pre_feedforward_layernorm.weight");
        G4(SYN_MAT, 0, I, H, 0, "mlp.gate_proj.weight");
        G4(SYN_MAT, 0, I, H, 0, "mlp.up_proj.weight");
        G4(SYN_MAT, 0, H, I, 0, "mlp.down_proj.weight");
        G4(SYN_NORM, 0, H, 0, 0, "post_feedforward_layernorm.weight");
        if (c->moe) {
            G4(SYN_NORM, 0, H, 0, 0, "pre_feedforward_layernorm_2.weight");
            G4(SYN_NORM, 0, H, 0, 0, "post_feedforward_layernorm_1.weight");
            G4(SYN_NORM, 0, H, 0, 0, "post_feedforward_layernorm_2.weight");
            G4(SYN_NORM, 0, H, 0, 0, "router.scale");
            G4(SYN_NORM, 0, E, 0, 0, "router.per_expert_scale");
            G4(SYN_MAT, 0, E, H, G4_ROUTER, "router.proj.weight");
            char gate[SYNTH_NAME_MAX], up[SYNTH_NAME_MAX], down[SYNTH_NAME_MAX];
            snprintf(gate, sizeof gate, "model.layers.%d.experts.gate_proj", i);
            snprintf(up, sizeof up, "model.layers.%d.experts.up_proj", i);
            snprintf(down, sizeof down, "model.layers.%d.experts.down_proj", i);
            if (p->bits) {
                G4(SYN_MAT, E, Im, H, 0, "experts.switch_glu.gate_proj.weight");
                p->e[p->n_e - 1].hash = p->e[p->n_e - 1].hash2 = fnv1a(gate);
                G4(SYN_MAT, E, Im, H, 0, "experts.switch_glu.up_proj.weight");
                p->e[p->n_e - 1].hash = p->e[p->n_e - 1].hash2 = fnv1a(up);
                G4(SYN_MAT, E, H, Im, 0, "experts.switch_glu.down_proj.weight");
            } else {
                G4(SYN_MAT, E, 2 * Im, H, 0, "experts.gate_up_proj");
                synth_entry *gu = &p->e[p->n_e - 1];
                gu->hash = fnv1a(gate);
                gu->hash2 = fnv1a(up);
                gu->split = Im;
                G4(SYN_MAT, E, H, Im, 0, "experts.down_proj");
            }
            p->e[p->n_e - 1].hash = p->e[p->n_e - 1].hash2 = fnv1a(down);
        }
        if (P) {
            G4(SYN_MAT, 0, P, H, G4_OPT, "per_layer_input_gate.weight");
            G4(SYN_MAT, 0, H, P, G4_OPT, "per_layer_projection.weight");
            G4(SYN_NORM, 0, H, 0, 0, "post_per_layer_input_norm.weight");
        }
        G4(SYN_NORM, 0, 1, 0, 0, "layer_scalar");
#undef G4
    }
    OSP_TRY(g4_add(p, cap, SYN_NORM, 0, H, 0, 0, "model.norm.weight"));
    if (!m->tied) OSP_TRY(g4_add(p, cap, SYN_MAT, 0, c->vocab, H, 0, "lm_head.weight"));
    return OSP_OK;
}

static osp_status plan_build(const synth_model *m, synth_plan *p) {
    if (m->gemma4) return plan_build_gemma4(m, p);
    const int per_layer = 20, cap = 4 + per_layer * (int)m->layers;
    p->e = osp_calloc(OSP_POOL_MISC, (size_t)cap * sizeof *p->e);
    p->slot = osp_calloc(OSP_POOL_MISC, (size_t)cap * 3 * sizeof *p->slot);
    if (!p->e || !p->slot) return osp_err(OSP_ERR_NOMEM, "out of memory");
    const int64_t H = m->hidden, I = m->inter, q = m->heads * m->head_dim,
                  kv = m->kv_heads * m->head_dim;
    OSP_TRY(plan_add(p, cap, SYN_MAT, m->vocab, H, "model.embed_tokens.weight", 0));
    for (int i = 0; i < (int)m->layers; i++) {
        OSP_TRY(plan_add(p, cap, SYN_NORM, H, 0, "model.layers.%d.input_layernorm.weight", i));
        static const char *qkv[3] = {"q", "k", "v"};
        for (int j = 0; j < 3; j++) {
            char f[SYNTH_NAME_MAX];
            int64_t out = j == 0 ? q : kv;
            snprintf(f, sizeof f, "model.layers.%%d.self_attn.%s_proj.weight", qkv[j]);
            OSP_TRY(plan_add(p, cap, SYN_MAT, out, H, f, i));
            snprintf(f, sizeof f, "model.layers.%%d.self_attn.%s_proj.bias", qkv[j]);
            if (m->qkv_bias) OSP_TRY(plan_add(p, cap, SYN_BIAS, out, 0, f, i));
        }
        OSP_TRY(plan_add(p, cap, SYN_MAT, H, q, "model.layers.%d.self_attn.o_proj.weight", i));
        if (m->o_bias)
            OSP_TRY(plan_add(p, cap, SYN_BIAS, H, 0, "model.layers.%d.self_attn.o_proj.bias", i));
        if (m->qk_norm) {
            OSP_TRY(plan_add(p, cap, SYN_NORM, m->head_dim, 0,
                             "model.layers.%d.self_attn.q_norm.weight", i));
            OSP_TRY(plan_add(p, cap, SYN_NORM, m->head_dim, 0,
                             "model.layers.%d.self_attn.k_norm.weight", i));
        }
        OSP_TRY(plan_add(p, cap, SYN_NORM, H, 0, "model.layers.%d.post_attention_layernorm.weight",
                         i));
        if (m->gemma) {
            OSP_TRY(plan_add(p, cap, SYN_NORM, H, 0,
                             "model.layers.%d.pre_feedforward_layernorm.weight", i));
            OSP_TRY(plan_add(p, cap, SYN_NORM, H, 0,
                             "model.layers.%d.post_feedforward_layernorm.weight", i));
        }
        static const char *mlp[3] = {"gate", "up", "down"};
        for (int j = 0; j < 3; j++) {
            char f[SYNTH_NAME_MAX];
            int64_t out = j < 2 ? I : H, in = j < 2 ? H : I;
            snprintf(f, sizeof f, "model.layers.%%d.mlp.%s_proj.weight", mlp[j]);
            OSP_TRY(plan_add(p, cap, SYN_MAT, out, in, f, i));
            snprintf(f, sizeof f, "model.layers.%%d.mlp.%s_proj.bias", mlp[j]);
            if (m->mlp_bias) OSP_TRY(plan_add(p, cap, SYN_BIAS, out, 0, f, i));
        }
    }
    OSP_TRY(plan_add(p, cap, SYN_NORM, H, 0, "model.norm.weight", 0));
    if (!m->tied) OSP_TRY(plan_add(p, cap, SYN_MAT, m->vocab, H, "lm_head.weight", 0));
    return OSP_OK;
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
    const synth_model *m;
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
    float mean, std;
    synth_params(j->m, e->kind, &mean, &std);
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
    const synth_model *m;
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
        float mean, std;
        synth_params(c->m, e->kind, &mean, &std);
        synth_gen(p->seed, e->hash, 0, mean, std, v, e->rows);
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
    synth_job j = {.p = p, .m = c->m, .e = e, .r0 = row0, .nr = nrows, .buf = buf};
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
    osp_free(p->e);
    osp_free(p->slot);
    json_decref(p->qover);
}

/* ---------- command line ---------- */

static void synth_usage(FILE *f) {
    fprintf(f,
            "usage: osprey synth (--preset NAME | --config FILE) --out DIR\n"
            "                    [--dtype bf16|q2|q3|q4|q5|q6|q8] [--seed S] [--threads N]\n"
            "Writes DIR/config.json and DIR/model.safetensors with random weights.\n"
            "presets: llama-3.2-1b, qwen3-0.6b, gemma-3-1b, gemma-4-e2b, gemma-4-26b-a4b,\n"
            "         tiny-llama\n"
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

    json_t *cfg = NULL;
    if (a.preset) {
        cfg = preset_config(a.preset);
        if (!cfg)
            return synth_fail("unknown preset '%s' (llama-3.2-1b, qwen3-0.6b, gemma-3-1b, "
                              "gemma-4-e2b, gemma-4-26b-a4b, tiny-llama)", a.preset);
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
    synth_model m = {0};
    synth_plan p = {.bits = bits, .group = group, .seed = a.seed};
    osp_st_writer *w = osp_st_writer_new();
    char path[4200];
    osp_status st = w ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    if (st == OSP_OK) st = parse_model(cfg, &m);
    if (st == OSP_OK) st = plan_build(&m, &p);
    if (st == OSP_OK) st = plan_declare(&p, w);
    if (st == OSP_OK) st = osp_st_writer_set_meta(w, "format", bits ? "mlx" : "pt");
    if (st == OSP_OK) st = synth_mkdir(a.out);
    if (st == OSP_OK) st = synth_write_config(cfg, bits, group, p.qover, a.out);
    if (st == OSP_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", a.out);
        synth_fill_ctx fc = {&p, &m};
        st = osp_st_writer_write(w, path, synth_fill, &fc);
    }
    if (st == OSP_OK)
        printf("wrote %s: %s %s%d, %lld tensors, %.1f MB in %.1f s\n", a.out, m.model_type,
               bits ? "q" : "bf", bits ? bits : 16, (long long)osp_st_writer_count(w), osp_st_writer_data_bytes(w) / 1e6,
               osp_now_s() - t0);
    else
        fprintf(stderr, "osprey synth: %s\n", osp_last_error());
    plan_free(&p);
    if (m.gemma4) osp_config_free(&m.g4);
    osp_st_writer_free(w);
    json_decref(cfg);
    return st == OSP_OK ? 0 : 1;
}
