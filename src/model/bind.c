/* model/bind: binding checkpoint tensors by name, shared by the loader and
 * the architectures: dtype and shape checks with errors naming the file and
 * the tensor, MLX quantization per module (mlx-lm's rule: an explicit entry
 * in config "quantization" wins, false = dense; otherwise a module is
 * quantized with the defaults iff <path>.scales exists), and the weight
 * counts of osp_model_info. */
#include <stdlib.h>
#include <string.h>
#include "model.h"

/* The vector as host f32 (osp_malloc'd), or NULL. */
static float *read_vec(osp_model *m, const char *name, int64_t n, int required, osp_status *rc) {
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

osp_vec osp_bind_vec(osp_model *m, const char *name, int64_t n, int required, osp_status *rc) {
    float *v = read_vec(m, name, n, required, rc);
    if (!v) return NULL;
    osp_vec d = m->be->adopt_vec(v, n);
    if (!d) *rc = osp_err(OSP_ERR_NOMEM, "out of memory placing '%s'", name);
    return d;
}

float osp_bind_scalar(osp_model *m, const char *name, float def, osp_status *rc) {
    float *v = read_vec(m, name, 1, 0, rc);
    if (!v) return def;
    float x = v[0];
    osp_free(v);
    return x;
}
