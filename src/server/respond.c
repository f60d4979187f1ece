/* server/respond: the connection side of a generation. The connection's
 * thread waits on the job's eventfd and on the client's socket (poll, no
 * timer), takes the worker's events off the job and turns them into the
 * OpenAI response: SSE chunks (role, content / reasoning_content deltas,
 * tool_calls, finish_reason, usage, [DONE]) or one JSON body with usage.
 * The reply parser (reasoning / tool calls) and the decoding of logprob
 * tokens run here, never on the batch thread.
 *
 * The client's socket:
 *   - reset or error (POLLHUP / POLLERR): the client is gone; the job is
 *     cancelled and the connection closed.
 *   - end of file (POLLRDHUP): the client closed its sending side. That is
 *     a half-close (it may still read) or a full close; only a write tells
 *     them apart. So nothing is cancelled: a probe is written (an SSE
 *     comment in a stream; for a non-streamed request the response starts
 *     at once, 200 with chunked encoding, and the probe is a newline before
 *     the JSON body, which JSON allows). A fully closed client answers the
 *     probe with a reset, which the next poll sees; a half-closed one gets
 *     its answer.
 *
 * A job of the Messages API (j->api) goes through the same steps; only the
 * shapes differ (anthropic.c formats them), and its keep-alive is a `ping`
 * event rather than a comment. A Responses job (responses.c) keeps its
 * text in both modes: its final events and the stored response carry it. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/anthropic.h"
#include "server/responses.h"

enum { MODE_SSE, MODE_BODY, MODE_BODY_CHUNKED };

typedef struct srv_resp {
    srv *s;
    srv_job *j;
    int fd;                /* the client's socket, -1 if unknown */
    int mode;
    int eof, gone, probe;  /* client half-closed; client gone; a probe is owed */
    int ended;             /* the job's end has been handled: out holds everything */
    int status;            /* of the answer (MODE_BODY) */
    osp_reply *reply;
    srv_buf content, reasoning;
    srv_buf out;           /* bytes for the client not yet written */
    size_t out_off;
    json_t *lp_pending;    /* chat: logprobs entries not yet sent (stream) or all (body) */
    json_t *lp_tokens, *lp_values, *lp_top, *lp_offset; /* completions' legacy shape */
    json_t *ids;           /* return_tokens, or a Messages job with stop strings: the generated token ids */
    srv_buf raw;           /* a Messages job with stop strings: the text as the worker handed it out */
    srv_msg_sse msg;       /* a streamed Messages job: its open content block */
    size_t text_off;
    int failed;            /* out of memory while building output */
} srv_resp;

/* ---- formatting ---- */

static json_t *chunk_base(srv_resp *r, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(r->j->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(r->j->created));
    json_object_set_new(o, "model", json_string(r->s->model_name));
    json_object_set_new(o, "system_fingerprint", json_string("osprey"));
    return o;
}

static void send_event(srv_resp *r, json_t *o) {
    if (srv_buf_add(&r->out, "data: ", 6) || srv_buf_add_json(&r->out, o) || srv_buf_add(&r->out, "\n\n", 2))
        r->failed = 1;
    json_decref(o);
}

static json_t *take_legacy_logprobs(srv_resp *r) {
    json_t *o = json_object();
    json_object_set_new(o, "tokens", r->lp_tokens);
    json_object_set_new(o, "token_logprobs", r->lp_values);
    json_object_set_new(o, "top_logprobs", r->lp_top);
    json_object_set_new(o, "text_offset", r->lp_offset);
    r->lp_tokens = json_array(), r->lp_values = json_array(), r->lp_top = json_array(), r->lp_offset = json_array();
    return o;
}

static json_t *take_chat_logprobs(srv_resp *r) {
    json_t *o = json_object();
    json_object_set_new(o, "content", r->lp_pending);
    r->lp_pending = json_array();
    return o;
}

/* One streamed chat chunk with a delta (stolen) and a finish reason (or NULL). */
static void chat_chunk(srv_resp *r, json_t *delta, const char *finish, int with_logprobs) {
    json_t *o = chunk_base(r, "chat.completion.chunk");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    json_object_set_new(c, "delta", delta);
    json_object_set_new(c, "logprobs", with_logprobs && r->j->logprobs ? take_chat_logprobs(r) : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(o, "choices", json_pack("[o]", c));
    send_event(r, o);
}

static void completion_chunk(srv_resp *r, const char *text, size_t len, const char *finish) {
    json_t *o = chunk_base(r, "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    json_object_set_new(c, "text", srv_json_string_lossy(text, len));
    json_object_set_new(c, "logprobs", r->j->logprobs ? take_legacy_logprobs(r) : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    if (r->j->return_tokens) { /* the ids sampled since the last chunk */
        json_object_set_new(c, "tokens", r->ids);
        r->ids = json_array();
    }
    json_object_set_new(o, "choices", json_pack("[o]", c));
    send_event(r, o);
}

static int on_piece(void *user, osp_reply_kind kind, const char *text, size_t len) {
    srv_resp *r = user;
    if (!len) return 0;
    if (r->j->api == SRV_API_RESPONSES) {
        if (srv_buf_add(kind == OSP_REPLY_REASONING ? &r->reasoning : &r->content, text, len) ||
            (r->mode == MODE_SSE && srv_rsp_sse_piece(&r->j->rsp->sse, &r->out, kind, text, len)))
            r->failed = 1;
    } else if (r->mode == MODE_SSE && r->j->api == SRV_API_MESSAGES) {
        if (srv_msg_sse_piece(&r->msg, &r->out, kind, text, len)) r->failed = 1;
    } else if (r->mode == MODE_SSE) {
        json_t *d = json_object();
        json_object_set_new(d, kind == OSP_REPLY_REASONING ? "reasoning_content" : "content",
                            srv_json_string_lossy(text, len));
        chat_chunk(r, d, NULL, kind == OSP_REPLY_CONTENT);
    } else if (srv_buf_add(kind == OSP_REPLY_REASONING ? &r->reasoning : &r->content, text, len)) {
        r->failed = 1;
    }
    return r->failed;
}

static void on_text(srv_resp *r, const char *text, size_t len) {
    if (r->j->kind == SRV_CHAT) {
        if (osp_reply_feed(r->reply, text, len, on_piece, r) != OSP_OK) r->failed = 1;
    } else if (r->mode == MODE_SSE) {
        if (len || (r->j->logprobs && json_array_size(r->lp_tokens))) completion_chunk(r, text, len, NULL);
    } else if (srv_buf_add(&r->content, text, len)) {
        r->failed = 1;
    }
}

static json_t *token_piece(srv_resp *r, int32_t id, json_t **bytes) {
    char *t = NULL;
    size_t n = 0;
    if (osp_tokenizer_decode(r->s->tok, &id, 1, 0, &t, &n) != OSP_OK) n = 0;
    json_t *str = srv_json_string_lossy(t ? t : "", n);
    if (bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < n; i++) json_array_append_new(*bytes, json_integer((unsigned char)t[i]));
    }
    osp_free(t);
    return str;
}

static json_t *lp_number(float lp) { return json_real(lp < -9999.0f || lp != lp ? -9999.0 : lp); }

static void on_logprob(srv_resp *r, const srv_event *e) {
    if (r->j->kind == SRV_CHAT) {
        json_t *o = json_object(), *bytes;
        json_object_set_new(o, "token", token_piece(r, e->token, &bytes));
        json_object_set_new(o, "logprob", lp_number(e->logprob));
        json_object_set_new(o, "bytes", bytes);
        json_t *tops = json_array();
        for (int32_t i = 0; i < e->n_top; i++) {
            json_t *t = json_object(), *tb;
            json_object_set_new(t, "token", token_piece(r, e->top_ids[i], &tb));
            json_object_set_new(t, "logprob", lp_number(e->top_lp[i]));
            json_object_set_new(t, "bytes", tb);
            json_array_append_new(tops, t);
        }
        json_object_set_new(o, "top_logprobs", tops);
        json_array_append_new(r->lp_pending, o);
    } else {
        json_t *piece = token_piece(r, e->token, NULL);
        json_array_append_new(r->lp_offset, json_integer((json_int_t)r->text_off));
        r->text_off += json_string_length(piece);
        json_array_append_new(r->lp_tokens, piece);
        json_array_append_new(r->lp_values, lp_number(e->logprob));
        json_t *tops = json_object();
        for (int32_t i = 0; i < e->n_top; i++) {
            json_t *p = token_piece(r, e->top_ids[i], NULL);
            json_object_set_new(tops, json_string_value(p), lp_number(e->top_lp[i]));
            json_decref(p);
        }
        json_array_append_new(r->lp_top, tops);
    }
}

static json_t *usage_json(const osp_gen_stats *st) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(st->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(st->n_generated));
    json_object_set_new(u, "total_tokens", json_integer(st->n_prompt + st->n_generated));
    json_t *d = json_object();
    json_object_set_new(d, "cached_tokens", json_integer(st->n_cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

static json_t *timings_json(const osp_gen_stats *st, int batch_max) {
    json_t *t = json_object();
    json_object_set_new(t, "prompt_n", json_integer(st->n_prompt - st->n_cached)); /* computed, as llama-server */
    json_object_set_new(t, "prompt_per_second", json_real(st->prefill_tok_s));
    json_object_set_new(t, "predicted_n", json_integer(st->n_generated));
    json_object_set_new(t, "predicted_per_second", json_real(st->decode_tok_s));
    json_object_set_new(t, "ttft_ms", json_real(st->ttft_s * 1e3));
    json_object_set_new(t, "cache_n", json_integer(st->n_cached));
    json_object_set_new(t, "draft_n", json_integer(st->n_draft));
    json_object_set_new(t, "draft_n_accepted", json_integer(st->n_draft_accepted));
    json_object_set_new(t, "batch_max", json_integer(batch_max));
    return t;
}

/* A failed job: an SSE error event, or the error body with its status. */
static void end_failed(srv_resp *r, int status, const char *msg) {
    int messages = r->j->api == SRV_API_MESSAGES;
    if (r->mode == MODE_SSE && r->j->api == SRV_API_RESPONSES) { /* response.failed */
        srv_rsp_result f = {.status = status, .error = msg, .input_tokens = r->j->n_prompt};
        if (srv_rsp_finish(r->s, r->j, &r->out, 1, &f)) r->failed = 1;
        r->status = status;
        return;
    }
    json_t *e = messages ? srv_msg_error_json(status, msg) : srv_error_json(status, msg, status == 400 ? "max_tokens" : NULL);
    if (r->mode == MODE_SSE && messages) {
        if (srv_msg_sse_error(&r->out, status, msg)) r->failed = 1;
        json_decref(e);
    } else if (r->mode == MODE_SSE) {
        send_event(r, e);
    } else {
        srv_buf_add_json(&r->out, e);
        srv_buf_add(&r->out, "\n", 1);
        json_decref(e);
    }
    r->status = status;
}

/* Tool calls as the request allows them (parallel_tool_calls: false keeps the first). */
static void limit_calls(srv_resp *r, json_t *calls) {
    if (!r->j->parallel_tools)
        while (json_array_size(calls) > 1) json_array_remove(calls, json_array_size(calls) - 1);
}

/* Calls of the request's custom tools in chat's shape: {"id", "type": "custom", "custom": {"name", "input"}}. */
static void custom_calls(const srv_job *j, json_t *tool_calls) {
    size_t i;
    json_t *c;
    json_array_foreach(tool_calls, i, c) {
        json_t *f = json_object_get(c, "function"), *n = json_object_get(f, "name");
        if (!json_is_string(n) || !json_object_get(j->custom_tools, json_string_value(n))) continue;
        const char *args = json_string_value(json_object_get(f, "arguments"));
        json_t *a = args ? json_loads(args, 0, NULL) : NULL, *in = json_object_get(a, "input");
        if (json_is_string(in)) {
            json_object_set_new(c, "custom", json_pack("{s:O,s:O}", "name", n, "input", in));
            json_object_set_new(c, "type", json_string("custom"));
            json_object_del(c, "function");
        }
        json_decref(a);
    }
}

static void end_ok_openai(srv_resp *r, const srv_event *e, json_t *tool_calls) {
    srv_job *j = r->j;
    if (j->custom_tools) custom_calls(j, tool_calls);
    const char *finish = e->stats.finish == OSP_FINISH_LENGTH ? "length" : "stop";
    if (json_array_size(tool_calls)) finish = "tool_calls";
    if (r->mode == MODE_SSE) {
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
                chat_chunk(r, d, NULL, 0);
            }
            chat_chunk(r, json_object(), finish, 1);
        } else {
            completion_chunk(r, "", 0, finish);
        }
        if (j->include_usage) {
            json_t *o = chunk_base(r, j->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage_json(&e->stats));
            json_object_set_new(o, "timings", timings_json(&e->stats, e->batch_max));
            send_event(r, o);
        }
        if (srv_buf_add(&r->out, "data: [DONE]\n\n", 14)) r->failed = 1;
    } else {
        json_t *o = chunk_base(r, j->kind == SRV_CHAT ? "chat.completion" : "text_completion");
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(0));
        if (j->kind == SRV_CHAT) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            int has_calls = json_array_size(tool_calls) > 0;
            json_object_set_new(m, "content", r->content.len || !has_calls
                                                  ? srv_json_string_lossy(r->content.p ? r->content.p : "", r->content.len)
                                                  : json_null());
            if (r->reasoning.len)
                json_object_set_new(m, "reasoning_content", srv_json_string_lossy(r->reasoning.p, r->reasoning.len));
            if (has_calls) json_object_set(m, "tool_calls", tool_calls);
            json_object_set_new(c, "message", m);
            json_object_set_new(c, "logprobs", j->logprobs ? take_chat_logprobs(r) : json_null());
        } else {
            json_object_set_new(c, "text", srv_json_string_lossy(r->content.p ? r->content.p : "", r->content.len));
            json_object_set_new(c, "logprobs", j->logprobs ? take_legacy_logprobs(r) : json_null());
        }
        json_object_set_new(c, "finish_reason", json_string(finish));
        if (j->return_tokens) json_object_set(c, "tokens", r->ids);
        json_object_set_new(o, "choices", json_pack("[o]", c));
        json_object_set_new(o, "usage", usage_json(&e->stats));
        json_object_set_new(o, "timings", timings_json(&e->stats, e->batch_max));
        if (srv_buf_add_json(&r->out, o) || srv_buf_add(&r->out, "\n", 1)) r->failed = 1;
        json_decref(o);
        r->status = 200;
    }
}

/* The stop string that ended a Messages job's reply, or NULL: the tokens
 * decoded whole hold what the worker cut at the stop string. */
static const char *matched_stop(srv_resp *r, const srv_event *e) {
    srv_job *j = r->j;
    if (!j->n_stop || e->stats.finish != OSP_FINISH_STOP) return NULL;
    size_t n = json_array_size(r->ids);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    char *t = NULL;
    size_t tl = 0;
    if (!ids) return NULL;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(r->ids, i));
    const char *m = NULL;
    if (osp_tokenizer_decode(r->s->tok, ids, n, j->gp.skip_special ? OSP_DECODE_SKIP_SPECIAL : 0, &t, &tl) == OSP_OK)
        m = srv_msg_matched_stop((const char *const *)j->stops, j->n_stop, t, tl, r->raw.len);
    osp_free(t);
    free(ids);
    return m;
}

static void end_ok_messages(srv_resp *r, const srv_event *e, const json_t *tool_calls) {
    const char *stop = json_array_size(tool_calls) ? NULL : matched_stop(r, e);
    srv_msg_result m = {.id = r->j->id, .model = r->s->model_name, .reasoning = r->reasoning.p,
                        .reasoning_len = r->reasoning.len, .content = r->content.p, .content_len = r->content.len,
                        .tool_calls = tool_calls, .stop_sequence = stop,
                        .stop_reason = srv_msg_stop_reason(e->stats.finish, json_array_size(tool_calls) > 0, stop),
                        .input_tokens = e->stats.n_prompt, .cached_tokens = e->stats.n_cached,
                        .output_tokens = e->stats.n_generated};
    if (r->mode == MODE_SSE) {
        if (srv_msg_sse_end(&r->msg, &r->out, &m)) r->failed = 1;
        return;
    }
    json_t *o = srv_msg_body(&m);
    if (!o || srv_buf_add_json(&r->out, o) || srv_buf_add(&r->out, "\n", 1)) r->failed = 1;
    json_decref(o);
    r->status = 200;
}

static void end_ok_responses(srv_resp *r, const srv_event *e, const json_t *tool_calls) {
    json_t *lp = r->j->logprobs ? take_chat_logprobs(r) : NULL;
    srv_rsp_result m = {.reasoning = r->reasoning.p, .reasoning_len = r->reasoning.len, .content = r->content.p,
                        .content_len = r->content.len, .tool_calls = tool_calls,
                        .logprobs = json_object_get(lp, "content"), .finish = e->stats.finish,
                        .input_tokens = e->stats.n_prompt, .cached_tokens = e->stats.n_cached,
                        .output_tokens = e->stats.n_generated, .status = 200};
    if (srv_rsp_finish(r->s, r->j, &r->out, r->mode == MODE_SSE, &m)) r->failed = 1;
    json_decref(lp);
    r->status = 200;
}

static void end_ok(srv_resp *r, const srv_event *e) {
    json_t *tool_calls = NULL;
    if (r->reply && osp_reply_finish(r->reply, on_piece, r, &tool_calls) != OSP_OK) r->failed = 1;
    if (tool_calls) limit_calls(r, tool_calls);
    if (r->j->api == SRV_API_RESPONSES) end_ok_responses(r, e, tool_calls);
    else if (r->j->api == SRV_API_MESSAGES) end_ok_messages(r, e, tool_calls);
    else end_ok_openai(r, e, tool_calls);
    json_decref(tool_calls);
    if (r->failed) { /* replace what was built by an error */
        if (r->mode != MODE_SSE) r->out.len = r->out_off = 0;
        end_failed(r, 500, "out of memory while building the response");
    }
}

static void handle_end(srv_resp *r, const srv_event *e) {
    r->ended = 1;
    if (!e || (r->failed && e->status != 200)) {
        end_failed(r, 500, r->failed ? "out of memory while building the response" : "out of memory");
    } else if (e->status == 499) {
        r->gone = 1;
        r->status = 499;
    } else if (e->status != 200) {
        end_failed(r, e->status, e->text ? e->text : "generation failed");
    } else {
        end_ok(r, e);
    }
}

/* Take the job's events and format them. */
static void pump(srv_resp *r) {
    int ended;
    srv_event *e = srv_job_take(r->j, &ended), *end = NULL;
    while (e) {
        srv_event *next = e->next;
        if (!r->ended && !r->failed) {
            int keep_ids = r->j->return_tokens || (r->j->api == SRV_API_MESSAGES && r->j->n_stop);
            if (e->kind == SRV_EV_TEXT && e->token >= 0 && keep_ids && json_array_append_new(r->ids, json_integer(e->token)))
                r->failed = 1;
            if (e->kind == SRV_EV_TEXT && r->j->api == SRV_API_MESSAGES && r->j->n_stop && srv_buf_add(&r->raw, e->text, e->len))
                r->failed = 1;
            if (e->kind == SRV_EV_TEXT) on_text(r, e->text, e->len);
            else if (e->kind == SRV_EV_LOGPROB) on_logprob(r, e);
        }
        if (e->kind == SRV_EV_END && !end) end = e;
        else free(e);
        e = next;
    }
    if (r->failed && !ended) atomic_store(&r->j->cancel, 1); /* the worker stops; its END follows */
    if (ended && !r->ended) handle_end(r, end);
    free(end);
}

/* A long prefill, or a wait in the queue behind other requests, can leave a
 * started stream silent for long: clients and proxies with read timeouts
 * would take it for dead, so an SSE stream with nothing to say for a quarter
 * of --timeout sends a comment. */
static int keepalive_ms(const srv_resp *r) {
    int t = r->s->limits.idle_timeout * 250; /* a quarter: room for a loaded machine's scheduling delays */
    return t < 250 ? 250 : t;
}

/* Wait until the job has news or the client's socket changes (0), or
 * timeout_ms pass (1; -1 = no timeout). Returns -1 when the client is gone
 * (the job is cancelled). */
static int wait_news(srv_resp *r, int timeout_ms) {
    struct pollfd p[2] = {{.fd = r->j->wake_fd, .events = POLLIN},
                          {.fd = r->fd, .events = r->eof ? 0 : POLLRDHUP}};
    for (;;) {
        int n = poll(p, r->fd >= 0 ? 2 : 1, timeout_ms);
        if (n < 0) continue; /* EINTR */
        if (n == 0) return 1;
        break;
    }
    if (r->fd >= 0 && (p[1].revents & (POLLHUP | POLLERR | POLLNVAL))) {
        r->gone = 1;
        atomic_store(&r->j->cancel, 1);
        return -1;
    }
    if (r->fd >= 0 && (p[1].revents & POLLRDHUP) && !r->eof) {
        r->eof = 1;
        r->probe = 1;
        OSP_LOG(3, "osprey serve: %s: the client closed its sending side", r->j->id);
    }
    return 0;
}

/* ---- lifetime ---- */

static srv_resp *resp_new(srv *s, srv_job *j, int fd) {
    srv_resp *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->s = s;
    r->j = j;
    r->fd = fd;
    r->mode = j->stream ? MODE_SSE : MODE_BODY;
    r->lp_pending = json_array();
    r->lp_tokens = json_array(), r->lp_values = json_array(), r->lp_top = json_array(), r->lp_offset = json_array();
    r->ids = json_array();
    if (j->kind == SRV_CHAT) {
        if (osp_reply_new(j->fmt, j->parse_reasoning, j->parse_tools, j->start_in_reasoning, &r->reply) != OSP_OK) {
            json_decref(r->lp_pending);
            json_decref(r->lp_tokens), json_decref(r->lp_values), json_decref(r->lp_top), json_decref(r->lp_offset);
            json_decref(r->ids);
            free(r);
            return NULL;
        }
        if (r->mode == MODE_SSE && j->api == SRV_API_MESSAGES && /* message_start comes before any block */
            srv_msg_sse_start(&r->msg, &r->out, j->id, s->model_name, j->n_prompt))
            r->failed = 1;
        if (r->mode == MODE_SSE && j->api == SRV_API_RESPONSES && srv_rsp_sse_start(&j->rsp->sse, &r->out))
            r->failed = 1;
        if (j->forced) on_text(r, j->forced, strlen(j->forced)); /* the reply's forced opening */
        if (r->mode == MODE_SSE && j->api == SRV_API_OPENAI) {
            json_t *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            chat_chunk(r, d, NULL, 0);
        }
    }
    return r;
}

/* The connection is done with it: a job still running is cancelled. */
static void resp_free(srv_resp *r) {
    if (!r) return;
    if (!r->ended) atomic_store(&r->j->cancel, 1);
    srv_job_release(r->j);
    json_decref(r->lp_pending);
    json_decref(r->lp_tokens), json_decref(r->lp_values), json_decref(r->lp_top), json_decref(r->lp_offset);
    json_decref(r->ids);
    srv_buf_free(&r->content);
    srv_buf_free(&r->reasoning);
    srv_buf_free(&r->raw);
    srv_buf_free(&r->out);
    osp_reply_free(r->reply);
    free(r);
}

/* ---- writing ---- */

/* The stream's bytes so far to the client. -1: the client is gone or stalled. */
static int flush_out(srv_resp *r, srv_req *c) {
    if (r->out.len <= r->out_off) return 0;
    int rc = srv_req_stream_write(c, r->out.p + r->out_off, r->out.len - r->out_off);
    r->out.len = r->out_off = 0;
    return rc;
}

/* A response written as it is generated: SSE, or a body that began early
 * (MODE_BODY_CHUNKED). Ends with the job, or when the client goes. */
static int stream(srv *s, srv_req *c, srv_resp *r, const char *ctype) {
    const char *extra = r->mode == MODE_SSE ? "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n" : NULL;
    int rc = srv_req_stream_begin(c, 200, ctype, extra);
    while (!rc) {
        if ((rc = flush_out(r, c))) break;
        if (r->gone) { /* cancelled: the response is cut */
            rc = -1;
            break;
        }
        if (r->ended) {
            rc = srv_req_stream_end(c);
            break;
        }
        if (r->probe) { /* see the top of this file */
            r->probe = 0;
            if (srv_buf_add(&r->out, r->mode == MODE_SSE ? ": ping\n\n" : "\n", r->mode == MODE_SSE ? 8 : 1)) r->failed = 1;
            continue;
        }
        int w = wait_news(r, r->mode == MODE_SSE ? keepalive_ms(r) : -1);
        if (w < 0) {
            rc = -1;
            break;
        }
        if (w > 0) {
            if (r->j->api == SRV_API_MESSAGES ? srv_msg_sse_ping(&r->out) : srv_buf_add(&r->out, ": keep-alive\n\n", 14))
                r->failed = 1;
            continue;
        }
        pump(r);
    }
    if (rc) c->close_after = 1;
    if (c->stalled) {
        atomic_fetch_add(&s->c_stalled, 1);
        OSP_LOG(1, "osprey serve: %s cancelled: the client read nothing for --write-timeout %g s", r->j->id,
                c->write_timeout);
    }
    resp_free(r); /* a job still running is cancelled */
    return rc;
}

int srv_respond(srv *s, srv_req *c, srv_job *j) {
    srv_resp *r = resp_new(s, j, c->fd);
    if (!r) {
        srv_job_release(j);
        return srv_send_error(s, c, 500, "out of memory");
    }
    if (srv_queue_push(s, j)) {
        resp_free(r); /* never queued: nothing to cancel */
        return srv_send_error(s, c, 503, "the server is shutting down");
    }
    if (r->mode == MODE_SSE) return stream(s, c, r, "text/event-stream");
    /* wait for the whole answer */
    while (!r->ended) {
        int w = wait_news(r, keepalive_ms(r));
        if (w < 0) break;
        if (w == 0) pump(r);
        if (!r->ended && r->eof) { /* answer now (200, chunked), probe, and go on as a stream */
            r->mode = MODE_BODY_CHUNKED;
            return stream(s, c, r, "application/json");
        }
    }
    if (!r->ended || r->gone) { /* the client is gone: nothing to answer */
        c->failed = 1;
        c->close_after = 1;
        resp_free(r);
        return -1;
    }
    int rc = srv_req_reply(c, r->status, "application/json", r->out.p ? r->out.p : "", r->out.len, NULL);
    if (c->stalled) {
        atomic_fetch_add(&s->c_stalled, 1);
        OSP_LOG(1, "osprey serve: %s: the client read nothing for --write-timeout %g s: its answer was dropped",
                r->j->id, c->write_timeout);
    }
    resp_free(r);
    return rc;
}
