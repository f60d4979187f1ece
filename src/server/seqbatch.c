/* server/seqbatch: batching across requests (seqbatch.h). */
#include "seqbatch.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct srv_seq_job {
    const int32_t *const *ids;
    const int32_t *len;
    int32_t n;
    float *out;
    osp_status st;
    char err[512];
    int done;
    struct srv_seq_job *next;
} srv_seq_job;

void srv_seqbatch_init(srv_seqbatch *b, srv_seq_fn fn, void *ctx, int64_t width) {
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->fn = fn, b->ctx = ctx, b->width = width;
}

void srv_seqbatch_destroy(srv_seqbatch *b) {
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

/* the jobs of list as one call (the caller is the leader, the lock not held) */
static void run_call(srv_seqbatch *b, srv_seq_job *list) {
    int64_t n = 0;
    for (srv_seq_job *j = list; j; j = j->next) n += j->n;
    const int32_t **ids = malloc(sizeof *ids * (size_t)n);
    int32_t *len = malloc(sizeof *len * (size_t)n);
    float *out = list->next ? malloc(sizeof(float) * (size_t)n * (size_t)b->width) : list->out; /* one job: its own */
    osp_status st = ids && len && out ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
    int64_t k = 0;
    for (srv_seq_job *j = list; st == OSP_OK && j; j = j->next)
        for (int32_t i = 0; i < j->n; i++, k++) ids[k] = j->ids[i], len[k] = j->len[i];
    if (st == OSP_OK) st = b->fn(b->ctx, ids, len, (int32_t)n, out);
    const char *msg = st == OSP_OK ? "" : osp_last_error();
    k = 0;
    for (srv_seq_job *j = list; j; k += j->n, j = j->next) {
        j->st = st;
        snprintf(j->err, sizeof j->err, "%s", msg);
        if (st == OSP_OK && out != j->out)
            memcpy(j->out, out + k * b->width, sizeof(float) * (size_t)j->n * (size_t)b->width);
    }
    if (out != list->out) free(out);
    free(ids), free(len);
}

osp_status srv_seqbatch_run(srv_seqbatch *b, const int32_t *const *ids, const int32_t *len, int32_t n, float *out) {
    srv_seq_job job = {.ids = ids, .len = len, .n = n, .out = out};
    pthread_mutex_lock(&b->mu);
    if (b->tail) b->tail->next = &job;
    else b->head = &job;
    b->tail = &job;
    while (!job.done) {
        if (b->busy) {
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        srv_seq_job *list = b->head; /* (holds this job: it is queued until taken) */
        b->head = b->tail = NULL;
        b->busy = 1;
        pthread_mutex_unlock(&b->mu);
        run_call(b, list);
        pthread_mutex_lock(&b->mu);
        b->calls++;
        for (srv_seq_job *j = list, *next; j; j = next) {
            next = j->next; /* (a job's memory is its waiter's: read next before done lets it go) */
            b->jobs++;
            j->done = 1;
        }
        b->busy = 0;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    return job.st == OSP_OK ? OSP_OK : osp_err(job.st, "%s", job.err);
}
