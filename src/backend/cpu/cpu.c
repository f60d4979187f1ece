/* backend/cpu: the CPU backend. Its memory is host memory (an osp_dbuf is
 * a float pointer here); its operations are the kernels of the ops table
 * chosen from the CPU's features (backend/ops.h), the thread pool, and the
 * int8 path of backend/q8act.h. Matmuls (matmul.c), attention
 * (attention.c), KV stores (kv_store.c) and weight placement (place.c) are
 * in their own files; the small row operations are here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "backend/cpu/features.h"
#include "core/threadpool.h"

#define F(p) ((float *)(p))
#define CF(p) ((const float *)(p))

/* ---- memory ---- */

static osp_dbuf *cpu_alloc(size_t n) { return (osp_dbuf *)osp_malloc(OSP_POOL_SCRATCH, (n ? n : 1) * sizeof(float)); }
static void cpu_free(osp_dbuf *p) { osp_free(p); }
static osp_dbuf *cpu_adopt_vec(float *host, int64_t n) {
    (void)n;
    return (osp_dbuf *)host; /* already host memory */
}
static void cpu_free_vec(osp_dbuf *p) { osp_free(p); }
static void cpu_write(osp_dbuf *dst, const float *host, int64_t n) { memcpy(dst, host, sizeof(float) * (size_t)n); }
static void cpu_upload(osp_be_session *s, osp_dbuf *dst, const float *host, int64_t n) {
    (void)s;
    cpu_write(dst, host, n);
}
static void cpu_read(float *host, const osp_dbuf *src, int64_t n) { memcpy(host, src, sizeof(float) * (size_t)n); }

static void *kv_alloc(size_t n) { return osp_pages_alloc(OSP_POOL_KV, n); }
static void kv_free(void *p, size_t n) { osp_pages_free(OSP_POOL_KV, p, n); }
static void kv_copy(void *d, const void *s, size_t n) { memcpy(d, s, n); }
static const osp_kv_mem KV_MEM = {kv_alloc, kv_free, kv_copy, kv_copy, kv_copy};

/* ---- sessions ---- */

static void session_free(osp_be_session *s) {
    if (!s) return;
    osp_free(s->q8mem);
    osp_free(s->bt);
    osp_free(s->dq);
    osp_free(s->att);
    free(s->q8acts);
    free(s);
}

/* The int8 panels hold max_tok prepared activations of up to max_cols columns. */
static osp_status session_new(int32_t max_tok, int64_t max_cols, osp_be_session **out) {
    *out = NULL;
    osp_be_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    s->ops = osp_ops_get();
    s->q8stride = (osp_q8act_bytes(max_cols) + 63) & ~(size_t)63;
    s->q8cap = max_tok;
    size_t panels = ((size_t)max_tok + OSP_Q8ACT_SLOTS - 1) / OSP_Q8ACT_SLOTS;
    s->q8mem = osp_malloc(OSP_POOL_SCRATCH, s->q8stride * panels);
    s->q8acts = calloc(panels, sizeof *s->q8acts);
    s->btk = osp_bf16t_engine();
    if (s->btk) { /* bf16 weights' production path: any call whose columns fit */
        s->bt_cols = (max_cols + OSP_BF16T_COLS - 1) / OSP_BF16T_COLS * OSP_BF16T_COLS;
        s->bt = osp_malloc(OSP_POOL_SCRATCH, osp_bf16t_packed_bytes(max_tok, s->bt_cols));
        if (max_tok >= 16) { /* (8-bit weights join it in prefill chunks only) */
            s->dq_slots = osp_threads_count();
            s->dq = osp_malloc(OSP_POOL_SCRATCH, sizeof(uint16_t) * osp_bf16t_dq_elems(s->bt_cols) * (size_t)s->dq_slots);
            if (!s->dq) s->dq_slots = 0; /* (then 8-bit weights keep the f32 kernels) */
        }
    }
    if (!s->q8mem || !s->q8acts || (s->bt_cols && !s->bt)) {
        session_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of memory allocating activations");
    }
    *out = s;
    return OSP_OK;
}

static void set_fast(osp_be_session *s, int fast) { s->fast = fast != 0; }

static void set_exact_tokens(osp_be_session *s, int on) { s->exact_tokens = on != 0; }

static void set_chunk_exact(osp_be_session *s, int on) { s->chunk_exact = on != 0; }

static void begin_chunk(osp_be_session *s, int32_t B, int32_t T) {
    s->per_token = (s->fast && T == 1 && B > 1) || (s->exact_tokens && (int64_t)B * T > 1);
}

static osp_status status(osp_be_session *s) {
    (void)s;
    return OSP_OK; /* CPU operations cannot fail once the session exists */
}

/* ---- row operations ---- */

static void rmsnorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    for (int64_t i = 0; i < n; i++) s->ops->rmsnorm(F(y) + i * d, CF(x) + i * d, CF(w), d, eps, add_one);
}

static void add(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    (void)s;
    float *a = F(y);
    const float *b = CF(x);
    for (int64_t i = 0; i < n; i++) a[i] += b[i];
}

static void add_bias(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d) {
    (void)s;
    if (!b) return;
    float *a = F(y);
    const float *c = CF(b);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < d; j++) a[i * d + j] += c[j];
}

static void scale(osp_be_session *s, osp_dbuf *y, float f, int64_t n) {
    (void)s;
    float *a = F(y);
    for (int64_t i = 0; i < n; i++) a[i] *= f;
}

static void copy(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    (void)s;
    memcpy(y, x, sizeof(float) * (size_t)n);
}

typedef struct act_ctx {
    void (*fn)(float *, const float *, const float *, int64_t);
    float *y;
    const float *g, *u;
    int64_t d, ld_u;
} act_ctx;

static void act_task(void *p, int64_t i) {
    const act_ctx *c = p;
    c->fn(c->y + i * c->d, c->g + i * c->d, c->u + i * c->ld_u, c->d);
}

/* element by element, so a token's rows go to the pool's threads as they come (a prefill chunk's 512 rows of the
 * gate's 8192 were one thread's) */
static void act_mul(osp_be_session *s, osp_act act, osp_dbuf *y, const osp_dbuf *g, const osp_dbuf *u, int64_t n,
                    int64_t d, int64_t ld_u) {
    act_ctx c = {act == OSP_ACT_SILU ? s->ops->silu_mul : s->ops->gelu_tanh_mul, F(y), CF(g), CF(u), d, ld_u};
    if (!s->serial && n >= 8 && n * d >= (1 << 16)) {
        osp_parallel_for(n, act_task, &c);
        return;
    }
    if (ld_u == d) {
        c.fn(c.y, c.g, c.u, n * d);
        return;
    }
    for (int64_t i = 0; i < n; i++) act_task(&c, i);
}

/* RoPE in the rotate-half layout: a position's cos and sin computed once for all its heads, 256 pairs at a time */
#define ROPE_CHUNK 256
static void rope(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t D,
                 const osp_dbuf *inv, const int32_t *pos) {
    (void)s;
    const int32_t h2 = D / 2;
    float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
    for (int32_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            const int32_t p = pos[b] + (int32_t)t;
            for (int32_t i0 = 0; i0 < h2; i0 += ROPE_CHUNK) {
                const int32_t m = h2 - i0 < ROPE_CHUNK ? h2 - i0 : ROPE_CHUNK;
                for (int32_t i = 0; i < m; i++) {
                    const float a = (float)p * CF(inv)[i0 + i];
                    cs[i] = cosf(a), sn[i] = sinf(a);
                }
                for (int64_t h = 0; h < heads; h++) {
                    float *v = F(x) + (((int64_t)b * T + t) * heads + h) * D + i0;
                    for (int32_t i = 0; i < m; i++) {
                        const float x1 = v[i], x2 = v[i + h2];
                        v[i] = x1 * cs[i] - x2 * sn[i];
                        v[i + h2] = x2 * cs[i] + x1 * sn[i];
                    }
                }
            }
        }
}

static void embed(osp_be_session *s, const osp_weight *e, float sc, const int32_t *ids, int64_t n, osp_dbuf *xb) {
    (void)s;
    int64_t H = e->cols;
    float *x = F(xb);
    for (int64_t i = 0; i < n; i++) {
        osp_weight_row_f32(e, ids[i], x + i * H);
        if (sc != 1.0f)
            for (int64_t j = 0; j < H; j++) x[i * H + j] *= sc;
    }
}

static void head(osp_be_session *s, const osp_head_args *a) {
    const osp_ops *ops = s->ops;
    int64_t N = (int64_t)a->B * a->T, H = a->hidden, V = a->vocab;
    if (a->res) add(s, (osp_dbuf *)a->x, a->res, N * H);
    if (a->all_logits) {
        rmsnorm(s, a->xn, a->x, a->norm, N, H, a->eps, a->add_one);
        for (int32_t b = 0; b < a->B; b++) {
            float *dst = a->logits + (int64_t)b * a->ld_rows * V;
            osp_dbuf *d = (osp_dbuf *)dst;
            osp_cpu_matmul(s, &a->w, 1, osp_dbuf_at(a->xn, (int64_t)b * a->T * H), a->T, &d);
            if (a->softcap > 0) ops->softcap(dst, (int64_t)a->T * V, a->softcap);
        }
    } else {
        for (int32_t b = 0; b < a->B; b++)
            ops->rmsnorm(F(a->hlast) + b * H, CF(a->x) + ((int64_t)b * a->T + a->T - 1) * H, CF(a->norm), H, a->eps,
                         a->add_one);
        osp_dbuf *d = (osp_dbuf *)a->logits;
        osp_cpu_matmul(s, &a->w, 1, a->hlast, a->B, &d);
        if (a->softcap > 0) ops->softcap(a->logits, (int64_t)a->B * V, a->softcap);
        if (a->ids) /* the sampler's own argmax, on the same bits */
            for (int32_t b = 0; b < a->B; b++) a->ids[b] = ops->argmax(a->logits + (int64_t)b * V, (int32_t)V);
    }
}

/* Routed experts: see osp_moe_args. Tokens are gathered per expert, so each
 * expert runs once on all the tokens routed to it. */
static void moe(osp_be_session *s, const osp_moe_args *a) {
    const osp_ops *ops = s->ops;
    int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k, I = a->inter;
    float *nrm = F(a->normed), *probs = F(a->probs), *out = F(a->out);
    for (int64_t i = 0; i < N; i++) { /* router on the un-normed residual */
        float *r = nrm + i * H;
        ops->rmsnorm(r, CF(a->x) + i * H, NULL, H, a->eps, 0);
        for (int64_t j = 0; j < H; j++) r[j] = r[j] * CF(a->router_scale)[j] * a->scale;
    }
    osp_dbuf *pb = a->probs;
    osp_cpu_matmul(s, &a->router, 1, a->normed, N, &pb);
    for (int64_t i = 0; i < N; i++) {
        float *p = probs + i * E;
        ops->softmax(p, E);
        osp_moe_route_topk(p, E, K, CF(a->per_expert_scale), a->top_idx + i * K, a->top_w + i * K);
    }
    memset(out, 0, sizeof(float) * N * H);
    for (int64_t e = 0; e < E; e++) { /* gather the tokens routed to e, run it once for all */
        int64_t n = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t k = 0; k < K; k++)
                if (a->top_idx[i * K + k] == e) {
                    a->rows[n] = (int32_t)i;
                    a->row_w[n] = a->top_w[i * K + k];
                    memcpy(F(a->moe_x) + n * H, CF(a->x2) + i * H, sizeof(float) * H);
                    n++;
                }
        if (!n) continue;
        const osp_weight *ws[] = {&a->gate[e], &a->up[e]};
        osp_dbuf *ys[] = {a->g, a->u};
        osp_cpu_matmul(s, ws, 2, a->moe_x, n, ys);
        act_mul(s, a->act, a->g, a->g, a->u, n, I, I);
        osp_dbuf *acc = a->moe_acc;
        const osp_weight *wd = &a->down[e];
        osp_cpu_matmul(s, &wd, 1, a->g, n, &acc);
        for (int64_t r = 0; r < n; r++) ops->axpy(out + (int64_t)a->rows[r] * H, a->row_w[r], CF(a->moe_acc) + r * H, H);
    }
}

static osp_status place(osp_weight *const *ws, int n, const void *const *keep, int n_keep, const osp_region *maps,
                        int n_maps, void **owned) {
    return osp_cpu_place(ws, n, keep, n_keep, maps, n_maps, owned);
}

/* Production precision with every matmul weight on the int8 path (4-bit,
 * repacked for VNNI: exact int32 sums in a fixed order per token, whatever
 * the chunk) or on the bf16 engine (AMX or AVX512-BF16: a token's sums do
 * not depend on the call); attention, norms and the rest are per row already. The f32 kernels
 * are not: n == 1, small n and GEMM tiles sum in different orders. */
static int chunk_invariant(const osp_weight *const *ws, int n, int fast, int chunk_exact) {
    if (!fast || n <= 0) return 0;
    const osp_bf16t_kind k = osp_bf16t_engine();
    const int q8 = osp_q8act_matmul_fast() != NULL, bt = k != OSP_BF16T_NONE;
    for (int i = 0; i < n; i++) {
        if (bt && osp_bf16t_fits(ws[i])) continue;
        /* (on AMX, 4-bit prefill chunks run on the tiles, and decode steps on the int8 path, unless chunk_exact) */
        if (!(q8 && ws[i]->packed) || (!chunk_exact && k == OSP_BF16T_AMX && osp_q4t_fits(ws[i]))) return 0;
    }
    return 1;
}

/* Production precision with the bf16 weights on the bf16 engine: on AMX a
 * pass of tens of tokens still costs little more than streaming the weights
 * once (the tiles' compute is far from its bound; on the padded bundled
 * model 8 speculating rows of up to 5 tokens run 1.5x plain 8-row
 * decoding): 64. VDPBF16PS's compute grows with the tokens but is cheap
 * enough for a few a row (Zen 5, the same model, 8 rows: a cap of 8 drafts
 * nothing, 0.99x; 16 1.32x, 24 1.44x, 32 1.30x, 40 1.35x): 24. The f32 and
 * int8 kernels' compute grows with every token: 8. */
static int32_t pass_tokens(const osp_weight *const *ws, int n, int fast) {
    const osp_bf16t_kind k = osp_bf16t_engine();
    if (!fast || n <= 0 || k == OSP_BF16T_NONE) return 8;
    int64_t on = 0, all = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = ws[i]->rows * osp_weight_row_bytes(ws[i]);
        all += b;
        if (osp_bf16t_fits(ws[i])) on += b;
    }
    if (!(all > 0 && on >= all / 10 * 9)) return 8;
    return k == OSP_BF16T_AMX ? 64 : 24;
}

static osp_backend CPU = {
    .device = OSP_DEVICE_CPU,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .adopt_vec = cpu_adopt_vec,
    .free_vec = cpu_free_vec,
    .write = cpu_write,
    .read = cpu_read,
    .kv_mem = &KV_MEM,
    .place = place,
    .chunk_invariant = chunk_invariant,
    .pass_tokens = pass_tokens,
    .set_exact_tokens = set_exact_tokens,
    .set_chunk_exact = set_chunk_exact,
    .unplace = osp_cpu_unplace,
    .session_new = session_new,
    .session_free = session_free,
    .set_fast = set_fast,
    .begin_chunk = begin_chunk,
    .status = status,
    .upload = cpu_upload,
    .matmul = osp_cpu_matmul,
    .rmsnorm = rmsnorm,
    .add = add,
    .add_bias = add_bias,
    .scale = scale,
    .copy = copy,
    .act_mul = act_mul,
    .rope = rope,
    .embed = embed,
    .attention = osp_cpu_attention,
    .bidir_attention = osp_cpu_bidir_attention,
    .kv_write = osp_cpu_kv_write,
    .head = head,
    .moe = moe,
};

const osp_backend *osp_backend_cpu(void) {
    static char name[64];
    if (!CPU.name) {
        osp_cpu_encdec_fill(&CPU);
        const osp_cpu_features *f = osp_cpu_features_get();
        /* the bf16 engine is named: it decides bf16 weights' numbers in production precision (and the prefix
         * cache's namespace includes this name, so servers on other engines sharing a folder never mix) */
        const osp_bf16t_kind k = osp_bf16t_engine();
        snprintf(name, sizeof name, "cpu (%s%s%s)", osp_ops_get()->name, f->vnni ? "+vnni" : "",
                 k == OSP_BF16T_AMX ? "+amx" : k == OSP_BF16T_DOT ? "+bf16" : "");
        CPU.name = name;
    }
    return &CPU;
}
