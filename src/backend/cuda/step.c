/* backend/cuda/step: sessions, and how a chunk's operations reach the GPU.
 *
 * Host data a step needs (embedding rows, positions, per-row KV
 * descriptors) is written into a pinned staging area at offsets that
 * follow the order of the operations, and copied up ahead of the kernels
 * that read it.
 *
 * A decode step (one token per row) issues the same operations with the
 * same arguments every time for a given number of rows and head mode, so
 * it can run as a CUDA graph: the first decode step of B rows runs eagerly
 * (and measures its staging), the next one of B rows is captured, and
 * later ones only stage their data, record their operations and, at the
 * head, copy their staging up in one copy and replay the graph whose
 * fingerprint (every operation's function and argument bytes) matches.
 * The same holds for short chunks of B rows of T tokens that
 * never use cuBLAS (graph_key): a speculative verification chunk in exact
 * mode, a draft's catch-up of a token or two; their graphs are kept per
 * (B, T). When none matches, or the step needs the host mid-way (MoE
 * routing in reference precision), or a capture fails, the recorded operations run eagerly: a
 * graph never runs a different computation, and no step is lost.
 *
 * A step whose head defers its ids (osp_head_args.defer_ids) is not waited
 * for: the next step may be staged while it runs, once its staging has been
 * copied up (ev_staged, recorded after that copy). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_profiler_api.h>
#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_internal.h"
#include "core/options.h"

/* One lock for every session's capture and every thread's legacy-stream work and frees (osp_cu_legacy_lock):
 * recursive, so that a capturing thread may call what takes it. */
static pthread_mutex_t legacy_mu;
static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;
static void legacy_init(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&legacy_mu, &a);
    pthread_mutexattr_destroy(&a);
}
void osp_cu_legacy_lock(void) {
    pthread_once(&legacy_once, legacy_init);
    pthread_mutex_lock(&legacy_mu);
}
void osp_cu_legacy_unlock(void) { pthread_mutex_unlock(&legacy_mu); }

int osp_cu_pdl_on(void) { return osp_options_get()->cuda_pdl; }

/* OSP_CUDA_PROFILE_ROWS=N: a profiler's window (ncu --profile-from-start off)
 * around the third decode step (one token a row) of N rows or more, so that
 * one step can be profiled without the prefills before it. */
static void profile_window(int32_t B, int32_t T) {
    static int seen = 0;
    const int rows = osp_options_get()->cuda_profile_rows;
    if (rows <= 0 || B < rows || T != 1) return;
    if (seen == 2) cudaProfilerStart();
    if (seen == 3) cudaProfilerStop();
    seen++;
}

/* a capture in progress ends, its graph dropped (and the capture lock let go) */
static void drop_capture(osp_be_session *s) {
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(s->st, &g);
    osp_cu_legacy_unlock();
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    s->cap_err = 0;
}

static void drop_graphs(osp_be_session *s) {
    for (int i = 0; i < s->n_graphs; i++) cudaGraphExecDestroy(s->graphs[i].exec);
    s->n_graphs = 0;
    memset(s->seen_staged, 0, sizeof s->seen_staged);
    memset(s->want, 0, sizeof s->want);
}

void osp_cu_note(osp_be_session *s, int e, const char *where) {
    if (!e) return;
    if (s->mode == STEP_CAPTURE) { /* the step falls back to running eagerly */
        if (!s->cap_err) s->cap_err = e;
        return;
    }
    if (!s->err) {
        s->err = e;
        snprintf(s->err_where, sizeof s->err_where, "%s", where);
    }
}

int osp_cu_grow(osp_be_session *s, void **p, size_t *cap, size_t n, size_t elem) {
    if (n <= *cap) return 1;
    if (s->mode != STEP_EAGER) return 0;
    cudaStreamSynchronize(s->st);
    drop_graphs(s);
    osp_cu_legacy_lock();
    cudaFree(*p);
    osp_cu_legacy_unlock();
    *p = NULL;
    *cap = 0;
    if (cudaMalloc(p, n * elem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    *cap = n;
    return 1;
}

osp_status osp_cu_step_init(osp_be_session *s, size_t stage_bytes) {
    s->use_graphs = osp_options_get()->cuda_graphs;
    osp_cu_legacy_lock();
    int ok = cudaMallocHost((void **)&s->stage_h, stage_bytes) == cudaSuccess &&
             cudaMalloc((void **)&s->stage_d, stage_bytes) == cudaSuccess &&
             cudaEventCreateWithFlags(&s->ev_staged, cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&s->dfr_ev[0], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&s->dfr_ev[1], cudaEventDisableTiming) == cudaSuccess;
    osp_cu_legacy_unlock();
    if (!ok) {
        cudaGetLastError();
        return osp_err(OSP_ERR_NOMEM, "out of GPU or pinned host memory for a session's staging area");
    }
    s->stage_cap = stage_bytes;
    return OSP_OK;
}

void osp_cu_step_free(osp_be_session *s) {
    if (s->mode == STEP_CAPTURE) { /* a capture left open ends (and its lock goes), its step not run */
        drop_capture(s);
        s->mode = STEP_EAGER;
    }
    drop_graphs(s);
    osp_cu_legacy_lock();
    cudaFreeHost(s->stage_h);
    cudaFree(s->stage_d);
    if (s->ev_staged) cudaEventDestroy(s->ev_staged);
    for (int i = 0; i < 2; i++)
        if (s->dfr_ev[i]) cudaEventDestroy(s->dfr_ev[i]);
    osp_cu_legacy_unlock();
    free(s->log);
}

static graph_slot *match(osp_be_session *s) {
    for (int i = 0; i < s->n_graphs; i++) {
        graph_slot *g = &s->graphs[i];
        if (g->key == s->key && g->n_ops == s->n_ops && g->staged == s->stage_off && g->fp == s->fp) return g;
    }
    return NULL;
}

static int has_graph(osp_be_session *s, int32_t key) {
    for (int i = 0; i < s->n_graphs; i++)
        if (s->graphs[i].key == key) return 1;
    return 0;
}

/* The graph key of a chunk of B rows of T tokens, or -1 when such chunks
 * are not graphs: a chunk can be one when it issues the same operations
 * every time for its shape, which rules out the production GEMM (a prefill
 * chunk of one row, cuda.c's use_gemm, which never runs in a graph) and
 * long chunks (prefills: positions move their attention's arguments). */
static int32_t graph_key(const osp_be_session *s, int32_t B, int32_t T) {
    if (B < 1 || B > MAX_GRAPH_ROWS || T < 1 || T > MAX_GRAPH_T) return -1;
    if (T > 1 && !s->exact && s->fast && B == 1 && T >= 16) return -1; /* cuBLAS's chunk */
    return B + (T - 1) * (MAX_GRAPH_ROWS + 1);
}

void osp_cu_step_begin(osp_be_session *s, int32_t B, int32_t T) {
    if (s->mode == STEP_CAPTURE) osp_cu_step_eager(s); /* (a chunk without a head or status: its capture ends) */
    if (s->pending) { /* the staging area is rewritten: the last chunk's copies must have run */
        if (s->staged_marked) /* a deferred step runs: its staging copy is enough */
            osp_cu_note(s, cudaEventSynchronize(s->ev_staged), "a previous step's staging");
        else
            osp_cu_note(s, cudaStreamSynchronize(s->st), "a previous chunk");
        s->pending = 0;
    }
    s->staged_marked = 0;
    profile_window(B, T);
    s->B = B, s->T = T;
    s->stage_off = 0;
    s->n_ops = 0;
    s->fp = 0xcbf29ce484222325ULL;
    s->mode = STEP_EAGER;
    s->cap_err = 0;
    s->key = graph_key(s, B, T);
    if (!s->use_graphs || s->key < 0 || s->err) return;
    int32_t k = s->key;
    s->steps++;
    int capture = s->seen_staged[k] && (s->want[k] || !has_graph(s, k));
    if (!capture) {
        if (has_graph(s, k)) s->mode = STEP_REPLAY;
        return;
    }
    osp_cu_legacy_lock(); /* held until the capture ends (osp_cu_step_eager, osp_cu_step_end) */
    if (cudaStreamBeginCapture(s->st, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        osp_cu_legacy_unlock();
        cudaGetLastError();
        s->use_graphs = 0;
        return;
    }
    s->mode = STEP_CAPTURE; /* (the staging is copied up before each launch of the graph: launch) */
}

/* Run what the step recorded, eagerly, from its first operation. */
static void run_log(osp_be_session *s) {
    int n = s->n_ops;
    s->mode = STEP_EAGER;
    for (int i = 0; i < n && !s->err; i++) s->n_exec++, s->log[i].fn(s, s->log[i].args);
}

void osp_cu_step_eager(osp_be_session *s) {
    if (s->mode == STEP_CAPTURE) drop_capture(s);
    if (s->mode != STEP_EAGER) run_log(s);
}

void osp_cu_submit(osp_be_session *s, osp_cu_exec fn, const void *args, size_t n) {
    uint64_t a[OP_ARGS / 8] = {0};
    if (n > OP_ARGS) n = OP_ARGS; /* (every operation's arguments fit: see cuda.c) */
    memcpy(a, args, n);
    /* the fingerprint: the function and the argument words, multiplied in */
    uint64_t h = s->fp ^ (uint64_t)(uintptr_t)fn;
    h *= 0x9e3779b97f4a7c15ULL;
    for (size_t i = 0; i < (n + 7) / 8; i++) {
        h = (h ^ a[i]) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    s->fp = h;
    if (s->mode != STEP_EAGER) {
        if (s->n_ops >= s->log_cap) {
            int cap = s->log_cap ? 2 * s->log_cap : 1024;
            cu_op *l = realloc(s->log, sizeof *l * (size_t)cap);
            if (!l) { /* no room to record: run eagerly from here */
                osp_cu_step_eager(s);
                s->n_ops++;
                s->n_exec++;
                fn(s, a);
                return;
            }
            s->log = l, s->log_cap = cap;
        }
        s->log[s->n_ops].fn = fn;
        memcpy(s->log[s->n_ops].args, a, OP_ARGS);
    }
    s->n_ops++;
    if (s->mode != STEP_REPLAY && !s->err) s->n_exec++, fn(s, a);
}

void *osp_cu_stage_alloc(osp_be_session *s, size_t n, void **host) {
    size_t off = (s->stage_off + 255) & ~(size_t)255;
    if (off + n > s->stage_cap) {
        osp_cu_step_eager(s); /* a captured or replayed step is never moved */
        size_t cap = 2 * (off + n);
        cudaStreamSynchronize(s->st); /* earlier copies have read the old area */
        drop_graphs(s);
        unsigned char *h = NULL, *d = NULL;
        osp_cu_legacy_lock();
        if (cudaMallocHost((void **)&h, cap) != cudaSuccess || cudaMalloc((void **)&d, cap) != cudaSuccess) {
            cudaFreeHost(h);
            osp_cu_legacy_unlock();
            cudaGetLastError();
            osp_cu_note(s, cudaErrorMemoryAllocation, "staging");
            return NULL;
        }
        cudaFreeHost(s->stage_h);
        cudaFree(s->stage_d);
        osp_cu_legacy_unlock();
        s->stage_h = h, s->stage_d = d, s->stage_cap = cap;
    }
    s->stage_off = off + n;
    *host = s->stage_h + off;
    return s->stage_d + off;
}

typedef struct put_args {
    unsigned char *dev;
    size_t off, n;
} put_args;

static void put_exec(osp_be_session *s, const void *p) {
    const put_args *a = p;
    if (s->mode == STEP_CAPTURE) return; /* the graph's first node copies the whole staging */
    osp_cu_note(s, cudaMemcpyAsync(a->dev, s->stage_h + a->off, a->n, cudaMemcpyHostToDevice, s->st), "staging copy");
    s->pending = 1;
}

void osp_cu_stage_put(osp_be_session *s, void *dev, size_t n) {
    if (!dev) return;
    put_args a;
    memset(&a, 0, sizeof a);
    a.dev = dev, a.off = (size_t)((unsigned char *)dev - s->stage_d), a.n = n;
    osp_cu_submit(s, put_exec, &a, sizeof a);
}

void *osp_cu_stage(osp_be_session *s, const void *src, size_t n) {
    void *h, *d = osp_cu_stage_alloc(s, n, &h);
    if (!d) return NULL;
    memcpy(h, src, n);
    osp_cu_stage_put(s, d, n);
    return d;
}

/* A graph's launch: the step's staging copied up first (and, before a deferred head, ev_staged recorded). */
static void launch(osp_be_session *s, cudaGraphExec_t ex) {
    if (s->stage_off)
        osp_cu_note(s, cudaMemcpyAsync(s->stage_d, s->stage_h, s->stage_off, cudaMemcpyHostToDevice, s->st), "staging");
    if (s->defer) {
        osp_cu_note(s, cudaEventRecord(s->ev_staged, s->st), "staging");
        s->staged_marked = 1;
    }
    osp_cu_note(s, cudaGraphLaunch(ex, s->st), "launching a decode step's graph");
    s->pending = 1;
}

void osp_cu_step_end(osp_be_session *s) {
    int32_t k = s->key; /* the chunk's shape */
    if (s->mode == STEP_CAPTURE) {
        cudaGraph_t g = NULL;
        cudaGraphExec_t ex = NULL;
        int e = cudaStreamEndCapture(s->st, &g);
        osp_cu_legacy_unlock();
        int fits = s->stage_off <= s->seen_staged[k];
        if (e == cudaSuccess && !s->cap_err && fits) e = cudaGraphInstantiate(&ex, g, 0);
        if (g) cudaGraphDestroy(g);
        if (e != cudaSuccess || s->cap_err || !fits) {
            cudaGetLastError();
            if (fits) s->use_graphs = 0; /* capturing fails here: this session runs eagerly */
            else s->seen_staged[k] = s->stage_off, s->want[k] = 1;
            s->cap_err = 0;
            run_log(s);
            return;
        }
        int slot = s->n_graphs;
        if (slot == MAX_GRAPHS) { /* all taken: the least recently run one goes */
            slot = 0;
            for (int i = 1; i < MAX_GRAPHS; i++)
                if (s->graphs[i].used < s->graphs[slot].used) slot = i;
            cudaGraphExecDestroy(s->graphs[slot].exec);
        } else {
            s->n_graphs++;
        }
        s->graphs[slot] = (graph_slot){k, ex, s->n_ops, s->stage_off, s->fp, s->steps};
        s->want[k] = 0;
        s->mode = STEP_EAGER;
        launch(s, ex);
        return;
    }
    if (s->mode == STEP_REPLAY) {
        graph_slot *g = match(s);
        if (!g) { /* another variant of a step of B rows: run it, capture it next time */
            s->want[k] = 1;
            if (s->stage_off > s->seen_staged[k]) s->seen_staged[k] = s->stage_off;
            run_log(s);
            return;
        }
        s->mode = STEP_EAGER;
        g->used = s->steps;
        launch(s, g->exec);
        return;
    }
    if (s->use_graphs && k >= 0 && s->stage_off > s->seen_staged[k]) s->seen_staged[k] = s->stage_off;
}

osp_status osp_cu_step_status(osp_be_session *s) {
    osp_cu_step_eager(s); /* a step that ended before its head: what it recorded runs now */
    if (!s->err) osp_cu_note(s, cudaGetLastError(), "a kernel launch");
    if (!s->err) return OSP_OK;
    int e = s->err;
    s->err = 0; /* reported once; the session stays usable */
    cudaGetLastError();
    return osp_err(OSP_ERR_IO, "CUDA: %s (%s)", cudaGetErrorString((cudaError_t)e), s->err_where);
}

/* ---- sessions ---- */

static void session_free(osp_be_session *s) {
    if (!s) return;
    cudaStreamSynchronize(s->st);
    osp_cu_step_free(s);
    osp_cu_legacy_lock(); /* (the frees below) */
    osp_cublas_free(s->blas);
    cudaFree(s->logits);
    cudaFree(s->ids_d);
    cudaFreeHost(s->ids_h);
    cudaFree(s->part);
    cudaFree(s->xb);
    cudaFree(s->wb);
    cudaFree(s->moe_i);
    cudaFree(s->moe_f);
    for (int i = 0; i < s->n_moe_tab; i++) cudaFree(s->moe_tab[i].dev);
    osp_cu_tc_ws_free(&s->tcws);
    cudaStreamDestroy(s->st);
    osp_cu_legacy_unlock();
    free(s);
}

static osp_status session_new(int32_t max_tok, int64_t max_cols, osp_be_session **out) {
    *out = NULL;
    osp_be_session *s = calloc(1, sizeof *s);
    if (!s) return osp_err(OSP_ERR_NOMEM, "out of memory");
    if (cudaStreamCreate(&s->st) != cudaSuccess) {
        cudaGetLastError();
        free(s);
        return osp_err(OSP_ERR_IO, "cannot create a CUDA stream");
    }
    const osp_options *o = osp_options_get();
    s->fuse = o->cuda_fuse;
    s->att_kernel = o->cuda_attention; /* (a test hook: 0, by the step's tokens, unless a test sets it) */
    /* the embedding rows of a full chunk and room for the small arrays */
    size_t cap = (size_t)(max_tok > 0 ? max_tok : 1) * (size_t)(max_cols > 0 ? max_cols : 1) * sizeof(float) +
                 ((size_t)1 << 20);
    osp_status rc = osp_cu_step_init(s, cap);
    if (rc == OSP_OK && osp_cu_tc_ws_init(&s->tcws, (int64_t)(max_tok > 0 ? max_tok : 1) * (max_cols > 0 ? max_cols : 1)))
        rc = osp_err(OSP_ERR_NOMEM, "out of GPU memory for a session's matmul workspace");
    if (rc != OSP_OK) {
        session_free(s);
        return rc;
    }
    *out = s;
    return OSP_OK;
}

static void set_fast(osp_be_session *s, int fast) { s->fast = fast != 0; }

/* Exact tokens: a chunk's tokens go through the decode kernels (which give a
 * row the same numbers among any number of rows), never cuBLAS, and its
 * attention reads earlier positions from the cache (the model stores the
 * chunk first). */
static void set_exact_tokens(osp_be_session *s, int on) { s->exact = on != 0; }
static void begin_chunk(osp_be_session *s, int32_t B, int32_t T) { osp_cu_step_begin(s, B, T); }

static osp_status status(osp_be_session *s) { return osp_cu_step_status(s); }

/* the table's session entries */
void osp_cu_session_fill(osp_backend *b) {
    b->session_new = session_new, b->session_free = session_free, b->set_fast = set_fast;
    b->set_exact_tokens = set_exact_tokens, b->begin_chunk = begin_chunk, b->status = status;
}
