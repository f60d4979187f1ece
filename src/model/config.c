#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "arch.h"
#include "config.h"
#include "core/json_get.h"
#include "tensor/tensor.h"

#define get_int osp_json_int
#define get_num osp_json_num
#define get_str osp_json_str

/* Parse one rope parameter object (rope_parameters or rope_scaling form). */
static osp_status parse_rope(json_t *o, const char *path, float theta_def, osp_rope *r) {
    r->type = OSP_ROPE_DEFAULT;
    r->theta = theta_def;
    r->factor = 1.0f;
    r->partial = 1.0f;
    if (!o || json_is_null(o)) return OSP_OK;
    if (!json_is_object(o)) return osp_err(OSP_ERR_FORMAT, "%s: rope parameters are not an object", path);
    r->theta = (float)get_num(o, "rope_theta", theta_def);
    const char *t = get_str(o, "rope_type");
    if (!t) t = get_str(o, "type");
    if (!t || strcmp(t, "default") == 0) {
        r->type = OSP_ROPE_DEFAULT;
    } else if (strcmp(t, "linear") == 0) {
        r->type = OSP_ROPE_LINEAR;
    } else if (strcmp(t, "proportional") == 0) {
        r->type = OSP_ROPE_PROPORTIONAL;
    } else if (strcmp(t, "llama3") == 0) {
        r->type = OSP_ROPE_LLAMA3;
        r->low_freq_factor = get_num(o, "low_freq_factor", 1.0);
        r->high_freq_factor = get_num(o, "high_freq_factor", 4.0);
        r->orig_max_pos = get_int(o, "original_max_position_embeddings", 8192);
        if (r->high_freq_factor == r->low_freq_factor)
            return osp_err(OSP_ERR_FORMAT, "%s: llama3 rope needs high_freq_factor != low_freq_factor", path);
    } else {
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: rope type '%s' is not supported", path, t);
    }
    r->factor = (float)get_num(o, "factor", 1.0);
    if (r->factor <= 0) return osp_err(OSP_ERR_FORMAT, "%s: rope factor must be positive", path);
    r->partial = get_num(o, "partial_rotary_factor", 1.0);
    if (r->partial <= 0 || r->partial > 1)
        return osp_err(OSP_ERR_FORMAT, "%s: partial_rotary_factor %g is out of range", path, r->partial);
    if (r->partial != 1.0 && r->type != OSP_ROPE_PROPORTIONAL)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported for this architecture",
                       path, r->partial);
    return OSP_OK;
}

static osp_status parse_eos(json_t *v, osp_config *c) {
    if (json_is_integer(v)) {
        c->eos_ids[c->n_eos++] = (int32_t)json_integer_value(v);
    } else if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (json_is_integer(e) && c->n_eos < OSP_MAX_EOS) c->eos_ids[c->n_eos++] = (int32_t)json_integer_value(e);
        }
    }
    return OSP_OK;
}

static osp_status pick_arch(json_t *root, json_t *tc, const char *path, osp_config *c) {
    const char *name = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
    const char *mt = get_str(tc, "model_type");
    if (!mt) mt = get_str(root, "model_type");
    snprintf(c->model_type, sizeof c->model_type, "%s", mt ? mt : "");
    const char *canonical = NULL;
    c->arch = osp_arch_find(name, mt, &canonical);
    if (!c->arch)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: architecture '%s' (model_type '%s') is not supported", path,
                       name ? name : "?", mt ? mt : "?");
    snprintf(c->architecture, sizeof c->architecture, "%s", canonical);
    return OSP_OK;
}

static osp_status parse_quant(json_t *root, const char *path, osp_config *c) {
    json_t *q = json_object_get(root, "quantization");
    if (!q) q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q)) return OSP_OK;
    if (!json_is_object(q)) return osp_err(OSP_ERR_FORMAT, "%s: quantization is not an object", path);
    const char *mode = get_str(q, "mode");
    if (mode && strcmp(mode, "affine") != 0)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: quantization mode '%s' is not supported (only MLX affine)", path, mode);
    if (!json_object_get(q, "bits") && get_str(q, "quant_method"))
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: quantization method '%s' is not supported (only MLX affine)",
                       path, get_str(q, "quant_method"));
    c->q_bits = get_int(q, "bits", 4);
    c->q_group = get_int(q, "group_size", 64);
    c->quant = json_incref(q);
    return OSP_OK;
}

static osp_status parse_layers(json_t *tc, const char *path, osp_config *c) {
    c->layer_sliding = calloc((size_t)c->n_layers, 1);
    if (!c->layer_sliding) return osp_err(OSP_ERR_NOMEM, "out of memory");
    json_t *lt = json_object_get(tc, "layer_types");
    if (json_is_array(lt)) {
        if ((int)json_array_size(lt) != c->n_layers)
            return osp_err(OSP_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", path,
                           json_array_size(lt), c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const char *s = json_string_value(json_array_get(lt, i));
            if (s && strcmp(s, "sliding_attention") == 0) c->layer_sliding[i] = 1;
            else if (!s || strcmp(s, "full_attention") != 0)
                return osp_err(OSP_ERR_UNSUPPORTED, "%s: layer type '%s' is not supported", path, s ? s : "?");
        }
    } else if (c->arch->sliding_pattern) {
        int pat = get_int(tc, "sliding_window_pattern", get_int(tc, "_sliding_window_pattern", 6));
        for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = pat > 0 && (i + 1) % pat != 0;
    } else if (json_is_true(json_object_get(tc, "use_sliding_window"))) {
        int mw = get_int(tc, "max_window_layers", c->n_layers);
        for (int i = mw; i < c->n_layers; i++) c->layer_sliding[i] = 1;
    }
    if (c->arch->last_layer_full) c->layer_sliding[c->n_layers - 1] = 0; /* as HF does */
    int any = 0;
    for (int i = 0; i < c->n_layers; i++) any |= c->layer_sliding[i];
    c->sliding_window = any ? get_int(tc, "sliding_window", 0) : 0;
    if (any && c->sliding_window <= 0)
        return osp_err(OSP_ERR_FORMAT, "%s: sliding layers but no positive sliding_window", path);
    return OSP_OK;
}

static osp_status parse_ropes(json_t *tc, const char *path, osp_config *c) {
    json_t *rp = json_object_get(tc, "rope_parameters");
    float theta = (float)get_num(tc, "rope_theta", 10000.0);
    if (json_is_object(rp) && (json_object_get(rp, "full_attention") || json_object_get(rp, "sliding_attention"))) {
        OSP_TRY(parse_rope(json_object_get(rp, "full_attention"), path, theta, &c->rope_full));
        json_t *sl = json_object_get(rp, "sliding_attention");
        OSP_TRY(parse_rope(sl ? sl : json_object_get(rp, "full_attention"), path, theta, &c->rope_sliding));
        return OSP_OK;
    }
    json_t *rs = json_is_object(rp) ? rp : json_object_get(tc, "rope_scaling");
    OSP_TRY(parse_rope(rs, path, theta, &c->rope_full));
    if (json_is_object(rs) && !json_object_get(rs, "rope_theta")) c->rope_full.theta = theta;
    c->rope_sliding = c->rope_full;
    if (c->arch->local_rope_base) { /* older configs: a local base for sliding layers, no scaling */
        OSP_TRY(parse_rope(NULL, path, (float)get_num(tc, "rope_local_base_freq", 10000.0), &c->rope_sliding));
    }
    return OSP_OK;
}

static osp_status parse_act(json_t *tc, const char *path, osp_config *c) {
    const char *a = get_str(tc, "hidden_activation");
    if (!a) a = get_str(tc, "hidden_act");
    if (!a) a = c->arch->act_default;
    if (strcmp(a, "silu") == 0 || strcmp(a, "swish") == 0) c->act = OSP_ACT_SILU;
    else if (strcmp(a, "gelu_pytorch_tanh") == 0 || strcmp(a, "gelu_tanh") == 0 ||
             strcmp(a, "gelu_new") == 0 || strcmp(a, "gelu_fast") == 0)
        c->act = OSP_ACT_GELU_TANH;
    else return osp_err(OSP_ERR_UNSUPPORTED, "%s: activation '%s' is not supported", path, a);
    return OSP_OK;
}

/* Per-layer geometry: every layer as the config's globals say (an
 * architecture's configure may then vary them). */
static osp_status per_layer_defaults(osp_config *c) {
    int n = c->n_layers;
    c->layer_head_dim = malloc(sizeof(int32_t) * n);
    c->layer_kv_heads = malloc(sizeof(int32_t) * n);
    c->layer_kv_donor = malloc(sizeof(int32_t) * n);
    if (!c->layer_head_dim || !c->layer_kv_heads || !c->layer_kv_donor) return osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        c->layer_head_dim[i] = c->head_dim;
        c->layer_kv_heads[i] = c->n_kv_heads;
        c->layer_kv_donor[i] = -1;
    }
    return OSP_OK;
}

static osp_status per_layer_check(const char *path, const osp_config *c) {
    for (int i = 0; i < c->n_layers; i++)
        if (c->layer_head_dim[i] <= 0 || c->layer_head_dim[i] % 2 || c->layer_kv_heads[i] <= 0 ||
            c->n_heads % c->layer_kv_heads[i])
            return osp_err(OSP_ERR_FORMAT, "%s: layer %d has head_dim %d and %d KV heads for %d query heads", path, i,
                           c->layer_head_dim[i], c->layer_kv_heads[i], c->n_heads);
    return OSP_OK;
}

osp_status osp_config_parse(json_t *root, const char *path, osp_config *c) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(root)) return osp_err(OSP_ERR_FORMAT, "%s: not a JSON object", path);
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc)) tc = root;
    OSP_TRY(pick_arch(root, tc, path, c));
    c->hidden = get_int(tc, "hidden_size", 0);
    c->n_layers = get_int(tc, "num_hidden_layers", 0);
    c->n_heads = get_int(tc, "num_attention_heads", 0);
    c->n_kv_heads = get_int(tc, "num_key_value_heads", c->n_heads);
    c->intermediate = get_int(tc, "intermediate_size", 0);
    c->vocab = get_int(tc, "vocab_size", 0);
    c->max_pos = get_int(tc, "max_position_embeddings", 2048);
    if (c->hidden <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->intermediate <= 0 || c->vocab <= 0 || c->n_heads % c->n_kv_heads != 0)
        return osp_err(OSP_ERR_FORMAT, "%s: missing or inconsistent hidden_size / num_hidden_layers / "
                       "num_attention_heads / num_key_value_heads / intermediate_size / vocab_size", path);
    c->head_dim = get_int(tc, "head_dim", c->hidden / c->n_heads);
    if (c->head_dim <= 0 || c->head_dim % 2) return osp_err(OSP_ERR_FORMAT, "%s: bad head_dim", path);
    /* per-layer tables are sized by num_hidden_layers before any tensor is looked at: a config cannot ask for
     * gigabytes of them (the fuzzer found one asking for 3 GB; the largest models have a few hundred layers) */
    if (c->n_layers > OSP_CONFIG_MAX_LAYERS)
        return osp_err(OSP_ERR_FORMAT, "%s: num_hidden_layers %d is more than %d", path, c->n_layers,
                       OSP_CONFIG_MAX_LAYERS);
    c->eps = (float)get_num(tc, "rms_norm_eps", 1e-6);
    json_t *tie = json_object_get(tc, "tie_word_embeddings");
    if (!tie) tie = json_object_get(root, "tie_word_embeddings");
    c->tie_embeddings = tie ? json_is_true(tie) : c->arch->tie_default;
    c->attn_scale = (float)pow((double)c->head_dim, -0.5); /* head_dim**-0.5, as the reference */
    if (!c->arch->own_act) OSP_TRY(parse_act(tc, path, c));
    OSP_TRY(parse_layers(tc, path, c));
    OSP_TRY(parse_ropes(tc, path, c));
    c->bos_id = get_int(tc, "bos_token_id", get_int(root, "bos_token_id", -1));
    parse_eos(json_object_get(root, "eos_token_id"), c);
    if (tc != root) parse_eos(json_object_get(tc, "eos_token_id"), c);
    OSP_TRY(parse_quant(root, path, c));
    OSP_TRY(per_layer_defaults(c));
    OSP_TRY(c->arch->configure(root, tc, path, c)); /* the architecture's own keys */
    return per_layer_check(path, c);
}

osp_status osp_config_load(const char *path, osp_config *c) {
    memset(c, 0, sizeof *c);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return osp_err(OSP_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    osp_status rc = osp_config_parse(root, path, c);
    json_decref(root);
    if (rc != OSP_OK) osp_config_free(c);
    return rc;
}

void osp_config_free(osp_config *c) {
    free(c->layer_sliding);
    free(c->layer_head_dim);
    free(c->layer_kv_heads);
    free(c->layer_kv_donor);
    c->layer_sliding = NULL;
    c->layer_head_dim = c->layer_kv_heads = c->layer_kv_donor = NULL;
    if (c->quant) json_decref(c->quant);
    c->quant = NULL;
}
