/* backend/cuda: what cuda.c (the backend and its operations) and step.c
 * (how a chunk's operations reach the GPU) share. */
#ifndef OSP_CUDA_INTERNAL_H
#define OSP_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "backend/cuda/kernels.h"

enum { STEP_EAGER, STEP_CAPTURE, STEP_REPLAY };

#define MAX_GRAPHS 64
#define MAX_GRAPH_ROWS 256
#define MAX_GRAPH_T 16    /* chunks of up to this many tokens a row can be graphs (exact or GEMM-free ones) */
#define GRAPH_KEYS ((MAX_GRAPH_ROWS + 1) * MAX_GRAPH_T)
#define OP_ARGS 192 /* bytes of one operation's arguments */
#define OSP_CU_MOE_TABS 256 /* layers of routed experts a session keeps device tables for */

/* An operation: a function launching kernels, and its arguments (a plain
 * struct, zero-padded: its bytes are the operation's fingerprint). */
typedef void (*osp_cu_exec)(osp_be_session *s, const void *args);

typedef struct cu_op {
    osp_cu_exec fn;
    unsigned char args[OP_ARGS];
} cu_op;

typedef struct graph_slot {
    int32_t key;             /* the chunk's shape: B + (T - 1) * (MAX_GRAPH_ROWS + 1) */
    cudaGraphExec_t exec;
    int n_ops;
    size_t staged;
    uint64_t fp;
    uint64_t used;           /* the step it last ran (the least recent is replaced when all are taken) */
} graph_slot;

struct osp_be_session {
    cudaStream_t st;
    int fast;
    int exact;               /* exact tokens (speculative verification): no GEMM, chunks as decode steps */
    int err;                 /* the first CUDA error, until status() reports it */
    char err_where[96];
    int32_t B, T;            /* the chunk in progress */
    /* staging: pinned host and device areas of the same size */
    unsigned char *stage_h, *stage_d;
    size_t stage_cap, stage_off;
    int pending;             /* work enqueued since the last synchronization */
    /* the step's operations (kept while capturing or replaying) */
    int mode, use_graphs;
    int n_ops;
    uint64_t fp;
    cu_op *log;
    int log_cap;
    int cap_err;             /* a failure while capturing: the step falls back to eager */
    int32_t key;             /* the chunk in progress's shape (graph_slot.key), -1: never a graph */
    size_t seen_staged[GRAPH_KEYS]; /* staging of the eager chunks of a shape (0: none ran yet) */
    unsigned char want[GRAPH_KEYS];  /* a chunk of that shape matched no graph: capture the next */
    graph_slot graphs[MAX_GRAPHS];
    int n_graphs;
    uint64_t steps;
    int att_kernel;          /* an f32 cache's attention kernel: 0 the compact one in few-token steps, the split
                                one in others; 1 the split one, 2 the compact one in every step (options.h's
                                cuda_attention, a test hook) */
    int fuse;                /* the fused entries (add_rmsnorm, rope_qk: head norms with the RoPE; gate_up_act)
                                take their fused launches, in few-token steps the FUSE_FEW parts too
                                (OSP_CUDA_FUSE=0: none, every fused entry as its plain operations) */
    /* device scratch */
    float *logits;           /* the head's output */
    size_t logits_cap;       /* floats */
    int32_t *ids_d, *ids_h;  /* the head's greedy tokens: device, and their pinned host copies (two slots of
                                ids_cap: a deferred head's and the one after it) */
    size_t ids_cap;          /* ids (device; each host slot) */
    /* deferred heads (osp_head_args.defer_ids) whose ids are not waited for yet, oldest first: the slot of ids_h
     * their copy lands in (completing dfr_ev[slot]), and where ids_wait writes them */
    struct osp_cu_dfr {
        int slot;
        int32_t nb;
        int32_t *dst;
    } dfr[2];
    int n_dfr;
    cudaEvent_t dfr_ev[2];
    cudaEvent_t ev_staged;   /* recorded once the last deferred step's staging is copied up (its area may be
                                rewritten then, while the step runs) */
    int defer;               /* the step in progress ends in a deferred head: osp_cu_step_end records ev_staged */
    int staged_marked;       /* ev_staged was recorded after the last chunk's staging copies (a deferred head) */
    float *part;             /* attention's split partials */
    size_t part_cap;         /* floats */
    uint64_t n_exec;         /* operations run (step.c counts them) */
    void *blas;              /* cuBLAS handle, or NULL */
    int blas_tried;
    uint16_t *xb, *wb;       /* bf16 activations and weights of a GEMM */
    osp_cu_tc_ws tcws;       /* the tensor-core matmul's split-K workspace */
    size_t xb_cap, wb_cap;   /* elements */
    /* routed experts on the device (cuda.c's moe_device) */
    int32_t *moe_i;          /* routing and grouping */
    float *moe_f;            /* routing weights, the experts' gate and up rows */
    size_t moe_i_cap, moe_f_cap;
    struct osp_cu_moe_tab {
        const void *key, *first, *last; /* a layer's experts (host), and the placements they had */
        osp_cu_weight *dev;             /* [3][E]: gate, up, down */
    } moe_tab[OSP_CU_MOE_TABS];
    int n_moe_tab;
};

/* The fused parts a few-token step takes (cuda.c's fz): the KV store in k's RoPE launch; a one-token step's RoPE
 * and store (no q/k norms) in attention; gate and up in one launch with their activation */
enum { FUSE_KV = 4, FUSE_ROPE_ATT = 16, FUSE_PAIR = 64, FUSE_FEW = FUSE_KV | FUSE_ROPE_ATT | FUSE_PAIR };

/* The sessions' streams are blocking streams, ordered with the legacy stream both ways, so legacy-stream work
 * (a synchronous copy, a KV block's copy or zeroing) or a free from one thread while another session captures a
 * graph would make the legacy stream depend on the capturing stream: an error for both. Such work and every
 * capture (osp_cu_step_begin to its end) take this lock, process-wide and recursive. */
void osp_cu_legacy_lock(void);
void osp_cu_legacy_unlock(void);
/* every legacy-stream operation and free under osp_cu_legacy_lock (no other session is capturing) */
#define LEGACY(stmt) (osp_cu_legacy_lock(), (stmt), osp_cu_legacy_unlock())

/* Record the first failure (a cudaError_t) of the step. */
void osp_cu_note(osp_be_session *s, int e, const char *where);
/* Grow a device buffer to n elements of elem bytes (contents not kept);
 * graphs that captured the old one are dropped. 0 on failure (and never
 * while capturing or replaying). */
int osp_cu_grow(osp_be_session *s, void **p, size_t *cap, size_t n, size_t elem);

/* The encoder-decoder operations (encdec.c) into the table. */
void osp_cu_encdec_fill(osp_backend *b);
/* The table's other parts: memory, placement and the bandwidth trial (memory.c), sessions (step.c), the head,
 * its logits and ids, and the previous ids' embedding (head.c); cuda.c holds the operations. */
void osp_cu_memory_fill(osp_backend *b);
void osp_cu_session_fill(osp_backend *b);
void osp_cu_head_fill(osp_backend *b);
/* cuda.c's norm (t: x += t first, in the norm's launch; or NULL), add and matmul, for head.c */
void osp_cu_op_norm(osp_be_session *s, float *y, const float *x, const float *t, const float *w, int64_t n, int64_t d,
                    float eps, int add_one);
void osp_cu_op_add(osp_be_session *s, float *y, const float *x, int64_t n);
void osp_cu_op_mm(osp_be_session *s, const osp_cu_weight *d, const float *x, int64_t n, float *y, int64_t ldy);

/* ---- step.c ---- */
osp_status osp_cu_step_init(osp_be_session *s, size_t stage_bytes);
void osp_cu_step_free(osp_be_session *s);
void osp_cu_step_begin(osp_be_session *s, int32_t B, int32_t T);
/* n bytes of this step's staging: fill *host now; the device address is
 * what the step's kernels read once osp_cu_stage_put has been submitted. */
void *osp_cu_stage_alloc(osp_be_session *s, size_t n, void **host);
void osp_cu_stage_put(osp_be_session *s, void *dev, size_t n);
void *osp_cu_stage(osp_be_session *s, const void *src, size_t n);
/* Run (or, in a replayed step, record) an operation. */
void osp_cu_submit(osp_be_session *s, osp_cu_exec fn, const void *args, size_t n);
/* Leave graph mode for the rest of the step (an operation that needs the
 * host mid-step): what was recorded runs now. */
void osp_cu_step_eager(osp_be_session *s);
/* The step's last operation was submitted: launch its graph, or run what
 * is left. */
void osp_cu_step_end(osp_be_session *s);
/* After a chunk: its status (a step cut short runs what it recorded first). */
osp_status osp_cu_step_status(osp_be_session *s);

#endif
