/* server/http: a request's route and answer, on its handler thread (front.c
 * read the request; conn.c writes the response): the API key, CORS, the
 * small routes. Generations go to respond.c, audio to audio.c.
 *
 * Routes:
 *   GET|HEAD /health                     200 {"status":"ok"}; 503 while loading or draining
 *   GET  /v1/models, /models             the served model
 *   GET  /v1/models/{id}, /models/{id}   the served model, if {id} is its name (404 otherwise)
 *   POST /v1/chat/completions, /chat/completions
 *   POST /v1/completions, /completions
 *   POST /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API: anthropic.c; errors in its shape)
 *   POST /v1/responses; GET|DELETE /v1/responses/{id} (OpenAI's Responses API: responses.c)
 *   POST /tokenize, /detokenize, /apply-template
 *   GET  /stats, /metrics                the counters: JSON; Prometheus text (server/stats.c)
 *   POST /v1/audio/transcriptions, /v1/audio/translations (multipart; audio.c; --max-audio-body)
 *   POST /v1/embeddings, /embeddings (embed.c; --embedding-model)
 *   POST /v1/rerank, /rerank, /v1/reranking, /reranking (rerank.c; --rerank-model)
 *   OPTIONS *                            CORS preflight
 * Anything else is a 404; a known route with the wrong method a 405.
 *
 * srv_http_admit decides at the head, before any body is read: the route
 * (404), the method (405), the API key (401), a route with nothing to serve
 * it (404), and the body's limit (front.c answers 413 past it). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "server/anthropic.h"
#include "server/responses.h"

/* ---- responses ---- */

static const char *origin_allowed(srv *s, srv_req *c) {
    const char *origin = srv_req_header(c, "Origin");
    const char *list = s->cfg.allowed_origins;
    if (!origin || !list || !*list) return NULL;
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        while (n && *p == ' ') p++, n--;
        while (n && p[n - 1] == ' ') n--;
        if (n == 1 && *p == '*') return "*";
        if (n == strlen(origin) && !strncmp(p, origin, n)) return origin;
        p = e ? e + 1 : p + strlen(p);
    }
    return NULL;
}

int srv_send_json(srv *s, srv_req *c, int status, json_t *o) {
    (void)s;
    srv_buf b = {0};
    if (srv_buf_add_json(&b, o) || srv_buf_add(&b, "\n", 1)) {
        srv_buf_free(&b);
        json_decref(o);
        c->failed = 1;
        return -1;
    }
    json_decref(o);
    int rc = srv_req_reply(c, status, "application/json", b.p, b.len, NULL);
    srv_buf_free(&b);
    return rc;
}

static int is_messages_route(const char *path);

json_t *srv_http_error_json(const char *path, int status, const char *msg) {
    return is_messages_route(path) ? srv_msg_error_json(status, msg) : srv_error_json(status, msg, NULL);
}

int srv_send_error(srv *s, srv_req *c, int status, const char *msg) {
    return srv_send_json(s, c, status, srv_http_error_json(c->path, status, msg));
}

#define send_json srv_send_json

/* ---- small routes ---- */

static json_t *model_json(srv *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer(s->created));
    json_object_set_new(m, "owned_by", json_string("osprey"));
    if (s->model) json_object_set_new(m, "context_window", json_integer(s->ctx));
    return m;
}

static json_t *models_json(srv *s) {
    json_t *d = json_array();
    json_array_append_new(d, model_json(s));
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", d);
    return o;
}

static int do_tokenize(srv *s, srv_req *c, json_t *b) {
    json_t *content = json_object_get(b, "content");
    if (!json_is_string(content)) return send_json(s, c, 400, srv_error_json(400, "'content' must be a string", "content"));
    json_t *as = json_object_get(b, "add_special"), *wp = json_object_get(b, "with_pieces");
    if ((as && !json_is_boolean(as)) || (wp && !json_is_boolean(wp)))
        return srv_send_error(s, c, 400, "'add_special' and 'with_pieces' must be booleans");
    int32_t *ids = NULL;
    size_t n = 0;
    if (osp_tokenizer_encode_alloc(s->tok, json_string_value(content), json_string_length(content), json_is_true(as),
                                   &ids, &n) != OSP_OK)
        return srv_send_error(s, c, 400, osp_last_error());
    /* written as text, not as a tree of JSON objects (a million small
     * objects made this route quadratic in the allocator) */
    srv_buf out = {0};
    int bad = srv_buf_add(&out, "{\"tokens\":[", 11);
    for (size_t i = 0; i < n && !bad; i++) {
        if (i) bad |= srv_buf_add(&out, ",", 1);
        if (!json_is_true(wp)) {
            bad |= srv_buf_addf(&out, "%d", ids[i]);
            continue;
        }
        char *t = NULL;
        size_t tl = 0;
        if (osp_tokenizer_decode(s->tok, &ids[i], 1, 0, &t, &tl) != OSP_OK) tl = 0;
        bad |= srv_buf_addf(&out, "{\"id\":%d,\"piece\":", ids[i]);
        bad |= srv_buf_add_json_string(&out, t ? t : "", tl);
        bad |= srv_buf_add(&out, "}", 1);
        osp_free(t);
    }
    osp_free(ids);
    bad |= srv_buf_add(&out, "]}\n", 3);
    if (bad) {
        srv_buf_free(&out);
        return srv_send_error(s, c, 500, "out of memory");
    }
    int rc = srv_req_reply(c, 200, "application/json", out.p, out.len, NULL);
    srv_buf_free(&out);
    return rc;
}

static int do_detokenize(srv *s, srv_req *c, json_t *b) {
    json_t *t = json_object_get(b, "tokens");
    if (!json_is_array(t)) return send_json(s, c, 400, srv_error_json(400, "'tokens' must be a list of token ids", "tokens"));
    size_t n = json_array_size(t);
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!ids) return srv_send_error(s, c, 500, "out of memory");
    int32_t V = osp_tokenizer_get_info(s->tok)->vocab_size;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(t, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V) {
            free(ids);
            return send_json(s, c, 400, srv_error_json(400, "'tokens' must be token ids in range", "tokens"));
        }
        ids[i] = (int32_t)json_integer_value(x);
    }
    char *text = NULL;
    size_t len = 0;
    osp_status rc = osp_tokenizer_decode(s->tok, ids, n, 0, &text, &len);
    free(ids);
    if (rc != OSP_OK) return srv_send_error(s, c, 400, osp_last_error());
    json_t *o = json_object();
    json_object_set_new(o, "content", srv_json_string_lossy(text, len));
    osp_free(text);
    return send_json(s, c, 200, o);
}

/* ---- checks ---- */

static int check_key(srv *s, srv_req *c) {
    if (!s->cfg.api_key) return 1;
    const char *h = srv_req_header(c, "Authorization");
    const char *key = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) key = h + 7;
    if (!key) key = srv_req_header(c, "x-api-key");
    if (!key) return 0;
    size_t a = strlen(key), b = strlen(s->cfg.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(key[i] ^ s->cfg.api_key[i]);
    return diff == 0;
}

enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_TEMPLATE, R_STATS, R_METRICS,
       R_TRANSCRIBE, R_TRANSLATE, R_MESSAGES, R_COUNT_TOKENS, R_RESPONSES, R_RESPONSE, R_EMBEDDINGS, R_RERANK };

/* The route of url; *arg = the rest after a prefix route (R_MODEL). */
static int route_of(const char *url, int *is_post, const char **arg) {
    static const struct { const char *path; int route, post; } T[] = {
        {"/health", R_HEALTH, 0},          {"/v1/health", R_HEALTH, 0},
        {"/v1/models", R_MODELS, 0},       {"/models", R_MODELS, 0},
        {"/v1/chat/completions", R_CHAT, 1}, {"/chat/completions", R_CHAT, 1},
        {"/v1/completions", R_COMPLETIONS, 1}, {"/completions", R_COMPLETIONS, 1},
        {"/tokenize", R_TOKENIZE, 1},      {"/detokenize", R_DETOKENIZE, 1},
        {"/apply-template", R_TEMPLATE, 1},
        {"/stats", R_STATS, 0},            {"/metrics", R_METRICS, 0},
        {"/v1/audio/transcriptions", R_TRANSCRIBE, 1}, {"/audio/transcriptions", R_TRANSCRIBE, 1},
        {"/v1/audio/translations", R_TRANSLATE, 1}, {"/audio/translations", R_TRANSLATE, 1},
        {"/v1/messages", R_MESSAGES, 1},  {"/v1/messages/count_tokens", R_COUNT_TOKENS, 1},
        {"/v1/responses", R_RESPONSES, 1}, {"/responses", R_RESPONSES, 1},
        {"/v1/embeddings", R_EMBEDDINGS, 1}, {"/embeddings", R_EMBEDDINGS, 1},
        {"/v1/rerank", R_RERANK, 1},       {"/rerank", R_RERANK, 1},
        {"/v1/reranking", R_RERANK, 1},    {"/reranking", R_RERANK, 1},
    };
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--;
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (strlen(T[i].path) == n && !strncmp(T[i].path, url, n)) {
            *is_post = T[i].post;
            return T[i].route;
        }
    for (int k = 0; k < 2; k++) { /* /v1/responses/{id} (GET or DELETE) */
        const char *pre = k ? "/responses/" : "/v1/responses/";
        size_t pl = strlen(pre);
        if (n > pl && !strncmp(url, pre, pl)) {
            *is_post = 0;
            *arg = url + pl;
            return R_RESPONSE;
        }
    }
    for (int k = 0; k < 2; k++) { /* /v1/models/{id}: ids may contain '/' (org/name) */
        const char *pre = k ? "/models/" : "/v1/models/";
        size_t pl = strlen(pre);
        if (n > pl && !strncmp(url, pre, pl)) {
            *is_post = 0;
            *arg = url + pl;
            return R_MODEL;
        }
    }
    return R_NONE;
}

static int is_messages_route(const char *path) {
    int post;
    const char *arg;
    int r = path ? route_of(path, &post, &arg) : R_NONE;
    return r == R_MESSAGES || r == R_COUNT_TOKENS;
}

static int model_route(srv *s, srv_req *c, const char *id) {
    char want[512];
    size_t n = strlen(id);
    while (n > 1 && id[n - 1] == '/') n--;
    snprintf(want, sizeof want, "%.*s", (int)n, id);
    if (strcmp(want, s->model_name)) {
        char m[700];
        snprintf(m, sizeof m, "the model '%.200s' does not exist (this server serves '%.200s')", want, s->model_name);
        json_t *e = srv_error_json(404, m, "model");
        json_object_set_new(json_object_get(e, "error"), "code", json_string("model_not_found"));
        return send_json(s, c, 404, e);
    }
    return send_json(s, c, 200, model_json(s));
}

/* --strict-model-name: a generation request naming another model is refused. */
static int model_mismatch(srv *s, const json_t *body, char *msg, size_t cap) {
    if (!s->cfg.strict_model) return 0;
    json_t *m = json_object_get(body, "model");
    if (!json_is_string(m) || !strcmp(json_string_value(m), s->model_name)) return 0;
    snprintf(msg, cap, "the model '%.200s' does not exist (this server serves '%.200s')", json_string_value(m),
             s->model_name);
    return 1;
}

#define NO_CHAT_MODEL "no chat model is served: this server transcribes audio only (start osprey serve with --model M " \
                      "beside --audio-model for both)"
#define NO_CHAT_MODEL_EMBED "no chat model is served: this server embeds only (start osprey serve with a MODEL beside " \
                            "--embedding-model for both)"
#define NO_CHAT_MODEL_RERANK "no chat model is served: this server reranks only (start osprey serve with a MODEL beside " \
                             "--rerank-model for both)"
#define NO_AUDIO_MODEL "no audio model is served (start osprey serve with --audio-model)"

/* ---- at the head ---- */

int srv_http_admit(srv *s, srv_req *c, size_t *limit, char *msg, size_t cap) {
    int is_post = 0;
    const char *arg = NULL;
    int route = route_of(c->path, &is_post, &arg);
    int audio = route == R_TRANSCRIBE || route == R_TRANSLATE;
    *limit = audio ? s->cfg.max_audio_body : s->cfg.max_body;
    c->too_large = audio ? 400 : 413; /* an audio upload too large is a bad upload, as the audio API's others */
    if (!strcmp(c->method, "OPTIONS")) return 0;
    if (route != R_HEALTH && !check_key(s, c)) return snprintf(msg, cap, "invalid or missing API key"), 401;
    if (route == R_NONE) return snprintf(msg, cap, "no route %.100s", c->path), 404;
    int is_get = !strcmp(c->method, "GET") || !strcmp(c->method, "HEAD") ||
                 (route == R_RESPONSE && !strcmp(c->method, "DELETE"));
    if (is_post ? strcmp(c->method, "POST") : !is_get)
        return snprintf(msg, cap, "%.100s expects %s", c->path, is_post ? "POST" : "GET"), 405;
    if (atomic_load(&s->ready)) {
        if (audio && !s->audio) return snprintf(msg, cap, NO_AUDIO_MODEL), 404;
        if (route == R_EMBEDDINGS && !s->embed)
            return snprintf(msg, cap, "no embedding model is served (start osprey serve with --embedding-model)"), 404;
        if (route == R_RERANK && !s->rerank)
            return snprintf(msg, cap, "no reranker is served (start osprey serve with --rerank-model)"), 404;
        if ((route == R_CHAT || route == R_COMPLETIONS || route == R_TOKENIZE || route == R_DETOKENIZE ||
             route == R_TEMPLATE || route == R_MESSAGES || route == R_COUNT_TOKENS || route == R_RESPONSES ||
             route == R_RESPONSE) && !s->model)
            return snprintf(msg, cap, "%s", s->audio ? NO_CHAT_MODEL : s->embed ? NO_CHAT_MODEL_EMBED : NO_CHAT_MODEL_RERANK), 404;
    }
    return 0;
}

/* ---- the handler ---- */

static int options(srv *s, srv_req *c) {
    char extra[1024] = "";
    if (origin_allowed(s, c)) {
        const char *rh = srv_req_header(c, "Access-Control-Request-Headers");
        snprintf(extra, sizeof extra,
                 "Access-Control-Allow-Methods: GET, HEAD, POST, DELETE, OPTIONS\r\nAccess-Control-Allow-Headers: %.800s\r\n"
                 "Access-Control-Max-Age: 86400\r\n", rh ? rh : "Content-Type, Authorization");
    }
    /* 204: no body, no Content-Length needed; written as a 0-length body */
    return srv_req_reply(c, 204, "text/plain", "", 0, extra);
}

int srv_submit(srv *s, srv_req *c, srv_job *j) {
    j->kv_need = srv_kv_need(s, j->n_prompt, j->gp.max_tokens);
    if (s->kv_budget > 0 && j->kv_need > s->kv_budget) { /* could never be admitted: refuse it now */
        srv_job_release(j);
        return 400;
    }
    __atomic_add_fetch(&s->n_requests, 1, __ATOMIC_RELAXED);
    atomic_fetch_add(&s->active, 1);
    srv_respond(s, c, j);
    atomic_fetch_sub(&s->active, 1);
    return 0;
}

/* The route's answer; returns when it is written (or the client is gone). */
static void route_request(srv *s, srv_req *c) {
    OSP_LOG(3, "osprey serve: %s %s", c->method, c->path);
    c->cors_origin = origin_allowed(s, c);
    if (!strcmp(c->method, "OPTIONS")) {
        options(s, c);
        return;
    }
    size_t limit;
    char m[600];
    int st = srv_http_admit(s, c, &limit, m, sizeof m); /* again: the server may have become ready meanwhile */
    if (st) {
        srv_send_error(s, c, st, m);
        return;
    }
    int is_post = 0;
    const char *arg = NULL;
    int route = route_of(c->path, &is_post, &arg);
    if (route == R_HEALTH) {
        if (!atomic_load(&s->ready)) srv_send_error(s, c, 503, "Loading model");
        else if (atomic_load(&s->draining)) srv_send_error(s, c, 503, "the server is shutting down");
        else {
            json_t *o = json_object();
            json_object_set_new(o, "status", json_string("ok"));
            send_json(s, c, 200, o);
        }
        return;
    }
    if (!atomic_load(&s->ready)) {
        srv_send_error(s, c, 503, "Loading model");
        return;
    }
    if (route == R_MODELS) {
        send_json(s, c, 200, models_json(s));
        return;
    }
    if (route == R_MODEL) {
        model_route(s, c, arg);
        return;
    }
    if (route == R_STATS) {
        send_json(s, c, 200, srv_stats_json(s));
        return;
    }
    if (route == R_METRICS) {
        srv_buf b = {0};
        if (srv_metrics_text(s, &b)) srv_send_error(s, c, 500, "out of memory");
        else srv_req_reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.len, NULL);
        srv_buf_free(&b);
        return;
    }
    if (route == R_RESPONSE) {
        srv_responses_get(s, c, arg, !strcmp(c->method, "DELETE"));
        return;
    }
    if (atomic_load(&s->draining)) {
        srv_send_error(s, c, 503, "the server is shutting down");
        return;
    }
    if (route == R_TRANSCRIBE || route == R_TRANSLATE) { /* multipart, not JSON */
        atomic_fetch_add(&s->active, 1);
        srv_audio_respond(s, c, c->body, c->body_len, route == R_TRANSLATE);
        atomic_fetch_sub(&s->active, 1);
        return;
    }
    json_error_t je;
    json_t *body = json_loadb(c->body ? c->body : "", c->body_len, JSON_REJECT_DUPLICATES, &je);
    if (!body) {
        snprintf(m, sizeof m, "malformed JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
        srv_send_error(s, c, 400, m);
        return;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        srv_send_error(s, c, 400, "the body must be a JSON object");
        return;
    }
    int status = 400;
    json_t *err = NULL;
    srv_job *j = NULL;
    switch (route) {
    case R_CHAT:
    case R_COMPLETIONS:
        if (model_mismatch(s, body, m, sizeof m)) {
            json_decref(body);
            json_t *e = srv_error_json(404, m, "model");
            json_object_set_new(json_object_get(e, "error"), "code", json_string("model_not_found"));
            send_json(s, c, 404, e);
            return;
        }
        if (route == R_CHAT) atomic_fetch_add(&s->c_route_chat, 1);
        j = route == R_CHAT ? srv_parse_chat(s, body, &status, &err) : srv_parse_completion(s, body, &status, &err);
        json_decref(body);
        if (!j) {
            send_json(s, c, status, err);
            return;
        }
        if (srv_submit(s, c, j)) send_json(s, c, 400, srv_error_json(400, SRV_KV_BUDGET_MSG, "max_tokens"));
        return;
    case R_MESSAGES:
    case R_COUNT_TOKENS:
        if (model_mismatch(s, body, m, sizeof m)) srv_send_error(s, c, 404, m);
        else {
            if (route == R_MESSAGES) atomic_fetch_add(&s->c_route_messages, 1);
            srv_messages(s, c, body, route == R_COUNT_TOKENS);
        }
        break;
    case R_RESPONSES:
        atomic_fetch_add(&s->c_route_responses, 1);
        if (model_mismatch(s, body, m, sizeof m)) srv_send_error(s, c, 404, m);
        else srv_responses(s, c, body);
        break;
    case R_EMBEDDINGS: srv_embed_respond(s, c, body); break;
    case R_RERANK: srv_rerank_respond(s, c, body); break;
    case R_TOKENIZE: do_tokenize(s, c, body); break;
    case R_DETOKENIZE: do_detokenize(s, c, body); break;
    case R_TEMPLATE: {
        json_t *o = srv_apply_template(s, body, &status);
        send_json(s, c, status, o);
        break;
    }
    default: srv_send_error(s, c, 404, "no such route");
    }
    json_decref(body);
}

void srv_http_handle(srv *s, srv_req *c) {
    route_request(s, c);
    if (!c->status && !c->failed) srv_send_error(s, c, 500, "the request could not be answered");
}
