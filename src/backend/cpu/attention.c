/* backend/cpu/attention: causal (optionally windowed) attention of a chunk
 * of new tokens against each row's cached past, on the thread pool.
 *
 * Keys and values of positions before the chunk come from the KV cache
 * (storage layer kv->layers[layer], f32, bf16 or affine-quantized planes
 * read as stored); those of the chunk itself come from the chunk buffers,
 * so attention runs before the chunk is stored and a sliding ring never
 * needs more than its window. Batch row i is KV row rows[i]; each query
 * sees exactly its own row's positions [lo, p], so rows at different
 * positions need no padding and a row's numbers never depend on the other
 * rows of the batch. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/kvq.h"
#include "core/options.h"
#include "core/threadpool.h"
#include "kv/kv.h"

/* The chunk's arrays, as host pointers, and the kernels. */
typedef struct attn_view {
    const osp_attn_args *a;
    const osp_ops *ops;
    const float *q, *k, *v;
    float *out, *scores;
} attn_view;

/* scores[j - lo] = q · K[j] for cached positions j in [lo, end), in runs of
 * consecutive ring slots. */
static void cached_scores(const attn_view *w, const osp_kv_layer *L, int32_t row, int32_t hk, const float *q,
                          int32_t lo, int32_t end, float *sc) {
    int32_t D = w->a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot; /* a ring wraps */
        if (L->bits) {
            osp_kv_qrows k = osp_kv_q(L, row, 0, hk, slot);
            osp_kvq_ops_get()->scores(q, D, L->bits, L->group, k.codes, k.scales, k.biases, run, sc + (j - lo));
        } else {
            w->ops->scores(sc + (j - lo), q, osp_kv_f32(L, row, 0, hk, slot), run, D, D);
        }
        j += run;
    }
}

/* o += sum_j p[j - lo] V[j] over cached positions [lo, end). */
static void cached_values(const attn_view *w, const osp_kv_layer *L, int32_t row, int32_t hk, const float *p,
                          int32_t lo, int32_t end, float *o) {
    int32_t D = w->a->head_dim;
    for (int32_t j = lo; j < end;) {
        int32_t slot = osp_kv_slot(L, j), run = end - j;
        if (L->sliding && slot + run > L->ring) run = L->ring - slot;
        if (L->bits) {
            osp_kv_qrows v = osp_kv_q(L, row, 1, hk, slot);
            osp_kvq_ops_get()->wsum(o, p + (j - lo), run, D, L->bits, L->group, v.codes, v.scales, v.biases);
        } else {
            w->ops->wsum(o, p + (j - lo), osp_kv_f32(L, row, 1, hk, slot), run, D, D);
        }
        j += run;
    }
}

/* x *= s, vectorized (the per-element softcap test in the same loop kept it
 * scalar: 7% of a 4K-token prefill); each product as the scalar one. */
__attribute__((optimize("tree-vectorize"))) static void scale_in_place(float *x, int32_t n, float s) {
    for (int32_t i = 0; i < n; i++) x[i] *= s;
}

/* Positions per block: the query heads of one KV head take turns on a
 * block of K (then of V) while it is in L1, so a long cache is read from
 * memory once per KV head instead of once per query head. */
static int32_t block_positions(int32_t D) { return D >= 256 ? 16 : 4096 / D; }

/* The chunk's own positions go in blocks too, of a multiple of 16 rows:
 * the scores kernel folds rows in groups of 16 from the start of a call, so
 * calls that start 16k rows in give every row the bits one call over the
 * whole range gives it (and wsum adds a value's terms in position order
 * either way). */
static int32_t chunk_positions(int32_t D) {
    int32_t b = block_positions(D) & ~15;
    return b < 16 ? 16 : b;
}

/* Tokens a work item takes: they share each block of K and V while it is
 * in L1 (a prefill's queries read the same earlier positions). */
#define ATT_TT 8

typedef struct attn_job {
    attn_view w;
    int32_t n_sub;     /* work items per (row, KV head, token tile): its query heads split into n_sub runs */
    int32_t tt, n_tiles, nh_max;
    int64_t items;
    _Atomic int64_t next;
    float *scratch;    /* per worker: scores [tt][nh_max][sc_len], then K and V blocks; NULL: none */
    int64_t slot_floats;
    int64_t sc_len;    /* the scratch's score rows */
} attn_job;

/* The cached positions of each token of a tile in blocks: block k of token
 * t is [lo[t] + k blk, ...) up to end[t], the blocks every token gets alone
 * (decode); the tile's tokens take turns on a block. */
static void cached_pass(const attn_job *job, const osp_kv_layer *L, int32_t row, int32_t hk, int32_t nt, int32_t nh,
                        const int32_t *lo, const int32_t *end, float *const *sc, const float *const *q, float *const *o,
                        int values) {
    const int32_t blk = block_positions(job->w.a->head_dim);
    for (int32_t k = 0;; k++) {
        int any = 0;
        for (int32_t t = 0; t < nt; t++) {
            int32_t jb = lo[t] + k * blk;
            if (jb >= end[t]) continue;
            any = 1;
            int32_t je = jb + blk < end[t] ? jb + blk : end[t];
            for (int32_t h = 0; h < nh; h++) {
                float *s = sc[t * nh + h] + (jb - lo[t]);
                if (values) cached_values(&job->w, L, row, hk, s, jb, je, o[t * nh + h]);
                else cached_scores(&job->w, L, row, hk, q[t * nh + h], jb, je, s);
            }
        }
        if (!any) return;
    }
}

/* The chunk's own positions [from[t], to[t]] of each token: block k of
 * token t starts chunk_positions(D) k rows after from[t]; the tile's rows
 * of a block are copied to buf (contiguous: the chunk's rows of one KV head
 * are Hkv D apart, which L1's sets do not hold) when there is one;
 * without, one block a token (the calls it gets alone). */
static void chunk_pass(const attn_job *job, int32_t b, int32_t hk, int32_t pos0, int32_t nt, int32_t nh,
                       const int32_t *lo, const int32_t *from, const int32_t *to, float *const *sc,
                       const float *const *q, float *const *o, float *buf, int values) {
    const osp_attn_args *a = job->w.a;
    const int32_t D = a->head_dim, cb = buf ? chunk_positions(D) : INT32_MAX / 2; /* no buf: one call a token */
    const int64_t ld = (int64_t)a->n_kv_heads * D;
    const float *base = (values ? job->w.v : job->w.k) + (int64_t)hk * D;
#define CHUNK_ROW(j) (base + ((int64_t)b * a->T + ((j) - pos0)) * ld) /* position j's row of this KV head */
    for (int32_t k = 0;; k++) {
        int32_t ub = INT32_MAX, ue = -1;
        for (int32_t t = 0; t < nt; t++) {
            int32_t jb = from[t] + k * cb;
            if (jb > to[t]) continue;
            int32_t je = jb + cb <= to[t] + 1 ? jb + cb : to[t] + 1;
            ub = jb < ub ? jb : ub;
            ue = je > ue ? je : ue;
        }
        if (ue < 0) break;
        const float *rows = CHUNK_ROW(ub);
        int64_t stride = ld;
        if (buf) {
            for (int32_t j = ub; j < ue; j++) memcpy(buf + (int64_t)(j - ub) * D, CHUNK_ROW(j), sizeof(float) * D);
            rows = buf, stride = D;
        }
        for (int32_t t = 0; t < nt; t++) {
            int32_t jb = from[t] + k * cb;
            if (jb > to[t]) continue;
            int32_t n = (jb + cb <= to[t] + 1 ? jb + cb : to[t] + 1) - jb;
            const float *r = rows + (int64_t)(jb - ub) * stride;
            for (int32_t h = 0; h < nh; h++) {
                float *s = sc[t * nh + h] + (jb - lo[t]);
                if (values) job->w.ops->wsum(o[t * nh + h], s, r, n, stride, D);
                else job->w.ops->scores(s, q[t * nh + h], r, n, stride, D);
            }
        }
    }
#undef CHUNK_ROW
}

/* A tile of tokens of one row, the query heads [h0, h1) of one KV head.
 * Every query's numbers are those it gets alone: the same kernel calls on
 * the same ranges of positions (or calls that split them where the kernels
 * give the same bits), in the same order. */
static void attn_tile(const attn_job *job, int32_t tile, int32_t b, int32_t hk, int32_t sub, float *buf) {
    const attn_view *w = &job->w;
    const osp_attn_args *a = w->a;
    const osp_ops *ops = w->ops;
    const osp_kv_layer *L = &a->kv->layers[a->layer];
    const int32_t Hq = a->n_heads, Hkv = a->n_kv_heads, D = a->head_dim, G = Hq / Hkv, ns = job->n_sub;
    const int32_t h0 = hk * G + sub * G / ns, h1 = hk * G + (sub + 1) * G / ns, nh = h1 - h0;
    const int32_t row = a->rows[b], pos0 = a->kv->pos[row];
    const int32_t t0 = tile * job->tt, nt = a->T - t0 < job->tt ? a->T - t0 : job->tt;
    if (nt < 1 || nh < 1) return;
    int32_t lo[ATT_TT], cend[ATT_TT], j0[ATT_TT], pp[ATT_TT];
    float *sc[ATT_TT * 64], *o[ATT_TT * 64];
    const float *q[ATT_TT * 64];
    for (int32_t t = 0; t < nt; t++) {
        const int32_t p = pos0 + t0 + t;
        pp[t] = p;
        lo[t] = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        cend[t] = a->chunk_stored ? p : pos0; /* cached positions are [lo, cend) */
        j0[t] = cend[t] > lo[t] ? cend[t] : lo[t]; /* this chunk's own positions [j0, p] */
        const int64_t r = (int64_t)b * a->T + t0 + t;
        for (int32_t h = 0; h < nh; h++) {
            sc[t * nh + h] = buf ? buf + ((int64_t)t * job->nh_max + h) * job->sc_len
                                 : (float *)w->scores + ((int64_t)b * Hq + h0 + h) * a->score_stride;
            q[t * nh + h] = w->q + r * Hq * D + (int64_t)(h0 + h) * D;
            o[t * nh + h] = w->out + r * Hq * D + (int64_t)(h0 + h) * D;
        }
    }
    float *kvbuf = buf ? buf + (int64_t)job->tt * job->nh_max * job->sc_len : NULL;
    cached_pass(job, L, row, hk, nt, nh, lo, cend, sc, q, o, 0);
    chunk_pass(job, b, hk, pos0, nt, nh, lo, j0, pp, sc, q, o, kvbuf, 0);
    const float scale = a->scale, cap = a->softcap;
    for (int32_t t = 0; t < nt; t++) {
        const int32_t n = pp[t] - lo[t] + 1;
        for (int32_t h = 0; h < nh; h++) {
            float *s = sc[t * nh + h];
            if (cap > 0)
                for (int32_t i = 0; i < n; i++) s[i] = cap * tanhf(s[i] * scale / cap);
            else
                scale_in_place(s, n, scale);
            ops->softmax(s, n);
            memset(o[t * nh + h], 0, sizeof(float) * D);
        }
    }
    cached_pass(job, L, row, hk, nt, nh, lo, cend, sc, q, o, 1);
    chunk_pass(job, b, hk, pos0, nt, nh, lo, j0, pp, sc, q, o, kvbuf, 1);
}

/* Item i: with scratch, one tile (the longest tiles first); without, every
 * token of (row, KV head, heads) in turn (they share the model's scores). */
static void attn_item(const attn_job *job, int64_t item, float *buf) {
    const osp_attn_args *a = job->w.a;
    const int32_t Hkv = a->n_kv_heads, ns = job->n_sub;
    const int64_t per = (int64_t)a->nb * Hkv * ns, rest = item % per;
    const int32_t b = (int32_t)(rest / ((int64_t)Hkv * ns)), hk = (int32_t)(rest / ns % Hkv), sub = (int32_t)(rest % ns);
    if (buf) attn_tile(job, job->n_tiles - 1 - (int32_t)(item / per), b, hk, sub, buf);
    else
        for (int32_t t = 0; t < job->n_tiles; t++) attn_tile(job, t, b, hk, sub, NULL);
}

/* A worker takes items until none is left; its slot of the scratch is its own. */
static void attn_worker(void *p, int64_t slot) {
    attn_job *job = p;
    float *buf = job->scratch ? job->scratch + slot * job->slot_floats : NULL;
    for (;;) {
        int64_t it = atomic_fetch_add(&job->next, 1);
        if (it >= job->items) return;
        attn_item(job, it, buf);
    }
}

/* All threads' scratch at most (prefill tiles of fewer tokens, then none, past it). */
#define ATT_SCRATCH_FLOATS ((int64_t)16 << 20)

/* Work items of (token tile, row, KV head) when that gives every thread a
 * few; else the query heads of a KV head are split further (Gemma 4's
 * single global KV head). A head's numbers do not depend on the split.
 * A thread's scratch holds a tile's scores, rows as long as this call's
 * queries see (not the context's length); where the threads' scratch
 * would pass ATT_SCRATCH_FLOATS the tiles shrink, and past that (or with
 * OSP_ATT_NOSCRATCH set, for tests) a token at a time in the model's
 * scores buffer, as before tiles: the same numbers either way. */
void osp_cpu_attention(osp_be_session *s, const osp_attn_args *a) {
    const int32_t G = a->n_heads / a->n_kv_heads, nt = osp_threads_count(), want = 4 * nt;
    int64_t len = 0; /* the most positions a query of this call sees */
    for (int32_t b = 0; b < a->nb; b++) {
        int64_t e = (int64_t)a->kv->pos[a->rows[b]] + a->T;
        len = e > len ? e : len;
    }
    if (a->window > 0 && len > a->window) len = a->window;
    len = (len + 15) & ~(int64_t)15;
    const int no_scratch = osp_options_get()->att_noscratch;
    int32_t tt = a->T < ATT_TT ? a->T : ATT_TT, ns = 1, nh_max = G;
    int64_t slot = 0;
    for (;; tt /= 2) {
        const int32_t tiles = (a->T + tt - 1) / tt;
        ns = 1;
        while (ns < G && (int64_t)tiles * a->nb * a->n_kv_heads * ns < want) ns *= 2;
        if (ns > G) ns = G;
        nh_max = (G + ns - 1) / ns;
        slot = (int64_t)tt * nh_max * len + 2 * (int64_t)(chunk_positions(a->head_dim) + tt) * a->head_dim;
        if (tt == 1 || slot * nt <= ATT_SCRATCH_FLOATS) break;
    }
    const int use = !no_scratch && nh_max <= 64 && slot * nt <= ATT_SCRATCH_FLOATS;
    if (use && (size_t)(slot * nt) > s->att_floats) { /* (grows; never shrinks) */
        osp_free(s->att);
        s->att = osp_malloc(OSP_POOL_SCRATCH, sizeof(float) * (size_t)(slot * nt));
        s->att_floats = s->att ? (size_t)(slot * nt) : 0;
    }
    const int32_t tiles = (a->T + tt - 1) / tt;
    attn_job job = {{a, s->ops, (const float *)a->q, (const float *)a->k, (const float *)a->v, (float *)a->out,
                     (float *)a->scores},
                    ns, tt, tiles, nh_max, 0, 0, NULL, slot, len};
    if (use && s->att && (size_t)(slot * nt) <= s->att_floats) {
        job.scratch = s->att;
        job.items = (int64_t)tiles * a->nb * a->n_kv_heads * ns;
    } else {
        job.tt = 1, job.n_tiles = a->T;
        int32_t n1 = 1;
        while (n1 < G && (int64_t)a->nb * a->n_kv_heads * n1 < want) n1 *= 2;
        job.n_sub = n1 > G ? G : n1;
        if ((G + job.n_sub - 1) / job.n_sub > ATT_TT * 64) return; /* (no model has so many heads a KV head) */
        job.items = (int64_t)a->nb * a->n_kv_heads * job.n_sub;
    }
    atomic_store(&job.next, 0);
    osp_parallel_for(nt, attn_worker, &job);
}
