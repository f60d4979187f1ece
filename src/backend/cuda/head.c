/* backend/cuda/head: the model's head (its norm, the logits' matmul, softcap, the greedy argmax on the
 * device), the logits and ids a step gives back (deferred heads' ids, copied while the next step is queued),
 * and the embedding of the previous step's ids (chains): the backend table's head entries
 * (osp_cu_head_fill). */
#include <string.h>
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kernels.h"

#define D(p) ((float *)(p))
#define CD(p) ((const float *)(p))
#define note osp_cu_note
/* submit an operation (cuda.c's SUBMIT) */
#define SUBMIT(s, fn, a) osp_cu_submit((s), (fn), &(a), sizeof(a))
#define ARGS(type, a) type a; memset(&a, 0, sizeof a)

typedef struct softcap_args {
    float *x;
    int64_t n;
    float cap;
} softcap_args;

static void softcap_exec(osp_be_session *s, const void *p) {
    const softcap_args *a = p;
    note(s, osp_cu_softcap(s->st, a->x, a->n, a->cap), "softcap");
}

typedef struct argmax_args {
    const float *x;
    int32_t *ids;
    int64_t rows, n;
} argmax_args;

static void argmax_exec(osp_be_session *s, const void *p) {
    const argmax_args *a = p;
    note(s, osp_cu_argmax(s->st, a->x, a->rows, a->n, a->ids), "argmax");
}

static void dfr_pop(osp_be_session *s);

/* Room for n ids: device (written by the step, so never moved under a graph) and pinned host (two slots). */
static int ids_room(osp_be_session *s, size_t n) {
    if (n <= s->ids_cap) return 1;
    osp_cu_step_eager(s);
    while (s->n_dfr) dfr_pop(s); /* (their ids are in the slots) */
    if (n < MAX_GRAPH_ROWS) n = MAX_GRAPH_ROWS;
    size_t cap = s->ids_cap;
    s->ids_cap = 0;
    if (!osp_cu_grow(s, (void **)&s->ids_d, &cap, n, sizeof(int32_t))) return 0;
    int e;
    osp_cu_legacy_lock();
    cudaFreeHost(s->ids_h);
    s->ids_h = NULL;
    e = cudaMallocHost((void **)&s->ids_h, 2 * n * sizeof(int32_t));
    osp_cu_legacy_unlock();
    if (e != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    s->ids_cap = n;
    return 1;
}

/* The rows of a step's logits that come back: all, or with ids out only the needed ones (runs of adjacent rows in
 * one copy each). */
static void logits_back(osp_be_session *s, const osp_head_args *a, const float *lg) {
    int64_t V = a->vocab;
    if (a->all_logits) {
        for (int32_t b = 0; b < a->B; b++)
            note(s, cudaMemcpyAsync(a->logits + (int64_t)b * a->ld_rows * V, lg + (int64_t)b * a->T * V,
                                    (size_t)(a->T * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
                 "logits");
        return;
    }
    if (!a->ids) {
        note(s, cudaMemcpyAsync(a->logits, lg, (size_t)(a->B * V) * sizeof(float), cudaMemcpyDeviceToHost, s->st),
             "logits");
        return;
    }
    note(s, cudaMemcpyAsync(s->ids_h, s->ids_d, sizeof(int32_t) * (size_t)a->B, cudaMemcpyDeviceToHost, s->st), "ids");
    /* (slot 0: no deferred head is waiting, the stream's synchronization below waits for them all) */
    for (int32_t b = 0; a->need && b < a->B;) {
        if (!a->need[b]) {
            b++;
            continue;
        }
        int32_t e = b + 1;
        while (e < a->B && a->need[e]) e++;
        note(s, cudaMemcpyAsync(a->logits + (int64_t)b * V, lg + (int64_t)b * V, (size_t)((e - b) * V) * sizeof(float),
                                cudaMemcpyDeviceToHost, s->st),
             "logits");
        b = e;
    }
}

static void head(osp_be_session *s, const osp_head_args *a) {
    const osp_cu_weight *w = a->w->packed;
    int64_t N = (int64_t)a->B * a->T, H = a->hidden, V = a->vocab, rows = a->all_logits ? N : a->B;
    int ids = a->ids && !a->all_logits;
    if (rows * V > (int64_t)s->logits_cap) {
        osp_cu_step_eager(s); /* the logits buffer is never moved under a graph */
        if (!osp_cu_grow(s, (void **)&s->logits, &s->logits_cap, (size_t)(rows * V), sizeof(float))) {
            note(s, cudaErrorMemoryAllocation, "logits");
            return;
        }
    }
    if (ids && !ids_room(s, (size_t)a->B)) {
        note(s, cudaErrorMemoryAllocation, "ids");
        return;
    }
    int defer = ids && a->defer_ids && !a->need;
    /* two deferred heads at most (the caller waits for one before the next); a head that is not deferred
     * takes slot 0 */
    while (s->n_dfr == 2 || (!defer && s->n_dfr)) dfr_pop(s);
    if (!w) {
        note(s, cudaErrorInvalidValue, "the head's weight is not on the GPU");
        return;
    }
    float *lg = s->logits;
    /* the residual add (res) in the norm's launch where that norm reads all of x (add_rmsnorm's fusion) */
    const float *res = CD(a->res);
    if (res && (!s->fuse || (!a->all_logits && a->T != 1))) {
        osp_cu_op_add(s, D(a->x), res, N * H);
        res = NULL;
    }
    if (a->all_logits) {
        osp_cu_op_norm(s, D(a->xn), CD(a->x), res, CD(a->norm), N, H, a->eps, a->add_one);
        osp_cu_op_mm(s, w, CD(a->xn), N, lg, V);
    } else {
        if (a->T == 1) /* the rows' last tokens are contiguous */
            osp_cu_op_norm(s, D(a->hlast), CD(a->x), res, CD(a->norm), a->B, H, a->eps, a->add_one);
        else
            for (int32_t b = 0; b < a->B; b++)
                osp_cu_op_norm(s, D(a->hlast) + b * H, CD(a->x) + ((int64_t)b * a->T + a->T - 1) * H, NULL,
                               CD(a->norm), 1, H, a->eps, a->add_one);
        osp_cu_op_mm(s, w, CD(a->hlast), a->B, lg, V);
    }
    if (a->softcap > 0) {
        ARGS(softcap_args, c);
        c.x = lg, c.n = rows * V, c.cap = a->softcap;
        SUBMIT(s, softcap_exec, c);
    }
    if (ids) { /* part of the step (and of its graph): the greedy tokens, on the soft-capped logits */
        ARGS(argmax_args, m);
        m.x = lg, m.ids = s->ids_d, m.rows = a->B, m.n = V;
        SUBMIT(s, argmax_exec, m);
    }
    s->defer = defer, s->staged_marked = 0;
    osp_cu_step_end(s);
    s->defer = 0;
    if (s->err) {
        s->staged_marked = 0;
        return;
    }
    if (!defer) s->staged_marked = 0;
    if (defer) { /* the ids into a free slot, an event after them; the next step may be staged at ev_staged */
        if (!s->staged_marked) note(s, cudaEventRecord(s->ev_staged, s->st), "staging"); /* (an eager step) */
        s->staged_marked = 1;
        int slot = s->n_dfr ? !s->dfr[0].slot : 0;
        note(s, cudaMemcpyAsync(s->ids_h + (size_t)slot * s->ids_cap, s->ids_d, sizeof(int32_t) * (size_t)a->B,
                                cudaMemcpyDeviceToHost, s->st),
             "ids");
        note(s, cudaEventRecord(s->dfr_ev[slot], s->st), "ids");
        if (s->err) return;
        s->dfr[s->n_dfr++] = (struct osp_cu_dfr){slot, a->B, a->ids};
        s->pending = 1;
        return;
    }
    logits_back(s, a, lg); /* after the step's graph, on its stream */
    note(s, cudaStreamSynchronize(s->st), "logits");
    s->pending = 0;
    if (ids && !s->err) memcpy(a->ids, s->ids_h, sizeof(int32_t) * (size_t)a->B);
}

/* the oldest deferred head's ids, once copied, where it said (touches nothing of a step in progress) */
static void dfr_pop(osp_be_session *s) {
    struct osp_cu_dfr d = s->dfr[0];
    s->dfr[0] = s->dfr[1];
    s->n_dfr--;
    note(s, cudaEventSynchronize(s->dfr_ev[d.slot]), "a step's ids");
    if (!s->err) memcpy(d.dst, s->ids_h + (size_t)d.slot * s->ids_cap, sizeof(int32_t) * (size_t)d.nb);
}

static osp_status ids_wait(osp_be_session *s) {
    if (!s->n_dfr) return OSP_OK;
    dfr_pop(s);
    return osp_cu_step_status(s);
}

/* ids on the device: a deferred (or any) head's ids_d, read by the next step's first kernel */
typedef struct embp_args {
    osp_cu_weight w;
    const int32_t *ids;
    int64_t n;
    float scale;
    float *x;
} embp_args;

static void embp_exec(osp_be_session *s, const void *p) {
    const embp_args *a = p;
    note(s, osp_cu_embed_ids(s->st, &a->w, a->ids, a->n, a->scale, a->x), "embedding");
}

static int can_embed_prev(const osp_weight *e) { return e->packed != NULL; }

static void embed_prev(osp_be_session *s, const osp_weight *e, float sc, int64_t n, osp_dbuf *x) {
    if (!e->packed || !s->ids_d || (size_t)n > s->ids_cap) {
        note(s, cudaErrorInvalidValue, "an embedding of the previous step's ids, which are not on the GPU");
        return;
    }
    ARGS(embp_args, a);
    a.w = *(const osp_cu_weight *)e->packed;
    a.ids = s->ids_d, a.n = n, a.scale = sc, a.x = D(x);
    SUBMIT(s, embp_exec, a);
}

/* the table's head entries */
void osp_cu_head_fill(osp_backend *b) {
    b->head = head, b->ids_wait = ids_wait, b->can_embed_prev = can_embed_prev, b->embed_prev = embed_prev;
}
