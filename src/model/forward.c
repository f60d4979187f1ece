/* The transformer forward pass for a batch of rows.
 *
 * Input ids [B, T]; row b continues at its own position kv->pos[b]. The
 * chunk's K/V are computed into scratch, attention reads old positions
 * from the cache and new ones from scratch, and only then is the chunk
 * written into the cache. That keeps sliding-window rings at exactly
 * `window` slots even when a chunk is longer than the window.
 *
 * All math is f32 (reference precision); weights are read as stored.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "core/threadpool.h"
#include "attention.h"
#include "model.h"

#define OSP_MAX_CHUNK 512

/* ---- matmul on the thread pool ---- */

#define MM_MAX_W 4
#define MM_MIN_TAKE 64 /* rows a claim takes at least */

typedef struct mm_ctx {
    const osp_ops *ops;
    const float *x;
    int64_t n;
    const osp_q8act *acts; /* fast path: the n prepared activations */
    osp_q8act_mm_fn q8;
    int per_token;         /* each activation through the one-token kernel */
    int nw, nt;
    const osp_weight *w[MM_MAX_W];
    float *y[MM_MAX_W];
    /* weight i owns rows [first[i], first[i + 1]) of one row space (its
     * rows rounded up to 16); threads claim ranges of it from cursor */
    int64_t first[MM_MAX_W + 1];
    _Atomic int64_t cursor;
} mm_ctx;

static void mm_rows(const mm_ctx *c, int i, int64_t r0, int64_t r1) {
    const osp_weight *w = c->w[i];
    float *y = c->y[i];
    if (c->acts && w->packed) { /* every token at once, each bitwise as if alone */
        c->q8(w, c->acts, c->n, y + r0, w->rows, r0, r1);
        return;
    }
    if (c->per_token) {
        for (int64_t k = 0; k < c->n; k++)
            c->ops->matmul(w, c->x + k * w->cols, 1, y + k * w->rows + r0, w->rows, r0, r1);
        return;
    }
    c->ops->matmul(w, c->x, c->n, y + r0, w->rows, r0, r1);
}

/* Guided self-scheduling: each claim takes 1/(2 threads) of what is left
 * (16-row aligned, at least MM_MIN_TAKE rows, never past its weight), so the
 * streams start long and the last claims are short: the threads finish
 * within a short range of each other. A row's numbers do not depend on
 * the range it is computed in, so the split changes nothing but time. */
static void mm_task(void *p, int64_t t) {
    (void)t;
    mm_ctx *c = p;
    const int64_t total = c->first[c->nw];
    for (;;) {
        int64_t cur = atomic_load(&c->cursor), take;
        int i;
        do {
            if (cur >= total) return;
            i = 0;
            while (cur >= c->first[i + 1]) i++;
            take = (total - cur) / (2 * c->nt);
            take = (take + 15) & ~(int64_t)15;
            if (take < MM_MIN_TAKE) take = MM_MIN_TAKE;
            if (take > c->first[i + 1] - cur) take = c->first[i + 1] - cur;
        } while (!atomic_compare_exchange_weak(&c->cursor, &cur, cur + take));
        int64_t r0 = cur - c->first[i], r1 = r0 + take;
        mm_rows(c, i, r0, r1 < c->w[i]->rows ? r1 : c->w[i]->rows);
    }
}

typedef struct prep_ctx {
    osp_scratch *sc;
    const float *x;
    int64_t n, cols, ng; /* tokens, columns, groups */
    int64_t parts;       /* group ranges per panel */
} prep_ctx;

/* One group range of every token of one panel: a task writes its own part
 * of the panel (by token, two threads would share its cache lines). */
static void prep_task(void *p, int64_t t) {
    const prep_ctx *c = p;
    const int64_t panel = t / c->parts, k = t % c->parts, g0 = k * c->ng / c->parts, g1 = (k + 1) * c->ng / c->parts;
    for (int64_t tok = panel * OSP_Q8ACT_SLOTS; tok < c->n && tok < (panel + 1) * OSP_Q8ACT_SLOTS; tok++)
        osp_q8act_prepare_groups(&c->sc->q8acts[panel], (int)(tok % OSP_Q8ACT_SLOTS), c->x + tok * c->cols, g0, g1);
}

void osp_matmul_shared(osp_session *s, const osp_weight *const *ws, int nw, const float *x, int64_t n,
                       float *const *ys) {
    /* The int8 path needs one activation layout for all: the same group. */
    const osp_weight *pk = NULL;
    int fast = s->fast && s->sc.q8mem && n <= s->sc.q8cap && osp_q8act_matmul_fast();
    for (int i = 0; i < nw && fast; i++) {
        if (!ws[i]->packed) continue;
        if (pk && pk->group != ws[i]->group) {
            for (int j = 0; j < nw; j++) osp_matmul_shared(s, &ws[j], 1, x, n, &ys[j]);
            return;
        }
        pk = ws[i];
    }
    mm_ctx c = {.ops = s->m->ops, .x = x, .n = n, .nw = nw};
    if (pk) {
        for (int64_t p = 0; p * OSP_Q8ACT_SLOTS < n; p++) {
            int64_t width = n - p * OSP_Q8ACT_SLOTS < OSP_Q8ACT_SLOTS ? n - p * OSP_Q8ACT_SLOTS : OSP_Q8ACT_SLOTS;
            osp_q8act_init(&s->sc.q8acts[p], pk->cols, pk->group, (int)width, (char *)s->sc.q8mem + p * s->sc.q8stride);
        }
        /* 16k values or more are split over the threads: by panel, and by
         * group ranges when there are fewer than two panels a thread.
         * Against the earlier split (one thread below 16 tokens, else a task
         * per token, whose threads shared the panels' cache lines): batched
         * decode +1-2% at 8 rows, +20% at 16; pp512 +3-20%. */
        const int64_t panels = (n + OSP_Q8ACT_SLOTS - 1) / OSP_Q8ACT_SLOTS, ng = pk->cols / pk->group;
        const int nt = osp_threads_count(), split = n * pk->cols >= 16384;
        prep_ctx pc = {&s->sc, x, n, pk->cols, ng, 1};
        if (split && panels < 2 * nt) {
            const int64_t want = (2 * nt + panels - 1) / panels;
            pc.parts = want < ng ? want : ng;
        }
        if (split && panels * pc.parts > 1) osp_parallel_for(panels * pc.parts, prep_task, &pc);
        else
            for (int64_t t = 0; t < panels * pc.parts; t++) prep_task(&pc, t);
        c.acts = s->sc.q8acts;
        c.q8 = osp_q8act_matmul_fast();
    }
    /* A batched decode step runs every other activation through exactly the
     * kernel a lone one would get, so a row's numbers do not depend on the
     * rest of the batch. (8-bit weights stay on the f32 path: int8
     * activations cost them more accuracy, and their matvec is memory-bound
     * there already.) */
    c.per_token = s->per_token && n > 1;
    int nt = osp_threads_count();
    int64_t work = 0;
    c.nt = nt;
    for (int i = 0; i < nw; i++) {
        const osp_weight *w = ws[i];
        c.w[i] = w;
        c.y[i] = ys[i];
        c.first[i + 1] = c.first[i] + ((w->rows + 15) & ~(int64_t)15);
        work += w->rows * osp_weight_row_bytes(w) * n;
    }
    atomic_init(&c.cursor, 0);
    /* Small matmuls (tiny models, the per-layer-input projections) cost less
     * than waking the pool: run them on this thread. */
    if (work < (256 << 10)) {
        for (int i = 0; i < nw; i++) mm_rows(&c, i, 0, ws[i]->rows);
        return;
    }
    osp_parallel_for(nt, mm_task, &c);
}

void osp_matmul(osp_session *s, const osp_weight *w, const float *x, int64_t n, float *y) {
    osp_matmul_shared(s, &w, 1, x, n, &y);
}

void osp_session_set_fast(osp_session *s, int fast) { s->fast = fast != 0; }

static void add_bias(float *y, const float *b, int64_t n, int64_t d) {
    if (!b) return;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) y[i * d + j] += b[j];
}

/* ---- session ---- */

static void scratch_free(osp_scratch *s, int n_layers) {
    float *v[] = {s->x, s->xn, s->q, s->k, s->v, s->att, s->tmp, s->g, s->u, s->scores, s->hlast, s->ple,
                  s->ple_tmp, s->ple_emb, s->router, s->top_w, s->moe_x, s->moe_out, s->moe_acc, s->moe_w};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) osp_free(v[i]);
    osp_free(s->ids);
    osp_free(s->q8mem);
    free(s->q8acts);
    free(s->bpos);
    osp_free(s->top_idx);
    osp_free(s->moe_rows);
    for (int i = 0; s->donor_k && i < n_layers; i++) {
        osp_free(s->donor_k[i]);
        osp_free(s->donor_v[i]);
    }
    free(s->donor_k);
    free(s->donor_v);
    memset(s, 0, sizeof *s);
}

static size_t at_least1(size_t n) { return n ? n : 1; }

/* Activation buffers for forward calls of up to max_tok tokens in all
 * (B rows, max_tok / B each), sized by the widest layer (Gemma 4 varies
 * head sizes and MLP widths per layer). */
static osp_status scratch_new(const osp_model *m, int32_t B, int32_t max_tok, int32_t max_ctx, osp_scratch *s) {
    const osp_config *c = &m->cfg;
    memset(s, 0, sizeof *s);
    s->max_tok = max_tok;
    size_t N = (size_t)max_tok, H = c->hidden, Q = 0, KV = 0, I = 0;
    for (int i = 0; i < c->n_layers; i++) {
        size_t q = (size_t)c->n_heads * c->layer_head_dim[i], kv = (size_t)c->layer_kv_heads[i] * c->layer_head_dim[i];
        Q = q > Q ? q : Q;
        KV = kv > KV ? kv : KV;
        I = (size_t)m->layers[i].intermediate > I ? (size_t)m->layers[i].intermediate : I;
    }
    if ((size_t)c->moe_intermediate > I) I = c->moe_intermediate;
    size_t HQ = H > Q ? H : Q, NP = (size_t)c->n_layers * c->ple_dim, E = c->n_experts, K = c->top_k_experts;
    int ok = 1;
#define A(field, count) (ok &= (s->field = osp_malloc(OSP_POOL_SCRATCH, at_least1(count) * sizeof *s->field)) != NULL)
    A(x, N * H), A(xn, N * H), A(q, N * Q), A(k, N * KV), A(v, N * KV), A(att, N * HQ), A(tmp, N * HQ);
    A(g, N * I), A(u, N * I), A(scores, (size_t)B * c->n_heads * ((size_t)max_ctx + max_tok));
    A(hlast, (size_t)B * H), A(ids, N);
    { /* prepared int8 activations for the fast path: the widest matmul input */
        size_t cols = H > Q ? H : Q;
        cols = I > cols ? I : cols;
        if ((size_t)c->ple_dim > cols) cols = c->ple_dim;
        s->q8stride = (osp_q8act_bytes((int64_t)cols) + 63) & ~(size_t)63;
        s->q8cap = max_tok;
        size_t panels = ((size_t)max_tok + OSP_Q8ACT_SLOTS - 1) / OSP_Q8ACT_SLOTS;
        ok &= (s->q8mem = osp_malloc(OSP_POOL_SCRATCH, s->q8stride * panels)) != NULL;
        ok &= (s->q8acts = calloc(panels, sizeof *s->q8acts)) != NULL;
        ok &= (s->bpos = calloc((size_t)B, sizeof *s->bpos)) != NULL;
    }
    if (c->ple_dim) A(ple, N * NP), A(ple_tmp, N * c->ple_dim), A(ple_emb, NP);
    if (c->moe) {
        A(router, N * E), A(top_idx, N * K), A(top_w, N * K), A(moe_x, N * K * H), A(moe_out, N * H);
        A(moe_acc, N * K * H), A(moe_rows, N * K), A(moe_w, N * K);
    }
    s->donor_k = calloc((size_t)c->n_layers, sizeof *s->donor_k);
    s->donor_v = calloc((size_t)c->n_layers, sizeof *s->donor_v);
    ok &= s->donor_k && s->donor_v;
    for (int i = 0; ok && i < c->n_layers; i++) { /* layers whose KV others reuse keep their chunk K/V */
        int d = c->layer_kv_donor[i];
        if (d < 0 || s->donor_k[d]) continue;
        size_t kv = N * c->layer_kv_heads[d] * c->layer_head_dim[d];
        A(donor_k[d], kv), A(donor_v[d], kv);
    }
#undef A
    if (!ok) {
        scratch_free(s, c->n_layers);
        return osp_err(OSP_ERR_NOMEM, "out of memory allocating activations");
    }
    return OSP_OK;
}

osp_status osp_session_new_opts(const osp_model *m, const osp_session_opts *o, osp_session **out) {
    *out = NULL;
    const osp_config *c = &m->cfg;
    int32_t n_rows = o->n_rows, max_ctx = o->max_ctx;
    if (n_rows <= 0) return osp_err(OSP_ERR_INVALID, "a session needs at least one row");
    if (max_ctx <= 0 || max_ctx > c->max_pos) max_ctx = c->max_pos;
    OSP_TRY(osp_model_place((osp_model *)m)); /* once per model: see model/pack.c */
    osp_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->m = m;
    osp_kv_spec *specs = calloc((size_t)c->n_layers, sizeof *specs);
    s->all_rows = malloc(sizeof(int32_t) * (size_t)n_rows);
    if (!specs || !s->all_rows) {
        free(specs);
        free(s->all_rows);
        free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    for (int32_t b = 0; b < n_rows; b++) s->all_rows[b] = b;
    for (int i = 0; i < c->n_layers; i++) {
        int32_t bits = o->layer_kv_bits ? o->layer_kv_bits[i] : o->kv_bits;
        int32_t group = o->layer_kv_group && o->layer_kv_group[i] ? o->layer_kv_group[i] : o->kv_group;
        specs[i] = (osp_kv_spec){c->layer_kv_heads[i], c->layer_head_dim[i], c->layer_sliding[i] ? c->sliding_window : 0,
                                 c->layer_kv_donor[i], bits, bits && bits != 16 ? (group ? group : 64) : 0};
    }
    osp_status rc = osp_kv_new(n_rows, c->n_layers, specs, max_ctx, o->spare, &s->kv);
    free(specs);
    if (rc == OSP_OK) s->kv->budget = o->kv_budget;
    int32_t N = o->max_tokens > 0 ? o->max_tokens : (max_ctx < OSP_MAX_CHUNK ? max_ctx : OSP_MAX_CHUNK);
    if (N < n_rows) N = n_rows;
    if (rc == OSP_OK) rc = scratch_new(m, n_rows, N, max_ctx, &s->sc);
    if (rc != OSP_OK) {
        osp_session_free(s);
        return rc;
    }
    *out = s;
    return OSP_OK;
}

osp_status osp_session_new(const osp_model *m, int32_t n_rows, int32_t max_ctx, osp_session **out) {
    osp_session_opts o = {.n_rows = n_rows, .max_ctx = max_ctx};
    return osp_session_new_opts(m, &o, out);
}

void osp_session_free(osp_session *s) {
    if (!s) return;
    osp_kv_free(s->kv);
    scratch_free(&s->sc, s->m->cfg.n_layers);
    free(s->all_rows);
    free(s);
}

void osp_session_reset_row(osp_session *s, int32_t row) { osp_kv_reset_row(s->kv, row); }

size_t osp_session_kv_bytes(const osp_session *s) { return osp_kv_bytes(s->kv); }

int64_t osp_session_kv_row_bytes(const osp_session *s, int32_t n_pos) { return osp_kv_row_bytes(s->kv, n_pos); }

int32_t osp_session_rows(const osp_session *s) { return s->kv->n_rows; }

int32_t osp_session_max_ctx(const osp_session *s) { return s->kv->max_ctx; }

int32_t osp_session_row_pos(const osp_session *s, int32_t row) {
    return row >= 0 && row < s->kv->n_rows ? s->kv->pos[row] : -1;
}

osp_status osp_session_trim_row(osp_session *s, int32_t row, int32_t n) { return osp_kv_trim(s->kv, row, n); }

void osp_session_round_begin(osp_session *s) { osp_kv_round_begin(s->kv); }

osp_status osp_session_rollback(osp_session *s, const int32_t *keep) { return osp_kv_rollback(s->kv, keep); }

void osp_session_commit(osp_session *s) { osp_kv_commit(s->kv); }

/* A session around an existing KV cache, with the options of `like`. */
static osp_status wrap_kv(const osp_session *like, osp_kv *kv, osp_session **out) {
    *out = NULL;
    osp_session_opts o = {.n_rows = kv->n_rows, .max_ctx = kv->max_ctx, .max_tokens = like->sc.max_tok};
    osp_session *s;
    osp_status rc = osp_session_new_opts(like->m, &o, &s); /* scratch and row list for kv's rows */
    if (rc != OSP_OK) {
        osp_kv_free(kv);
        return rc;
    }
    osp_kv_free(s->kv);
    s->kv = kv;
    s->fast = like->fast;
    *out = s;
    return OSP_OK;
}

osp_status osp_session_extract_row(const osp_session *s, int32_t row, osp_session **out) {
    *out = NULL;
    osp_kv *kv;
    OSP_TRY(osp_kv_extract(s->kv, row, &kv));
    return wrap_kv(s, kv, out);
}

osp_status osp_session_merge(const osp_session *const *parts, int32_t n, osp_session **out) {
    *out = NULL;
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "merge needs at least one session");
    const osp_kv *kvs[n];
    for (int32_t i = 0; i < n; i++) {
        if (parts[i]->m != parts[0]->m) return osp_err(OSP_ERR_INVALID, "merge: sessions of different models");
        kvs[i] = parts[i]->kv;
    }
    osp_kv *kv;
    OSP_TRY(osp_kv_merge(kvs, n, &kv));
    return wrap_kv(parts[0], kv, out);
}

osp_status osp_session_filter(osp_session *s, const int32_t *keep, int32_t n) {
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "filter must keep at least one row");
    return osp_kv_filter(s->kv, keep, n);
}

/* ---- layers ---- */

void osp_norm_rows(const osp_ops *ops, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                   int add_one) {
    for (int64_t i = 0; i < n; i++) ops->rmsnorm(y + i * d, x + i * d, w, d, eps, add_one);
}

static void attention_block(osp_session *s, int li, int32_t B, int32_t T) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    const osp_ops *ops = m->ops;
    osp_scratch *sc = &s->sc;
    osp_kv_layer *KL = &s->kv->layers[li];
    int64_t N = (int64_t)B * T, H = c->hidden, D = c->head_dim, Hq = c->n_heads, Hkv = c->n_kv_heads;
    int sliding = c->layer_sliding[li];
    const float *inv = sliding ? m->inv_freq_sliding : m->inv_freq_full;

    osp_norm_rows(ops, sc->xn, sc->x, L->attn_norm, N, H, c->eps, c->norm_add_one);
    {
        const osp_weight *ws[] = {&L->wq, &L->wk, &L->wv};
        float *ys[] = {sc->q, sc->k, sc->v};
        osp_matmul_shared(s, ws, 3, sc->xn, N, ys);
    }
    add_bias(sc->q, L->bq, N, Hq * D);
    add_bias(sc->k, L->bk, N, Hkv * D);
    add_bias(sc->v, L->bv, N, Hkv * D);
    for (int32_t b = 0; b < B; b++)
        for (int32_t t = 0; t < T; t++) {
            int64_t row = (int64_t)b * T + t;
            int32_t pos = sc->bpos[b] + t;
            for (int64_t h = 0; h < Hq; h++) {
                float *q = sc->q + (row * Hq + h) * D;
                if (L->q_norm) ops->rmsnorm(q, q, L->q_norm, D, c->eps, c->norm_add_one);
                osp_rope_apply(q, (int32_t)D, inv, pos);
            }
            for (int64_t h = 0; h < Hkv; h++) {
                float *k = sc->k + (row * Hkv + h) * D;
                if (L->k_norm) ops->rmsnorm(k, k, L->k_norm, D, c->eps, c->norm_add_one);
                osp_rope_apply(k, (int32_t)D, inv, pos);
            }
        }
    osp_attn_args a = {.ops = ops, .kv = s->kv, .layer = li, .rows = s->rows, .nb = B, .T = T,
                       .n_heads = (int32_t)Hq, .n_kv_heads = (int32_t)Hkv, .head_dim = (int32_t)D,
                       .scale = c->attn_scale, .softcap = c->attn_softcap, .window = KL->window, .q = sc->q,
                       .k = sc->k, .v = sc->v, .out = sc->att, .scores = sc->scores,
                       .score_stride = (int64_t)s->kv->max_ctx + sc->max_tok};
    osp_attention(&a);
    osp_kv_write(s->kv, li, s->rows, B, sc->k, sc->v, T);

    osp_matmul(s, &L->wo, sc->att, N, sc->tmp);
    add_bias(sc->tmp, L->bo, N, H);
    if (L->post_attn_norm) osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_attn_norm, N, H, c->eps, c->norm_add_one);
    for (int64_t i = 0; i < N * H; i++) sc->x[i] += sc->tmp[i];
}

static void mlp_block(osp_session *s, int li, int32_t B, int32_t T) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    const osp_layer *L = &m->layers[li];
    const osp_ops *ops = m->ops;
    osp_scratch *sc = &s->sc;
    int64_t N = (int64_t)B * T, H = c->hidden, I = c->intermediate;

    osp_norm_rows(ops, sc->xn, sc->x, L->mlp_norm, N, H, c->eps, c->norm_add_one);
    {
        const osp_weight *ws[] = {&L->wg, &L->wu};
        float *ys[] = {sc->g, sc->u};
        osp_matmul_shared(s, ws, 2, sc->xn, N, ys);
    }
    add_bias(sc->g, L->bg, N, I);
    add_bias(sc->u, L->bu, N, I);
    if (c->act == OSP_ACT_SILU) ops->silu_mul(sc->g, sc->g, sc->u, N * I);
    else ops->gelu_tanh_mul(sc->g, sc->g, sc->u, N * I);
    osp_matmul(s, &L->wd, sc->g, N, sc->tmp);
    add_bias(sc->tmp, L->bd, N, H);
    if (L->post_mlp_norm) osp_norm_rows(ops, sc->tmp, sc->tmp, L->post_mlp_norm, N, H, c->eps, c->norm_add_one);
    for (int64_t i = 0; i < N * H; i++) sc->x[i] += sc->tmp[i];
}

void osp_embed_rows(const osp_model *m, const osp_weight *e, float scale, const int32_t *ids, int64_t n, float *x) {
    int64_t H = e->cols;
    for (int64_t i = 0; i < n; i++) {
        osp_weight_row_f32(e, ids[i], x + i * H);
        if (scale != 1.0f)
            for (int64_t j = 0; j < H; j++) x[i * H + j] *= scale;
    }
}

/* Final norm, LM head and soft-cap. logits rows are written at
 * logits + (b * ld_rows + t) * vocab, or [B, vocab] for the last positions. */
void osp_head(osp_session *s, const float *x, int32_t B, int32_t T, int all_logits, float *logits, int64_t ld_rows) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    const osp_ops *ops = m->ops;
    osp_scratch *sc = &s->sc;
    int64_t N = (int64_t)B * T, H = c->hidden;
    int add_one = c->norm_add_one;
    if (all_logits) {
        osp_norm_rows(ops, sc->xn, x, m->final_norm, N, H, c->eps, add_one);
        for (int32_t b = 0; b < B; b++) {
            float *dst = logits + (int64_t)b * ld_rows * c->vocab;
            osp_matmul(s, &m->head, sc->xn + (int64_t)b * T * H, T, dst);
            if (c->final_softcap > 0) ops->softcap(dst, (int64_t)T * c->vocab, c->final_softcap);
        }
    } else {
        for (int32_t b = 0; b < B; b++)
            ops->rmsnorm(sc->hlast + b * H, x + ((int64_t)b * T + T - 1) * H, m->final_norm, H, c->eps, add_one);
        osp_matmul(s, &m->head, sc->hlast, B, logits);
        if (c->final_softcap > 0) ops->softcap(logits, (int64_t)B * c->vocab, c->final_softcap);
    }
}

/* One chunk through the Llama/Qwen/Gemma 3 body. */
osp_status osp_model_forward_chunk(osp_session *s, const int32_t *ids, int32_t T, int all_logits, float *logits,
                                   int64_t ld_rows) {
    const osp_model *m = s->m;
    const osp_config *c = &m->cfg;
    osp_scratch *sc = &s->sc;
    int32_t B = s->nb;
    for (int32_t b = 0; b < B; b++) sc->bpos[b] = s->kv->pos[s->rows[b]];
    s->per_token = s->fast && T == 1 && B > 1;
    if (c->arch == OSP_ARCH_GEMMA4) return osp_gemma4_forward_chunk(s, ids, T, logits, all_logits, ld_rows);
    osp_embed_rows(m, &m->embed, m->embed_scale, ids, (int64_t)B * T, sc->x);
    for (int li = 0; li < c->n_layers; li++) {
        attention_block(s, li, B, T);
        mlp_block(s, li, B, T);
    }
    for (int32_t b = 0; b < B; b++) s->kv->pos[s->rows[b]] += T;
    if (logits) osp_head(s, sc->x, B, T, all_logits, logits, ld_rows); /* NULL: an intermediate prefill chunk */
    return OSP_OK;
}

osp_status osp_forward_rows(osp_session *s, const int32_t *rows, int32_t nb, const int32_t *ids, int32_t n_tok,
                            int all_logits, float *logits) {
    const osp_config *c = &s->m->cfg;
    osp_kv *kv = s->kv;
    if (n_tok <= 0) return osp_err(OSP_ERR_INVALID, "forward needs at least one token per row");
    if (nb <= 0 || nb > kv->n_rows) return osp_err(OSP_ERR_INVALID, "forward of %d rows in a session of %d", nb, kv->n_rows);
    for (int32_t b = 0; b < nb; b++) {
        int32_t r = rows[b];
        if (r < 0 || r >= kv->n_rows) return osp_err(OSP_ERR_INVALID, "row %d is not in the session", r);
        for (int32_t j = 0; j < b; j++)
            if (rows[j] == r) return osp_err(OSP_ERR_INVALID, "row %d listed twice", r);
        if ((int64_t)kv->pos[r] + n_tok > kv->max_ctx)
            return osp_err(OSP_ERR_RANGE, "row %d: %d + %d tokens exceed the context of %d", r, kv->pos[r], n_tok,
                           kv->max_ctx);
        for (int32_t t = 0; t < n_tok; t++) {
            int32_t id = ids[(int64_t)b * n_tok + t];
            if (id < 0 || id >= c->vocab)
                return osp_err(OSP_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", id, c->vocab - 1);
        }
    }
    for (int32_t b = 0; b < nb; b++) OSP_TRY(osp_kv_reserve(kv, rows[b], kv->pos[rows[b]] + n_tok));
    s->rows = rows;
    s->nb = nb;
    int32_t step = s->sc.max_tok / nb;
    for (int32_t t0 = 0; t0 < n_tok; t0 += step) {
        int32_t T = n_tok - t0 < step ? n_tok - t0 : step;
        for (int32_t b = 0; b < nb; b++)
            memcpy(s->sc.ids + (int64_t)b * T, ids + (int64_t)b * n_tok + t0, sizeof(int32_t) * T);
        int last = t0 + T >= n_tok;
        float *dst = all_logits ? logits + (int64_t)t0 * c->vocab : logits;
        if (!all_logits && !last) dst = NULL; /* only the last chunk's logits are wanted */
        OSP_TRY(osp_model_forward_chunk(s, s->sc.ids, T, all_logits, dst, n_tok));
    }
    return OSP_OK;
}

osp_status osp_forward(osp_session *s, const int32_t *ids, int32_t n_tok, int all_logits, float *logits) {
    return osp_forward_rows(s, s->all_rows, s->kv->n_rows, ids, n_tok, all_logits, logits);
}

osp_status osp_set_threads(int n) {
    osp_threads_init(n);
    return OSP_OK;
}
