/* Added tokens: matched before the model, the way the reference's
 * AddedVocabulary does it. Two byte tries: tokens with normalized=false are
 * matched on the raw text; the rest are matched, by their normalized form,
 * on each normalized piece. A scan takes at each position the longest token
 * starting there (leftmost-longest, like its Aho-Corasick), then applies
 * single_word (a match inside a word is dropped and the scan resumes after
 * it), lstrip (swallows the whitespace before, not past the previous cut)
 * and rstrip (swallows the whitespace after). */
#include <string.h>
#include "text/tokenizer_internal.h"

static int32_t trie_node(tk_trie *tr, uint8_t byte) {
    if (tr->n == tr->cap) {
        int32_t cap = tr->cap ? tr->cap * 2 : 256;
        tk_trie_node *q = tk_grow(tr->nodes, (size_t)tr->n, (size_t)cap, sizeof *q);
        if (!q) return -1;
        tr->nodes = q;
        tr->cap = cap;
    }
    tk_trie_node *nd = &tr->nodes[tr->n];
    nd->child = nd->sibling = nd->tok = -1;
    nd->byte = byte;
    return tr->n++;
}

static osp_status trie_insert(tk_trie *tr, const char *s, size_t n, int32_t tok) {
    const uint8_t *u = (const uint8_t *)s;
    if (!tr->used) {
        for (int i = 0; i < 256; i++) tr->root[i] = -1;
        tr->used = 1;
    }
    int32_t node = tr->root[u[0]];
    if (node < 0) {
        if ((node = trie_node(tr, u[0])) < 0) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
        tr->root[u[0]] = node;
    }
    for (size_t i = 1; i < n; i++) {
        int32_t c = tr->nodes[node].child, prev = -1;
        while (c >= 0 && tr->nodes[c].byte != u[i]) {
            prev = c;
            c = tr->nodes[c].sibling;
        }
        if (c < 0) {
            if ((c = trie_node(tr, u[i])) < 0) return osp_err(OSP_ERR_NOMEM, "tokenizer: out of memory");
            if (prev < 0) tr->nodes[node].child = c;
            else tr->nodes[prev].sibling = c;
        }
        node = c;
    }
    if (tr->nodes[node].tok < 0) tr->nodes[node].tok = tok;
    return OSP_OK;
}

/* Longest token starting at s[i]; returns its length (0: none). */
static size_t trie_longest(const tk_trie *tr, const char *s, size_t n, size_t i, int32_t *tok) {
    const uint8_t *u = (const uint8_t *)s;
    int32_t node = tr->root[u[i]];
    size_t best = 0, k = i;
    while (node >= 0) {
        if (tr->nodes[node].tok >= 0) {
            best = k - i + 1;
            *tok = tr->nodes[node].tok;
        }
        if (++k >= n) break;
        int32_t c = tr->nodes[node].child;
        while (c >= 0 && tr->nodes[c].byte != u[k]) c = tr->nodes[c].sibling;
        node = c;
    }
    return best;
}

static void trie_free(tk_trie *tr) {
    osp_free(tr->nodes);
    memset(tr, 0, sizeof *tr);
}

osp_status tk_added_finish(osp_tokenizer *t) {
    osp_free(t->added_of_id);
    t->added_of_id = osp_malloc(OSP_POOL_MISC, (size_t)(t->n_vocab > 0 ? t->n_vocab : 1) * sizeof *t->added_of_id);
    if (!t->added_of_id) return osp_err(OSP_ERR_NOMEM, "%s: out of memory", t->name);
    for (int32_t i = 0; i < t->n_vocab; i++) t->added_of_id[i] = -1;
    tk_ctx c;
    OSP_TRY(tk_ctx_init(&c, t));
    osp_status st = OSP_OK;
    for (int32_t i = 0; i < t->n_added && st == OSP_OK; i++) {
        tk_added *a = &t->added[i];
        if (a->id >= t->n_vocab) {
            st = osp_err(OSP_ERR_INTERNAL, "%s: added token id out of range", t->name);
            break;
        }
        if (t->added_of_id[a->id] >= 0) continue; /* first definition wins */
        t->added_of_id[a->id] = i;
        if (!a->normalized) {
            st = trie_insert(&t->trie_raw, a->s, a->len, i);
        } else {
            const char *ns;
            size_t nn;
            st = tk_normalize(&c, a->s, a->len, &ns, &nn);
            if (st == OSP_OK && nn > 0) st = trie_insert(&t->trie_norm, ns, nn, i);
        }
    }
    tk_ctx_free(&c);
    return st;
}

static size_t ws_before(const char *s, size_t from, size_t end) {
    /* start of the whitespace run that ends at `end`, not before `from` */
    size_t i = end;
    while (i > from) {
        size_t j = i - 1;
        while (j > from && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        int len;
        uint32_t cp = tk_u8dec(s + j, &len);
        if (!tk_is_white_space(cp)) break;
        i = j;
    }
    return i;
}

static size_t ws_after(const char *s, size_t i, size_t n) {
    while (i < n) {
        int len;
        uint32_t cp = tk_u8dec(s + i, &len);
        if (!tk_is_white_space(cp)) break;
        i += (size_t)len;
    }
    return i;
}

static int word_before(const char *s, size_t i) {
    if (i == 0) return 0;
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
    int len;
    return tk_is_word(tk_u8dec(s + j, &len));
}

static int word_after(const char *s, size_t i, size_t n) {
    if (i >= n) return 0;
    int len;
    return tk_is_word(tk_u8dec(s + i, &len));
}

osp_status tk_added_split(tk_ctx *c, const tk_trie *tr, const tk_piece *in, tk_pieces *out) {
    const osp_tokenizer *t = c->t;
    const char *s = in->s;
    size_t n = in->len, pos = 0, cut = 0; /* cut: end of the last emitted piece */
    if (!tr->used || n == 0) return tk_pieces_push(out, *in);
    while (pos < n) {
        if (tr->root[(uint8_t)s[pos]] < 0) {
            pos++;
            continue;
        }
        int32_t ti = -1;
        size_t len = trie_longest(tr, s, n, pos, &ti);
        if (!len) {
            pos++;
            continue;
        }
        const tk_added *a = &t->added[ti];
        size_t start = pos, stop = pos + len;
        pos = stop;
        if (a->single_word && (word_before(s, start) || word_after(s, stop, n))) continue;
        if (a->lstrip) {
            size_t ns = ws_before(s, 0, start);
            start = ns > cut ? ns : cut;
        }
        if (a->rstrip) stop = ws_after(s, stop, n);
        if (cut < start) {
            tk_piece pc = {s + cut, (uint32_t)(start - cut), -1, (uint8_t)(in->orig0 && cut == 0), in->bl};
            OSP_TRY(tk_pieces_push(out, pc));
        }
        tk_piece tp = {s + start, (uint32_t)(stop - start), a->id, 0, 0};
        OSP_TRY(tk_pieces_push(out, tp));
        cut = stop;
    }
    if (cut < n) {
        tk_piece pc = {s + cut, (uint32_t)(n - cut), -1, (uint8_t)(in->orig0 && cut == 0), in->bl};
        OSP_TRY(tk_pieces_push(out, pc));
    }
    return OSP_OK;
}

void tk_added_free(osp_tokenizer *t) {
    for (int32_t i = 0; i < t->n_added; i++) osp_free(t->added[i].s);
    osp_free(t->added);
    t->added = NULL;
    t->n_added = 0;
    trie_free(&t->trie_raw);
    trie_free(&t->trie_norm);
}
