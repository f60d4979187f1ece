/* model/bind: binding checkpoint tensors by name, shared by the loader and
 * the architectures: dtype and shape checks with errors naming the file and
 * the tensor, MLX quantization per module (mlx-lm's rule: an explicit entry
 * in config "quantization" wins, false = dense; otherwise a module is
 * quantized with the defaults iff <path>.scales exists), and the weight
 * counts of osp_model_info. */
#include <stdio.h>
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

static osp_status bad(osp_model *m, const char *name, const char *what) {
    return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s': %s", m->dir, name, what);
}

/* Slice expert e of a stacked dense tensor [E, rows, cols] (rows starting at r0). */
static osp_weight dense_slice(const osp_st_tensor *t, int64_t e, int64_t r0, int64_t rows, int64_t cols) {
    size_t es = osp_dtype_size(t->dtype);
    osp_weight w = {.dtype = t->dtype, .rows = rows, .cols = cols};
    w.data = (const unsigned char *)t->data + ((e * t->shape[1] + r0) * cols) * (int64_t)es;
    return w;
}

/* Experts: HF fused (experts.gate_up_proj [E, 2I, H], experts.down_proj
 * [E, H, I]) or MLX switch_glu ({gate,up,down}_proj.{weight,scales,biases}
 * stacked on a leading E axis, quantized or not). */
static osp_status bind_experts(osp_model *m, const osp_tdesc *d) {
    const char *lp = d->name;
    int64_t E = d->n_exp, I = d->rows, H = d->cols, K = d->n_used;
    char n[512];
    osp_weight *gate = calloc(E, sizeof(osp_weight)), *up = calloc(E, sizeof(osp_weight)),
               *down = calloc(E, sizeof(osp_weight));
    *d->gate = gate, *d->up = up, *d->down = down; /* freed with the model */
    if (!gate || !up || !down) return osp_err(OSP_ERR_NOMEM, "out of memory");
    snprintf(n, sizeof n, "%sexperts.gate_up_proj", lp);
    const osp_st_tensor *gu = osp_st_find(m->st, n);
    if (gu) {
        snprintf(n, sizeof n, "%sexperts.down_proj", lp);
        const osp_st_tensor *dn = osp_st_find(m->st, n);
        if (!dn) return osp_err(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", m->dir, n);
        int fl = gu->dtype == OSP_DT_BF16 || gu->dtype == OSP_DT_F16 || gu->dtype == OSP_DT_F32;
        if (!fl || gu->ndim != 3 || gu->shape[0] != E || gu->shape[1] != 2 * I || gu->shape[2] != H)
            return bad(m, gu->name, "expected a float tensor [num_experts, 2 * moe_intermediate_size, hidden]");
        if (dn->dtype != gu->dtype || dn->ndim != 3 || dn->shape[0] != E || dn->shape[1] != H || dn->shape[2] != I)
            return bad(m, dn->name, "expected a float tensor [num_experts, hidden, moe_intermediate_size]");
        for (int64_t e = 0; e < E; e++) {
            gate[e] = dense_slice(gu, e, 0, I, H); /* first half of the rows is gate */
            up[e] = dense_slice(gu, e, I, I, H);
            down[e] = dense_slice(dn, e, 0, H, I);
        }
        m->info.weight_bytes += (int64_t)(gu->nbytes + dn->nbytes);
        m->info.n_params += gu->numel + dn->numel;
        m->info.decode_bytes += (int64_t)(gu->nbytes + dn->nbytes) / E * K;
        return OSP_OK;
    }
    /* MLX: bind [E*rows, cols] views through the 2-D binder, then slice */
    static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
    osp_weight *dst[3] = {gate, up, down};
    for (int k = 0; k < 3; k++) {
        int64_t rows = k < 2 ? I : H, cols = k < 2 ? H : I;
        snprintf(n, sizeof n, "%sexperts.switch_glu.%s.weight", lp, names[k]);
        const osp_st_tensor *t = osp_st_find(m->st, n);
        if (!t) return osp_err(OSP_ERR_FORMAT, "%s: no experts found: tensor '%sexperts.gate_up_proj' or '%s' is missing",
                               m->dir, lp, n);
        if (t->ndim != 3 || t->shape[0] != E || t->shape[1] != rows)
            return bad(m, n, "expected a stacked expert tensor [num_experts, rows, ...]");
        /* Treat the stack as one [E*rows, cols] matrix: same bytes, same per-row layout. */
        snprintf(n, sizeof n, "%sexperts.switch_glu.%s", lp, names[k]);
        osp_st_tensor saved = *t;
        osp_st_tensor *tm = (osp_st_tensor *)t;
        tm->ndim = 2;
        tm->shape[0] = E * rows;
        tm->shape[1] = saved.shape[2];
        osp_st_tensor *ts[2] = {NULL, NULL}, sv[2];
        for (int j = 0; j < 2; j++) {
            char sn[560];
            snprintf(sn, sizeof sn, "%s.%s", n, j ? "biases" : "scales");
            ts[j] = (osp_st_tensor *)osp_st_find(m->st, sn);
            if (ts[j] && ts[j]->ndim == 3 && ts[j]->shape[0] == E && ts[j]->shape[1] == rows) {
                sv[j] = *ts[j];
                ts[j]->ndim = 2;
                ts[j]->shape[0] = E * rows;
                ts[j]->shape[1] = sv[j].shape[2];
            } else {
                ts[j] = NULL;
            }
        }
        osp_weight all;
        osp_status rc = osp_bind_linear(m, n, E * rows, cols, &all);
        *tm = saved;
        for (int j = 0; j < 2; j++)
            if (ts[j]) *ts[j] = sv[j];
        OSP_TRY(rc);
        int64_t rb = osp_weight_row_bytes(&all) - (all.qbits ? 2 * (cols / all.group) * (int64_t)osp_dtype_size(all.sdtype) : 0);
        for (int64_t e = 0; e < E; e++) {
            osp_weight w = all;
            w.rows = rows;
            w.data = (const unsigned char *)all.data + e * rows * rb;
            if (all.qbits) {
                int64_t sb = rows * (cols / all.group) * (int64_t)osp_dtype_size(all.sdtype);
                w.scales = (const unsigned char *)all.scales + e * sb;
                w.biases = (const unsigned char *)all.biases + e * sb;
            }
            dst[k][e] = w;
        }
        m->info.decode_bytes += all.rows * osp_weight_row_bytes(&all) / E * K;
    }
    return OSP_OK;
}

/* The loader's visitor of an architecture's layout (layout.h): bind each
 * tensor where the description says, and count what the forward streams. */
osp_status osp_bind_visit(void *ctx, const osp_tdesc *d) {
    osp_model *m = ctx;
    osp_status rc = OSP_OK;
    switch (d->kind) {
    case OSP_T_LINEAR:
        OSP_TRY(osp_bind_linear(m, d->name, d->rows, d->cols, d->w));
        if (!(d->flags & OSP_TF_GATHERED)) m->info.decode_bytes += d->w->rows * osp_weight_row_bytes(d->w);
        return OSP_OK;
    case OSP_T_VEC:
        if (d->scalar) *d->scalar = osp_bind_scalar(m, d->name, *d->scalar, &rc);
        else *d->vec = osp_bind_vec(m, d->name, d->rows, !(d->flags & OSP_TF_OPTIONAL), &rc);
        return rc;
    case OSP_T_EXPERTS: return bind_experts(m, d);
    }
    return osp_err(OSP_ERR_INVALID, "unknown tensor kind");
}
