/* backend/cuda: the CUDA backend. Activations, weight vectors, placed
 * matmul weights and KV blocks live in device memory; every operation is a
 * kernel (kernels.cu) on the session's stream. Token ids go in as host
 * arrays (the embedding rows are gathered on the host from the mapped table
 * and uploaded), positions and per-row KV descriptors are uploaded per
 * call, logits come back in one copy.
 *
 * This first version is built for exactness (the goldens' reference tier)
 * and batch invariance, not yet for speed: small per-call arrays are copied
 * from pageable memory (which orders them after the work in flight), and
 * matmuls are one warp per weight row. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "kv/kv.h"

#define D(p) ((float *)(p))
#define CD(p) ((const float *)(p))

struct osp_be_session {
    cudaStream_t st;
    int fast;
    int err;             /* the first CUDA error, sticky */
    char err_where[64];
    void *args;          /* device: small per-call arrays */
    size_t args_cap;
    float *logits;       /* device: the head's output */
    size_t logits_cap;   /* floats */
    float *host;         /* host staging (embedding rows, router probabilities) */
    size_t host_cap;     /* floats */
};

static void note(osp_be_session *s, int e, const char *where) {
    if (e && !s->err) {
        s->err = e;
        snprintf(s->err_where, sizeof s->err_where, "%s", where);
    }
}

/* A device buffer of at least n bytes (grown as needed; the old contents are not kept). */
static void *args_buf(osp_be_session *s, size_t n) {
    if (n > s->args_cap) {
        cudaStreamSynchronize(s->st);
        cudaFree(s->args);
        s->args = NULL;
        s->args_cap = 0;
        if (cudaMalloc(&s->args, n) != cudaSuccess) return NULL;
        s->args_cap = n;
    }
    return s->args;
}

/* Upload n bytes of host data into the args buffer at offset off (ordered
 * after the work already on the stream, since the source is pageable). */
static void *upload_args(osp_be_session *s, size_t off, const void *src, size_t n) {
    char *base = args_buf(s, off + n + 256);
    if (!base) {
        note(s, cudaErrorMemoryAllocation, "argument buffer");
        return NULL;
    }
    note(s, cudaMemcpyAsync(base + off, src, n, cudaMemcpyHostToDevice, s->st), "upload");
    return base + off;
}

static float *host_buf(osp_be_session *s, size_t n) {
    if (n > s->host_cap) {
        free(s->host);
        s->host = malloc(n * sizeof(float));
        s->host_cap = s->host ? n : 0;
    }
    return s->host;
}

/* ---- memory ---- */

static osp_dbuf *cu_alloc(size_t n) {
    void *p = NULL;
    return cudaMalloc(&p, (n ? n : 1) * sizeof(float)) == cudaSuccess ? (osp_dbuf *)p : NULL;
}

static void cu_free(osp_dbuf *p) { cudaFree(p); }

static osp_dbuf *cu_adopt_vec(float *host, int64_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, (size_t)(n ? n : 1) * sizeof(float)) != cudaSuccess) return NULL;
    cudaMemcpy(p, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    osp_free(host);
    return (osp_dbuf *)p;
}

static void cu_write(osp_dbuf *dst, const float *host, int64_t n) {
    cudaMemcpy(dst, host, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
}

static void cu_read(float *host, const osp_dbuf *src, int64_t n) {
    cudaMemcpy(host, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
}

static void *kv_alloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    cudaMemset(p, 0, n);
    return p;
}

static void kv_free(void *p) { cudaFree(p); }
static void kv_copy(void *d, const void *s, size_t n) { cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice); }
static const osp_kv_mem KV_MEM = {kv_alloc, kv_free, kv_copy};

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
            if (cudaMemcpy(next, src[k], part[k], cudaMemcpyHostToDevice) != cudaSuccess) {
                cudaFree(pl->arena);
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
    cudaFree(pl->arena);
    free(pl->descs);
    free(pl);
}

/* ---- sessions ---- */

static void session_free(osp_be_session *s) {
    if (!s) return;
    cudaStreamSynchronize(s->st);
    cudaFree(s->args);
    cudaFree(s->logits);
    free(s->host);
    cudaStreamDestroy(s->st);
    free(s);
}

static osp_status session_new(int32_t max_tok, int64_t max_cols, osp_be_session **out) {
    (void)max_tok, (void)max_cols;
    *out = NULL;
    osp_be_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (cudaStreamCreate(&s->st) != cudaSuccess) {
        free(s);
        return osp_err(OSP_ERR_IO, "cannot create a CUDA stream");
    }
    *out = s;
    return OSP_OK;
}

static void set_fast(osp_be_session *s, int fast) { s->fast = fast != 0; }
static void begin_chunk(osp_be_session *s, int32_t B, int32_t T) { (void)s, (void)B, (void)T; }

static osp_status status(osp_be_session *s) {
    if (!s->err) note(s, cudaGetLastError(), "a kernel launch");
    if (!s->err) return OSP_OK;
    return osp_err(OSP_ERR_IO, "CUDA: %s (%s)", cudaGetErrorString((cudaError_t)s->err), s->err_where);
}

/* ---- operations ---- */

static void matmul(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *x, int64_t n,
                   osp_dbuf *const *ys) {
    for (int i = 0; i < nw; i++) {
        const osp_cu_weight *d = ws[i]->packed;
        if (!d) {
            note(s, cudaErrorInvalidValue, "a weight not placed on the GPU");
            return;
        }
        note(s, osp_cu_matmul(s->st, d, CD(x), n, D(ys[i]), d->rows), "matmul");
    }
}

static void rmsnorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    note(s, osp_cu_rmsnorm(s->st, D(y), CD(x), CD(w), n, d, eps, add_one), "rmsnorm");
}

static void add(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) { note(s, osp_cu_add(s->st, D(y), CD(x), n), "add"); }

static void add_bias(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d) {
    if (b) note(s, osp_cu_add_bias(s->st, D(y), CD(b), n, d), "add_bias");
}

static void scale(osp_be_session *s, osp_dbuf *y, float a, int64_t n) { note(s, osp_cu_scale(s->st, D(y), a, n), "scale"); }

static void copy(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    note(s, cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s->st), "copy");
}

static void act_mul(osp_be_session *s, osp_act act, osp_dbuf *y, const osp_dbuf *g, const osp_dbuf *u, int64_t n,
                    int64_t d, int64_t ld_u) {
    note(s, osp_cu_act_mul(s->st, act == OSP_ACT_SILU ? 0 : 1, D(y), CD(g), CD(u), n, d, ld_u), "act_mul");
}

static void rope(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t Dh,
                 const osp_dbuf *inv, const int32_t *pos) {
    const int32_t *dpos = upload_args(s, 0, pos, sizeof(int32_t) * (size_t)B);
    if (dpos) note(s, osp_cu_rope(s->st, D(x), B, T, heads, Dh, CD(inv), dpos), "rope");
}

static void embed(osp_be_session *s, const osp_weight *e, float sc, const int32_t *ids, int64_t n, osp_dbuf *x) {
    int64_t H = e->cols;
    float *h = host_buf(s, (size_t)(n * H));
    if (!h) {
        note(s, cudaErrorMemoryAllocation, "embedding staging");
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        osp_weight_row_f32(e, ids[i], h + i * H);
        if (sc != 1.0f)
            for (int64_t j = 0; j < H; j++) h[i * H + j] *= sc;
    }
    note(s, cudaMemcpyAsync(x, h, (size_t)(n * H) * sizeof(float), cudaMemcpyHostToDevice, s->st), "embed");
    note(s, cudaStreamSynchronize(s->st), "embed"); /* the staging buffer is reused */
}

/* The per-row descriptors of a KV layer for this call, on the device. */
static const osp_cu_kvrow *kv_rows(osp_be_session *s, const osp_kv *kv, int32_t layer, const int32_t *rows,
                                   int32_t nb, osp_cu_kvlayer *L) {
    const osp_kv_layer *l = &kv->layers[layer];
    *L = (osp_cu_kvlayer){l->sliding, l->ring, l->bits, l->group, l->n_kv_heads, l->head_dim, l->cb, l->ng,
                          l->slot_bytes};
    osp_cu_kvrow r[nb > 0 ? nb : 1];
    for (int32_t i = 0; i < nb; i++) {
        int32_t row = rows[i];
        r[i] = (osp_cu_kvrow){l->mem ? l->mem[row] : NULL, l->cap ? l->cap[row] : 0, kv->pos[row]};
    }
    return upload_args(s, 0, r, sizeof(osp_cu_kvrow) * (size_t)nb);
}

static void attention(osp_be_session *s, const osp_attn_args *a) {
    osp_cu_attn c;
    c.rows = kv_rows(s, a->kv, a->layer, a->rows, a->nb, &c.L);
    if (!c.rows) return;
    c.nb = a->nb, c.T = a->T, c.n_heads = a->n_heads, c.window = a->window;
    c.scale = a->scale, c.softcap = a->softcap;
    c.q = CD(a->q), c.k = CD(a->k), c.v = CD(a->v), c.out = D(a->out);
    note(s, osp_cu_attention(s->st, &c), "attention");
}

static void kv_write(osp_be_session *s, struct osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                     const osp_dbuf *k, const osp_dbuf *v, int32_t T) {
    osp_cu_kvlayer L;
    const osp_cu_kvrow *r = kv_rows(s, kv, layer, rows, nb, &L);
    if (r) note(s, osp_cu_kv_write(s->st, &L, r, nb, T, CD(k), CD(v)), "kv_write");
}

static float *logits_buf(osp_be_session *s, size_t n) {
    if (n > s->logits_cap) {
        cudaStreamSynchronize(s->st);
        cudaFree(s->logits);
        s->logits = NULL;
        s->logits_cap = 0;
        if (cudaMalloc((void **)&s->logits, n * sizeof(float)) != cudaSuccess) return NULL;
        s->logits_cap = n;
    }
    return s->logits;
}

static void head(osp_be_session *s, const osp_head_args *a) {
    const osp_cu_weight *w = a->w->packed;
    int64_t N = (int64_t)a->B * a->T, H = a->hidden, V = a->vocab, rows = a->all_logits ? N : a->B;
    float *lg = logits_buf(s, (size_t)(rows * V));
    if (!w || !lg) {
        note(s, w ? cudaErrorMemoryAllocation : cudaErrorInvalidValue, "head");
        return;
    }
    if (a->all_logits) {
        rmsnorm(s, a->xn, a->x, a->norm, N, H, a->eps, a->add_one);
        note(s, osp_cu_matmul(s->st, w, CD(a->xn), N, lg, V), "head");
    } else {
        for (int32_t b = 0; b < a->B; b++)
            note(s, osp_cu_rmsnorm(s->st, D(a->hlast) + b * H, CD(a->x) + ((int64_t)b * a->T + a->T - 1) * H,
                                   CD(a->norm), 1, H, a->eps, a->add_one),
                 "head norm");
        note(s, osp_cu_matmul(s->st, w, CD(a->hlast), a->B, lg, V), "head");
    }
    if (a->softcap > 0) note(s, osp_cu_softcap(s->st, lg, rows * V, a->softcap), "softcap");
    if (a->all_logits) {
        for (int32_t b = 0; b < a->B; b++)
            note(s, cudaMemcpyAsync(a->logits + (int64_t)b * a->ld_rows * V, lg + (int64_t)b * a->T * V,
                                    (size_t)(a->T * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
                 "logits");
    } else {
        note(s, cudaMemcpyAsync(a->logits, lg, (size_t)(a->B * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
             "logits");
    }
    note(s, cudaStreamSynchronize(s->st), "logits");
}

static void softmax_host(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

/* Routing on the host (the probabilities come back: E per token), experts on the GPU. */
static void moe(osp_be_session *s, const osp_moe_args *a) {
    int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k, I = a->inter;
    note(s, osp_cu_rmsnorm(s->st, D(a->normed), CD(a->x), NULL, N, H, a->eps, 0), "router norm");
    note(s, osp_cu_mul_vec(s->st, D(a->normed), CD(a->router_scale), a->scale, N, H), "router scale");
    osp_dbuf *pb = a->probs;
    matmul(s, &a->router, 1, a->normed, N, &pb);
    float *probs = host_buf(s, (size_t)(N * E)), *pes = NULL;
    if (!probs) {
        note(s, cudaErrorMemoryAllocation, "router");
        return;
    }
    note(s, cudaMemcpyAsync(probs, a->probs, (size_t)(N * E) * sizeof(float), cudaMemcpyDeviceToHost, s->st), "router");
    note(s, cudaStreamSynchronize(s->st), "router");
    pes = malloc(sizeof(float) * (size_t)E);
    if (!pes) return;
    note(s, cudaMemcpy(pes, a->per_expert_scale, sizeof(float) * (size_t)E, cudaMemcpyDeviceToHost), "router");
    for (int64_t i = 0; i < N; i++) {
        float *p = probs + i * E;
        softmax_host(p, E);
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
    free(pes);
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
        size_t rb = (sizeof(int32_t) * (size_t)n + 255) & ~(size_t)255;
        if (!args_buf(s, rb + sizeof(float) * (size_t)n + 256)) { /* both fit before either is uploaded */
            note(s, cudaErrorMemoryAllocation, "argument buffer");
            return;
        }
        const int32_t *drows = upload_args(s, 0, a->rows, sizeof(int32_t) * (size_t)n);
        const float *dw = upload_args(s, rb, a->row_w, sizeof(float) * (size_t)n);
        if (!drows || !dw) return;
        note(s, osp_cu_gather(s->st, D(a->moe_x), CD(a->x2), drows, n, H), "moe gather");
        const osp_weight *ws[] = {&a->gate[e], &a->up[e]};
        osp_dbuf *ys[] = {a->g, a->u};
        matmul(s, ws, 2, a->moe_x, n, ys);
        act_mul(s, a->act, a->g, a->g, a->u, n, I, I);
        const osp_weight *wd = &a->down[e];
        osp_dbuf *acc = a->moe_acc;
        matmul(s, &wd, 1, a->g, n, &acc);
        note(s, osp_cu_scatter_axpy(s->st, D(a->out), CD(a->moe_acc), drows, dw, n, H), "moe scatter");
    }
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
    .begin_chunk = begin_chunk,
    .status = status,
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
    .head = head,
    .moe = moe,
};

const osp_backend *osp_backend_cuda(void) {
    static char name[300];
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        osp_err(OSP_ERR_UNSUPPORTED, "no CUDA device is present");
        return NULL;
    }
    if (!CUDA.name) {
        struct cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) snprintf(name, sizeof name, "cuda (%s)", p.name);
        else snprintf(name, sizeof name, "cuda");
        CUDA.name = name;
    }
    return &CUDA;
}
