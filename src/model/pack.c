/* Repacking a model's 4-bit matrices for the int8-activation path
 * (backend/q8act.h), once at load, when this CPU has AVX-512 VNNI.
 *
 * Every matrix that goes through osp_matmul gets its packed copy: one
 * allocation for the model, filled on the thread pool. Gathered tables
 * (the embeddings) keep only their mmapped form; a tied head is the
 * embedding's struct copy and is packed as the head. The mmapped codes
 * stay for the reference precision mode, which reads them; the fast mode
 * never touches them, so they cost address space, not memory. */
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "core/threadpool.h"
#include "model.h"

/* Calls fn on every matmul weight of the model. */
static void each_matmul_weight(osp_model *m, void (*fn)(osp_weight *w, void *ctx), void *ctx) {
    fn(&m->head, ctx);
    fn(&m->ple_model_proj, ctx);
    for (int i = 0; i < m->cfg.n_layers; i++) {
        osp_layer *L = &m->layers[i];
        osp_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->wg, &L->wu, &L->wd,
                            &L->w_ple_gate, &L->w_ple_proj, &L->w_router};
        for (size_t j = 0; j < sizeof ws / sizeof *ws; j++) fn(ws[j], ctx);
        for (int e = 0; L->ex_gate && e < m->cfg.n_experts; e++) {
            fn(&L->ex_gate[e], ctx);
            fn(&L->ex_up[e], ctx);
            fn(&L->ex_down[e], ctx);
        }
    }
}

static int packable(const osp_weight *w) { return w->data && osp_q8act_supported(w); }

static void add_size(osp_weight *w, void *ctx) {
    if (packable(w)) *(size_t *)ctx += (osp_q4pack_bytes(w) + 63) & ~(size_t)63;
}

typedef struct pack_ctx {
    char *next;
    osp_weight *w;
    const void *keep; /* the embedding's codes: gathered from the mmap */
    const osp_st *st;
} pack_ctx;

#define TILES_PER_TASK 64

static void pack_task(void *p, int64_t t) {
    const pack_ctx *c = p;
    int64_t tiles = (c->w->rows + OSP_Q4PACK_ROWS - 1) / OSP_Q4PACK_ROWS, t1 = (t + 1) * TILES_PER_TASK;
    osp_q4pack(c->w, (void *)c->w->packed, t * TILES_PER_TASK, t1 < tiles ? t1 : tiles);
}

/* Let the kernel drop the mmapped pages packing read (a read-only private
 * file mapping: they come back from the file if the reference mode reads
 * them), so the process does not hold the weights twice. */
static void release(const osp_st *st, const void *p, size_t n) {
    int mapped = 0; /* only ever a range inside a file mapping: advice on heap memory would zero it */
    for (int i = 0; i < st->n_files && !mapped; i++) {
        const char *f = st->files[i].map;
        mapped = f && (const char *)p >= f && (const char *)p + n <= f + st->files[i].size;
    }
    if (!mapped) return;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + pg - 1) & ~(pg - 1),
              b = ((uintptr_t)p + n) & ~(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

static void pack_one(osp_weight *w, void *ctx) {
    pack_ctx *c = ctx;
    if (!packable(w)) return;
    w->packed = c->next;
    c->next += (osp_q4pack_bytes(w) + 63) & ~(size_t)63;
    c->w = w;
    int64_t tiles = (w->rows + OSP_Q4PACK_ROWS - 1) / OSP_Q4PACK_ROWS;
    osp_parallel_for((tiles + TILES_PER_TASK - 1) / TILES_PER_TASK, pack_task, c);
    if (w->data != c->keep) release(c->st, w->data, (size_t)(w->rows * w->cols / 2));
    release(c->st, w->scales, (size_t)(w->rows * (w->cols / w->group) * 2));
    release(c->st, w->biases, (size_t)(w->rows * (w->cols / w->group) * 2));
}

osp_status osp_model_pack(osp_model *m) {
    if (!osp_q8act_matmul_fast()) return OSP_OK;
    size_t total = 0;
    each_matmul_weight(m, add_size, &total);
    if (!total) return OSP_OK;
    m->packed = osp_malloc_huge(OSP_POOL_WEIGHTS, total);
    if (!m->packed)
        return osp_err(OSP_ERR_NOMEM, "%s: out of memory repacking %.1f MB of 4-bit weights", m->dir, total / 1e6);
    pack_ctx c = {m->packed, NULL, m->embed.data, m->st};
    each_matmul_weight(m, pack_one, &c);
    return OSP_OK;
}
