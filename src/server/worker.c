/* server/worker: the FIFO queue, admission under the KV budget, and the
 * scheduler thread that runs up to --parallel generations at once on the
 * server's session (continuous batching, below). It reports each job's
 * progress as events (server_internal.h) and formats nothing: the
 * connection threads turn events into responses (respond.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/options.h"
#include "engine/spec.h"
#include "kv/prefix.h"
#include "server/server_internal.h"

/* ---- events ---- */

static void job_push(srv_job *j, srv_event *e) {
    pthread_mutex_lock(&j->mu);
    if (j->ended) { /* nothing after the end */
        pthread_mutex_unlock(&j->mu);
        free(e);
        return;
    }
    e->next = NULL;
    if (j->ev_tail) j->ev_tail->next = e;
    else j->ev_head = e;
    j->ev_tail = e;
    if (e->kind == SRV_EV_END) j->ended = 1;
    pthread_mutex_unlock(&j->mu);
    uint64_t one = 1;
    (void)!write(j->wake_fd, &one, sizeof one);
}

int srv_job_text(srv_job *j, int32_t token, const char *text, size_t len) {
    srv_event *e = calloc(1, sizeof *e + len + 1);
    if (!e) return -1;
    e->kind = SRV_EV_TEXT;
    e->token = token;
    e->text = (char *)(e + 1);
    memcpy(e->text, text, len);
    e->len = len;
    job_push(j, e);
    return 0;
}

int srv_job_logprob(srv_job *j, int32_t token, float lp, const int32_t *top_ids, const float *top_lp, int32_t k) {
    srv_event *e = calloc(1, sizeof *e + (sizeof(int32_t) + sizeof(float)) * (size_t)k);
    if (!e) return -1;
    e->kind = SRV_EV_LOGPROB;
    e->token = token;
    e->logprob = lp;
    e->n_top = k;
    e->top_ids = (int32_t *)(e + 1);
    e->top_lp = (float *)(e->top_ids + k);
    if (k) memcpy(e->top_ids, top_ids, sizeof(int32_t) * (size_t)k), memcpy(e->top_lp, top_lp, sizeof(float) * (size_t)k);
    job_push(j, e);
    return 0;
}

void srv_job_end(srv_job *j, int status, const char *error, const osp_gen_stats *st) {
    size_t n = error ? strlen(error) : 0;
    srv_event *e = calloc(1, sizeof *e + n + 1);
    if (!e) { /* still end it: the connection must not wait forever */
        pthread_mutex_lock(&j->mu);
        j->ended = 1; /* the connection sees an end without an event: a failure */
        pthread_mutex_unlock(&j->mu);
        uint64_t one = 1;
        (void)!write(j->wake_fd, &one, sizeof one);
        return;
    }
    e->kind = SRV_EV_END;
    e->status = status;
    if (error) e->text = (char *)(e + 1), memcpy(e->text, error, n), e->len = n;
    if (st) e->stats = *st;
    e->batch_max = j->batch_max;
    job_push(j, e);
}

/* The wake counter is drained before the events are taken: an event pushed
 * after the take writes it again, so the next poll wakes. (Drained after,
 * it could swallow the wake of an END pushed in between, and the
 * connection would wait forever.) */
srv_event *srv_job_take(srv_job *j, int *ended) {
    uint64_t v;
    (void)!read(j->wake_fd, &v, sizeof v);
    pthread_mutex_lock(&j->mu);
    srv_event *e = j->ev_head;
    j->ev_head = j->ev_tail = NULL;
    *ended = j->ended;
    pthread_mutex_unlock(&j->mu);
    return e;
}

/* ---- the queue ---- */

int srv_queue_push(srv *s, srv_job *j) {
    pthread_mutex_lock(&s->qmu);
    if (atomic_load(&s->draining)) {
        pthread_mutex_unlock(&s->qmu);
        return -1;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++; /* the queue's / worker's reference */
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (s->tail) s->tail->next = j;
    else s->head = j;
    s->tail = j;
    s->n_queued++;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}

int srv_queue_idle(srv *s) {
    pthread_mutex_lock(&s->qmu);
    int idle = !s->head && !s->busy;
    pthread_mutex_unlock(&s->qmu);
    return idle;
}

void srv_queue_counts(srv *s, int *queued, int *running) {
    pthread_mutex_lock(&s->qmu);
    *queued = s->n_queued;
    *running = s->busy;
    pthread_mutex_unlock(&s->qmu);
}

/* ---- one job's callbacks (on the worker thread) ---- */

static int on_text(void *user, int32_t token, const char *text, size_t len) {
    srv_job *j = user;
    if (atomic_load(&j->cancel)) return 1;
    if (srv_job_text(j, token, text, len)) return 1;
    return atomic_load(&j->cancel);
}

static void on_logprob(void *user, int32_t token, float logprob, const int32_t *top_ids, const float *top_lp,
                       int32_t k) {
    srv_job *j = user;
    if (srv_job_logprob(j, token, logprob, top_ids, top_lp, k)) atomic_store(&j->cancel, 1);
}

/* ---- the scheduler ----
 *
 * Continuous batching over one session of `parallel` rows. Each loop:
 * admit queued jobs (FIFO) into free rows while their KV reservation fits
 * the budget; run one prefill chunk (at most --prefill-step-size tokens)
 * of the oldest row still prefilling; run one decode step of every row
 * that is decoding; hand each row's logits to its stream (or, for a
 * stream whose choice is the plain argmax, the token the backend took:
 * osp_stream_takes_id); rows that are
 * done or whose client left leave at once. A job's numbers do not depend
 * on the others: prefill runs each row alone, in the same chunks as when
 * it runs by itself, and batched decode computes every row as if alone.
 */
struct srv_slot {
    srv_job *j;         /* NULL: free */
    osp_stream *st;
    int32_t row;
    int32_t done_prompt;
    int32_t next;       /* the token a decoding row feeds next */
    int has_pending;    /* a chain's last step computed the row's next token: pending, for its stream first */
    int32_t pending;
    int decoding;
    int looked_up;      /* the prefix cache was asked (when its prefill began) */
    int64_t reserved;   /* KV bytes held for it */
    long long seq;      /* admission order */
    osp_grammar_matcher *gm; /* structured output: the row's parse (made and used on this thread only), or NULL */
};

static osp_status slot_begin(srv *s, srv_slot *sl, srv_job *j) {
    sl->j = j;
    j->batch_max = 1;
    osp_gen_params gp = j->gp;
    if (j->logprobs) {
        gp.on_logprob = on_logprob;
        gp.logprob_user = j;
        gp.top_logprobs = j->top_logprobs;
    }
    sl->done_prompt = 0;
    sl->looked_up = 0;
    sl->has_pending = 0;
    if (s->spec) osp_spec_reset_row(s->spec, sl->row);
    sl->decoding = 0; /* its row is empty: slot_end resets it */
    if (j->grammar) {
        OSP_TRY(osp_grammar_matcher_new(srv_grammar_of(j->grammar), s->gvocab, &sl->gm));
        gp.grammar = sl->gm;
        gp.grammar_trigger = j->grammar_trigger;
    }
    return osp_stream_new(s->model, s->tok, j->prompt, j->n_prompt, s->ctx, &gp, on_text, j, &sl->st);
}

/* The prefix cache inside the KV budget: what the rows' reservations leave. */
static void prefix_fit(srv *s) {
    if (!s->pc || s->kv_budget <= 0) return;
    pthread_mutex_lock(&s->qmu);
    int64_t room = s->kv_budget - s->kv_reserved;
    pthread_mutex_unlock(&s->qmu);
    osp_prefix_shrink(s->pc, room);
}

void srv_prefix_freed(void *srv_) {
    srv *s = srv_;
    pthread_mutex_lock(&s->qmu);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

/* The job's end: its END event, its row's KV back, its reservation released. */
static void slot_end(srv *s, srv_slot *sl, osp_status rc) {
    srv_job *j = sl->j;
    osp_gen_stats st = {0};
    if (sl->st) st = *osp_stream_stats(sl->st);
    int cancelled = atomic_load(&j->cancel) || st.finish == OSP_FINISH_CANCELLED;
    /* the prompt and its reply, for a next turn (only where the reply's KV, computed by decode steps, is what a
     * prefill would compute: chunk-invariant rows) */
    if (!cancelled && rc == OSP_OK && s->pc && j->cache_prompt && sl->st && !s->pc_grid) {
        int32_t nt, pos = osp_session_row_pos(s->session, sl->row);
        const int32_t *toks = osp_stream_tokens(sl->st, &nt);
        if (pos > 0 && pos <= nt && osp_prefix_insert(s->pc, toks, pos, osp_session_kv(s->session), sl->row) != OSP_OK)
            OSP_LOG(1, "osprey serve: prefix cache: %s", osp_last_error());
    }
    atomic_fetch_add(&s->c_requests, 1);
    atomic_fetch_add(cancelled ? &s->c_cancelled : rc != OSP_OK ? &s->c_failed : &s->c_ok, 1);
    atomic_fetch_add(&s->c_prompt_tokens, st.n_prompt);
    atomic_fetch_add(&s->c_cached_tokens, st.n_cached);
    atomic_fetch_add(&s->c_gen_tokens, st.n_generated);
    atomic_fetch_add(&s->c_draft, st.n_draft);
    atomic_fetch_add(&s->c_draft_accepted, st.n_draft_accepted);
    if (cancelled && atomic_load(&j->cancel) == SRV_CANCEL_SHUTDOWN) {
        OSP_LOG(1, "osprey serve: %s cut by --drain-timeout after %d tokens", j->id, st.n_generated);
        srv_job_end(j, 503, "the server is shutting down (--drain-timeout)", &st);
    } else if (cancelled) {
        OSP_LOG(2, "osprey serve: %s cancelled (client gone) after %d tokens", j->id, st.n_generated);
        srv_job_end(j, 499, "cancelled", &st);
    } else if (rc != OSP_OK) {
        OSP_LOG(0, "osprey serve: %s failed: %s", j->id, osp_last_error());
        srv_job_end(j, 500, osp_last_error(), &st);
    } else {
        OSP_LOG(2, "osprey serve: %s prompt %d, generated %d, ttft %.1f ms, %.1f tok/s", j->id, st.n_prompt,
                st.n_generated, st.ttft_s * 1e3, st.decode_tok_s);
        srv_job_end(j, 200, NULL, &st);
    }
    osp_stream_free(sl->st);
    osp_grammar_matcher_free(sl->gm);
    sl->st = NULL;
    sl->gm = NULL;
    osp_session_reset_row(s->session, sl->row); /* its KV goes back */
    srv_job_release(j);
    pthread_mutex_lock(&s->qmu);
    s->kv_reserved -= sl->reserved;
    s->busy--;
    sl->reserved = 0;
    sl->j = NULL;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    prefix_fit(s);
}

int64_t srv_kv_need(srv *s, int32_t n_prompt, int32_t max_tokens) {
    int64_t n = (int64_t)n_prompt + (max_tokens > 0 ? max_tokens : s->ctx);
    return osp_session_kv_row_bytes(s->session, (int32_t)(n < s->ctx ? n : s->ctx));
}

/* Under qmu: move queued jobs into free rows, oldest first, while their KV
 * fits. The queue's head waits for room (nobody overtakes it). Jobs that
 * are cancelled or can never fit are finished here. Returns the jobs to
 * start, in admission order, in out[] (at most n_free). */
static int admit(srv *s, srv_job **out, int64_t *need_out, int max) {
    int n = 0;
    while (s->head && n < max) {
        srv_job *j = s->head;
        int64_t need = j->kv_need;
        int gone = atomic_load(&j->cancel), never = s->kv_budget > 0 && need > s->kv_budget;
        if (!gone && !never && s->kv_budget > 0) {
            int64_t cached = s->pc ? osp_prefix_bytes(s->pc) : 0;
            if (s->kv_reserved + need + cached > s->kv_budget && cached > 0) { /* cached prefixes make room */
                osp_prefix_shrink(s->pc, s->kv_budget - s->kv_reserved - need);
                cached = osp_prefix_bytes(s->pc); /* entries being written count until they are */
            }
            if (s->kv_reserved + need + cached > s->kv_budget) break;
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_queued--;
        if (gone || never) { /* never: refused before queueing (server.c); kept as a guard */
            if (gone == SRV_CANCEL_CLIENT) { /* counted and logged as a cancelled running request is */
                atomic_fetch_add(&s->c_requests, 1);
                atomic_fetch_add(&s->c_cancelled, 1);
                OSP_LOG(2, "osprey serve: %s cancelled (client gone) while queued", j->id);
            }
            if (gone == SRV_CANCEL_SHUTDOWN) srv_job_end(j, 503, "the server is shutting down (--drain-timeout)", NULL);
            else srv_job_end(j, gone ? 499 : 400, gone ? "cancelled" : SRV_KV_BUDGET_MSG, NULL);
            srv_job_release(j);
            continue;
        }
        s->kv_reserved += need;
        s->busy++;
        need_out[n] = need;
        out[n++] = j;
    }
    return n;
}

/* Chains of greedy steps (osp_forward_rows_chain) in the decode loop: when every decoding row takes the
 * backend's greedy token, no row prefills and nothing speculates, the step fed with the tokens a step gave back
 * is queued before they reach the host (on a GPU, which then never waits for this thread between steps). The
 * chain keeps its rows; before the batch changes it ends: a step it queued finishes, and its tokens become the
 * rows' pending ones, which their streams take before their next step (no step is run twice). A row whose
 * stream ends takes back the step queued for it (one position), so its KV is what plain steps leave.
 * OSP_SERVE_CHAIN=0: never; 1: also where the device does not queue (the CPU: for tests); unset: where it does. */
typedef struct wchain {
    int on, active, nb;
    srv_slot **batch;    /* [P] its rows' slots */
    int32_t *rows, *got; /* [P] its rows; the tokens of its last step */
    osp_status *why;     /* [P] a row's stream's end (chain_next) */
    uint8_t *ends;       /* [P] */
} wchain;

static int chain_wanted(srv *s) {
    const int want = osp_options_get()->serve_chain;
    return want >= 0 ? want : osp_session_chain_queues(s->session);
}

/* the chain ends before the batch changes (see wchain) */
static void chain_stop(srv *s, wchain *c) {
    if (!c->active) return;
    c->active = 0;
    int queued = osp_forward_chain_queued(s->session);
    osp_status rc = osp_forward_chain_end(s->session, queued, s->logits, c->got);
    for (int b = 0; b < c->nb; b++) {
        srv_slot *sl = c->batch[b];
        if (rc != OSP_OK) slot_end(s, sl, rc);
        else if (queued) sl->pending = c->got[b], sl->has_pending = 1;
    }
}

/* the chain goes on: the tokens of the step before to each row's stream; the step fed with them is queued.
 * A row whose stream ends leaves (its queued step taken back), which ends the chain for the others (pending). */
static void chain_next(srv *s, wchain *c, int32_t *prev) {
    osp_status rc = osp_forward_rows_chain(s->session, c->rows, c->nb, NULL, s->logits, prev);
    if (rc != OSP_OK) { /* (the chain is over: what it queued was waited for) */
        c->active = 0;
        for (int b = 0; b < c->nb; b++) slot_end(s, c->batch[b], rc);
        return;
    }
    int ended = 0, queued = osp_forward_chain_queued(s->session);
    for (int b = 0; b < c->nb; b++) {
        srv_slot *sl = c->batch[b];
        if (c->nb > sl->j->batch_max) sl->j->batch_max = c->nb;
        int32_t pos = osp_session_row_pos(s->session, sl->row) - queued; /* (without the queued step) */
        c->why[b] = OSP_OK;
        c->ends[b] = !osp_stream_next_id(sl->st, prev[b], pos, &sl->next, &c->why[b]);
        ended |= c->ends[b];
    }
    if (!ended) return;
    c->active = 0;
    rc = osp_forward_chain_end(s->session, queued, s->logits, c->got);
    for (int b = 0; b < c->nb; b++) {
        srv_slot *sl = c->batch[b];
        if (c->ends[b]) {
            osp_status t = queued && rc == OSP_OK ? osp_session_trim_row(s->session, sl->row, 1) : rc;
            slot_end(s, sl, t != OSP_OK ? t : c->why[b]);
        } else if (rc != OSP_OK) {
            slot_end(s, sl, rc);
        } else if (queued) {
            sl->pending = c->got[b], sl->has_pending = 1;
        }
    }
}

/* Grammar masks during the forward pass: before a decode step, the rows held to a grammar hand their streams to
 * this thread, which computes each one's mask for the token the step will give (osp_stream_mask_ahead: it
 * depends only on the tokens so far); the worker waits for it before it samples. One thread: the vocab's mask
 * cache has one user at a time (the worker computes masks itself, inline, only while this thread is idle). */
typedef struct wmask {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    osp_stream **st; /* [P] */
    int n, busy, stop, started;
} wmask;

static void *mask_main(void *arg) {
    wmask *m = arg;
    pthread_mutex_lock(&m->mu);
    for (;;) {
        while (!m->busy && !m->stop) pthread_cond_wait(&m->cv, &m->mu);
        if (m->stop) break;
        pthread_mutex_unlock(&m->mu);
        for (int i = 0; i < m->n; i++) osp_stream_mask_ahead(m->st[i]);
        pthread_mutex_lock(&m->mu);
        m->busy = 0;
        pthread_cond_broadcast(&m->cv);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

static void mask_init(wmask *m, int P) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->st = malloc(sizeof(osp_stream *) * P);
    m->started = m->st && !pthread_create(&m->th, NULL, mask_main, m); /* else: masks inline */
}

/* the batch's grammar rows to the thread (0 when there are none) */
static int mask_start(wmask *m, srv_slot **batch, int nb) {
    if (!m->started) return 0;
    int n = 0;
    for (int b = 0; b < nb; b++)
        if (osp_stream_params(batch[b]->st)->grammar) m->st[n++] = batch[b]->st;
    if (!n) return 0;
    pthread_mutex_lock(&m->mu);
    m->n = n, m->busy = 1;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return 1;
}

static void mask_wait(wmask *m) {
    pthread_mutex_lock(&m->mu);
    while (m->busy) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
}

static void mask_free(wmask *m) {
    if (m->started) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->th, NULL);
    }
    pthread_mutex_destroy(&m->mu);
    pthread_cond_destroy(&m->cv);
    free(m->st);
}

static void *worker_main(void *arg) {
    srv *s = arg;
    int P = s->parallel;
    long long seq = 0;
    int32_t *rows = malloc(sizeof(int32_t) * P), *ids = malloc(sizeof(int32_t) * P);
    srv_slot **batch = malloc(sizeof(srv_slot *) * P);
    srv_job **fresh = malloc(sizeof(srv_job *) * P);
    int64_t *need = malloc(sizeof(int64_t) * P);
    osp_stream **streams = malloc(sizeof(osp_stream *) * P);
    int *use = malloc(sizeof(int) * P), *more = malloc(sizeof(int) * P);
    osp_status *rcs = malloc(sizeof(osp_status) * P);
    int32_t *chosen = malloc(sizeof(int32_t) * P); /* the backend's greedy tokens (osp_forward_rows_ids) */
    uint8_t *want = malloc((size_t)P);             /* rows whose stream needs its logits */
    wchain c = {.on = chain_wanted(s), .batch = malloc(sizeof(srv_slot *) * P), .rows = malloc(sizeof(int32_t) * P),
                .got = malloc(sizeof(int32_t) * P), .why = malloc(sizeof(osp_status) * P), .ends = malloc((size_t)P)};
    if (!rows || !ids || !batch || !fresh || !need || !streams || !use || !more || !rcs || !chosen || !want ||
        !c.batch || !c.rows || !c.got || !c.why || !c.ends) {
        OSP_LOG(0, "osprey serve: out of memory starting the scheduler");
        free(rows), free(ids), free(batch), free(fresh), free(need), free(streams), free(use), free(more), free(rcs);
        free(chosen), free(want), free(c.batch), free(c.rows), free(c.got), free(c.why), free(c.ends);
        return NULL;
    }
    wmask mk;
    mask_init(&mk, P);
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        for (;;) {
            int n_free = 0;
            for (int i = 0; i < P; i++) n_free += !s->slots[i].j;
            int n_new = admit(s, fresh, need, n_free);
            for (int k = 0, i = 0; k < n_new; i++)
                if (!s->slots[i].j) {
                    s->slots[i].j = fresh[k];
                    s->slots[i].reserved = need[k];
                    s->slots[i].seq = seq++;
                    s->slots[i].st = NULL;
                    s->slots[i].decoding = -1; /* to begin, outside the lock */
                    k++;
                }
            if (s->busy > 0 || (atomic_load(&s->stopping) && !s->head)) break;
            pthread_cond_wait(&s->qcv, &s->qmu);
        }
        int idle = s->busy == 0;
        pthread_mutex_unlock(&s->qmu);
        if (idle) break; /* stopping and nothing left */

        for (int i = 0; c.active && i < P; i++) /* a row joins or leaves: a chain ends first */
            if (s->slots[i].j && (s->slots[i].decoding < 0 || atomic_load(&s->slots[i].j->cancel))) chain_stop(s, &c);
        for (int i = 0; i < P; i++) { /* new rows get their stream; cancelled ones leave */
            srv_slot *sl = &s->slots[i];
            if (!sl->j) continue;
            if (sl->decoding < 0) {
                osp_status rc = slot_begin(s, sl, sl->j);
                if (rc != OSP_OK) {
                    slot_end(s, sl, rc);
                    continue;
                }
            }
            if (atomic_load(&sl->j->cancel)) {
                osp_stream_cancel(sl->st);
                slot_end(s, sl, OSP_OK);
            }
        }

        /* one prefill chunk: the oldest row still prefilling */
        srv_slot *pf = NULL;
        for (int i = 0; i < P; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->j && !sl->decoding && (!pf || sl->seq < pf->seq)) pf = sl;
        }
        if (pf && !pf->looked_up) { /* its prefill begins: the longest cached prefix of its prompt */
            pf->looked_up = 1;
            if (s->pc && pf->j->cache_prompt) {
                int32_t u = osp_prefix_restore(s->pc, pf->j->prompt, pf->j->n_prompt, osp_session_kv(s->session), pf->row);
                pf->done_prompt = u;
                osp_stream_set_cached(pf->st, u);
                if (u) OSP_LOG(2, "osprey serve: %s: %d of %d prompt tokens from the prefix cache", pf->j->id, u,
                               pf->j->n_prompt);
            }
        }
        if (pf) {
            chain_stop(s, &c); /* (no chain runs beside a prefill) */
            int32_t left = pf->j->n_prompt - pf->done_prompt, n = left < s->prefill_step ? left : s->prefill_step;
            int last = n == left;
            want[0] = !osp_stream_takes_id(pf->st);
            const int32_t *chunk = pf->j->prompt + pf->done_prompt;
            osp_status rc = last ? osp_forward_rows_ids(s->session, &pf->row, 1, chunk, n, want, s->logits, chosen)
                                 : osp_forward_rows(s->session, &pf->row, 1, chunk, n, 0, NULL);
            pf->done_prompt += n;
            if (rc != OSP_OK) {
                slot_end(s, pf, rc);
            } else if (last) {
                int32_t pos = osp_session_row_pos(s->session, pf->row);
                int more = want[0] ? osp_stream_next(pf->st, s->logits, pos, &pf->next, &rc)
                                   : osp_stream_next_id(pf->st, chosen[0], pos, &pf->next, &rc);
                if (s->pc && pf->j->cache_prompt) { /* the prompt alone, for requests sharing it (after the first
                                                      token: its time to first token does not wait for the copy) */
                    if (osp_prefix_insert(s->pc, pf->j->prompt, pf->j->n_prompt, osp_session_kv(s->session), pf->row) != OSP_OK)
                        OSP_LOG(1, "osprey serve: prefix cache: %s", osp_last_error());
                    prefix_fit(s);
                }
                if (more) pf->decoding = 1;
                else slot_end(s, pf, rc);
            }
        }

        /* one decode step of every decoding row */
        int nb = 0;
        for (int i = 0; i < P; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->j && sl->decoding > 0 && sl != pf) batch[nb++] = sl;
        }
        if (c.active) { /* the chain goes on with the same rows, all still taking ids, or ends */
            int same = nb == c.nb && !s->spec;
            for (int b = 0; same && b < nb; b++) same = batch[b] == c.batch[b] && osp_stream_takes_id(batch[b]->st);
            if (same) {
                chain_next(s, &c, ids);
                continue;
            }
            chain_stop(s, &c);
        }
        for (int b = 0; b < nb; b++) { /* a chain's last tokens first */
            srv_slot *sl = batch[b];
            if (!sl->has_pending) continue;
            sl->has_pending = 0;
            osp_status src = OSP_OK;
            if (!osp_stream_next_id(sl->st, sl->pending, osp_session_row_pos(s->session, sl->row), &sl->next, &src))
                slot_end(s, sl, src);
        }
        int kept = 0;
        for (int b = 0; b < nb; b++)
            if (batch[b]->j) {
                batch[kept] = batch[b];
                rows[kept] = batch[b]->row;
                ids[kept++] = batch[b]->next;
            }
        nb = kept;
        if (!nb) continue;
        int greedy = c.on && !s->spec && !pf;
        for (int b = 0; greedy && b < nb; b++) greedy = osp_stream_takes_id(batch[b]->st);
        if (greedy) { /* a chain begins: this step's tokens come back with the next */
            osp_status rc = osp_forward_rows_chain(s->session, rows, nb, ids, s->logits, NULL);
            if (rc == OSP_OK) {
                c.active = 1, c.nb = nb;
                memcpy(c.batch, batch, sizeof(srv_slot *) * (size_t)nb);
                memcpy(c.rows, rows, sizeof(int32_t) * (size_t)nb);
                for (int b = 0; b < nb; b++)
                    if (nb > batch[b]->j->batch_max) batch[b]->j->batch_max = nb;
            } else {
                for (int b = 0; b < nb; b++) slot_end(s, batch[b], rc);
            }
            continue;
        }
        if (s->spec) { /* a speculative round: each row's drafts verified in one exact chunk (engine/spec.h) */
            for (int b = 0; b < nb; b++) streams[b] = batch[b]->st, use[b] = batch[b]->j->speculative;
            osp_status rc = osp_spec_step(s->spec, s->session, rows, nb, streams, use, ids, more, rcs);
            for (int b = 0; b < nb; b++) {
                srv_slot *sl = batch[b];
                if (nb > sl->j->batch_max) sl->j->batch_max = nb;
                if (rc == OSP_OK && rcs[b] == OSP_OK && more[b]) {
                    sl->next = ids[b];
                    continue;
                }
                slot_end(s, sl, rc != OSP_OK ? rc : rcs[b]);
            }
            continue;
        }
        /* the backend takes every row's greedy token; only the rows whose sampling needs more get their logits
         * (the same step always: one graph per row count on a GPU) */
        for (int b = 0; b < nb; b++) want[b] = !osp_stream_takes_id(batch[b]->st);
        int masking = mask_start(&mk, batch, nb);
        osp_status rc = osp_forward_rows_ids(s->session, rows, nb, ids, 1, want, s->logits, chosen);
        if (masking) mask_wait(&mk);
        for (int b = 0; b < nb; b++) {
            srv_slot *sl = batch[b];
            osp_status src = rc;
            if (nb > sl->j->batch_max) sl->j->batch_max = nb;
            if (rc == OSP_OK) {
                float *lg = s->logits + (int64_t)b * s->vocab;
                int32_t pos = osp_session_row_pos(s->session, sl->row);
                if (want[b] ? osp_stream_next(sl->st, lg, pos, &sl->next, &src)
                            : osp_stream_next_id(sl->st, chosen[b], pos, &sl->next, &src))
                    continue;
            }
            slot_end(s, sl, src);
        }
    }
    chain_stop(s, &c);
    mask_free(&mk);
    free(rows), free(ids), free(batch), free(fresh), free(need), free(streams), free(use), free(more), free(rcs);
    free(chosen), free(want), free(c.batch), free(c.rows), free(c.got), free(c.why), free(c.ends);
    return NULL;
}

int srv_slots_init(srv *s) {
    s->slots = calloc((size_t)s->parallel, sizeof *s->slots);
    if (!s->slots) return -1;
    for (int i = 0; i < s->parallel; i++) s->slots[i].row = i;
    return 0;
}

int srv_worker_start(srv *s) {
    if (pthread_create(&s->worker, NULL, worker_main, s)) return -1;
    s->worker_started = 1;
    return 0;
}

void srv_queue_cancel_all(srv *s) {
    pthread_mutex_lock(&s->qmu);
    for (srv_job *j = s->head; j; j = j->next) atomic_store(&j->cancel, SRV_CANCEL_SHUTDOWN);
    for (int i = 0; s->slots && i < s->parallel; i++)
        if (s->slots[i].j) atomic_store(&s->slots[i].j->cancel, SRV_CANCEL_SHUTDOWN);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

void srv_worker_stop(srv *s) {
    if (!s->worker_started) return;
    pthread_mutex_lock(&s->qmu);
    atomic_store(&s->stopping, 1);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->worker, NULL);
    s->worker_started = 0;
}
