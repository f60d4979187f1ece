/* Post-processors and tokenizer_config.json: what encode(add_special)
 * puts around the ids (a prefix and a suffix of special ids), and the
 * bos/eos/pad/unk ids.
 *
 * TemplateProcessing's single template is [specials] $A [specials]; a
 * Sequence of processors wraps one inside the other; ByteLevel only trims
 * offsets, which are not kept; Roberta/BertProcessing are cls $A sep. */
#include <jansson.h>
#include <string.h>
#include "text/tokenizer_internal.h"

static osp_status ids_append(osp_tokenizer *t, int32_t **v, int *n, const int32_t *ids, int k) {
    int32_t *q = tk_grow(*v, (size_t)*n, (size_t)(*n + k), sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    if (k) memcpy(q + *n, ids, (size_t)k * sizeof *q);
    *v = q;
    *n += k;
    return OSP_OK;
}

/* Wrap the current prefix/suffix: prefix = pre + prefix, suffix = suffix + suf. */
static osp_status wrap(osp_tokenizer *t, const int32_t *pre, int npre, const int32_t *suf, int nsuf) {
    int32_t *np = NULL;
    int nn = 0;
    OSP_TRY(ids_append(t, &np, &nn, pre, npre));
    osp_status st = ids_append(t, &np, &nn, t->pp_prefix, t->n_prefix);
    if (st != OSP_OK) {
        osp_free(np);
        return st;
    }
    osp_free(t->pp_prefix);
    t->pp_prefix = np;
    t->n_prefix = nn;
    return ids_append(t, &t->pp_suffix, &t->n_suffix, suf, nsuf);
}

static osp_status check_id(osp_tokenizer *t, json_int_t v, const char *what) {
    if (v < 0 || v >= t->n_vocab)
        return osp_err(OSP_ERR_FORMAT, "%s: %s id %lld is not in the vocabulary", t->name, what, (long long)v);
    return OSP_OK;
}

static osp_status parse_template(osp_tokenizer *t, json_t *pp) {
    json_t *single = json_object_get(pp, "single"), *sp = json_object_get(pp, "special_tokens");
    if (!json_is_array(single)) return osp_err(OSP_ERR_FORMAT, "%s: TemplateProcessing without \"single\"", t->name);
    int32_t pre[64], suf[64];
    int npre = 0, nsuf = 0, seen_a = 0;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        json_t *stok = json_object_get(item, "SpecialToken"), *seq = json_object_get(item, "Sequence");
        if (seq) {
            const char *sid = json_string_value(json_object_get(seq, "id"));
            if (!sid || strcmp(sid, "A") != 0 || seen_a)
                return osp_err(OSP_ERR_UNSUPPORTED, "%s: TemplateProcessing single template must hold $A once",
                               t->name);
            seen_a = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(stok, "id"));
        json_t *def = name ? json_object_get(sp, name) : NULL;
        json_t *ids = json_object_get(def, "ids");
        if (!json_is_array(ids))
            return osp_err(OSP_ERR_FORMAT, "%s: TemplateProcessing special token '%s' is not defined", t->name,
                           name ? name : "?");
        size_t k;
        json_t *idv;
        json_array_foreach(ids, k, idv) {
            OSP_TRY(check_id(t, json_integer_value(idv), "TemplateProcessing"));
            int32_t *dst = seen_a ? suf : pre;
            int *nd = seen_a ? &nsuf : &npre;
            if (*nd == 64) return osp_err(OSP_ERR_UNSUPPORTED, "%s: TemplateProcessing too long", t->name);
            dst[(*nd)++] = (int32_t)json_integer_value(idv);
        }
    }
    if (!seen_a) return osp_err(OSP_ERR_UNSUPPORTED, "%s: TemplateProcessing single template has no $A", t->name);
    return wrap(t, pre, npre, suf, nsuf);
}

static osp_status parse_post(osp_tokenizer *t, json_t *pp) {
    if (json_is_null(pp)) return OSP_OK;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!type) return osp_err(OSP_ERR_FORMAT, "%s: post_processor without a type", t->name);
    if (!strcmp(type, "ByteLevel")) return OSP_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing")) return parse_template(t, pp);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(pp, "processors");
        if (!json_is_array(list)) return osp_err(OSP_ERR_FORMAT, "%s: post_processor Sequence without processors", t->name);
        size_t i;
        json_t *p;
        json_array_foreach(list, i, p) OSP_TRY(parse_post(t, p));
        return OSP_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_array_get(json_object_get(pp, "cls"), 1);
        json_t *sep = json_array_get(json_object_get(pp, "sep"), 1);
        if (!json_is_integer(cls) || !json_is_integer(sep))
            return osp_err(OSP_ERR_FORMAT, "%s: %s needs cls and sep", t->name, type);
        OSP_TRY(check_id(t, json_integer_value(cls), type));
        OSP_TRY(check_id(t, json_integer_value(sep), type));
        int32_t c = (int32_t)json_integer_value(cls), s = (int32_t)json_integer_value(sep);
        return wrap(t, &c, 1, &s, 1);
    }
    return osp_err(OSP_ERR_UNSUPPORTED, "%s: post_processor type '%s' is not supported", t->name, type);
}

/* ---- tokenizer_config.json ---- */

static int jbool(json_t *o, const char *k, int dflt) {
    json_t *v = json_object_get(o, k);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int32_t config_token(osp_tokenizer *t, json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return -1;
    return osp_tokenizer_token_id(t, json_string_value(v), json_string_length(v));
}

osp_status tk_config_parse(osp_tokenizer *t, const char *cfg_text, size_t n) {
    /* defaults from the post-processor */
    t->info.bos_id = t->n_prefix ? t->pp_prefix[0] : -1;
    t->info.eos_id = t->n_suffix ? t->pp_suffix[t->n_suffix - 1] : -1;
    t->info.pad_id = -1;
    t->info.unk_id = t->unk_id;
    if (!cfg_text) goto done;
    json_error_t e;
    json_t *cfg = json_loadb(cfg_text, n, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &e);
    if (!cfg) return osp_err(OSP_ERR_FORMAT, "%s: tokenizer_config.json: %s (line %d)", t->name, e.text, e.line);
    int32_t id;
    if (json_object_get(cfg, "bos_token")) t->info.bos_id = config_token(t, cfg, "bos_token");
    if (json_object_get(cfg, "eos_token")) t->info.eos_id = config_token(t, cfg, "eos_token");
    if ((id = config_token(t, cfg, "pad_token")) >= 0) t->info.pad_id = id;
    if ((id = config_token(t, cfg, "unk_token")) >= 0) t->info.unk_id = id;
    t->info.clean_up_tokenization_spaces = jbool(cfg, "clean_up_tokenization_spaces", 0);
    json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
    /* transformers' update_post_processor ([bos] $A [eos]) on the side the config states; a side it does not
     * state keeps the file's post-processor: Qwen3-Embedding states add_bos_token false, and its post-processor
     * appends <|endoftext|> (not its eos_token), without which its embeddings are wrong (transformers 4's Qwen2
     * tokenizer keeps it; 5's rebuild of both sides drops it) */
    if (json_is_boolean(ab)) {
        t->n_prefix = 0;
        if (json_is_true(ab) && t->info.bos_id >= 0) OSP_TRY(ids_append(t, &t->pp_prefix, &t->n_prefix, &t->info.bos_id, 1));
    }
    if (json_is_boolean(ae)) {
        t->n_suffix = 0;
        if (json_is_true(ae) && t->info.eos_id >= 0) OSP_TRY(ids_append(t, &t->pp_suffix, &t->n_suffix, &t->info.eos_id, 1));
    }
    json_decref(cfg);
done:
    t->info.add_bos = t->n_prefix > 0;
    t->info.add_eos = t->n_suffix > 0;
    return OSP_OK;
}

osp_status tk_post_parse(osp_tokenizer *t, const void *json) { return parse_post(t, (json_t *)json); }
