/* model/embed: pooling from the sentence-transformers files, Matryoshka
 * widths, and the batched run (see embed.h). */
#include "embed.h"
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "core/json_get.h"
#include "model.h"
#include "safetensors.h"

const char *osp_pooling_name(osp_pooling p) {
    return p == OSP_POOLING_MEAN ? "mean" : p == OSP_POOLING_CLS ? "cls" : "last token";
}

static json_t *load_json(const char *dir, const char *name, osp_status *rc) {
    char p[4300];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL; /* absent */
    fclose(f);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) *rc = osp_err(OSP_ERR_FORMAT, "%s: %s (line %d)", p, je.text, je.line);
    return j;
}

/* 1_Pooling/config.json (or the Pooling module's own folder): exactly one mode we run. */
static osp_status read_pooling(const char *dir, const char *sub, osp_embed_config *c) {
    char name[300];
    snprintf(name, sizeof name, "%s%sconfig.json", sub, *sub ? "/" : "");
    osp_status rc = OSP_OK;
    json_t *j = load_json(dir, name, &rc);
    if (!j) return rc != OSP_OK ? rc : osp_err(OSP_ERR_FORMAT, "%s: modules.json lists a Pooling module but %s is missing", dir, name);
    static const struct {
        const char *key;
        int mode; /* -1: not run */
    } MODES[] = {{"pooling_mode_lasttoken", OSP_POOLING_LAST}, {"pooling_mode_mean_tokens", OSP_POOLING_MEAN},
                 {"pooling_mode_cls_token", OSP_POOLING_CLS}, {"pooling_mode_max_tokens", -1},
                 {"pooling_mode_mean_sqrt_len_tokens", -1}, {"pooling_mode_weightedmean_tokens", -1}};
    int n = 0;
    for (size_t i = 0; i < sizeof MODES / sizeof *MODES; i++) {
        if (!json_is_true(json_object_get(j, MODES[i].key))) continue;
        if (MODES[i].mode < 0 || n++) {
            rc = osp_err(OSP_ERR_UNSUPPORTED, "%s/%s: pooling %s is not supported (one of last token, mean, cls)",
                         dir, name, MODES[i].key);
            break;
        }
        c->pooling = (osp_pooling)MODES[i].mode;
    }
    if (rc == OSP_OK && !n) rc = osp_err(OSP_ERR_FORMAT, "%s/%s: no pooling mode is on", dir, name);
    snprintf(c->source, sizeof c->source, "%.63s", name);
    json_decref(j);
    return rc;
}

/* a Dense module's folder: config.json and model.safetensors (linear.weight, linear.bias) */
static osp_status read_dense(const char *dir, const char *sub, int32_t in_width, osp_embed_dense *d) {
    char name[300], path[4600];
    snprintf(name, sizeof name, "%s/config.json", sub);
    osp_status rc = OSP_OK;
    json_t *j = load_json(dir, name, &rc);
    if (!j) return rc != OSP_OK ? rc : osp_err(OSP_ERR_FORMAT, "%s: modules.json lists a Dense module but %s is missing", dir, name);
    const char *act = osp_json_str(j, "activation_function");
    d->in = osp_json_int(j, "in_features", -1), d->out = osp_json_int(j, "out_features", -1);
    int bias = !json_is_false(json_object_get(j, "bias")); /* sentence-transformers' default: with a bias */
    if (act && strcmp(act, "torch.nn.modules.linear.Identity") && strcmp(act, "torch.nn.modules.activation.Tanh"))
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s/%s: activation_function %s is not supported (Identity or Tanh)", dir,
                     name, act);
    else if (d->in != in_width || d->out < 1 || d->out > 1 << 20)
        rc = osp_err(OSP_ERR_FORMAT, "%s/%s: in_features %d and out_features %d do not follow a width of %d", dir,
                     name, d->in, d->out, in_width);
    d->tanh = !act || !strcmp(act, "torch.nn.modules.activation.Tanh"); /* (its default: Tanh) */
    json_decref(j);
    OSP_TRY(rc);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, sub);
    osp_st *st;
    OSP_TRY(osp_st_open_file(path, &st));
    const osp_st_tensor *w = osp_st_find(st, "linear.weight"), *b = bias ? osp_st_find(st, "linear.bias") : NULL;
    if (!w || w->ndim != 2 || w->shape[0] != d->out || w->shape[1] != d->in || (bias && (!b || b->numel != d->out)))
        rc = osp_err(OSP_ERR_FORMAT, "%s: needs linear.weight [%d, %d]%s", path, d->out, d->in,
                     bias ? " and linear.bias" : "");
    int64_t nw = (int64_t)d->out * d->in;
    if (rc == OSP_OK) {
        d->w = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)nw);
        d->b = bias ? osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)d->out) : NULL;
        if (!d->w || (bias && !d->b)) rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; rc == OSP_OK && i < nw; i++) d->w[i] = osp_load_float(w->data, w->dtype, i);
    for (int64_t i = 0; rc == OSP_OK && bias && i < d->out; i++) d->b[i] = osp_load_float(b->data, b->dtype, i);
    osp_st_close(st);
    return rc;
}

void osp_embed_config_free(osp_embed_config *c) {
    for (int i = 0; i < c->n_dense; i++) osp_free(c->dense[i].w), osp_free(c->dense[i].b);
    c->n_dense = 0;
}

static osp_status read_modules(const char *dir, json_t *mods, osp_embed_config *c) {
    if (!json_is_array(mods)) return osp_err(OSP_ERR_FORMAT, "%s/modules.json: not a list", dir);
    size_t i;
    json_t *e;
    int pooled = 0;
    json_array_foreach(mods, i, e) {
        const char *type = osp_json_str(e, "type"), *path = osp_json_str(e, "path");
        const char *dot = type ? strrchr(type, '.') : NULL, *kind = dot ? dot + 1 : type ? type : "?";
        if (!strcmp(kind, "Transformer") && i == 0) continue;
        if (!strcmp(kind, "Pooling") && !pooled) {
            OSP_TRY(read_pooling(dir, path ? path : "1_Pooling", c));
            pooled = 1;
        } else if (!strcmp(kind, "Dense") && pooled && !c->normalize && c->n_dense < OSP_EMBED_MAX_DENSE) {
            osp_embed_dense *d = &c->dense[c->n_dense];
            OSP_TRY(read_dense(dir, path ? path : "2_Dense", c->dims, d));
            c->n_dense++;
            c->dims = d->out;
        } else if (!strcmp(kind, "Normalize") && pooled) {
            c->normalize = 1;
        } else {
            return osp_err(OSP_ERR_UNSUPPORTED, "%s/modules.json: module %zu (%s) is not supported yet", dir, i, kind);
        }
    }
    if (!pooled) return osp_err(OSP_ERR_UNSUPPORTED, "%s/modules.json: no Pooling module", dir);
    return OSP_OK;
}

/* config.json's Matryoshka keys (vLLM's), else the architecture's default */
static osp_status read_matryoshka(const osp_model *m, osp_embed_config *c) {
    osp_status rc = OSP_OK;
    json_t *j = load_json(m->dir, "config.json", &rc);
    if (!j) return rc;
    json_t *list = json_object_get(j, "matryoshka_dimensions"), *flag = json_object_get(j, "is_matryoshka");
    /* (a bidirectional Gemma 3 is EmbeddingGemma, trained for Matryoshka widths) */
    c->matryoshka = json_is_boolean(flag) ? json_is_true(flag) : m->cfg.arch->matryoshka || m->cfg.bidirectional;
    if (json_is_array(list)) {
        size_t i;
        json_t *v;
        c->matryoshka = 1;
        json_array_foreach(list, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > c->dims ||
                c->n_mrl_dims == OSP_EMBED_MAX_MRL) {
                rc = osp_err(OSP_ERR_FORMAT, "%s/config.json: matryoshka_dimensions needs at most %d widths in 1..%d",
                             m->dir, OSP_EMBED_MAX_MRL, c->dims);
                break;
            }
            c->mrl_dims[c->n_mrl_dims++] = (int32_t)json_integer_value(v);
        }
    }
    json_decref(j);
    return rc;
}

osp_status osp_embed_config_load(const osp_model *m, osp_embed_config *c) {
    memset(c, 0, sizeof *c);
    c->dims = c->hidden = m->cfg.hidden;
    if (!m->cfg.arch->hidden)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: %s models do not give hidden states: no embeddings", m->dir,
                       m->cfg.arch->name);
    osp_status rc = OSP_OK;
    json_t *mods = load_json(m->dir, "modules.json", &rc);
    if (rc != OSP_OK) return rc;
    if (mods) {
        rc = read_modules(m->dir, mods, c);
        json_decref(mods);
        if (rc != OSP_OK) osp_embed_config_free(c);
        OSP_TRY(rc);
    } else if (m->cfg.arch->encoder) { /* no documented default for the family: CLS (bge) or mean (MiniLM) */
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: an encoder pools as its sentence-transformers files say "
                       "(modules.json, 1_Pooling/config.json), and the folder has none", m->dir);
    } else {
        c->pooling = OSP_POOLING_LAST, c->normalize = 1;
        snprintf(c->source, sizeof c->source, "default");
    }
    rc = read_matryoshka(m, c);
    if (rc != OSP_OK) osp_embed_config_free(c);
    return rc;
}

osp_status osp_embed_check_dims(const osp_embed_config *c, int32_t d) {
    if (d == c->dims) return OSP_OK;
    if (d < 1 || d > c->dims) return osp_err(OSP_ERR_INVALID, "dimensions must be between 1 and %d", c->dims);
    if (!c->matryoshka)
        return osp_err(OSP_ERR_INVALID, "this model does not support dimensions other than %d (no Matryoshka "
                       "training: config.json has no is_matryoshka or matryoshka_dimensions)", c->dims);
    if (!c->n_mrl_dims) return OSP_OK;
    for (int i = 0; i < c->n_mrl_dims; i++)
        if (c->mrl_dims[i] == d) return OSP_OK;
    char list[256];
    int k = 0;
    for (int i = 0; i < c->n_mrl_dims && k < (int)sizeof list - 16; i++)
        k += snprintf(list + k, sizeof list - (size_t)k, "%s%d", i ? ", " : "", c->mrl_dims[i]);
    return osp_err(OSP_ERR_INVALID, "dimensions must be one of %s or %d (the model's matryoshka_dimensions)", list,
                   c->dims);
}

void osp_embed_pool(osp_pooling p, const float *h, int32_t n, int64_t H, float *out) {
    if (p != OSP_POOLING_MEAN) { /* the one state given */
        memcpy(out, h, sizeof(float) * (size_t)H);
        return;
    }
    for (int64_t j = 0; j < H; j++) { /* summed in double: the reference's f32 sums differ only by rounding */
        double acc = 0;
        for (int32_t t = 0; t < n; t++) acc += h[(int64_t)t * H + j];
        out[j] = (float)(acc / n);
    }
}

void osp_embed_finish(const osp_embed_config *c, float *v, int32_t d) {
    if (!c->normalize && d == c->dims) return;
    double ss = 0;
    for (int32_t j = 0; j < d; j++) ss += (double)v[j] * v[j];
    /* torch.nn.functional.normalize: x / max(||x||, 1e-12) */
    double norm = sqrt(ss);
    if (norm < 1e-12) norm = 1e-12;
    for (int32_t j = 0; j < d; j++) v[j] = (float)(v[j] / norm);
}

#define EMBED_STEP 512 /* tokens of a forward step at most (session.c's prefill chunk) */

osp_status osp_embed_session_new(const osp_model *m, int32_t rows, int32_t ctx, osp_session **out) {
    if (m->cfg.bidirectional && !m->be->bidir_attention)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s has bidirectional attention, which the %s backend does not run yet "
                       "(--device cpu runs it)", m->dir, m->be->name);
    /* a step of at most a prefill chunk's tokens: the CPU's matmuls stream the step's activations once for every
     * block of weight rows, and a step 4 times that size no longer stays in cache (slower per token); more rows
     * than fit whole share the step, in chunks, as prompts do */
    int64_t tok = (int64_t)rows * ctx;
    osp_session_opts o = {.n_rows = rows, .max_ctx = ctx,
                          .max_tokens = (int32_t)(tok < EMBED_STEP ? (tok < rows ? rows : tok) : EMBED_STEP)};
    if (o.max_tokens < rows) o.max_tokens = rows;
    int32_t whole = ctx > 0 && ctx < m->cfg.max_pos ? ctx : m->cfg.max_pos;
    if ((m->cfg.arch->encoder || m->cfg.bidirectional) && o.max_tokens < whole)
        o.max_tokens = whole; /* an encoder (or a bidirectional decoder body) runs an input whole */
    return osp_session_new_opts(m, &o, out);
}

/* the Dense modules on one pooled vector v [H] into out [c->dims]; tmp [2][widest] */
static void apply_dense(const osp_embed_config *c, const float *v, int64_t H, float *out, float *tmp, int64_t widest) {
    const float *x = v;
    for (int k = 0; k < c->n_dense; k++) {
        const osp_embed_dense *d = &c->dense[k];
        float *y = k == c->n_dense - 1 ? out : tmp + (k % 2) * widest;
        for (int32_t r = 0; r < d->out; r++) {
            const float *w = d->w + (int64_t)r * d->in;
            double acc = d->b ? d->b[r] : 0;
            for (int32_t j = 0; j < d->in; j++) acc += (double)w[j] * x[j];
            y[r] = (float)(d->tanh ? tanh(acc) : acc);
        }
        x = y;
    }
    if (!c->n_dense) memcpy(out, v, sizeof(float) * (size_t)H);
}

osp_status osp_embed_run(osp_session *s, const osp_embed_config *c, const int32_t *const *ids, const int32_t *len,
                         int32_t n, float *out) {
    /* the pooled width is the model's; the output's the last Dense module's (a config made by hand may say only
     * dims) */
    const int64_t H = s->m->cfg.hidden, D = c->n_dense ? c->dense[c->n_dense - 1].out : H;
    const int32_t R = osp_session_rows(s), ctx = osp_session_max_ctx(s);
    for (int32_t i = 0; i < n; i++)
        if (len[i] < 1 || len[i] > ctx)
            return osp_err(OSP_ERR_RANGE, "input %d has %d tokens: between 1 and %d (the context) are allowed", i,
                           len[i], ctx);
    int32_t maxlen = 0;
    for (int32_t i = 0; i < n; i++) maxlen = len[i] > maxlen ? len[i] : maxlen;
    int all = c->pooling == OSP_POOLING_MEAN;
    int64_t widest = H;
    for (int k = 0; k < c->n_dense; k++) widest = c->dense[k].out > widest ? c->dense[k].out : widest;
    int32_t *rows = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)R * 2);
    int32_t *buf = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)R * (size_t)maxlen);
    float *h = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)R * (size_t)H * (size_t)(all ? maxlen : 1));
    float *pv = osp_malloc(OSP_POOL_MISC, sizeof(float) * (size_t)(H + 2 * widest));
    osp_status rc = rows && buf && h && pv ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    for (int32_t i0 = 0, nb; i0 < n && rc == OSP_OK; i0 += nb) {
        nb = n - i0 < R ? n - i0 : R;
        int32_t T = 0, *pos = rows + R;
        for (int32_t b = 0; b < nb; b++) T = len[i0 + b] > T ? len[i0 + b] : T;
        for (int32_t b = 0; b < nb; b++) {
            int32_t L = len[i0 + b];
            rows[b] = b;
            pos[b] = c->pooling == OSP_POOLING_CLS ? 0 : L - 1;
            memcpy(buf + (int64_t)b * T, ids[i0 + b], sizeof(int32_t) * (size_t)L);
            for (int32_t t = L; t < T; t++) buf[(int64_t)b * T + t] = ids[i0 + b][L - 1]; /* padding: unseen (lens) */
        }
        rc = osp_forward_rows_hidden_lens(s, rows, nb, buf, T, len + i0, all ? NULL : pos, h);
        for (int32_t b = 0; b < nb && rc == OSP_OK; b++) {
            osp_embed_pool(c->pooling, h + (int64_t)b * (all ? T : 1) * H, len[i0 + b], H, pv);
            apply_dense(c, pv, H, out + (int64_t)(i0 + b) * D, pv + H, widest);
        }
        for (int32_t b = 0; b < nb; b++) osp_session_reset_row(s, b);
    }
    osp_free(rows);
    osp_free(buf);
    osp_free(h);
    osp_free(pv);
    return rc;
}
