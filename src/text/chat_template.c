/* text/chat_template: find, parse and render a model's chat template (see
 * chat_template.h). Named templates are all parsed at load, so a broken
 * one is reported when the model is loaded, naming it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "core/fs.h"
#include "text/chat_template.h"

#define MAX_TEMPLATE_FILE ((size_t)16 << 20)
#define MAX_NAMED 16

typedef struct named_template {
    char *name;
    osp_jinja_template *t;
} named_template;

struct osp_chat_template {
    named_template named[MAX_NAMED];
    int n_named;
    char *bos, *eos;
    char *source; /* every named template's source, joined by newlines */
    size_t source_len;
};

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = osp_malloc(OSP_POOL_MISC, n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

static osp_status read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return osp_err(OSP_ERR_IO, "%s: cannot open", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 65536 * 2;
            char *b = osp_malloc(OSP_POOL_MISC, nc);
            if (!b) { osp_free(buf); fclose(f); return osp_err(OSP_ERR_NOMEM, "%s: out of memory", path); }
            if (n) memcpy(b, buf, n);
            osp_free(buf);
            buf = b;
            cap = nc;
        }
        size_t k = fread(buf + n, 1, 65536, f);
        n += k;
        if (n > MAX_TEMPLATE_FILE) {
            osp_free(buf);
            fclose(f);
            return osp_err(OSP_ERR_RANGE, "%s: larger than %zu MiB", path, MAX_TEMPLATE_FILE >> 20);
        }
        if (k < 65536) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { osp_free(buf); return osp_err(OSP_ERR_IO, "%s: read error", path); }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return OSP_OK;
}

/* A Hugging Face cache repo folder resolves to its snapshot; else the path. */
static void resolve_dir(const char *path, char *out, size_t n) {
    if (!osp_hf_snapshot(path, out, n)) snprintf(out, n, "%s", path);
}

static osp_status add_named(osp_chat_template *ct, const char *name, const char *src, size_t len,
                            const char *where) {
    if (ct->n_named == MAX_NAMED) return osp_err(OSP_ERR_UNSUPPORTED, "%s: more than %d named chat templates", where, MAX_NAMED);
    named_template *nt = &ct->named[ct->n_named];
    osp_status st = osp_jinja_parse(src, len, &nt->t);
    if (st != OSP_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        if (strcmp(name, "default")) return osp_err(st, "%s (chat template '%s'): %s", where, name, msg);
        return osp_err(st, "%s: %s", where, msg);
    }
    nt->name = dup_str(name);
    char *joined = osp_malloc(OSP_POOL_MISC, ct->source_len + len + 2);
    if (!nt->name || !joined) {
        osp_jinja_free(nt->t);
        osp_free(nt->name);
        osp_free(joined);
        return osp_err(OSP_ERR_NOMEM, "out of memory");
    }
    if (ct->source_len) memcpy(joined, ct->source, ct->source_len);
    joined[ct->source_len] = '\n';
    memcpy(joined + ct->source_len + 1, src, len);
    ct->source_len += len + 1;
    joined[ct->source_len] = 0;
    osp_free(ct->source);
    ct->source = joined;
    ct->n_named++;
    return OSP_OK;
}

/* "chat_template" of a JSON config: a string or [{"name", "template"}]. */
static osp_status add_from_json(osp_chat_template *ct, const json_t *tpl, const char *where) {
    if (json_is_string(tpl))
        return add_named(ct, "default", json_string_value(tpl), json_string_length(tpl), where);
    if (!json_is_array(tpl) || !json_array_size(tpl))
        return osp_err(OSP_ERR_FORMAT, "%s: chat_template must be a string or a list of {name, template}", where);
    size_t i;
    json_t *e;
    json_array_foreach(tpl, i, e) {
        json_t *name = json_object_get(e, "name"), *src = json_object_get(e, "template");
        if (!json_is_string(name) || !json_is_string(src))
            return osp_err(OSP_ERR_FORMAT, "%s: chat_template[%zu] needs string 'name' and 'template'", where, i);
        OSP_TRY(add_named(ct, json_string_value(name), json_string_value(src), json_string_length(src), where));
    }
    return OSP_OK;
}

/* bos_token / eos_token: a string, an AddedToken {"content": ...}, or null. */
static osp_status read_token(const json_t *cfg, const char *key, char **out, int *seen, const char *where) {
    json_t *v = json_object_get(cfg, key);
    if (!v) return OSP_OK;
    *seen = 1;
    if (json_is_null(v)) return OSP_OK;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return osp_err(OSP_ERR_FORMAT, "%s: %s must be a string or {\"content\": string}", where, key);
    *out = dup_str(json_string_value(v));
    return *out ? OSP_OK : osp_err(OSP_ERR_NOMEM, "out of memory");
}

/* Configs may hold integers beyond 64 bits (Llama 3's model_max_length):
 * only strings are read here, so numbers are decoded as reals. */
static osp_status load_json(const char *path, json_t **out) {
    json_error_t e;
    *out = json_load_file(path, JSON_DECODE_INT_AS_REAL, &e);
    if (!*out) return osp_err(OSP_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, e.line, e.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return osp_err(OSP_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return OSP_OK;
}

static osp_status load_into(osp_chat_template *ct, const char *model_dir, const char *template_file) {
    char dir[4096] = "", p[4200];
    json_t *cfg = NULL;
    osp_status st = OSP_OK;
    if (model_dir) {
        if (!osp_is_dir(model_dir)) return osp_err(OSP_ERR_IO, "%s: no such model folder", model_dir);
        resolve_dir(model_dir, dir, sizeof dir);
        snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
        if (osp_is_file(p)) OSP_TRY(load_json(p, &cfg));
    }
    if (cfg) {
        int seen_bos = 0, seen_eos = 0;
        st = read_token(cfg, "bos_token", &ct->bos, &seen_bos, p);
        if (st == OSP_OK) st = read_token(cfg, "eos_token", &ct->eos, &seen_eos, p);
        char sp[4200];
        snprintf(sp, sizeof sp, "%s/special_tokens_map.json", dir);
        if (st == OSP_OK && (!seen_bos || !seen_eos) && osp_is_file(sp)) {
            json_t *map;
            st = load_json(sp, &map);
            if (st == OSP_OK) {
                int dummy = 0;
                if (!seen_bos) st = read_token(map, "bos_token", &ct->bos, &dummy, sp);
                if (st == OSP_OK && !seen_eos) st = read_token(map, "eos_token", &ct->eos, &dummy, sp);
                json_decref(map);
            }
        }
        if (st != OSP_OK) { json_decref(cfg); return st; }
    }
    char *src = NULL;
    size_t len = 0;
    const char *file = template_file;
    char jinja[4200], cjson[4200];
    if (!file && model_dir) {
        snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", dir);
        snprintf(cjson, sizeof cjson, "%s/chat_template.json", dir);
        if (osp_is_file(jinja)) file = jinja;
    }
    if (file) {
        st = read_file(file, &src, &len);
        if (st == OSP_OK) st = add_named(ct, "default", src, len, file);
        osp_free(src);
    } else if (model_dir && osp_is_file(cjson)) {
        json_t *j;
        st = load_json(cjson, &j);
        if (st == OSP_OK) {
            json_t *tpl = json_object_get(j, "chat_template");
            st = tpl ? add_from_json(ct, tpl, cjson) : osp_err(OSP_ERR_FORMAT, "%s: no \"chat_template\"", cjson);
            json_decref(j);
        }
    } else if (cfg && json_object_get(cfg, "chat_template") && !json_is_null(json_object_get(cfg, "chat_template"))) {
        st = add_from_json(ct, json_object_get(cfg, "chat_template"), p);
    } else if (model_dir) {
        st = osp_err(OSP_ERR_UNSUPPORTED,
                     "%s: no chat template (no chat_template.jinja, and tokenizer_config.json has no chat_template); "
                     "pass one with --chat-template FILE", model_dir);
    } else {
        st = osp_err(OSP_ERR_INVALID, "no model folder and no chat template file given");
    }
    json_decref(cfg);
    return st;
}

osp_status osp_chat_template_load(const char *model_dir, const char *template_file, osp_chat_template **out) {
    *out = NULL;
    osp_chat_template *ct = osp_calloc(OSP_POOL_MISC, sizeof *ct);
    if (!ct) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_status st = load_into(ct, model_dir, template_file);
    if (st != OSP_OK) { osp_chat_template_free(ct); return st; }
    *out = ct;
    return OSP_OK;
}

osp_status osp_chat_template_new(const char *source, size_t len, const char *bos_token, const char *eos_token,
                                 osp_chat_template **out) {
    *out = NULL;
    osp_chat_template *ct = osp_calloc(OSP_POOL_MISC, sizeof *ct);
    if (!ct) return osp_err(OSP_ERR_NOMEM, "out of memory");
    osp_status st = add_named(ct, "default", source, len, "chat template");
    if (st == OSP_OK && bos_token && !(ct->bos = dup_str(bos_token))) st = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (st == OSP_OK && eos_token && !(ct->eos = dup_str(eos_token))) st = osp_err(OSP_ERR_NOMEM, "out of memory");
    if (st != OSP_OK) { osp_chat_template_free(ct); return st; }
    *out = ct;
    return OSP_OK;
}

void osp_chat_template_free(osp_chat_template *ct) {
    if (!ct) return;
    for (int i = 0; i < ct->n_named; i++) {
        osp_jinja_free(ct->named[i].t);
        osp_free(ct->named[i].name);
    }
    osp_free(ct->bos);
    osp_free(ct->eos);
    osp_free(ct->source);
    osp_free(ct);
}

const char *osp_chat_template_source(const osp_chat_template *ct) { return ct->source ? ct->source : ""; }

const char *osp_chat_template_bos(const osp_chat_template *ct) { return ct ? ct->bos : NULL; }
const char *osp_chat_template_eos(const osp_chat_template *ct) { return ct ? ct->eos : NULL; }

static const osp_jinja_template *pick(const osp_chat_template *ct, int have_tools) {
    const osp_jinja_template *dflt = NULL;
    for (int i = 0; i < ct->n_named; i++) {
        if (have_tools && !strcmp(ct->named[i].name, "tool_use")) return ct->named[i].t;
        if (!strcmp(ct->named[i].name, "default")) dflt = ct->named[i].t;
    }
    return dflt;
}

osp_status osp_chat_template_render(const osp_chat_template *ct, const json_t *messages, const json_t *tools,
                                    int add_generation_prompt, const json_t *extra,
                                    const osp_jinja_options *opt, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!ct) return osp_err(OSP_ERR_INVALID, "no chat template");
    if (!json_is_array(messages)) return osp_err(OSP_ERR_INVALID, "messages must be a JSON array");
    if (tools && !json_is_null(tools) && !json_is_array(tools)) return osp_err(OSP_ERR_INVALID, "tools must be a JSON array");
    if (extra && !json_is_object(extra)) return osp_err(OSP_ERR_INVALID, "extra template variables must be a JSON object");
    if (tools && json_is_null(tools)) tools = NULL;
    const osp_jinja_template *t = pick(ct, tools != NULL);
    if (!t)
        return osp_err(OSP_ERR_UNSUPPORTED,
                       "this model has several chat templates and none is named 'default'; pass one with --chat-template");
    json_t *vars = json_object();
    if (!vars) return osp_err(OSP_ERR_NOMEM, "out of memory");
    int bad = json_object_set(vars, "messages", (json_t *)messages);
    bad |= json_object_set_new(vars, "tools", tools ? json_incref((json_t *)tools) : json_null());
    bad |= json_object_set_new(vars, "documents", json_null());
    bad |= json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    if (ct->bos) bad |= json_object_set_new(vars, "bos_token", json_string(ct->bos));
    if (ct->eos) bad |= json_object_set_new(vars, "eos_token", json_string(ct->eos));
    if (extra) bad |= json_object_update(vars, (json_t *)extra);
    osp_status st = bad ? osp_err(OSP_ERR_NOMEM, "out of memory") : osp_jinja_render(t, vars, opt, out, out_len);
    json_decref(vars);
    return st;
}
