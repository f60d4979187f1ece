/* osprey convert: the plan (one entry per output tensor), the shards, the
 * side files. Layout, rules and guarantees are in convert.h.
 *
 * The plan maps every output tensor to a view of one source tensor: flat
 * row fr of the output (all dims but the last, flattened) reads source
 * flat row (fr / rows) · src_rows + off + fr % rows, which is the identity
 * except for the halves of a fused expert tensor [E, 2I, H]. Tensors are
 * produced in chunks of dim-0 slices by the safetensors writer's fill
 * callback (an unchanged tensor is copied from the input's mapping). A quantized module is declared as codes, scales,
 * biases in that order: filling the codes computes the scales and biases
 * into a stash (the module's [rows, in/group] ×2, in the target dtype)
 * that the next two tensors are copied from, so every group is quantized
 * once. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "convert.h"
#include "arch.h"
#include "config.h"
#include "core/fs.h"
#include "safetensors.h"
#include "st_write.h"
#include "tensor/quant.h"

#define CV_NAME_MAX 320
#define CV_SHARD_DEFAULT ((uint64_t)5 << 30) /* mlx_lm: MAX_FILE_SIZE_GB << 30 */

typedef enum cv_kind { CV_COPY, CV_CAST, CV_CODES, CV_SCALES, CV_BIASES } cv_kind;

typedef struct cv_entry {
    char name[CV_NAME_MAX];
    cv_kind kind;
    const osp_st_tensor *src;
    osp_dtype dtype;         /* output dtype */
    int ndim;
    int64_t shape[OSP_ST_MAX_DIMS];
    int64_t rows, src_rows, off; /* the row view (see the top of the file) */
    int64_t cols;            /* source elements per flat row */
    int64_t flat;            /* output flat rows in all */
    int bits, group;         /* CV_CODES/SCALES/BIASES */
    size_t nbytes;
    int64_t params;          /* parameters it stands for (codes: rows · in) */
    int unit;                /* entries of one unit (a quantized module) share a shard */
    int shard;
} cv_entry;

/* A module the layout says may be quantized. */
typedef struct cv_module {
    char path[CV_NAME_MAX]; /* module path, no ".weight"; experts: the layer prefix */
    int experts;
    int bits, group, override;
} cv_module;

typedef struct cv_plan {
    const osp_st *st;
    int quantize, bits, group;
    cv_module *mods;
    int n_mods, cap_mods;
    cv_entry *e;
    int n, cap;
    int n_units;
    json_t *overrides;       /* module path -> {"group_size", "bits"} */
} cv_plan;

static osp_status cv_grow(void **p, int *cap, int n, size_t elt) {
    if (n < *cap) return OSP_OK;
    int c = *cap ? 2 * *cap : 64;
    void *q = osp_malloc(OSP_POOL_MISC, (size_t)c * elt);
    if (!q) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (n) memcpy(q, *p, (size_t)n * elt);
    osp_free(*p);
    *p = q;
    *cap = c;
    return OSP_OK;
}

static int is_float(osp_dtype t) { return t == OSP_DT_F32 || t == OSP_DT_F16 || t == OSP_DT_BF16; }

/* ---------- which modules quantize: the architecture's layout ---------- */

static osp_status mod_visit(void *ctx, const osp_tdesc *d) {
    cv_plan *p = ctx;
    if (d->kind == OSP_T_VEC) return OSP_OK;
    OSP_TRY(cv_grow((void **)&p->mods, &p->cap_mods, p->n_mods, sizeof *p->mods));
    cv_module *m = &p->mods[p->n_mods++];
    memset(m, 0, sizeof *m);
    snprintf(m->path, sizeof m->path, "%s", d->name);
    m->experts = d->kind == OSP_T_EXPERTS;
    m->bits = p->bits;
    m->group = p->group;
    if (d->flags & OSP_TF_Q8_ROUTER) { /* mlx_lm's Gemma 4 predicate */
        m->bits = 8;
        m->group = 64;
        m->override = 1;
    }
    return OSP_OK;
}

/* The text model's name prefix, found as the loader finds it (a bare embedder's none: no head either). */
static osp_status plan_modules(cv_plan *p, const osp_config *c) {
    static const char *prefixes[] = {"model.", "model.language_model.", "language_model.model.", ""};
    static const char *heads[] = {"lm_head", "lm_head", "language_model.lm_head", "lm_head"};
    for (int i = 0; i < 4; i++) {
        char n[128];
        snprintf(n, sizeof n, "%sembed_tokens.weight", prefixes[i]);
        if (!osp_st_find(p->st, n)) continue;
        osp_config cc = *c; /* as the loader decides it (loader.c's bind_all) */
        snprintf(n, sizeof n, "%s.weight", heads[i]);
        cc.no_head = !*prefixes[i] || (!c->tie_embeddings && !osp_st_find(p->st, n));
        osp_tnames names = {prefixes[i], heads[i]};
        return c->arch->layout(&cc, NULL, &names, mod_visit, p);
    }
    return osp_err(OSP_ERR_FORMAT, "no tensor 'model.embed_tokens.weight' in the input: not a checkpoint of a "
                                   "language model osprey runs");
}

static const cv_module *find_linear(const cv_plan *p, const char *tensor) {
    size_t n = strlen(tensor);
    if (n < 8 || strcmp(tensor + n - 7, ".weight")) return NULL;
    for (int i = 0; i < p->n_mods; i++)
        if (!p->mods[i].experts && strlen(p->mods[i].path) == n - 7 && !strncmp(p->mods[i].path, tensor, n - 7))
            return &p->mods[i];
    return NULL;
}

/* The experts module whose fused tensor this is; *which = 0 gate_up, 1 down. */
static const cv_module *find_experts(const cv_plan *p, const char *tensor, int *which) {
    for (int i = 0; i < p->n_mods; i++) {
        if (!p->mods[i].experts) continue;
        size_t k = strlen(p->mods[i].path);
        if (strncmp(tensor, p->mods[i].path, k)) continue;
        if (!strcmp(tensor + k, "experts.gate_up_proj")) return *which = 0, &p->mods[i];
        if (!strcmp(tensor + k, "experts.down_proj")) return *which = 1, &p->mods[i];
    }
    return NULL;
}

/* ---------- the plan ---------- */

static osp_status push(cv_plan *p, const char *name, cv_kind kind, const osp_st_tensor *src, osp_dtype dt,
                       int64_t rows, int64_t src_rows, int64_t off, int bits, int group, cv_entry **out) {
    OSP_TRY(cv_grow((void **)&p->e, &p->cap, p->n, sizeof *p->e));
    cv_entry *e = &p->e[p->n];
    memset(e, 0, sizeof *e);
    if (strlen(name) >= sizeof e->name) return osp_err(OSP_ERR_FORMAT, "tensor name too long: %.80s...", name);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->src = src;
    e->dtype = dt;
    e->bits = bits;
    e->group = group;
    e->cols = src->ndim >= 2 ? src->shape[src->ndim - 1] : 1;
    e->rows = rows;
    e->src_rows = src_rows;
    e->off = off;
    e->unit = p->n_units;
    p->n++;
    *out = e;
    return OSP_OK;
}

static int64_t flat_rows(const osp_st_tensor *t) {
    int64_t c = t->ndim >= 2 ? t->shape[t->ndim - 1] : 1;
    return c ? t->numel / c : 0;
}

/* One float or copied tensor; split: E experts, `rows` of every expert's
 * src_rows starting at `off` (a half of a fused expert tensor). */
static osp_status plan_dense(cv_plan *p, const char *name, const osp_st_tensor *t, int dtype, int64_t rows,
                             int64_t src_rows, int64_t off) {
    osp_dtype dt = is_float(t->dtype) && dtype >= 0 ? (osp_dtype)dtype : t->dtype;
    int split = rows != src_rows;
    cv_entry *e;
    OSP_TRY(push(p, name, dt == t->dtype && !split ? CV_COPY : CV_CAST, t, dt, rows, src_rows, off, 0, 0, &e));
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    if (split) e->shape[1] = rows;
    e->flat = split ? t->shape[0] * rows : flat_rows(t);
    e->nbytes = (size_t)(e->flat * e->cols) * osp_dtype_size(dt);
    e->params = e->flat * e->cols;
    p->n_units++;
    return OSP_OK;
}

/* A quantized module <base>.{weight,scales,biases} from a view of t. */
static osp_status plan_quant(cv_plan *p, const char *base, const osp_st_tensor *t, int dtype, int64_t rows,
                             int64_t src_rows, int64_t off, int bits, int group) {
    static const char *suffix[3] = {"weight", "scales", "biases"};
    static const cv_kind kinds[3] = {CV_CODES, CV_SCALES, CV_BIASES};
    osp_dtype dt = dtype >= 0 ? (osp_dtype)dtype : t->dtype;
    int split = rows != src_rows;
    for (int k = 0; k < 3; k++) {
        char n[CV_NAME_MAX + 64];
        snprintf(n, sizeof n, "%s.%s", base, suffix[k]);
        cv_entry *e;
        OSP_TRY(push(p, n, kinds[k], t, k ? dt : OSP_DT_U32, rows, src_rows, off, bits, group, &e));
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        if (split) e->shape[1] = rows;
        e->flat = split ? t->shape[0] * rows : flat_rows(t);
        int64_t last = k ? e->cols / group : e->cols * bits / 32;
        e->shape[e->ndim - 1] = last;
        e->nbytes = (size_t)(e->flat * last) * osp_dtype_size(e->dtype);
        e->params = k ? 0 : e->flat * e->cols;
    }
    p->n_units++;
    return OSP_OK;
}

static int fits(const osp_st_tensor *t, int group) {
    return is_float(t->dtype) && t->ndim >= 2 && t->shape[t->ndim - 1] % group == 0 && t->numel > 0;
}

static osp_status plan_build(cv_plan *p, int dtype) {
    for (int i = 0; i < p->st->n_tensors; i++) {
        const osp_st_tensor *t = &p->st->tensors[i];
        int which;
        const cv_module *m = p->quantize ? find_linear(p, t->name) : NULL;
        const cv_module *x = p->quantize && !m ? find_experts(p, t->name, &which) : NULL;
        if (m && fits(t, m->group)) {
            char base[CV_NAME_MAX];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);
            OSP_TRY(plan_quant(p, base, t, dtype, flat_rows(t), flat_rows(t), 0, m->bits, m->group));
            if (m->override)
                json_object_set_new(p->overrides, m->path,
                                    json_pack("{s:i, s:i}", "group_size", m->group, "bits", m->bits));
        } else if (x && t->ndim == 3) {
            /* HF fused experts → MLX switch_glu: gate_up [E, 2I, H] splits in halves. */
            static const char *names[3] = {"gate_proj", "up_proj", "down_proj"};
            int64_t R = which ? t->shape[1] : t->shape[1] / 2;
            for (int h = 0; h < (which ? 1 : 2); h++) {
                char base[CV_NAME_MAX + 32];
                snprintf(base, sizeof base, "%sexperts.switch_glu.%s", x->path, names[which ? 2 : h]);
                if (fits(t, x->group)) {
                    OSP_TRY(plan_quant(p, base, t, dtype, R, t->shape[1], h * R, x->bits, x->group));
                } else {
                    char n[CV_NAME_MAX + 48];
                    snprintf(n, sizeof n, "%s.weight", base);
                    OSP_TRY(plan_dense(p, n, t, dtype, R, t->shape[1], h * R));
                }
            }
        } else {
            OSP_TRY(plan_dense(p, t->name, t, dtype, flat_rows(t), flat_rows(t), 0));
        }
    }
    return OSP_OK;
}

/* ---------- producing the bytes ---------- */

typedef struct cv_fill {
    cv_plan *p;
    const int *index;        /* this shard's writer index -> plan entry */
    unsigned char *stash[2]; /* scales, biases of the module being written */
    size_t stash_bytes;
    float *row;              /* one source row, f32 */
    uint8_t codes[128];
    uint64_t done, total;
    const osp_convert_opts *o;
    int64_t n_done;
} cv_fill;

static void store(void *dst, osp_dtype t, int64_t i, float v) {
    unsigned char *b = dst;
    uint16_t h;
    switch (t) {
    case OSP_DT_BF16: h = osp_f32_to_bf16(v); memcpy(b + 2 * i, &h, 2); break;
    case OSP_DT_F16: h = osp_f32_to_f16(v); memcpy(b + 2 * i, &h, 2); break;
    default: memcpy(b + 4 * i, &v, 4); break;
    }
}

/* The value as the target dtype holds it (mlx_lm casts before quantizing). */
static float as_dtype(float v, osp_dtype t) {
    if (t == OSP_DT_BF16) return osp_bf16_to_f32(osp_f32_to_bf16(v));
    if (t == OSP_DT_F16) return osp_f16_to_f32(osp_f32_to_f16(v));
    return v;
}

static void load_row(cv_fill *f, const cv_entry *e, int64_t fr, osp_dtype rounding) {
    int64_t sr = (fr / e->rows) * e->src_rows + e->off + fr % e->rows;
    for (int64_t c = 0; c < e->cols; c++)
        f->row[c] = as_dtype(osp_load_float(e->src->data, e->src->dtype, sr * e->cols + c), rounding);
}

static osp_status cv_fill_fn(void *ctx, int64_t index, int64_t row0, int64_t nrows, void *buf, size_t nbytes) {
    cv_fill *f = ctx;
    const cv_entry *e = &f->p->e[f->index[index]];
    int64_t fps = e->ndim >= 2 ? e->flat / e->shape[0] : 1; /* flat rows per dim-0 slice */
    int64_t r0 = row0 * fps, r1 = (row0 + nrows) * fps;
    unsigned char *out = buf;
    const osp_convert_opts *o = f->o;
    if (row0 == 0 && o->progress && o->progress(o->progress_ud, f->n_done, f->p->n, e->name, f->done, f->total))
        return osp_err(OSP_ERR_INVALID, "convert cancelled");
    if (row0 == 0) f->n_done++;
    f->done += nbytes;
    if (e->kind == CV_COPY) { /* the same bytes, through the fill so progress is in order */
        size_t slice = e->nbytes / (size_t)(e->ndim ? e->shape[0] : 1);
        memcpy(out, (const unsigned char *)e->src->data + (size_t)row0 * slice, nbytes);
        return OSP_OK;
    }
    if (e->kind == CV_CAST) {
        if (!is_float(e->dtype)) { /* a copied view of a non-float tensor (not produced today) */
            size_t rb = (size_t)e->cols * osp_dtype_size(e->dtype);
            for (int64_t fr = r0; fr < r1; fr++) {
                int64_t sr = (fr / e->rows) * e->src_rows + e->off + fr % e->rows;
                memcpy(out + (size_t)(fr - r0) * rb, (const unsigned char *)e->src->data + (size_t)sr * rb, rb);
            }
            return OSP_OK;
        }
        for (int64_t fr = r0; fr < r1; fr++) {
            load_row(f, e, fr, OSP_DT_F32);
            for (int64_t c = 0; c < e->cols; c++) store(out, e->dtype, (fr - r0) * e->cols + c, f->row[c]);
        }
        return OSP_OK;
    }
    const cv_entry *sc = e->kind == CV_CODES ? e + 1 : NULL; /* the scales entry: the stash's dtype */
    int64_t ng = e->cols / e->group;
    size_t ssize = osp_dtype_size(e->kind == CV_CODES ? sc->dtype : e->dtype);
    if (e->kind != CV_CODES) { /* scales or biases: from the stash the codes filled */
        memcpy(out, f->stash[e->kind == CV_BIASES] + (size_t)(r0 * ng) * ssize, (size_t)((r1 - r0) * ng) * ssize);
        return OSP_OK;
    }
    if (row0 == 0) {
        size_t need = (size_t)(e->flat * ng) * ssize;
        if (need > f->stash_bytes) {
            osp_free(f->stash[0]);
            osp_free(f->stash[1]);
            f->stash[0] = osp_malloc(OSP_POOL_SCRATCH, need);
            f->stash[1] = osp_malloc(OSP_POOL_SCRATCH, need);
            f->stash_bytes = f->stash[0] && f->stash[1] ? need : 0;
            if (!f->stash_bytes)
                return osp_err(OSP_ERR_NOMEM, "%s: cannot allocate 2 x %zu bytes for scales and biases",
                               e->name, need);
        }
    }
    const int64_t gbytes = (int64_t)e->group * e->bits / 8, rbytes = e->cols * e->bits / 8;
    for (int64_t fr = r0; fr < r1; fr++) {
        load_row(f, e, fr, sc->dtype);
        for (int64_t g = 0; g < ng; g++) {
            float s, b;
            osp_quantize_group(f->row + g * e->group, e->group, e->bits, f->codes, &s, &b);
            osp_pack_codes(f->codes, e->group, e->bits, out + (fr - r0) * rbytes + g * gbytes);
            store(f->stash[0], sc->dtype, fr * ng + g, s);
            store(f->stash[1], sc->dtype, fr * ng + g, b);
        }
    }
    return OSP_OK;
}

/* ---------- files and folders ---------- */

static osp_status copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb");
    if (!a) return osp_err(OSP_ERR_IO, "cannot read %s: %s", from, strerror(errno));
    FILE *b = fopen(to, "wb");
    if (!b) {
        fclose(a);
        return osp_err(OSP_ERR_IO, "cannot create %s: %s", to, strerror(errno));
    }
    osp_status st = OSP_OK;
    char *buf = osp_malloc(OSP_POOL_SCRATCH, 1 << 20);
    if (!buf) st = osp_err(OSP_ERR_NOMEM, "out of memory");
    size_t n;
    while (st == OSP_OK && (n = fread(buf, 1, 1 << 20, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) st = osp_err(OSP_ERR_IO, "%s: write failed: %s", to, strerror(errno));
    if (st == OSP_OK && ferror(a)) st = osp_err(OSP_ERR_IO, "%s: read failed", from);
    if (fclose(b) != 0 && st == OSP_OK) st = osp_err(OSP_ERR_IO, "%s: write failed: %s", to, strerror(errno));
    fclose(a);
    osp_free(buf);
    return st;
}

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* dir/file into out[n]; an error when it does not fit. */
static osp_status join(char *out, size_t n, const char *dir, const char *file) {
    int k = snprintf(out, n, "%s/%s", dir, file);
    if (k < 0 || (size_t)k >= n) return osp_err(OSP_ERR_INVALID, "path too long: %.80s...", dir);
    return OSP_OK;
}

/* What mlx_lm's save carries over: the tokenizer as save_pretrained writes
 * it, the chat template, generation_config.json and *.py. */
static int is_side_file(const char *f) {
    static const char *names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "added_tokens.json", "tokenizer.model", "tiktoken.model", "vocab.json",
                                  "merges.txt", "chat_template.jinja", "chat_template.json",
                                  "generation_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(f, names[i])) return 1;
    return ends_with(f, ".tiktoken") || ends_with(f, ".py");
}

static osp_status copy_side_files(const char *in, const char *tmp) {
    DIR *d = opendir(in);
    if (!d) return osp_err(OSP_ERR_IO, "cannot list %s: %s", in, strerror(errno));
    osp_status st = OSP_OK;
    struct dirent *de;
    while (st == OSP_OK && (de = readdir(d))) {
        char a[4200], b[4200];
        if (!is_side_file(de->d_name)) continue;
        st = join(a, sizeof a, in, de->d_name);
        if (st == OSP_OK && !osp_is_file(a)) continue;
        if (st == OSP_OK) st = join(b, sizeof b, tmp, de->d_name);
        if (st == OSP_OK) st = copy_file(a, b);
    }
    closedir(d);
    return st;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            char p[4200];
            if (join(p, sizeof p, dir, de->d_name) == OSP_OK) unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static const char *hf_dtype_name(osp_dtype t) {
    return t == OSP_DT_F32 ? "float32" : t == OSP_DT_F16 ? "float16" : "bfloat16";
}

/* config.json: the dtype mlx_lm would cast to (torch_dtype, then dtype, at
 * the root or in text_config), or -1. */
static int config_dtype(const json_t *root) {
    const json_t *objs[2] = {root, json_object_get(root, "text_config")};
    const char *keys[2] = {"torch_dtype", "dtype"};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 2; k++) {
            const char *s = json_string_value(json_object_get(objs[o], keys[k]));
            int dt;
            if (s && osp_convert_parse_dtype(s, &dt) == OSP_OK) return dt;
        }
    osp_err_clear();
    return -1;
}

/* 1 if every real in j reads back the same when printed with `digits`. */
static int reals_round_trip(const json_t *j, int digits) {
    if (json_is_real(j)) {
        char b[64];
        snprintf(b, sizeof b, "%.*g", digits, json_real_value(j));
        return strtod(b, NULL) == json_real_value(j);
    }
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(j)) json_object_foreach((json_t *)j, k, v) if (!reals_round_trip(v, digits)) return 0;
    if (json_is_array(j)) json_array_foreach(j, i, v) if (!reals_round_trip(v, digits)) return 0;
    return 1;
}

/* Sorted keys, indent 4 (as mlx_lm), and reals as short as reads back
 * exactly (1e-06, not 9.9999999999999995e-07). */
static osp_status write_json(json_t *j, const char *path) {
    int digits = 15;
    while (digits < 17 && !reals_round_trip(j, digits)) digits++;
    if (json_dump_file(j, path, JSON_INDENT(4) | JSON_SORT_KEYS | JSON_REAL_PRECISION(digits)) != 0)
        return osp_err(OSP_ERR_IO, "cannot write %s", path);
    return OSP_OK;
}

static osp_status write_config(const json_t *root, const cv_plan *p, int dtype, const char *tmp) {
    json_t *c = json_deep_copy(root);
    if (!c) return osp_err(OSP_ERR_NOMEM, "out of memory");
    json_object_del(c, "_name_or_path");
    if (dtype >= 0) { /* the dtype keys follow the cast */
        json_t *objs[2] = {c, json_object_get(c, "text_config")};
        const char *keys[2] = {"torch_dtype", "dtype"};
        for (int o = 0; o < 2; o++)
            for (int k = 0; k < 2; k++)
                if (json_is_object(objs[o]) && json_is_string(json_object_get(objs[o], keys[k])))
                    json_object_set_new(objs[o], keys[k], json_string(hf_dtype_name((osp_dtype)dtype)));
    }
    if (p->quantize) {
        json_t *q = json_pack("{s:i, s:i}", "group_size", p->group, "bits", p->bits);
        if (q) json_object_update(q, p->overrides);
        json_object_set_new(c, "quantization", q);
        json_object_set_new(c, "quantization_config", json_deep_copy(q));
    }
    char path[4300];
    osp_status st = join(path, sizeof path, tmp, "config.json");
    if (st == OSP_OK) st = write_json(c, path);
    json_decref(c);
    return st;
}

/* Shards of at most max bytes (a unit is never split), as make_shards. */
static int assign_shards(cv_plan *p, uint64_t max) {
    int shard = 0;
    uint64_t size = 0;
    for (int i = 0; i < p->n;) {
        int j = i;
        uint64_t u = 0;
        while (j < p->n && p->e[j].unit == p->e[i].unit) u += p->e[j++].nbytes;
        if (size > 0 && size + u > max) shard++, size = 0;
        for (int k = i; k < j; k++) p->e[k].shard = shard;
        size += u;
        i = j;
    }
    return shard + 1;
}

static void shard_name(int s, int n, char *out, size_t len) {
    if (n == 1) snprintf(out, len, "model.safetensors");
    else snprintf(out, len, "model-%05d-of-%05d.safetensors", s + 1, n);
}

static osp_status write_shards(cv_plan *p, int n_shards, const char *tmp, const osp_convert_opts *o,
                               osp_convert_result *res) {
    cv_fill f = {.p = p, .o = o};
    int *index = osp_malloc(OSP_POOL_MISC, (size_t)(p->n ? p->n : 1) * sizeof *index);
    int64_t maxcols = 1;
    for (int i = 0; i < p->n; i++) {
        f.total += p->e[i].nbytes;
        if (p->e[i].cols > maxcols) maxcols = p->e[i].cols;
    }
    f.row = osp_malloc(OSP_POOL_SCRATCH, (size_t)maxcols * sizeof(float));
    osp_status st = index && f.row ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    json_t *map = json_object();
    int64_t params = 0;
    for (int s = 0; s < n_shards && st == OSP_OK; s++) {
        osp_st_writer *w = osp_st_writer_new();
        if (!w) st = osp_err(OSP_ERR_NOMEM, "out of memory");
        char file[64], path[4300];
        shard_name(s, n_shards, file, sizeof file);
        snprintf(path, sizeof path, "%s/%s", tmp, file);
        if (st == OSP_OK) st = osp_st_writer_set_meta(w, "format", "mlx");
        int n = 0;
        for (int i = 0; i < p->n && st == OSP_OK; i++) {
            const cv_entry *e = &p->e[i];
            if (e->shard != s) continue;
            index[n++] = i;
            st = osp_st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, NULL, e->nbytes);
            json_object_set_new(map, e->name, json_string(file));
            params += e->params;
        }
        f.index = index;
        if (st == OSP_OK) st = osp_st_writer_write(w, path, cv_fill_fn, &f);
        osp_st_writer_free(w);
    }
    if (st == OSP_OK) {
        json_t *idx = json_pack("{s:{s:I, s:I}, s:O}", "metadata", "total_size", (json_int_t)f.total,
                                "total_parameters", (json_int_t)params, "weight_map", map);
        char path[4300];
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", tmp);
        st = idx ? write_json(idx, path) : osp_err(OSP_ERR_NOMEM, "out of memory");
        json_decref(idx);
    }
    if (res) {
        res->n_tensors = p->n;
        res->n_shards = n_shards;
        res->bytes = f.total;
        res->n_quantized = 0;
        for (int i = 0; i < p->n; i++) res->n_quantized += p->e[i].kind == CV_CODES;
    }
    json_decref(map);
    osp_free(f.stash[0]);
    osp_free(f.stash[1]);
    osp_free(f.row);
    osp_free(index);
    return st;
}

/* ---------- the checks, and the whole ---------- */

osp_status osp_convert_parse_dtype(const char *s, int *dtype) {
    if (s && (!strcmp(s, "bf16") || !strcmp(s, "bfloat16"))) return *dtype = OSP_DT_BF16, OSP_OK;
    if (s && (!strcmp(s, "f16") || !strcmp(s, "float16"))) return *dtype = OSP_DT_F16, OSP_OK;
    if (s && (!strcmp(s, "f32") || !strcmp(s, "float32"))) return *dtype = OSP_DT_F32, OSP_OK;
    return osp_err(OSP_ERR_INVALID, "unknown dtype '%s' (bf16, f16 or f32)", s ? s : "");
}

static osp_status check_out(const char *out) {
    struct stat sb;
    if (stat(out, &sb) != 0) return OSP_OK;
    if (!S_ISDIR(sb.st_mode)) return osp_err(OSP_ERR_INVALID, "%s already exists (not a folder)", out);
    DIR *d = opendir(out);
    if (!d) return osp_err(OSP_ERR_IO, "%s: %s", out, strerror(errno));
    struct dirent *de;
    int empty = 1;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
    closedir(d);
    if (!empty)
        return osp_err(OSP_ERR_INVALID, "%s already exists and is not empty; remove it or choose another "
                                        "output folder",
                       out);
    return OSP_OK;
}

static osp_status resolve_in(const char *in, char *dir, size_t n) {
    char p[4200];
    if (join(p, sizeof p, in, "config.json") == OSP_OK && osp_is_file(p)) return snprintf(dir, n, "%s", in), OSP_OK;
    if (osp_hf_snapshot(in, dir, n)) return OSP_OK;
    if (!osp_is_dir(in)) return osp_err(OSP_ERR_IO, "%s: no such model folder", in);
    return osp_err(OSP_ERR_IO, "%s: no config.json (not a model folder or Hugging Face cache repo)", in);
}

static int input_quantized(const json_t *root, const osp_st *st) {
    if (json_object_get(root, "quantization") || json_object_get(root, "quantization_config")) return 1;
    for (int i = 0; i < st->n_tensors; i++)
        if (ends_with(st->tensors[i].name, ".scales") && st->tensors[i].ndim >= 2) return 1;
    return 0;
}

osp_status osp_convert(const char *in, const char *out, const osp_convert_opts *opts, osp_convert_result *res) {
    osp_convert_opts o = opts ? *opts : (osp_convert_opts){.dtype = -1};
    if (!in || !out || !*out) return osp_err(OSP_ERR_INVALID, "missing input or output folder");
    if (o.quantize) {
        if (!o.bits) o.bits = 4;
        if (!o.group) o.group = 64;
        OSP_TRY(osp_quant_check(o.group, o.bits, o.group));
    }
    if (o.dtype >= 0 && !is_float((osp_dtype)o.dtype))
        return osp_err(OSP_ERR_INVALID, "dtype must be bf16, f16 or f32");
    if (!o.shard_bytes) o.shard_bytes = CV_SHARD_DEFAULT;

    char dir[4096], outp[4096], tmp[4200], path[4300];
    OSP_TRY(resolve_in(in, dir, sizeof dir));
    snprintf(outp, sizeof outp, "%s", out);
    for (size_t n = strlen(outp); n > 1 && outp[n - 1] == '/'; n--) outp[n - 1] = 0;
    OSP_TRY(check_out(outp));

    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return osp_err(OSP_ERR_FORMAT, "%s: %s (line %d)", path, je.text, je.line);
    }
    osp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    osp_st *st = NULL;
    cv_plan p = {.quantize = o.quantize, .bits = o.bits, .group = o.group, .overrides = json_object()};
    int made = 0;
    osp_status rc = osp_config_parse(root, path, &cfg);
    if (rc == OSP_OK) rc = osp_st_open_dir(dir, &st);
    if (rc == OSP_OK && o.quantize && input_quantized(root, st))
        rc = osp_err(OSP_ERR_UNSUPPORTED, "%s is already quantized; -q needs an unquantized (float) "
                                          "checkpoint",
                     in);
    p.st = st;
    int dtype = o.dtype >= 0 ? o.dtype : config_dtype(root);
    if (rc == OSP_OK && o.quantize) rc = plan_modules(&p, &cfg);
    if (rc == OSP_OK) rc = plan_build(&p, dtype);
    if (rc == OSP_OK) {
        snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", outp);
        if (!mkdtemp(tmp)) rc = osp_err(OSP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        else made = 1;
    }
    if (rc == OSP_OK) rc = write_shards(&p, assign_shards(&p, o.shard_bytes), tmp, &o, res);
    if (rc == OSP_OK) rc = write_config(root, &p, o.dtype >= 0 ? o.dtype : -1, tmp);
    if (rc == OSP_OK) rc = copy_side_files(dir, tmp);
    if (rc == OSP_OK && chmod(tmp, 0755) != 0) rc = osp_err(OSP_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (rc == OSP_OK && rename(tmp, outp) != 0)
        rc = osp_err(OSP_ERR_IO, "cannot rename %s to %s: %s", tmp, outp, strerror(errno));
    if (rc != OSP_OK && made) remove_tree(tmp);
    osp_free(p.mods);
    osp_free(p.e);
    json_decref(p.overrides);
    osp_st_close(st);
    osp_config_free(&cfg);
    json_decref(root);
    return rc;
}
