/* server/worker: the FIFO queue and the scheduler thread that runs up to
 * --parallel generations at once on the server's session (continuous
 * batching, below), turning tokens into OpenAI responses:
 * SSE chunks (role, content / reasoning_content deltas, tool_calls,
 * finish_reason, usage, [DONE]) or one JSON body with usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/server_internal.h"

void srv_job_emit(srv_job *j, const char *p, size_t n) {
    pthread_mutex_lock(&j->mu);
    srv_buf_add(&j->out, p, n);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_finish(srv_job *j, int status) {
    pthread_mutex_lock(&j->mu);
    j->done = 1;
    j->status = status;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

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

/* ---- one job's output ---- */

typedef struct gen_ctx {
    srv *s;
    srv_job *j;
    osp_reply *reply;
    srv_buf content, reasoning;
    json_t *lp_pending;    /* chat: logprobs entries not yet sent (stream) or all (non-stream) */
    json_t *lp_tokens, *lp_values, *lp_top, *lp_offset; /* completions' legacy shape */
    size_t text_off;
    int failed;            /* out of memory while building output */
    int batch_max;         /* most rows decoded in one step with this one */
} gen_ctx;

static json_t *chunk_base(gen_ctx *g, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->j->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(g->j->created));
    json_object_set_new(o, "model", json_string(g->s->model_name));
    json_object_set_new(o, "system_fingerprint", json_string("osprey"));
    return o;
}

static void send_event(gen_ctx *g, json_t *o) {
    srv_buf b = {0};
    if (srv_buf_add(&b, "data: ", 6) || srv_buf_add_json(&b, o) || srv_buf_add(&b, "\n\n", 2)) g->failed = 1;
    else srv_job_emit(g->j, b.p, b.len);
    srv_buf_free(&b);
    json_decref(o);
}

/* Legacy completions logprobs object of the pending entries (moved out). */
static json_t *take_legacy_logprobs(gen_ctx *g) {
    json_t *o = json_object();
    json_object_set_new(o, "tokens", g->lp_tokens);
    json_object_set_new(o, "token_logprobs", g->lp_values);
    json_object_set_new(o, "top_logprobs", g->lp_top);
    json_object_set_new(o, "text_offset", g->lp_offset);
    g->lp_tokens = json_array(), g->lp_values = json_array(), g->lp_top = json_array(), g->lp_offset = json_array();
    return o;
}

static json_t *take_chat_logprobs(gen_ctx *g) {
    json_t *o = json_object();
    json_object_set_new(o, "content", g->lp_pending);
    g->lp_pending = json_array();
    return o;
}

/* One streamed chat chunk with a delta (stolen) and a finish reason (or NULL). */
static void chat_chunk(gen_ctx *g, json_t *delta, const char *finish, int with_logprobs) {
    json_t *o = chunk_base(g, "chat.completion.chunk");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    json_object_set_new(c, "delta", delta);
    json_object_set_new(c, "logprobs", with_logprobs && g->j->logprobs ? take_chat_logprobs(g) : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, c);
    json_object_set_new(o, "choices", arr);
    send_event(g, o);
}

static void completion_chunk(gen_ctx *g, const char *text, size_t len, const char *finish) {
    json_t *o = chunk_base(g, "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    json_object_set_new(c, "text", srv_json_string_lossy(text, len));
    json_object_set_new(c, "logprobs", g->j->logprobs ? take_legacy_logprobs(g) : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, c);
    json_object_set_new(o, "choices", arr);
    send_event(g, o);
}

static int on_piece(void *user, osp_reply_kind kind, const char *text, size_t len) {
    gen_ctx *g = user;
    if (!len) return 0;
    if (g->j->stream) {
        json_t *d = json_object();
        json_object_set_new(d, kind == OSP_REPLY_REASONING ? "reasoning_content" : "content",
                            srv_json_string_lossy(text, len));
        chat_chunk(g, d, NULL, kind == OSP_REPLY_CONTENT);
    } else if (srv_buf_add(kind == OSP_REPLY_REASONING ? &g->reasoning : &g->content, text, len)) {
        g->failed = 1;
    }
    return atomic_load(&g->j->cancel) || g->failed;
}

static int on_text(void *user, int32_t token, const char *text, size_t len) {
    gen_ctx *g = user;
    (void)token;
    if (atomic_load(&g->j->cancel)) return 1;
    if (g->j->kind == SRV_CHAT) {
        if (osp_reply_feed(g->reply, text, len, on_piece, g) != OSP_OK) return 1;
    } else if (g->j->stream) {
        if (len || (g->j->logprobs && json_array_size(g->lp_tokens))) completion_chunk(g, text, len, NULL);
    } else if (srv_buf_add(&g->content, text, len)) {
        g->failed = 1;
    }
    return atomic_load(&g->j->cancel) || g->failed;
}

static json_t *token_piece(gen_ctx *g, int32_t id, json_t **bytes) {
    char *t = NULL;
    size_t n = 0;
    if (osp_tokenizer_decode(g->s->tok, &id, 1, 0, &t, &n) != OSP_OK) n = 0;
    json_t *str = srv_json_string_lossy(t ? t : "", n);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)t[i]));
    }
    osp_free(t);
    return str;
}

static json_t *lp_number(float lp) { return json_real(lp < -9999.0f || lp != lp ? -9999.0 : lp); }

static void on_logprob(void *user, int32_t token, float logprob, const int32_t *top_ids, const float *top_lp,
                       int32_t k) {
    gen_ctx *g = user;
    if (g->j->kind == SRV_CHAT) {
        json_t *e = json_object(), *bytes;
        json_object_set_new(e, "token", token_piece(g, token, &bytes));
        json_object_set_new(e, "logprob", lp_number(logprob));
        json_object_set_new(e, "bytes", bytes);
        json_t *tops = json_array();
        for (int32_t i = 0; i < k; i++) {
            json_t *t = json_object(), *tb;
            json_object_set_new(t, "token", token_piece(g, top_ids[i], &tb));
            json_object_set_new(t, "logprob", lp_number(top_lp[i]));
            json_object_set_new(t, "bytes", tb);
            json_array_append_new(tops, t);
        }
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(g->lp_pending, e);
    } else {
        json_t *piece = token_piece(g, token, NULL);
        json_array_append_new(g->lp_offset, json_integer((json_int_t)g->text_off));
        g->text_off += json_string_length(piece);
        json_array_append_new(g->lp_tokens, piece);
        json_array_append_new(g->lp_values, lp_number(logprob));
        json_t *tops = json_object();
        for (int32_t i = 0; i < k; i++) {
            json_t *p = token_piece(g, top_ids[i], NULL);
            json_object_set_new(tops, json_string_value(p), lp_number(top_lp[i]));
            json_decref(p);
        }
        json_array_append_new(g->lp_top, tops);
    }
}

static json_t *usage_json(const osp_gen_stats *st) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(st->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(st->n_generated));
    json_object_set_new(u, "total_tokens", json_integer(st->n_prompt + st->n_generated));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(0));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *timings_json(const osp_gen_stats *st, int batch_max) {
    json_t *t = json_object();
    json_object_set_new(t, "prompt_n", json_integer(st->n_prompt));
    json_object_set_new(t, "prompt_per_second", json_real(st->prefill_tok_s));
    json_object_set_new(t, "predicted_n", json_integer(st->n_generated));
    json_object_set_new(t, "predicted_per_second", json_real(st->decode_tok_s));
    json_object_set_new(t, "ttft_ms", json_real(st->ttft_s * 1e3));
    json_object_set_new(t, "cache_n", json_integer(0));
    json_object_set_new(t, "batch_max", json_integer(batch_max));
    return t;
}

static void send_error_event(gen_ctx *g, const char *msg) {
    json_t *e = srv_error_json(500, msg, NULL);
    send_event(g, e);
}

/* ---- the scheduler ----
 *
 * Continuous batching over one session of `parallel` rows. Each loop:
 * admit queued jobs (FIFO) into free rows while their KV reservation fits
 * the budget; run one prefill chunk (at most --prefill-step-size tokens)
 * of the oldest row still prefilling; run one decode step of every row
 * that is decoding; hand each row's logits to its stream; rows that are
 * done or whose client left leave at once. A job's numbers do not depend
 * on the others: prefill runs each row alone, in the same chunks as when
 * it runs by itself, and batched decode computes every row as if alone.
 */
struct srv_slot {
    srv_job *j;         /* NULL: free */
    gen_ctx g;
    osp_stream *st;
    int32_t row;
    int32_t done_prompt;
    int32_t next;       /* the token a decoding row feeds next */
    int decoding;
    int64_t reserved;   /* KV bytes held for it */
    long long seq;      /* admission order */
};

static osp_status slot_begin(srv *s, srv_slot *sl, srv_job *j) {
    memset(&sl->g, 0, sizeof sl->g);
    sl->j = j;
    gen_ctx *g = &sl->g;
    g->s = s;
    g->j = j;
    g->batch_max = 1;
    g->lp_pending = json_array();
    g->lp_tokens = json_array(), g->lp_values = json_array(), g->lp_top = json_array(), g->lp_offset = json_array();
    osp_gen_params gp = j->gp;
    if (j->logprobs) {
        gp.on_logprob = on_logprob;
        gp.logprob_user = g;
        gp.top_logprobs = j->top_logprobs;
    }
    osp_status rc = OSP_OK;
    if (j->kind == SRV_CHAT) {
        rc = osp_reply_new(j->fmt, j->parse_reasoning, j->parse_tools, j->start_in_reasoning, &g->reply);
        if (rc == OSP_OK && j->stream) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            chat_chunk(g, d, NULL, 0);
        }
    }
    if (rc == OSP_OK) rc = osp_stream_new(s->model, s->tok, j->prompt, j->n_prompt, s->ctx, &gp, on_text, g, &sl->st);
    sl->done_prompt = 0;
    sl->decoding = 0; /* its row is empty: slot_end resets it */
    return rc;
}

/* The job's last words: the final chunks or body, or an error. */
static void slot_end(srv *s, srv_slot *sl, osp_status rc) {
    srv_job *j = sl->j;
    gen_ctx *g = &sl->g;
    osp_gen_stats st = {0};
    if (sl->st) st = *osp_stream_stats(sl->st);
    json_t *tool_calls = NULL;
    if (rc == OSP_OK && g->reply && st.finish != OSP_FINISH_CANCELLED)
        rc = osp_reply_finish(g->reply, on_piece, g, &tool_calls);
    int cancelled = atomic_load(&j->cancel) || st.finish == OSP_FINISH_CANCELLED;
    const char *finish = st.finish == OSP_FINISH_LENGTH ? "length" : "stop";
    if (json_array_size(tool_calls)) finish = "tool_calls";
    if (g->failed && rc == OSP_OK) rc = osp_err(OSP_ERR_NOMEM, "out of memory while building the response");
    if (cancelled) {
        OSP_LOG(2, "osprey serve: %s cancelled (client gone) after %d tokens", j->id, st.n_generated);
        srv_job_finish(j, 499);
    } else if (rc != OSP_OK) {
        OSP_LOG(0, "osprey serve: %s failed: %s", j->id, osp_last_error());
        if (j->stream) {
            send_error_event(g, osp_last_error());
            srv_job_finish(j, 200);
        } else {
            json_t *e = srv_error_json(500, osp_last_error(), NULL);
            srv_buf b = {0};
            srv_buf_add_json(&b, e);
            srv_job_emit(j, b.p, b.len);
            srv_buf_free(&b);
            json_decref(e);
            srv_job_finish(j, 500);
        }
    } else if (j->stream) {
        if (j->kind == SRV_CHAT) {
            if (json_array_size(tool_calls)) {
                json_t *calls = json_array();
                size_t i;
                json_t *c;
                json_array_foreach(tool_calls, i, c) {
                    json_t *cc = json_deep_copy(c);
                    json_object_set_new(cc, "index", json_integer((json_int_t)i));
                    json_array_append_new(calls, cc);
                }
                json_t *d = json_object();
                json_object_set_new(d, "tool_calls", calls);
                chat_chunk(g, d, NULL, 0);
            }
            chat_chunk(g, json_object(), finish, 1);
        } else {
            completion_chunk(g, "", 0, finish);
        }
        if (j->include_usage) {
            json_t *o = chunk_base(g, j->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(&st));
            json_object_set_new(o, "timings", timings_json(&st, g->batch_max));
            send_event(g, o);
        }
        srv_job_emit(j, "data: [DONE]\n\n", 14);
        srv_job_finish(j, 200);
    } else {
        json_t *o = chunk_base(g, j->kind == SRV_CHAT ? "chat.completion" : "text_completion");
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(0));
        if (j->kind == SRV_CHAT) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            int has_calls = json_array_size(tool_calls) > 0;
            json_object_set_new(m, "content", g->content.len || !has_calls
                                                  ? srv_json_string_lossy(g->content.p ? g->content.p : "", g->content.len)
                                                  : json_null());
            if (g->reasoning.len)
                json_object_set_new(m, "reasoning_content", srv_json_string_lossy(g->reasoning.p, g->reasoning.len));
            if (has_calls) json_object_set(m, "tool_calls", tool_calls);
            json_object_set_new(c, "message", m);
            json_object_set_new(c, "logprobs", j->logprobs ? take_chat_logprobs(g) : json_null());
        } else {
            json_object_set_new(c, "text", srv_json_string_lossy(g->content.p ? g->content.p : "", g->content.len));
            json_object_set_new(c, "logprobs", j->logprobs ? take_legacy_logprobs(g) : json_null());
        }
        json_object_set_new(c, "finish_reason", json_string(finish));
        json_t *arr = json_array();
        json_array_append_new(arr, c);
        json_object_set_new(o, "choices", arr);
        json_object_set_new(o, "usage", usage_json(&st));
        json_object_set_new(o, "timings", timings_json(&st, g->batch_max));
        srv_buf b = {0};
        int bad = srv_buf_add_json(&b, o);
        json_decref(o);
        if (bad) {
            json_t *e = srv_error_json(500, "out of memory while building the response", NULL);
            srv_buf_free(&b);
            srv_buf_add_json(&b, e);
            json_decref(e);
        }
        srv_job_emit(j, b.p, b.len);
        srv_buf_free(&b);
        srv_job_finish(j, bad ? 500 : 200);
    }
    OSP_LOG(2, "osprey serve: %s prompt %d, generated %d, ttft %.1f ms, %.1f tok/s, finish %s", j->id, st.n_prompt,
            st.n_generated, st.ttft_s * 1e3, st.decode_tok_s, cancelled ? "cancelled" : finish);
    json_decref(tool_calls);
    json_decref(g->lp_pending);
    json_decref(g->lp_tokens), json_decref(g->lp_values), json_decref(g->lp_top), json_decref(g->lp_offset);
    srv_buf_free(&g->content);
    srv_buf_free(&g->reasoning);
    osp_reply_free(g->reply);
    osp_stream_free(sl->st);
    sl->st = NULL;
    osp_session_reset_row(s->session, sl->row); /* its KV goes back */
    srv_job_release(j);
    pthread_mutex_lock(&s->qmu);
    s->kv_reserved -= sl->reserved;
    s->busy--;
    sl->reserved = 0;
    sl->j = NULL;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

/* KV bytes a job may come to hold: its prompt plus max_tokens. */
static int64_t job_need(srv *s, const srv_job *j) {
    int64_t n = (int64_t)j->n_prompt + (j->gp.max_tokens > 0 ? j->gp.max_tokens : s->ctx);
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
        int64_t need = job_need(s, j);
        int gone = atomic_load(&j->cancel), never = s->kv_budget > 0 && need > s->kv_budget;
        if (!gone && !never && s->kv_budget > 0 && s->kv_reserved + need > s->kv_budget) break;
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_queued--;
        if (gone || never) {
            if (never) {
                json_t *e = srv_error_json(400, "the prompt plus max_tokens needs more KV cache than --kv-budget allows",
                                           "max_tokens");
                srv_buf b = {0};
                srv_buf_add_json(&b, e);
                srv_job_emit(j, b.p, b.len);
                srv_buf_free(&b);
                json_decref(e);
            }
            srv_job_finish(j, gone ? 499 : 400);
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

static void *worker_main(void *arg) {
    srv *s = arg;
    int P = s->parallel;
    long long seq = 0;
    int32_t *rows = malloc(sizeof(int32_t) * P), *ids = malloc(sizeof(int32_t) * P);
    srv_slot **batch = malloc(sizeof(srv_slot *) * P);
    srv_job **fresh = malloc(sizeof(srv_job *) * P);
    int64_t *need = malloc(sizeof(int64_t) * P);
    if (!rows || !ids || !batch || !fresh || !need) {
        OSP_LOG(0, "osprey serve: out of memory starting the scheduler");
        free(rows), free(ids), free(batch), free(fresh), free(need);
        return NULL;
    }
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
        if (pf) {
            int32_t left = pf->j->n_prompt - pf->done_prompt, n = left < s->prefill_step ? left : s->prefill_step;
            int last = n == left;
            osp_status rc = osp_forward_rows(s->session, &pf->row, 1, pf->j->prompt + pf->done_prompt, n, 0,
                                             last ? s->logits : NULL);
            pf->done_prompt += n;
            if (rc != OSP_OK) {
                slot_end(s, pf, rc);
            } else if (last) {
                int more = osp_stream_next(pf->st, s->logits, osp_session_row_pos(s->session, pf->row), &pf->next, &rc);
                if (more) pf->decoding = 1;
                else slot_end(s, pf, rc);
            }
        }

        /* one decode step of every decoding row */
        int nb = 0;
        for (int i = 0; i < P; i++) {
            srv_slot *sl = &s->slots[i];
            if (sl->j && sl->decoding > 0 && sl != pf) {
                batch[nb] = sl;
                rows[nb] = sl->row;
                ids[nb++] = sl->next;
            }
        }
        if (!nb) continue;
        osp_status rc = osp_forward_rows(s->session, rows, nb, ids, 1, 0, s->logits);
        for (int b = 0; b < nb; b++) {
            srv_slot *sl = batch[b];
            osp_status src = rc;
            if (nb > sl->g.batch_max) sl->g.batch_max = nb;
            if (rc == OSP_OK) {
                float *lg = s->logits + (int64_t)b * s->vocab;
                if (osp_stream_next(sl->st, lg, osp_session_row_pos(s->session, sl->row), &sl->next, &src)) continue;
            }
            slot_end(s, sl, src);
        }
    }
    free(rows), free(ids), free(batch), free(fresh), free(need);
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

void srv_worker_stop(srv *s) {
    if (!s->worker_started) return;
    pthread_mutex_lock(&s->qmu);
    atomic_store(&s->stopping, 1);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->worker, NULL);
    s->worker_started = 0;
}
