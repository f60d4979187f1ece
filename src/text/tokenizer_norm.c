/* Normalizers: NFC, NFD, NFKC, NFKD (utf8proc), Lowercase (Rust's
 * char::to_lowercase), Replace, Prepend, Strip; a Sequence is flattened into
 * the step list. Each step reads a string and writes a new one into the
 * call's arena (or passes it through unchanged). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include "text/tokenizer_internal.h"

static osp_status add_step(osp_tokenizer *t, tk_norm **step) {
    tk_norm *q = tk_grow(t->norm, (size_t)t->n_norm, (size_t)t->n_norm + 1, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    t->norm = q;
    *step = &t->norm[t->n_norm++];
    memset(*step, 0, sizeof **step);
    return OSP_OK;
}

/* {"String": s} or {"Regex": r} */
osp_status tk_parse_pattern(osp_tokenizer *t, json_t *pat, const char *what, tk_pattern *out) {
    json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
    if (json_is_string(s)) return tk_pattern_init(out, json_string_value(s), json_string_length(s), 0, what);
    if (json_is_string(r)) return tk_pattern_init(out, json_string_value(r), json_string_length(r), 1, what);
    return osp_err(OSP_ERR_FORMAT, "%s: %s: pattern must be {\"String\": ..} or {\"Regex\": ..}", t->name, what);
}

static osp_status parse_one(osp_tokenizer *t, json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return osp_err(OSP_ERR_FORMAT, "%s: normalizer without a type", t->name);
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list)) return osp_err(OSP_ERR_FORMAT, "%s: normalizer Sequence without normalizers", t->name);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) OSP_TRY(parse_one(t, v));
        return OSP_OK;
    }
    static const struct { const char *name; int type; } SIMPLE[] = {
        {"NFC", TN_NFC}, {"NFD", TN_NFD}, {"NFKC", TN_NFKC}, {"NFKD", TN_NFKD}, {"Lowercase", TN_LOWER},
    };
    tk_norm *st;
    for (size_t i = 0; i < sizeof SIMPLE / sizeof *SIMPLE; i++) {
        if (!strcmp(type, SIMPLE[i].name)) {
            OSP_TRY(add_step(t, &st));
            st->type = SIMPLE[i].type;
            return OSP_OK;
        }
    }
    if (!strcmp(type, "Replace")) {
        json_t *content = json_object_get(j, "content");
        if (!json_is_string(content)) return osp_err(OSP_ERR_FORMAT, "%s: Replace normalizer without content", t->name);
        OSP_TRY(add_step(t, &st));
        st->type = TN_REPLACE;
        st->content = tk_strndup(json_string_value(content), json_string_length(content));
        st->content_len = json_string_length(content);
        if (!st->content) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
        return tk_parse_pattern(t, json_object_get(j, "pattern"), "Replace normalizer", &st->pat);
    }
    if (!strcmp(type, "Prepend")) {
        json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p)) return osp_err(OSP_ERR_FORMAT, "%s: Prepend normalizer without prepend", t->name);
        OSP_TRY(add_step(t, &st));
        st->type = TN_PREPEND;
        st->content = tk_strndup(json_string_value(p), json_string_length(p));
        st->content_len = json_string_length(p);
        return st->content ? OSP_OK : osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    }
    if (!strcmp(type, "Strip")) {
        OSP_TRY(add_step(t, &st));
        st->type = TN_STRIP;
        st->left = json_is_true(json_object_get(j, "strip_left"));
        st->right = json_is_true(json_object_get(j, "strip_right"));
        return OSP_OK;
    }
    if (!strcmp(type, "BertNormalizer")) { /* strip_accents null: as lowercase (tokenizers' bert.rs) */
        OSP_TRY(add_step(t, &st));
        st->type = TN_BERT;
        json_t *sa = json_object_get(j, "strip_accents");
        int lower = !json_is_false(json_object_get(j, "lowercase"));
        st->flags = (!json_is_false(json_object_get(j, "clean_text")) ? TK_BERT_CLEAN : 0) |
                    (!json_is_false(json_object_get(j, "handle_chinese_chars")) ? TK_BERT_CHINESE : 0) |
                    ((json_is_boolean(sa) ? json_is_true(sa) : lower) ? TK_BERT_ACCENTS : 0) | (lower ? TK_BERT_LOWER : 0);
        return OSP_OK;
    }
    if (!strcmp(type, "Precompiled")) {
        json_t *map = json_object_get(j, "precompiled_charsmap");
        if (!json_is_string(map)) return osp_err(OSP_ERR_FORMAT, "%s: Precompiled normalizer without a charsmap", t->name);
        OSP_TRY(add_step(t, &st));
        st->type = TN_PRECOMPILED;
        return tk_precompiled_parse(t, st, json_string_value(map), json_string_length(map));
    }
    return osp_err(OSP_ERR_UNSUPPORTED, "%s: normalizer type '%s' is not supported", t->name, type);
}

osp_status tk_norm_parse(osp_tokenizer *t, const void *json) { return parse_one(t, (json_t *)json); }

void tk_norm_free(tk_norm *n) {
    tk_pattern_free(&n->pat);
    osp_free(n->content);
}

static int is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static osp_status unicode_form(tk_ctx *c, int type, const char *s, size_t n, const char **o, size_t *on) {
    if (is_ascii(s, n)) { /* every form leaves ASCII as it is */
        *o = s;
        *on = n;
        return OSP_OK;
    }
    int opt = UTF8PROC_STABLE;
    if (type == TN_NFC) opt |= UTF8PROC_COMPOSE;
    else if (type == TN_NFD) opt |= UTF8PROC_DECOMPOSE;
    else if (type == TN_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) return osp_err(OSP_ERR_INTERNAL, "tokenizer: normalization failed: %s", utf8proc_errmsg(r));
    char *a = tk_arena_alloc(&c->arena, (size_t)r + 1);
    if (!a) {
        free(dst);
        return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    memcpy(a, dst, (size_t)r);
    free(dst);
    *o = a;
    *on = (size_t)r;
    return OSP_OK;
}

osp_status tk_lowercase(tk_ctx *c, const char *s, size_t n, const char **o, size_t *on) {
    char *a = tk_arena_alloc(&c->arena, n * 3 / 2 + 8); /* lowercase grows a char by at most 1.5x */
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char b = (unsigned char)s[i];
        if (b < 0x80) {
            a[k++] = (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
            i++;
            continue;
        }
        int len;
        uint32_t cp = tk_u8dec(s + i, &len);
        i += (size_t)len;
        if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
            a[k++] = 'i';
            k += (size_t)tk_u8enc(0x307, a + k);
            continue;
        }
        k += (size_t)tk_u8enc((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), a + k);
    }
    *o = a;
    *on = k;
    return OSP_OK;
}

static osp_status replace(tk_ctx *c, const tk_norm *st, const char *s, size_t n, const char **o, size_t *on) {
    c->spans.n = 0;
    OSP_TRY(tk_pattern_find(&st->pat, s, n, &c->rx, &c->spans));
    if (c->spans.n == 0) {
        *o = s;
        *on = n;
        return OSP_OK;
    }
    size_t removed = 0;
    for (size_t i = 0; i < c->spans.n; i++) removed += c->spans.p[i].b - c->spans.p[i].a;
    size_t total = n - removed + c->spans.n * st->content_len;
    char *a = tk_arena_alloc(&c->arena, total + 1);
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0, prev = 0;
    for (size_t i = 0; i < c->spans.n; i++) {
        memcpy(a + k, s + prev, c->spans.p[i].a - prev);
        k += c->spans.p[i].a - prev;
        memcpy(a + k, st->content, st->content_len);
        k += st->content_len;
        prev = c->spans.p[i].b;
    }
    memcpy(a + k, s + prev, n - prev);
    k += n - prev;
    *o = a;
    *on = k;
    return OSP_OK;
}

static void strip(const tk_norm *st, const char *s, size_t n, const char **o, size_t *on) {
    size_t b = 0, e = n;
    int len;
    if (st->left)
        while (b < e && tk_is_white_space(tk_u8dec(s + b, &len))) b += (size_t)len;
    if (st->right) {
        while (e > b) {
            size_t j = e - 1;
            while (j > b && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
            if (!tk_is_white_space(tk_u8dec(s + j, &len))) break;
            e = j;
        }
    }
    *o = s + b;
    *on = e - b;
}

osp_status tk_normalize(tk_ctx *c, const char *s, size_t n, const char **out, size_t *out_n) {
    const osp_tokenizer *t = c->t;
    for (int i = 0; i < t->n_norm; i++) {
        const tk_norm *st = &t->norm[i];
        switch (st->type) {
        case TN_NFC:
        case TN_NFD:
        case TN_NFKC:
        case TN_NFKD: OSP_TRY(unicode_form(c, st->type, s, n, &s, &n)); break;
        case TN_LOWER: OSP_TRY(tk_lowercase(c, s, n, &s, &n)); break;
        case TN_BERT: OSP_TRY(tk_bert_normalize(c, st->flags, s, n, &s, &n)); break;
        case TN_PRECOMPILED: OSP_TRY(tk_precompiled_normalize(c, st, s, n, &s, &n)); break;
        case TN_REPLACE: OSP_TRY(replace(c, st, s, n, &s, &n)); break;
        case TN_STRIP: strip(st, s, n, &s, &n); break;
        case TN_PREPEND:
            if (n > 0) {
                char *a = tk_arena_alloc(&c->arena, st->content_len + n + 1);
                if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
                memcpy(a, st->content, st->content_len);
                memcpy(a + st->content_len, s, n);
                s = a;
                n += st->content_len;
            }
            break;
        }
    }
    *out = s;
    *out_n = n;
    return OSP_OK;
}
