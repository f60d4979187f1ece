/* backend/cuda: the CUDA backend. Activations, weight vectors, placed
 * matmul weights and KV blocks live in device memory; every operation is a
 * kernel (kernels.cu) on the session's stream.
 *
 * Host data a step needs (embedding rows gathered from the mapped table,
 * positions, per-row KV descriptors) is written into a pinned staging area
 * at offsets that follow the order of the operations, and copied up by
 * the stream ahead of the kernels that read it. A decode step (one token per
 * row) therefore issues the same operations with the same arguments every
 * time for a given number of rows: the second such step is captured as a
 * CUDA graph, and later steps only stage their data and replay the graph
 * (one launch instead of hundreds). A step's fingerprint (every pointer,
 * size and constant its operations passed) must match the captured one, or
 * the step fails rather than replay a different computation.
 *
 * Precisions: reference (f32 everywhere, the goldens' tier) and production
 * (set_fast): prefill chunks of one row with 16 or more tokens multiply on
 * the tensor cores through cuBLAS (bf16 operands, f32 accumulation). A
 * decode step uses the same kernels in both, whatever the number of rows,
 * so a row's numbers do not depend on its batch. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/kernels.h"
#include "kv/kv.h"

#define D(p) ((float *)(p))
#define CD(p) ((const float *)(p))

enum { EAGER, CAPTURE, REPLAY };

#define MAX_GRAPHS 64
#define MAX_GRAPH_ROWS 256

typedef struct graph_slot {
    int32_t B;
    cudaGraphExec_t exec;
    int n_ops;
    size_t staged;
    uint64_t fp;
} graph_slot;

struct osp_be_session {
    cudaStream_t st;
    int fast;
    int err;             /* the first CUDA error, sticky until status() reports it */
    char err_where[96];
    int32_t B, T;        /* the chunk in progress */
    /* staging: pinned host and device areas of the same size */
    unsigned char *stage_h, *stage_d;
    size_t stage_cap, stage_off;
    int pending;         /* work enqueued since the last synchronization */
    /* graphs */
    int mode, use_graphs;
    int n_ops;
    uint64_t fp;
    unsigned char seen[MAX_GRAPH_ROWS + 1]; /* decode steps of B rows run eagerly (captured when B comes again) */
    graph_slot graphs[MAX_GRAPHS];
    int n_graphs;
    /* device scratch */
    float *logits;       /* the head's output */
    size_t logits_cap;   /* floats */
    void *blas;          /* cuBLAS handle, or NULL */
    int blas_tried;
    uint16_t *xb, *wb;   /* bf16 activations and weights of a GEMM */
    size_t xb_cap, wb_cap; /* elements */
};

static void note(osp_be_session *s, int e, const char *where) {
    if (e && !s->err) {
        s->err = e;
        snprintf(s->err_where, sizeof s->err_where, "%s", where);
    }
}

static void drop_graphs(osp_be_session *s) {
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
    memset(s->seen, 0, sizeof s->seen);
}

/* FNV-1a over the words an operation passes: the step's fingerprint. */
static void mix(osp_be_session *s, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        s->fp ^= (v >> (8 * i)) & 0xff;
        s->fp *= 0x100000001b3ULL;
    }
}

/* An operation begins: its arguments go into the fingerprint; returns 0
 * when it must not launch (a replayed step: the graph holds its kernels). */
static int op(osp_be_session *s, int id, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    s->n_ops++;
    mix(s, (uint64_t)id), mix(s, a), mix(s, b), mix(s, c), mix(s, d);
    return s->mode != REPLAY && !s->err;
}
#define U(p) ((uint64_t)(uintptr_t)(p))

static uint64_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Grow the device buffer *p to n bytes (contents not kept); graphs that
 * captured the old one are dropped. 0 when out of memory or capturing. */
static int grow(osp_be_session *s, void **p, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return 1;
    if (s->mode != EAGER) return 0; /* never inside a captured or replayed step */
    cudaStreamSynchronize(s->st);
    drop_graphs(s);
    cudaFree(*p);
    *p = NULL;
    *cap = 0;
    if (cudaMalloc(p, n * elem) != cudaSuccess) return 0;
    *cap = n;
    return 1;
}

/* n bytes of staging for this step: *host to fill now; returns the device
 * address the step's kernels read. The copy up is enqueued by stage_put. */
static void *stage_alloc(osp_be_session *s, size_t n, void **host) {
    size_t off = (s->stage_off + 255) & ~(size_t)255;
    if (off + n > s->stage_cap) {
        if (s->mode != EAGER) {
            note(s, cudaErrorMemoryAllocation, "staging (a replayed step outgrew its capture)");
            return NULL;
        }
        size_t cap = 2 * (off + n) > ((size_t)1 << 20) ? 2 * (off + n) : (size_t)1 << 20;
        cudaStreamSynchronize(s->st); /* earlier copies of this step have read the old area */
        drop_graphs(s);
        unsigned char *h = NULL, *d = NULL;
        if (cudaMallocHost((void **)&h, cap) != cudaSuccess || cudaMalloc((void **)&d, cap) != cudaSuccess) {
            cudaFreeHost(h);
            note(s, cudaErrorMemoryAllocation, "staging");
            return NULL;
        }
        if (off) memcpy(h, s->stage_h, off); /* nothing after the sync reads the old area; keep it for tidiness */
        cudaFreeHost(s->stage_h);
        cudaFree(s->stage_d);
        s->stage_h = h, s->stage_d = d, s->stage_cap = cap;
    }
    s->stage_off = off + n;
    *host = s->stage_h + off;
    return s->stage_d + off;
}

/* Enqueue the copy up of a staged range (in a replayed step the graph's copy node does it). */
static void stage_put(osp_be_session *s, void *dev, size_t n) {
    if (s->mode == REPLAY || !dev) return;
    size_t off = (size_t)((unsigned char *)dev - s->stage_d);
    note(s, cudaMemcpyAsync(dev, s->stage_h + off, n, cudaMemcpyHostToDevice, s->st), "staging copy");
    s->pending = 1;
}

static void *stage(osp_be_session *s, const void *src, size_t n) {
    void *h, *d = stage_alloc(s, n, &h);
    if (!d) return NULL;
    memcpy(h, src, n);
    stage_put(s, d, n);
    return d;
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

/* KV blocks are allocated, copied and freed between steps, on the legacy
 * stream, which the sessions' (blocking) streams are ordered with. */
static void *kv_alloc(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n ? n : 1) != cudaSuccess) return NULL;
    if (cudaMemset(p, 0, n) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void kv_free(void *p) { cudaFree(p); }

static void kv_copy(void *d, const void *s, size_t n) {
    cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
}
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
    drop_graphs(s);
    osp_cublas_free(s->blas);
    cudaFreeHost(s->stage_h);
    cudaFree(s->stage_d);
    cudaFree(s->logits);
    cudaFree(s->xb);
    cudaFree(s->wb);
    cudaStreamDestroy(s->st);
    free(s);
}

static osp_status session_new(int32_t max_tok, int64_t max_cols, osp_be_session **out) {
    *out = NULL;
    osp_be_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (cudaStreamCreate(&s->st) != cudaSuccess) {
        free(s);
        return osp_err(OSP_ERR_IO, "cannot create a CUDA stream");
    }
    const char *g = getenv("OSP_CUDA_GRAPHS");
    s->use_graphs = !(g && !strcmp(g, "0"));
    /* the embedding rows of a full chunk and room for the small arrays */
    size_t cap = (size_t)(max_tok > 0 ? max_tok : 1) * (size_t)(max_cols > 0 ? max_cols : 1) * sizeof(float) +
                 ((size_t)1 << 20);
    if (cudaMallocHost((void **)&s->stage_h, cap) != cudaSuccess || cudaMalloc((void **)&s->stage_d, cap) != cudaSuccess) {
        session_free(s);
        return osp_err(OSP_ERR_NOMEM, "out of GPU or pinned host memory for a session's staging area");
    }
    s->stage_cap = cap;
    *out = s;
    return OSP_OK;
}

static void set_fast(osp_be_session *s, int fast) { s->fast = fast != 0; }

static graph_slot *find_graph(osp_be_session *s, int32_t B) {
    for (int i = 0; i < s->n_graphs; i++)
        if (s->graphs[i].B == B) return &s->graphs[i];
    return NULL;
}

static void begin_chunk(osp_be_session *s, int32_t B, int32_t T) {
    if (s->pending) { /* the staging area is rewritten: the last chunk's copies must have run */
        note(s, cudaStreamSynchronize(s->st), "a previous chunk");
        s->pending = 0;
    }
    s->B = B, s->T = T;
    s->stage_off = 0;
    s->n_ops = 0;
    s->fp = 0xcbf29ce484222325ULL;
    s->mode = EAGER;
    if (!s->use_graphs || T != 1 || B > MAX_GRAPH_ROWS || s->err) return;
    if (find_graph(s, B)) {
        s->mode = REPLAY;
    } else if (s->seen[B] && s->n_graphs < MAX_GRAPHS) {
        if (cudaStreamBeginCapture(s->st, cudaStreamCaptureModeRelaxed) == cudaSuccess) s->mode = CAPTURE;
        else cudaGetLastError();
    }
}

/* The end of a step whose head ran: capture ends, graphs launch. */
static void end_step(osp_be_session *s) {
    if (s->mode == CAPTURE) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ex = NULL;
        int e = cudaStreamEndCapture(s->st, &g);
        if (e == cudaSuccess && !s->err) e = cudaGraphInstantiate(&ex, g, 0);
        if (g) cudaGraphDestroy(g);
        s->mode = EAGER;
        if (e != cudaSuccess || s->err) {
            note(s, e, "capturing a decode step");
            s->use_graphs = 0; /* this session runs its steps eagerly from now on */
            return;
        }
        s->graphs[s->n_graphs++] = (graph_slot){s->B, ex, s->n_ops, s->stage_off, s->fp};
        note(s, cudaGraphLaunch(ex, s->st), "launching a decode step's graph");
    } else if (s->mode == REPLAY) {
        graph_slot *g = find_graph(s, s->B);
        s->mode = EAGER;
        if (g->n_ops != s->n_ops || g->staged != s->stage_off || g->fp != s->fp) {
            drop_graphs(s);
            s->use_graphs = 0;
            note(s, cudaErrorInvalidValue, "a decode step differed from its captured graph");
            return;
        }
        note(s, cudaGraphLaunch(g->exec, s->st), "launching a decode step's graph");
    } else if (s->use_graphs && s->T == 1 && s->B <= MAX_GRAPH_ROWS) {
        s->seen[s->B] = 1; /* captured when a step has as many rows again */
    }
}

static osp_status status(osp_be_session *s) {
    if (s->mode == CAPTURE) { /* a step that ended before its head */
        cudaGraph_t g = NULL;
        cudaStreamEndCapture(s->st, &g);
        if (g) cudaGraphDestroy(g);
        note(s, cudaErrorInvalidValue, "a captured step ended early");
        s->use_graphs = 0;
    } else if (s->mode == REPLAY) {
        note(s, cudaErrorInvalidValue, "a replayed step ended early");
        drop_graphs(s);
        s->use_graphs = 0;
    }
    s->mode = EAGER;
    if (!s->err) note(s, cudaGetLastError(), "a kernel launch");
    if (!s->err) return OSP_OK;
    int e = s->err;
    s->err = 0; /* reported once; the session stays usable */
    cudaGetLastError();
    return osp_err(OSP_ERR_IO, "CUDA: %s (%s)", cudaGetErrorString((cudaError_t)e), s->err_where);
}

/* ---- operations ---- */

/* The production path's GEMM: a prefill chunk of one row (its numbers
 * depend on that row's chunk alone) with enough tokens to fill the tensor
 * cores. */
static int use_gemm(osp_be_session *s, int64_t n) {
    if (!s->fast || s->T < 2 || s->B != 1 || n < 16 || s->mode != EAGER) return 0;
    if (!s->blas_tried) {
        s->blas_tried = 1;
        s->blas = osp_cublas_new(s->st);
    }
    return s->blas != NULL;
}

static void gemm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy) {
    const void *wb = d->data;
    if (d->qbits || d->dtype != 2) { /* dequantized to bf16 for this product */
        if (!grow(s, (void **)&s->wb, &s->wb_cap, (size_t)(d->rows * d->cols), sizeof(uint16_t))) {
            note(s, cudaErrorMemoryAllocation, "GEMM weight scratch");
            return;
        }
        note(s, osp_cu_weight_to_bf16(s->st, d, s->wb), "weight to bf16");
        wb = s->wb;
    }
    if (!grow(s, (void **)&s->xb, &s->xb_cap, (size_t)(n * d->cols), sizeof(uint16_t))) {
        note(s, cudaErrorMemoryAllocation, "GEMM activation scratch");
        return;
    }
    note(s, osp_cu_to_bf16(s->st, s->xb, x, n * d->cols), "activations to bf16");
    int e = osp_cublas_gemm_bf16(s->blas, d->rows, n, d->cols, wb, s->xb, y, ldy);
    if (e) note(s, cudaErrorUnknown, "cuBLAS GEMM");
}

static void mm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy) {
    if (!op(s, 1, U(d), U(x), (uint64_t)n, U(y) ^ (uint64_t)ldy << 48)) return;
    if (use_gemm(s, n)) gemm(s, d, x, n, y, ldy);
    else note(s, osp_cu_matmul(s->st, d, x, n, y, ldy), "matmul");
}

static void matmul(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *x, int64_t n,
                   osp_dbuf *const *ys) {
    for (int i = 0; i < nw; i++) {
        const osp_cu_weight *d = ws[i]->packed;
        if (!d) {
            note(s, cudaErrorInvalidValue, "a weight not placed on the GPU");
            return;
        }
        mm(s, d, CD(x), n, D(ys[i]), d->rows);
    }
}

static void norm(osp_be_session *s, float *y, const float *x, const float *w, int64_t n, int64_t d, float eps,
                 int add_one) {
    if (!op(s, 2, U(y), U(x), U(w) ^ (uint64_t)add_one << 60, (uint64_t)n << 32 ^ (uint64_t)d ^ fbits(eps) << 16))
        return;
    note(s, osp_cu_rmsnorm(s->st, y, x, w, n, d, eps, add_one), "rmsnorm");
}

static void rmsnorm(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, const osp_dbuf *w, int64_t n, int64_t d,
                    float eps, int add_one) {
    norm(s, D(y), CD(x), CD(w), n, d, eps, add_one);
}

static void add(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    if (op(s, 3, U(y), U(x), (uint64_t)n, 0)) note(s, osp_cu_add(s->st, D(y), CD(x), n), "add");
}

static void add_bias(osp_be_session *s, osp_dbuf *y, const osp_dbuf *b, int64_t n, int64_t d) {
    if (b && op(s, 4, U(y), U(b), (uint64_t)n, (uint64_t)d)) note(s, osp_cu_add_bias(s->st, D(y), CD(b), n, d), "add_bias");
}

static void scale(osp_be_session *s, osp_dbuf *y, float a, int64_t n) {
    if (op(s, 5, U(y), fbits(a), (uint64_t)n, 0)) note(s, osp_cu_scale(s->st, D(y), a, n), "scale");
}

static void copy(osp_be_session *s, osp_dbuf *y, const osp_dbuf *x, int64_t n) {
    if (op(s, 6, U(y), U(x), (uint64_t)n, 0))
        note(s, cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s->st), "copy");
}

static void act_mul(osp_be_session *s, osp_act act, osp_dbuf *y, const osp_dbuf *g, const osp_dbuf *u, int64_t n,
                    int64_t d, int64_t ld_u) {
    if (op(s, 7, U(y) ^ (uint64_t)act << 60, U(g), U(u), (uint64_t)n << 40 ^ (uint64_t)d << 20 ^ (uint64_t)ld_u))
        note(s, osp_cu_act_mul(s->st, act == OSP_ACT_SILU ? 0 : 1, D(y), CD(g), CD(u), n, d, ld_u), "act_mul");
}

static void rope(osp_be_session *s, osp_dbuf *x, int32_t B, int32_t T, int64_t heads, int32_t Dh,
                 const osp_dbuf *inv, const int32_t *pos) {
    const int32_t *dpos = stage(s, pos, sizeof(int32_t) * (size_t)B);
    if (dpos && op(s, 8, U(x), U(inv), U(dpos), (uint64_t)B << 48 ^ (uint64_t)T << 32 ^ (uint64_t)heads << 16 ^ (uint64_t)Dh))
        note(s, osp_cu_rope(s->st, D(x), B, T, heads, Dh, CD(inv), dpos), "rope");
}

/* The rows are gathered on the host from the mapped table into the staging area. */
static void embed(osp_be_session *s, const osp_weight *e, float sc, const int32_t *ids, int64_t n, osp_dbuf *x) {
    int64_t H = e->cols;
    size_t bytes = (size_t)(n * H) * sizeof(float);
    void *hv;
    float *dv = stage_alloc(s, bytes, &hv);
    if (!dv) return;
    float *h = hv;
    for (int64_t i = 0; i < n; i++) {
        osp_weight_row_f32(e, ids[i], h + i * H);
        if (sc != 1.0f)
            for (int64_t j = 0; j < H; j++) h[i * H + j] *= sc;
    }
    stage_put(s, dv, bytes);
    if (op(s, 9, U(x), U(dv), (uint64_t)n, (uint64_t)H))
        note(s, cudaMemcpyAsync(x, dv, bytes, cudaMemcpyDeviceToDevice, s->st), "embed");
}

/* The per-row descriptors of a KV layer for this call, staged. */
static const osp_cu_kvrow *kv_rows(osp_be_session *s, const osp_kv *kv, int32_t layer, const int32_t *rows,
                                   int32_t nb, osp_cu_kvlayer *L) {
    const osp_kv_layer *l = &kv->layers[layer];
    *L = (osp_cu_kvlayer){l->sliding, l->ring, l->bits, l->group, l->n_kv_heads, l->head_dim, l->cb, l->ng,
                          l->slot_bytes};
    void *hv;
    osp_cu_kvrow *d = stage_alloc(s, sizeof(osp_cu_kvrow) * (size_t)(nb > 0 ? nb : 1), &hv);
    if (!d) return NULL;
    osp_cu_kvrow *r = hv;
    for (int32_t i = 0; i < nb; i++) {
        int32_t row = rows[i];
        r[i] = (osp_cu_kvrow){l->mem ? l->mem[row] : NULL, l->cap ? l->cap[row] : 0, kv->pos[row]};
    }
    stage_put(s, d, sizeof(osp_cu_kvrow) * (size_t)nb);
    return d;
}

static uint64_t layer_fp(const osp_cu_kvlayer *L) {
    return (uint64_t)L->sliding ^ (uint64_t)L->ring << 8 ^ (uint64_t)L->bits << 32 ^ (uint64_t)L->group << 40 ^
           (uint64_t)L->n_kv_heads << 48 ^ (uint64_t)L->head_dim << 20;
}

static void attention(osp_be_session *s, const osp_attn_args *a) {
    osp_cu_attn c;
    c.rows = kv_rows(s, a->kv, a->layer, a->rows, a->nb, &c.L);
    if (!c.rows) return;
    c.nb = a->nb, c.T = a->T, c.n_heads = a->n_heads, c.window = a->window;
    c.scale = a->scale, c.softcap = a->softcap;
    c.q = CD(a->q), c.k = CD(a->k), c.v = CD(a->v), c.out = D(a->out);
    uint64_t k = (uint64_t)c.nb << 48 ^ (uint64_t)c.T << 32 ^ (uint64_t)c.n_heads << 16 ^ (uint64_t)c.window ^
                 fbits(c.scale) << 8 ^ fbits(c.softcap) << 24;
    if (op(s, 10, U(c.rows) ^ layer_fp(&c.L), U(c.q) ^ U(c.k) << 1, U(c.v) ^ U(c.out) << 1, k))
        note(s, osp_cu_attention(s->st, &c), "attention");
}

static void kv_write(osp_be_session *s, struct osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                     const osp_dbuf *k, const osp_dbuf *v, int32_t T) {
    osp_cu_kvlayer L;
    const osp_cu_kvrow *r = kv_rows(s, kv, layer, rows, nb, &L);
    if (r && op(s, 11, U(r) ^ layer_fp(&L), U(k), U(v), (uint64_t)nb << 32 ^ (uint64_t)T))
        note(s, osp_cu_kv_write(s->st, &L, r, nb, T, CD(k), CD(v)), "kv_write");
}

static void head(osp_be_session *s, const osp_head_args *a) {
    const osp_cu_weight *w = a->w->packed;
    int64_t N = (int64_t)a->B * a->T, H = a->hidden, V = a->vocab, rows = a->all_logits ? N : a->B;
    if (!w || !grow(s, (void **)&s->logits, &s->logits_cap, (size_t)(rows * V), sizeof(float))) {
        note(s, w ? cudaErrorMemoryAllocation : cudaErrorInvalidValue, "head");
        end_step(s);
        return;
    }
    float *lg = s->logits;
    if (a->all_logits) {
        norm(s, D(a->xn), CD(a->x), CD(a->norm), N, H, a->eps, a->add_one);
        mm(s, w, CD(a->xn), N, lg, V);
    } else {
        for (int32_t b = 0; b < a->B; b++)
            norm(s, D(a->hlast) + b * H, CD(a->x) + ((int64_t)b * a->T + a->T - 1) * H, CD(a->norm), 1, H, a->eps,
                 a->add_one);
        mm(s, w, CD(a->hlast), a->B, lg, V);
    }
    if (a->softcap > 0 && op(s, 12, U(lg), (uint64_t)(rows * V), fbits(a->softcap), 0))
        note(s, osp_cu_softcap(s->st, lg, rows * V, a->softcap), "softcap");
    end_step(s);
    if (s->err) return;
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
    s->pending = 0;
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

/* Routing on the host (the probabilities come back: E per token), experts
 * on the GPU. The round trip makes such a step uncapturable: sessions that
 * route run eagerly. */
static void moe(osp_be_session *s, const osp_moe_args *a) {
    if (s->mode != EAGER) {
        note(s, cudaErrorInvalidValue, "routing inside a captured step");
        return;
    }
    s->use_graphs = 0;
    drop_graphs(s);
    int64_t N = a->n, H = a->hidden, E = a->n_experts, K = a->top_k, I = a->inter;
    norm(s, D(a->normed), CD(a->x), NULL, N, H, a->eps, 0);
    note(s, osp_cu_mul_vec(s->st, D(a->normed), CD(a->router_scale), a->scale, N, H), "router scale");
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
        const int32_t *drows = stage(s, a->rows, sizeof(int32_t) * (size_t)n);
        const float *dw = stage(s, a->row_w, sizeof(float) * (size_t)n);
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

/* ---- measuring ---- */

static double bw_trial(int release) {
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
    .bw_trial = bw_trial,
};

const osp_backend *osp_backend_cuda(void) {
    static char name[300];
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        if (e == cudaSuccess || e == cudaErrorNoDevice) osp_err(OSP_ERR_UNSUPPORTED, "no CUDA device is present");
        else osp_err(OSP_ERR_UNSUPPORTED, "no usable CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
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
