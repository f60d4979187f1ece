/* backend/cpu: the CPU backend's parts (internal to backend/cpu/). */
#ifndef OSP_BACKEND_CPU_H
#define OSP_BACKEND_CPU_H

#include "backend/backend.h"
#include "backend/ops.h"
#include "backend/q8act.h"
#include "backend/cpu/bf16t.h"

/* A session's state on the CPU: the kernels, the precision mode, and the
 * int8 activation panels of the fast path. */
struct osp_be_session {
    const osp_ops *ops;
    int fast;      /* production precision: int8 activations for 4-bit weights */
    int per_token; /* this chunk is a batched decode step: each token through the one-token kernel */
    int exact_tokens; /* every chunk's tokens through the one-token kernel (speculative verification) */
    int chunk_exact; /* no kernel whose numbers depend on the chunk's size (4-bit prefill stays off the AMX tiles) */
    int serial;    /* the encoder-decoder operations on the calling thread (not the process pool) */
    void *q8mem;   /* int8 activation panels for q8cap tokens */
    size_t q8stride;
    int32_t q8cap;
    osp_q8act *q8acts; /* [q8cap / 8] panels */
    osp_bf16t_kind btk; /* the bf16 weights' production engine (backend/cpu/bf16t.h), or OSP_BF16T_NONE */
    uint16_t *bt;  /* bf16 activations packed for it: q8cap tokens, or NULL */
    int64_t bt_cols;
    uint16_t *dq;  /* 8-bit weights dequantized for it: dq_slots x 32 rows x bt_cols */
    int dq_slots;  /* the threads it was sized for */
    float *att;    /* attention's per-thread scratch (attention.c), grown as chunks need */
    size_t att_floats;
};

void osp_cpu_matmul(osp_be_session *s, const osp_weight *const *ws, int nw, const osp_dbuf *x, int64_t n,
                    osp_dbuf *const *ys);
void osp_cpu_attention(osp_be_session *s, const osp_attn_args *a);
void osp_cpu_bidir_attention(osp_be_session *s, const osp_bidir_attn_args *a); /* cpu/bidir.c */
void osp_cpu_kv_write(osp_be_session *s, struct osp_kv *kv, int32_t layer, const int32_t *rows, int32_t nb,
                      const osp_dbuf *k, const osp_dbuf *v, int32_t T);
/* the encoder-decoder operations (encdec.c) into the table */
void osp_cpu_encdec_fill(osp_backend *b);
osp_status osp_cpu_place(osp_weight *const *ws, int n, const void *const *keep, int n_keep, const osp_region *maps,
                         int n_maps, void **owned);
void osp_cpu_unplace(void *owned);

#endif
