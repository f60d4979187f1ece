/* backend/cuda: the CUDA backend. Activations, weight vectors, placed
 * matmul weights and KV blocks live in device memory; every operation is a
 * kernel (kernels.h; the .cu files) on the session's stream, submitted through step.c
 * (staged host data, CUDA graphs for decode steps).
 *
 * Precisions: reference (f32 everywhere, the goldens' tier) and production
 * (set_fast): prefill chunks of one row with 16 or more tokens multiply on
 * the tensor cores through cuBLAS (bf16 operands, f32 accumulation); other
 * chunks (decode steps of any number of rows) through the backend's own
 * tensor-core kernel for bf16 and 4/8-bit weights (bf16 operands, f32
 * accumulation, the reduction order fixed by the weight's shape). Each
 * precision uses the same kernels whatever the number of rows, so a row's
 * numbers do not depend on its batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/blas.h"
#include "backend/ops.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels.h"
#include "core/options.h"
#include "kv/kv.h"

#define D(p) ((float *)(p))
#define CD(p) ((const float *)(p))
#define note osp_cu_note
/* submit an operation: its argument struct is zeroed first (padding too: its bytes are the fingerprint) */
/* what is held back goes first (flush): an operation always runs after those submitted before it */
#define SUBMIT(s, fn, a) (flush(s), osp_cu_submit((s), (fn), &(a), sizeof(a)))
#define ARGS(type, a) type a; memset(&a, 0, sizeof a)

/* ---- memory ---- */

static osp_dbuf *cu_alloc(size_t n) {
    void *p = NULL;
    return cudaMalloc(&p, (n ? n : 1) * sizeof(float)) == cudaSuccess ? (osp_dbuf *)p : NULL;
}

/* every legacy-stream operation and free under osp_cu_legacy_lock (no other session is capturing) */
#define LEGACY(stmt) (osp_cu_legacy_lock(), (stmt), osp_cu_legacy_unlock())

static void cu_free(osp_dbuf *p) { LEGACY(cudaFree(p)); }

static osp_dbuf *cu_adopt_vec(float *host, int64_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)(n ? n : 1) * sizeof(float)) != cudaSuccess) return NULL;
    LEGACY(cudaMemcpy(p, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
    osp_free(host);
    return (osp_dbuf *)p;
}

static void cu_write(osp_dbuf *dst, const float *host, int64_t n) {
    LEGACY(cudaMemcpy(dst, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
}

static void cu_read(float *host, const osp_dbuf *src, int64_t n) {
    LEGACY(cudaMemcpy(host, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
}

/* KV blocks are allocated, copied and freed between steps, on the legacy
 * stream, which the sessions' (blocking) streams are ordered with both
 * ways: no host synchronization is needed. */
static void *kv_alloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    int e;
    LEGACY(e = cudaMemsetAsync(p, 0, n, 0));
    if (e != cudaSuccess) {
        LEGACY(cudaFree(p));
        return NULL;
    }
    return p;
}

static void kv_free(void *p, size_t n) {
    (void)n;
    LEGACY(cudaFree(p));
}
static void kv_copy(void *d, const void *s, size_t n) { LEGACY(cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, 0)); }
static void kv_to_host(void *h, const void *s, size_t n) { LEGACY(cudaMemcpy(h, s, n, cudaMemcpyDeviceToHost)); }
static void kv_from_host(void *d, const void *h, size_t n) { LEGACY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); }
static const osp_kv_mem KV_MEM = {kv_alloc, kv_free, kv_copy, kv_to_host, kv_from_host};

/* ---- weights ---- */

typedef struct placed {
    void *arena;
    osp_cu_weight *descs;
} placed;

static int dt_code(osp_dtype t) { return t == OSP_DT_BF16 ? 2 : t == OSP_DT_F16 ? 1 : 0; }

static size_t r256(size_t n) { return (n + 255) & ~(size_t)255; }

static void weight_parts(const osp_weight *w, size_t part[3]) {
    if (w->qbits) {
        part[0] = (size_t)(w->rows * w->cols * w->qbits / 8);
        part[1] = part[2] = (size_t)(w->rows * (w->cols / w->group)) * osp_dtype_size(w->sdtype);
    } else {
        part[0] = (size_t)(w->rows * w->cols) * osp_dtype_size(w->dtype);
        part[1] = part[2] = 0;
    }
}

static osp_status cu_place(osp_weight *const *ws, int n, const void *const *keep, int n_keep, const osp_region *maps,
                           int n_maps, void **owned) {
    (void)keep, (void)n_keep, (void)maps, (void)n_maps; /* the host copies stay mapped (embeddings gather from them) */
    *owned = NULL;
    size_t total = 0, part[3];
    for (int i = 0; i < n; i++) {
        weight_parts(ws[i], part);
        total += r256(part[0]) + r256(part[1]) + r256(part[2]);
    }
    placed *pl = calloc(1, sizeof *pl);
    if (!pl) return osp_err(OSP_ERR_NOMEM, "out of memory");
    pl->descs = calloc((size_t)(n ? n : 1), sizeof *pl->descs);
    if (!pl->descs || cudaMalloc(&pl->arena, total ? total : 1) != cudaSuccess) {
        free(pl->descs);
        free(pl);
        return osp_err(OSP_ERR_NOMEM, "out of GPU memory uploading %.1f MB of weights", total / 1e6);
    }
    char *next = pl->arena;
    for (int i = 0; i < n; i++) {
        osp_weight *w = ws[i];
        weight_parts(w, part);
        const void *src[3] = {w->data, w->scales, w->biases};
        void *dst[3] = {NULL, NULL, NULL};
        for (int k = 0; k < 3; k++) {
            if (!part[k]) continue;
            dst[k] = next;
            int e;
            LEGACY(e = cudaMemcpy(next, src[k], part[k], cudaMemcpyHostToDevice));
            if (e != cudaSuccess) {
                LEGACY(cudaFree(pl->arena));
                free(pl->descs);
                free(pl);
                return osp_err(OSP_ERR_IO, "uploading weights to the GPU failed");
            }
            next += r256(part[k]);
        }
        pl->descs[i] = (osp_cu_weight){dt_code(w->dtype), w->qbits, w->group, dt_code(w->sdtype), w->rows, w->cols,
                                       dst[0], dst[1], dst[2]};
        w->packed = &pl->descs[i];
    }
    *owned = pl;
    return OSP_OK;
}

static void cu_unplace(void *owned) {
    placed *pl = owned;
    if (!pl) return;
    LEGACY(cudaFree(pl->arena));
    free(pl->descs);
    free(pl);
}

/* ---- sessions ---- */

static void session_free(osp_be_session *s) {
    if (!s) return;
    cudaStreamSynchronize(s->st);
    osp_cu_step_free(s);
    osp_cu_legacy_lock(); /* (the frees below) */
    osp_cublas_free(s->blas);
    cudaFree(s->logits);
    cudaFree(s->ids_d);
    cudaFreeHost(s->ids_h);
    cudaFree(s->part);
    cudaFree(s->xb);
    cudaFree(s->wb);
    cudaFree(s->moe_i);
    cudaFree(s->moe_f);
    for (int i = 0; i < s->n_moe_tab; i++) cudaFree(s->moe_tab[i].dev);
    osp_cu_tc_ws_free(&s->tcws);
    cudaStreamDestroy(s->st);
    osp_cu_legacy_unlock();
    free(s);
}

static osp_status session_new(int32_t max_tok, int64_t max_cols, osp_be_session **out) {
    *out = NULL;
    osp_be_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (cudaStreamCreate(&s->st) != cudaSuccess) {
        cudaGetLastError();
        free(s);
        return osp_err(OSP_ERR_IO, "cannot create a CUDA stream");
    }
    const osp_options *o = osp_options_get();
    s->fuse = o->cuda_fuse;
    s->att_kernel = o->cuda_attention; /* (a test hook: 0, by the step's tokens, unless a test sets it) */
    /* the embedding rows of a full chunk and room for the small arrays */
    size_t cap = (size_t)(max_tok > 0 ? max_tok : 1) * (size_t)(max_cols > 0 ? max_cols : 1) * sizeof(float) +
                 ((size_t)1 << 20);
    osp_status rc = osp_cu_step_init(s, cap);
    if (rc == OSP_OK && osp_cu_tc_ws_init(&s->tcws, (int64_t)(max_tok > 0 ? max_tok : 1) * (max_cols > 0 ? max_cols : 1)))
        rc = osp_err(OSP_ERR_NOMEM, "out of GPU memory for a session's matmul workspace");
    if (rc != OSP_OK) {
        session_free(s);
        return rc;
    }
    *out = s;
    return OSP_OK;
}

static void set_fast(osp_be_session *s, int fast) { s->fast = fast != 0; }

/* Exact tokens: a chunk's tokens go through the decode kernels (which give a
 * row the same numbers among any number of rows), never cuBLAS, and its
 * attention reads earlier positions from the cache (the model stores the
 * chunk first). */
static void set_exact_tokens(osp_be_session *s, int on) { s->exact = on != 0; }
static void begin_chunk(osp_be_session *s, int32_t B, int32_t T) { osp_cu_step_begin(s, B, T); }

/* A step of few tokens (a decode step of up to 8 rows, a short verification chunk): its launches are short and
 * many, so it takes the fused parts (FUSE_FEW) and the compact attention kernel. Measured in docs/NOTES.md
 * (issue 18, the seventh session: the other parts, and the compact kernel in many-token steps, were slower) */
#define FEW_TOKENS 8
static int few(const osp_be_session *s) { return (int64_t)s->B * s->T <= FEW_TOKENS; }

/* the FUSE_ parts on in this step (none under OSP_CUDA_FUSE=0) */
static int fz(const osp_be_session *s) { return s->fuse && few(s) ? FUSE_FEW : 0; }
static void flush(osp_be_session *s);
static osp_status status(osp_be_session *s) {
    flush(s);
    return osp_cu_step_status(s);
}

/* ---- operations ---- */

/* The production path's GEMM: a prefill chunk of one row (its numbers
 * depend on that row's chunk alone) with enough tokens to fill the tensor
 * cores. */
static int use_gemm(osp_be_session *s, int64_t n) {
    if (!s->fast || s->exact || s->T < 2 || s->B != 1 || n < 16 || s->mode != STEP_EAGER) return 0;
    if (!s->blas_tried) {
        s->blas_tried = 1;
        s->blas = osp_cublas_new(s->st);
    }
    return s->blas != NULL;
}

static void gemm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy) {
    const void *wb = d->data;
    if (d->qbits || d->dtype != 2) { /* dequantized to bf16 for this product */
        if (!osp_cu_grow(s, (void **)&s->wb, &s->wb_cap, (size_t)(d->rows * d->cols), sizeof(uint16_t))) {
            note(s, cudaErrorMemoryAllocation, "GEMM weight scratch");
            return;
        }
        note(s, osp_cu_weight_to_bf16(s->st, d, s->wb), "weight to bf16");
        wb = s->wb;
    }
    if (!osp_cu_grow(s, (void **)&s->xb, &s->xb_cap, (size_t)(n * d->cols), sizeof(uint16_t))) {
        note(s, cudaErrorMemoryAllocation, "GEMM activation scratch");
        return;
    }
    note(s, osp_cu_to_bf16(s->st, s->xb, x, n * d->cols), "activations to bf16");
    int e = osp_cublas_gemm_bf16(s->blas, d->rows, n, d->cols, wb, s->xb, y, ldy);
    if (e) note(s, cudaErrorUnknown, "cuBLAS GEMM");
}

typedef struct mm_args {
    const osp_cu_weight *d[4];
    float *y[4];
    int64_t ldy[4];
    const float *x;
    int64_t n;
    int32_t nw;
} mm_args;
_Static_assert(sizeof(mm_args) <= OP_ARGS, "a matmul's arguments fit an operation's");

static void mm_exec(osp_be_session *s, const void *p) {
    const mm_args *a = p;
    if (use_gemm(s, a->n)) {
        for (int i = 0; i < a->nw; i++) gemm(s, a->d[i], a->x, a->n, a->y[i], a->ldy[i]);
    } else if (s->fast) {
        note(s, osp_cu_matmul_tc_multi(s->st, a->d, a->nw, a->x, a->n, a->y, a->ldy, &s->tcws), "matmul");
    } else {
        note(s, osp_cu_matmul_multi(s->st, a->d, a->nw, a->x, a->n, a->y, a->ldy), "matmul");
    }
}

static void mm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy) {
    ARGS(mm_args, a);
    a.d[0] = d, a.y[0] = y, a.ldy[0] = ldy, a.x = x, a.n = n, a.nw = 1;
    SUBMIT(s, mm_exec, a);
}

typedef struct act_args {
    float *y;
    const float *g, *u;
    int64_t n, d, ld_u;
    int32_t act;
} act_args;

/* weights sharing an input go in one operation, four at a time */
static void matmul(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *x, int64_t n,
                   osp_dbuf *const *ys) {
    flush(s);
    if (nw == 2 && (fz(s) & FUSE_PAIR) && s->fast && ws[0]->packed && ws[1]->packed &&
        osp_cu_tc_pair_ok(ws[0]->packed, ws[1]->packed, n) && !use_gemm(s, n)) {
        /* held: an activation of the two outputs next joins them (act_mul); anything else submits it as is */
        ARGS(mm_args, a);
        a.x = CD(x), a.n = n, a.nw = 2;
        for (int i = 0; i < 2; i++) a.d[i] = ws[i]->packed, a.y[i] = D(ys[i]), a.ldy[i] = a.d[i]->rows;
        memcpy(s->pend_args, &a, sizeof a);
        s->pend = HELD_MM_PAIR;
        return;
    }
    for (int i0 = 0; i0 < nw; i0 += 4) {
        ARGS(mm_args, a);
        a.x = CD(x), a.n = n;
        for (int i = i0; i < nw && i < i0 + 4; i++) {
            const osp_cu_weight *d = ws[i]->packed;
            if (!d) {
                note(s, cudaErrorInvalidValue, "a weight not placed on the GPU");
                return;
            }
            a.d[a.nw] = d, a.y[a.nw] = D(ys[i]), a.ldy[a.nw] = d->rows;
            a.nw++;
        }
        SUBMIT(s, mm_exec, a);
    }
}

/* the element-wise operations: y op= x / b / a */
typedef struct ew_args {
    float *y;
    const float *x;
    int64_t n, d;
    float a;
    int32_t kind; /* 0 add, 1 add_bias, 2 scale, 3 copy, 4 mul_vec */
} ew_args;

typedef struct rope_args {
    float *x, *x2; /* x2: a second tensor at the same positions (k after q), or NULL */
    const float *inv;
    const int32_t *pos;
    int64_t heads, heads2;
    int32_t B, T, Dh;
    /* each tensor's head norm first (fused), when norm1/norm2 */
    const float *w1, *w2;
    float eps1, eps2;
    int32_t norm1, norm2, add1, add2;
    /* x2 (k) and v stored in the cache once rotated (OSP_CUDA_FUSE=2: kv_write joined the held RoPE), when
     * kvrows */
    osp_cu_kvlayer L;
    const osp_cu_kvrow *kvrows;
    const float *v;
    const void *kv; /* the store's cache and layer (held for an attention of that layer: HELD_ROPE_ATT) */
    int32_t layer;
} rope_args;
_Static_assert(sizeof(rope_args) <= OP_ARGS, "a RoPE's arguments fit an operation's");

typedef struct norm_args {
    float *y, *x;
    const float *t, *w; /* t: added to x first (a residual add fused with the norm), or NULL */
    int64_t n, d;
    float eps;
    int32_t add_one;
} norm_args;

static void norm_exec(osp_be_session *s, const void *p) {
    const norm_args *a = p;
    note(s, osp_cu_add_rmsnorm(s->st, a->y, a->x, a->t, a->w, a->n, a->d, a->eps, a->add_one), "rmsnorm");
}

static void flush(osp_be_session *s);

static void norm(osp_be_session *s, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                 int add_one) {
    ARGS(norm_args, a);
    a.y = y, a.x = (float *)x, a.w = w, a.n = n, a.d = d, a.eps = eps, a.add_one = add_one;
    if (s->pend == HELD_ADD) { /* x += t held back: fused when this norm reads that sum */
        const float *const *held = (const float *const *)s->pend_args; /* ew_args: y, x, n */
        int64_t hn;
        memcpy(&hn, s->pend_args + 2 * sizeof(void *), sizeof hn);
        if (held[0] == x && hn == n * d) {
            a.t = held[1];
            s->pend = 0;
        }
    }
    if (!a.t && y == x && s->fuse) { /* in place: a RoPE of the same rows next may take it */
        if (s->pend == HELD_ROPE && !s->pend_n2 && !((rope_args *)s->pend_args)->x2) { /* k's norm after q's RoPE */
            memcpy(s->pend_n2_args, &a, sizeof a);
            s->pend_n2 = 1;
            return;
        }
        flush(s);
        memcpy(s->pend_args, &a, sizeof a);
        s->pend = HELD_NORM;
        return;
    }
    flush(s);
    SUBMIT(s, norm_exec, a);
}

static void rmsnorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    norm(s, D(y), CD(x), CD(w), n, d, eps, add_one);
}

/* the element-wise operations: y op= x / b / a (ew_args above) */

static void ew_exec(osp_be_session *s, const void *p) {
    const ew_args *a = p;
    switch (a->kind) {
    case 0: note(s, osp_cu_add(s->st, a->y, a->x, a->n), "add"); break;
    case 1: note(s, osp_cu_add_bias(s->st, a->y, a->x, a->n, a->d), "add_bias"); break;
    case 2: note(s, osp_cu_scale(s->st, a->y, a->a, a->n), "scale"); break;
    case 3: note(s, cudaMemcpyAsync(a->y, a->x, (size_t)a->n * sizeof(float), cudaMemcpyDeviceToDevice, s->st), "copy"); break;
    default: note(s, osp_cu_mul_vec(s->st, a->y, a->x, a->a, a->n, a->d), "mul_vec"); break;
    }
}

static void ew(osp_be_session *s, int kind, float *y, const float *x, int64_t n, int64_t d, float f) {
    flush(s);
    ARGS(ew_args, a);
    a.y = y, a.x = x, a.n = n, a.d = d, a.a = f, a.kind = kind;
    SUBMIT(s, ew_exec, a);
}

/* y += x is held back: the norm that usually follows reads y and fuses it */
static void add(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    ARGS(ew_args, a);
    a.y = D(y), a.x = CD(x), a.n = n, a.kind = 0;
    flush(s);
    memcpy(s->pend_args, &a, sizeof a);
    s->pend = HELD_ADD;
}

static void add_bias(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d) {
    if (b) ew(s, 1, D(y), CD(b), n, d, 0);
}

static void scale(osp_be_session *s, osp_dbuf *y, float a, int64_t n) { ew(s, 2, D(y), NULL, n, 0, a); }
static void copy(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) { ew(s, 3, D(y), CD(x), n, 0, 0); }

/* staged with the step (so a graph of it copies the new data up before it runs), then copied into place */
static void upload(osp_be_session *s, osp_dbuf *dst, const float *host, int64_t n) {
    flush(s);
    const float *d = osp_cu_stage(s, host, sizeof(float) * (size_t)n);
    if (!d) return;
    copy(s, dst, (const osp_dbuf *)d, n);
}

static void end_chunk(osp_be_session *s) {
    flush(s);
    osp_cu_step_end(s);
}

static void act_exec(osp_be_session *s, const void *p) {
    const act_args *a = p;
    note(s, osp_cu_act_mul(s->st, a->act, a->y, a->g, a->u, a->n, a->d, a->ld_u), "act_mul");
}

typedef struct pair_args {
    const osp_cu_weight *gw, *uw;
    const float *x;
    float *y;
    int64_t n, ldy;
    int32_t act;
} pair_args;

static void pair_exec(osp_be_session *s, const void *p) {
    const pair_args *a = p;
    note(s, osp_cu_matmul_tc_pair(s->st, a->gw, a->uw, a->x, a->act, a->n, a->y, a->ldy), "matmul pair + act");
}

static void act_mul(osp_be_session *s, osp_act act, osp_dbuf *y, const osp_dbuf *g, const osp_dbuf *u, int64_t n,
                    int64_t d, int64_t ld_u) {
    if (s->pend == HELD_MM_PAIR) { /* y = act(g) * u of the held gate and up: one launch (their outputs unwritten) */
        const mm_args *h = (const mm_args *)s->pend_args;
        if (h->y[0] == CD(g) && h->y[1] == CD(u) && h->n == n && h->d[0]->rows == d && ld_u == d) {
            ARGS(pair_args, a);
            a.gw = h->d[0], a.uw = h->d[1], a.x = h->x, a.y = D(y), a.n = n, a.ldy = d;
            a.act = act == OSP_ACT_SILU ? 0 : 1;
            s->pend = 0;
            SUBMIT(s, pair_exec, a);
            return;
        }
    }
    flush(s);
    ARGS(act_args, a);
    a.y = D(y), a.g = CD(g), a.u = CD(u), a.n = n, a.d = d, a.ld_u = ld_u, a.act = act == OSP_ACT_SILU ? 0 : 1;
    SUBMIT(s, act_exec, a);
}


static void rope_exec(osp_be_session *s, const void *p) {
    const rope_args *a = p;
    if (a->norm1 || a->norm2 || a->kvrows) { /* a block a head vector: its norm, RoPE and (kvrows) store */
        const osp_cu_rope_side s1 = {a->x, a->heads, a->w1, a->eps1, a->norm1, a->add1},
                               s2 = {a->x2, a->heads2, a->w2, a->eps2, a->norm2, a->add2};
        note(s, osp_cu_norm_rope_store(s->st, &s1, a->x2 ? &s2 : NULL, a->B, a->T, a->Dh, a->inv, a->pos,
                                       a->kvrows ? &a->L : NULL, a->kvrows, a->v),
             a->kvrows ? "norm + rope + kv store" : "norm + rope");
        return;
    }
    note(s, osp_cu_rope2(s->st, a->x, a->heads, a->x2, a->heads2, a->B, a->T, a->Dh, a->inv, a->pos), "rope");
}

/* a held norm of n rows of d, in place on x: the head norm of x [B*T, heads, Dh]? */
static int norm_of(const norm_args *n, const float *x, int32_t B, int32_t T, int64_t heads, int32_t Dh) {
    return n->y == x && n->x == x && !n->t && n->d == Dh && n->n == (int64_t)B * T * heads;
}

/* held back: a rope of the same positions next (k after q) joins it */
static void rope(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t Dh,
                 const osp_dbuf *inv, const int32_t *pos) {
    if (s->pend == HELD_ROPE) {
        rope_args *h = (rope_args *)s->pend_args;
        const norm_args *n2 = (const norm_args *)s->pend_n2_args;
        if (!h->x2 && h->B == B && h->T == T && h->Dh == Dh && h->inv == CD(inv) && s->pend_host == pos &&
            (!s->pend_n2 || norm_of(n2, D(x), B, T, heads, Dh))) {
            h->x2 = D(x), h->heads2 = heads;
            if (s->pend_n2) h->w2 = n2->w, h->eps2 = n2->eps, h->norm2 = 1, h->add2 = n2->add_one;
            s->pend_n2 = 0;
            if (fz(s) & FUSE_KV) return; /* held still: the store of k (and v) next may join it (kv_write) */
            s->pend = 0;
            SUBMIT(s, rope_exec, *h);
            return;
        }
    }
    ARGS(norm_args, held);
    int with_norm = s->pend == HELD_NORM && norm_of((const norm_args *)s->pend_args, D(x), B, T, heads, Dh);
    if (with_norm) {
        memcpy(&held, s->pend_args, sizeof held);
        s->pend = 0;
    }
    flush(s);
    const int32_t *dpos = osp_cu_stage(s, pos, sizeof(int32_t) * (size_t)B);
    if (!dpos) return;
    ARGS(rope_args, a);
    a.x = D(x), a.inv = CD(inv), a.pos = dpos, a.heads = heads, a.B = B, a.T = T, a.Dh = Dh;
    if (with_norm) a.w1 = held.w, a.eps1 = held.eps, a.norm1 = 1, a.add1 = held.add_one;
    memcpy(s->pend_args, &a, sizeof a);
    s->pend_host = pos;
    s->pend = HELD_ROPE;
}

/* submit the held-back operations, in their order */
static void flush(osp_be_session *s) {
    int k = s->pend, n2 = s->pend_n2;
    s->pend = 0, s->pend_n2 = 0;
    if (k == HELD_ADD) osp_cu_submit(s, ew_exec, s->pend_args, sizeof(ew_args));
    else if (k == HELD_ROPE || k == HELD_ROPE_ATT) osp_cu_submit(s, rope_exec, s->pend_args, sizeof(rope_args));
    else if (k == HELD_NORM) osp_cu_submit(s, norm_exec, s->pend_args, sizeof(norm_args));
    else if (k == HELD_MM_PAIR) osp_cu_submit(s, mm_exec, s->pend_args, sizeof(mm_args));
    if (n2) osp_cu_submit(s, norm_exec, s->pend_n2_args, sizeof(norm_args));
}

void osp_cu_flush(osp_be_session *s) { flush(s); }

/* y = x · Wᵀ + bias: the matmul (cuBLAS for a long chunk in production precision) and the bias */
static void linear(osp_be_session *s, const osp_weight *w, const osp_dbuf *x, int64_t n, const osp_dbuf *bias,
                   osp_dbuf *y) {
    matmul(s, &w, 1, x, n, &y);
    add_bias(s, y, bias, n, w->rows);
}

/* The rows are gathered on the host from the mapped table into the staging area. */
static void embed(osp_be_session *s, const osp_weight *e, float sc, const int32_t *ids, int64_t n, osp_dbuf *x) {
    flush(s);
    int64_t H = e->cols;
    size_t bytes = (size_t)(n * H) * sizeof(float);
    void *hv;
    float *dv = osp_cu_stage_alloc(s, bytes, &hv);
    if (!dv) return;
    float *h = hv;
    for (int64_t i = 0; i < n; i++) {
        osp_weight_row_f32(e, ids[i], h + i * H);
        if (sc != 1.0f)
            for (int64_t j = 0; j < H; j++) h[i * H + j] *= sc;
    }
    osp_cu_stage_put(s, dv, bytes);
    ew(s, 3, D(x), dv, n * H, 0, 0);
}

/* The per-row descriptors of a KV layer for this call, staged. */
static const osp_cu_kvrow *kv_rows(osp_be_session *s, const osp_kv *kv, int32_t layer, const int32_t *rows,
                                   int32_t nb, osp_cu_kvlayer *L) {
    const osp_kv_layer *l = &kv->layers[layer];
    memset(L, 0, sizeof *L);
    *L = (osp_cu_kvlayer){l->sliding, l->ring, l->bits, l->group, l->n_kv_heads, l->head_dim, l->cb, l->ng,
                          l->slot_bytes};
    void *hv;
    osp_cu_kvrow *d = osp_cu_stage_alloc(s, sizeof(osp_cu_kvrow) * (size_t)(nb > 0 ? nb : 1), &hv);
    if (!d) return NULL;
    osp_cu_kvrow *r = hv;
    for (int32_t i = 0; i < nb; i++) {
        int32_t row = rows[i];
        memset(&r[i], 0, sizeof r[i]);
        r[i].mem = l->mem ? l->mem[row] : NULL;
        r[i].cap = l->cap ? l->cap[row] : 0;
        r[i].pos = kv->pos[row];
    }
    osp_cu_stage_put(s, d, sizeof(osp_cu_kvrow) * (size_t)nb);
    return d;
}

typedef struct attn_args {
    osp_cu_attn c;
    int32_t nsplit;
} attn_args;

static void attn_exec(osp_be_session *s, const void *p) {
    const attn_args *a = p;
    int64_t need = osp_cu_attention_scratch(&a->c, a->nsplit);
    if (need > 0 && !osp_cu_grow(s, (void **)&s->part, &s->part_cap, (size_t)need, sizeof(float))) {
        note(s, cudaErrorMemoryAllocation, "attention scratch");
        return;
    }
    note(s, osp_cu_attention(s->st, &a->c, s->part, a->nsplit), "attention");
}

static void attention(osp_be_session *s, const osp_attn_args *a) {
    const float *rope_inv = NULL;
    if (s->pend == HELD_ROPE_ATT) { /* a one-token step's RoPE of q and k and its KV store held: this attention does them */
        const rope_args *h = (const rope_args *)s->pend_args;
        if (CD(a->q) == h->x && CD(a->k) == h->x2 && CD(a->v) == h->v && (const void *)a->kv == h->kv &&
            a->layer == h->layer && a->nb == h->B && a->T == 1 && h->T == 1 && !a->chunk_stored &&
            h->heads == a->n_heads && h->heads2 == a->n_kv_heads && h->Dh == a->head_dim) {
            rope_inv = h->inv;
            s->pend = 0;
        }
    }
    flush(s);
    ARGS(attn_args, x);
    osp_cu_attn *c = &x.c;
    c->rope = rope_inv != NULL, c->rope_inv = rope_inv;
    c->compact = s->att_kernel ? s->att_kernel == 2 : few(s);
    c->rows = kv_rows(s, a->kv, a->layer, a->rows, a->nb, &c->L);
    if (!c->rows) return;
    c->nb = a->nb, c->T = a->T, c->n_heads = a->n_heads, c->window = a->window;
    c->scale = a->scale, c->softcap = a->softcap;
    c->chunk_stored = a->chunk_stored;
    c->q = CD(a->q), c->k = CD(a->k), c->v = CD(a->v), c->out = D(a->out);
    /* splits: enough for the longest range. A decode step (a graph's
     * candidate, or a short chunk) sizes them by the rows' KV capacity rounded up to a power
     * of two instead, so its arguments change rarely as the rows grow (the
     * combine reads a query's own splits only: the numbers are the same). */
    const osp_kv_layer *l = &a->kv->layers[a->layer];
    int32_t longest = 1;
    int graph = a->T <= MAX_GRAPH_T; /* a graph's candidate: decode steps, verification chunks */
    for (int32_t i = 0; i < a->nb; i++) {
        int32_t r = a->rows[i], len = a->kv->pos[r] + a->T;
        if (graph && l->cap && l->cap[r] + a->T > len) len = l->cap[r] + a->T;
        if (len > longest) longest = len;
    }
    int32_t ns = (longest + OSP_CU_ATT_SPLIT - 1) / OSP_CU_ATT_SPLIT;
    if (graph) {
        int32_t p2 = 1;
        while (p2 < ns) p2 *= 2;
        ns = p2;
    }
    x.nsplit = ns;
    SUBMIT(s, attn_exec, x);
}

typedef struct kvw_args {
    osp_cu_kvlayer L;
    const osp_cu_kvrow *rows;
    const float *k, *v;
    int32_t nb, T;
} kvw_args;

static void kvw_exec(osp_be_session *s, const void *p) {
    const kvw_args *a = p;
    note(s, osp_cu_kv_write(s->st, &a->L, a->rows, a->nb, a->T, a->k, a->v), "kv_write");
}

static void kv_write(osp_be_session *s, struct osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                     const osp_dbuf *k, const osp_dbuf *v, int32_t T) {
    if (s->pend == HELD_ROPE && (fz(s) & FUSE_KV)) { /* k's RoPE held: the store joins its launch */
        rope_args *h = (rope_args *)s->pend_args;
        const osp_kv_layer *l = &kv->layers[layer];
        if (h->x2 == CD(k) && h->B == nb && h->T == T && h->heads2 == l->n_kv_heads && h->Dh == l->head_dim) {
            const unsigned char *area = s->stage_d;
            h->kvrows = kv_rows(s, kv, layer, rows, nb, &h->L);
            if (h->kvrows && s->stage_d != area) /* the staging area grew: the held RoPE's positions again */
                h->pos = osp_cu_stage(s, s->pend_host, sizeof(int32_t) * (size_t)h->B);
            if (h->kvrows && h->pos) {
                h->v = CD(v), h->kv = kv, h->layer = layer;
                if ((fz(s) & FUSE_ROPE_ATT) && T == 1 && !h->norm1 && !h->norm2) {
                    s->pend = HELD_ROPE_ATT; /* held once more: the attention of this step may rotate and store itself */
                    return;
                }
                s->pend = 0;
                SUBMIT(s, rope_exec, *h);
                return;
            }
        }
    }
    flush(s);
    ARGS(kvw_args, a);
    a.rows = kv_rows(s, kv, layer, rows, nb, &a.L);
    if (!a.rows) return;
    a.k = CD(k), a.v = CD(v), a.nb = nb, a.T = T;
    SUBMIT(s, kvw_exec, a);
}

typedef struct softcap_args {
    float *x;
    int64_t n;
    float cap;
} softcap_args;

static void softcap_exec(osp_be_session *s, const void *p) {
    const softcap_args *a = p;
    note(s, osp_cu_softcap(s->st, a->x, a->n, a->cap), "softcap");
}

typedef struct argmax_args {
    const float *x;
    int32_t *ids;
    int64_t rows, n;
} argmax_args;

static void argmax_exec(osp_be_session *s, const void *p) {
    const argmax_args *a = p;
    note(s, osp_cu_argmax(s->st, a->x, a->rows, a->n, a->ids), "argmax");
}

static void dfr_pop(osp_be_session *s);

/* Room for n ids: device (written by the step, so never moved under a graph) and pinned host (two slots). */
static int ids_room(osp_be_session *s, size_t n) {
    if (n <= s->ids_cap) return 1;
    osp_cu_step_eager(s);
    while (s->n_dfr) dfr_pop(s); /* (their ids are in the slots) */
    if (n < MAX_GRAPH_ROWS) n = MAX_GRAPH_ROWS;
    size_t cap = s->ids_cap;
    s->ids_cap = 0;
    if (!osp_cu_grow(s, (void **)&s->ids_d, &cap, n, sizeof(int32_t))) return 0;
    int e;
    osp_cu_legacy_lock();
    cudaFreeHost(s->ids_h);
    s->ids_h = NULL;
    e = cudaMallocHost((void **)&s->ids_h, 2 * n * sizeof(int32_t));
    osp_cu_legacy_unlock();
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    s->ids_cap = n;
    return 1;
}

/* The rows of a step's logits that come back: all, or with ids out only the needed ones (runs of adjacent rows in
 * one copy each). */
static void logits_back(osp_be_session *s, const osp_head_args *a, const float *lg) {
    int64_t V = a->vocab;
    if (a->all_logits) {
        for (int32_t b = 0; b < a->B; b++)
            note(s, cudaMemcpyAsync(a->logits + (int64_t)b * a->ld_rows * V, lg + (int64_t)b * a->T * V,
                                    (size_t)(a->T * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
                 "logits");
        return;
    }
    if (!a->ids) {
        note(s, cudaMemcpyAsync(a->logits, lg, (size_t)(a->B * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
             "logits");
        return;
    }
    note(s, cudaMemcpyAsync(s->ids_h, s->ids_d, sizeof(int32_t) * (size_t)a->B, cudaMemcpyDeviceToHost, s->st), "ids");
    /* (slot 0: no deferred head is waiting, the stream's synchronization below waits for them all) */
    for (int32_t b = 0; a->need && b < a->B;) {
        if (!a->need[b]) {
            b++;
            continue;
        }
        int32_t e = b + 1;
        while (e < a->B && a->need[e]) e++;
        note(s, cudaMemcpyAsync(a->logits + (int64_t)b * V, lg + (int64_t)b * V, (size_t)((e - b) * V) * sizeof(float),
                                cudaMemcpyDeviceToHost, s->st),
             "logits");
        b = e;
    }
}

static void head(osp_be_session *s, const osp_head_args *a) {
    flush(s);
    const osp_cu_weight *w = a->w->packed;
    int64_t N = (int64_t)a->B * a->T, H = a->hidden, V = a->vocab, rows = a->all_logits ? N : a->B;
    int ids = a->ids && !a->all_logits;
    if (rows * V > (int64_t)s->logits_cap) {
        osp_cu_step_eager(s); /* the logits buffer is never moved under a graph */
        if (!osp_cu_grow(s, (void **)&s->logits, &s->logits_cap, (size_t)(rows * V), sizeof(float))) {
            note(s, cudaErrorMemoryAllocation, "logits");
            return;
        }
    }
    if (ids && !ids_room(s, (size_t)a->B)) {
        note(s, cudaErrorMemoryAllocation, "ids");
        return;
    }
    int defer = ids && a->defer_ids && !a->need;
    /* two deferred heads at most (the caller waits for one before the next); a head that is not deferred
     * takes slot 0 */
    while (s->n_dfr == 2 || (!defer && s->n_dfr)) dfr_pop(s);
    if (!w) {
        note(s, cudaErrorInvalidValue, "the head's weight is not on the GPU");
        return;
    }
    float *lg = s->logits;
    if (a->all_logits) {
        norm(s, D(a->xn), CD(a->x), CD(a->norm), N, H, a->eps, a->add_one);
        mm(s, w, CD(a->xn), N, lg, V);
    } else {
        if (a->T == 1) /* the rows' last tokens are contiguous */
            norm(s, D(a->hlast), CD(a->x), CD(a->norm), a->B, H, a->eps, a->add_one);
        else
            for (int32_t b = 0; b < a->B; b++)
                norm(s, D(a->hlast) + b * H, CD(a->x) + ((int64_t)b * a->T + a->T - 1) * H, CD(a->norm), 1, H,
                     a->eps, a->add_one);
        mm(s, w, CD(a->hlast), a->B, lg, V);
    }
    if (a->softcap > 0) {
        ARGS(softcap_args, c);
        c.x = lg, c.n = rows * V, c.cap = a->softcap;
        SUBMIT(s, softcap_exec, c);
    }
    if (ids) { /* part of the step (and of its graph): the greedy tokens, on the soft-capped logits */
        ARGS(argmax_args, m);
        m.x = lg, m.ids = s->ids_d, m.rows = a->B, m.n = V;
        SUBMIT(s, argmax_exec, m);
    }
    s->defer = defer, s->staged_marked = 0;
    osp_cu_step_end(s);
    s->defer = 0;
    if (s->err) {
        s->staged_marked = 0;
        return;
    }
    if (!defer) s->staged_marked = 0;
    if (defer) { /* the ids into a free slot, an event after them; the next step may be staged at ev_staged */
        if (!s->staged_marked) note(s, cudaEventRecord(s->ev_staged, s->st), "staging"); /* (an eager step) */
        s->staged_marked = 1;
        int slot = s->n_dfr ? !s->dfr[0].slot : 0;
        note(s, cudaMemcpyAsync(s->ids_h + (size_t)slot * s->ids_cap, s->ids_d, sizeof(int32_t) * (size_t)a->B,
                                cudaMemcpyDeviceToHost, s->st),
             "ids");
        note(s, cudaEventRecord(s->dfr_ev[slot], s->st), "ids");
        if (s->err) return;
        s->dfr[s->n_dfr++] = (struct osp_cu_dfr){slot, a->B, a->ids};
        s->pending = 1;
        return;
    }
    logits_back(s, a, lg); /* after the step's graph, on its stream */
    note(s, cudaStreamSynchronize(s->st), "logits");
    s->pending = 0;
    if (ids && !s->err) memcpy(a->ids, s->ids_h, sizeof(int32_t) * (size_t)a->B);
}

/* the oldest deferred head's ids, once copied, where it said (touches nothing of a step in progress) */
static void dfr_pop(osp_be_session *s) {
    struct osp_cu_dfr d = s->dfr[0];
    s->dfr[0] = s->dfr[1];
    s->n_dfr--;
    note(s, cudaEventSynchronize(s->dfr_ev[d.slot]), "a step's ids");
    if (!s->err) memcpy(d.dst, s->ids_h + (size_t)d.slot * s->ids_cap, sizeof(int32_t) * (size_t)d.nb);
}

static osp_status ids_wait(osp_be_session *s) {
    if (!s->n_dfr) return OSP_OK;
    dfr_pop(s);
    return status(s);
}

/* ids on the device: a deferred (or any) head's ids_d, read by the next step's first kernel */
typedef struct embp_args {
    osp_cu_weight w;
    const int32_t *ids;
    int64_t n;
    float scale;
    float *x;
} embp_args;

static void embp_exec(osp_be_session *s, const void *p) {
    const embp_args *a = p;
    note(s, osp_cu_embed_ids(s->st, &a->w, a->ids, a->n, a->scale, a->x), "embedding");
}

static int can_embed_prev(const osp_weight *e) { return e->packed != NULL; }

static void embed_prev(osp_be_session *s, const osp_weight *e, float sc, int64_t n, osp_dbuf *x) {
    if (!e->packed || !s->ids_d || (size_t)n > s->ids_cap) {
        note(s, cudaErrorInvalidValue, "an embedding of the previous step's ids, which are not on the GPU");
        return;
    }
    ARGS(embp_args, a);
    a.w = *(const osp_cu_weight *)e->packed;
    a.ids = s->ids_d, a.n = n, a.scale = sc, a.x = D(x);
    SUBMIT(s, embp_exec, a);
}


typedef struct moe_io_args {
    float *dst;
    const float *src, *w;
    const int32_t *rows;
    int64_t n, H;
    int32_t scatter;
} moe_io_args;

static void moe_io_exec(osp_be_session *s, const void *p) {
    const moe_io_args *a = p;
    if (a->scatter) note(s, osp_cu_scatter_axpy(s->st, a->dst, a->src, a->rows, a->w, a->n, a->H), "moe scatter");
    else note(s, osp_cu_gather(s->st, a->dst, a->src, a->rows, a->n, a->H), "moe gather");
}

/* ---- routed experts on the device (production precision) ----
 * The router's logits stay on the GPU: a kernel routes each token as the
 * host path below does (expf is the device's: a routing weight may differ
 * from the host's in its last bit), another groups the (token, expert)
 * pairs by expert, the experts' matmuls run for every active expert in one
 * launch each (their weights found through a device table per layer, their
 * rows through the grouping), and a last kernel adds each token's experts
 * in expert order. Nothing comes back to the host, so such steps are CUDA
 * graphs like any other. A token's numbers do not depend on the other
 * tokens routed with it (the tensor-core matmul's columns are independent,
 * and it takes no split-K here). OSP_CUDA_MOE=host keeps the host path
 * (for measurements). */

typedef struct moe_dev_args {
    int32_t stage; /* 0 route, 1 group, 2 combine */
    int32_t E, K;
    int64_t N, H;
    const float *logits, *pes, *acc;
    float *out, *top_w;
    int32_t *top_idx, *g_e, *g_off, *g_cnt, *g_nact, *pair_row, *pos_of, *order;
} moe_dev_args;

static void moe_dev_exec(osp_be_session *s, const void *p) {
    const moe_dev_args *a = p;
    if (a->stage == 0)
        note(s, osp_cu_moe_route(s->st, a->logits, a->N, a->E, a->K, a->pes, a->top_idx, a->top_w), "moe routing");
    else if (a->stage == 1)
        note(s, osp_cu_moe_group(s->st, a->top_idx, a->N, a->K, a->E, a->g_e, a->g_off, a->g_cnt, a->g_nact,
                                 a->pair_row, a->pos_of, a->order), "moe grouping");
    else
        note(s, osp_cu_moe_combine(s->st, a->out, a->acc, a->top_w, a->pos_of, a->order, a->N, a->K, a->H),
             "moe combine");
}

typedef struct gmm_args {
    const osp_cu_weight *shape[2], *tab[2];
    float *y[2];
    int64_t ldy[2];
    const float *x;
    int64_t slots;
    const int32_t *e, *off, *cnt, *nact;
    int32_t nw;
} gmm_args;

static void gmm_exec(osp_be_session *s, const void *p) {
    const gmm_args *a = p;
    note(s, osp_cu_matmul_tc_grouped(s->st, a->shape, a->tab, a->nw, a->x, a->slots, a->e, a->off, a->cnt, a->nact,
                                     a->y, a->ldy), "experts' matmul");
}

static int same_expert(const osp_cu_weight *a, const osp_cu_weight *b) {
    return a && b && a->dtype == b->dtype && a->qbits == b->qbits && a->group == b->group && a->sdtype == b->sdtype &&
           a->rows == b->rows && a->cols == b->cols;
}

/* The layer's experts as a device table [3][E] (built once, in an eager step), or NULL. */
static const osp_cu_weight *moe_table(osp_be_session *s, const osp_moe_args *a) {
    const int64_t E = a->n_experts;
    const void *first = a->gate[0].packed, *last = a->down[E - 1].packed;
    for (int i = 0; i < s->n_moe_tab; i++)
        if (s->moe_tab[i].key == a->gate && s->moe_tab[i].first == first && s->moe_tab[i].last == last)
            return s->moe_tab[i].dev;
    if (s->mode != STEP_EAGER || s->n_moe_tab == OSP_CU_MOE_TABS) return NULL;
    osp_cu_weight *h = malloc(sizeof *h * (size_t)(3 * E)), *d = NULL;
    if (!h) return NULL;
    const osp_weight *const kinds[3] = {a->gate, a->up, a->down};
    int ok = 1;
    for (int k = 0; k < 3 && ok; k++)
        for (int64_t e = 0; e < E && ok; e++) {
            const osp_cu_weight *w = kinds[k][e].packed;
            ok = same_expert(w, kinds[k][0].packed) && osp_cu_tc_ok(w);
            if (ok) h[k * E + e] = *w;
        }
    if (ok && cudaMalloc((void **)&d, sizeof *h * (size_t)(3 * E)) == cudaSuccess &&
        cudaMemcpyAsync(d, h, sizeof *h * (size_t)(3 * E), cudaMemcpyHostToDevice, s->st) == cudaSuccess &&
        cudaStreamSynchronize(s->st) == cudaSuccess) {
        s->moe_tab[s->n_moe_tab++] = (struct osp_cu_moe_tab){a->gate, first, last, d};
    } else {
        cudaGetLastError();
        LEGACY(cudaFree(d));
        d = NULL;
    }
    free(h);
    return d;
}

static int moe_host_forced(void) { return osp_options_get()->cuda_moe_host; }

/* The whole layer's experts on the device; 0 (nothing submitted) when it cannot take them. */
static int moe_device(osp_be_session *s, const osp_moe_args *a) {
    const int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k, I = a->inter, P = N * K;
    if (moe_host_forced() || N < 1 || E < 1 || E > 1024 || K < 1 || K > E) return 0;
    const osp_cu_weight *gate = a->gate[0].packed, *up = a->up[0].packed, *down = a->down[0].packed;
    if (!same_expert(gate, up) || !down || gate->rows != I || gate->cols != H || down->rows != H || down->cols != I)
        return 0;
    const osp_cu_weight *tab = moe_table(s, a);
    if (!tab) return 0;
    /* every array starts 256-byte aligned: the matmuls read their inputs (g) as float4 */
    const int64_t Pa = (P + 63) & ~(int64_t)63, Ea = (E + 63) & ~(int64_t)63;
    const size_t ni = (size_t)(4 * Pa + 3 * Ea + 1), nf = (size_t)(Pa + 2 * Pa * I);
    if (!osp_cu_grow(s, (void **)&s->moe_i, &s->moe_i_cap, ni, sizeof(int32_t)) ||
        !osp_cu_grow(s, (void **)&s->moe_f, &s->moe_f_cap, nf, sizeof(float)))
        return 0;
    int32_t *top_idx = s->moe_i, *pos_of = top_idx + Pa, *order = pos_of + Pa, *pair_row = order + Pa,
            *g_e = pair_row + Pa, *g_off = g_e + Ea, *g_cnt = g_off + Ea, *g_nact = g_cnt + Ea;
    float *top_w = s->moe_f, *g = top_w + Pa, *u = g + Pa * I;
    const int64_t slots = P < E ? P : E;

    norm(s, D(a->normed), CD(a->x), NULL, N, H, a->eps, 0);
    ew(s, 4, D(a->normed), CD(a->router_scale), N, H, a->scale);
    osp_dbuf *pb = a->probs;
    matmul(s, &a->router, 1, a->normed, N, &pb);
    ARGS(moe_dev_args, r);
    r.E = (int32_t)E, r.K = (int32_t)K, r.N = N, r.H = H, r.logits = CD(a->probs), r.pes = CD(a->per_expert_scale);
    r.acc = CD(a->moe_acc), r.out = D(a->out), r.top_w = top_w, r.top_idx = top_idx, r.g_e = g_e, r.g_off = g_off;
    r.g_cnt = g_cnt, r.g_nact = g_nact, r.pair_row = pair_row, r.pos_of = pos_of, r.order = order;
    r.stage = 0;
    SUBMIT(s, moe_dev_exec, r);
    r.stage = 1;
    SUBMIT(s, moe_dev_exec, r);
    ARGS(moe_io_args, gx);
    gx.dst = D(a->moe_x), gx.src = CD(a->x2), gx.rows = pair_row, gx.n = P, gx.H = H;
    SUBMIT(s, moe_io_exec, gx);
    ARGS(gmm_args, m);
    m.shape[0] = gate, m.shape[1] = up, m.tab[0] = tab, m.tab[1] = tab + E, m.y[0] = g, m.y[1] = u;
    m.ldy[0] = m.ldy[1] = I, m.x = CD(a->moe_x), m.slots = slots, m.e = g_e, m.off = g_off, m.cnt = g_cnt;
    m.nact = g_nact, m.nw = 2;
    SUBMIT(s, gmm_exec, m);
    ARGS(act_args, ac);
    ac.y = g, ac.g = g, ac.u = u, ac.n = P, ac.d = I, ac.ld_u = I, ac.act = a->act == OSP_ACT_SILU ? 0 : 1;
    SUBMIT(s, act_exec, ac);
    m.shape[0] = down, m.shape[1] = NULL, m.tab[0] = tab + 2 * E, m.tab[1] = NULL, m.y[0] = D(a->moe_acc);
    m.y[1] = NULL, m.ldy[0] = H, m.ldy[1] = 0, m.x = g, m.nw = 1;
    SUBMIT(s, gmm_exec, m);
    r.stage = 2;
    SUBMIT(s, moe_dev_exec, r);
    return 1;
}

/* Routing on the host (the probabilities come back: E per token), experts
 * on the GPU. The round trip makes such a step uncapturable: a session
 * that routes runs its steps eagerly. Reference precision, and what the
 * device path does not take. */
static void moe(osp_be_session *s, const osp_moe_args *a) {
    flush(s);
    if (s->fast && moe_device(s, a)) return;
    osp_cu_step_eager(s);
    s->use_graphs = 0;
    int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k, I = a->inter;
    norm(s, D(a->normed), CD(a->x), NULL, N, H, a->eps, 0);
    ew(s, 4, D(a->normed), CD(a->router_scale), N, H, a->scale);
    osp_dbuf *pb = a->probs;
    matmul(s, &a->router, 1, a->normed, N, &pb);
    float *probs = malloc(sizeof(float) * (size_t)(N * E + E));
    if (!probs) {
        note(s, cudaErrorMemoryAllocation, "router");
        return;
    }
    float *pes = probs + N * E;
    flush(s); /* the router's matmul may be held (OSP_CUDA_FUSE=2): it runs before its output is read */
    note(s, cudaMemcpyAsync(probs, a->probs, (size_t)(N * E) * sizeof(float), cudaMemcpyDeviceToHost, s->st), "router");
    note(s, cudaMemcpyAsync(pes, a->per_expert_scale, sizeof(float) * (size_t)E, cudaMemcpyDeviceToHost, s->st), "router");
    note(s, cudaStreamSynchronize(s->st), "router");
    for (int64_t i = 0; i < N; i++) {
        float *p = probs + i * E;
        osp_ops_scalar()->softmax(p, E); /* the CPU reference's, on the host */
        int32_t *idx = a->top_idx + i * K;
        float *w = a->top_w + i * K, sum = 0;
        for (int64_t k = 0; k < K; k++) { /* top-k, ties to the lower index */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t j = 0; j < k; j++) taken |= idx[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[k] = (int32_t)best;
            w[k] = p[best];
            sum += p[best];
        }
        for (int64_t k = 0; k < K; k++) w[k] = w[k] / sum * pes[idx[k]];
    }
    free(probs);
    note(s, cudaMemsetAsync(a->out, 0, sizeof(float) * (size_t)(N * H), s->st), "moe");
    for (int64_t e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < K; k++)
                if (a->top_idx[i * K + k] == e) {
                    a->rows[n] = (int32_t)i;
                    a->row_w[n] = a->top_w[i * K + k];
                    n++;
                }
        if (!n) continue;
        const int32_t *drows = osp_cu_stage(s, a->rows, sizeof(int32_t) * (size_t)n);
        const float *dw = osp_cu_stage(s, a->row_w, sizeof(float) * (size_t)n);
        if (!drows || !dw) return;
        ARGS(moe_io_args, g);
        g.dst = D(a->moe_x), g.src = CD(a->x2), g.rows = drows, g.n = n, g.H = H;
        SUBMIT(s, moe_io_exec, g);
        const osp_weight *ws[] = {&a->gate[e], &a->up[e]};
        osp_dbuf *ys[] = {a->g, a->u};
        matmul(s, ws, 2, a->moe_x, n, ys);
        act_mul(s, a->act, a->g, a->g, a->u, n, I, I);
        const osp_weight *wd = &a->down[e];
        osp_dbuf *acc = a->moe_acc;
        matmul(s, &wd, 1, a->g, n, &acc);
        ARGS(moe_io_args, sc);
        sc.dst = D(a->out), sc.src = CD(a->moe_acc), sc.w = dw, sc.rows = drows, sc.n = n, sc.H = H, sc.scatter = 1;
        SUBMIT(s, moe_io_exec, sc);
    }
}

/* ---- measuring ---- */

/* the legacy stream's read of 2 GiB, timed (a bench's, between its steps) */
static double bw_trial_locked(int release) {
    static void *buf;
    static unsigned *sink;
    static int sms;
    const int64_t bytes = (int64_t)2 << 30; /* 2 GiB: far beyond the L2 */
    if (release) {
        cudaFree(buf), cudaFree(sink);
        buf = NULL, sink = NULL;
        return 0;
    }
    if (!buf) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (cudaMalloc(&buf, (size_t)bytes) != cudaSuccess || cudaMalloc((void **)&sink, sizeof *sink) != cudaSuccess) {
            cudaFree(buf);
            buf = NULL;
            return -1;
        }
        cudaMemset(buf, 0x5a, (size_t)bytes); /* written: a read of untouched pages measures nothing real */
        osp_cu_read_probe(NULL, buf, bytes, sink, sms); /* warm-up */
        cudaDeviceSynchronize();
    }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    cudaEventRecord(e0, NULL);
    int rc = osp_cu_read_probe(NULL, buf, bytes, sink, sms);
    cudaEventRecord(e1, NULL);
    float ms = 0;
    if (cudaEventSynchronize(e1) != cudaSuccess || rc) ms = -1;
    else cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return ms > 0 ? (double)bytes / (ms * 1e-3) / 1e9 : -1;
}

static double bw_trial(int release) {
    osp_cu_legacy_lock();
    double r = bw_trial_locked(release);
    osp_cu_legacy_unlock();
    return r;
}

static osp_backend CUDA = {
    .device = OSP_DEVICE_CUDA,
    .needs_place = 1,
    .alloc = cu_alloc,
    .free = cu_free,
    .adopt_vec = cu_adopt_vec,
    .free_vec = cu_free,
    .write = cu_write,
    .read = cu_read,
    .kv_mem = &KV_MEM,
    .place = cu_place,
    .unplace = cu_unplace,
    .session_new = session_new,
    .session_free = session_free,
    .set_fast = set_fast,
    .set_exact_tokens = set_exact_tokens,
    .begin_chunk = begin_chunk,
    .status = status,
    .upload = upload,
    .end_chunk = end_chunk,
    .matmul = matmul,
    .rmsnorm = rmsnorm,
    .add = add,
    .add_bias = add_bias,
    .scale = scale,
    .copy = copy,
    .act_mul = act_mul,
    .rope = rope,
    .embed = embed,
    .can_embed_prev = can_embed_prev,
    .embed_prev = embed_prev,
    .ids_wait = ids_wait,
    .attention = attention,
    .kv_write = kv_write,
    .head = head,
    .moe = moe,
    .bw_trial = bw_trial,
};

const osp_backend *osp_backend_cuda(void) {
    static char name[300];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        if (e == cudaSuccess || e == cudaErrorNoDevice) osp_err(OSP_ERR_UNSUPPORTED, "no CUDA device is present");
        else if (e == cudaErrorInsufficientDriver)
            osp_err(OSP_ERR_UNSUPPORTED, "no NVIDIA driver new enough for this build's CUDA runtime is present");
        else osp_err(OSP_ERR_UNSUPPORTED, "no usable CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return NULL;
    }
    if (!CUDA.name) {
        osp_cu_encdec_fill(&CUDA);
        CUDA.linear = linear;
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, sizeof name, "cuda (%s)", p.name);
        else snprintf(name, sizeof name, "cuda");
        CUDA.name = name;
    }
    return &CUDA;
}
