/* backend/cuda: the CUDA backend's operation table. Activations, weight
 * vectors, placed matmul weights and KV blocks live in device memory
 * (memory.c); every operation is a kernel (kernels.h; the .cu files) on the
 * session's stream (step.c: sessions, staged host data, CUDA graphs for
 * decode steps); the head and its ids are head.c's. The fused entries of
 * the table (add_rmsnorm, rope_qk, gate_up_act: backend.h) take fused
 * launches; every other operation is submitted when it is called.
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
#define SUBMIT(s, fn, a) osp_cu_submit((s), (fn), &(a), sizeof(a))
#define ARGS(type, a) type a; memset(&a, 0, sizeof a)

/* A step of few tokens (a decode step of up to 8 rows, a short verification chunk): its launches are short and
 * many, so it takes the fused parts (FUSE_FEW) and the compact attention kernel. Measured in docs/NOTES.md
 * (issue 18, the seventh session: the other parts, and the compact kernel in many-token steps, were slower) */
#define FEW_TOKENS 8
static int few(const osp_be_session *s) { return (int64_t)s->B * s->T <= FEW_TOKENS; }

/* the FUSE_ parts on in this step (none under OSP_CUDA_FUSE=0) */
static int fz(const osp_be_session *s) { return s->fuse && few(s) ? FUSE_FEW : 0; }
static osp_backend CUDA;

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
    /* x2 (k) and v stored in the cache once rotated (rope_qk in a few-token step: FUSE_KV), when kvrows */
    osp_cu_kvlayer L;
    const osp_cu_kvrow *kvrows;
    const float *v;
    const void *kv; /* the store's cache and layer */
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

/* y = rmsnorm(x) (t: x += t first, in the same launch) */
static void norm(osp_be_session *s, float *y, const float *x, const float *t, const float *w, int64_t n, int64_t d,
                 float eps, int add_one) {
    ARGS(norm_args, a);
    a.y = y, a.x = (float *)x, a.t = t, a.w = w, a.n = n, a.d = d, a.eps = eps, a.add_one = add_one;
    SUBMIT(s, norm_exec, a);
}
static void rmsnorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    norm(s, D(y), CD(x), NULL, CD(w), n, d, eps, add_one);
}

/* the residual add in the norm's launch (OSP_CUDA_FUSE=0: the two operations) */
static void add_rmsnorm(osp_be_session *s, osp_dbuf *y, osp_dbuf *x, const osp_dbuf *t, const osp_dbuf *w, int64_t n,
                        int64_t d, float eps, int add_one) {
    if (!s->fuse) osp_fused_add_rmsnorm(&CUDA, s, y, x, t, w, n, d, eps, add_one);
    else norm(s, D(y), CD(x), CD(t), CD(w), n, d, eps, add_one);
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
    ARGS(ew_args, a);
    a.y = y, a.x = x, a.n = n, a.d = d, a.a = f, a.kind = kind;
    SUBMIT(s, ew_exec, a);
}

static void add(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) { ew(s, 0, D(y), CD(x), n, 0, 0); }

static void add_bias(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d) {
    if (b) ew(s, 1, D(y), CD(b), n, d, 0);
}

static void scale(osp_be_session *s, osp_dbuf *y, float a, int64_t n) { ew(s, 2, D(y), NULL, n, 0, a); }
static void copy(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) { ew(s, 3, D(y), CD(x), n, 0, 0); }

/* staged with the step (so a graph of it copies the new data up before it runs), then copied into place */
static void upload(osp_be_session *s, osp_dbuf *dst, const float *host, int64_t n) {
    const float *d = osp_cu_stage(s, host, sizeof(float) * (size_t)n);
    if (!d) return;
    copy(s, dst, (const osp_dbuf *)d, n);
}

static void end_chunk(osp_be_session *s) { osp_cu_step_end(s); }

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
    ARGS(act_args, a);
    a.y = D(y), a.g = CD(g), a.u = CD(u), a.n = n, a.d = d, a.ld_u = ld_u, a.act = act == OSP_ACT_SILU ? 0 : 1;
    SUBMIT(s, act_exec, a);
}

/* y = act(gate) * up: in a few-token step one launch (osp_cu_matmul_tc_pair: gate's and up's outputs never
 * written) where the two weights' launch would not split the columns; else the matmul and act_mul */
static void gate_up_act(osp_be_session *s, osp_act act, const osp_weight *gate, const osp_weight *up,
                        const osp_dbuf *x, int64_t n, osp_dbuf *y, osp_dbuf *u) {
    const osp_cu_weight *gw = gate->packed, *uw = up->packed;
    if ((fz(s) & FUSE_PAIR) && s->fast && gw && uw && osp_cu_tc_pair_ok(gw, uw, n) && !use_gemm(s, n)) {
        ARGS(pair_args, a);
        a.gw = gw, a.uw = uw, a.x = CD(x), a.y = D(y), a.n = n, a.ldy = gw->rows;
        a.act = act == OSP_ACT_SILU ? 0 : 1;
        SUBMIT(s, pair_exec, a);
        return;
    }
    osp_fused_gate_up_act(&CUDA, s, act, gate, up, x, n, y, u);
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

/* RoPE alone (rope_qk: with the head norms, the other tensor and the store) */
static void rope(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t Dh,
                 const osp_dbuf *inv, const int32_t *pos) {
    const int32_t *dpos = osp_cu_stage(s, pos, sizeof(int32_t) * (size_t)B);
    if (!dpos) return;
    ARGS(rope_args, a);
    a.x = D(x), a.inv = CD(inv), a.pos = dpos, a.heads = heads, a.B = B, a.T = T, a.Dh = Dh;
    SUBMIT(s, rope_exec, a);
}

/* (head.c's calls of a norm, an add and a matmul) */
void osp_cu_op_norm(osp_be_session *s, float *y, const float *x, const float *t, const float *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    norm(s, y, x, t, w, n, d, eps, add_one);
}
void osp_cu_op_add(osp_be_session *s, float *y, const float *x, int64_t n) { ew(s, 0, y, x, n, 0, 0); }
void osp_cu_op_mm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy) {
    mm(s, d, x, n, y, ldy);
}

/* y = x · Wᵀ + bias: the matmul (cuBLAS for a long chunk in production precision) and the bias */
static void linear(osp_be_session *s, const osp_weight *w, const osp_dbuf *x, int64_t n, const osp_dbuf *bias,
                   osp_dbuf *y) {
    matmul(s, &w, 1, x, n, &y);
    add_bias(s, y, bias, n, w->rows);
}

/* The rows are gathered on the host from the mapped table into the staging area. */
static void embed(osp_be_session *s, const osp_weight *e, float sc, const int32_t *ids, int64_t n, osp_dbuf *x) {
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

/* rope_inv: q and k rotated (at the rows' positions) and stored by the attention launch itself (rope_qk's
 * FUSE_ROPE_ATT), or NULL */
static void attend(osp_be_session *s, const osp_attn_args *a, const float *rope_inv) {
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

static void attention(osp_be_session *s, const osp_attn_args *a) { attend(s, a, NULL); }

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
    ARGS(kvw_args, a);
    a.rows = kv_rows(s, kv, layer, rows, nb, &a.L);
    if (!a.rows) return;
    a.k = CD(k), a.v = CD(v), a.nb = nb, a.T = T;
    SUBMIT(s, kvw_exec, a);
}

/* q's and k's head norms and RoPE in one launch (osp_cu_norm_rope_store, or osp_cu_rope2 without norms); in a
 * few-token step the K/V store in that launch too (FUSE_KV), and in a one-token step without head norms the
 * RoPE and the store in the attention's launch instead (FUSE_ROPE_ATT). OSP_CUDA_FUSE=0: the plain operations. */
static void rope_qk(osp_be_session *s, const osp_rope_qk_args *r) {
    if (!s->fuse) {
        osp_fused_rope_qk(&CUDA, s, r);
        return;
    }
    ARGS(rope_args, a);
    a.pos = osp_cu_stage(s, r->pos, sizeof(int32_t) * (size_t)r->B);
    if (!a.pos) return;
    a.x = D(r->q), a.inv = CD(r->inv_freq), a.heads = r->q_heads, a.B = r->B, a.T = r->T, a.Dh = r->D;
    if (r->q_norm) a.w1 = CD(r->q_norm), a.eps1 = r->eps, a.norm1 = 1, a.add1 = r->add_one;
    if (r->k) {
        a.x2 = D(r->k), a.heads2 = r->k_heads;
        if (r->k_norm) a.w2 = CD(r->k_norm), a.eps2 = r->eps, a.norm2 = 1, a.add2 = r->add_one;
    }
    const osp_attn_args *at = r->attn;
    if (r->kv && r->k && (fz(s) & FUSE_KV) && r->k_heads == r->kv->layers[r->layer].n_kv_heads &&
        r->D == r->kv->layers[r->layer].head_dim) {
        const unsigned char *area = s->stage_d;
        a.kvrows = kv_rows(s, r->kv, r->layer, r->rows, r->B, &a.L);
        if (a.kvrows && s->stage_d != area) /* the staging area grew: the positions again */
            a.pos = osp_cu_stage(s, r->pos, sizeof(int32_t) * (size_t)r->B);
        if (!a.kvrows || !a.pos) return;
        a.v = CD(r->v), a.kv = r->kv, a.layer = r->layer;
        if ((fz(s) & FUSE_ROPE_ATT) && r->T == 1 && !a.norm1 && !a.norm2 && at && at->q == r->q && at->k == r->k &&
            at->v == r->v && at->kv == r->kv && at->layer == r->layer && at->nb == r->B && at->T == 1 &&
            !at->chunk_stored && at->n_heads == r->q_heads && at->n_kv_heads == r->k_heads && at->head_dim == r->D) {
            attend(s, at, a.inv); /* the attention rotates q and k and stores k and v itself */
            return;
        }
        SUBMIT(s, rope_exec, a);
    } else {
        SUBMIT(s, rope_exec, a);
        if (r->kv) kv_write(s, r->kv, r->layer, r->rows, r->B, r->k, r->v, r->T);
    }
    if (at) attend(s, at, NULL);
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

    norm(s, D(a->normed), CD(a->x), NULL, NULL, N, H, a->eps, 0);
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
    if (s->fast && moe_device(s, a)) return;
    osp_cu_step_eager(s);
    s->use_graphs = 0;
    int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k;
    norm(s, D(a->normed), CD(a->x), NULL, NULL, N, H, a->eps, 0);
    ew(s, 4, D(a->normed), CD(a->router_scale), N, H, a->scale);
    osp_dbuf *pb = a->probs;
    matmul(s, &a->router, 1, a->normed, N, &pb);
    float *probs = malloc(sizeof(float) * (size_t)(N * E + E));
    if (!probs) {
        note(s, cudaErrorMemoryAllocation, "router");
        return;
    }
    float *pes = probs + N * E;
    note(s, cudaMemcpyAsync(probs, a->probs, (size_t)(N * E) * sizeof(float), cudaMemcpyDeviceToHost, s->st), "router");
    note(s, cudaMemcpyAsync(pes, a->per_expert_scale, sizeof(float) * (size_t)E, cudaMemcpyDeviceToHost, s->st), "router");
    note(s, cudaStreamSynchronize(s->st), "router");
    for (int64_t i = 0; i < N; i++) {
        float *p = probs + i * E;
        osp_ops_scalar()->softmax(p, E); /* the CPU reference's, on the host */
        osp_moe_route_topk(p, E, K, pes, a->top_idx + i * K, a->top_w + i * K);
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
        gate_up_act(s, a->act, &a->gate[e], &a->up[e], a->moe_x, n, a->g, a->u);
        const osp_weight *wd = &a->down[e];
        osp_dbuf *acc = a->moe_acc;
        matmul(s, &wd, 1, a->g, n, &acc);
        ARGS(moe_io_args, sc);
        sc.dst = D(a->out), sc.src = CD(a->moe_acc), sc.w = dw, sc.rows = drows, sc.n = n, sc.H = H, sc.scatter = 1;
        SUBMIT(s, moe_io_exec, sc);
    }
}

static osp_backend CUDA = {
    .device = OSP_DEVICE_CUDA,
    .needs_place = 1,
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
    .attention = attention,
    .kv_write = kv_write,
    .moe = moe,
    .add_rmsnorm = add_rmsnorm,
    .rope_qk = rope_qk,
    .gate_up_act = gate_up_act,
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
        osp_cu_memory_fill(&CUDA);
        osp_cu_session_fill(&CUDA);
        osp_cu_head_fill(&CUDA);
        osp_cu_encdec_fill(&CUDA);
        CUDA.linear = linear;
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, sizeof name, "cuda (%s)", p.name);
        else snprintf(name, sizeof name, "cuda");
        CUDA.name = name;
    }
    return &CUDA;
}
