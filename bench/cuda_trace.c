/* bench/cuda_trace.c: a kernel timeline without Nsight Systems (the lent GPU machines have ncu but no nsys).
 * A CUDA injection library: the driver loads the file named by CUDA_INJECTION64_PATH at cuInit and calls
 * InitializeInjection, which turns on CUPTI's kernel activity records (start and end stamped by the GPU, graph
 * kernel nodes each with their node id). At exit the records go to OSP_TRACE_OUT (default osp_trace.csv), one
 * kernel a line, in start order:
 *
 *   start_ns,end_ns,graph_id,graph_node_id,stream,grid_x,grid_y,grid_z,block_x,registers,name
 *
 * bench/cuda_trace_summary.py turns a decode run's records into per-step tables (each kernel's time, the gap or
 * overlap before it, the step's span against its kernels' sum). Used as
 *
 *   CUDA_INJECTION64_PATH=build/libosp_cuda_trace.so OSP_TRACE_OUT=t.csv osprey bench --device cuda ...
 *
 * A development tool: nothing in osprey links it. */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rec {
    uint64_t start, end, node;
    uint32_t graph, stream;
    int32_t gx, gy, gz, bx;
    uint16_t regs;
    const char *name; /* CUPTI's: valid for the process' lifetime */
} rec;

static rec *recs;
static size_t n_recs, cap_recs;
static size_t dropped;

#define BUF_SIZE (8u << 20)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUF_SIZE);
    *size = *buffer ? BUF_SIZE : 0;
    *max_records = 0;
}

static void keep(const CUpti_ActivityKernel10 *k) {
    if (n_recs == cap_recs) {
        size_t nc = cap_recs ? 2 * cap_recs : 65536;
        rec *r = realloc(recs, nc * sizeof *r);
        if (!r) {
            dropped++;
            return;
        }
        recs = r, cap_recs = nc;
    }
    rec *r = &recs[n_recs++];
    r->start = k->start, r->end = k->end, r->node = k->graphNodeId;
    r->graph = k->graphId, r->stream = k->streamId;
    r->gx = k->gridX, r->gy = k->gridY, r->gz = k->gridZ, r->bx = k->blockX;
    r->regs = k->registersPerThread;
    r->name = k->name;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *a = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS)
        if (a->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || a->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            keep((const CUpti_ActivityKernel10 *)a);
    free(buffer);
}

static int by_start(const void *a, const void *b) {
    const rec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    const char *path = getenv("OSP_TRACE_OUT");
    if (!path || !*path) path = "osp_trace.csv";
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "osp_cuda_trace: cannot write %s\n", path);
        return;
    }
    qsort(recs, n_recs, sizeof *recs, by_start);
    fprintf(f, "start_ns,end_ns,graph_id,graph_node_id,stream,grid_x,grid_y,grid_z,block_x,registers,name\n");
    for (size_t i = 0; i < n_recs; i++) {
        const rec *r = &recs[i];
        fprintf(f, "%llu,%llu,%u,%llu,%u,%d,%d,%d,%d,%u,%s\n", (unsigned long long)r->start,
                (unsigned long long)r->end, r->graph, (unsigned long long)r->node, r->stream, r->gx, r->gy, r->gz,
                r->bx, (unsigned)r->regs, r->name ? r->name : "?");
    }
    fclose(f);
    fprintf(stderr, "osp_cuda_trace: %zu kernels to %s (%zu not kept)\n", n_recs, path, dropped);
}

int InitializeInjection(void);
int InitializeInjection(void) {
    const char *what = "cuptiActivityRegisterCallbacks";
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r == CUPTI_SUCCESS) what = "cuptiActivityEnable", r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
        const char *msg = NULL;
        cuptiGetResultString(r, &msg);
        fprintf(stderr, "osp_cuda_trace: %s: %s\n", what, msg ? msg : "?");
        return 0;
    }
    atexit(finish);
    return 1;
}
