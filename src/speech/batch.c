/* speech/batch.c: the transcription batch (see batch.h).
 *
 * Jobs: a transcription's thread hands its view's job (an encode, or a
 * decoder step with the row copies queued before it) to `submit`, which
 * queues it and waits. The batch thread takes every queued job once each
 * transcription holding a slot has one queued, or else when the wait is
 * over: gather_ms after the first came, and, while a transcription of the
 * last round has not come back (it is reading its logits, sampling, choosing
 * beams), up to hold_ms after that round ended. A transcription busy on the
 * host for longer (its next window's mel, its words) holds the others no
 * longer than that. Then it runs them: the steps' copies, one
 * decoder step of every step's runs (each job's runs together, as alone),
 * then the encodes, enc_windows windows a call. A step that fails is rerun
 * job by job, so that only the job at fault gets the error. Errors travel
 * back with their message (osp_err is per thread). */
#include "speech/batch.h"
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct pending {
    osp_whisper_job *job;
    osp_status rc;
    int done;
    char msg[512];
} pending;

struct osp_wbatch {
    const osp_whisper *m;
    osp_wbatch_opts o;
    osp_whisper_state *s;
    pthread_t th;
    int started, stop;
    pthread_mutex_t mu;
    pthread_cond_t work, done, slot_free;
    uint8_t *busy;           /* [slots] */
    int32_t active;          /* slots held */
    pending **queue, **take; /* [slots]: a slot has one job at a time */
    int32_t n_queue;
    struct timespec first;   /* when the oldest queued job came */
    struct timespec ended;   /* when the last round's jobs were handed back */
    uint8_t *expect;         /* [slots]: took part in the last round (its next job is expected soon) */
    uint8_t *queued;         /* [slots]: has a job queued */
    osp_wbatch_stats st;
    osp_whisper_run *runs;   /* [slots · rows]: a step's runs */
    const float **mels;      /* [enc_windows] */
    int32_t *enc_slots, *enc_of; /* [enc_windows]: slots, and the taken job of each */
};

typedef struct lease {
    osp_wbatch *b;
    int32_t slot;
} lease;

void osp_wbatch_defaults(osp_wbatch_opts *o) {
    memset(o, 0, sizeof *o);
    o->slots = 8;
    o->rows = 5;
    o->enc_windows = 4;
    o->serial = 1;
    o->gather_ms = 2;
    o->hold_ms = 20;
}

void osp_wbatch_get_stats(osp_wbatch *b, osp_wbatch_stats *out) {
    pthread_mutex_lock(&b->mu);
    *out = b->st;
    pthread_mutex_unlock(&b->mu);
}

static void set_result(pending *p, osp_status rc) {
    p->rc = rc;
    if (rc != OSP_OK) snprintf(p->msg, sizeof p->msg, "%s", osp_last_error());
}

/* the decoder step of the jobs' steps; the number of jobs and tokens it held into *jobs_out, *tokens_out */
static void run_steps(osp_wbatch *b, pending **jobs, int32_t n, int64_t *jobs_out, int64_t *tokens_out) {
    int32_t n_runs = 0, n_steps = 0;
    for (int32_t i = 0; i < n; i++) {
        osp_whisper_job *j = jobs[i]->job;
        if (j->mel) continue;
        osp_status rc = osp_whisper_copy_rows(b->s, j->copies, j->n_copies);
        set_result(jobs[i], rc);
        if (rc != OSP_OK) continue;
        memcpy(b->runs + n_runs, j->runs, sizeof *j->runs * j->n_runs);
        for (int32_t r = 0; r < j->n_runs; r++) *tokens_out += j->runs[r].n;
        n_runs += j->n_runs;
        n_steps++;
    }
    *jobs_out = n_steps;
    if (!n_steps) return;
    if (osp_whisper_step(b->s, b->runs, n_runs) == OSP_OK) return;
    for (int32_t i = 0; i < n; i++) /* alone, each as if it had come by itself */
        if (!jobs[i]->job->mel && jobs[i]->rc == OSP_OK)
            set_result(jobs[i], osp_whisper_step(b->s, jobs[i]->job->runs, jobs[i]->job->n_runs));
}

/* the jobs' encodes, enc_windows windows a call; the calls and windows added to b->st */
static void run_encodes(osp_wbatch *b, pending **jobs, int32_t n, int64_t *calls, int64_t *windows) {
    int32_t k = 0;
    for (int32_t i = 0; i <= n; i++) {
        if (i < n && jobs[i]->job->mel) {
            b->mels[k] = jobs[i]->job->mel;
            b->enc_slots[k] = jobs[i]->job->slot;
            b->enc_of[k++] = i;
        }
        if (k && (k == b->o.enc_windows || i == n)) {
            osp_status rc = osp_whisper_encode_batch(b->s, b->mels, b->enc_slots, k);
            ++*calls, *windows += k;
            for (int32_t e = 0; e < k; e++) set_result(jobs[b->enc_of[e]], rc);
            k = 0;
        }
    }
}

static double since(const struct timespec *t) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->tv_sec) + (double)(now.tv_nsec - t->tv_nsec) * 1e-9;
}

/* a deadline t + ms, as pthread_cond_timedwait takes it */
static struct timespec plus_ms(struct timespec t, double ms) {
    long ns = t.tv_nsec + (long)(ms * 1e6);
    t.tv_sec += ns / 1000000000L;
    t.tv_nsec = ns % 1000000000L;
    return t;
}

static int before(const struct timespec *a, const struct timespec *b) {
    return a->tv_sec != b->tv_sec ? a->tv_sec < b->tv_sec : a->tv_nsec < b->tv_nsec;
}

/* When the batch thread stops waiting for more jobs (b->mu held, a job queued): gather_ms after the first, or,
 * while one of the last round's transcriptions has none queued, hold_ms after that round, if later. */
static struct timespec gather_until(const osp_wbatch *b) {
    struct timespec t = plus_ms(b->first, b->o.gather_ms);
    for (int32_t i = 0; i < b->o.slots; i++)
        if (b->expect[i] && !b->queued[i]) {
            struct timespec h = plus_ms(b->ended, b->o.hold_ms);
            return before(&t, &h) ? h : t;
        }
    return t;
}

static void *batch_thread(void *p) {
    osp_wbatch *b = p;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && !b->n_queue) pthread_cond_wait(&b->work, &b->mu);
        if (!b->n_queue) break;
        /* the other slots' jobs, for a while */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        const struct timespec w0 = now;
        for (;;) {
            if (b->n_queue >= b->active) break;
            struct timespec until = gather_until(b);
            if (!before(&now, &until)) break;
            pthread_cond_timedwait(&b->work, &b->mu, &until);
            clock_gettime(CLOCK_MONOTONIC, &now);
        }
        b->st.gather_s += since(&w0);
        const int32_t n = b->n_queue;
        memcpy(b->take, b->queue, sizeof *b->take * n);
        b->n_queue = 0;
        /* in slot order, whatever order they came in: the same transcriptions give the same step, which a
         * device can then replay (a CUDA graph matches a step's operations and their arguments) */
        for (int32_t i = 1; i < n; i++)
            for (int32_t j = i; j > 0 && b->take[j - 1]->job->slot > b->take[j]->job->slot; j--) {
                pending *t = b->take[j];
                b->take[j] = b->take[j - 1];
                b->take[j - 1] = t;
            }
        memset(b->expect, 0, (size_t)b->o.slots);
        for (int32_t i = 0; i < n; i++) {
            b->queued[b->take[i]->job->slot] = 0;
            b->expect[b->take[i]->job->slot] = 1;
        }
        pthread_mutex_unlock(&b->mu);
        int64_t jobs = 0, tokens = 0, calls = 0, windows = 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        run_steps(b, b->take, n, &jobs, &tokens);
        run_encodes(b, b->take, n, &calls, &windows);
        const double busy = since(&now);
        pthread_mutex_lock(&b->mu);
        b->st.steps += jobs > 0, b->st.step_jobs += jobs, b->st.step_tokens += tokens;
        b->st.encodes += calls, b->st.windows += windows, b->st.compute_s += busy;
        clock_gettime(CLOCK_MONOTONIC, &b->ended);
        for (int32_t i = 0; i < n; i++) b->take[i]->done = 1;
        pthread_cond_broadcast(&b->done);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* osp_whisper_submit_fn: queue the view's job, wait until the batch thread ran it */
static osp_status submit(void *ctx, osp_whisper_job *job) {
    osp_wbatch *b = ((lease *)ctx)->b;
    pending p = {.job = job};
    pthread_mutex_lock(&b->mu);
    if (!b->n_queue) clock_gettime(CLOCK_MONOTONIC, &b->first);
    b->queue[b->n_queue++] = &p;
    b->queued[job->slot] = 1;
    pthread_cond_signal(&b->work);
    while (!p.done) pthread_cond_wait(&b->done, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (p.rc != OSP_OK) return osp_err(p.rc, "%s", p.msg);
    return OSP_OK;
}

osp_status osp_wbatch_new(const osp_whisper *m, const osp_wbatch_opts *o, osp_wbatch **out) {
    *out = NULL;
    osp_wbatch_opts d;
    osp_wbatch_defaults(&d);
    if (!o) o = &d;
    if (o->slots < 1 || o->slots > 64 || o->rows < 1 || o->rows > 16 || o->enc_windows < 1 ||
        o->enc_windows > o->slots || !(o->gather_ms >= 0 && o->gather_ms <= 1000) ||
        !(o->hold_ms >= 0 && o->hold_ms <= 1000))
        return osp_err(OSP_ERR_INVALID, "transcription batch: %d slots of %d rows, %d windows an encode, %g ms, %g ms",
                       o->slots, o->rows, o->enc_windows, o->gather_ms, o->hold_ms);
    osp_wbatch *b = osp_calloc(OSP_POOL_MISC, sizeof *b);
    if (!b) return osp_err(OSP_ERR_NOMEM, "out of memory");
    b->m = m;
    b->o = *o;
    osp_status rc = osp_whisper_state_new_slots(m, o->slots, o->rows, o->enc_windows, &b->s);
    b->busy = osp_calloc(OSP_POOL_MISC, (size_t)o->slots);
    b->expect = osp_calloc(OSP_POOL_MISC, (size_t)o->slots);
    b->queued = osp_calloc(OSP_POOL_MISC, (size_t)o->slots);
    b->queue = osp_malloc(OSP_POOL_MISC, sizeof *b->queue * o->slots);
    b->take = osp_malloc(OSP_POOL_MISC, sizeof *b->take * o->slots);
    b->runs = osp_malloc(OSP_POOL_MISC, sizeof *b->runs * o->slots * o->rows);
    b->mels = osp_malloc(OSP_POOL_MISC, sizeof *b->mels * o->enc_windows);
    b->enc_slots = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * o->enc_windows);
    b->enc_of = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * o->enc_windows);
    if (rc == OSP_OK && !(b->busy && b->expect && b->queued && b->queue && b->take && b->runs && b->mels && b->enc_slots && b->enc_of))
        rc = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (rc == OSP_OK) {
        osp_whisper_state_set_serial(b->s, o->serial);
        osp_whisper_state_set_fast(b->s, o->fast);
        pthread_mutex_init(&b->mu, NULL);
        pthread_cond_init(&b->work, NULL);
        pthread_cond_init(&b->done, NULL);
        pthread_cond_init(&b->slot_free, NULL);
        b->started = pthread_create(&b->th, NULL, batch_thread, b) == 0;
        if (!b->started) rc = osp_err(OSP_ERR_IO, "transcription batch: cannot start its thread");
    }
    if (rc != OSP_OK) {
        osp_wbatch_free(b);
        return rc;
    }
    *out = b;
    return OSP_OK;
}

void osp_wbatch_free(osp_wbatch *b) {
    if (!b) return;
    if (b->started) {
        pthread_mutex_lock(&b->mu);
        b->stop = 1;
        pthread_cond_signal(&b->work);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->th, NULL);
        pthread_mutex_destroy(&b->mu);
        pthread_cond_destroy(&b->work);
        pthread_cond_destroy(&b->done);
        pthread_cond_destroy(&b->slot_free);
    }
    osp_whisper_state_free(b->s);
    void *p[] = {b->busy, b->expect, b->queued, b->queue, b->take, b->runs, b->mels, b->enc_slots, b->enc_of};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) osp_free(p[i]);
    osp_free(b);
}

osp_status osp_wbatch_transcribe(osp_wbatch *b, const osp_tokenizer *tok, const float *pcm, int64_t n,
                                 const osp_transcribe_opts *o, osp_transcript *out) {
    memset(out, 0, sizeof *out);
    const int beam = o->beam_size > 1 ? o->beam_size : 1;
    if (beam > b->o.rows)
        return osp_err(OSP_ERR_INVALID, "beam size %d: this transcription batch has %d rows a request", beam, b->o.rows);
    lease l = {b, -1};
    pthread_mutex_lock(&b->mu);
    for (;;) {
        for (int32_t i = 0; i < b->o.slots && l.slot < 0; i++)
            if (!b->busy[i]) l.slot = i;
        if (l.slot >= 0) break;
        pthread_cond_wait(&b->slot_free, &b->mu);
    }
    b->busy[l.slot] = 1;
    b->active++;
    pthread_mutex_unlock(&b->mu);
    osp_whisper_state *v = NULL;
    osp_status rc = osp_whisper_state_view(b->s, l.slot, beam, submit, &l, &v);
    osp_transcribe_opts ro = *o;
    ro.serial = 1; /* its mel on its own thread: several transcriptions' threads run at once */
    if (rc == OSP_OK) rc = osp_transcribe_on(b->m, v, tok, pcm, n, &ro, out);
    osp_whisper_state_free(v);
    pthread_mutex_lock(&b->mu);
    b->busy[l.slot] = 0;
    b->expect[l.slot] = 0; /* (its last job was run: none is queued) */
    b->active--;
    pthread_cond_signal(&b->slot_free);
    pthread_cond_signal(&b->work); /* one fewer to wait for */
    pthread_mutex_unlock(&b->mu);
    return rc;
}
