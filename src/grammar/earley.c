/* grammar/earley: the grammar builder and an Earley parser whose terminals
 * are lexemes (DFAs).
 *
 * Layout: every set lives in one item array (gr_parser.items), set k at
 * items[set_start[k] ..]. A set only ever grows at the end of the array, so
 * trying a byte is pushing a set and forgetting it is popping one: the mask
 * walk (matcher.c) and rollback use that. An item waiting on a terminal
 * carries that terminal's DFA state; a byte advances it in the DFA, and
 * where the DFA accepts, the item also moves past the terminal (a lexeme
 * may end wherever its DFA accepts: JSON's lexemes are self-delimiting, and
 * the parser rejects the wrong cuts). Nullable nonterminals are advanced
 * over when predicted (Aycock and Horspool).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"

/* ---- builder ---- */
void gr_b_init(gr_builder *b) {
    memset(b, 0, sizeof *b);
    b->key_mask = 1023;
    b->key_slot = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (b->key_mask + 1));
    memset(b->key_slot, -1, sizeof(int32_t) * (b->key_mask + 1));
}
void gr_b_free(gr_builder *b) {
    for (int32_t i = 0; i < b->n_terms; i++) gr_dfa_free(&b->terms[i]), osp_free(b->term_key[i]);
    osp_free(b->terms), osp_free(b->term_key), osp_free(b->prods), osp_free(b->syms), osp_free(b->key_slot);
    memset(b, 0, sizeof *b);
}
int32_t gr_b_nt(gr_builder *b) { return b->n_nt++; }

static void *grow(void *p, size_t used, size_t *cap, size_t need, size_t elt) {
    if (need <= *cap) return p;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *n = osp_malloc(OSP_POOL_MISC, nc * elt);
    if (p) memcpy(n, p, used * elt);
    osp_free(p);
    *cap = nc;
    return n;
}

osp_status gr_b_prod(gr_builder *b, int32_t lhs, const int32_t *rhs, uint32_t n) {
    if (b->n_prods > 2000000 || b->n_syms > 8000000) return osp_err(OSP_ERR_UNSUPPORTED, "grammar too large");
    size_t cp = b->cap_prods, cs = b->cap_syms;
    b->prods = grow(b->prods, b->n_prods, &cp, b->n_prods + 1, sizeof(gr_prod));
    b->syms = grow(b->syms, b->n_syms, &cs, b->n_syms + n, sizeof(int32_t));
    b->cap_prods = (int32_t)cp, b->cap_syms = (uint32_t)cs;
    b->prods[b->n_prods++] = (gr_prod){lhs, b->n_syms, n};
    if (n) memcpy(b->syms + b->n_syms, rhs, n * sizeof(int32_t));
    b->n_syms += n;
    return OSP_OK;
}

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}
static osp_status add_term(gr_builder *b, gr_dfa *d, char *key, int32_t *sym) {
    size_t ct = b->cap_terms, ck = b->cap_terms;
    b->terms = grow(b->terms, b->n_terms, &ct, b->n_terms + 1, sizeof(gr_dfa));
    b->term_key = grow(b->term_key, b->n_terms, &ck, b->n_terms + 1, sizeof(char *));
    b->cap_terms = (int32_t)ct;
    b->terms[b->n_terms] = *d;
    b->term_key[b->n_terms] = key;
    if (key) {
        if ((uint32_t)b->n_terms * 2 > b->key_mask) { /* rehash */
            uint32_t nm = b->key_mask * 2 + 1;
            int32_t *ns = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (nm + 1));
            memset(ns, -1, sizeof(int32_t) * (nm + 1));
            for (int32_t i = 0; i < b->n_terms; i++) {
                if (!b->term_key[i]) continue;
                uint32_t h = hash_str(b->term_key[i]) & nm;
                while (ns[h] >= 0) h = (h + 1) & nm;
                ns[h] = i;
            }
            osp_free(b->key_slot);
            b->key_slot = ns, b->key_mask = nm;
        }
        uint32_t h = hash_str(key) & b->key_mask;
        while (b->key_slot[h] >= 0) h = (h + 1) & b->key_mask;
        b->key_slot[h] = b->n_terms;
    }
    *sym = -b->n_terms - 1;
    b->n_terms++;
    return OSP_OK;
}
static int32_t find_term(gr_builder *b, const char *key) {
    for (uint32_t h = hash_str(key) & b->key_mask;; h = (h + 1) & b->key_mask) {
        int32_t i = b->key_slot[h];
        if (i < 0) return -1;
        if (!strcmp(b->term_key[i], key)) return i;
    }
}

/* Compiled regexes by (mode, text), process-wide: every schema has JSON's
 * strings, numbers, whitespace and punctuation, and the subset construction
 * was most of a compile. Entries are copied in and out; bounded by count and
 * by bytes (later regexes compile each time once it is full). */
#define RC_MAX 8192
#define RC_MAX_BYTES ((size_t)64 << 20)
static struct {
    pthread_mutex_t mu;
    char **key;
    gr_dfa *dfa;
    int32_t *slot;
    uint32_t mask;
    int32_t n;
    size_t bytes;
} rc = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, NULL, 0, 0, 0};

static void dfa_copy(gr_dfa *to, const gr_dfa *from) {
    *to = *from;
    size_t cells = (size_t)from->nstates * from->ncls;
    to->next = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cells);
    memcpy(to->next, from->next, sizeof(int32_t) * cells);
    to->accept = osp_malloc(OSP_POOL_MISC, from->nstates);
    memcpy(to->accept, from->accept, from->nstates);
    to->base = NULL, to->base_st = NULL, to->on_trie = NULL;
}
static uint32_t hash_str(const char *s);
static int regex_cache_get(const char *key, gr_dfa *out) {
    int hit = 0;
    pthread_mutex_lock(&rc.mu);
    if (rc.slot)
        for (uint32_t h = hash_str(key) & rc.mask; rc.slot[h] >= 0; h = (h + 1) & rc.mask)
            if (!strcmp(rc.key[rc.slot[h]], key)) {
                dfa_copy(out, &rc.dfa[rc.slot[h]]);
                hit = 1;
                break;
            }
    pthread_mutex_unlock(&rc.mu);
    return hit;
}
static void regex_cache_put(const char *key, const gr_dfa *d) {
    if ((size_t)d->nstates * d->ncls > (1u << 16)) return; /* large ones are rare and would crowd it */
    pthread_mutex_lock(&rc.mu);
    if (!rc.slot) {
        rc.mask = RC_MAX * 2 - 1;
        rc.slot = malloc(sizeof(int32_t) * (rc.mask + 1));
        memset(rc.slot, -1, sizeof(int32_t) * (rc.mask + 1));
        rc.key = malloc(sizeof(char *) * RC_MAX);
        rc.dfa = malloc(sizeof(gr_dfa) * RC_MAX);
    }
    const size_t bytes = strlen(key) + 1 + (size_t)d->nstates * d->ncls * sizeof(int32_t) + (size_t)d->nstates;
    if (rc.n < RC_MAX && rc.bytes + bytes <= RC_MAX_BYTES) {
        uint32_t h = hash_str(key) & rc.mask;
        while (rc.slot[h] >= 0 && strcmp(rc.key[rc.slot[h]], key)) h = (h + 1) & rc.mask;
        if (rc.slot[h] < 0) {
            rc.key[rc.n] = strdup(key);
            dfa_copy(&rc.dfa[rc.n], d);
            rc.slot[h] = rc.n++;
            rc.bytes += bytes;
        }
    }
    pthread_mutex_unlock(&rc.mu);
}

osp_status gr_regex_dfa_cached(const char *re, int mode, gr_dfa *out) {
    size_t n = strlen(re);
    char *key = osp_malloc(OSP_POOL_MISC, n + 3);
    key[0] = (char)('0' + mode), key[1] = ':';
    memcpy(key + 2, re, n + 1);
    osp_status st = OSP_OK;
    if (!regex_cache_get(key, out)) {
        st = gr_regex_dfa(re, n, mode, out);
        if (!st) regex_cache_put(key, out);
    }
    osp_free(key);
    return st;
}

osp_status gr_b_regex(gr_builder *b, const char *re, int mode, int32_t *sym) {
    size_t n = strlen(re);
    char *key = osp_malloc(OSP_POOL_MISC, n + 3);
    key[0] = (char)('0' + mode), key[1] = ':';
    memcpy(key + 2, re, n + 1);
    int32_t t = find_term(b, key);
    if (t >= 0) {
        osp_free(key);
        *sym = -t - 1;
        return OSP_OK;
    }
    gr_dfa d;
    if (!regex_cache_get(key, &d)) {
        osp_status st = gr_regex_dfa(re, n, mode, &d);
        if (st) {
            osp_free(key);
            return st;
        }
        regex_cache_put(key, &d);
    }
    return add_term(b, &d, key, sym);
}

osp_status gr_b_lit(gr_builder *b, const char *s, size_t n, int32_t *sym) {
    /* as a plain regex of \xNN escapes */
    char *re = osp_malloc(OSP_POOL_MISC, n * 4 + 1);
    for (size_t i = 0; i < n; i++) {
        static const char hx[] = "0123456789abcdef";
        uint8_t c = (uint8_t)s[i];
        re[i * 4] = '\\', re[i * 4 + 1] = 'x', re[i * 4 + 2] = hx[c >> 4], re[i * 4 + 3] = hx[c & 15];
    }
    re[n * 4] = 0;
    osp_status st;
    if (n == 0) st = osp_err(OSP_ERR_INTERNAL, "empty literal terminal");
    else {
        /* \xNN above 0x7f is refused by the regex parser: build such literals directly */
        int ascii = 1;
        for (size_t i = 0; i < n; i++) ascii &= (uint8_t)s[i] < 0x80;
        if (ascii) st = gr_b_regex(b, re, GR_RE_PLAIN, sym);
        else {
            char *key = osp_malloc(OSP_POOL_MISC, n * 4 + 3);
            key[0] = 'L', key[1] = ':';
            memcpy(key + 2, re, n * 4 + 1);
            int32_t t = find_term(b, key);
            if (t >= 0) {
                osp_free(key);
                *sym = -t - 1;
                st = OSP_OK;
            } else {
                gr_dfa d = {0};
                d.ncls = 256;
                for (int c = 0; c < 256; c++) d.cls[c] = (uint8_t)c;
                d.nstates = (int32_t)n + 2;
                d.next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * d.nstates * 256);
                d.accept = osp_calloc(OSP_POOL_MISC, d.nstates);
                /* states: 1 start, 2..n+1 after i+1 bytes */
                for (size_t i = 0; i < n; i++) d.next[(i + 1) * 256 + (uint8_t)s[i]] = (int32_t)i + 2;
                d.accept[n + 1] = 1;
                st = add_term(b, &d, key, sym);
            }
        }
    }
    osp_free(re);
    return st;
}

osp_status gr_b_dfa(gr_builder *b, gr_dfa *d, int32_t *sym) { return add_term(b, d, NULL, sym); }


osp_status gr_b_finish(gr_builder *b, int32_t start, osp_grammar **out) {
    int32_t s0 = gr_b_nt(b);
    OSP_TRY(gr_b_prod(b, s0, &start, 1));
    /* drop productions that can derive no text (a false schema, a lexeme that matches nothing), so that a
     * live item can always be finished: the mask allows no dead end */
    uint8_t *tprod = osp_calloc(OSP_POOL_MISC, (size_t)b->n_terms + 1);
    for (int32_t t = 0; t < b->n_terms; t++) {
        const gr_dfa *d = &b->terms[t];
        for (int32_t c = 0; c < d->ncls && !tprod[t]; c++) tprod[t] = d->next[d->ncls + c] != 0;
    }
    uint8_t *prodv = osp_calloc(OSP_POOL_MISC, (size_t)b->n_nt + 1);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t i = 0; i < b->n_prods; i++) {
            const gr_prod *p = &b->prods[i];
            if (prodv[p->lhs]) continue;
            uint32_t k = 0;
            for (; k < p->len; k++) {
                int32_t y = b->syms[p->off + k];
                if (y >= 0 ? !prodv[y] : !tprod[-y - 1]) break;
            }
            if (k == p->len) prodv[p->lhs] = 1, changed = 1;
        }
    }
    int32_t kept = 0;
    for (int32_t i = 0; i < b->n_prods; i++) {
        const gr_prod *p = &b->prods[i];
        uint32_t k = 0;
        for (; k < p->len; k++) {
            int32_t y = b->syms[p->off + k];
            if (y >= 0 ? !prodv[y] : !tprod[-y - 1]) break;
        }
        if (k == p->len || p->lhs == s0) b->prods[kept++] = *p;
    }
    b->n_prods = kept;
    osp_free(tprod), osp_free(prodv);
    osp_grammar *g = osp_calloc(OSP_POOL_MISC, sizeof *g);
    g->n_nt = b->n_nt, g->n_prods = b->n_prods, g->n_terms = b->n_terms;
    g->prods = b->prods, g->syms = b->syms, g->terms = b->terms;
    { /* by lhs, keeping the order of each lhs's productions: a counting sort (by lhs, then by position) */
        uint32_t *cnt = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * ((size_t)g->n_nt + 1));
        for (int32_t i = 0; i < g->n_prods; i++) cnt[g->prods[i].lhs + 1]++;
        for (int32_t a = 0; a < g->n_nt; a++) cnt[a + 1] += cnt[a];
        gr_prod *sorted = osp_malloc(OSP_POOL_MISC, sizeof(gr_prod) * ((size_t)g->n_prods + 1));
        for (int32_t i = 0; i < g->n_prods; i++) sorted[cnt[g->prods[i].lhs]++] = g->prods[i];
        osp_free(g->prods), osp_free(cnt);
        g->prods = sorted;
    }
    g->nt_first = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (g->n_nt + 1));
    for (int32_t i = 0; i < g->n_prods; i++) g->nt_first[g->prods[i].lhs + 1]++;
    for (int32_t a = 0; a < g->n_nt; a++) g->nt_first[a + 1] += g->nt_first[a];
    g->start = g->nt_first[s0];
    g->nullable = osp_calloc(OSP_POOL_MISC, g->n_nt);
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t i = 0; i < g->n_prods; i++) {
            const gr_prod *p = &g->prods[i];
            if (g->nullable[p->lhs]) continue;
            uint32_t k = 0;
            while (k < p->len && g->syms[p->off + k] >= 0 && g->nullable[g->syms[p->off + k]]) k++;
            if (k == p->len) g->nullable[p->lhs] = 1, changed = 1;
        }
    }
    for (int32_t i = 0; i < b->n_terms; i++) osp_free(b->term_key[i]);
    osp_free(b->term_key), osp_free(b->key_slot);
    memset(b, 0, sizeof *b);
    *out = g;
    return OSP_OK;
}

/* ---- parser ---- */
osp_status gr_parser_init(gr_parser *p, const osp_grammar *g) {
    memset(p, 0, sizeof *p);
    p->g = g;
    p->cap_items = 1024, p->cap_sets = 256;
    p->items = osp_malloc(OSP_POOL_MISC, sizeof(gr_item) * p->cap_items);
    p->set_start = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * p->cap_sets);
    p->hmask = 4095;
    p->hslot = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * (p->hmask + 1));
    p->hstamp = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * (p->hmask + 1));
    gr_set_open(p);
    gr_set_add(p, (uint32_t)g->start, 0, 0, 0);
    gr_set_close(p);
    return OSP_OK;
}
void gr_parser_free(gr_parser *p) {
    osp_free(p->items), osp_free(p->set_start), osp_free(p->hslot), osp_free(p->hstamp);
    memset(p, 0, sizeof *p);
}

void gr_set_open(gr_parser *p) {
    if (p->n_sets == p->cap_sets) {
        uint32_t *n = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * p->cap_sets * 2);
        memcpy(n, p->set_start, sizeof(uint32_t) * p->n_sets);
        osp_free(p->set_start);
        p->set_start = n, p->cap_sets *= 2;
    }
    p->set_start[p->n_sets++] = p->n_items;
    if (++p->stamp == 0) { /* wrapped: clear the stamps */
        memset(p->hstamp, 0, sizeof(uint32_t) * (p->hmask + 1));
        p->stamp = 1;
    }
}
void gr_parser_pop(gr_parser *p) {
    p->n_items = p->set_start[--p->n_sets];
    if (++p->stamp == 0) {
        memset(p->hstamp, 0, sizeof(uint32_t) * (p->hmask + 1));
        p->stamp = 1;
    }
}

static inline uint32_t item_hash(uint32_t prod, uint32_t dot, uint32_t origin, int32_t st) {
    uint32_t h = prod * 0x9E3779B1u ^ dot * 0x85EBCA77u ^ origin * 0xC2B2AE3Du ^ (uint32_t)st * 0x27D4EB2Fu;
    return h ^ (h >> 15);
}

static void rehash(gr_parser *p) {
    uint32_t nm = p->hmask * 2 + 1;
    osp_free(p->hslot), osp_free(p->hstamp);
    p->hslot = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * (nm + 1));
    p->hstamp = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * (nm + 1));
    p->hmask = nm, p->stamp = 1;
    uint32_t k = p->set_start[p->n_sets - 1];
    for (uint32_t i = k; i < p->n_items; i++) {
        const gr_item *it = &p->items[i];
        uint32_t h = item_hash(it->prod, it->dot, it->origin, it->st) & nm;
        while (p->hstamp[h] == p->stamp) h = (h + 1) & nm;
        p->hstamp[h] = p->stamp, p->hslot[h] = i;
    }
}

void gr_set_add(gr_parser *p, uint32_t prod, uint32_t dot, uint32_t origin, int32_t st) {
    const osp_grammar *g = p->g;
    const gr_prod *pr = &g->prods[prod];
    int32_t sym = dot < pr->len ? g->syms[pr->off + dot] : INT32_MAX;
    if (sym < 0) {
        if (st == 0) st = 1;
    } else st = 0;
    uint32_t k = p->set_start[p->n_sets - 1];
    if ((p->n_items - k + 1) * 2 > p->hmask) rehash(p);
    uint32_t h = item_hash(prod, dot, origin, st) & p->hmask;
    for (; p->hstamp[h] == p->stamp; h = (h + 1) & p->hmask) {
        const gr_item *it = &p->items[p->hslot[h]];
        if (it->prod == prod && it->dot == dot && it->origin == origin && it->st == st) return;
    }
    if (p->n_items == p->cap_items) {
        gr_item *n = osp_malloc(OSP_POOL_MISC, sizeof(gr_item) * p->cap_items * 2);
        memcpy(n, p->items, sizeof(gr_item) * p->n_items);
        osp_free(p->items);
        p->items = n, p->cap_items *= 2;
    }
    p->hstamp[h] = p->stamp, p->hslot[h] = p->n_items;
    p->items[p->n_items++] = (gr_item){prod, dot, origin, st, sym};
}

void gr_set_close(gr_parser *p) {
    const osp_grammar *g = p->g;
    uint32_t cur = p->n_sets - 1;
    for (uint32_t i = p->set_start[cur]; i < p->n_items; i++) {
        gr_item it = p->items[i];
        int32_t sym = gr_next_sym(g, &it);
        if (sym == INT32_MAX) { /* complete: advance the items that waited on lhs */
            int32_t lhs = g->prods[it.prod].lhs;
            uint32_t o = it.origin;
            /* an empty derivation: lhs is nullable, and the predictor advanced every item waiting on it */
            if (o == cur) continue;
            uint32_t end = o + 1 < p->n_sets ? p->set_start[o + 1] : p->n_items;
            for (uint32_t j = p->set_start[o]; j < end; j++) {
                const gr_item *w = &p->items[j];
                if (w->sym == lhs) gr_set_add(p, w->prod, w->dot + 1, w->origin, 0);
            }
        } else if (sym >= 0) {
            for (int32_t q = g->nt_first[sym]; q < g->nt_first[sym + 1]; q++) gr_set_add(p, (uint32_t)q, 0, cur, 0);
            if (g->nullable[sym]) gr_set_add(p, it.prod, it.dot + 1, it.origin, 0);
        }
    }
}

int gr_step(gr_parser *p, uint8_t b) {
    const osp_grammar *g = p->g;
    uint32_t k = p->n_sets - 1, s = p->set_start[k], e = p->n_items;
    gr_set_open(p);
    for (uint32_t i = s; i < e; i++) {
        gr_item it = p->items[i];
        if (it.st <= 0) continue;
        int32_t sym = gr_next_sym(g, &it);
        const gr_dfa *d = &g->terms[-sym - 1];
        int32_t ns = gr_dfa_next(d, it.st, b);
        if (!ns) continue;
        gr_set_add(p, it.prod, it.dot, it.origin, ns);
        if (d->accept[ns]) gr_set_add(p, it.prod, it.dot + 1, it.origin, 0);
    }
    if (p->n_items == p->set_start[p->n_sets - 1]) {
        gr_parser_pop(p);
        return 0;
    }
    gr_set_close(p);
    return 1;
}

int gr_accepting(const gr_parser *p) {
    uint32_t k = p->n_sets - 1;
    for (uint32_t i = p->set_start[k]; i < p->n_items; i++) {
        const gr_item *it = &p->items[i];
        if (it->prod == (uint32_t)p->g->start && it->origin == 0 && gr_next_sym(p->g, it) == INT32_MAX) return 1;
    }
    return 0;
}
