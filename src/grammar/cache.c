/* grammar/cache: the vocab's lexeme masks by (interned DFA, state), shared
 * by every grammar and every matcher on one vocab, from any thread.
 *
 * What a lexeme allows from the trie's root depends only on its DFA and
 * state: per (DFA, state) an entry holds the tokens that stay inside the
 * lexeme (a list, or a bitset when long) and the trie nodes where it can
 * end with more bytes below (the frontier). DFAs are interned by content,
 * so a JSON string's lexeme is one cache whatever the schema.
 *
 * Concurrency. An entry is built by the thread that misses, outside any
 * lock, then published once into an open-addressing table of pointers with
 * a release store; it is never changed afterwards, so a hit is a probe of
 * acquire loads and no lock. Inserts, growth and interning take one mutex;
 * a grown table replaces the old one, which stays allocated (readers may
 * still probe it) until the next clear. A mask runs inside a read section
 * of an rwlock (gr_cache_enter/leave) so that the clear, which frees the
 * entries when the cache passes its memory budget, runs with no mask in
 * flight (write side, writers preferred so clears are not starved). Past
 * the budget and until that clear, misses are not cached: the caller walks
 * the trie plainly.
 *
 * Filling an entry walks the trie below the root in lockstep with the DFA;
 * for string lexemes, whose states treat most bytes alike, it walks the trie
 * folded by coarse byte classes instead (see the fold below), a small
 * fraction of the trie, built on the first fill and kept.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"


struct gr_ftrie;
static void ftrie_free(struct gr_ftrie *f);

typedef struct gr_ctable {
    _Atomic(gr_centry *) *slot; /* [mask + 1], NULL empty */
    uint32_t mask;
    struct gr_ctable *retired;  /* tables this one replaced, freed at the clear */
} gr_ctable;

struct gr_cache {
    pthread_rwlock_t life; /* read: a mask in flight; write: the clear */
    pthread_mutex_t mu;    /* inserts, growth, interning, binding grammars */
    _Atomic(gr_ctable *) tab;
    uint32_t n;            /* entries (under mu) */
    size_t bytes;          /* their size (under mu) */
    size_t budget;         /* bytes of entries before a clear */
    atomic_int full;       /* over budget: clear at the next gr_cache_leave */
    /* interned DFAs (copies), by content; under mu */
    gr_dfa *dfa;
    uint64_t *dhash;
    int32_t n_dfa, cap_dfa;
    int32_t *dslot; /* hash of dhash -> index, -1 */
    uint32_t dmask;
    /* the trie folded by byte classes, one per class map met (under mu, published like entries) */
    _Atomic(struct gr_ftrie *) fold; /* the trie folded by coarse classes, built once */
    atomic_int fold_claimed;
};
#define GR_INTERN_MAX_CELLS (1u << 20) /* larger DFAs get no cache: walked plainly */
#define GR_CACHE_MAX_BYTES ((size_t)512 << 20)

static gr_ctable *table_new(uint32_t mask) {
    gr_ctable *t = osp_calloc(OSP_POOL_MISC, sizeof *t);
    t->slot = osp_calloc(OSP_POOL_MISC, sizeof(*t->slot) * (mask + 1));
    t->mask = mask;
    return t;
}

gr_cache *gr_cache_new(void) {
    gr_cache *C = osp_calloc(OSP_POOL_MISC, sizeof *C);
    pthread_rwlockattr_t a;
    pthread_rwlockattr_init(&a);
#ifdef __GLIBC__
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    pthread_rwlock_init(&C->life, &a);
    pthread_rwlockattr_destroy(&a);
    pthread_mutex_init(&C->mu, NULL);
    atomic_init(&C->tab, table_new(63));
    atomic_init(&C->full, 0);
    C->budget = GR_CACHE_MAX_BYTES;
    return C;
}

static void entry_free(gr_centry *e) {
    osp_free(e->toks), osp_free(e->bits), osp_free(e->fnode), osp_free(e->fstate), osp_free(e);
}

/* Frees every entry and the retired tables; no reader may be in flight. */
static void clear_entries(gr_cache *C) {
    gr_ctable *t = atomic_load_explicit(&C->tab, memory_order_relaxed);
    for (uint32_t i = 0; i <= t->mask; i++) {
        gr_centry *e = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
        if (e) entry_free(e);
        atomic_store_explicit(&t->slot[i], NULL, memory_order_relaxed);
    }
    for (gr_ctable *r = t->retired, *nx; r; r = nx) {
        nx = r->retired;
        osp_free(r->slot), osp_free(r);
    }
    t->retired = NULL;
    C->n = 0, C->bytes = 0;
    atomic_store(&C->full, 0);
}

void gr_cache_free(gr_cache *C) {
    if (!C) return;
    clear_entries(C);
    gr_ctable *t = atomic_load(&C->tab);
    osp_free(t->slot), osp_free(t);
    for (int32_t i = 0; i < C->n_dfa; i++) gr_dfa_free(&C->dfa[i]);
    osp_free(C->dfa), osp_free(C->dhash), osp_free(C->dslot);
    ftrie_free(atomic_load(&C->fold));
    pthread_rwlock_destroy(&C->life);
    pthread_mutex_destroy(&C->mu);
    osp_free(C);
}

void gr_cache_set_budget(gr_cache *C, size_t bytes) {
    pthread_mutex_lock(&C->mu);
    C->budget = bytes;
    pthread_mutex_unlock(&C->mu);
}

void gr_cache_enter(gr_cache *C) { pthread_rwlock_rdlock(&C->life); }
void gr_cache_leave(gr_cache *C) {
    pthread_rwlock_unlock(&C->life);
    if (!atomic_load_explicit(&C->full, memory_order_relaxed)) return;
    pthread_rwlock_wrlock(&C->life);
    if (atomic_load(&C->full)) clear_entries(C); /* another thread may have cleared it first */
    pthread_rwlock_unlock(&C->life);
}

/* ---- interning ---- */
static uint64_t dfa_hash(const gr_dfa *d) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *parts[3] = {d->cls, (const uint8_t *)d->next, d->accept};
    size_t lens[3] = {256, sizeof(int32_t) * (size_t)d->nstates * d->ncls, (size_t)d->nstates};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < lens[k]; i++) h = (h ^ parts[k][i]) * 1099511628211ull;
    return h ^ (uint64_t)d->nstates << 40 ^ (uint64_t)d->ncls;
}
static int dfa_same(const gr_dfa *a, const gr_dfa *b) {
    return a->nstates == b->nstates && a->ncls == b->ncls && !memcmp(a->cls, b->cls, 256) &&
           !memcmp(a->accept, b->accept, a->nstates) &&
           !memcmp(a->next, b->next, sizeof(int32_t) * (size_t)a->nstates * a->ncls);
}
/* Under mu. */
static int32_t intern(gr_cache *C, const gr_dfa *d) {
    if ((size_t)d->nstates * d->ncls > GR_INTERN_MAX_CELLS) return -1;
    uint64_t h = dfa_hash(d);
    if ((uint32_t)(C->n_dfa + 1) * 2 > C->dmask) {
        uint32_t nm = C->dmask ? C->dmask * 2 + 1 : 1023;
        osp_free(C->dslot);
        C->dslot = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (nm + 1));
        memset(C->dslot, -1, sizeof(int32_t) * (nm + 1));
        C->dmask = nm;
        for (int32_t i = 0; i < C->n_dfa; i++) {
            uint32_t k = (uint32_t)C->dhash[i] & nm;
            while (C->dslot[k] >= 0) k = (k + 1) & nm;
            C->dslot[k] = i;
        }
    }
    uint32_t slot = (uint32_t)h & C->dmask;
    for (; C->dslot[slot] >= 0; slot = (slot + 1) & C->dmask) {
        int32_t i = C->dslot[slot];
        if (C->dhash[i] == h && dfa_same(&C->dfa[i], d)) return i;
    }
    if (C->n_dfa >= 1000000) return -1;
    C->dslot[slot] = C->n_dfa;
    if (C->n_dfa == C->cap_dfa) {
        int32_t nc = C->cap_dfa ? C->cap_dfa * 2 : 64;
        gr_dfa *a = osp_malloc(OSP_POOL_MISC, sizeof(gr_dfa) * nc);
        uint64_t *b = osp_malloc(OSP_POOL_MISC, sizeof(uint64_t) * nc);
        if (C->n_dfa) memcpy(a, C->dfa, sizeof(gr_dfa) * C->n_dfa), memcpy(b, C->dhash, 8 * (size_t)C->n_dfa);
        osp_free(C->dfa), osp_free(C->dhash);
        C->dfa = a, C->dhash = b, C->cap_dfa = nc;
    }
    gr_dfa *x = &C->dfa[C->n_dfa];
    *x = *d;
    x->base = NULL, x->base_st = NULL, x->on_trie = NULL;
    x->next = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (size_t)d->nstates * d->ncls);
    memcpy(x->next, d->next, sizeof(int32_t) * (size_t)d->nstates * d->ncls);
    x->accept = osp_malloc(OSP_POOL_MISC, d->nstates);
    memcpy(x->accept, d->accept, d->nstates);
    C->dhash[C->n_dfa] = h;
    return C->n_dfa++;
}

osp_status gr_cache_bind(gr_cache *C, osp_grammar *g, const osp_grammar_vocab *v) {
    osp_status st = OSP_OK;
    pthread_mutex_lock(&C->mu);
    if (g->cache_vocab && g->cache_vocab != v) st = osp_err(OSP_ERR_INVALID, "grammar: a grammar's matchers must share one vocab");
    else if (!g->cache_vocab) {
        g->term_vid = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (g->n_terms + 1));
        for (int32_t t = 0; t < g->n_terms; t++)
            g->term_vid[t] = intern(C, g->terms[t].base ? g->terms[t].base : &g->terms[t]);
        g->cache_vocab = v;
    }
    pthread_mutex_unlock(&C->mu);
    return st;
}

/* ---- entries ---- */
typedef struct cbuild {
    const osp_grammar_vocab *v;
    const gr_dfa *d;
    uint32_t *bits;
    int32_t n_tok;
    uint32_t *fnode;
    int32_t *fstate;
    int32_t n_front, cap_front;
} cbuild;

static void front_add(cbuild *cb, uint32_t node, int32_t st) {
    if (cb->n_front == cb->cap_front) {
        int32_t nc = cb->cap_front ? cb->cap_front * 2 : 16;
        uint32_t *a = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * nc);
        int32_t *b = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * nc);
        if (cb->n_front) memcpy(a, cb->fnode, 4 * cb->n_front), memcpy(b, cb->fstate, 4 * cb->n_front);
        osp_free(cb->fnode), osp_free(cb->fstate);
        cb->fnode = a, cb->fstate = b, cb->cap_front = nc;
    }
    cb->fnode[cb->n_front] = node, cb->fstate[cb->n_front] = st, cb->n_front++;
}

static void cache_dfs(cbuild *cb, uint32_t node, int32_t st) {
    const gr_node *nodes = cb->v->nodes;
    for (uint32_t c = node + 1, end = nodes[node].end; c < end; c = nodes[c].end) {
        const gr_node *cn = &nodes[c];
        int32_t s2 = gr_dfa_next(cb->d, st, cn->byte);
        if (!s2) continue;
        for (int32_t t = cn->tok; t >= 0; t = cb->v->dup_next[t]) cb->bits[t >> 5] |= 1u << (t & 31), cb->n_tok++;
        if (cn->end == c + 1) continue;
        if (cb->d->accept[s2]) front_add(cb, c, s2);
        cache_dfs(cb, c, s2);
    }
}

/* ---- the trie folded by coarse byte classes ----
 * The classes of a JSON string's bytes: the quote, the backslash, control bytes, the other ASCII bytes, and
 * UTF-8's ranges. A string lexeme's DFA (free, bounded, chunked, most formats) treats the bytes of each class
 * alike except just after a backslash, so the trie folded by these classes (ASCII tokens of one length
 * and quote/backslash layout share a path) is walked instead of the trie while the state treats them alike,
 * and below a state that does not, the trie nodes folded into that node are walked one by one. */
enum { FOLD_CLASSES = 17 };
static void fold_classes(uint8_t cls[256], uint8_t rep[FOLD_CLASSES]) {
    static const uint8_t lo[FOLD_CLASSES] = {0, 0x20, 0, 0, 0x80, 0x90, 0xa0, 0xc0, 0xc2, 0xe0, 0xe1, 0xed, 0xee, 0xf0, 0xf1, 0xf4, 0xf5};
    static const uint8_t hi[FOLD_CLASSES] = {0, 0x7f, 0, 0x1f, 0x8f, 0x9f, 0xbf, 0xc1, 0xdf, 0xe0, 0xec, 0xed, 0xef, 0xf0, 0xf3, 0xf4, 0xff};
    for (int k = 3; k < FOLD_CLASSES; k++)
        for (int b = lo[k]; b <= hi[k]; b++) cls[b] = (uint8_t)k;
    for (int b = 0x20; b < 0x80; b++) cls[b] = 1;
    cls['"'] = 0, cls['\\'] = 2;
    for (int k = 0; k < FOLD_CLASSES; k++) rep[k] = k == 0 ? '"' : k == 1 ? 'a' : k == 2 ? '\\' : lo[k];
}

typedef struct gr_ftrie {
    uint8_t cls[256], rep[FOLD_CLASSES];
    int32_t n;          /* nodes; 0 is the root */
    int32_t *kid;       /* [n * FOLD_CLASSES]: child by class, -1 */
    uint32_t *tok_off;  /* [n + 1]: tokens spelled by node i = toks[tok_off[i] .. tok_off[i+1]) */
    int32_t *toks;
    uint32_t *fr_off;   /* [n + 1]: trie nodes with children folded into i = fr[fr_off[i] ..) */
    uint32_t *fr;
} gr_ftrie;

static void ftrie_free(gr_ftrie *f) {
    if (!f) return;
    osp_free(f->kid), osp_free(f->tok_off), osp_free(f->toks), osp_free(f->fr_off), osp_free(f->fr), osp_free(f);
}

static gr_ftrie *ftrie_build(const osp_grammar_vocab *v) {
    gr_ftrie *f = osp_calloc(OSP_POOL_MISC, sizeof *f);
    fold_classes(f->cls, f->rep);
    const int nc = FOLD_CLASSES;
    uint32_t cap = 1024;
    f->kid = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap * nc);
    memset(f->kid, -1, sizeof(int32_t) * cap * nc);
    int32_t *fold = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * v->n_nodes);
    f->n = 1;
    fold[0] = 0;
    const gr_node *nodes = v->nodes;
    /* preorder with a stack of open subtrees: a node's parent is the innermost one still open */
    uint32_t *stk = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * ((size_t)v->max_len + 2));
    int32_t sp = 0;
    stk[sp++] = 0;
    for (uint32_t c = 1; c < v->n_nodes; c++) {
        while (nodes[stk[sp - 1]].end <= c) sp--;
        int32_t pf = fold[stk[sp - 1]], k = f->cls[nodes[c].byte];
        int32_t *slot = &f->kid[(size_t)pf * nc + k];
        if (*slot < 0) {
            if ((uint32_t)f->n == cap) {
                int32_t *a = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * cap * 2 * nc);
                memcpy(a, f->kid, sizeof(int32_t) * cap * nc);
                memset(a + (size_t)cap * nc, -1, sizeof(int32_t) * cap * nc);
                osp_free(f->kid);
                f->kid = a, cap *= 2;
                slot = &f->kid[(size_t)pf * nc + k];
            }
            *slot = f->n++;
        }
        fold[c] = *slot;
        if (nodes[c].end > c + 1) stk[sp++] = c;
    }
    osp_free(stk);
    /* tokens and trie nodes with children per folded node: count, then fill */
    f->tok_off = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * ((size_t)f->n + 1));
    f->fr_off = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * ((size_t)f->n + 1));
    for (uint32_t c = 1; c < v->n_nodes; c++) {
        for (int32_t t = nodes[c].tok; t >= 0; t = v->dup_next[t]) f->tok_off[fold[c] + 1]++;
        if (nodes[c].end > c + 1) f->fr_off[fold[c] + 1]++;
    }
    for (int32_t i = 0; i < f->n; i++) f->tok_off[i + 1] += f->tok_off[i], f->fr_off[i + 1] += f->fr_off[i];
    f->toks = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (f->tok_off[f->n] + 1));
    f->fr = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * (f->fr_off[f->n] + 1));
    uint32_t *tp = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * f->n), *fp = osp_malloc(OSP_POOL_MISC, sizeof(uint32_t) * f->n);
    memcpy(tp, f->tok_off, sizeof(uint32_t) * f->n), memcpy(fp, f->fr_off, sizeof(uint32_t) * f->n);
    for (uint32_t c = 1; c < v->n_nodes; c++) {
        for (int32_t t = nodes[c].tok; t >= 0; t = v->dup_next[t]) f->toks[tp[fold[c]]++] = t;
        if (nodes[c].end > c + 1) f->fr[fp[fold[c]]++] = c;
    }
    osp_free(tp), osp_free(fp), osp_free(fold);
    return f;
}

/* The folded trie, built by the first thread that asks (the others walk the trie meanwhile). */
static const gr_ftrie *ftrie_get(gr_cache *C, const osp_grammar_vocab *v) {
    gr_ftrie *f = atomic_load_explicit(&C->fold, memory_order_acquire);
    if (f) return f;
    int zero = 0;
    if (!atomic_compare_exchange_strong(&C->fold_claimed, &zero, 1)) return NULL;
    f = ftrie_build(v);
    atomic_store_explicit(&C->fold, f, memory_order_release);
    return f;
}

/* Whether state st sends every byte of each fold class to one state (memo: 0 unknown, 1 yes, 2 no). */
static int fold_respects(const gr_ftrie *f, const gr_dfa *d, int32_t st, uint8_t *memo) {
    if (memo[st]) return memo[st] == 1;
    int32_t first[FOLD_CLASSES];
    for (int k = 0; k < FOLD_CLASSES; k++) first[k] = -1;
    int ok = 1;
    for (int b = 0; b < 256 && ok; b++) {
        int32_t t = gr_dfa_next(d, st, (uint8_t)b), k = f->cls[b];
        if (first[k] < 0) first[k] = t;
        else ok = first[k] == t;
    }
    memo[st] = ok ? 1 : 2;
    return ok;
}

static void cache_dfs(cbuild *cb, uint32_t node, int32_t st);
static void ftrie_dfs(cbuild *cb, const gr_ftrie *f, int32_t fn, int32_t st, uint8_t *memo) {
    const int32_t *kid = f->kid + (size_t)fn * FOLD_CLASSES;
    for (int32_t k = 0; k < FOLD_CLASSES; k++) {
        int32_t c = kid[k];
        if (c < 0) continue;
        int32_t s2 = gr_dfa_next(cb->d, st, f->rep[k]);
        if (!s2) continue;
        for (uint32_t i = f->tok_off[c]; i < f->tok_off[c + 1]; i++) {
            int32_t t = f->toks[i];
            cb->bits[t >> 5] |= 1u << (t & 31);
        }
        cb->n_tok += (int32_t)(f->tok_off[c + 1] - f->tok_off[c]);
        if (f->fr_off[c + 1] == f->fr_off[c]) continue; /* no trie node below */
        if (cb->d->accept[s2])
            for (uint32_t i = f->fr_off[c]; i < f->fr_off[c + 1]; i++) front_add(cb, f->fr[i], s2);
        if (fold_respects(f, cb->d, s2, memo)) ftrie_dfs(cb, f, c, s2, memo);
        else
            for (uint32_t i = f->fr_off[c]; i < f->fr_off[c + 1]; i++) cache_dfs(cb, f->fr[i], s2);
    }
}

static gr_centry *entry_build(gr_cache *C, const osp_grammar_vocab *v, const gr_dfa *d, int32_t st, uint64_t key,
                              size_t *bytes) {
    int32_t words = (v->n_tokens + 31) / 32;
    cbuild cb = {0};
    cb.v = v, cb.d = d;
    cb.bits = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * words);
    const gr_ftrie *f = ftrie_get(C, v);
    uint8_t *memo = f ? osp_calloc(OSP_POOL_MISC, (size_t)d->nstates) : NULL;
    if (f && fold_respects(f, d, st, memo)) ftrie_dfs(&cb, f, 0, st, memo);
    else cache_dfs(&cb, 0, st);
    osp_free(memo);
    gr_centry *e = osp_calloc(OSP_POOL_MISC, sizeof *e);
    e->key = key, e->n_tok = cb.n_tok, e->fnode = cb.fnode, e->fstate = cb.fstate, e->n_front = cb.n_front;
    if (cb.n_tok < words) {
        e->toks = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (cb.n_tok + 1));
        int32_t k = 0;
        for (int32_t w = 0; w < words; w++)
            for (uint32_t x = cb.bits[w]; x; x &= x - 1) e->toks[k++] = w * 32 + __builtin_ctz(x);
        osp_free(cb.bits);
        *bytes = sizeof(int32_t) * (size_t)cb.n_tok;
    } else {
        e->bits = cb.bits;
        *bytes = sizeof(uint32_t) * (size_t)words;
    }
    *bytes += 8 * (size_t)cb.n_front + sizeof *e;
    return e;
}

static inline uint32_t key_hash(uint64_t key) { return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32); }

static gr_centry *probe(gr_ctable *t, uint64_t key) {
    for (uint32_t h = key_hash(key) & t->mask;; h = (h + 1) & t->mask) {
        gr_centry *e = atomic_load_explicit(&t->slot[h], memory_order_acquire);
        if (!e || e->key == key) return e;
    }
}

/* Under mu: a table with room for one more, the old one retired. */
static gr_ctable *room(gr_cache *C) {
    gr_ctable *t = atomic_load_explicit(&C->tab, memory_order_relaxed);
    if ((C->n + 1) * 2 <= t->mask) return t;
    gr_ctable *nt = table_new(t->mask * 2 + 1);
    for (uint32_t i = 0; i <= t->mask; i++) {
        gr_centry *e = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
        if (!e) continue;
        uint32_t h = key_hash(e->key) & nt->mask;
        while (atomic_load_explicit(&nt->slot[h], memory_order_relaxed)) h = (h + 1) & nt->mask;
        atomic_store_explicit(&nt->slot[h], e, memory_order_relaxed);
    }
    nt->retired = t; /* older tables hang off t */
    atomic_store_explicit(&C->tab, nt, memory_order_release);
    return nt;
}

const gr_centry *gr_cache_get(gr_cache *C, const osp_grammar_vocab *v, int32_t vid, const gr_dfa *d, int32_t st) {
    if (vid < 0) return NULL;
    uint64_t key = (uint64_t)vid << 32 | (uint32_t)st;
    gr_centry *e = probe(atomic_load_explicit(&C->tab, memory_order_acquire), key);
    if (e) return e;
    if (atomic_load_explicit(&C->full, memory_order_relaxed)) return NULL;
    size_t bytes;
    gr_centry *mine = entry_build(C, v, d, st, key, &bytes);
    pthread_mutex_lock(&C->mu);
    gr_ctable *t = room(C);
    uint32_t h = key_hash(key) & t->mask;
    for (;; h = (h + 1) & t->mask) {
        e = atomic_load_explicit(&t->slot[h], memory_order_relaxed);
        if (!e || e->key == key) break;
    }
    if (!e) { /* ours is the first */
        atomic_store_explicit(&t->slot[h], mine, memory_order_release);
        C->n++, C->bytes += bytes;
        if (C->bytes > C->budget) atomic_store(&C->full, 1);
        e = mine, mine = NULL;
    }
    pthread_mutex_unlock(&C->mu);
    if (mine) entry_free(mine); /* another thread published the same entry first */
    return e;
}
