/* server/worker: the FIFO queue and the thread that runs one generation at
 * a time on the server's session, turning tokens into OpenAI responses:
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

/* ---- one job ---- */

typedef struct gen_ctx {
    srv *s;
    srv_job *j;
    osp_reply *reply;
    srv_buf content, reasoning;
    json_t *lp_pending;    /* chat: logprobs entries not yet sent (stream) or all (non-stream) */
    json_t *lp_tokens, *lp_values, *lp_top, *lp_offset; /* completions' legacy shape */
    size_t text_off;
    int failed;            /* out of memory while building output */
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

static json_t *timings_json(const osp_gen_stats *st) {
    json_t *t = json_object();
    json_object_set_new(t, "prompt_n", json_integer(st->n_prompt));
    json_object_set_new(t, "prompt_per_second", json_real(st->prefill_tok_s));
    json_object_set_new(t, "predicted_n", json_integer(st->n_generated));
    json_object_set_new(t, "predicted_per_second", json_real(st->decode_tok_s));
    json_object_set_new(t, "ttft_ms", json_real(st->ttft_s * 1e3));
    json_object_set_new(t, "cache_n", json_integer(0));
    return t;
}

static void send_error_event(gen_ctx *g, const char *msg) {
    json_t *e = srv_error_json(500, msg, NULL);
    send_event(g, e);
}

static void run_job(srv *s, srv_job *j) {
    gen_ctx g = {.s = s, .j = j};
    g.lp_pending = json_array();
    g.lp_tokens = json_array(), g.lp_values = json_array(), g.lp_top = json_array(), g.lp_offset = json_array();
    osp_gen_params gp = j->gp;
    if (j->logprobs) {
        gp.on_logprob = on_logprob;
        gp.logprob_user = &g;
        gp.top_logprobs = j->top_logprobs;
    }
    osp_status rc = OSP_OK;
    if (j->kind == SRV_CHAT) {
        rc = osp_reply_new(j->fmt, j->parse_reasoning, j->parse_tools, j->start_in_reasoning, &g.reply);
        if (rc == OSP_OK && j->stream) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            chat_chunk(&g, d, NULL, 0);
        }
    }
    osp_gen_stats st = {0};
    if (rc == OSP_OK) {
        osp_session_reset_row(s->session, 0);
        rc = osp_generate(s->session, s->tok, j->prompt, j->n_prompt, &gp, on_text, &g, &st);
    }
    json_t *tool_calls = NULL;
    if (rc == OSP_OK && g.reply && st.finish != OSP_FINISH_CANCELLED)
        rc = osp_reply_finish(g.reply, on_piece, &g, &tool_calls);
    int cancelled = atomic_load(&j->cancel) || st.finish == OSP_FINISH_CANCELLED;
    const char *finish = st.finish == OSP_FINISH_LENGTH ? "length" : "stop";
    if (json_array_size(tool_calls)) finish = "tool_calls";
    if (g.failed && rc == OSP_OK) rc = osp_err(OSP_ERR_NOMEM, "out of memory while building the response");
    if (cancelled) {
        OSP_LOG(2, "osprey serve: %s cancelled (client gone) after %d tokens", j->id, st.n_generated);
        srv_job_finish(j, 499);
    } else if (rc != OSP_OK) {
        OSP_LOG(0, "osprey serve: %s failed: %s", j->id, osp_last_error());
        if (j->stream) {
            send_error_event(&g, osp_last_error());
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
                chat_chunk(&g, d, NULL, 0);
            }
            chat_chunk(&g, json_object(), finish, 1);
        } else {
            completion_chunk(&g, "", 0, finish);
        }
        if (j->include_usage) {
            json_t *o = chunk_base(&g, j->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(&st));
            json_object_set_new(o, "timings", timings_json(&st));
            send_event(&g, o);
        }
        srv_job_emit(j, "data: [DONE]\n\n", 14);
        srv_job_finish(j, 200);
    } else {
        json_t *o = chunk_base(&g, j->kind == SRV_CHAT ? "chat.completion" : "text_completion");
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(0));
        if (j->kind == SRV_CHAT) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            int has_calls = json_array_size(tool_calls) > 0;
            json_object_set_new(m, "content", g.content.len || !has_calls
                                                  ? srv_json_string_lossy(g.content.p ? g.content.p : "", g.content.len)
                                                  : json_null());
            if (g.reasoning.len)
                json_object_set_new(m, "reasoning_content", srv_json_string_lossy(g.reasoning.p, g.reasoning.len));
            if (has_calls) json_object_set(m, "tool_calls", tool_calls);
            json_object_set_new(c, "message", m);
            json_object_set_new(c, "logprobs", j->logprobs ? take_chat_logprobs(&g) : json_null());
        } else {
            json_object_set_new(c, "text", srv_json_string_lossy(g.content.p ? g.content.p : "", g.content.len));
            json_object_set_new(c, "logprobs", j->logprobs ? take_legacy_logprobs(&g) : json_null());
        }
        json_object_set_new(c, "finish_reason", json_string(finish));
        json_t *arr = json_array();
        json_array_append_new(arr, c);
        json_object_set_new(o, "choices", arr);
        json_object_set_new(o, "usage", usage_json(&st));
        json_object_set_new(o, "timings", timings_json(&st));
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
    json_decref(g.lp_pending);
    json_decref(g.lp_tokens), json_decref(g.lp_values), json_decref(g.lp_top), json_decref(g.lp_offset);
    srv_buf_free(&g.content);
    srv_buf_free(&g.reasoning);
    osp_reply_free(g.reply);
}

static void *worker_main(void *arg) {
    srv *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->qmu);
        while (!s->head && !atomic_load(&s->stopping)) pthread_cond_wait(&s->qcv, &s->qmu);
        srv_job *j = s->head;
        if (!j) {
            pthread_mutex_unlock(&s->qmu);
            break;
        }
        s->head = j->next;
        if (!s->head) s->tail = NULL;
        s->n_queued--;
        s->busy = 1;
        pthread_mutex_unlock(&s->qmu);
        if (atomic_load(&j->cancel)) srv_job_finish(j, 499); /* its client left while it waited */
        else run_job(s, j);
        srv_job_release(j);
        pthread_mutex_lock(&s->qmu);
        s->busy = 0;
        pthread_cond_broadcast(&s->qcv);
        pthread_mutex_unlock(&s->qmu);
    }
    return NULL;
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
