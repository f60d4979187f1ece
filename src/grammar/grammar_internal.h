/* grammar/ internals: DFAs, the grammar builder, the Earley parser. */
#ifndef OSP_GRAMMAR_INTERNAL_H
#define OSP_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"
#include "core/core.h"

/* A byte-level DFA. State 0 is dead, 1 the start; states that cannot reach
 * an accepting state are folded into 0, so a live state can always finish. */
typedef struct gr_dfa {
    uint8_t cls[256];   /* byte -> class */
    int32_t ncls, nstates;
    int32_t *next;      /* [nstates * ncls] */
    uint8_t *accept;    /* [nstates] */
    /* A DFA minus words (gr_dfa_minus_words) keeps its base: state s acts as
     * base state base_st[s] except while on_trie[s] (a prefix of a word), so
     * masks reuse the base's cache and correct only the words' paths. */
    struct gr_dfa *base;
    int32_t *base_st;
    uint8_t *on_trie;
} gr_dfa;

static inline int32_t gr_dfa_next(const gr_dfa *d, int32_t s, uint8_t b) { return d->next[s * d->ncls + d->cls[b]]; }

#define GR_MAX_DFA_STATES 20000
/* NFA states a subset construction may visit (closures and gathered successors): a hostile regex fails in about a
 * second instead of compiling for minutes; MaskBench's costliest pattern takes a quarter of it (docs/GRAMMAR.md) */
#define GR_MAX_DFA_WORK 250000000LL
/* GR_RE_JSONBODY: a piece of a string's literal (anchored), with its opening
 * and/or closing quote when GR_RE_OPEN / GR_RE_CLOSE are ORed in.
 * GR_RE_ALLESC (ORed in): printable ASCII characters also match as \u00XX
 * escapes, for a DFA that removes strings (every spelling must go).
 * GR_RE_UTF8 (ORed into GR_RE_PLAIN): a class's non-ASCII members are
 * whole UTF-8 characters rather than single bytes 0x80..0xff.
 * Groups (?i:...) and (?s:...) (or (?is:...)) match letters in either case
 * and let '.' take a newline. */
enum { GR_RE_PLAIN = 0, GR_RE_JSONSTR = 1, GR_RE_JSONBODY = 2, GR_RE_OPEN = 4, GR_RE_CLOSE = 8, GR_RE_ALLESC = 16,
       GR_RE_UTF8 = 32 };
/* Compile a regex to a DFA. In GR_RE_JSONSTR mode the regex is over decoded
 * string characters and the DFA matches their JSON encoding (escapes). */
osp_status gr_regex_dfa(const char *re, size_t len, int mode, gr_dfa *out);
void gr_dfa_free(gr_dfa *d);
/* The same through the process-wide cache of compiled regexes (a copy). */
osp_status gr_regex_dfa_cached(const char *re, int mode, gr_dfa *out);
/* The product of two DFAs: GR_DFA_AND accepts what both accept,
 * GR_DFA_MINUS what a accepts and b does not. */
enum { GR_DFA_AND = 0, GR_DFA_MINUS = 1 };
osp_status gr_dfa_product(const gr_dfa *a, const gr_dfa *b, int op, gr_dfa *out);
/* Remove from d's language a finite set of byte strings (d is replaced). */
osp_status gr_dfa_minus_words(gr_dfa *d, char *const *words, const size_t *lens, int n);

/* Grammar symbols: >= 0 a nonterminal, < 0 the terminal -sym-1. */
typedef struct gr_prod {
    int32_t lhs;
    uint32_t off, len; /* rhs = syms[off .. off+len) */
} gr_prod;

typedef struct gr_cache gr_cache;

struct osp_grammar {
    int32_t n_nt, n_prods, n_terms;
    gr_prod *prods;      /* sorted by lhs */
    int32_t *syms;
    int32_t *nt_first;   /* [n_nt + 1]: prods of nt a = [nt_first[a], nt_first[a+1]) */
    uint8_t *nullable;   /* [n_nt] */
    gr_dfa *terms;       /* [n_terms] */
    int32_t start;       /* the augmented start production */
    int32_t *term_vid;   /* [n_terms]: the vocab's id of each DFA (its mask cache), -1: none */
    const osp_grammar_vocab *cache_vocab;
};

/* Builder. */
typedef struct gr_builder {
    gr_prod *prods;
    int32_t n_prods, cap_prods;
    int32_t *syms;
    uint32_t n_syms, cap_syms;
    int32_t n_nt;
    gr_dfa *terms;
    char **term_key;
    int32_t n_terms, cap_terms;
    int32_t *key_slot; /* hash of term_key -> term index, -1 */
    uint32_t key_mask;
} gr_builder;

void gr_b_init(gr_builder *b);
void gr_b_free(gr_builder *b);
int32_t gr_b_nt(gr_builder *b);
osp_status gr_b_prod(gr_builder *b, int32_t lhs, const int32_t *rhs, uint32_t n);
/* A terminal from a regex (deduplicated by mode and text): its symbol. */
osp_status gr_b_regex(gr_builder *b, const char *re, int mode, int32_t *sym);
/* A terminal matching exactly these bytes. */
osp_status gr_b_lit(gr_builder *b, const char *s, size_t n, int32_t *sym);
/* A terminal given as a DFA (taken over). */
osp_status gr_b_dfa(gr_builder *b, gr_dfa *d, int32_t *sym);
/* Finish with `start` as the start symbol; b is emptied. */
osp_status gr_b_finish(gr_builder *b, int32_t start, osp_grammar **out);

/* Earley items and sets. An item waiting on a terminal carries the DFA
 * state of that terminal (1 = not started); others carry 0. */
typedef struct gr_item {
    uint32_t prod;
    uint32_t dot;
    uint32_t origin;
    int32_t st;
    int32_t sym; /* the next symbol (INT32_MAX: complete), kept for the completer's scans */
} gr_item;

typedef struct gr_parser {
    const osp_grammar *g;
    gr_item *items;
    uint32_t n_items, cap_items;
    uint32_t *set_start; /* set k = items[set_start[k] .. set_start[k+1]) */
    uint32_t n_sets, cap_sets;
    /* dedup of the set being built */
    uint32_t *hslot, *hstamp;
    uint32_t hmask, stamp;
} gr_parser;

osp_status gr_parser_init(gr_parser *p, const osp_grammar *g);
void gr_parser_free(gr_parser *p);
/* Open a new set; add items; close it (predict/complete). The set is
 * the last one; gr_parser_pop drops it. */
void gr_set_open(gr_parser *p);
void gr_set_add(gr_parser *p, uint32_t prod, uint32_t dot, uint32_t origin, int32_t st);
void gr_set_close(gr_parser *p);
void gr_parser_pop(gr_parser *p);
static inline uint32_t gr_set_size(const gr_parser *p, uint32_t k) {
    return (k + 1 < p->n_sets ? p->set_start[k + 1] : p->n_items) - p->set_start[k];
}
/* Step the last set by one byte into a new set; 0 (and nothing pushed)
 * when the byte is rejected. */
int gr_step(gr_parser *p, uint8_t b);
int gr_accepting(const gr_parser *p);
/* The next symbol of an item, or INT32_MAX when it is complete. */
static inline int32_t gr_next_sym(const osp_grammar *g, const gr_item *it) {
    (void)g;
    return it->sym;
}

/* Vocab trie in preorder: node n's subtree is [n, end), its first child
 * n + 1, a child's next sibling at the child's end. A whole-trie walk then
 * reads memory in order. */
typedef struct gr_node {
    uint32_t end;
    int32_t tok;     /* a token ending here, -1; more in dup_next */
    uint8_t byte;
} gr_node;

struct osp_grammar_vocab {
    int32_t n_tokens, eos_id;
    gr_node *nodes;
    uint32_t n_nodes;
    int32_t *dup_next; /* [n_tokens]: next token with the same bytes, -1 */
    char **tok_bytes;  /* [n_tokens] (NULL: none) */
    uint32_t *tok_len;
    int32_t max_len;
    /* Lexeme masks from the root, by (interned DFA, state), shared by every
     * grammar on this vocab: a JSON string's lexeme is one DFA whatever the
     * schema. Mutable behind the const vocab, safe from any thread (cache.c). */
    gr_cache *cache;
};

/* A cache entry, immutable once published: from the trie's root in one
 * (DFA, state), the tokens that stay inside the lexeme and the frontier
 * nodes where it can end with more bytes below. */
typedef struct gr_centry {
    uint64_t key;    /* vid << 32 | state */
    int32_t n_tok;   /* tokens inside */
    int32_t *toks;   /* list when n_tok is small, else NULL and bits set */
    uint32_t *bits;
    uint32_t *fnode; /* frontier nodes */
    int32_t *fstate;
    int32_t n_front;
} gr_centry;

gr_cache *gr_cache_new(void);
void gr_cache_free(gr_cache *c);
/* Intern g's lexemes in c once (g->term_vid); an error when g is already
 * bound to another vocab. */
/* The entries' memory budget (tests make it small to exercise clears). */
void gr_cache_set_budget(gr_cache *c, size_t bytes);
osp_status gr_cache_bind(gr_cache *c, osp_grammar *g, const osp_grammar_vocab *v);
/* A mask's entries are read between enter and leave (entries live until a
 * clear, which waits for every reader to leave). */
void gr_cache_enter(gr_cache *c);
void gr_cache_leave(gr_cache *c);
/* The entry of (vid, state) of DFA d, built on a miss; NULL: not cached
 * (vid < 0, or the cache is over its budget until the next clear). */
const gr_centry *gr_cache_get(gr_cache *c, const osp_grammar_vocab *v, int32_t vid, const gr_dfa *d, int32_t st);

#endif
