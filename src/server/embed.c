/* server/embed: POST /v1/embeddings (OpenAI's embeddings API) with the
 * --embedding-model model, beside a chat model or alone.
 *
 * The body: input (a string, a list of strings, a list of token ids, or a
 * list of lists of token ids; at most 2048 inputs; strings go through the
 * model's tokenizer with its special tokens, so Qwen3-Embedding's post-
 * processor appends <|endoftext|>; token ids are taken as given), model (any
 * name, as the chat route's), encoding_format ("float", the default, or
 * "base64": the little-endian f32 bytes, base64), dimensions (model/embed.h:
 * Matryoshka models only), user (accepted, unused). Any other field, an
 * empty input, a wrong type, a token id outside the vocabulary or an input
 * over the context is a 400 naming the field.
 *
 * The answer: {"object": "list", "data": [{"object": "embedding", "index",
 * "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}};
 * floats printed with 9 significant digits, which give back the f32 bits.
 *
 * A request's inputs run together as rows of one forward (up to --parallel
 * at a time, model/embed.c's osp_embed_run), and with the inputs of the
 * requests waiting when it starts (server/seqbatch.h: batching across
 * requests). The session computes in the device's production precision, as
 * chat does. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "core/base64.h"
#include "model/embed.h"
#include "server/seqbatch.h"
#include "server/server_internal.h"

#define MAX_INPUTS 2048

typedef struct srv_embed {
    osp_model *model;
    osp_tokenizer *tok;
    osp_embed_config cfg;
    osp_session *session;
    int32_t ctx, rows, vocab;
    char name[256];     /* the id answered when a request names none */
    srv_seqbatch batch; /* the requests' inputs, batched across requests, on the session */
    int batch_init;
} srv_embed;

static osp_status embed_rows(void *ctx, const int32_t *const *ids, const int32_t *len, int32_t n, float *out) {
    srv_embed *e = ctx;
    return osp_embed_run(e->session, &e->cfg, ids, len, n, out);
}

int srv_embed_setup(srv *s) {
    const osp_serve_config *c = &s->cfg;
    if (!c->embedding_model) return 0;
    srv_embed *e = calloc(1, sizeof *e);
    if (!e) return osp_err(OSP_ERR_NOMEM, "out of memory"), -1;
    s->embed = e;
    osp_model_params mp = {.device = (osp_device)c->device, .place = 1};
    if (osp_model_load_params(c->embedding_model, &mp, &e->model) != OSP_OK) return -1;
    const osp_model_info *in = osp_model_get_info(e->model);
    if (osp_tokenizer_load(in->dir, &e->tok) != OSP_OK || osp_embed_config_load(e->model, &e->cfg) != OSP_OK) return -1;
    int ctx = c->ctx > 0 ? c->ctx : 8192;
    e->ctx = in->max_ctx > 0 && ctx > in->max_ctx ? in->max_ctx : ctx;
    e->rows = c->parallel > 0 ? c->parallel : 4;
    e->vocab = in->vocab;
    srv_model_name(c->embedding_model, e->name, sizeof e->name);
    if (osp_embed_session_new(e->model, e->rows, e->ctx, &e->session) != OSP_OK) return -1;
    osp_session_set_fast(e->session, 1);
    srv_seqbatch_init(&e->batch, embed_rows, e, e->cfg.dims);
    e->batch_init = 1;
    OSP_LOG(1, "osprey serve: embedding model %s (%s, %d dimensions, %s pooling%s from %s, Matryoshka %s, context %d; "
            "%s) on /v1/embeddings", c->embedding_model, in->architecture, e->cfg.dims,
            osp_pooling_name(e->cfg.pooling), e->cfg.normalize ? ", normalized" : "", e->cfg.source,
            e->cfg.matryoshka ? "yes" : "no", e->ctx, in->device);
    return 0;
}

void srv_embed_teardown(srv *s) {
    srv_embed *e = s->embed;
    if (!e) return;
    osp_session_free(e->session);
    osp_embed_config_free(&e->cfg);
    osp_tokenizer_free(e->tok);
    osp_model_free(e->model);
    if (e->batch_init) {
        OSP_LOG(2, "osprey serve: embeddings: %lld requests in %lld forward calls", (long long)e->batch.jobs,
                (long long)e->batch.calls);
        srv_seqbatch_destroy(&e->batch);
    }
    free(e);
    s->embed = NULL;
}

static int bad(srv *s, srv_req *c, const char *param, const char *msg) {
    return srv_send_json(s, c, 400, srv_error_json(400, msg, param));
}

/* One input's token ids (osp_malloc'd) from a string or a list of ids; a message in err when it is refused. */
static int input_ids(srv_embed *e, const json_t *v, int32_t **ids, int32_t *n, char *err, size_t cap) {
    *ids = NULL, *n = 0;
    if (json_is_string(v)) {
        size_t k = 0, len = json_string_length(v);
        if (!len) return snprintf(err, cap, "input must not be an empty string"), -1;
        if (osp_tokenizer_encode_alloc(e->tok, json_string_value(v), len, 1, ids, &k) != OSP_OK)
            return snprintf(err, cap, "input: %s", osp_last_error()), -1;
        *n = (int32_t)k;
        return 0;
    }
    size_t k = json_array_size(v);
    if (!k) return snprintf(err, cap, "input must not be an empty list of token ids"), -1;
    *ids = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * k);
    if (!*ids) return snprintf(err, cap, "out of memory"), -1;
    for (size_t i = 0; i < k; i++) {
        const json_t *t = json_array_get(v, i);
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (!json_is_integer(t) || id < 0 || id >= e->vocab) {
            osp_free(*ids), *ids = NULL;
            return snprintf(err, cap, "input: token ids are integers in 0..%d", e->vocab - 1), -1;
        }
        (*ids)[i] = (int32_t)id;
    }
    *n = (int32_t)k;
    return 0;
}

/* The request's inputs as a list of items, each a string or a list of ids; NULL (message in err) when malformed. */
static json_t *input_items(const json_t *in, char *err, size_t cap) {
    if (json_is_string(in)) return json_pack("[O]", in);
    if (!json_is_array(in)) return snprintf(err, cap, "input must be a string, a list of strings, a list of token "
                                            "ids or a list of lists of token ids"), NULL;
    size_t n = json_array_size(in);
    if (!n) return snprintf(err, cap, "input must not be an empty list"), NULL;
    if (json_is_integer(json_array_get(in, 0))) return json_pack("[O]", in); /* one list of ids */
    if (n > MAX_INPUTS) return snprintf(err, cap, "input has %zu items: at most %d", n, MAX_INPUTS), NULL;
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(in, i);
        if (!json_is_string(v) && !json_is_array(v))
            return snprintf(err, cap, "input[%zu] must be a string or a list of token ids (not a %s)", i,
                            srv_json_type(v)), NULL;
    }
    return json_incref((json_t *)in);
}

int srv_embed_respond(srv *s, srv_req *c, const json_t *body) {
    srv_embed *e = s->embed;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)body, key, v) {
        if (!strcmp(key, "input") || !strcmp(key, "encoding_format") || !strcmp(key, "dimensions")) continue;
        char m[300];
        if (!strcmp(key, "model") || !strcmp(key, "user")) {
            snprintf(m, sizeof m, "%s must be a string", key);
            if (!json_is_string(v) && !json_is_null(v)) return bad(s, c, key, m);
            continue;
        }
        snprintf(m, sizeof m, "unknown field '%.200s'", key);
        return bad(s, c, key, m);
    }
    const json_t *fmt = json_object_get(body, "encoding_format"), *dim = json_object_get(body, "dimensions");
    int b64 = 0;
    if (fmt && !json_is_null(fmt)) {
        const char *f = json_string_value(fmt);
        if (!f || (strcmp(f, "float") && strcmp(f, "base64")))
            return bad(s, c, "encoding_format", "encoding_format must be \"float\" or \"base64\"");
        b64 = !strcmp(f, "base64");
    }
    int32_t dims = e->cfg.dims;
    if (dim && !json_is_null(dim)) {
        if (!json_is_integer(dim) || json_integer_value(dim) < 1 || json_integer_value(dim) > e->cfg.dims ||
            osp_embed_check_dims(&e->cfg, (int32_t)json_integer_value(dim)) != OSP_OK) {
            char m[400];
            if (!json_is_integer(dim) || json_integer_value(dim) < 1 || json_integer_value(dim) > e->cfg.dims)
                snprintf(m, sizeof m, "dimensions must be an integer between 1 and %d", e->cfg.dims);
            else snprintf(m, sizeof m, "%s", osp_last_error());
            return bad(s, c, "dimensions", m);
        }
        dims = (int32_t)json_integer_value(dim);
    }
    const json_t *in = json_object_get(body, "input");
    if (!in) return bad(s, c, "input", "input is required");
    char err[400];
    json_t *items = input_items(in, err, sizeof err);
    if (!items) return bad(s, c, "input", err);
    int32_t n = (int32_t)json_array_size(items), **ids = calloc((size_t)n, sizeof *ids);
    int32_t *len = calloc((size_t)n, sizeof *len);
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)e->cfg.dims);
    int64_t tokens = 0;
    int rc = 0;
    if (!ids || !len || !out) {
        rc = srv_send_error(s, c, 500, "out of memory");
        goto done;
    }
    for (int32_t i = 0; i < n; i++) {
        if (input_ids(e, json_array_get(items, i), &ids[i], &len[i], err, sizeof err)) {
            rc = bad(s, c, "input", err);
            goto done;
        }
        if (len[i] > e->ctx) {
            snprintf(err, sizeof err, "input %d has %d tokens, more than the context of %d", i, len[i], e->ctx);
            rc = bad(s, c, "input", err);
            goto done;
        }
        tokens += len[i];
    }
    atomic_fetch_add(&s->active, 1);
    osp_status st = srv_seqbatch_run(&e->batch, (const int32_t *const *)ids, len, n, out);
    atomic_fetch_sub(&s->active, 1);
    if (st != OSP_OK) {
        rc = srv_send_error(s, c, 500, osp_last_error());
        goto done;
    }
    srv_buf b = {0};
    int fail = srv_buf_addf(&b, "{\"object\": \"list\", \"data\": [");
    for (int32_t i = 0; i < n && !fail; i++) {
        float *x = out + (int64_t)i * e->cfg.dims;
        osp_embed_finish(&e->cfg, x, dims);
        fail |= srv_buf_addf(&b, "%s{\"object\": \"embedding\", \"index\": %d, \"embedding\": ", i ? ", " : "", i);
        if (b64) {
            char *t = osp_base64_encode(x, sizeof(float) * (size_t)dims); /* x86 and arm64: little-endian already */
            fail |= !t || srv_buf_addf(&b, "\"%s\"}", t);
            osp_free(t);
        } else {
            for (int32_t j = 0; j < dims && !fail; j++) fail |= srv_buf_addf(&b, "%s%.9g", j ? ", " : "[", x[j]);
            fail |= srv_buf_addf(&b, "]}");
        }
    }
    fail |= srv_buf_addf(&b, "], \"model\": ");
    const json_t *model = json_object_get(body, "model");
    fail |= srv_buf_add_json_string(&b, json_is_string(model) ? json_string_value(model) : e->name,
                                    strlen(json_is_string(model) ? json_string_value(model) : e->name));
    fail |= srv_buf_addf(&b, ", \"usage\": {\"prompt_tokens\": %lld, \"total_tokens\": %lld}}", (long long)tokens,
                         (long long)tokens);
    if (fail) rc = srv_send_error(s, c, 500, "out of memory");
    else rc = srv_req_reply(c, 200, "application/json", b.p, b.len, NULL);
    srv_buf_free(&b);
done:
    for (int32_t i = 0; ids && i < n; i++) osp_free(ids[i]);
    free(ids), free(len), free(out);
    json_decref(items);
    return rc;
}
