/* server/request: an OpenAI request body ─► a validated job.
 *
 * Everything a client can get wrong is checked here, before the job is
 * queued, and answered with a 400 naming the field: wrong types, values out
 * of range, empty messages, unknown roles, non-text content, a prompt that
 * (with max_tokens) does not fit the context, template errors.
 *
 * Sampling defaults: request field → server flag → the model's
 * generation_config.json → built-in (greedy). The server's defaults
 * (srv.defaults) already hold the last three.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include "server/server_internal.h"

typedef struct perr {
    int status;
    char msg[512];
    const char *param;
    srv_reject why; /* for the routes that word it their own way */
} perr;

#define FAIL(e, prm, ...)                                                                                    \
    do {                                                                                                     \
        (e)->status = 400;                                                                                   \
        (e)->param = (prm);                                                                                  \
        snprintf((e)->msg, sizeof (e)->msg, __VA_ARGS__);                                                    \
        return -1;                                                                                           \
    } while (0)

static json_t *get(const json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

/* A number field within [lo, hi]; absent/null leaves *out. */
static int num_field(const json_t *b, const char *k, double lo, double hi, float *out, perr *e) {
    json_t *v = get(b, k);
    if (!v) return 0;
    if (!json_is_number(v)) FAIL(e, k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) FAIL(e, k, "'%s' must be in [%g, %g], got %g", k, lo, hi, d);
    *out = (float)d;
    return 0;
}

static int int_field(const json_t *b, const char *k, long long lo, long long hi, int32_t *out, perr *e) {
    json_t *v = get(b, k);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e15)
        x = (long long)json_real_value(v); /* 5.0 is 5 */
    else FAIL(e, k, "'%s' must be an integer", k);
    if (x < lo || x > hi) FAIL(e, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *out = (int32_t)x;
    return 0;
}

static int bool_field(const json_t *b, const char *k, int *out, perr *e) {
    json_t *v = get(b, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) FAIL(e, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 0;
}

static void job_free_fields(srv_job *j) {
    osp_free(j->prompt);
    free(j->forced);
    free(j->rf_schema);
    json_decref(j->custom_tools);
    srv_grammar_release(j->grammar);
    for (int i = 0; i < j->n_stop; i++) free(j->stops[i]);
    free(j->stops);
    free(j->bias);
}

static srv_job *job_new(srv *s) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (j->wake_fd < 0) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    j->parallel_tools = 1;
    j->gp = s->defaults;
    memcpy(j->eos, s->eos, sizeof j->eos);
    j->gp.eos = j->eos;
    j->gp.n_eos = s->n_eos;
    j->gp.sampler.xtc_exempt = j->eos;
    j->gp.sampler.n_xtc_exempt = s->n_eos;
    j->gp.max_tokens = -1;
    j->created = (long long)time(NULL);
    j->fmt = OSP_REPLY_NONE;
    return j;
}

void srv_job_release(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    job_free_fields(j);
    for (srv_event *e = j->ev_head, *n; e; e = n) n = e->next, free(e);
    close(j->wake_fd);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* The schema a response format asks for, as JSON text in j->rf_schema (compiled once the prompt is known:
 * settle_grammar): response_format json_object (any object, or llama-server's "schema") or json_schema
 * ({"json_schema": {"name", "schema", "strict"}}), or llama-server's top-level json_schema. */
static int response_format(const json_t *b, srv_job *j, perr *e) {
    const json_t *schema = NULL, *v;
    int any_object = 0;
    const json_t *gbnf = NULL;
    if ((v = get(b, "grammar"))) {
        if (!json_is_string(v)) FAIL(e, "grammar", "'grammar' must be a string (a GBNF grammar)");
        if (json_string_length(v)) gbnf = v; /* (llama-server: "" is none) */
    }
    if ((v = get(b, "response_format"))) {
        const char *t = srv_json_type(v);
        if (!t || (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema")))
            FAIL(e, "response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                       "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": ...}}");
        if (!strcmp(t, "json_object")) {
            schema = get(v, "schema");
            any_object = !schema;
        } else if (!strcmp(t, "json_schema")) {
            json_t *js = get(v, "json_schema");
            if (js && !json_is_object(js)) FAIL(e, "response_format", "'response_format.json_schema' must be an object");
            json_t *x;
            if (js && (x = get(js, "name")) && !json_is_string(x))
                FAIL(e, "response_format", "'response_format.json_schema.name' must be a string");
            if (js && (x = get(js, "strict")) && !json_is_boolean(x))
                FAIL(e, "response_format", "'response_format.json_schema.strict' must be a boolean");
            schema = js && get(js, "schema") ? get(js, "schema") : get(v, "schema"); /* (llama-server: beside type) */
            if (!schema) FAIL(e, "response_format", "'response_format.json_schema.schema' is required");
        }
        j->rf_param = "response_format";
    }
    if ((v = get(b, "json_schema"))) {
        if (schema || any_object) FAIL(e, "json_schema", "give a schema either in 'response_format' or in 'json_schema', not both");
        schema = v;
        j->rf_param = "json_schema";
    }
    if (gbnf) {
        if (schema || any_object)
            FAIL(e, "grammar", "give either a GBNF 'grammar' or a JSON Schema ('%s'), not both", j->rf_param);
        if (!(j->rf_schema = strdup(json_string_value(gbnf)))) FAIL(e, "grammar", "out of memory");
        j->rf_gbnf = 1, j->rf_param = "grammar";
        return 0;
    }
    if (any_object && !(j->rf_schema = strdup("{\"type\":\"object\"}"))) FAIL(e, j->rf_param, "out of memory");
    if (!schema) return 0;
    if (!json_is_object(schema) && !json_is_boolean(schema))
        FAIL(e, j->rf_param, "'%s': a JSON Schema must be an object or a boolean", j->rf_param);
    if (!(j->rf_schema = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY))) FAIL(e, j->rf_param, "out of memory");
    return 0;
}

/* The response format's grammar, after prefix (text the reply must start with: the close of a reasoning block
 * the prompt opened), or none. */
static int settle_grammar(srv *s, srv_job *j, const char *prefix, perr *e) {
    if (!j->rf_schema) return 0;
    if (!s->gvocab) FAIL(e, j->rf_param, "structured output is not available with this model's tokenizer");
    char why[400];
    if (j->rf_gbnf) {
        if (!(j->grammar = srv_grammar_gbnf(s->gcache, j->rf_schema, strlen(j->rf_schema), prefix, why, sizeof why)))
            FAIL(e, "grammar", "'grammar' cannot be used: %s", why);
        return 0;
    }
    osp_grammar_part part = {.prefix = prefix, .schema = j->rf_schema, .schema_len = strlen(j->rf_schema)};
    j->grammar = prefix && *prefix ? srv_grammar_parts(s->gcache, &part, 1, why, sizeof why)
                                   : srv_grammar_schema(s->gcache, part.schema, part.schema_len, why, sizeof why);
    if (!j->grammar) FAIL(e, j->rf_param, "'%s': the JSON Schema cannot be used: %s", j->rf_param, why);
    return 0;
}

/* Tool calls held to the tools' parameter schemas. A forced call (force 1: any of the tools, 2: the function
 * name): what follows the forced opening (forced_opening) is the call's rest in the format's syntax. Not forced
 * (0), with a tool that is strict: each call, from its opening marker on (the grammar's trigger), names a tool
 * and gives its arguments (a strict tool's under its schema, another's any object); the text around is free.
 * Only the JSON formats (and calls without forcing only where a call has an opening marker): Gemma 4's own
 * notation is not JSON Schema's. */
static int tool_grammar(srv *s, srv_job *j, const osp_reply_spec *f, const json_t *tools, const json_t *formats,
                        int force, const char *name, perr *e) {
    if (!s->gvocab || (f->calls != OSP_REPLY_CALLS_JSON_BLOCK && f->calls != OSP_REPLY_CALLS_JSON_REPLY)) return 0;
    size_t nt = json_array_size(tools), n = 0, any = strlen(f->force.any), i;
    json_t *t;
    const char *sep = ""; /* without forcing: what comes between the call's marker and its name */
    if (!force) {
        int strict = 0;
        json_array_foreach(tools, i, t) strict |= json_is_true(json_object_get(json_object_get(t, "function"), "strict"));
        size_t ol = f->tool_open ? strlen(f->tool_open) : 0;
        if (!strict || f->calls != OSP_REPLY_CALLS_JSON_BLOCK || strncmp(f->force.open, f->tool_open, ol)) return 0;
        sep = f->force.open + ol;
        any = 0;
        j->grammar_trigger = f->tool_open;
    }
    osp_grammar_part *alts = calloc(nt ? nt : 1, sizeof *alts);
    char **texts = calloc(nt ? nt * 3 : 1, sizeof *texts);
    srv_buf suffix = {0};
    srv_buf_addf(&suffix, "}%s%s", f->tool_close ? "\n" : "", f->tool_close ? f->tool_close : "");
    int rc = 0;
    if (!alts || !texts || !suffix.p) {
        e->status = 500;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        rc = -1;
    }
    json_array_foreach(tools, i, t) {
        if (rc) break;
        json_t *fn = json_object_get(t, "function");
        const char *fname = json_string_value(json_object_get(fn, "name"));
        if (force == 2 && strcmp(fname, name)) continue;
        json_t *params = get(fn, "parameters");
        if (params && !json_is_object(params) && !json_is_boolean(params)) {
            e->status = 400, e->param = "tools";
            snprintf(e->msg, sizeof e->msg, "tools[%zu]: 'parameters' must be a JSON Schema object", i);
            rc = -1;
            break;
        }
        if (!force && !json_is_true(get(fn, "strict"))) params = NULL; /* any object */
        texts[2 * n] = params ? json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY) : strdup("{\"type\":\"object\"}");
        if (force != 2) { /* the name's text (after the format's `any`, which a forced opening wrote) */
            srv_buf pre = {0};
            srv_buf_addf(&pre, "%s%s%s%s", sep, f->force.name_pre, fname, f->force.name_post);
            texts[2 * n + 1] = pre.p && pre.len >= any ? strdup(pre.p + any) : NULL;
            srv_buf_free(&pre);
        }
        alts[n] = (osp_grammar_part){.prefix = texts[2 * n + 1], .schema = texts[2 * n],
                                     .schema_len = texts[2 * n] ? strlen(texts[2 * n]) : 0, .suffix = suffix.p};
        json_t *fm = force ? json_object_get(formats, fname) : NULL;
        if (fm) { /* a custom tool's grammar: its input, inside the JSON string of {"input": ...} */
            const char *sx = json_string_value(json_object_get(fm, "syntax"));
            json_t *def = json_object_get(fm, "definition");
            srv_buf pre = {0}, suf = {0};
            srv_buf_addf(&pre, "%s{\"input\": \"", texts[2 * n + 1] ? texts[2 * n + 1] : "");
            srv_buf_addf(&suf, "\"}%s", suffix.p ? suffix.p : "");
            free(texts[2 * n + 1]);
            texts[2 * n + 1] = pre.p ? strdup(pre.p) : NULL;
            texts[2 * nt + n] = suf.p ? strdup(suf.p) : NULL;
            srv_buf_free(&pre), srv_buf_free(&suf);
            alts[n] = (osp_grammar_part){.prefix = texts[2 * n + 1], .suffix = texts[2 * nt + n],
                                         .syntax = !strcmp(sx, "lark") ? OSP_GRAMMAR_LARK : OSP_GRAMMAR_REGEX,
                                         .grammar = json_string_value(def), .grammar_len = json_string_length(def)};
        }
        n++;
    }
    if (!rc && n) {
        char why[400];
        j->grammar = srv_grammar_parts(s->gcache, alts, (int)n, why, sizeof why);
        if (!j->grammar) {
            e->status = 400, e->param = "tools";
            snprintf(e->msg, sizeof e->msg, "tools: a function's 'parameters' (or a custom tool's 'format') cannot be used: %s",
                     why);
            rc = -1;
        }
    }
    for (size_t k = 0; texts && k < 3 * nt; k++) free(texts[k]);
    free(texts), free(alts);
    srv_buf_free(&suffix);
    return rc;
}

/* Fields shared by chat and completions. */
static int parse_common(srv *s, const json_t *b, srv_job *j, int32_t *max_tokens, perr *e) {
    osp_sampler_params *sp = &j->gp.sampler;
    int32_t mt = -1, n = 1;
    if (int_field(b, "max_tokens", 1, 1 << 30, &mt, e)) return -1;
    if (int_field(b, "max_completion_tokens", 1, 1 << 30, &mt, e)) return -1;
    if (int_field(b, "n", 1, 1, &n, e)) {
        snprintf(e->msg, sizeof e->msg, "only n = 1 is supported");
        return -1;
    }
    *max_tokens = mt;
    int32_t best_of = 1;
    if (int_field(b, "best_of", 1, 1, &best_of, e)) {
        snprintf(e->msg, sizeof e->msg, "'best_of' is not supported (only 1)");
        return -1;
    }
    int store = 0;
    if (bool_field(b, "store", &store, e)) return -1;
    if (store) FAIL(e, "store", "'store' is not supported: this server keeps no completions");
    if (num_field(b, "temperature", 0, 1e6, &sp->temperature, e)) return -1;
    if (num_field(b, "top_p", 0, 1, &sp->top_p, e)) return -1;
    if (num_field(b, "min_p", 0, 1, &sp->min_p, e)) return -1;
    int32_t tk = -2;
    if (int_field(b, "top_k", -1, 1 << 30, &tk, e)) return -1;
    if (tk != -2) sp->top_k = tk < 0 ? 0 : tk;
    if (num_field(b, "repetition_penalty", 0, 1e6, &sp->repetition_penalty, e)) return -1;
    if (num_field(b, "presence_penalty", -2, 2, &sp->presence_penalty, e)) return -1;
    if (num_field(b, "frequency_penalty", -2, 2, &sp->frequency_penalty, e)) return -1;
    if (int_field(b, "repetition_context_size", 0, 1 << 30, &sp->repetition_context, e)) return -1;
    if (int_field(b, "presence_context_size", 0, 1 << 30, &sp->presence_context, e)) return -1;
    if (int_field(b, "frequency_context_size", 0, 1 << 30, &sp->frequency_context, e)) return -1;
    if (num_field(b, "xtc_probability", 0, 1, &sp->xtc_probability, e)) return -1;
    if (num_field(b, "xtc_threshold", 0, 0.5, &sp->xtc_threshold, e)) return -1;
    json_t *v = get(b, "seed");
    if (v) {
        if (!json_is_integer(v)) FAIL(e, "seed", "'seed' must be an integer");
        sp->seed = (uint64_t)json_integer_value(v);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        sp->seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)j;
    }
    if (bool_field(b, "stream", &j->stream, e)) return -1;
    j->cache_prompt = 1;
    if (bool_field(b, "cache_prompt", &j->cache_prompt, e)) return -1;
    if (bool_field(b, "return_tokens", &j->return_tokens, e)) return -1;
    j->speculative = 1;
    if (bool_field(b, "speculative", &j->speculative, e)) return -1;
    if ((v = get(b, "stream_options"))) {
        if (!json_is_object(v)) FAIL(e, "stream_options", "'stream_options' must be an object");
        if (bool_field(v, "include_usage", &j->include_usage, e)) return -1;
    }
    /* stop: a string or a list of strings */
    if ((v = get(b, "stop"))) {
        size_t ns = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : (size_t)-1;
        if (ns == (size_t)-1) FAIL(e, "stop", "'stop' must be a string or a list of strings");
        if (ns > 16) FAIL(e, "stop", "at most 16 stop strings, got %zu", ns);
        j->stops = calloc(ns + 1, sizeof *j->stops);
        if (!j->stops) FAIL(e, "stop", "out of memory");
        for (size_t i = 0; i < ns; i++) {
            json_t *x = json_is_string(v) ? v : json_array_get(v, i);
            if (!json_is_string(x)) FAIL(e, "stop", "'stop' must be a string or a list of strings");
            if (json_string_length(x) > 1024) FAIL(e, "stop", "stop strings are limited to 1024 bytes");
            j->stops[j->n_stop++] = strdup(json_string_value(x));
        }
        j->gp.stop = (const char *const *)j->stops;
        j->gp.n_stop = j->n_stop;
    }
    /* logit_bias: {"token id": bias} */
    if ((v = get(b, "logit_bias"))) {
        if (!json_is_object(v)) FAIL(e, "logit_bias", "'logit_bias' must be an object of token id → bias");
        size_t nb = json_object_size(v);
        int32_t V = osp_model_get_info(s->model)->vocab;
        if (nb > (size_t)V) FAIL(e, "logit_bias", "'logit_bias' has more entries (%zu) than the vocabulary", nb);
        j->bias = calloc(nb + 1, sizeof *j->bias);
        if (!j->bias) FAIL(e, "logit_bias", "out of memory");
        const char *key;
        json_t *x;
        int32_t k = 0;
        json_object_foreach(v, key, x) {
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id >= V)
                FAIL(e, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)", key, V);
            if (!json_is_number(x) || !(fabs(json_number_value(x)) <= 100))
                FAIL(e, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
            j->bias[k].token = (int32_t)id;
            j->bias[k++].bias = (float)json_number_value(x);
        }
        j->gp.sampler.logit_bias = j->bias;
        j->gp.sampler.n_logit_bias = k;
    }
    return response_format(b, j, e);
}

/* Tokens of the prompt fit the context; settle max_tokens. */
static int fit_context(srv *s, srv_job *j, int32_t max_tokens, perr *e) {
    if (j->n_prompt <= 0) FAIL(e, NULL, "the prompt is empty");
    if (j->n_prompt >= s->ctx) {
        e->why = (srv_reject){SRV_REJECT_OVER_CONTEXT, j->n_prompt, s->ctx};
        FAIL(e, NULL, "the prompt has %d tokens; the context holds %d", j->n_prompt, s->ctx);
    }
    if (max_tokens > 0 && (int64_t)j->n_prompt + max_tokens > s->ctx)
        FAIL(e, "max_tokens", "the prompt (%d tokens) plus max_tokens (%d) exceeds the context of %d tokens",
             j->n_prompt, max_tokens, s->ctx);
    if (max_tokens <= 0) {
        max_tokens = s->cfg.max_tokens > 0 ? s->cfg.max_tokens : 512;
        if (max_tokens > s->ctx - j->n_prompt) max_tokens = s->ctx - j->n_prompt;
    }
    j->gp.max_tokens = max_tokens;
    return 0;
}

static srv_job *fail_job(srv_job *j, perr *e, int *status, json_t **err) {
    *status = e->status ? e->status : 400;
    *err = srv_error_json(*status, e->msg, e->param);
    srv_job_release(j);
    return NULL;
}

/* OpenAI message content → a plain string (text parts joined). */
static int content_text(const json_t *c, srv_buf *out, perr *e) {
    if (json_is_string(c)) return srv_buf_add(out, json_string_value(c), json_string_length(c));
    if (!json_is_array(c)) FAIL(e, "messages", "message content must be a string or a list of parts");
    size_t i;
    json_t *p;
    json_array_foreach(c, i, p) {
        json_t *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (json_is_string(p)) {
            srv_buf_add(out, json_string_value(p), json_string_length(p));
            continue;
        }
        if (!json_is_string(t)) FAIL(e, "messages", "content parts must be objects with a 'type'");
        if (strcmp(json_string_value(t), "text") && strcmp(json_string_value(t), "input_text"))
            FAIL(e, "messages", "content part type '%.40s' is not supported (this model takes text only)",
                 json_string_value(t));
        json_t *x = json_object_get(p, "text");
        if (!json_is_string(x)) FAIL(e, "messages", "a text part needs a string 'text'");
        srv_buf_add(out, json_string_value(x), json_string_length(x));
    }
    return 0;
}

/* The messages as the template expects them. */
static json_t *normalize_messages(const json_t *msgs, perr *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        e->status = 400;
        e->param = "messages";
        snprintf(e->msg, sizeof e->msg, "'messages' must be a non-empty list");
        return NULL;
    }
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        static const char *roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
        json_t *r = json_is_object(m) ? json_object_get(m, "role") : NULL;
        const char *role = json_is_string(r) ? json_string_value(r) : NULL;
        int ok = 0;
        for (size_t k = 0; role && k < sizeof roles / sizeof *roles; k++) ok |= !strcmp(role, roles[k]);
        if (!ok) {
            e->status = 400;
            e->param = "messages";
            snprintf(e->msg, sizeof e->msg, "messages[%zu]: 'role' must be one of system, developer, user, assistant, tool", i);
            json_decref(out);
            return NULL;
        }
        json_t *nm = json_object();
        json_object_set_new(nm, "role", json_string(!strcmp(role, "developer") ? "system" : !strcmp(role, "function") ? "tool" : role));
        json_t *c = json_object_get(m, "content");
        if (c && !json_is_null(c)) {
            srv_buf t = {0};
            if (content_text(c, &t, e)) {
                srv_buf_free(&t);
                json_decref(nm);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(nm, "content", json_stringn(t.p ? t.p : "", t.len));
            srv_buf_free(&t);
        } else if (!json_object_get(m, "tool_calls")) {
            if (strcmp(role, "assistant")) {
                e->status = 400;
                e->param = "messages";
                snprintf(e->msg, sizeof e->msg, "messages[%zu] has no content", i);
                json_decref(nm);
                json_decref(out);
                return NULL;
            }
            json_object_set_new(nm, "content", json_string(""));
        } else { /* "", not null: Qwen 3's template tests '</think>' in content, an error on None (llama.cpp's
                  * templates get the same polyfill); templates that test the content's truth see no difference */
            json_object_set_new(nm, "content", json_string(""));
        }
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)m, key, v) {
            if (!strcmp(key, "role") || !strcmp(key, "content")) continue;
            if (!strcmp(key, "tool_calls") && json_is_array(v)) {
                /* arguments arrive as a JSON string; templates want the object */
                json_t *tc = json_deep_copy(v);
                size_t q;
                json_t *call;
                json_array_foreach(tc, q, call) {
                    json_t *cu = json_object_get(call, "custom"), *in = json_object_get(cu, "input");
                    if (json_is_object(cu) && json_is_string(json_object_get(cu, "name")) && json_is_string(in)) {
                        /* chat's custom tool call: the function of {"input"} the template was offered */
                        json_object_set_new(call, "function", json_pack("{s:O,s:{s:O}}", "name", json_object_get(cu, "name"),
                                                                        "arguments", "input", in));
                        json_object_set_new(call, "type", json_string("function"));
                        json_object_del(call, "custom");
                        continue;
                    }
                    json_t *f = json_object_get(call, "function");
                    json_t *a = f ? json_object_get(f, "arguments") : NULL;
                    if (json_is_string(a)) {
                        json_t *obj = json_loads(json_string_value(a), JSON_DECODE_ANY, NULL);
                        if (json_is_object(obj)) json_object_set_new(f, "arguments", obj);
                        else json_decref(obj);
                    }
                }
                json_object_set_new(nm, key, tc);
            } else {
                json_object_set(nm, key, v);
            }
        }
        json_array_append_new(out, nm);
    }
    return out;
}

/* Tools as given, unless tool_choice is "none"; *force: 0 auto, 1 required,
 * 2 the function *name. Returns a borrowed ref in *tools or NULL. */
static int pick_tools(const json_t *b, const json_t **tools, int *force, const char **name, perr *e) {
    *tools = NULL;
    *force = 0;
    *name = NULL;
    json_t *t = get(b, "tools"), *c = get(b, "tool_choice");
    if (t && !json_is_array(t)) FAIL(e, "tools", "'tools' must be a list");
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x) {
        json_t *f = json_is_object(x) ? json_object_get(x, "function") : NULL;
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            FAIL(e, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
    }
    if (c) {
        const char *cs = json_is_string(c) ? json_string_value(c) : NULL;
        if (cs && strcmp(cs, "none") && strcmp(cs, "auto") && strcmp(cs, "required"))
            FAIL(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
        if (!cs) {
            json_t *f = json_is_object(c) ? json_object_get(c, "function") : NULL;
            json_t *fn = json_is_object(f) ? json_object_get(f, "name") : NULL;
            if (!json_is_string(fn))
                FAIL(e, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            *name = json_string_value(fn);
        }
        if ((!cs || strcmp(cs, "none")) && !json_array_size(t))
            FAIL(e, "tool_choice", "'tool_choice' is only allowed when 'tools' are given");
        if (cs && !strcmp(cs, "none")) return 0;
        if (cs && !strcmp(cs, "required")) *force = 1;
        if (*name) {
            int found = 0;
            json_array_foreach(t, i, x) found |= !strcmp(json_string_value(json_object_get(json_object_get(x, "function"), "name")), *name);
            if (!found) FAIL(e, "tool_choice", "'tool_choice' names '%.100s', which is not among 'tools'", *name);
            for (const char *q = *name; *q; q++) /* it is written into the reply's opening */
                if (!(isalnum((unsigned char)*q) || *q == '_' || *q == '-' || *q == '.'))
                    FAIL(e, "tool_choice", "a forced function's name may only hold letters, digits, '_', '-' and '.'");
            *force = 2;
        }
    }
    if (json_array_size(t)) *tools = t;
    return 0;
}

/* The text a forced tool call's reply starts with, in the model family's
 * format (after closing an open reasoning block); NULL when the format has
 * no tool calls. */
static char *forced_opening(const osp_reply_spec *f, int in_reasoning, int force, const char *name) {
    if (f->calls == OSP_REPLY_CALLS_NONE) return NULL;
    srv_buf b = {0};
    if (in_reasoning && f->force.close_think) srv_buf_addf(&b, "%s", f->force.close_think);
    srv_buf_addf(&b, "%s", f->force.open);
    if (force == 2) srv_buf_addf(&b, "%s%s%s", f->force.name_pre, name, f->force.name_post);
    else srv_buf_addf(&b, "%s", f->force.any);
    return b.p;
}

/* chat_template_kwargs (+ reasoning_effort "none" → enable_thinking false). */
static int template_extra(const json_t *b, json_t **extra, perr *e) {
    *extra = NULL;
    json_t *k = get(b, "chat_template_kwargs");
    if (k && !json_is_object(k)) FAIL(e, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    json_t *x = k ? json_deep_copy(k) : json_object();
    json_t *re = get(b, "reasoning_effort");
    if (re && !json_is_string(re)) {
        json_decref(x);
        FAIL(e, "reasoning_effort", "'reasoning_effort' must be a string");
    }
    if (re && !json_object_get(x, "enable_thinking"))
        json_object_set_new(x, "enable_thinking", json_boolean(strcmp(json_string_value(re), "none") != 0));
    *extra = x;
    return 0;
}

static int render(srv *s, const json_t *b, char **text, size_t *len, const json_t **tools_out, int *force,
                  const char **force_name, perr *e) {
    if (!s->tmpl) {
        e->status = 400;
        snprintf(e->msg, sizeof e->msg, "this model has no chat template (use /v1/completions or --chat-template)");
        return -1;
    }
    json_t *msgs = normalize_messages(get(b, "messages"), e);
    if (!msgs) return -1;
    const json_t *tools;
    json_t *extra = NULL;
    int fc = 0;
    const char *fname = NULL;
    if (pick_tools(b, &tools, &fc, &fname, e) || template_extra(b, &extra, e)) {
        json_decref(msgs);
        return -1;
    }
    osp_status rc = osp_chat_template_render(s->tmpl, msgs, tools, 1, extra, NULL, text, len);
    json_decref(msgs);
    json_decref(extra);
    if (rc != OSP_OK) {
        e->status = 400;
        snprintf(e->msg, sizeof e->msg, "chat template: %s", osp_last_error());
        return -1;
    }
    if (tools_out) *tools_out = tools;
    if (force) *force = fc, *force_name = fname;
    return 0;
}

/* A job of this kind with the fields both endpoints share; NULL with
 * *status / *err set on failure. */
static srv_job *begin_job(srv *s, const json_t *b, srv_kind kind, int32_t *max_tokens, int *status, json_t **err) {
    perr e = {0};
    srv_job *j = job_new(s);
    if (!j) {
        *status = 500;
        *err = srv_error_json(500, "out of memory", NULL);
        return NULL;
    }
    j->kind = kind;
    if (!json_is_object(b)) {
        e.status = 400;
        snprintf(e.msg, sizeof e.msg, "the body must be a JSON object");
        return fail_job(j, &e, status, err);
    }
    if (parse_common(s, b, j, max_tokens, &e)) return fail_job(j, &e, status, err);
    return j;
}

/* count_only: the prompt is tokenized and counted, and may be longer than the
 * context (a count, not a generation: count_tokens). *why (not NULL): why
 * the prompt did not fit. */
static int type_is(const json_t *o, const char *t) {
    const char *v = json_string_value(json_object_get(o, "type"));
    return v && !strcmp(v, t);
}

/* A custom tool's grammar format: "" when it is good (*sx its syntax, *def its text), else why not in msg. */
static void custom_format(srv *s, const json_t *f, const char *at, const char **sx, json_t **def, char *msg, size_t cap) {
    const json_t *g = json_is_object(get(f, "grammar")) ? get(f, "grammar") : f; /* chat nests it; responses does not */
    const char *where = g == f ? "" : ".grammar";
    *sx = json_string_value(json_object_get(g, "syntax"));
    *def = json_object_get(g, "definition");
    if (!*sx || (strcmp(*sx, "lark") && strcmp(*sx, "regex"))) {
        snprintf(msg, cap, "%s.format%s.syntax must be \"lark\" or \"regex\"", at, where);
        return;
    }
    if (!json_is_string(*def)) {
        snprintf(msg, cap, "%s.format%s.definition must be a string (the grammar)", at, where);
        return;
    }
    char why[400];
    osp_grammar_part part = {.syntax = **sx == 'l' ? OSP_GRAMMAR_LARK : OSP_GRAMMAR_REGEX,
                             .grammar = json_string_value(*def), .grammar_len = json_string_length(*def)};
    srv_grammar *sg = srv_grammar_parts(s->gcache, &part, 1, why, sizeof why); /* (cached for the forced call) */
    if (!sg) snprintf(msg, cap, "%s.format%s.definition: the %s grammar cannot be used: %.300s", at, where, *sx, why);
    srv_grammar_release(sg);
}

/* Custom tools (chat's {"type": "custom", "custom": {"name", "description", "format"}}, or the responses
 * API's flat {"type": "custom", "name", ...}) as functions of {"input": string}, the chat template's shape;
 * their formats that are grammars in *formats (name -> {"syntax", "definition"}), each compiled here so that a
 * bad one is a 400 even where no call is forced; their names in *names (name -> true). *norm: b with those
 * tools (and a tool_choice naming a custom tool as a function), NULL when b has no custom tool. */
static int custom_tools(srv *s, const json_t *b, json_t **norm, json_t **formats, json_t **names, perr *e) {
    *norm = *formats = *names = NULL;
    json_t *t = get(b, "tools"), *x;
    size_t i;
    int any = 0;
    json_array_foreach(t, i, x) any |= type_is(x, "custom");
    if (!any) return 0;
    json_t *out = json_array(), *fm = json_object(), *nm = json_object();
    char msg[sizeof e->msg], at[64];
    msg[0] = 0;
    json_array_foreach(t, i, x) {
        if (!type_is(x, "custom")) {
            json_array_append(out, x);
            continue;
        }
        json_t *c = json_is_object(get(x, "custom")) ? get(x, "custom") : x;
        snprintf(at, sizeof at, "tools[%zu]%s", i, c == x ? "" : ".custom");
        json_t *n = json_object_get(c, "name"), *d = get(c, "description"), *f = get(c, "format"), *def = NULL;
        const char *sx = NULL;
        if (!json_is_string(n)) snprintf(msg, sizeof msg, "%s: a custom tool needs a string 'name'", at);
        else if (json_object_get(nm, json_string_value(n)))
            snprintf(msg, sizeof msg, "%s: two custom tools are named '%.60s'", at, json_string_value(n));
        else if (d && !json_is_string(d)) snprintf(msg, sizeof msg, "%s: 'description' must be a string", at);
        else if (f && !json_is_object(f)) snprintf(msg, sizeof msg, "%s.format must be an object", at);
        else if (f && type_is(f, "grammar")) custom_format(s, f, at, &sx, &def, msg, sizeof msg);
        else if (f && !type_is(f, "text")) snprintf(msg, sizeof msg, "%s.format.type must be \"text\" or \"grammar\"", at);
        if (msg[0]) break;
        json_object_set_new(nm, json_string_value(n), json_true());
        if (sx) json_object_set_new(fm, json_string_value(n), json_pack("{s:s,s:O}", "syntax", sx, "definition", def));
        json_t *fn = json_pack("{s:O,s:{s:s,s:{s:{s:s}},s:[s]}}", "name", n, "parameters", "type", "object",
                               "properties", "input", "type", "string", "required", "input");
        if (d) json_object_set(fn, "description", d);
        json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    if (msg[0]) {
        json_decref(out), json_decref(fm), json_decref(nm);
        FAIL(e, "tools", "%s", msg);
    }
    *norm = json_copy((json_t *)b);
    json_object_set_new(*norm, "tools", out);
    json_t *tc = get(b, "tool_choice"), *cn = json_object_get(get(tc, "custom"), "name");
    if (type_is(tc, "custom") && json_is_string(cn))
        json_object_set_new(*norm, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", cn));
    *formats = fm, *names = nm;
    return 0;
}

static srv_job *parse_chat_tools(srv *s, const json_t *b, const json_t *formats, int count_only, int *status,
                                 json_t **err, srv_reject *why);

static srv_job *parse_chat(srv *s, const json_t *b, int count_only, int *status, json_t **err, srv_reject *why) {
    perr e = {0};
    json_t *norm = NULL, *formats = NULL, *names = NULL;
    if (json_is_object(b) && custom_tools(s, b, &norm, &formats, &names, &e)) {
        *status = e.status ? e.status : 400;
        *err = srv_error_json(*status, e.msg, e.param);
        return NULL;
    }
    srv_job *j = parse_chat_tools(s, norm ? norm : b, formats, count_only, status, err, why);
    json_decref(norm), json_decref(formats);
    if (j) j->custom_tools = names;
    else json_decref(names);
    return j;
}

static srv_job *parse_chat_tools(srv *s, const json_t *b, const json_t *formats, int count_only, int *status,
                                 json_t **err, srv_reject *why) {
    perr e = {0};
    int32_t max_tokens;
    srv_job *j = begin_job(s, b, SRV_CHAT, &max_tokens, status, err);
    if (!j) return NULL;
    json_t *v = get(b, "logprobs");
    if (v && !json_is_boolean(v)) {
        e.status = 400, e.param = "logprobs";
        snprintf(e.msg, sizeof e.msg, "'logprobs' must be a boolean");
        return fail_job(j, &e, status, err);
    }
    j->logprobs = json_is_true(v);
    int32_t tl = 0;
    if (int_field(b, "top_logprobs", 0, 20, &tl, &e)) return fail_job(j, &e, status, err);
    j->top_logprobs = tl;
    int ptc = 1;
    if (bool_field(b, "parallel_tool_calls", &ptc, &e)) return fail_job(j, &e, status, err);
    j->parallel_tools = ptc;
    char *text = NULL;
    size_t len = 0;
    const json_t *tools = NULL;
    int force = 0;
    const char *force_name = NULL;
    if (render(s, b, &text, &len, &tools, &force, &force_name, &e)) return fail_job(j, &e, status, err);
    const osp_reply_spec *fmt = osp_reply_spec_of(s->fmt);
    j->fmt = s->fmt;
    j->parse_tools = tools != NULL && fmt->calls != OSP_REPLY_CALLS_NONE;
    j->parse_reasoning = fmt->think_open != NULL;
    j->start_in_reasoning = j->parse_reasoning && osp_reply_prompt_opens_reasoning(s->fmt, text, len);
    if (force) { /* the reply starts with the format's tool-call opening: the model goes on from there */
        j->forced = forced_opening(fmt, j->start_in_reasoning, force, force_name);
        if (!j->forced) {
            osp_free(text);
            e.status = 400, e.param = "tool_choice";
            snprintf(e.msg, sizeof e.msg, "this model's chat template has no tool-call format: tool_choice '%s' "
                     "cannot be honoured", force == 2 ? "function" : "required");
            return fail_job(j, &e, status, err);
        }
        size_t fl = strlen(j->forced);
        char *t2 = osp_malloc(OSP_POOL_MISC, len + fl + 1);
        if (!t2) {
            osp_free(text);
            e.status = 500;
            snprintf(e.msg, sizeof e.msg, "out of memory");
            return fail_job(j, &e, status, err);
        }
        memcpy(t2, text, len), memcpy(t2 + len, j->forced, fl + 1);
        osp_free(text);
        text = t2, len += fl;
        /* a forced call is the whole reply: its grammar replaces a response format's */
        free(j->rf_schema);
        j->rf_schema = NULL, j->rf_gbnf = 0;
        if (tool_grammar(s, j, fmt, tools, formats, force, force_name, &e)) {
            osp_free(text);
            return fail_job(j, &e, status, err);
        }
    } else if (settle_grammar(s, j, j->start_in_reasoning ? fmt->force.close_think : NULL, &e) ||
               (!j->grammar && tools && tool_grammar(s, j, fmt, tools, formats, 0, NULL, &e))) {
        osp_free(text);
        return fail_job(j, &e, status, err);
    }
    size_t n = 0;
    osp_status rc = osp_tokenizer_encode_alloc(s->tok, text, len, 0, &j->prompt, &n);
    /* markers that are special tokens (Gemma 4's) stay in the text for the parser */
    if (fmt->special_markers && (j->parse_tools || j->parse_reasoning)) j->gp.skip_special = 0;
    osp_free(text);
    if (rc != OSP_OK) {
        e.status = 400;
        snprintf(e.msg, sizeof e.msg, "tokenizer: %s", osp_last_error());
        return fail_job(j, &e, status, err);
    }
    j->n_prompt = (int32_t)n;
    if (!count_only && fit_context(s, j, max_tokens, &e)) {
        if (why) *why = e.why;
        return fail_job(j, &e, status, err);
    }
    srv_make_id(j->id, sizeof j->id, "chatcmpl");
    return j;
}

srv_job *srv_parse_chat(srv *s, const json_t *b, int *status, json_t **err) {
    return parse_chat(s, b, 0, status, err, NULL);
}

srv_job *srv_parse_count(srv *s, json_t *chat, int *status, json_t **err) {
    srv_job *j = parse_chat(s, chat, 1, status, err, NULL);
    json_decref(chat);
    return j;
}

srv_job *srv_parse_translated(srv *s, json_t *chat, int32_t max_tokens, int *status, json_t **err, srv_reject *why) {
    srv_job *j = parse_chat(s, chat, 0, status, err, why);
    json_decref(chat);
    int32_t room = j ? s->ctx - j->n_prompt : 0; /* fit_context left at least one token */
    if (j && max_tokens > 0) j->gp.max_tokens = max_tokens < room ? max_tokens : room;
    return j;
}

srv_job *srv_parse_completion(srv *s, const json_t *b, int *status, json_t **err) {
    perr e = {0};
    int32_t max_tokens;
    srv_job *j = begin_job(s, b, SRV_COMPLETION, &max_tokens, status, err);
    if (!j) return NULL;
    int32_t lp = -1;
    if (int_field(b, "logprobs", 0, 20, &lp, &e)) return fail_job(j, &e, status, err);
    j->logprobs = lp >= 0;
    j->top_logprobs = lp > 0 ? lp : 0;
    int echo = 0;
    if (bool_field(b, "echo", &echo, &e)) return fail_job(j, &e, status, err);
    if (echo) {
        e.status = 400, e.param = "echo";
        snprintf(e.msg, sizeof e.msg, "'echo' is not supported");
        return fail_job(j, &e, status, err);
    }
    json_t *sfx = get(b, "suffix");
    if (sfx && (!json_is_string(sfx) || json_string_length(sfx))) {
        e.status = 400, e.param = "suffix";
        snprintf(e.msg, sizeof e.msg, "'suffix' is not supported (no fill-in-the-middle)");
        return fail_job(j, &e, status, err);
    }
    json_t *p = get(b, "prompt");
    /* a one-element batch is the same as its element */
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    int32_t V = osp_model_get_info(s->model)->vocab;
    if (json_is_string(p)) {
        size_t n = 0;
        if (osp_tokenizer_encode_alloc(s->tok, json_string_value(p), json_string_length(p), 1, &j->prompt, &n) !=
            OSP_OK) {
            e.status = 400;
            snprintf(e.msg, sizeof e.msg, "tokenizer: %s", osp_last_error());
            return fail_job(j, &e, status, err);
        }
        j->n_prompt = (int32_t)n;
    } else if (json_is_array(p)) {
        size_t n = json_array_size(p);
        j->prompt = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (n ? n : 1));
        if (!j->prompt) {
            e.status = 500;
            snprintf(e.msg, sizeof e.msg, "out of memory");
            return fail_job(j, &e, status, err);
        }
        for (size_t i = 0; i < n; i++) {
            json_t *x = json_array_get(p, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= V) {
                e.status = 400, e.param = "prompt";
                snprintf(e.msg, sizeof e.msg,
                         json_is_array(x) || json_is_string(x) ? "only one prompt per request is supported"
                                                               : "'prompt' token ids must be integers in [0, %d)",
                         V);
                return fail_job(j, &e, status, err);
            }
            j->prompt[i] = (int32_t)json_integer_value(x);
        }
        j->n_prompt = (int32_t)n;
    } else {
        e.status = 400, e.param = "prompt";
        snprintf(e.msg, sizeof e.msg, "'prompt' must be a string or a list of token ids");
        return fail_job(j, &e, status, err);
    }
    if (fit_context(s, j, max_tokens, &e) || settle_grammar(s, j, NULL, &e)) return fail_job(j, &e, status, err);
    srv_make_id(j->id, sizeof j->id, "cmpl");
    return j;
}

json_t *srv_apply_template(srv *s, const json_t *b, int *status) {
    perr e = {0};
    char *text = NULL;
    size_t len = 0;
    if (!json_is_object(b)) {
        *status = 400;
        return srv_error_json(400, "the body must be a JSON object", NULL);
    }
    if (render(s, b, &text, &len, NULL, NULL, NULL, &e)) {
        *status = e.status ? e.status : 400;
        return srv_error_json(*status, e.msg, e.param);
    }
    json_t *o = json_object();
    json_object_set_new(o, "prompt", json_stringn(text, len));
    osp_free(text);
    *status = 200;
    return o;
}
