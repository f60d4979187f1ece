/* backend/cuda/memory: device memory (activations, KV blocks), the placement of a model's weights (one
 * arena, the matmul weights' descriptors), and the read-bandwidth trial between a bench's steps: the
 * backend table's memory entries (osp_cu_memory_fill). Every legacy-stream call holds osp_cu_legacy_lock. */
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels.h"
#include "kv/kv.h"

/* ---- memory ---- */

static osp_dbuf *cu_alloc(size_t n) {
    void *p = NULL;
    return cudaMalloc(&p, (n ? n : 1) * sizeof(float)) == cudaSuccess ? (osp_dbuf *)p : NULL;
}


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

/* the table's memory, placement and measuring entries */
void osp_cu_memory_fill(osp_backend *b) {
    b->alloc = cu_alloc, b->free = cu_free, b->adopt_vec = cu_adopt_vec, b->free_vec = cu_free;
    b->write = cu_write, b->read = cu_read, b->kv_mem = &KV_MEM;
    b->place = cu_place, b->unplace = cu_unplace, b->bw_trial = bw_trial;
}
