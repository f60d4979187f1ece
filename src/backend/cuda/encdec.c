/* backend/cuda/encdec: the encoder-decoder operations (model/whisper.c) on
 * the GPU: each a kernel of kernels_encdec.cu submitted through step.c (a
 * decoder step ends with end_chunk, so it can be replayed as a graph). The
 * linear is cuda.c's matmul and bias. */
#include <string.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels.h"

#define D(p) ((float *)(p))
#define CD(p) ((const float *)(p))
#define SUBMIT(s, fn, a) osp_cu_submit((s), (fn), &(a), sizeof(a))
#define ARGS(type, a) type a; memset(&a, 0, sizeof a)

typedef struct ln_args {
    float *y;
    const float *x, *w, *b;
    int64_t n, d;
    float eps;
} ln_args;

static void ln_exec(osp_be_session *s, const void *p) {
    const ln_args *a = p;
    osp_cu_note(s, osp_cu_layernorm(s->st, a->y, a->x, a->w, a->b, a->n, a->d, a->eps), "layernorm");
}

static void layernorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, const osp_dbuf *b,
                      int64_t n, int64_t d, float eps) {
    ARGS(ln_args, a);
    a.y = D(y), a.x = CD(x), a.w = CD(w), a.b = CD(b), a.n = n, a.d = d, a.eps = eps;
    SUBMIT(s, ln_exec, a);
}

typedef struct gelu_args {
    float *x;
    int64_t n;
} gelu_args;

static void gelu_exec(osp_be_session *s, const void *p) {
    const gelu_args *a = p;
    osp_cu_note(s, osp_cu_gelu(s->st, a->x, a->n), "gelu");
}

static void gelu(osp_be_session *s, osp_dbuf *x, int64_t n) {
    ARGS(gelu_args, a);
    a.x = D(x), a.n = n;
    SUBMIT(s, gelu_exec, a);
}

static void im2col_exec(osp_be_session *s, const void *p) {
    const osp_im2col_args *a = p;
    osp_cu_note(s, osp_cu_im2col(s->st, D(a->col), CD(a->x), a->C, a->t_in, a->t_out, a->ld_c, a->ld_f, a->k,
                                 a->stride, a->pad, a->k_major),
                "im2col");
}

static void im2col(osp_be_session *s, const osp_im2col_args *in) {
    ARGS(osp_im2col_args, a);
    a.col = in->col, a.x = in->x, a.C = in->C, a.t_in = in->t_in, a.t_out = in->t_out, a.ld_c = in->ld_c;
    a.ld_f = in->ld_f, a.k = in->k, a.stride = in->stride, a.pad = in->pad, a.k_major = in->k_major;
    SUBMIT(s, im2col_exec, a);
}

typedef struct pack_args {
    float *kh, *vt;
    const float *k, *v;
    int64_t S, ld;
    int32_t heads, hd;
} pack_args;

static void pack_exec(osp_be_session *s, const void *p) {
    const pack_args *a = p;
    osp_cu_note(s, osp_cu_pack_kv(s->st, a->kh, a->vt, a->k, a->v, a->S, a->ld, a->heads, a->hd), "pack_kv");
}

static void pack_kv(osp_be_session *s, osp_dbuf *kh, osp_dbuf *vt, const osp_dbuf *k, const osp_dbuf *v, int64_t S,
                    int64_t ld, int32_t heads, int32_t hd) {
    ARGS(pack_args, a);
    a.kh = D(kh), a.vt = D(vt), a.k = CD(k), a.v = CD(v), a.S = S, a.ld = ld, a.heads = heads, a.hd = hd;
    SUBMIT(s, pack_exec, a);
}

typedef struct fatt_args {
    osp_full_attn_args a;
    int32_t flash; /* the production path's tensor-core kernel */
    int32_t rows;  /* a.kh, a.vt are K and V as rows [S, ld] (the flash kernel only) */
} fatt_args;

static void fatt_exec(osp_be_session *s, const void *p) {
    const fatt_args *f = p;
    const osp_full_attn_args *a = &f->a;
    if (f->flash) {
        const int64_t need = osp_cu_flash_scratch(a->n, a->S, a->ld, a->heads, a->whole);
        if (need && !osp_cu_grow(s, (void **)&s->part, &s->part_cap, (size_t)need, sizeof(float))) {
            osp_cu_note(s, cudaErrorMemoryAllocation, "full attention scratch");
            return;
        }
        osp_cu_note(s, osp_cu_flash_attention(s->st, CD(a->q), CD(a->kh), CD(a->vt), D(a->out), s->part, a->n, a->S,
                                              a->ld, a->heads, a->hd, a->whole, f->rows ? a->ld : 0),
                    "full attention (tensor cores)");
        return;
    }
    osp_cu_note(s, osp_cu_full_attention(s->st, CD(a->q), CD(a->kh), CD(a->vt), D(a->out), a->n, a->S, a->ld,
                                         a->heads, a->hd),
                "full attention");
}

/* production precision: the tensor-core kernel (bf16 operands) where the head size allows; reference: f32 */
static void full_attention(osp_be_session *s, const osp_full_attn_args *in) {
    ARGS(fatt_args, f);
    osp_full_attn_args *a = &f.a;
    a->q = in->q, a->kh = in->kh, a->vt = in->vt, a->out = in->out, a->n = in->n, a->S = in->S, a->ld = in->ld;
    a->heads = in->heads, a->hd = in->hd, a->whole = in->whole;
    f.flash = s->fast && osp_cu_flash_ok(in->hd);
    SUBMIT(s, fatt_exec, f);
}

/* K and V read as the projections wrote them: the flash kernel takes them so; the f32 kernel reads them packed */
static int full_attention_rows(osp_be_session *s, const osp_full_attn_args *in) {
    if (!s->fast || !osp_cu_flash_ok(in->hd)) return 0;
    ARGS(fatt_args, f);
    f.a = *in;
    f.flash = 1, f.rows = 1;
    SUBMIT(s, fatt_exec, f);
    return 1;
}

typedef struct scores_args {
    float *out;
    const float *q, *kh;
    int64_t n, S, ld;
    int32_t head, hd;
} scores_args;

static void scores_exec(osp_be_session *s, const void *p) {
    const scores_args *a = p;
    osp_cu_note(s, osp_cu_full_scores(s->st, a->out, a->q, a->kh, a->n, a->S, a->ld, a->head, a->hd), "scores");
}

static void full_scores(osp_be_session *s, osp_dbuf *out, const osp_dbuf *q, const osp_dbuf *kh, int64_t n, int64_t S,
                        int64_t ld, int32_t head, int32_t hd) {
    ARGS(scores_args, a);
    a.out = D(out), a.q = CD(q), a.kh = CD(kh), a.n = n, a.S = S, a.ld = ld, a.head = head, a.hd = hd;
    SUBMIT(s, scores_exec, a);
}

typedef struct rows_args {
    float *kc, *vc, *out;
    const float *q, *k, *v;
    const int32_t *row, *pos; /* device (staged) */
    int64_t n, ctx, ld;
    int32_t heads, hd;
} rows_args;

static void store_exec(osp_be_session *s, const void *p) {
    const rows_args *a = p;
    osp_cu_note(s, osp_cu_rows_store(s->st, a->kc, a->vc, a->k, a->v, a->row, a->pos, a->n, a->ctx, a->ld),
                "rows_store");
}

static void ratt_exec(osp_be_session *s, const void *p) {
    const rows_args *a = p;
    osp_cu_note(s, osp_cu_rows_attention(s->st, a->q, a->k, a->v, a->out, a->row, a->pos, a->n, a->ctx, a->ld,
                                         a->heads, a->hd),
                "rows attention");
}

/* the host rows and positions of n tokens, staged: 0 on failure */
static int stage_rows(osp_be_session *s, const int32_t *row, const int32_t *pos, int64_t n, rows_args *a) {
    a->row = osp_cu_stage(s, row, sizeof(int32_t) * (size_t)n);
    a->pos = osp_cu_stage(s, pos, sizeof(int32_t) * (size_t)n);
    return a->row && a->pos;
}

static void rows_store(osp_be_session *s, osp_dbuf *kc, osp_dbuf *vc, const osp_dbuf *k, const osp_dbuf *v,
                       const int32_t *row, const int32_t *pos, int64_t n, int64_t ctx, int64_t ld) {
    ARGS(rows_args, a);
    if (!stage_rows(s, row, pos, n, &a)) return;
    a.kc = D(kc), a.vc = D(vc), a.k = CD(k), a.v = CD(v), a.n = n, a.ctx = ctx, a.ld = ld;
    SUBMIT(s, store_exec, a);
}

static void rows_attention(osp_be_session *s, const osp_rows_attn_args *in) {
    ARGS(rows_args, a);
    if (!stage_rows(s, in->row, in->pos, in->n, &a)) return;
    a.q = CD(in->q), a.k = CD(in->k), a.v = CD(in->v), a.out = D(in->out), a.n = in->n, a.ctx = in->ctx;
    a.ld = in->ld, a.heads = in->heads, a.hd = in->hd;
    SUBMIT(s, ratt_exec, a);
}

typedef struct bidir_args {
    osp_bidir_attn_args a;
    const int32_t *lens; /* device (staged), or NULL */
} bidir_args;
_Static_assert(sizeof(bidir_args) <= OP_ARGS, "the arguments fit an operation's");

static void bidir_exec(osp_be_session *s, const void *p) {
    const bidir_args *f = p;
    const osp_bidir_attn_args *a = &f->a;
    osp_cu_note(s, osp_cu_bidir_attention(s->st, CD(a->q), CD(a->k), CD(a->v), D(a->out), f->lens, a->nb, a->T,
                                          a->n_heads, a->n_kv_heads, a->head_dim, a->radius, a->scale, a->softcap),
                "bidirectional attention");
}

/* f32 in both precisions; each row's lengths staged with the chunk */
static void bidir_attention(osp_be_session *s, const osp_bidir_attn_args *in) {
    ARGS(bidir_args, f);
    f.a = *in;
    f.a.len = NULL; /* the host array is read here, not when the operation runs */
    if (in->len && !(f.lens = osp_cu_stage(s, in->len, sizeof(int32_t) * (size_t)in->nb))) return;
    SUBMIT(s, bidir_exec, f);
}

void osp_cu_encdec_fill(osp_backend *b) {
    b->layernorm = layernorm;
    b->gelu = gelu;
    b->im2col = im2col;
    b->pack_kv = pack_kv;
    b->full_attention = full_attention;
    b->full_attention_rows = full_attention_rows;
    b->full_scores = full_scores;
    b->rows_store = rows_store;
    b->rows_attention = rows_attention;
    b->bidir_attention = bidir_attention;
}
