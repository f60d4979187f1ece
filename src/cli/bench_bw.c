/* The bench's memory-bandwidth probes (bench_bw.h). */
#include "bench_bw.h"
#include <string.h>
#include "core/core.h"
#include "core/threadpool.h"

enum { BW_NONE, BW_READ, BW_TRIAD, BW_DEVICE };

/* 64 bytes: a cache line a load (the compiler splits it into the widest loads the target has) */
typedef uint64_t bw_line __attribute__((vector_size(64)));

static volatile uint64_t bw_sink;

static void read_task(void *p, int64_t t) {
    osp_bw_probe *pr = p;
    int64_t i0 = t * pr->block, i1 = i0 + pr->block < pr->n ? i0 + pr->block : pr->n;
    const bw_line *restrict v = pr->a;
    bw_line x0 = {0}, x1 = {0}, x2 = {0}, x3 = {0}; /* four chains: the loads never wait on one another */
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) x0 ^= v[i], x1 ^= v[i + 1], x2 ^= v[i + 2], x3 ^= v[i + 3];
    for (; i < i1; i++) x0 ^= v[i];
    x0 ^= x1 ^ x2 ^ x3;
    uint64_t s = 0;
    for (int k = 0; k < 8; k++) s ^= x0[k];
    bw_sink ^= s; /* the reads are used: the compiler keeps them */
}

static void read_init_task(void *p, int64_t t) {
    osp_bw_probe *pr = p;
    int64_t i0 = t * pr->block, i1 = i0 + pr->block < pr->n ? i0 + pr->block : pr->n;
    memset((bw_line *)pr->a + i0, (int)(t + 1), (size_t)(i1 - i0) * sizeof(bw_line));
}

int osp_bw_open_read(osp_bw_probe *pr, size_t weight_bytes) {
    memset(pr, 0, sizeof *pr);
    size_t lo = (size_t)512 << 20, hi = (size_t)4 << 30;
    size_t bytes = weight_bytes < lo ? lo : weight_bytes > hi ? hi : weight_bytes;
    pr->n = (int64_t)(bytes / sizeof(bw_line));
    if (!(pr->a = osp_malloc_huge(OSP_POOL_SCRATCH, (size_t)pr->n * sizeof(bw_line)))) return 0;
    int nt = osp_threads_count();
    pr->block = (pr->n + nt - 1) / nt; /* one contiguous slice per thread, first-touched by it */
    osp_parallel_for(nt, read_init_task, pr);
    pr->kind = BW_READ;
    return 1;
}

static void triad_task(void *p, int64_t t) {
    osp_bw_probe *pr = p;
    int64_t i0 = t * pr->block, i1 = i0 + pr->block < pr->n ? i0 + pr->block : pr->n;
    float *restrict a = pr->a;
    const float *restrict b = pr->b, *restrict c = pr->c;
    for (int64_t i = i0; i < i1; i++) a[i] = b[i] + 3.0f * c[i];
}

static void triad_init_task(void *p, int64_t t) {
    osp_bw_probe *pr = p;
    float *a = pr->a, *b = pr->b, *c = pr->c;
    int64_t i0 = t * pr->block, i1 = i0 + pr->block < pr->n ? i0 + pr->block : pr->n;
    for (int64_t i = i0; i < i1; i++) a[i] = 0, b[i] = 1, c[i] = 2;
}

int osp_bw_open_triad(osp_bw_probe *pr, int huge) {
    memset(pr, 0, sizeof *pr);
    pr->n = 32LL << 20;
    void *(*alloc)(osp_pool, size_t) = huge ? osp_malloc_huge : osp_malloc;
    pr->a = alloc(OSP_POOL_SCRATCH, pr->n * sizeof(float));
    pr->b = alloc(OSP_POOL_SCRATCH, pr->n * sizeof(float));
    pr->c = alloc(OSP_POOL_SCRATCH, pr->n * sizeof(float));
    if (!pr->a || !pr->b || !pr->c) {
        osp_bw_close(pr);
        return 0;
    }
    int nt = osp_threads_count();
    pr->block = (pr->n + nt - 1) / nt;
    osp_parallel_for(nt, triad_init_task, pr);
    pr->kind = BW_TRIAD;
    return 1;
}

int osp_bw_open_device(osp_bw_probe *pr, const osp_model *m) {
    memset(pr, 0, sizeof *pr);
    double g;
    if (osp_model_bw_trial(m, 0, &g) != OSP_OK) return 0; /* the first trial allocates and warms */
    pr->dev = m;
    pr->kind = BW_DEVICE;
    return 1;
}

static void record(osp_bw_probe *pr, double bytes, double dt) {
    pr->bytes += bytes;
    pr->secs += dt;
    if (dt > 0 && bytes / dt / 1e9 > pr->best) pr->best = bytes / dt / 1e9;
    pr->trials++;
}

void osp_bw_trial(osp_bw_probe *pr) {
    if (pr->kind == BW_DEVICE) {
        double g;
        if (osp_model_bw_trial(pr->dev, 0, &g) == OSP_OK) record(pr, g * 1e9, 1.0);
        return;
    }
    if (pr->kind != BW_READ && pr->kind != BW_TRIAD) return;
    double t0 = osp_now_s();
    osp_parallel_for(osp_threads_count(), pr->kind == BW_READ ? read_task : triad_task, pr);
    double dt = osp_now_s() - t0;
    record(pr, pr->kind == BW_READ ? (double)pr->n * sizeof(bw_line) : 3.0 * pr->n * sizeof(float), dt);
}

double osp_bw_mean(const osp_bw_probe *pr) { return pr->secs > 0 ? pr->bytes / pr->secs / 1e9 : 0; }

void osp_bw_close(osp_bw_probe *pr) {
    if (pr->kind == BW_DEVICE) osp_model_bw_trial(pr->dev, 1, NULL);
    osp_free(pr->a), osp_free(pr->b), osp_free(pr->c);
    memset(pr, 0, sizeof *pr);
}
