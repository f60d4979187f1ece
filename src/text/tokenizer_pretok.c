/* Pre-tokenizers: each step cuts every piece that is not an added token
 * into smaller pieces. Cutting follows the reference's split: the matches
 * of a pattern and the gaps between them become segments, then the
 * behavior (Removed, Isolated, MergedWithPrevious, MergedWithNext,
 * Contiguous) folds them, and empty pieces are dropped.
 *
 * Character predicates become one-character regexes (\p{N} for Digits,
 * punctuation for Punctuation, White_Space for WhitespaceSplit) so every
 * split goes through the same span code. ByteLevel's byte -> char mapping
 * is deferred to the model when ByteLevel is the last step (piece.bl): the
 * model then reads raw bytes through a byte -> id table. */
#include <jansson.h>
#include <string.h>
#include "text/tokenizer_internal.h"

static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static osp_status add_step(osp_tokenizer *t, int type, tk_pretok **step) {
    tk_pretok *q = tk_grow(t->pre, (size_t)t->n_pre, (size_t)t->n_pre + 1, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    t->pre = q;
    *step = &t->pre[t->n_pre++];
    memset(*step, 0, sizeof **step);
    (*step)->type = type;
    return OSP_OK;
}

static osp_status parse_behavior(osp_tokenizer *t, json_t *v, int dflt, int *out) {
    static const struct { const char *name; int b; } B[] = {
        {"Removed", TB_REMOVED},           {"Isolated", TB_ISOLATED},     {"MergedWithPrevious", TB_MERGED_PREV},
        {"MergedWithNext", TB_MERGED_NEXT}, {"Contiguous", TB_CONTIGUOUS},
    };
    if (!v) {
        *out = dflt;
        return OSP_OK;
    }
    const char *s = json_string_value(v);
    for (size_t i = 0; s && i < sizeof B / sizeof *B; i++)
        if (!strcmp(s, B[i].name)) {
            *out = B[i].b;
            return OSP_OK;
        }
    return osp_err(OSP_ERR_UNSUPPORTED, "%s: split behavior '%s' is not supported", t->name, s ? s : "?");
}

/* "replacement": one character */
static osp_status parse_char(osp_tokenizer *t, json_t *v, const char *what, uint32_t *cp, char *buf, int *len) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    int l = 0;
    if (!s || n == 0 || (*cp = tk_u8dec(s, &l), (size_t)l != n))
        return osp_err(OSP_ERR_FORMAT, "%s: %s must be one character", t->name, what);
    memcpy(buf, s, n);
    *len = (int)n;
    return OSP_OK;
}

osp_status tk_parse_prepend_scheme(osp_tokenizer *t, json_t *j, int *out) {
    json_t *ps = json_object_get(j, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always")) *out = TK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = TK_PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = TK_PREPEND_NEVER;
        else return osp_err(OSP_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme '%s' is not supported", t->name, s);
        return OSP_OK;
    }
    json_t *ap = json_object_get(j, "add_prefix_space"); /* before prepend_scheme existed */
    *out = (!ap || json_is_true(ap)) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
    return OSP_OK;
}

static osp_status regex_step(osp_tokenizer *t, int type, const char *re, int behavior, int invert, const char *what) {
    tk_pretok *st;
    OSP_TRY(add_step(t, type, &st));
    st->behavior = behavior;
    st->invert = invert;
    return tk_pattern_init(&st->pat, re, strlen(re), 1, what);
}

static osp_status parse_one(osp_tokenizer *t, json_t *j) {
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type) return osp_err(OSP_ERR_FORMAT, "%s: pre_tokenizer without a type", t->name);
    tk_pretok *st;
    if (!strcmp(type, "Sequence")) {
        json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list)) return osp_err(OSP_ERR_FORMAT, "%s: pre_tokenizer Sequence without pretokenizers", t->name);
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) OSP_TRY(parse_one(t, v));
        return OSP_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        OSP_TRY(add_step(t, TP_BYTELEVEL, &st));
        json_t *ap = json_object_get(j, "add_prefix_space"), *ur = json_object_get(j, "use_regex");
        st->add_prefix_space = ap ? json_is_true(ap) : 1;
        st->use_regex = ur ? json_is_true(ur) : 1;
        if (st->use_regex && !t->re_gpt2) OSP_TRY(tk_regex_compile(GPT2_RE, strlen(GPT2_RE), "ByteLevel", &t->re_gpt2));
        return OSP_OK;
    }
    if (!strcmp(type, "Split")) {
        OSP_TRY(add_step(t, TP_SPLIT, &st));
        st->invert = json_is_true(json_object_get(j, "invert"));
        OSP_TRY(parse_behavior(t, json_object_get(j, "behavior"), -1, &st->behavior));
        if (st->behavior < 0) return osp_err(OSP_ERR_FORMAT, "%s: Split pre_tokenizer without behavior", t->name);
        return tk_parse_pattern(t, json_object_get(j, "pattern"), "Split pre_tokenizer", &st->pat);
    }
    if (!strcmp(type, "Metaspace")) {
        OSP_TRY(add_step(t, TP_METASPACE, &st));
        OSP_TRY(parse_char(t, json_object_get(j, "replacement"), "Metaspace replacement", &st->repl_cp, st->repl,
                           &st->repl_len));
        OSP_TRY(tk_parse_prepend_scheme(t, j, &st->prepend));
        json_t *sp = json_object_get(j, "split");
        st->split = sp ? json_is_true(sp) : 1;
        return tk_pattern_init(&st->pat, st->repl, (size_t)st->repl_len, 0, "Metaspace");
    }
    if (!strcmp(type, "Digits")) {
        int ind = json_is_true(json_object_get(j, "individual_digits"));
        return regex_step(t, TP_DIGITS, "\\p{N}", ind ? TB_ISOLATED : TB_CONTIGUOUS, 0, "Digits");
    }
    if (!strcmp(type, "Punctuation")) {
        int b;
        OSP_TRY(parse_behavior(t, json_object_get(j, "behavior"), TB_ISOLATED, &b));
        return regex_step(t, TP_PUNCT, "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]", b, 0,
                          "Punctuation");
    }
    if (!strcmp(type, "Whitespace")) return regex_step(t, TP_WHITESPACE, "\\w+|[^\\w\\s]+", TB_REMOVED, 1, "Whitespace");
    if (!strcmp(type, "WhitespaceSplit")) return regex_step(t, TP_WSPLIT, "\\s", TB_REMOVED, 0, "WhitespaceSplit");
    if (!strcmp(type, "BertPreTokenizer")) { /* tokenizers' bert.rs: split on whitespace, then punctuation isolated */
        OSP_TRY(regex_step(t, TP_WSPLIT, "\\s", TB_REMOVED, 0, "BertPreTokenizer"));
        return regex_step(t, TP_PUNCT, "[\\p{P}\\x{21}-\\x{2F}\\x{3A}-\\x{40}\\x{5B}-\\x{60}\\x{7B}-\\x{7E}]", TB_ISOLATED, 0,
                          "BertPreTokenizer");
    }
    if (!strcmp(type, "CharDelimiterSplit")) {
        uint32_t cp;
        char b[4];
        int n;
        OSP_TRY(parse_char(t, json_object_get(j, "delimiter"), "CharDelimiterSplit delimiter", &cp, b, &n));
        OSP_TRY(add_step(t, TP_SPLIT, &st));
        st->behavior = TB_REMOVED;
        return tk_pattern_init(&st->pat, b, (size_t)n, 0, "CharDelimiterSplit");
    }
    return osp_err(OSP_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' is not supported", t->name, type);
}

osp_status tk_pretok_parse(osp_tokenizer *t, const void *json) { return parse_one(t, (json_t *)json); }

void tk_pretok_free(tk_pretok *p) { tk_pattern_free(&p->pat); }

/* ---- splitting ---- */

#define SEG_MATCH 0x80000000u

static osp_status emit(const tk_piece *pc, uint32_t a, uint32_t b, tk_pieces *out) {
    if (b <= a) return OSP_OK;
    tk_piece p = {pc->s + a, b - a, -1, (uint8_t)(pc->orig0 && a == 0), pc->bl};
    return tk_pieces_push(out, p);
}

osp_status tk_split_spans(tk_ctx *c, const tk_piece *pc, const tk_spans *m, int behavior, int invert,
                          tk_pieces *out) {
    /* segments: gaps (not a match) and matches, covering the piece */
    tk_spans *seg = &c->segs;
    seg->n = 0;
    uint32_t prev = 0, n = pc->len;
    for (size_t i = 0; i < m->n; i++) {
        if (prev < m->p[i].a) OSP_TRY(tk_spans_push(seg, prev, m->p[i].a | (invert ? SEG_MATCH : 0)));
        OSP_TRY(tk_spans_push(seg, m->p[i].a, m->p[i].b | (invert ? 0 : SEG_MATCH)));
        prev = m->p[i].b;
    }
    if (prev < n || n == 0) OSP_TRY(tk_spans_push(seg, prev, n | (invert ? SEG_MATCH : 0)));

    if (behavior == TB_ISOLATED || behavior == TB_REMOVED) {
        for (size_t i = 0; i < seg->n; i++) {
            int match = (seg->p[i].b & SEG_MATCH) != 0;
            if (behavior == TB_REMOVED && match) continue;
            OSP_TRY(emit(pc, seg->p[i].a, seg->p[i].b & ~SEG_MATCH, out));
        }
        return OSP_OK;
    }
    size_t k = 0;
    int prev_match = 0;
    if (behavior == TB_MERGED_NEXT) {
        /* walk backwards; a match extends the segment after it */
        tk_spans *acc = &c->acc;
        acc->n = 0;
        for (size_t r = seg->n; r-- > 0;) {
            uint32_t a = seg->p[r].a, b = seg->p[r].b & ~SEG_MATCH;
            int match = (seg->p[r].b & SEG_MATCH) != 0;
            if (match && !prev_match && acc->n > 0) acc->p[acc->n - 1].a = a;
            else OSP_TRY(tk_spans_push(acc, a, b));
            prev_match = match;
        }
        for (size_t i = acc->n; i-- > 0;) OSP_TRY(emit(pc, acc->p[i].a, acc->p[i].b, out));
        return OSP_OK;
    }
    /* fold in place (k <= r): acc is the prefix seg->p[0..k) */
    for (size_t r = 0; r < seg->n; r++) {
        uint32_t a = seg->p[r].a, b = seg->p[r].b & ~SEG_MATCH;
        int match = (seg->p[r].b & SEG_MATCH) != 0;
        int merge = behavior == TB_MERGED_PREV ? (match && !prev_match) : (match == prev_match);
        if (merge && k > 0) seg->p[k - 1].b = b;
        else {
            seg->p[k].a = a;
            seg->p[k].b = b;
            k++;
        }
        prev_match = match;
    }
    for (size_t i = 0; i < k; i++) OSP_TRY(emit(pc, seg->p[i].a, seg->p[i].b, out));
    return OSP_OK;
}

/* ---- steps ---- */

static osp_status map_bytes(tk_ctx *c, tk_piece *pc) {
    char *a = tk_arena_alloc(&c->arena, (size_t)pc->len * 2 + 1);
    if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    size_t k = 0;
    for (uint32_t i = 0; i < pc->len; i++) k += (size_t)tk_u8enc(tk_byte_cp((unsigned char)pc->s[i]), a + k);
    pc->s = a;
    pc->len = (uint32_t)k;
    return OSP_OK;
}

static osp_status byte_level(tk_ctx *c, const tk_pretok *st, int last, tk_piece pc, tk_pieces *out) {
    if (st->add_prefix_space && (pc.len == 0 || pc.s[0] != ' ')) {
        char *a = tk_arena_alloc(&c->arena, (size_t)pc.len + 1);
        if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        a[0] = ' ';
        memcpy(a + 1, pc.s, pc.len);
        pc.s = a;
        pc.len++;
    }
    size_t first = out->n;
    if (st->use_regex) {
        c->spans.n = 0;
        OSP_TRY(tk_regex_find(c->t->re_gpt2, pc.s, pc.len, &c->rx, &c->spans));
        OSP_TRY(tk_split_spans(c, &pc, &c->spans, TB_ISOLATED, 0, out));
    } else if (pc.len) {
        OSP_TRY(tk_pieces_push(out, pc));
    }
    for (size_t i = first; i < out->n; i++) {
        if (last) out->p[i].bl = 1;
        else OSP_TRY(map_bytes(c, &out->p[i]));
    }
    return OSP_OK;
}

static osp_status metaspace(tk_ctx *c, const tk_pretok *st, tk_piece pc, tk_pieces *out) {
    size_t spaces = 0;
    for (uint32_t i = 0; i < pc.len; i++) spaces += pc.s[i] == ' ';
    /* the reference replaces first, then looks at the first char */
    int starts = pc.len && (pc.s[0] == ' ' || (pc.len >= (uint32_t)st->repl_len &&
                                                !memcmp(pc.s, st->repl, (size_t)st->repl_len)));
    int prepend = (st->prepend == TK_PREPEND_ALWAYS && !starts) ||
                  (st->prepend == TK_PREPEND_FIRST && !starts && pc.orig0);
    if (spaces || prepend) {
        size_t n = pc.len + spaces * (size_t)(st->repl_len - 1) + (prepend ? (size_t)st->repl_len : 0);
        char *a = tk_arena_alloc(&c->arena, n + 1);
        if (!a) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        size_t k = 0;
        if (prepend) {
            memcpy(a, st->repl, (size_t)st->repl_len);
            k = (size_t)st->repl_len;
        }
        for (uint32_t i = 0; i < pc.len; i++) {
            if (pc.s[i] == ' ') {
                memcpy(a + k, st->repl, (size_t)st->repl_len);
                k += (size_t)st->repl_len;
            } else {
                a[k++] = pc.s[i];
            }
        }
        pc.s = a;
        pc.len = (uint32_t)k;
    }
    if (!st->split) return pc.len ? tk_pieces_push(out, pc) : OSP_OK;
    c->spans.n = 0;
    OSP_TRY(tk_pattern_find(&st->pat, pc.s, pc.len, &c->rx, &c->spans));
    return tk_split_spans(c, &pc, &c->spans, TB_MERGED_NEXT, 0, out);
}

osp_status tk_pretokenize(tk_ctx *c, tk_pieces *a, tk_pieces *b, tk_pieces **result) {
    const osp_tokenizer *t = c->t;
    for (int s = 0; s < t->n_pre; s++) {
        const tk_pretok *st = &t->pre[s];
        b->n = 0;
        for (size_t i = 0; i < a->n; i++) {
            tk_piece pc = a->p[i];
            if (pc.id >= 0) {
                OSP_TRY(tk_pieces_push(b, pc));
                continue;
            }
            switch (st->type) {
            case TP_BYTELEVEL: OSP_TRY(byte_level(c, st, s == t->n_pre - 1, pc, b)); break;
            case TP_METASPACE: OSP_TRY(metaspace(c, st, pc, b)); break;
            default:
                c->spans.n = 0;
                OSP_TRY(tk_pattern_find(&st->pat, pc.s, pc.len, &c->rx, &c->spans));
                OSP_TRY(tk_split_spans(c, &pc, &c->spans, st->behavior, st->invert, b));
            }
        }
        tk_pieces *tmp = a;
        a = b;
        b = tmp;
    }
    *result = a;
    return OSP_OK;
}
