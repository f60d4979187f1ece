/* server/server: osp_serve: the HTTP front (libmicrohttpd, one thread per
 * connection), model loading behind /health, signals and draining.
 *
 * Routes:
 *   GET  /health                         200 {"status":"ok"}, 503 while loading
 *   GET  /v1/models, /models             the served model
 *   POST /v1/chat/completions, /chat/completions
 *   POST /v1/completions, /completions
 *   POST /tokenize, /detokenize, /apply-template
 *   OPTIONS *                            CORS preflight
 * Anything else is a 404; a known route with the wrong method a 405.
 */
#define _GNU_SOURCE
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include "server/server_internal.h"

void osp_serve_config_defaults(osp_serve_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_tokens = 512;
    c->temp = c->top_p = c->min_p = -1;
    c->top_k = -1;
    c->allowed_origins = "*";
    c->max_body = 8u << 20;
    c->log_level = 1;
    c->parallel = 4;
    c->prefill_step = 512;
    c->kv_bits = -1;
    c->kv_group = 64;
}

/* Bytes of memory the system can still give (MemAvailable), or 0. */
static int64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return (int64_t)kb * 1024;
}

typedef struct req_ctx {
    srv *s;
    srv_buf body;
    int too_large;
    int counted; /* in srv.active until the response is sent */
} req_ctx;

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

static json_t *models_json(srv *s) {
    json_t *m = json_object();
    json_object_set_new(m, "id", json_string(s->model_name));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(m, "owned_by", json_string("osprey"));
    json_object_set_new(m, "context_window", json_integer(s->ctx));
    json_t *d = json_array();
    json_array_append_new(d, m);
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
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        if (json_is_true(wp)) {
            char *t = NULL;
            size_t tl = 0;
            osp_tokenizer_decode(s->tok, &ids[i], 1, 0, &t, &tl);
            json_t *p = json_object();
            json_object_set_new(p, "id", json_integer(ids[i]));
            json_object_set_new(p, "piece", srv_json_string_lossy(t ? t : "", tl));
            osp_free(t);
            json_array_append_new(arr, p);
        } else {
            json_array_append_new(arr, json_integer(ids[i]));
        }
    }
    osp_free(ids);
    json_t *o = json_object();
    json_object_set_new(o, "tokens", arr);
    return send_json(s, c, 200, o);
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

enum { R_NONE, R_HEALTH, R_MODELS, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE, R_TEMPLATE };

static int route_of(const char *url, int *is_post) {
    static const struct { const char *path; int route, post; } T[] = {
        {"/health", R_HEALTH, 0},          {"/v1/health", R_HEALTH, 0},
        {"/v1/models", R_MODELS, 0},       {"/models", R_MODELS, 0},
        {"/v1/chat/completions", R_CHAT, 1}, {"/chat/completions", R_CHAT, 1},
        {"/v1/completions", R_COMPLETIONS, 1}, {"/completions", R_COMPLETIONS, 1},
        {"/tokenize", R_TOKENIZE, 1},      {"/detokenize", R_DETOKENIZE, 1},
        {"/apply-template", R_TEMPLATE, 1},
    };
    size_t n = strlen(url);
    while (n > 1 && url[n - 1] == '/') n--;
    for (size_t i = 0; i < sizeof T / sizeof *T; i++)
        if (strlen(T[i].path) == n && !strncmp(T[i].path, url, n)) {
            *is_post = T[i].post;
            return T[i].route;
        }
    return R_NONE;
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
        *con_cls = rq;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0;
        if (n > s->cfg.max_body) {
            rq->too_large = 1; /* read and drop the body, then answer 413 (a client still */
            if (n / 16 > s->cfg.max_body) { /* writing would miss an early answer); absurd sizes: at once */
                char m[128];
                snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes", s->cfg.max_body);
                return srv_send_error(s, c, 413, m);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_large) {
            if (rq->body.len + *upload_size > s->cfg.max_body) {
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
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", rh ? rh : "Content-Type, Authorization");
            MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
        }
        return srv_queue_response(s, c, 204, r, "text/plain");
    }
    if (rq->too_large) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than the limit of %zu bytes", s->cfg.max_body);
        return srv_send_error(s, c, 413, m);
    }
    int is_post = 0, route = route_of(url, &is_post);
    if (route == R_HEALTH && !strcmp(method, "GET")) {
        if (!atomic_load(&s->ready)) return srv_send_error(s, c, 503, "Loading model");
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        return send_json(s, c, 200, o);
    }
    if (!check_key(s, c)) return srv_send_error(s, c, 401, "invalid or missing API key");
    if (route == R_NONE) {
        char m[160];
        snprintf(m, sizeof m, "no route %.100s", url);
        return srv_send_error(s, c, 404, m);
    }
    if (strcmp(method, is_post ? "POST" : "GET")) {
        char m[160];
        snprintf(m, sizeof m, "%.100s expects %s", url, is_post ? "POST" : "GET");
        return srv_send_error(s, c, 405, m);
    }
    if (!atomic_load(&s->ready)) return srv_send_error(s, c, 503, "Loading model");
    if (route == R_MODELS) return send_json(s, c, 200, models_json(s));
    if (atomic_load(&s->draining)) return srv_send_error(s, c, 503, "the server is shutting down");

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
    switch (route) {
    case R_CHAT:
    case R_COMPLETIONS:
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

/* ---- lifecycle ---- */

static atomic_int g_signals;
static sigset_t g_sigset;
static pthread_mutex_t g_stop_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_stop_cv = PTHREAD_COND_INITIALIZER;

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&g_sigset, &sig)) continue;
        if (atomic_fetch_add(&g_signals, 1) >= 1) {
            static const char m[] = "osprey serve: second signal, exiting now\n";
            (void)!write(2, m, sizeof m - 1);
            _exit(130);
        }
        pthread_mutex_lock(&g_stop_mu);
        pthread_cond_broadcast(&g_stop_cv);
        pthread_mutex_unlock(&g_stop_mu);
    }
    return NULL;
}

static void model_name_of(const char *path, char *out, size_t cap) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    const char *b = strrchr(tmp, '/');
    b = b ? b + 1 : tmp;
    if (!strncmp(b, "models--", 8)) { /* Hugging Face cache: models--ORG--NAME */
        snprintf(out, cap, "%s", b + 8);
        char *d = strstr(out, "--");
        if (d) memmove(d + 1, d + 2, strlen(d + 2) + 1), *d = '/';
    } else {
        snprintf(out, cap, "%s", b);
    }
}

static int load_model(srv *s) {
    const osp_serve_config *c = &s->cfg;
    double t0 = osp_now_s();
    if (osp_model_load(c->model, &s->model) != OSP_OK) return -1;
    const osp_model_info *in = osp_model_get_info(s->model);
    if (osp_tokenizer_load(in->dir, &s->tok) != OSP_OK) return -1;
    if (osp_chat_template_load(in->dir, c->chat_template, &s->tmpl) != OSP_OK) {
        if (c->chat_template) return -1;
        OSP_LOG(1, "osprey serve: no chat template (%s); /v1/chat/completions is unavailable", osp_last_error());
        s->tmpl = NULL;
    }
    s->fmt = s->tmpl ? osp_reply_format_detect(osp_chat_template_source(s->tmpl)) : OSP_REPLY_NONE;
    int ctx = c->ctx > 0 ? c->ctx : (in->max_ctx > 0 && in->max_ctx < 8192 ? in->max_ctx : 8192);
    if (in->max_ctx > 0 && ctx > in->max_ctx) {
        OSP_LOG(1, "osprey serve: -c %d is larger than the model's %d positions; using %d", ctx, in->max_ctx, in->max_ctx);
        ctx = in->max_ctx;
    }
    s->ctx = ctx;
    int32_t n_layers = in->n_layers, lbits[n_layers], lgroup[n_layers];
    int have_cfg = 0;
    osp_session_opts so = {.n_rows = c->parallel, .max_ctx = ctx, .kv_bits = c->kv_bits > 0 ? c->kv_bits : 0,
                           .kv_group = c->kv_group,
                           .max_tokens = c->parallel > c->prefill_step ? c->parallel : c->prefill_step};
    if (c->kv_bits < 0) { /* no flag: the model's kv_config.json, if any */
        if (osp_model_kv_config(s->model, lbits, lgroup, &have_cfg) != OSP_OK) return -1;
        if (have_cfg) so.layer_kv_bits = lbits, so.layer_kv_group = lgroup;
    }
    if (osp_session_new_opts(s->model, &so, &s->session) != OSP_OK) return -1;
    osp_session_set_fast(s->session, 1); /* the production path, as osprey generate and bench use */
    /* the KV budget: the flag, else what all rows at full context take, capped at 3/4 of available memory */
    int64_t full = osp_session_kv_row_bytes(s->session, ctx) * c->parallel, avail = mem_available() / 4 * 3;
    s->kv_budget = c->kv_budget > 0 ? c->kv_budget : (avail > 0 && avail < full ? avail : full);
    s->parallel = c->parallel;
    s->prefill_step = c->prefill_step;
    s->vocab = in->vocab;
    s->logits = malloc(sizeof(float) * (size_t)c->parallel * in->vocab);
    if (!s->logits || srv_slots_init(s)) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    osp_gen_defaults(s->model, s->tok, &s->defaults, s->eos);
    s->n_eos = s->defaults.n_eos;
    if (c->temp >= 0) s->defaults.sampler.temperature = c->temp;
    if (c->top_p >= 0) s->defaults.sampler.top_p = c->top_p;
    if (c->top_k >= 0) s->defaults.sampler.top_k = c->top_k;
    if (c->min_p >= 0) s->defaults.sampler.min_p = c->min_p;
    OSP_LOG(1, "osprey serve: loaded %s (%s, context %d, reply format %s) in %.2f s; %d parallel rows, KV %s%s, "
            "budget %.1f MiB (%.1f MiB per row at full context)", s->model_name, in->architecture, ctx,
            osp_reply_format_name(s->fmt), osp_now_s() - t0, c->parallel,
            have_cfg ? "per kv_config.json" : so.kv_bits == 16 ? "bf16" : so.kv_bits ? (so.kv_bits == 4 ? "4-bit" : "8-bit") : "f32",
            so.kv_bits && so.kv_bits != 16 ? " (affine-quantized)" : "", s->kv_budget / 1048576.0, full / (double)c->parallel / 1048576.0);
    return 0;
}

static struct MHD_Daemon *start_http(srv *s) {
    const osp_serve_config *c = &s->cfg;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    if (getaddrinfo(c->host, port, &hints, &ai) || !ai) {
        fprintf(stderr, "osprey serve: cannot resolve host '%s'\n", c->host);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_USE_POLL;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)c->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_NOTIFY_COMPLETED, completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)512, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        fprintf(stderr, "osprey serve: cannot listen on %s:%d (address in use or not allowed)\n", c->host, c->port);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : c->port;
    fprintf(stderr, "osprey serve: listening on http://%s%s%s:%d\n", strchr(c->host, ':') ? "[" : "", c->host,
            strchr(c->host, ':') ? "]" : "", bound);
    return d;
}

int osp_serve(const osp_serve_config *cfg) {
    srv *s = calloc(1, sizeof *s);
    if (!s) return 1;
    s->cfg = *cfg;
    osp_log_level = cfg->log_level;
    model_name_of(cfg->model, s->model_name, sizeof s->model_name);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&g_sigset);
    sigaddset(&g_sigset, SIGINT);
    sigaddset(&g_sigset, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &g_sigset, NULL); /* every thread created from here on inherits it */
    pthread_t sig_thr;
    pthread_create(&sig_thr, NULL, signal_thread, NULL);
    pthread_detach(sig_thr);

    int rc = 1;
    struct MHD_Daemon *d = NULL;
    if (osp_set_threads(cfg->threads) != OSP_OK) { /* the pool's threads inherit the blocked signals */
        fprintf(stderr, "osprey serve: %s\n", osp_last_error());
        goto out;
    }
    d = start_http(s);
    if (!d) goto out;
    if (load_model(s)) {
        fprintf(stderr, "osprey serve: %s\n", osp_last_error());
        goto out;
    }
    if (srv_worker_start(s)) {
        fprintf(stderr, "osprey serve: cannot start the worker thread\n");
        goto out;
    }
    atomic_store(&s->ready, 1);
    OSP_LOG(1, "osprey serve: ready");
    pthread_mutex_lock(&g_stop_mu);
    while (!atomic_load(&g_signals)) pthread_cond_wait(&g_stop_cv, &g_stop_mu);
    pthread_mutex_unlock(&g_stop_mu);
    OSP_LOG(1, "osprey serve: stopping: finishing %s", srv_queue_idle(s) ? "nothing" : "the queued requests");
    rc = 0;
out:
    atomic_store(&s->draining, 1);
    srv_worker_stop(s); /* runs what is queued, then returns */
    /* let the connections deliver what the worker finished (at most 30 s) */
    for (double t0 = osp_now_s(); atomic_load(&s->active) > 0 && osp_now_s() - t0 < 30;) usleep(10000);
    if (d) MHD_stop_daemon(d);
    osp_session_free(s->session);
    free(s->slots);
    free(s->logits);
    osp_chat_template_free(s->tmpl);
    osp_tokenizer_free(s->tok);
    osp_model_free(s->model);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s);
    if (rc == 0) OSP_LOG(1, "osprey serve: bye");
    return rc;
}
