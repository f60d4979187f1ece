/* backend/cpu/encdec: the encoder-decoder operations (model/whisper.c) on
 * the CPU: linears as 64-row × 64-token tiles of the ops table's matmul on
 * the thread pool (a tile's numbers never depend on the split), the full
 * attentions as two GEMMs per 16 queries (K as [heads][S][hd], V
 * transposed), the decoder's self-attention over its rows' caches on the
 * ops table's scores/softmax/wsum. With `serial` set every task runs on
 * the calling thread (a caller beside another user of the pool). */
#include <math.h>
#include <string.h>
#include "backend/cpu/bf16t.h"
#include "backend/cpu/cpu.h"
#include "core/threadpool.h"

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

#define MM_ROWS 64
#define MM_TOKS 64
#define ATT_Q 16           /* queries per attention task */
#define ATT_MAX_KEYS 4096  /* keys of a cached row, at most (scores on the stack) */
#define ATT_MAX_HD 256     /* head size, at most */
#define ATT_FULL_KEYS 1500 /* keys of a full attention, at most (a Whisper window) */

static void par(const osp_be_session *s, int64_t n, osp_task_fn fn, void *ctx) {
    if (s->serial)
        for (int64_t t = 0; t < n; t++) fn(ctx, t);
    else
        osp_parallel_for(n, fn, ctx);
}

static void set_serial(osp_be_session *s, int serial) { s->serial = serial != 0; }

/* ---- linear ---- */

typedef struct lin_ctx {
    const osp_ops *ops;
    const osp_weight *w;
    const float *x, *bias;
    float *y;
    int64_t n, rblocks;
} lin_ctx;

static void lin_task(void *p, int64_t t) {
    const lin_ctx *c = p;
    int64_t rb = t % c->rblocks, tb = t / c->rblocks;
    int64_t r0 = rb * MM_ROWS, r1 = r0 + MM_ROWS < c->w->rows ? r0 + MM_ROWS : c->w->rows;
    int64_t t0 = tb * MM_TOKS, nt = c->n - t0 < MM_TOKS ? c->n - t0 : MM_TOKS;
    float *y = c->y + t0 * c->w->rows + r0;
    c->ops->matmul(c->w, c->x + t0 * c->w->cols, nt, y, c->w->rows, r0, r1);
    if (c->bias)
        for (int64_t i = 0; i < nt; i++)
            for (int64_t r = r0; r < r1; r++) y[i * c->w->rows + r - r0] += c->bias[r];
}

/* Production precision, bf16 weights, a CPU with a bf16 engine (backend/cpu/bf16t.h: AMX or AVX512-BF16), 64 tokens at a time
 * (the session's packing room), rows split over the pool. */
typedef struct lin_bt_ctx {
    osp_bf16t_kind k;
    const osp_weight *w;
    const uint16_t *xp;
    float *y;
    int64_t n;
} lin_bt_ctx;

static void lin_bt_task(void *p, int64_t t) {
    const lin_bt_ctx *c = p;
    int64_t r0 = t * MM_ROWS, r1 = r0 + MM_ROWS < c->w->rows ? r0 + MM_ROWS : c->w->rows;
    osp_bf16t_mm(c->k, c->w, c->xp, c->n, c->y + r0, c->w->rows, r0, r1);
}

/* A step whose tokens are each computed as alone (begin_chunk with exact tokens: the decoder's batched steps):
 * per 64-row block, every token through the one-token kernel, the block read once for all of them. */
static void lin_each_task(void *p, int64_t rb) {
    const lin_ctx *c = p;
    const osp_weight *w = c->w;
    int64_t r0 = rb * MM_ROWS, r1 = r0 + MM_ROWS < w->rows ? r0 + MM_ROWS : w->rows;
    float *y = c->y + r0;
    if (!(c->ops->matmul_each && c->ops->matmul_each(w, c->x, c->n, y, w->rows, r0, r1)))
        for (int64_t t = 0; t < c->n; t++) c->ops->matmul(w, c->x + t * w->cols, 1, y + t * w->rows, w->rows, r0, r1);
    if (c->bias)
        for (int64_t t = 0; t < c->n; t++)
            for (int64_t r = r0; r < r1; r++) y[t * w->rows + r - r0] += c->bias[r];
}

static void bias_task(void *p, int64_t t) {
    const lin_ctx *c = p;
    float *y = c->y + t * c->w->rows;
    for (int64_t r = 0; r < c->w->rows; r++) y[r] += c->bias[r];
}

static void linear(osp_be_session *s, const osp_weight *w, const osp_dbuf *x, int64_t n, const osp_dbuf *bias,
                   osp_dbuf *y) {
    if (s->fast && s->bt && osp_bf16t_fits(w) && w->cols <= s->bt_cols && s->q8cap > 0) {
        const int64_t R = w->rows, C = w->cols;
        for (int64_t t0 = 0; t0 < n; t0 += s->q8cap) {
            const int64_t nc = n - t0 < s->q8cap ? n - t0 : s->q8cap;
            osp_bf16t_pack_fast(s->btk, CF(x) + t0 * C, nc, C, s->bt, 0, C / OSP_BF16T_COLS);
            lin_bt_ctx c = {s->btk, w, s->bt, F(y) + t0 * R, nc};
            par(s, (R + MM_ROWS - 1) / MM_ROWS, lin_bt_task, &c);
        }
        if (bias) {
            lin_ctx c = {s->ops, w, NULL, CF(bias), F(y), n, 0};
            par(s, n, bias_task, &c);
        }
        return;
    }
    lin_ctx c = {s->ops, w, CF(x), CF(bias), F(y), n, (w->rows + MM_ROWS - 1) / MM_ROWS};
    if (s->per_token && n > 1) par(s, c.rblocks, lin_each_task, &c);
    else par(s, c.rblocks * ((n + MM_TOKS - 1) / MM_TOKS), lin_task, &c);
}

/* ---- row operations ---- */

/* Row operations are split over the pool in ranges of rows (or elements): each row's (element's) operations
 * are the same whichever thread runs them. */
typedef struct ln_ctx {
    const float *x, *w, *b;
    float *y;
    int64_t n, d;
    float eps;
} ln_ctx;

#define LN_ROWS 16      /* rows a layer-norm task */
#define GELU_ELEMS 8192 /* elements a GELU task */

static void ln_task(void *p, int64_t task) {
    const ln_ctx *c = p;
    const int64_t d = c->d, t1 = (task + 1) * LN_ROWS < c->n ? (task + 1) * LN_ROWS : c->n;
    for (int64_t t = task * LN_ROWS; t < t1; t++) {
        const float *xi = c->x + t * d;
        float *yi = c->y + t * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++) mean += xi[i];
        mean /= d;
        for (int64_t i = 0; i < d; i++) var += (xi[i] - mean) * (xi[i] - mean);
        float inv = (float)(1.0 / sqrt(var / d + c->eps));
        for (int64_t i = 0; i < d; i++) yi[i] = (float)(xi[i] - mean) * inv * c->w[i] + c->b[i];
    }
}

static void layernorm(osp_be_session *s, osp_dbuf *yb, const osp_dbuf *xb, const osp_dbuf *wb, const osp_dbuf *bb,
                      int64_t n, int64_t d, float eps) {
    ln_ctx c = {CF(xb), CF(wb), CF(bb), F(yb), n, d, eps};
    par(s, (n + LN_ROWS - 1) / LN_ROWS, ln_task, &c);
}

typedef struct gelu_ctx {
    const osp_ops *ops;
    float *x;
    int64_t n;
} gelu_ctx;

static void gelu_task(void *p, int64_t task) {
    const gelu_ctx *c = p;
    const int64_t i1 = (task + 1) * GELU_ELEMS < c->n ? (task + 1) * GELU_ELEMS : c->n;
    c->ops->gelu_erf(c->x + task * GELU_ELEMS, i1 - task * GELU_ELEMS);
}

static void gelu(osp_be_session *s, osp_dbuf *xb, int64_t n) {
    gelu_ctx c = {s->ops, F(xb), n};
    par(s, (n + GELU_ELEMS - 1) / GELU_ELEMS, gelu_task, &c);
}

static void im2col(osp_be_session *s, const osp_im2col_args *a) {
    (void)s;
    const float *x = CF(a->x);
    float *col = F(a->col);
    const int64_t C = a->C, k = a->k;
    for (int64_t t = 0; t < a->t_out; t++)
        for (int64_t ci = 0; ci < C; ci++)
            for (int64_t j = 0; j < k; j++) {
                int64_t src = a->stride * t + j - a->pad;
                col[a->k_major ? t * C * k + j * C + ci : (t * C + ci) * k + j] =
                    src >= 0 && src < a->t_in ? x[ci * a->ld_c + src * a->ld_f] : 0.0f;
            }
}

typedef struct pack_kv_ctx {
    float *kh, *vt;
    const float *k, *v;
    int64_t S, ld;
    int32_t hd;
} pack_kv_ctx;

static void pack_kv_task(void *p, int64_t h) { /* one head */
    const pack_kv_ctx *c = p;
    const int64_t S = c->S, ld = c->ld, hd = c->hd;
    for (int64_t j = 0; j < S; j++) {
        memcpy(c->kh + (h * S + j) * hd, c->k + j * ld + h * hd, sizeof(float) * hd);
        for (int64_t e = 0; e < hd; e++) c->vt[(h * hd + e) * S + j] = c->v[j * ld + h * hd + e];
    }
}

static void pack_kv(osp_be_session *s, osp_dbuf *khb, osp_dbuf *vtb, const osp_dbuf *kb, const osp_dbuf *vb,
                    int64_t S, int64_t ld, int32_t heads, int32_t hd) {
    pack_kv_ctx c = {F(khb), F(vtb), CF(kb), CF(vb), S, ld, hd};
    par(s, heads, pack_kv_task, &c);
}

/* ---- full attention: a block of 16 queries is two matrix products on the
 * ops table's GEMM (scores = Q_blk K_hᵀ, out = P V_h as Vᵀ_h rows); fewer
 * than 16, one query at a time (scores, softmax, dots) ---- */

typedef struct fatt_ctx {
    const osp_ops *ops;
    const float *q, *kh, *vt;
    float *out;
    int64_t n, S, ld, hd, qblocks;
} fatt_ctx;

static void fatt_task(void *p, int64_t t) {
    const fatt_ctx *c = p;
    const int64_t hd = c->hd, S = c->S, h = t / c->qblocks, i0 = (t % c->qblocks) * ATT_Q;
    const int64_t ni = c->n - i0 < ATT_Q ? c->n - i0 : ATT_Q;
    const float *K = c->kh + h * S * hd, *Vt = c->vt + h * hd * S;
    float qb[ATT_Q * ATT_MAX_HD], ob[ATT_Q * ATT_MAX_HD], sc[ATT_Q * ATT_FULL_KEYS];
    for (int64_t i = 0; i < ni; i++) memcpy(qb + i * hd, c->q + (i0 + i) * c->ld + h * hd, sizeof(float) * hd);
    if (ni == ATT_Q) {
        osp_weight kw = {.dtype = OSP_DT_F32, .rows = S, .cols = hd, .data = K};
        osp_weight vw = {.dtype = OSP_DT_F32, .rows = hd, .cols = S, .data = Vt};
        c->ops->matmul(&kw, qb, ni, sc, S, 0, S);
        for (int64_t i = 0; i < ni; i++) c->ops->softmax(sc + i * S, S);
        c->ops->matmul(&vw, sc, ni, ob, hd, 0, hd);
    } else {
        for (int64_t i = 0; i < ni; i++) {
            c->ops->scores(sc, qb + i * hd, K, S, hd, hd);
            c->ops->softmax(sc, S);
            for (int64_t j = 0; j < hd; j++) ob[i * hd + j] = c->ops->dot(sc, Vt + j * S, S);
        }
    }
    for (int64_t i = 0; i < ni; i++) memcpy(c->out + (i0 + i) * c->ld + h * hd, ob + i * hd, sizeof(float) * hd);
}

static void full_attention(osp_be_session *s, const osp_full_attn_args *a) {
    if (a->S > ATT_FULL_KEYS || a->hd > ATT_MAX_HD) return; /* the model checks its shapes at load */
    fatt_ctx c = {s->ops, CF(a->q), CF(a->kh), CF(a->vt), F(a->out), a->n, a->S, a->ld, a->hd,
                  (a->n + ATT_Q - 1) / ATT_Q};
    par(s, a->heads * c.qblocks, fatt_task, &c);
}

static void full_scores(osp_be_session *s, osp_dbuf *out, const osp_dbuf *q, const osp_dbuf *kh, int64_t n, int64_t S,
                        int64_t ld, int32_t head, int32_t hd) {
    for (int64_t i = 0; i < n; i++)
        s->ops->scores(F(out) + i * S, CF(q) + i * ld + (int64_t)head * hd, CF(kh) + (int64_t)head * S * hd, S, hd, hd);
}

/* ---- the decoder's self-attention over its rows' caches: one task per
 * (head, block of 16 tokens) ---- */

static void rows_store(osp_be_session *s, osp_dbuf *kc, osp_dbuf *vc, const osp_dbuf *k, const osp_dbuf *v,
                       const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld) {
    (void)s;
    for (int64_t i = 0; i < n; i++) {
        int64_t at = ((int64_t)row[i] * ctx + pos[i]) * ld;
        memcpy(F(kc) + at, CF(k) + i * ld, sizeof(float) * ld);
        memcpy(F(vc) + at, CF(v) + i * ld, sizeof(float) * ld);
    }
}

typedef struct ratt_ctx {
    const osp_ops *ops;
    const osp_rows_attn_args *a;
    int64_t qblocks;
} ratt_ctx;

static void ratt_task(void *p, int64_t t) {
    const ratt_ctx *c = p;
    const osp_rows_attn_args *a = c->a;
    const int64_t hd = a->hd, ld = a->ld, h = t / c->qblocks, i0 = (t % c->qblocks) * ATT_Q;
    const int64_t i1 = i0 + ATT_Q < a->n ? i0 + ATT_Q : a->n;
    float sc[ATT_MAX_KEYS];
    for (int64_t i = i0; i < i1; i++) {
        const int64_t keys = a->pos[i] + 1, base = (int64_t)a->row[i] * a->ctx * ld + h * hd;
        float *o = F(a->out) + i * ld + h * hd;
        c->ops->scores(sc, CF(a->q) + i * ld + h * hd, CF(a->k) + base, keys, ld, hd);
        c->ops->softmax(sc, keys);
        memset(o, 0, sizeof(float) * hd);
        c->ops->wsum(o, sc, CF(a->v) + base, keys, ld, hd);
    }
}

static void rows_attention(osp_be_session *s, const osp_rows_attn_args *a) {
    if (a->ctx > ATT_MAX_KEYS) return; /* the model checks its shapes at load */
    ratt_ctx c = {s->ops, a, (a->n + ATT_Q - 1) / ATT_Q};
    par(s, a->heads * c.qblocks, ratt_task, &c);
}

void osp_cpu_encdec_fill(osp_backend *b) {
    b->set_serial = set_serial;
    b->linear = linear;
    b->layernorm = layernorm;
    b->gelu = gelu;
    b->im2col = im2col;
    b->pack_kv = pack_kv;
    b->full_attention = full_attention;
    b->full_scores = full_scores;
    b->rows_store = rows_store;
    b->rows_attention = rows_attention;
}
