/* Model loading: resolve the folder, parse config.json, bind every tensor
 * the architecture needs (checking names, dtypes and shapes), and fill
 * osp_model_info. Quantization per module follows mlx-lm: an explicit
 * entry in config "quantization" wins (false = dense), otherwise a module
 * is quantized with the defaults iff <path>.scales exists. */
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/fs.h"
#include "model.h"

/* A model folder, or a Hugging Face cache repo folder resolved to its snapshot. */
static osp_status resolve_dir(const char *path, char *out, size_t n) {
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", path);
    if (osp_is_file(p)) {
        snprintf(out, n, "%s", path);
        return OSP_OK;
    }
    if (osp_hf_snapshot(path, out, n)) return OSP_OK;
    if (!osp_is_dir(path)) return osp_err(OSP_ERR_IO, "%s: no such model folder", path);
    return osp_err(OSP_ERR_IO, "%s: no config.json (not a model folder or Hugging Face cache repo)", path);
}

/* Weight-name prefix of the text model ("model." for text checkpoints). */
static const char *PREFIXES[] = {"model.", "model.language_model.", "language_model.model."};
static const char *HEADS[] = {"lm_head", "lm_head", "language_model.lm_head"};

float *osp_bind_vec(osp_model *m, const char *name, int64_t n, int required, osp_status *rc) {
    if (*rc != OSP_OK) return NULL;
    const osp_st_tensor *t = osp_st_find(m->st, name);
    if (!t) {
        if (required) *rc = osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, name);
        return NULL;
    }
    if ((t->dtype != OSP_DT_F32 && t->dtype != OSP_DT_F16 && t->dtype != OSP_DT_BF16) || t->numel != n) {
        *rc = osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' has dtype %s and %lld elements; expected a float vector of %lld",
                      m->st->files[t->file].path, name, osp_dtype_name(t->dtype), (long long)t->numel, (long long)n);
        return NULL;
    }
    float *v = osp_malloc(OSP_POOL_WEIGHTS, (size_t)n * sizeof(float));
    if (!v) {
        *rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) v[i] = osp_load_float(t->data, t->dtype, i);
    m->info.weight_bytes += (int64_t)t->nbytes;
    m->info.n_params += n;
    return v;
}

/* Quantization declared for module `path`: returns bits (0 = dense). */
static osp_status quant_for(osp_model *m, const char *path, int *bits, int *group) {
    char key[512];
    *bits = 0;
    *group = 0;
    json_t *ov = m->cfg.quant ? json_object_get(m->cfg.quant, path) : NULL;
    if (ov && json_is_false(ov)) return OSP_OK;
    snprintf(key, sizeof key, "%s.scales", path);
    if (!ov && !osp_st_find(m->st, key)) return OSP_OK;
    if (!m->cfg.quant && !ov)
        return osp_err(OSP_ERR_FORMAT, "%s: '%s' looks quantized but config.json declares no quantization",
                       m->dir, key);
    *bits = m->cfg.q_bits;
    *group = m->cfg.q_group;
    if (json_is_object(ov)) {
        json_t *b = json_object_get(ov, "bits"), *g = json_object_get(ov, "group_size");
        if (json_is_integer(b)) *bits = (int)json_integer_value(b);
        if (json_is_integer(g)) *group = (int)json_integer_value(g);
    }
    if (*bits != 2 && *bits != 3 && *bits != 4 && *bits != 5 && *bits != 6 && *bits != 8)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: '%s': %d-bit quantization is not supported", m->dir, path, *bits);
    if (*group != 32 && *group != 64 && *group != 128)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: '%s': quantization group size %d is not supported", m->dir, path, *group);
    return OSP_OK;
}

static osp_status need(osp_model *m, const char *name, const osp_st_tensor **t) {
    *t = osp_st_find(m->st, name);
    if (!*t) return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, name);
    return OSP_OK;
}

static osp_status shape_err(osp_model *m, const osp_st_tensor *t, const char *what) {
    return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' has dtype %s shape [%lld%s%lld]; expected %s",
                   m->st->files[t->file].path, t->name, osp_dtype_name(t->dtype), (long long)t->shape[0],
                   t->ndim > 1 ? ", " : "", t->ndim > 1 ? (long long)t->shape[1] : 0LL, what);
}

/* Bind module `path` (no .weight suffix) as W[rows, cols]. */
osp_status osp_bind_linear(osp_model *m, const char *path, int64_t rows, int64_t cols, osp_weight *w) {
    char name[512], what[128];
    int bits, group;
    OSP_TRY(quant_for(m, path, &bits, &group));
    memset(w, 0, sizeof *w);
    w->rows = rows;
    w->cols = cols;
    const osp_st_tensor *t;
    snprintf(name, sizeof name, "%s.weight", path);
    OSP_TRY(need(m, name, &t));
    if (!bits) {
        snprintf(what, sizeof what, "a float matrix [%lld, %lld]", (long long)rows, (long long)cols);
        if ((t->dtype != OSP_DT_F32 && t->dtype != OSP_DT_F16 && t->dtype != OSP_DT_BF16) || t->ndim != 2 ||
            t->shape[0] != rows || t->shape[1] != cols)
            return shape_err(m, t, what);
        w->dtype = t->dtype;
        w->data = t->data;
        m->info.weight_bytes += (int64_t)t->nbytes;
        m->info.n_params += rows * cols;
        return OSP_OK;
    }
    if (cols % group != 0 || (cols * bits) % 32 != 0)
        return osp_err(OSP_ERR_FORMAT, "%s: '%s': %lld columns do not split into %d-bit groups of %d",
                       m->dir, path, (long long)cols, bits, group);
    snprintf(what, sizeof what, "U32 codes [%lld, %lld] (%d-bit)", (long long)rows, (long long)(cols * bits / 32), bits);
    if (t->dtype != OSP_DT_U32 || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols * bits / 32)
        return shape_err(m, t, what);
    w->dtype = OSP_DT_U32;
    w->data = t->data;
    w->qbits = bits;
    w->group = group;
    m->info.weight_bytes += (int64_t)t->nbytes;
    const char *suffix[2] = {"scales", "biases"};
    for (int i = 0; i < 2; i++) {
        const osp_st_tensor *s;
        snprintf(name, sizeof name, "%s.%s", path, suffix[i]);
        OSP_TRY(need(m, name, &s));
        snprintf(what, sizeof what, "float [%lld, %lld] (group %d)", (long long)rows, (long long)(cols / group), group);
        if ((s->dtype != OSP_DT_F32 && s->dtype != OSP_DT_F16 && s->dtype != OSP_DT_BF16) || s->ndim != 2 ||
            s->shape[0] != rows || s->shape[1] != cols / group || (i == 1 && s->dtype != w->sdtype))
            return shape_err(m, s, what);
        w->sdtype = s->dtype;
        if (i == 0) w->scales = s->data;
        else w->biases = s->data;
        m->info.weight_bytes += (int64_t)s->nbytes;
    }
    m->info.n_params += rows * cols;
    return OSP_OK;
}

static int64_t weight_bytes(const osp_weight *w) { return w->rows * osp_weight_row_bytes(w); }

static osp_status bind_layer(osp_model *m, const char *pre, int i, osp_layer *L) {
    const osp_config *c = &m->cfg;
    char p[512], n[512];
    int64_t H = c->hidden, D = c->head_dim, q = (int64_t)c->n_heads * D, kv = (int64_t)c->n_kv_heads * D;
    osp_status rc = OSP_OK;
#define LP(fmt) (snprintf(p, sizeof p, "%slayers.%d." fmt, pre, i), p)
#define VEC(fmt, len, req) (snprintf(n, sizeof n, "%slayers.%d." fmt, pre, i), osp_bind_vec(m, n, len, req, &rc))
    OSP_TRY(osp_bind_linear(m, LP("self_attn.q_proj"), q, H, &L->wq));
    OSP_TRY(osp_bind_linear(m, LP("self_attn.k_proj"), kv, H, &L->wk));
    OSP_TRY(osp_bind_linear(m, LP("self_attn.v_proj"), kv, H, &L->wv));
    OSP_TRY(osp_bind_linear(m, LP("self_attn.o_proj"), H, q, &L->wo));
    OSP_TRY(osp_bind_linear(m, LP("mlp.gate_proj"), c->intermediate, H, &L->wg));
    OSP_TRY(osp_bind_linear(m, LP("mlp.up_proj"), c->intermediate, H, &L->wu));
    OSP_TRY(osp_bind_linear(m, LP("mlp.down_proj"), H, c->intermediate, &L->wd));
    L->attn_norm = VEC("input_layernorm.weight", H, 1);
    if (c->sandwich_norm) {
        L->post_attn_norm = VEC("post_attention_layernorm.weight", H, 1);
        L->mlp_norm = VEC("pre_feedforward_layernorm.weight", H, 1);
        L->post_mlp_norm = VEC("post_feedforward_layernorm.weight", H, 1);
    } else {
        L->mlp_norm = VEC("post_attention_layernorm.weight", H, 1);
    }
    if (c->qk_norm) {
        L->q_norm = VEC("self_attn.q_norm.weight", D, 1);
        L->k_norm = VEC("self_attn.k_norm.weight", D, 1);
    }
    if (c->qkv_bias) {
        L->bq = VEC("self_attn.q_proj.bias", q, 1);
        L->bk = VEC("self_attn.k_proj.bias", kv, 1);
        L->bv = VEC("self_attn.v_proj.bias", kv, 1);
    }
    if (c->o_bias) L->bo = VEC("self_attn.o_proj.bias", H, 1);
    if (c->mlp_bias) {
        L->bg = VEC("mlp.gate_proj.bias", c->intermediate, 1);
        L->bu = VEC("mlp.up_proj.bias", c->intermediate, 1);
        L->bd = VEC("mlp.down_proj.bias", H, 1);
    }
#undef LP
#undef VEC
    L->intermediate = c->intermediate;
    L->layer_scalar = 1.0f;
    if (rc == OSP_OK) {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd};
        for (int j = 0; j < 7; j++) m->info.decode_bytes += weight_bytes(ws[j]);
    }
    return rc;
}

static osp_status bind_all(osp_model *m) {
    const osp_config *c = &m->cfg;
    char n[512];
    int pi = -1;
    for (int i = 0; i < 3 && pi < 0; i++) {
        snprintf(n, sizeof n, "%sembed_tokens.weight", PREFIXES[i]);
        if (osp_st_find(m->st, n)) pi = i;
    }
    if (pi < 0) return osp_err(OSP_ERR_FORMAT, "%s: tensor 'model.embed_tokens.weight' is missing", m->dir);
    const char *pre = PREFIXES[pi];
    snprintf(n, sizeof n, "%sembed_tokens", pre);
    OSP_TRY(osp_bind_linear(m, n, c->vocab, c->hidden, &m->embed));
    if (c->tie_embeddings) {
        m->head = m->embed;
    } else {
        OSP_TRY(osp_bind_linear(m, HEADS[pi], c->vocab, c->hidden, &m->head));
    }
    m->info.decode_bytes += weight_bytes(&m->head);
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (c->arch == OSP_ARCH_GEMMA4) OSP_TRY(osp_gemma4_bind(m, pre));
    else
        for (int i = 0; i < c->n_layers; i++) OSP_TRY(bind_layer(m, pre, i, &m->layers[i]));
    osp_status rc = OSP_OK;
    snprintf(n, sizeof n, "%snorm.weight", pre);
    m->final_norm = osp_bind_vec(m, n, c->hidden, 1, &rc);
    return rc;
}

static void fill_info(osp_model *m) {
    const osp_config *c = &m->cfg;
    osp_model_info *in = &m->info;
    in->architecture = c->architecture;
    in->model_type = c->model_type;
    in->n_layers = c->n_layers;
    in->hidden = c->hidden;
    in->n_heads = c->n_heads;
    in->n_kv_heads = c->n_kv_heads;
    in->head_dim = c->head_dim;
    in->intermediate = c->intermediate;
    in->vocab = c->vocab;
    in->max_ctx = c->max_pos;
    in->sliding_window = c->sliding_window;
    in->dir = m->dir;
    in->eos_ids = c->eos_ids;
    in->n_eos = c->n_eos;
    in->bos_id = c->bos_id;
    for (int i = 0; i < c->n_layers; i++) {
        in->n_sliding_layers += c->layer_sliding[i];
        if (c->layer_kv_donor[i] >= 0) { /* shares its donor's cache */
            in->n_kv_shared_layers++;
            continue;
        }
        int64_t per_layer = 2LL * c->layer_kv_heads[i] * c->layer_head_dim[i] * (int64_t)sizeof(float);
        if (c->layer_sliding[i]) {
            in->kv_bytes_sliding += per_layer * c->sliding_window;
        } else {
            in->kv_bytes_per_token += per_layer;
        }
    }
    const osp_weight *probe = &m->layers[0].wq;
    in->quant_bits = probe->qbits;
    in->quant_group = probe->group;
    snprintf(m->dtype_name, sizeof m->dtype_name, "%s",
             osp_dtype_name(probe->qbits ? probe->sdtype : probe->dtype));
    in->dtype = m->dtype_name;
}

/* Gemma's embedding scale: the f32 value of sqrt(dim), as the reference's
 * scale buffer holds it (torch.tensor(dim ** 0.5)); not rounded to the
 * embedding's dtype (docs/NOTES.md, "Reference numerics"). */
static float embed_scale(float dim) { return (float)sqrt((double)dim); }

osp_status osp_model_load(const char *path, osp_model **out) {
    *out = NULL;
    osp_err_clear();
    char dir[4096], cfgp[4200];
    OSP_TRY(resolve_dir(path, dir, sizeof dir));
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_err(OSP_ERR_NOMEM, "out of memory");
    m->dir = strdup(dir);
    pthread_mutex_init(&m->place_mu, NULL);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    osp_status rc = osp_config_load(cfgp, &m->cfg);
    if (rc == OSP_OK) rc = osp_st_open_dir(dir, &m->st);
    if (rc == OSP_OK) rc = bind_all(m);
    if (rc == OSP_OK) {
        const osp_config *c = &m->cfg;
        m->ops = osp_ops_get();
        m->embed_scale = c->embed_scaled ? embed_scale((float)c->hidden) : 1.0f;
        if (c->ple_dim) m->embed_ple_scale = embed_scale((float)c->ple_dim);
        /* RoPE tables per layer type, sized by that type's head_dim */
        int32_t d_full = c->head_dim, d_slide = c->head_dim;
        for (int i = c->n_layers - 1; i >= 0; i--) {
            if (c->layer_sliding[i]) d_slide = c->layer_head_dim[i];
            else d_full = c->layer_head_dim[i];
        }
        for (int i = 0; i < c->n_layers && rc == OSP_OK; i++)
            if (c->layer_head_dim[i] != (c->layer_sliding[i] ? d_slide : d_full))
                rc = osp_err(OSP_ERR_UNSUPPORTED, "%s: layers of one attention type with different head_dim", m->dir);
        m->inv_freq_full = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * (size_t)d_full / 2);
        m->inv_freq_sliding = osp_malloc(OSP_POOL_WEIGHTS, sizeof(float) * (size_t)d_slide / 2);
        if (rc != OSP_OK) {
        } else if (!m->inv_freq_full || !m->inv_freq_sliding) {
            rc = osp_err(OSP_ERR_NOMEM, "out of memory");
        } else {
            osp_rope_inv_freq(&c->rope_full, d_full, m->inv_freq_full);
            osp_rope_inv_freq(&c->rope_sliding, d_slide, m->inv_freq_sliding);
            fill_info(m);
        }
    }
    if (rc != OSP_OK) {
        osp_model_free(m);
        return rc;
    }
    *out = m;
    return OSP_OK;
}

void osp_model_free(osp_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int i = 0; i < m->cfg.n_layers; i++) {
            osp_layer *L = &m->layers[i];
            float *v[] = {L->attn_norm, L->post_attn_norm, L->mlp_norm, L->post_mlp_norm, L->q_norm, L->k_norm,
                          L->bq, L->bk, L->bv, L->bo, L->bg, L->bu, L->bd, L->post_ple_norm, L->mlp_norm2,
                          L->post_mlp_norm1, L->post_mlp_norm2, L->router_scale, L->per_expert_scale};
            for (size_t j = 0; j < sizeof v / sizeof *v; j++) osp_free(v[j]);
            free(L->ex_gate);
            free(L->ex_up);
            free(L->ex_down);
        }
        free(m->layers);
    }
    osp_free(m->final_norm);
    osp_free(m->packed);
    pthread_mutex_destroy(&m->place_mu);
    osp_free(m->ple_proj_norm);
    osp_free(m->inv_freq_full);
    osp_free(m->inv_freq_sliding);
    osp_st_close(m->st);
    osp_config_free(&m->cfg);
    free(m->dir);
    free(m);
}

const osp_model_info *osp_model_get_info(const osp_model *m) { return &m->info; }
