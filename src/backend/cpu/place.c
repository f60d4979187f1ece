/* backend/cpu/place: placing a model's matmul weights in memory that
 * streams at the full bandwidth, once, at load: one huge-page-advised block for the model
 * (with 4 KiB pages, two cores read half as fast here: the page walks of a
 * virtual machine), filled on the thread pool.
 *
 * - 4-bit matrices, when the CPU has AVX2 or AVX-512 VNNI, are repacked for the
 *   int8 path (backend/q8act.h); reference precision keeps reading the
 *   mmapped original, whose pages are given back until then.
 * - every other matrix is copied as stored (codes, scales and biases, or
 *   the dense rows) and its pointers move to the copy.
 * Gathered tables (the embeddings) stay mmapped; a tied head is the
 * embedding's struct copy and is placed as the head. The mmapped pages
 * that were read are given back to the kernel (a read-only private file
 * mapping: they come back from the file if read again), so the process
 * holds the weights once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "backend/cpu/cpu.h"
#include "core/threadpool.h"

static int packable(const osp_weight *w) { return w->data && w->packed == NULL && osp_q8act_supported(w); }

/* Bytes of a weight that is copied as stored: [codes, scales, biases] or
 * the dense rows. 0 for one that is repacked or absent. */
static size_t copy_parts(const osp_weight *w, size_t part[3]) {
    part[0] = part[1] = part[2] = 0;
    if (!w->data || (osp_q8act_matmul_fast() && osp_q8act_supported(w))) return 0;
    if (w->qbits) {
        part[0] = (size_t)(w->rows * w->cols * w->qbits / 8);
        part[1] = part[2] = (size_t)(w->rows * (w->cols / w->group)) * osp_dtype_size(w->sdtype);
    } else {
        part[0] = (size_t)(w->rows * w->cols) * osp_dtype_size(w->dtype);
    }
    return part[0] + part[1] + part[2];
}

static size_t r64(size_t n) { return (n + 63) & ~(size_t)63; }

static void add_size(osp_weight *w, void *ctx) {
    size_t part[3];
    if (osp_q8act_matmul_fast() && packable(w)) *(size_t *)ctx += r64(osp_q4pack_bytes(w));
    else if (copy_parts(w, part)) *(size_t *)ctx += r64(part[0]) + r64(part[1]) + r64(part[2]);
}

typedef struct pack_ctx {
    char *next;
    osp_weight *w;
    const void *const *keep; /* data gathered from where it is (the embedding's codes) */
    int n_keep;
    const osp_region *maps;  /* file mappings whose pages may be given back */
    int n_maps;
} pack_ctx;

static int kept(const pack_ctx *c, const void *p) {
    for (int i = 0; i < c->n_keep; i++)
        if (c->keep[i] == p) return 1;
    return 0;
}

#define TILES_PER_TASK 64

static void pack_task(void *p, int64_t t) {
    const pack_ctx *c = p;
    int64_t tiles = (c->w->rows + OSP_Q4PACK_ROWS - 1) / OSP_Q4PACK_ROWS, t1 = (t + 1) * TILES_PER_TASK;
    osp_q4pack(c->w, (void *)c->w->packed, t * TILES_PER_TASK, t1 < tiles ? t1 : tiles);
}

/* Let the kernel drop mmapped pages that were read here. */
static void release(const pack_ctx *c, const void *p, size_t n) {
    int mapped = 0; /* only ever a range inside a file mapping: advice on heap memory would zero it */
    for (int i = 0; i < c->n_maps && !mapped; i++) {
        const char *f = c->maps[i].p;
        mapped = f && (const char *)p >= f && (const char *)p + n <= f + c->maps[i].n;
    }
    if (!mapped) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
              b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

typedef struct copy_ctx {
    const void *src;
    void *dst;
    size_t n;
} copy_ctx;

#define COPY_CHUNK ((size_t)4 << 20)

static void copy_task(void *p, int64_t t) {
    const copy_ctx *c = p;
    size_t o = (size_t)t * COPY_CHUNK, n = c->n - o < COPY_CHUNK ? c->n - o : COPY_CHUNK;
    memcpy((char *)c->dst + o, (const char *)c->src + o, n);
}

/* The bytes at *ptr move to the arena (in parallel), and the mapping's
 * pages are given back. */
static void move_part(pack_ctx *c, const void **ptr, size_t n, int keep_source) {
    if (!n) return;
    copy_ctx cc = {*ptr, c->next, n};
    osp_parallel_for((int64_t)((n + COPY_CHUNK - 1) / COPY_CHUNK), copy_task, &cc);
    if (!keep_source) release(c, *ptr, n);
    *ptr = c->next;
    c->next += r64(n);
}

static void pack_one(osp_weight *w, void *ctx) {
    pack_ctx *c = ctx;
    size_t part[3];
    if (!osp_q8act_matmul_fast() || !packable(w)) {
        if (!copy_parts(w, part)) return;
        int keep = kept(c, w->data); /* the embedding is gathered from the mapping */
        move_part(c, &w->data, part[0], keep);
        move_part(c, &w->scales, part[1], 0);
        move_part(c, &w->biases, part[2], 0);
        return;
    }
    w->packed = c->next;
    c->next += r64(osp_q4pack_bytes(w));
    c->w = w;
    int64_t tiles = (w->rows + OSP_Q4PACK_ROWS - 1) / OSP_Q4PACK_ROWS;
    osp_parallel_for((tiles + TILES_PER_TASK - 1) / TILES_PER_TASK, pack_task, c);
    if (!kept(c, w->data)) release(c, w->data, (size_t)(w->rows * w->cols / 2));
    release(c, w->scales, (size_t)(w->rows * (w->cols / w->group) * 2));
    release(c, w->biases, (size_t)(w->rows * (w->cols / w->group) * 2));
}

osp_status osp_cpu_place(osp_weight *const *ws, int n, const void *const *keep, int n_keep, const osp_region *maps,
                         int n_maps, void **owned) {
    *owned = NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) add_size(ws[i], &total);
    if (!total) return OSP_OK;
    char *arena = osp_malloc_huge(OSP_POOL_WEIGHTS, total);
    if (!arena) return osp_err(OSP_ERR_NOMEM, "out of memory placing %.1f MB of weights", total / 1e6);
    pack_ctx c = {arena, NULL, keep, n_keep, maps, n_maps};
    for (int i = 0; i < n; i++) pack_one(ws[i], &c);
    *owned = arena;
    return OSP_OK;
}

void osp_cpu_unplace(void *owned) { osp_free(owned); }
