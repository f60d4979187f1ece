/* Loading tokenizer.json (+ tokenizer_config.json).
 *
 * One pass of the pull parser over the file: the model's vocabulary and
 * merges and the added tokens are read straight into the tables (a DOM of
 * the 33 MB Gemma file would cost more than the whole load); the small
 * pipeline settings are kept as spans and parsed with jansson afterwards.
 * Order: vocabulary -> its hash map -> merges (which need the map); added
 * tokens widen the id range; the normalized added tokens need the
 * normalizer; bos/eos come from the post-processor and the config. */
#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "core/fs.h"
#include <sys/stat.h>
#include "text/tokenizer_internal.h"

typedef struct span {
    const char *b, *e;
} span;

/* ---- vocabulary storage ---- */

/* Pool entries are [id u32][len u32][bytes][NUL]; offsets point at the
 * bytes, so a map slot (hash tag, offset) reaches id, length and bytes in
 * one cache line. */
osp_status tk_pool_add(osp_tokenizer *t, int32_t id, const char *s, size_t n, uint32_t *off) {
    size_t need = 8 + n + 1;
    if (t->pool_n + need > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap : 1 << 16;
        while (cap < t->pool_n + need) cap *= 2;
        if (cap > UINT32_MAX) return osp_err(OSP_ERR_FORMAT, "%s: vocabulary too large", t->name);
        char *q = tk_grow(t->pool, t->pool_n, cap, 1);
        if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
        t->pool = q;
        t->pool_cap = cap;
    }
    uint32_t len = (uint32_t)n;
    memcpy(t->pool + t->pool_n, &id, 4);
    memcpy(t->pool + t->pool_n + 4, &len, 4);
    *off = (uint32_t)(t->pool_n + 8);
    memcpy(t->pool + *off, s, n);
    t->pool[*off + n] = 0;
    t->pool_n += need;
    return OSP_OK;
}

osp_status tk_ids_resize(osp_tokenizer *t, int32_t n_vocab) {
    if (n_vocab <= t->n_vocab && t->mstr) return OSP_OK;
    size_t n = n_vocab > 0 ? (size_t)n_vocab : 1;
    tk_str *q = tk_grow(t->mstr, t->mstr ? (size_t)t->n_vocab : 0, n, sizeof *q);
    if (!q) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    for (size_t i = t->mstr ? (size_t)t->n_vocab : 0; i < n; i++) {
        q[i].off = 0;
        q[i].len = TK_NONE;
    }
    t->mstr = q;
    t->n_vocab = n_vocab;
    t->info.vocab_size = n_vocab;
    return OSP_OK;
}

static inline int slot_is(const osp_tokenizer *t, uint64_t e, const char *s, size_t n, int32_t *id) {
    uint32_t off = (uint32_t)e, len;
    memcpy(&len, t->pool + off - 4, 4);
    if (len != n || memcmp(t->pool + off, s, n) != 0) return 0;
    memcpy(id, t->pool + off - 8, 4);
    return 1;
}

static inline osp_status find_h(const osp_tokenizer *t, const char *s, size_t n, uint64_t h, int32_t *id) {
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint32_t i = (uint32_t)h & t->vmask;; i = (i + 1) & t->vmask) {
        uint64_t e = t->vmap[i];
        if (!e) return OSP_ERR_RANGE;
        if ((uint32_t)(e >> 32) == tag && slot_is(t, e, s, n, id)) return OSP_OK;
    }
}

osp_status tk_vocab_find(const osp_tokenizer *t, const char *s, size_t n, int32_t *id) {
    if (!t->vmap) return OSP_ERR_RANGE;
    return find_h(t, s, n, tk_hash(s, n), id);
}

/* Warm the cache lines a lookup of hash h will touch (slot, then entry). */
static inline void prefetch_slot(const osp_tokenizer *t, uint64_t h) {
    __builtin_prefetch(&t->vmap[(uint32_t)h & t->vmask]);
}
static inline void prefetch_entry(const osp_tokenizer *t, uint64_t h) {
    uint64_t e = t->vmap[(uint32_t)h & t->vmask];
    if (e && (uint32_t)(e >> 32) == (uint32_t)(h >> 32)) __builtin_prefetch(t->pool + (uint32_t)e - 8);
}

osp_status tk_vocab_build_map(osp_tokenizer *t) {
    size_t cnt = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) cnt += t->mstr[i].len != TK_NONE;
    uint32_t cap = 1024;
    while (cap < cnt * 2) cap *= 2;
    osp_free(t->vmap);
    t->vmap = osp_calloc(OSP_POOL_MISC, (size_t)cap * sizeof *t->vmap);
    if (!t->vmap) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    t->vmask = cap - 1;
    for (int32_t k = 0; k < t->n_vocab; k++) {
        if (t->mstr[k].len == TK_NONE) continue;
        const char *s = t->pool + t->mstr[k].off;
        uint64_t h = tk_hash(s, t->mstr[k].len);
        uint32_t i = (uint32_t)h & t->vmask;
        int32_t other;
        while (t->vmap[i]) {
            if ((uint32_t)(t->vmap[i] >> 32) == (uint32_t)(h >> 32) && slot_is(t, t->vmap[i], s, t->mstr[k].len, &other))
                return osp_err(OSP_ERR_FORMAT, "%s: model vocab has '%.*s' twice", t->name,
                               (int)t->mstr[k].len, s);
            i = (i + 1) & t->vmask;
        }
        t->vmap[i] = ((h >> 32) << 32) | t->mstr[k].off;
    }
    return OSP_OK;
}

static osp_status pairs_alloc(osp_tokenizer *t, size_t n) {
    uint32_t cap = 1024;
    while (cap < n * 2 + 1) cap *= 2;
    tk_pair_slot *p = osp_malloc(OSP_POOL_MISC, (size_t)cap * sizeof *p);
    if (!p) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    for (uint32_t i = 0; i < cap; i++) p[i].key = UINT64_MAX;
    tk_pair_slot *old = t->pairs;
    uint32_t old_cap = old ? t->pmask + 1 : 0;
    t->pairs = p;
    t->pmask = cap - 1;
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].key == UINT64_MAX) continue;
        uint32_t k = (uint32_t)tk_mix64(old[i].key) & t->pmask;
        while (p[k].key != UINT64_MAX) k = (k + 1) & t->pmask;
        p[k] = old[i];
    }
    osp_free(old);
    return OSP_OK;
}

/* A later duplicate overwrites, like the reference's HashMap collect. */
osp_status tk_pairs_insert(osp_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    if (!t->pairs || (t->n_pairs + 1) * 2 > (size_t)t->pmask + 1)
        OSP_TRY(pairs_alloc(t, t->pairs ? (size_t)t->pmask + 1 : 1024));
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)tk_mix64(key) & t->pmask;
    while (t->pairs[i].key != UINT64_MAX && t->pairs[i].key != key) i = (i + 1) & t->pmask;
    if (t->pairs[i].key == UINT64_MAX) t->n_pairs++;
    t->pairs[i].key = key;
    t->pairs[i].rank = rank;
    t->pairs[i].id = id;
    return OSP_OK;
}

/* ---- small readers ---- */

static osp_status read_opt_string(tk_json *j, tk_buf *b, int *is_null) {
    tkj_ws(j);
    if (j->p < j->end && *j->p == 'n') {
        *is_null = 1;
        return tkj_skip(j);
    }
    *is_null = 0;
    return tkj_string(j, b);
}

/* true / false (null reads as false, as serde's Option<bool> default). */
static osp_status read_bool(tk_json *j, const char *what, int *v) {
    tkj_ws(j);
    const char *s = j->p;
    OSP_TRY(tkj_skip(j));
    size_t n = (size_t)(j->p - s);
    if (n == 4 && !memcmp(s, "true", 4)) *v = 1;
    else if ((n == 5 && !memcmp(s, "false", 5)) || (n == 4 && !memcmp(s, "null", 4))) *v = 0;
    else {
        j->p = s;
        return tkj_error(j, what);
    }
    return OSP_OK;
}

static osp_status opt_string_field(tk_json *j, tk_buf *val, char **out) {
    int is_null;
    OSP_TRY(read_opt_string(j, val, &is_null));
    osp_free(*out);
    *out = NULL;
    if (!is_null && val->n > 0) {
        *out = tk_strndup(val->p, val->n);
        if (!*out) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
    }
    return OSP_OK;
}

/* ---- model ---- */

typedef struct model_hdr {
    int has_type, vocab_done;
    span merges;          /* where the merges are (read once the model is known) */
    size_t merges_prefix; /* continuing_subword_prefix length they were read with */
    int merges_done;
    char *unk;
    int64_t unk_id; /* Unigram's unk_id (-1: none) */
    double dropout;
} model_hdr;

/* {"token": id, ...}: into the pool, then the id table and its map. */
static osp_status parse_vocab(osp_tokenizer *t, tk_json *j) {
    tk_buf key = {0};
    size_t cap = 1 << 14, n = 0;
    struct vrec {
        uint32_t off, len;
        int32_t id;
    } *r = osp_malloc(OSP_POOL_MISC, cap * sizeof *r);
    if (!r) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    osp_status st = tkj_expect(j, '{');
    int first = 1;
    int32_t max_id = -1;
    while (st == OSP_OK && tkj_obj_next(j, &first, &key, &st) == 1) {
        int64_t id;
        if ((st = tkj_int(j, &id)) != OSP_OK) break;
        if (id < 0 || id >= INT32_MAX - 1) {
            st = osp_err(OSP_ERR_FORMAT, "%s: vocab id %lld of '%s' is out of range", t->name, (long long)id, key.p);
            break;
        }
        if (n == cap) {
            struct vrec *q = tk_grow(r, n, cap * 2, sizeof *r);
            if (!q) {
                st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
                break;
            }
            r = q;
            cap *= 2;
        }
        if ((st = tk_pool_add(t, (int32_t)id, key.p, key.n, &r[n].off)) != OSP_OK) break;
        r[n].len = (uint32_t)key.n;
        r[n].id = (int32_t)id;
        if (id > max_id) max_id = (int32_t)id;
        n++;
    }
    tk_buf_free(&key);
    /* ids index arrays: a vocabulary is dense (ids 0..n-1); a sparse one
     * would make a small file allocate gigabytes */
    if (st == OSP_OK && (int64_t)max_id >= 2 * (int64_t)n + 65536)
        st = osp_err(OSP_ERR_FORMAT, "%s: vocab ids are not dense (%zu tokens, largest id %d)", t->name, n, max_id);
    if (st == OSP_OK) st = tk_ids_resize(t, max_id + 1);
    for (size_t i = 0; i < n && st == OSP_OK; i++) {
        if (t->mstr[r[i].id].len != TK_NONE)
            st = osp_err(OSP_ERR_FORMAT, "%s: vocab id %d is given to two tokens", t->name, r[i].id);
        t->mstr[r[i].id].off = r[i].off;
        t->mstr[r[i].id].len = r[i].len;
    }
    osp_free(r);
    if (st == OSP_OK) st = tk_vocab_build_map(t);
    return st;
}

/* Chars right before a U+2581 inside a merge result (see tokenizer_bpe.c). */
static void meta_scan(osp_tokenizer *t, const char *s, size_t n) {
    const char *p = s, *end = s + n;
    while ((p = memchr(p, 0xE2, (size_t)(end - p))) != NULL) {
        if (end - p >= 3 && (unsigned char)p[1] == 0x96 && (unsigned char)p[2] == 0x81 && p > s) {
            const char *q = p - 1;
            while (q > s && ((unsigned char)*q & 0xC0) == 0x80) q--;
            int len;
            uint32_t cp = tk_u8dec(q, &len);
            int seen = cp == 0x2581;
            for (int m = 0; m < t->n_meta_bad && !seen; m++) seen = t->meta_bad[m] == cp;
            if (!seen) {
                if (t->n_meta_bad == (int)(sizeof t->meta_bad / sizeof *t->meta_bad)) t->meta_overflow = 1;
                else t->meta_bad[t->n_meta_bad++] = cp;
            }
        }
        p++;
    }
}

/* ["a b", ...] or [["a", "b"], ...]; the merge a+b (b without the
 * continuing-subword prefix) must be in the vocab. Three lookups per merge
 * into tables far larger than the cache: merges go in batches, first parsed
 * and hashed with their map slots prefetched, then their pool entries
 * prefetched, then resolved, so the cache misses overlap. */
#define MB 32
typedef struct mrec {
    uint32_t a, na, b, nb, c, nc; /* offsets into the batch buffer */
    uint64_t h[3];
} mrec;

static osp_status read_merge(osp_tokenizer *t, tk_json *j, size_t rank, tk_buf *sb, tk_buf *tmp, mrec *m) {
    size_t base = sb->n;
    if (*j->p == '"') {
        OSP_TRY(tkj_string(j, tmp));
        char *sp1 = memchr(tmp->p, ' ', tmp->n);
        if (!sp1 || memchr(sp1 + 1, ' ', tmp->n - (size_t)(sp1 + 1 - tmp->p)))
            return osp_err(OSP_ERR_FORMAT, "%s: merge %zu ('%s') is not two tokens separated by one space",
                           t->name, rank + 1, tmp->p);
        OSP_TRY(tk_buf_put(sb, tmp->p, tmp->n));
        m->a = (uint32_t)base;
        m->na = (uint32_t)(sp1 - tmp->p);
        m->b = m->a + m->na + 1;
        m->nb = (uint32_t)(tmp->n - m->na - 1);
    } else {
        int f2 = 1;
        osp_status st = OSP_OK;
        OSP_TRY(tkj_expect(j, '['));
        if (tkj_arr_next(j, &f2, &st) != 1 || (st = tkj_string(j, tmp)) != OSP_OK)
            return st != OSP_OK ? st : tkj_error(j, "a merge must be a pair of strings");
        OSP_TRY(tk_buf_put(sb, tmp->p, tmp->n));
        m->a = (uint32_t)base;
        m->na = (uint32_t)tmp->n;
        if (tkj_arr_next(j, &f2, &st) != 1 || (st = tkj_string(j, tmp)) != OSP_OK || tkj_arr_next(j, &f2, &st) != 0)
            return st != OSP_OK ? st : tkj_error(j, "a merge must be a pair of strings");
        m->b = (uint32_t)sb->n;
        m->nb = (uint32_t)tmp->n;
        OSP_TRY(tk_buf_put(sb, tmp->p, tmp->n));
    }
    size_t skip = 0;
    if (t->cs_prefix_len && m->nb >= t->cs_prefix_len && !memcmp(sb->p + m->b, t->cs_prefix, t->cs_prefix_len))
        skip = t->cs_prefix_len;
    m->c = (uint32_t)sb->n;
    OSP_TRY(tk_buf_reserve(sb, m->na + m->nb));
    memcpy(sb->p + sb->n, sb->p + m->a, m->na);
    memcpy(sb->p + sb->n + m->na, sb->p + m->b + skip, m->nb - skip);
    sb->n += m->na + m->nb - skip;
    m->nc = (uint32_t)(sb->n - m->c);
    return OSP_OK;
}

static osp_status resolve_batch(osp_tokenizer *t, mrec *m, int n, const char *sb, size_t rank0) {
    for (int i = 0; i < n; i++) {
        m[i].h[0] = tk_hash(sb + m[i].a, m[i].na);
        m[i].h[1] = tk_hash(sb + m[i].b, m[i].nb);
        m[i].h[2] = tk_hash(sb + m[i].c, m[i].nc);
        for (int k = 0; k < 3; k++) prefetch_slot(t, m[i].h[k]);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) prefetch_entry(t, m[i].h[k]);
    int32_t ids[MB][3];
    for (int i = 0; i < n; i++) {
        const uint32_t off[3] = {m[i].a, m[i].b, m[i].c}, len[3] = {m[i].na, m[i].nb, m[i].nc};
        for (int k = 0; k < 3; k++) {
            if (find_h(t, sb + off[k], len[k], m[i].h[k], &ids[i][k]) == OSP_OK) continue;
            if (k < 2)
                return osp_err(OSP_ERR_FORMAT, "%s: merge %zu uses '%.*s', which is not in the vocab", t->name,
                               rank0 + (size_t)i + 1, (int)len[k], sb + off[k]);
            return osp_err(OSP_ERR_FORMAT, "%s: merge %zu gives '%.*s', which is not in the vocab", t->name,
                           rank0 + (size_t)i + 1, (int)len[k], sb + off[k]);
        }
        if (t->pairs && (t->n_pairs + (size_t)n) * 2 <= (size_t)t->pmask + 1) {
            uint64_t key = ((uint64_t)(uint32_t)ids[i][0] << 32) | (uint32_t)ids[i][1];
            __builtin_prefetch(&t->pairs[(uint32_t)tk_mix64(key) & t->pmask], 1);
        }
    }
    for (int i = 0; i < n; i++) {
        OSP_TRY(tk_pairs_insert(t, ids[i][0], ids[i][1], (uint32_t)(rank0 + (size_t)i), ids[i][2]));
        meta_scan(t, sb + m[i].c, m[i].nc);
    }
    return OSP_OK;
}

static osp_status parse_merges(osp_tokenizer *t, tk_json *j) {
    tk_buf sb = {0}, tmp = {0};
    mrec m[MB];
    int n = 0;
    osp_status st = t->pairs ? OSP_OK : pairs_alloc(t, (size_t)(t->n_vocab > 0 ? t->n_vocab : 1));
    if (st == OSP_OK) st = tkj_expect(j, '[');
    int first = 1, more = 0;
    size_t rank = 0;
    t->n_meta_bad = t->meta_overflow = 0;
    while (st == OSP_OK) {
        more = tkj_arr_next(j, &first, &st);
        if (more == 1 && (rank + (size_t)n) > UINT32_MAX - 2) st = osp_err(OSP_ERR_FORMAT, "%s: too many merges", t->name);
        if (st != OSP_OK) break;
        if (more == 1) {
            st = read_merge(t, j, rank + (size_t)n, &sb, &tmp, &m[n]);
            n++;
        }
        if (st == OSP_OK && n && (n == MB || more != 1)) {
            st = resolve_batch(t, m, n, sb.p, rank);
            rank += (size_t)n;
            n = 0;
            sb.n = 0;
        }
        if (more != 1) break;
    }
    t->meta_scanned = 1;
    tk_buf_free(&sb);
    tk_buf_free(&tmp);
    return st;
}

static osp_status merges_from_span(osp_tokenizer *t, model_hdr *mh, const char *beg) {
    osp_free(t->pairs);
    t->pairs = NULL;
    t->n_pairs = 0;
    tk_json jm = {mh->merges.b, beg, mh->merges.e, t->name};
    OSP_TRY(parse_merges(t, &jm));
    mh->merges_done = 1;
    mh->merges_prefix = t->cs_prefix_len;
    return OSP_OK;
}

static osp_status parse_model(osp_tokenizer *t, tk_json *j, model_hdr *mh) {
    tk_buf key = {0}, val = {0};
    osp_status st = tkj_expect(j, '{');
    int first = 1;
    while (st == OSP_OK && tkj_obj_next(j, &first, &key, &st) == 1) {
        tkj_ws(j);
        if (!strcmp(key.p, "type")) {
            if ((st = tkj_string(j, &val)) != OSP_OK) break;
            if (!strcmp(val.p, "WordPiece")) t->model = TK_MODEL_WORDPIECE;
            else if (!strcmp(val.p, "Unigram")) t->model = TK_MODEL_UNIGRAM;
            else if (strcmp(val.p, "BPE") != 0) {
                st = osp_err(OSP_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (BPE, WordPiece, Unigram)",
                             t->name, val.p);
                break;
            }
            mh->has_type = 1;
        } else if (!strcmp(key.p, "vocab")) {
            if (mh->vocab_done) {
                st = tkj_error(j, "vocab given twice");
                break;
            }
            st = j->p < j->end && *j->p == '[' ? tk_unigram_parse_vocab(t, j) : parse_vocab(t, j);
            mh->vocab_done = 1;
        } else if (!strcmp(key.p, "merges")) {
            mh->merges.b = j->p;
            if (mh->vocab_done) { /* the usual order: read them right here */
                st = parse_merges(t, j);
                mh->merges_done = 1;
                mh->merges_prefix = t->cs_prefix_len;
            } else {
                st = tkj_skip(j);
            }
            mh->merges.e = j->p;
        } else if (!strcmp(key.p, "unk_token")) {
            st = opt_string_field(j, &val, &mh->unk);
        } else if (!strcmp(key.p, "continuing_subword_prefix")) {
            st = opt_string_field(j, &val, &t->cs_prefix);
            t->cs_prefix_len = t->cs_prefix ? strlen(t->cs_prefix) : 0;
        } else if (!strcmp(key.p, "end_of_word_suffix")) {
            st = opt_string_field(j, &val, &t->eow_suffix);
            t->eow_suffix_len = t->eow_suffix ? strlen(t->eow_suffix) : 0;
        } else if (!strcmp(key.p, "unk_id")) { /* Unigram */
            int64_t v = -1;
            if (!(j->p + 4 <= j->end && !memcmp(j->p, "null", 4))) st = tkj_int(j, &v);
            else j->p += 4;
            mh->unk_id = v;
        } else if (!strcmp(key.p, "max_input_chars_per_word")) { /* WordPiece */
            int64_t v;
            if ((st = tkj_int(j, &v)) == OSP_OK && (v < 1 || v > INT32_MAX))
                st = tkj_error(j, "max_input_chars_per_word must be positive");
            t->wp_max_chars = (int32_t)v;
        } else if (!strcmp(key.p, "fuse_unk")) {
            st = read_bool(j, "fuse_unk must be a boolean", &t->fuse_unk);
        } else if (!strcmp(key.p, "byte_fallback")) {
            st = read_bool(j, "byte_fallback must be a boolean", &t->byte_fallback);
        } else if (!strcmp(key.p, "ignore_merges")) {
            st = read_bool(j, "ignore_merges must be a boolean", &t->ignore_merges);
        } else if (!strcmp(key.p, "dropout")) {
            const char *s = j->p;
            if ((st = tkj_skip(j)) != OSP_OK) break;
            if (!(j->p - s == 4 && !memcmp(s, "null", 4))) {
                char num[64];
                size_t n = (size_t)(j->p - s) < sizeof num - 1 ? (size_t)(j->p - s) : sizeof num - 1;
                memcpy(num, s, n);
                num[n] = 0;
                char *endp;
                mh->dropout = strtod(num, &endp);
                if (endp == num) {
                    j->p = s;
                    st = tkj_error(j, "dropout must be a number or null");
                }
            }
        } else {
            st = tkj_skip(j);
        }
    }
    tk_buf_free(&key);
    tk_buf_free(&val);
    if (st != OSP_OK) return st;
    if (!mh->has_type)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: model has no \"type\" (BPE, WordPiece, Unigram)", t->name);
    if ((t->model == TK_MODEL_UNIGRAM) != (t->uni_score != NULL))
        return osp_err(OSP_ERR_FORMAT, "%s: a %s model needs its vocab as %s", t->name,
                       t->model == TK_MODEL_UNIGRAM ? "Unigram" : "BPE or WordPiece",
                       t->model == TK_MODEL_UNIGRAM ? "[[piece, score], ...]" : "{token: id, ...}");
    if (t->model == TK_MODEL_UNIGRAM) {
        if (mh->unk_id < -1 || mh->unk_id >= t->n_vocab) return osp_err(OSP_ERR_FORMAT, "%s: unk_id %lld is not in the vocab", t->name, (long long)mh->unk_id);
        t->unk_id = (int32_t)mh->unk_id;
        return OSP_OK;
    }
    if (t->model == TK_MODEL_WORDPIECE) {
        if (!mh->vocab_done) return osp_err(OSP_ERR_FORMAT, "%s: WordPiece model without vocab", t->name);
        if (!t->wp_max_chars) t->wp_max_chars = 100;
        if (!t->cs_prefix) { /* tokenizers' default "##" */
            t->cs_prefix = tk_strndup("##", 2);
            t->cs_prefix_len = 2;
            if (!t->cs_prefix) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
        }
        return OSP_OK;
    }
    if (mh->dropout > 0)
        return osp_err(OSP_ERR_UNSUPPORTED, "%s: BPE dropout %g is not supported (encoding would be random)",
                       t->name, mh->dropout);
    if (!mh->vocab_done || !mh->merges.b)
        return osp_err(OSP_ERR_FORMAT, "%s: BPE model without %s", t->name, mh->vocab_done ? "merges" : "vocab");
    /* merges read before the vocab, or before a continuing_subword_prefix */
    if (!mh->merges_done || mh->merges_prefix != t->cs_prefix_len) OSP_TRY(merges_from_span(t, mh, j->beg));
    return OSP_OK;
}

/* ---- added tokens ---- */

static osp_status parse_added(osp_tokenizer *t, tk_json *j) {
    tk_buf key = {0}, content = {0};
    tkj_ws(j);
    if (j->p < j->end && *j->p == 'n') return tkj_skip(j);
    osp_status st = tkj_expect(j, '[');
    int first = 1;
    size_t cap = 0, idx = 0;
    while (st == OSP_OK && tkj_arr_next(j, &first, &st) == 1) {
        int64_t id = -1;
        int special = 0, single = 0, lstrip = 0, rstrip = 0, normalized = -1, have_content = 0;
        int f2 = 1;
        if ((st = tkj_expect(j, '{')) != OSP_OK) break;
        while (st == OSP_OK && tkj_obj_next(j, &f2, &key, &st) == 1) {
            if (!strcmp(key.p, "id")) st = tkj_int(j, &id);
            else if (!strcmp(key.p, "content")) {
                st = tkj_string(j, &content);
                have_content = 1;
            } else if (!strcmp(key.p, "special")) st = read_bool(j, "special must be a boolean", &special);
            else if (!strcmp(key.p, "single_word")) st = read_bool(j, "single_word must be a boolean", &single);
            else if (!strcmp(key.p, "lstrip")) st = read_bool(j, "lstrip must be a boolean", &lstrip);
            else if (!strcmp(key.p, "rstrip")) st = read_bool(j, "rstrip must be a boolean", &rstrip);
            else if (!strcmp(key.p, "normalized")) st = read_bool(j, "normalized must be a boolean", &normalized);
            else st = tkj_skip(j);
        }
        if (st != OSP_OK) break;
        if (id < 0 || id >= INT32_MAX - 1 || !have_content) {
            st = osp_err(OSP_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content", t->name, idx);
            break;
        }
        idx++;
        if (content.n == 0) continue; /* the reference ignores empty tokens */
        if ((size_t)t->n_added == cap) {
            cap = cap ? cap * 2 : 64;
            tk_added *q = tk_grow(t->added, (size_t)t->n_added, cap, sizeof *q);
            if (!q) {
                st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
                break;
            }
            t->added = q;
        }
        tk_added *a = &t->added[t->n_added];
        memset(a, 0, sizeof *a);
        a->s = tk_strndup(content.p, content.n);
        if (!a->s) {
            st = osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
            break;
        }
        t->n_added++;
        a->len = (uint32_t)content.n;
        a->id = (int32_t)id;
        a->special = (uint8_t)special;
        a->single_word = (uint8_t)single;
        a->lstrip = (uint8_t)lstrip;
        a->rstrip = (uint8_t)rstrip;
        a->normalized = (uint8_t)(normalized < 0 ? !special : normalized);
    }
    tk_buf_free(&key);
    tk_buf_free(&content);
    return st;
}

/* ---- the whole file ---- */

typedef struct top_spans {
    span norm, pre, post, dec;
} top_spans;

static osp_status json_sub(osp_tokenizer *t, span sp, const char *what, json_t **out) {
    json_error_t e;
    *out = json_loadb(sp.b, (size_t)(sp.e - sp.b), JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!*out) return osp_err(OSP_ERR_FORMAT, "%s: %s: %s", t->name, what, e.text);
    return OSP_OK;
}

static osp_status walk_top(osp_tokenizer *t, tk_json *j, top_spans *ts, model_hdr *mh) {
    tk_buf key = {0};
    osp_status st = tkj_expect(j, '{');
    int first = 1, have_model = 0;
    while (st == OSP_OK && tkj_obj_next(j, &first, &key, &st) == 1) {
        tkj_ws(j);
        span *sp = NULL;
        if (!strcmp(key.p, "model")) {
            if (have_model) {
                st = tkj_error(j, "\"model\" given twice");
                break;
            }
            have_model = 1;
            st = parse_model(t, j, mh);
            continue;
        }
        if (!strcmp(key.p, "added_tokens")) {
            st = parse_added(t, j);
            continue;
        }
        if (!strcmp(key.p, "normalizer")) sp = &ts->norm;
        else if (!strcmp(key.p, "pre_tokenizer")) sp = &ts->pre;
        else if (!strcmp(key.p, "post_processor")) sp = &ts->post;
        else if (!strcmp(key.p, "decoder")) sp = &ts->dec;
        const char *b = j->p;
        st = tkj_skip(j);
        if (sp) {
            sp->b = b;
            sp->e = j->p;
        }
    }
    tk_buf_free(&key);
    if (st != OSP_OK) return st;
    tkj_ws(j);
    if (j->p != j->end) return tkj_error(j, "trailing data after the top-level object");
    if (!have_model) return osp_err(OSP_ERR_FORMAT, "%s: no \"model\"", t->name);
    return OSP_OK;
}

static osp_status load_stage(osp_tokenizer *t, span sp, const char *what,
                             osp_status (*fn)(osp_tokenizer *, const void *)) {
    if (!sp.b) return OSP_OK;
    json_t *v;
    OSP_TRY(json_sub(t, sp, what, &v));
    osp_status st = json_is_null(v) ? OSP_OK : fn(t, v);
    json_decref(v);
    return st;
}

static osp_status load_json(osp_tokenizer *t, const char *json, size_t len, const char *cfg, size_t cfg_len) {
    tk_json j = {json, json, json + len, t->name};
    top_spans ts = {0};
    model_hdr mh = {.unk_id = -1};
    osp_status st = walk_top(t, &j, &ts, &mh);
    int32_t max_id = t->n_vocab - 1;
    for (int32_t i = 0; i < t->n_added; i++)
        if (t->added[i].id > max_id) max_id = t->added[i].id;
    if (st == OSP_OK && (int64_t)max_id >= 2 * ((int64_t)t->n_vocab + t->n_added) + 65536)
        st = osp_err(OSP_ERR_FORMAT, "%s: added token ids are far beyond the vocabulary (%d tokens, largest id %d)",
                     t->name, t->n_vocab + t->n_added, max_id);
    if (st == OSP_OK) st = tk_ids_resize(t, max_id + 1);
    if (st == OSP_OK && mh.unk && tk_vocab_find(t, mh.unk, strlen(mh.unk), &t->unk_id) != OSP_OK)
        st = osp_err(OSP_ERR_FORMAT, "%s: unk_token '%s' is not in the vocab", t->name, mh.unk);
    osp_free(mh.unk);
    if (st == OSP_OK) st = load_stage(t, ts.norm, "normalizer", tk_norm_parse);
    if (st == OSP_OK) st = tk_added_finish(t);
    if (st == OSP_OK) st = load_stage(t, ts.pre, "pre_tokenizer", tk_pretok_parse);
    if (st == OSP_OK) st = load_stage(t, ts.dec, "decoder", tk_decoder_parse);
    if (st == OSP_OK) st = load_stage(t, ts.post, "post_processor", tk_post_parse);
    if (st == OSP_OK) st = tk_finish_model(t);
    if (st == OSP_OK) st = tk_config_parse(t, cfg, cfg_len);
    return st;
}

osp_status osp_tokenizer_load_json(const char *json, size_t json_len, const char *config, size_t config_len,
                                   const char *name, osp_tokenizer **out) {
    *out = NULL;
    if (!json) return osp_err(OSP_ERR_INVALID, "tokenizer: no JSON given");
    osp_tokenizer *t;
    OSP_TRY(tk_tokenizer_new(name ? name : "tokenizer.json", &t));
    osp_status st = load_json(t, json, json_len, config, config_len);
    if (st != OSP_OK) {
        osp_tokenizer_free(t);
        return st;
    }
    *out = t;
    return OSP_OK;
}

/* ---- files ---- */

static osp_status read_file(const char *path, char **buf, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return osp_err(OSP_ERR_IO, "%s: cannot open", path);
    osp_status st = OSP_OK;
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) st = osp_err(OSP_ERR_IO, "%s: cannot read", path);
    char *b = NULL;
    if (st == OSP_OK && !(b = osp_malloc(OSP_POOL_MISC, (size_t)sz + 1)))
        st = osp_err(OSP_ERR_NOMEM, "%s: out of memory (%ld bytes)", path, sz);
    if (st == OSP_OK && fread(b, 1, (size_t)sz, f) != (size_t)sz) st = osp_err(OSP_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (st != OSP_OK) {
        osp_free(b);
        return st;
    }
    b[sz] = 0;
    *buf = b;
    *n = (size_t)sz;
    return OSP_OK;
}

osp_status osp_tokenizer_load(const char *path, osp_tokenizer **out) {
    *out = NULL;
    if (!path || !*path) return osp_err(OSP_ERR_INVALID, "tokenizer: no path given");
    char dir[4096], jpath[4096 + 32], cpath[4096 + 32];
    if (osp_is_file(path)) {
        snprintf(jpath, sizeof jpath, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    } else if (osp_is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(jpath, sizeof jpath, "%s/tokenizer.json", dir);
        if (!osp_is_file(jpath) && osp_hf_snapshot(path, dir, sizeof dir))
            snprintf(jpath, sizeof jpath, "%s/tokenizer.json", dir);
        if (!osp_is_file(jpath)) return osp_err(OSP_ERR_IO, "%s: no tokenizer.json in this folder", path);
    } else {
        return osp_err(OSP_ERR_IO, "%s: no such file or folder", path);
    }
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", dir);
    char *json = NULL, *cfg = NULL;
    size_t jn = 0, cn = 0;
    OSP_TRY(read_file(jpath, &json, &jn));
    osp_status st = OSP_OK;
    if (osp_is_file(cpath)) st = read_file(cpath, &cfg, &cn);
    if (st == OSP_OK) st = osp_tokenizer_load_json(json, jn, cfg, cn, jpath, out);
    osp_free(json);
    osp_free(cfg);
    return st;
}
