/* backend/cpu/matmul: matmuls on the thread pool.
 *
 * Rows of the weights are claimed by the threads (guided self-scheduling);
 * in production precision (fast) 4-bit weights run on the int8 path: the
 * input's int8 form is prepared once per call (backend/q8act.h) and shared
 * by every weight of the call. A batched decode step runs each activation
 * through exactly the kernel a lone one would get. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu.h"
#include "core/threadpool.h"

#define MM_MAX_W 4
#define MM_MIN_TAKE 64 /* rows a claim takes at least */

typedef struct mm_ctx {
    const osp_ops *ops;
    const float *x;
    int64_t n;
    const osp_q8act *acts; /* fast path: the n prepared activations */
    osp_q8act_mm_fn q8;
    int per_token;         /* each activation through the one-token kernel */
    osp_bf16t_kind btk;    /* fast path, bf16 weights on the bf16 engine (bf16t.h): */
    const uint16_t *bt;    /* the n activations packed for it */
    uint16_t *dq;          /* and 8-bit ones in prefill chunks: each task's dequantization scratch */
    int q4t;               /* (and 4-bit ones, on AMX) */
    size_t dq_elems;       /* (bf16 values a task's scratch: osp_bf16t_dq_elems of the widest input) */
    int nw, nt;
    const osp_weight *w[MM_MAX_W];
    float *y[MM_MAX_W];
    /* weight i owns rows [first[i], first[i + 1]) of one row space (its
     * rows rounded up to 16); threads claim ranges of it from cursor */
    int64_t first[MM_MAX_W + 1];
    _Atomic int64_t cursor;
} mm_ctx;

static void mm_rows(const mm_ctx *c, int i, int64_t r0, int64_t r1, int64_t slot) {
    const osp_weight *w = c->w[i];
    float *y = c->y[i];
    if (c->q4t && osp_q4t_fits(w)) { /* 4-bit weights in prefill chunks on AMX (bf16t.h) */
        osp_q4t_mm(c->btk, w, c->bt, c->n, y + r0, w->rows, r0, r1, c->dq + slot * c->dq_elems);
        return;
    }
    if (c->acts && w->packed) { /* every token at once, each bitwise as if alone */
        c->q8(w, c->acts, c->n, y + r0, w->rows, r0, r1);
        return;
    }
    if (c->bt && osp_bf16t_fits(w)) { /* the same on the bf16 engine */
        osp_bf16t_mm(c->btk, w, c->bt, c->n, y + r0, w->rows, r0, r1);
        return;
    }
    if (c->bt && c->dq && osp_q8t_fits(w)) {
        osp_q8t_mm(c->btk, w, c->bt, c->n, y + r0, w->rows, r0, r1, c->dq + slot * c->dq_elems);
        return;
    }
    if (c->per_token && c->ops->matmul_each && c->ops->matmul_each(w, c->x, c->n, y + r0, w->rows, r0, r1))
        return; /* every token as alone, the weight read once */
    if (c->per_token) { /* blocks of rows small enough to stay in cache while every token reads them: the
                         * weights stream from memory once for all tokens (a row's numbers do not depend on
                         * the range it is computed in) */
        int64_t blk = (32 << 10) / (osp_weight_row_bytes(w) > 0 ? osp_weight_row_bytes(w) : 1);
        blk = blk < 8 ? 8 : blk & ~(int64_t)7; /* whole groups of the one-token kernel's rows */
        for (int64_t b0 = r0; b0 < r1; b0 += blk) {
            int64_t b1 = b0 + blk < r1 ? b0 + blk : r1;
            for (int64_t k = 0; k < c->n; k++)
                c->ops->matmul(w, c->x + k * w->cols, 1, y + k * w->rows + b0, w->rows, b0, b1);
        }
        return;
    }
    c->ops->matmul(w, c->x, c->n, y + r0, w->rows, r0, r1);
}

/* Guided self-scheduling: each claim takes 1/(2 threads) of what is left
 * (16-row aligned, at least MM_MIN_TAKE rows, never past its weight), so the
 * streams start long and the last claims are short: the threads finish
 * within a short range of each other. A row's numbers do not depend on
 * the range it is computed in, so the split changes nothing but time. */
static void mm_task(void *p, int64_t t) {
    (void)t;
    mm_ctx *c = p;
    const int64_t total = c->first[c->nw];
    for (;;) {
        int64_t cur = atomic_load(&c->cursor), take;
        int i;
        do {
            if (cur >= total) return;
            i = 0;
            while (cur >= c->first[i + 1]) i++;
            take = (total - cur) / (2 * c->nt);
            take = (take + 15) & ~(int64_t)15;
            if (take < MM_MIN_TAKE) take = MM_MIN_TAKE;
            if (take > c->first[i + 1] - cur) take = c->first[i + 1] - cur;
        } while (!atomic_compare_exchange_weak(&c->cursor, &cur, cur + take));
        int64_t r0 = cur - c->first[i], r1 = r0 + take;
        mm_rows(c, i, r0, r1 < c->w[i]->rows ? r1 : c->w[i]->rows, t);
    }
}

typedef struct pack_ctx {
    osp_bf16t_kind k;
    const float *x;
    int64_t n, cols, nch, parts;
    uint16_t *xp;
} pack_ctx;

static void pack_task(void *p, int64_t t) {
    const pack_ctx *c = p;
    osp_bf16t_pack_fast(c->k, c->x, c->n, c->cols, c->xp, t * c->nch / c->parts, (t + 1) * c->nch / c->parts);
}

typedef struct prep_ctx {
    osp_be_session *sc;
    const float *x;
    int64_t n, cols, ng; /* tokens, columns, groups */
    int64_t parts;       /* group ranges per panel */
} prep_ctx;

/* One group range of every token of one panel: a task writes its own part
 * of the panel (by token, two threads would share its cache lines). */
static void prep_task(void *p, int64_t t) {
    const prep_ctx *c = p;
    const int64_t panel = t / c->parts, k = t % c->parts, g0 = k * c->ng / c->parts, g1 = (k + 1) * c->ng / c->parts;
    for (int64_t tok = panel * OSP_Q8ACT_SLOTS; tok < c->n && tok < (panel + 1) * OSP_Q8ACT_SLOTS; tok++)
        osp_q8act_prepare_groups(&c->sc->q8acts[panel], (int)(tok % OSP_Q8ACT_SLOTS), c->x + tok * c->cols, g0, g1);
}

void osp_cpu_matmul(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *xb, int64_t n,
                    osp_dbuf *const *ysb) {
    const float *x = (const float *)xb;
    float *const *ys = (float *const *)ysb;
    /* bf16 weights in production precision on the bf16 engine (AMX tiles or AVX512-BF16): the activations
     * rounded to bf16 and packed once for every weight of the call; a token's numbers do not depend on n (so
     * no per-token mode is needed). 8-bit weights join them in prefill chunks (16 tokens or more: the
     * dequantization is paid once for all; decode steps keep the f32 kernels), and so do 4-bit ones on AMX
     * (decode steps keep the int8 path). (The weights of a call share its input: one width; fitting implies
     * whole 32-column tiles.) */
    const int per_token = s->per_token && n > 1;
    const int64_t cols = ws[0]->cols;
    const int bt_call = s->fast && s->bt && n <= s->q8cap && cols <= s->bt_cols;
    const int q8t = bt_call && s->dq && !per_token && n >= 16 && osp_threads_count() <= s->dq_slots;
    const int q4t = q8t && s->btk == OSP_BF16T_AMX && !s->chunk_exact;
    /* The int8 path needs one activation layout for all: the same group. */
    const osp_weight *pk = NULL;
    int fast = s->fast && s->q8mem && n <= s->q8cap && osp_q8act_matmul_fast();
    for (int i = 0; i < nw && fast; i++) {
        if (!ws[i]->packed || (q4t && osp_q4t_fits(ws[i]))) continue;
        if (pk && pk->group != ws[i]->group) {
            for (int j = 0; j < nw; j++) osp_cpu_matmul(s, &ws[j], 1, xb, n, &ysb[j]);
            return;
        }
        pk = ws[i];
    }
    mm_ctx c = {.ops = s->ops, .x = x, .n = n, .nw = nw};
    if (pk) {
        for (int64_t p = 0; p * OSP_Q8ACT_SLOTS < n; p++) {
            int64_t width = n - p * OSP_Q8ACT_SLOTS < OSP_Q8ACT_SLOTS ? n - p * OSP_Q8ACT_SLOTS : OSP_Q8ACT_SLOTS;
            osp_q8act_init(&s->q8acts[p], pk->cols, pk->group, (int)width, (char *)s->q8mem + p * s->q8stride);
        }
        /* 16k values or more are split over the threads: by panel, and by
         * group ranges when there are fewer than two panels a thread.
         * Against the earlier split (one thread below 16 tokens, else a task
         * per token, whose threads shared the panels' cache lines): batched
         * decode +1-2% at 8 rows, +20% at 16; pp512 +3-20%. */
        const int64_t panels = (n + OSP_Q8ACT_SLOTS - 1) / OSP_Q8ACT_SLOTS, ng = pk->cols / pk->group;
        const int nt = osp_threads_count(), split = n * pk->cols >= 16384;
        prep_ctx pc = {s, x, n, pk->cols, ng, 1};
        if (split && panels < 2 * nt) {
            const int64_t want = (2 * nt + panels - 1) / panels;
            pc.parts = want < ng ? want : ng;
        }
        if (split && panels * pc.parts > 1) osp_parallel_for(panels * pc.parts, prep_task, &pc);
        else
            for (int64_t t = 0; t < panels * pc.parts; t++) prep_task(&pc, t);
        c.acts = s->q8acts;
        c.q8 = osp_q8act_matmul_fast();
    }
    /* A batched decode step runs every other activation through exactly the
     * kernel a lone one would get, so a row's numbers do not depend on the
     * rest of the batch. (8-bit weights stay on the f32 path: int8
     * activations cost them more accuracy, and their matvec is memory-bound
     * there already.) */
    c.per_token = per_token;
    if (bt_call) {
        int any = 0;
        for (int i = 0; i < nw; i++)
            any |= osp_bf16t_fits(ws[i]) || (q8t && osp_q8t_fits(ws[i])) || (q4t && osp_q4t_fits(ws[i]));
        if (any) {
            pack_ctx pc = {s->btk, x, n, cols, cols / OSP_BF16T_COLS, 1, s->bt};
            const int nt = osp_threads_count();
            if (n * cols >= (1 << 16) && nt > 1) pc.parts = pc.nch < 4 * nt ? pc.nch : 4 * nt;
            if (pc.parts > 1) osp_parallel_for(pc.parts, pack_task, &pc);
            else pack_task(&pc, 0);
            c.bt = s->bt, c.btk = s->btk;
            if (q8t) c.dq = s->dq, c.dq_elems = osp_bf16t_dq_elems(s->bt_cols), c.q4t = q4t;
        }
    }
    int nt = osp_threads_count();
    int64_t work = 0;
    c.nt = nt;
    for (int i = 0; i < nw; i++) {
        const osp_weight *w = ws[i];
        c.w[i] = w;
        c.y[i] = ys[i];
        c.first[i + 1] = c.first[i] + ((w->rows + 15) & ~(int64_t)15);
        work += w->rows * osp_weight_row_bytes(w) * n;
    }
    atomic_init(&c.cursor, 0);
    /* Small matmuls (tiny models, the per-layer-input projections) cost less
     * than waking the pool: run them on this thread. */
    if (work < (256 << 10)) {
        for (int i = 0; i < nw; i++) mm_rows(&c, i, 0, ws[i]->rows, 0);
        return;
    }
    osp_parallel_for(nt, mm_task, &c);
}

