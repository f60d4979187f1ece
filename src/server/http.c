/* server/http: libmicrohttpd's side: one thread per connection once a
 * request head has passed front.c; routing, the API key, CORS, the body
 * limit and deadline, and the small routes. Generations go to respond.c.
 *
 * Routes:
 *   GET|HEAD /health                     200 {"status":"ok"}; 503 while loading or draining
 *   GET  /v1/models, /models             the served model
 *   GET  /v1/models/{id}, /models/{id}   the served model, if {id} is its name (404 otherwise)
 *   POST /v1/chat/completions, /chat/completions
 *   POST /v1/completions, /completions
 *   POST /tokenize, /detokenize, /apply-template
 *   GET  /stats, /metrics                the counters: JSON; Prometheus text (server/stats.c)
 *   POST /v1/audio/transcriptions, /v1/audio/translations (multipart; audio.c; --max-audio-body)
 *   OPTIONS *                            CORS preflight
 * Anything else is a 404; a known route with the wrong method a 405.
 *
 * Order of the checks when a request's head has arrived (before its body):
 * framing (Transfer-Encoding, Content-Length) → API key → body size; so an
 * unauthenticated client never gets to upload. */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include "server/server_internal.h"

typedef struct req_ctx {
    srv *s;
    srv_buf body;
    int too_large;
    int refused;      /* 401: the body is read and dropped, then this is the answer */
    int counted;      /* in srv.active until the response is sent */
    double t_start;   /* when the head arrived: the body's deadline counts from here */
    size_t limit;     /* body limit of the route: --max-body, or --max-audio-body for audio uploads */
    int audio;        /* an audio upload: too large is a 400 (a bad upload, as the audio API's other ones), else 413 */
} req_ctx;

static enum MHD_Result send_too_large(srv *s, struct MHD_Connection *c, const req_ctx *rq) {
    char m[160];
    snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes%s", rq->limit,
             rq->audio ? " (--max-audio-body)" : "");
    return srv_send_error(s, c, rq->audio ? 400 : 413, m);
}

/* ---- responses ---- */

static const char *origin_allowed(srv *s, struct MHD_Connection *c) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
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

enum MHD_Result srv_queue_response(srv *s, struct MHD_Connection *c, int status, struct MHD_Response *r,
                                   const char *ctype) {
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", ctype);
    const char *o = origin_allowed(s, c);
    if (o) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", o);
        if (strcmp(o, "*")) MHD_add_response_header(r, "Vary", "Origin");
    }
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result send_json(srv *s, struct MHD_Connection *c, int status, json_t *o) {
    srv_buf b = {0};
    if (srv_buf_add_json(&b, o) || srv_buf_add(&b, "\n", 1)) {
        srv_buf_free(&b);
        json_decref(o);
        return MHD_NO;
    }
    json_decref(o);
    struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
    if (!r) srv_buf_free(&b);
    return srv_queue_response(s, c, status, r, "application/json");
}

enum MHD_Result srv_send_error(srv *s, struct MHD_Connection *c, int status, const char *msg) {
    return send_json(s, c, status, srv_error_json(status, msg, NULL));
}

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

static enum MHD_Result do_tokenize(srv *s, struct MHD_Connection *c, json_t *b) {
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
    struct MHD_Response *r = MHD_create_response_from_buffer(out.len, out.p, MHD_RESPMEM_MUST_FREE);
    if (!r) srv_buf_free(&out);
    return srv_queue_response(s, c, 200, r, "application/json");
}

static enum MHD_Result do_detokenize(srv *s, struct MHD_Connection *c, json_t *b) {
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

static int check_key(srv *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *key = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) key = h + 7;
    if (!key) key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (!key) return 0;
    size_t a = strlen(key), b = strlen(s->cfg.api_key);
    unsigned diff = (unsigned)(a != b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(key[i] ^ s->cfg.api_key[i]);
    return diff == 0;
}

typedef struct framing {
    int n_cl, n_te, te_other;
    const char *cl;
} framing;

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    framing *f = cls;
    (void)kind;
    if (!strcasecmp(key, "Content-Length")) {
        if (f->n_cl++ && value && f->cl && strcmp(value, f->cl)) f->te_other |= 2;
        f->cl = value;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        f->n_te++;
        if (!value || strcasecmp(value, "chunked")) f->te_other |= 1;
    }
    return MHD_YES;
}

/* Framing of a request that libmicrohttpd accepted (front.c checks the first
 * request of a connection; this also covers later ones on a kept-alive
 * connection). 0 = fine, else the status, with msg. */
static int check_framing(struct MHD_Connection *c, const char **msg) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, framing_cb, &f);
    if (f.te_other & 2) return *msg = "conflicting Content-Length headers", 400;
    if (f.n_te && f.n_cl) return *msg = "a request may not have both Content-Length and Transfer-Encoding", 400;
    if (f.n_te > 1 || (f.te_other & 1)) return *msg = "only 'Transfer-Encoding: chunked' is supported", 501;
    return 0;
}

enum { R_NONE, R_HEALTH, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_TEMPLATE, R_STATS, R_METRICS,
       R_TRANSCRIBE, R_TRANSLATE };

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
    };
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--;
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (strlen(T[i].path) == n && !strncmp(T[i].path, url, n)) {
            *is_post = T[i].post;
            return T[i].route;
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

static enum MHD_Result model_route(srv *s, struct MHD_Connection *c, const char *id) {
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

/* ---- the handler ---- */

static enum MHD_Result on_head(srv *s, req_ctx *rq, struct MHD_Connection *c, const char *url, const char *method) {
    const char *msg = NULL;
    int st = check_framing(c, &msg);
    if (st) return srv_send_error(s, c, st, msg);
    int is_post = 0;
    const char *arg = NULL;
    int route = route_of(url, &is_post, &arg);
    rq->audio = route == R_TRANSCRIBE || route == R_TRANSLATE;
    rq->limit = rq->audio ? s->cfg.max_audio_body : s->cfg.max_body;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
    int absurd = n / 16 > rq->limit;
    if (strcmp(method, "OPTIONS") && route != R_HEALTH && !check_key(s, c)) {
        /* decided now, before any body: nothing of it is kept. Without a body (or with an absurd one) the
         * answer goes at once; otherwise once the body is read and dropped (or --body-timeout), so that a
         * client still writing it sees the 401 rather than a reset connection */
        if ((!n && !te) || absurd) return srv_send_error(s, c, 401, "invalid or missing API key");
        rq->refused = 401;
        return MHD_YES;
    }
    if (n > rq->limit) {
        rq->too_large = 1; /* read and drop the body, then answer 413: a client still writing would */
        if (absurd) return send_too_large(s, c, rq); /* miss an early answer; absurd sizes: at once */
    }
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    srv *s = cls;
    (void)version;
    req_ctx *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq) return MHD_NO;
        rq->s = s;
        rq->t_start = osp_now_s();
        *con_cls = rq;
        return on_head(s, rq, c, url, method);
    }
    if (*upload_size) {
        if (s->limits.body_timeout > 0 && osp_now_s() - rq->t_start > s->limits.body_timeout) {
            *upload_size = 0;
            srv_buf_free(&rq->body);
            if (rq->refused) return srv_send_error(s, c, 401, "invalid or missing API key");
            return srv_send_error(s, c, 408, "the request body did not arrive within --body-timeout");
        }
        if (!rq->too_large && !rq->refused) {
            if (rq->body.len + *upload_size > rq->limit) {
                rq->too_large = 1;
                srv_buf_free(&rq->body);
            } else if (srv_buf_add(&rq->body, upload, *upload_size)) {
                return MHD_NO;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    OSP_LOG(3, "osprey serve: %s %s", method, url);
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        const char *o = origin_allowed(s, c);
        if (o) {
            const char *rh = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, HEAD, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", rh ? rh : "Content-Type, Authorization");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        }
        return srv_queue_response(s, c, 204, r, "text/plain");
    }
    if (rq->refused) return srv_send_error(s, c, 401, "invalid or missing API key");
    if (rq->too_large) return send_too_large(s, c, rq);
    int is_post = 0;
    const char *arg = NULL;
    int route = route_of(url, &is_post, &arg);
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD"); /* libmicrohttpd drops HEAD's body */
    if (route == R_HEALTH && is_get) {
        if (!atomic_load(&s->ready)) return srv_send_error(s, c, 503, "Loading model");
        if (atomic_load(&s->draining)) return srv_send_error(s, c, 503, "the server is shutting down");
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        return send_json(s, c, 200, o);
    }
    if (route == R_NONE) {
        char m[160];
        snprintf(m, sizeof m, "no route %.100s", url);
        return srv_send_error(s, c, 404, m);
    }
    if (is_post ? strcmp(method, "POST") : !is_get) {
        char m[160];
        snprintf(m, sizeof m, "%.100s expects %s", url, is_post ? "POST" : "GET");
        return srv_send_error(s, c, 405, m);
    }
    if (!atomic_load(&s->ready)) return srv_send_error(s, c, 503, "Loading model");
    if (route == R_MODELS) return send_json(s, c, 200, models_json(s));
    if (route == R_MODEL) return model_route(s, c, arg);
    if (route == R_STATS) return send_json(s, c, 200, srv_stats_json(s));
    if (route == R_METRICS) {
        srv_buf b = {0};
        if (srv_metrics_text(s, &b)) {
            srv_buf_free(&b);
            return srv_send_error(s, c, 500, "out of memory");
        }
        struct MHD_Response *r = MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_FREE);
        if (!r) srv_buf_free(&b);
        return srv_queue_response(s, c, 200, r, "text/plain; version=0.0.4; charset=utf-8");
    }
    if (atomic_load(&s->draining)) return srv_send_error(s, c, 503, "the server is shutting down");
    if (route == R_TRANSCRIBE || route == R_TRANSLATE) { /* multipart, not JSON */
        atomic_fetch_add(&s->active, 1);
        rq->counted = 1;
        return srv_audio_respond(s, c, rq->body.p, rq->body.len, route == R_TRANSLATE);
    }
    if (!s->model) /* an audio-only server */
        return srv_send_error(s, c, 404, "no chat model is served: this server transcribes audio only (start osprey "
                                         "serve with --model M beside --audio-model for both)");

    json_error_t je;
    json_t *body = json_loadb(rq->body.p ? rq->body.p : "", rq->body.len, JSON_REJECT_DUPLICATES, &je);
    if (!body) {
        char m[300];
        snprintf(m, sizeof m, "malformed JSON body: %s (line %d, column %d)", je.text, je.line, je.column);
        return srv_send_error(s, c, 400, m);
    }
    if (!json_is_object(body)) {
        json_decref(body);
        return srv_send_error(s, c, 400, "the body must be a JSON object");
    }
    enum MHD_Result rc;
    int status = 400;
    json_t *err = NULL;
    srv_job *j = NULL;
    char m[600];
    switch (route) {
    case R_CHAT:
    case R_COMPLETIONS:
        if (model_mismatch(s, body, m, sizeof m)) {
            json_decref(body);
            json_t *e = srv_error_json(404, m, "model");
            json_object_set_new(json_object_get(e, "error"), "code", json_string("model_not_found"));
            return send_json(s, c, 404, e);
        }
        j = route == R_CHAT ? srv_parse_chat(s, body, &status, &err) : srv_parse_completion(s, body, &status, &err);
        json_decref(body);
        if (!j) return send_json(s, c, status, err);
        j->kv_need = srv_kv_need(s, j->n_prompt, j->gp.max_tokens);
        if (s->kv_budget > 0 && j->kv_need > s->kv_budget) { /* could never be admitted: refuse it now */
            srv_job_release(j);
            return send_json(s, c, 400, srv_error_json(400, SRV_KV_BUDGET_MSG, "max_tokens"));
        }
        __atomic_add_fetch(&s->n_requests, 1, __ATOMIC_RELAXED);
        atomic_fetch_add(&s->active, 1);
        rq->counted = 1;
        return srv_respond(s, c, j);
    case R_TOKENIZE: rc = do_tokenize(s, c, body); break;
    case R_DETOKENIZE: rc = do_detokenize(s, c, body); break;
    case R_TEMPLATE: {
        json_t *o = srv_apply_template(s, body, &status);
        rc = send_json(s, c, status, o);
        break;
    }
    default: rc = srv_send_error(s, c, 404, "no such route");
    }
    json_decref(body);
    return rc;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)c, (void)toe;
    req_ctx *rq = *con_cls;
    if (!rq) return;
    if (rq->counted) atomic_fetch_sub(&rq->s->active, 1);
    srv_buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

/* ---- connections by address (for --max-connections-per-client) ---- */

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    srv *s = cls;
    (void)socket_context;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return;
    pthread_mutex_lock(&s->conn_mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        if (s->n_conn < s->limits.max_connections) {
            memset(&s->conn_addr[s->n_conn], 0, sizeof s->conn_addr[s->n_conn]);
            memcpy(&s->conn_addr[s->n_conn], ci->client_addr,
                   ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
            s->conn_of[s->n_conn++] = c;
        }
    } else {
        for (int i = 0; i < s->n_conn; i++)
            if (s->conn_of[i] == c) {
                s->conn_of[i] = s->conn_of[--s->n_conn];
                s->conn_addr[i] = s->conn_addr[s->n_conn];
                break;
            }
    }
    pthread_mutex_unlock(&s->conn_mu);
}

int srv_conns_from(srv *s, const struct sockaddr *a) {
    int n = 0;
    pthread_mutex_lock(&s->conn_mu);
    for (int i = 0; i < s->n_conn; i++) n += srv_same_host((const struct sockaddr *)&s->conn_addr[i], a);
    pthread_mutex_unlock(&s->conn_mu);
    return n;
}

/* libmicrohttpd's messages: an aborted client ("Closing connection
 * (application error generating response)") is routine, so they are INFO. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    if (osp_log_level < 2) return;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && m[n - 1] == '\n') m[--n] = 0;
    OSP_LOG(2, "osprey serve: libmicrohttpd: %s", m);
}

struct MHD_Daemon *srv_http_start(srv *s) {
    const srv_limits *L = &s->limits;
    s->conn_addr = calloc((size_t)L->max_connections, sizeof *s->conn_addr);
    s->conn_of = calloc((size_t)L->max_connections, sizeof *s->conn_of);
    if (!s->conn_addr || !s->conn_of) return NULL;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_USE_POLL | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, 0, NULL, NULL, handle, s, MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        notify_conn, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)L->idle_timeout, MHD_OPTION_CONNECTION_LIMIT, (unsigned)L->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(L->per_client > 0 ? L->per_client : 0),
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024), MHD_OPTION_END);
    if (!d) fprintf(stderr, "osprey serve: cannot start the HTTP server\n");
    return d;
}
