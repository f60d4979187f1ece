/* server/seqbatch: requests' sequences batched across requests, for the
 * models that turn n sequences into n rows of numbers (the embedder, the
 * reranker: server/embed.c, server/rerank.c).
 *
 * Each request queues its job and waits. Whoever finds the model idle runs
 * every job queued by then as one call (rows of the same forward passes, as
 * many at a time as the session has) and hands each job its rows; requests
 * that arrive meanwhile are the next call's. A failure is every job's of
 * that call, with its message. No thread is added: the waiting requests'
 * own threads take turns. */
#ifndef SRV_SEQBATCH_H
#define SRV_SEQBATCH_H

#include <pthread.h>
#include <stdint.h>
#include "core/core.h"

/* n sequences (ids[i] of len[i] tokens) into out [n, width] */
typedef osp_status (*srv_seq_fn)(void *ctx, const int32_t *const *ids, const int32_t *len, int32_t n, float *out);

typedef struct srv_seqbatch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct srv_seq_job *head, *tail; /* queued, not yet taken */
    int busy;                        /* a call is running */
    srv_seq_fn fn;
    void *ctx;
    int64_t width;
    int64_t calls, jobs;             /* for the log: calls run, jobs they carried */
} srv_seqbatch;

void srv_seqbatch_init(srv_seqbatch *b, srv_seq_fn fn, void *ctx, int64_t width);
void srv_seqbatch_destroy(srv_seqbatch *b);
/* Run n >= 1 sequences with whatever other requests' are queued; out [n, width]. OSP_OK, or the call's failure. */
osp_status srv_seqbatch_run(srv_seqbatch *b, const int32_t *const *ids, const int32_t *len, int32_t n, float *out);

#endif
