/* grammar/matcher: one constrained row's parse, its token masks and commits.
 *
 * The mask is a walk of the vocab trie in lockstep with the lexemes the
 * parser waits on. Inside a lexeme only DFA states change (a table lookup a
 * node); the parser is consulted only where a lexeme can end: there the
 * Earley set that follows is built (pushed) and the walk goes on below that
 * node from it, then the set is popped.
 *
 * Fast path: what a lexeme allows from the trie's root depends only on its
 * DFA and state, so per (DFA, state) the vocab caches the tokens that stay
 * inside the lexeme ("inside") and the trie nodes where it can end with
 * more bytes below ("frontier"; cache.c, shared across threads). A mask is
 * then the union of the
 * cached inside sets of the waiting items plus walks below their frontier
 * nodes. A JSON string's state allows ~all of the vocabulary, which the
 * plain walk visits node by node; the cache makes that a bitset OR.
 * osp_grammar_matcher_mask_reference is the plain walk, kept as the twin.
 */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"

struct osp_grammar_matcher {
    osp_grammar *g;
    const osp_grammar_vocab *v;
    gr_parser p;
    uint32_t *saved; /* n_sets before each commit */
    int32_t n_saved, cap_saved;
    int32_t words;
    /* walk scratch: active lexemes (item index, terminal, state) */
    int32_t *act;
    size_t act_top, act_cap;
    uint32_t *tmp;     /* [words]: one item's share of a mask */
    uint32_t *ex_node; /* trie nodes a word exclusion kills */
    int32_t n_ex, cap_ex;
};

static inline void mark(const osp_grammar_vocab *v, int32_t tok, uint32_t *bits) {
    for (; tok >= 0; tok = v->dup_next[tok]) bits[tok >> 5] |= 1u << (tok & 31);
}

static int32_t *act_alloc(osp_grammar_matcher *m, size_t n) {
    if (m->act_top + n > m->act_cap) {
        size_t nc = m->act_cap * 2;
        while (nc < m->act_top + n) nc *= 2;
        int32_t *a = osp_malloc(OSP_POOL_MISC, nc * sizeof(int32_t));
        memcpy(a, m->act, m->act_top * sizeof(int32_t));
        osp_free(m->act);
        m->act = a, m->act_cap = nc;
    }
    int32_t *r = m->act + m->act_top;
    m->act_top += n;
    return r;
}

static void walk(osp_grammar_matcher *m, uint32_t node, size_t a_off, int na, uint32_t *bits);

/* The item at index `it` ends its lexeme: push the set that follows and list
 * its waiting lexemes (item, terminal, state) on the act stack at *a_off.
 * The set is the same wherever in the trie the lexeme ends, so one push
 * serves all of an item's frontier nodes. Undo with frontier_close. */
static int frontier_open(osp_grammar_matcher *m, uint32_t it, size_t *a_off) {
    gr_parser *p = &m->p;
    gr_item x = p->items[it];
    gr_set_open(p);
    gr_set_add(p, x.prod, x.dot + 1, x.origin, 0);
    gr_set_close(p);
    uint32_t s = p->set_start[p->n_sets - 1], e = p->n_items;
    int na = 0;
    for (uint32_t i = s; i < e; i++)
        if (p->items[i].st > 0) na++;
    *a_off = (size_t)(act_alloc(m, (size_t)na * 3) - m->act);
    na = 0;
    for (uint32_t i = s; i < e; i++) {
        const gr_item *y = &p->items[i];
        if (y->st <= 0) continue;
        m->act[*a_off + na * 3] = (int32_t)i;
        m->act[*a_off + na * 3 + 1] = -gr_next_sym(p->g, y) - 1;
        m->act[*a_off + na * 3 + 2] = y->st;
        na++;
    }
    return na;
}
static void frontier_close(osp_grammar_matcher *m, size_t a_off) {
    m->act_top = a_off;
    gr_parser_pop(&m->p);
}
static void frontier(osp_grammar_matcher *m, uint32_t it, uint32_t node, uint32_t *bits) {
    size_t a_off;
    int na = frontier_open(m, it, &a_off);
    if (na) walk(m, node, a_off, na, bits);
    frontier_close(m, a_off);
}

static void walk(osp_grammar_matcher *m, uint32_t node, size_t a_off, int na, uint32_t *bits) {
    const osp_grammar_vocab *v = m->v;
    const gr_dfa *terms = m->g->terms;
    const gr_node *nodes = v->nodes;
    size_t save = m->act_top;
    size_t n_off = (size_t)(act_alloc(m, (size_t)na * 3) - m->act);
    for (uint32_t c = node + 1, end = nodes[node].end; c < end; c = nodes[c].end) {
        uint8_t b = nodes[c].byte;
        int k = 0;
        for (int j = 0; j < na; j++) {
            const int32_t *aj = m->act + a_off + j * 3;
            int32_t s2 = gr_dfa_next(&terms[aj[1]], aj[2], b);
            if (!s2) continue;
            int32_t *o = m->act + n_off + k * 3;
            o[0] = aj[0], o[1] = aj[1], o[2] = s2;
            k++;
        }
        if (!k) continue;
        mark(v, nodes[c].tok, bits);
        if (nodes[c].end == c + 1) continue;
        for (int j = 0; j < k; j++) {
            const int32_t *o = m->act + n_off + j * 3;
            if (terms[o[1]].accept[o[2]]) frontier(m, (uint32_t)o[0], c, bits);
        }
        walk(m, c, n_off, k, bits);
    }
    m->act_top = save;
}

void osp_grammar_free(osp_grammar *g) {
    if (!g) return;
    osp_free(g->term_vid);
    for (int32_t i = 0; i < g->n_terms; i++) gr_dfa_free(&g->terms[i]);
    osp_free(g->terms), osp_free(g->prods), osp_free(g->syms), osp_free(g->nt_first), osp_free(g->nullable);
    osp_free(g);
}

/* ---- matcher ---- */
osp_status osp_grammar_matcher_new(osp_grammar *g, const osp_grammar_vocab *v, osp_grammar_matcher **out) {
    OSP_TRY(gr_cache_bind(v->cache, g, v));
    osp_grammar_matcher *m = osp_calloc(OSP_POOL_MISC, sizeof *m);
    m->g = g, m->v = v;
    m->words = (v->n_tokens + 31) / 32;
    OSP_TRY(gr_parser_init(&m->p, g));
    m->act_cap = 4096;
    m->act = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * m->act_cap);
    m->tmp = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * m->words);
    m->cap_saved = 64;
    m->saved = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * m->cap_saved);
    *out = m;
    return OSP_OK;
}

void osp_grammar_matcher_free(osp_grammar_matcher *m) {
    if (!m) return;
    gr_parser_free(&m->p);
    osp_free(m->act), osp_free(m->saved), osp_free(m->tmp), osp_free(m->ex_node), osp_free(m);
}

static void eos_bit(osp_grammar_matcher *m, uint32_t *bits) {
    int32_t e = m->v->eos_id;
    if (e >= 0 && e < m->v->n_tokens && gr_accepting(&m->p)) bits[e >> 5] |= 1u << (e & 31);
}

void osp_grammar_matcher_mask_reference(osp_grammar_matcher *m, uint32_t *bits) {
    memset(bits, 0, sizeof(uint32_t) * m->words);
    gr_parser *p = &m->p;
    uint32_t s = p->set_start[p->n_sets - 1], e = p->n_items;
    int na = 0;
    size_t a_off = (size_t)(act_alloc(m, (size_t)(e - s) * 3) - m->act);
    for (uint32_t i = s; i < e; i++) {
        const gr_item *y = &p->items[i];
        if (y->st <= 0) continue;
        int32_t *o = m->act + a_off + na * 3;
        o[0] = (int32_t)i, o[1] = -gr_next_sym(p->g, y) - 1, o[2] = y->st;
        na++;
    }
    if (na) walk(m, 0, a_off, na, bits);
    m->act_top = 0;
    eos_bit(m, bits);
}

/* Where a DFA minus words differs from its base from state st: the trie
 * nodes at which the base lives and it dies (a word's closing byte). It can
 * only differ while on a word's path, so the walk follows those paths. */
static void ex_walk(osp_grammar_matcher *m, const gr_dfa *d, uint32_t node, int32_t st) {
    const gr_node *nodes = m->v->nodes;
    for (uint32_t c = node + 1, end = nodes[node].end; c < end; c = nodes[c].end) {
        int32_t s2 = gr_dfa_next(d, st, nodes[c].byte);
        int32_t b2 = gr_dfa_next(d->base, d->base_st[st], nodes[c].byte);
        if (b2 && !s2) {
            if (m->n_ex == m->cap_ex) {
                int32_t nc = m->cap_ex ? m->cap_ex * 2 : 16;
                uint32_t *a = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * nc);
                if (m->n_ex) memcpy(a, m->ex_node, sizeof(uint32_t) * m->n_ex);
                osp_free(m->ex_node);
                m->ex_node = a, m->cap_ex = nc;
            }
            m->ex_node[m->n_ex++] = c;
        } else if (s2 && d->on_trie[s2]) ex_walk(m, d, c, s2);
    }
}
static void exclusions(osp_grammar_matcher *m, const gr_dfa *d, int32_t st) {
    m->n_ex = 0;
    if (d->on_trie[st]) ex_walk(m, d, 0, st);
}

void osp_grammar_matcher_mask(osp_grammar_matcher *m, uint32_t *bits) {
    memset(bits, 0, sizeof(uint32_t) * m->words);
    gr_parser *p = &m->p;
    uint32_t s = p->set_start[p->n_sets - 1], e = p->n_items;
    gr_cache_enter(m->v->cache);
    for (uint32_t i = s; i < e; i++) {
        const gr_item *y = &p->items[i];
        if (y->st <= 0) continue;
        int32_t term = -gr_next_sym(p->g, y) - 1, st = y->st;
        const gr_dfa *d = &p->g->terms[term];
        const gr_centry *ce = gr_cache_get(m->v->cache, m->v, m->g->term_vid[term], d->base ? d->base : d,
                                           d->base ? d->base_st[st] : st);
        if (!ce) { /* cache full: this item by the plain walk */
            int32_t *o = act_alloc(m, 3);
            o[0] = (int32_t)i, o[1] = term, o[2] = st;
            walk(m, 0, (size_t)(o - m->act), 1, bits);
            m->act_top = 0;
            continue;
        }
        if (d->base) { /* the base's share, less the excluded words' tokens and frontier nodes */
            exclusions(m, d, st);
            uint32_t *t = m->tmp;
            if (ce->toks) {
                memset(t, 0, sizeof(uint32_t) * m->words);
                for (int32_t k = 0; k < ce->n_tok; k++) t[ce->toks[k] >> 5] |= 1u << (ce->toks[k] & 31);
            } else memcpy(t, ce->bits, sizeof(uint32_t) * m->words);
            for (int32_t x = 0; x < m->n_ex; x++)
                for (int32_t tk = m->v->nodes[m->ex_node[x]].tok; tk >= 0; tk = m->v->dup_next[tk])
                    t[tk >> 5] &= ~(1u << (tk & 31));
            for (int32_t w = 0; w < m->words; w++) bits[w] |= t[w];
            if (ce->n_front) {
                size_t a_off;
                int na = frontier_open(m, i, &a_off);
                for (int32_t f = 0; f < ce->n_front && na; f++) {
                    int skip = 0;
                    for (int32_t x = 0; x < m->n_ex && !skip; x++) skip = m->ex_node[x] == ce->fnode[f];
                    if (!skip) walk(m, ce->fnode[f], a_off, na, bits);
                }
                frontier_close(m, a_off);
            }
            continue;
        }
        /* the same (terminal, state) on an earlier item: inside already ORed */
        int dup = 0;
        for (uint32_t j = s; j < i && !dup; j++)
            dup = p->items[j].st == st && -gr_next_sym(p->g, &p->items[j]) - 1 == term;
        if (!dup) {
            if (ce->toks)
                for (int32_t k = 0; k < ce->n_tok; k++) bits[ce->toks[k] >> 5] |= 1u << (ce->toks[k] & 31);
            else
                for (int32_t w = 0; w < m->words; w++) bits[w] |= ce->bits[w];
        }
        if (ce->n_front) {
            size_t a_off;
            int na = frontier_open(m, i, &a_off);
            for (int32_t f = 0; f < ce->n_front && na; f++) walk(m, ce->fnode[f], a_off, na, bits);
            frontier_close(m, a_off);
        }
    }
    gr_cache_leave(m->v->cache);
    eos_bit(m, bits);
}

int osp_grammar_matcher_commit_bytes(osp_grammar_matcher *m, const char *bytes, size_t n) {
    gr_parser *p = &m->p;
    uint32_t save = p->n_sets;
    for (size_t i = 0; i < n; i++)
        if (!gr_step(p, (uint8_t)bytes[i])) {
            while (p->n_sets > save) gr_parser_pop(p);
            return 0;
        }
    if (m->n_saved == m->cap_saved) {
        uint32_t *a = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * m->cap_saved * 2);
        memcpy(a, m->saved, sizeof(uint32_t) * m->n_saved);
        osp_free(m->saved);
        m->saved = a, m->cap_saved *= 2;
    }
    m->saved[m->n_saved++] = save;
    return 1;
}

int osp_grammar_matcher_commit(osp_grammar_matcher *m, int32_t token) {
    const osp_grammar_vocab *v = m->v;
    if (token < 0 || token >= v->n_tokens) return 0;
    if (token == v->eos_id) return gr_accepting(&m->p);
    if (!v->tok_bytes[token] || !v->tok_len[token]) return 0;
    return osp_grammar_matcher_commit_bytes(m, v->tok_bytes[token], v->tok_len[token]);
}

void osp_grammar_matcher_rollback(osp_grammar_matcher *m, int n) {
    while (n-- > 0 && m->n_saved > 0) {
        uint32_t save = m->saved[--m->n_saved];
        while (m->p.n_sets > save) gr_parser_pop(&m->p);
    }
}

int osp_grammar_matcher_accepting(const osp_grammar_matcher *m) { return gr_accepting(&m->p); }
