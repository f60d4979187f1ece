/* text/tokenizer internals, shared by the tokenizer_*.c modules.
 *
 * Layout of a loaded tokenizer (all owned by it, freed by osp_tokenizer_free):
 *   - model vocabulary: one string pool; per id an offset/length into it
 *     (mstr[id].len == TK_NONE for ids that only exist as added tokens or
 *     not at all); an open-addressing map string -> id over those strings; a direct
 *     table code point -> id for single-character tokens below U+10000.
 *   - merges: an open-addressing map (left id, right id) -> (rank, merged id).
 *   - added tokens: an array, a per-id index into it, and two byte tries
 *     (tokens matched on the raw text, tokens matched on normalized text).
 *   - the pipeline: flat arrays of normalizer, pre-tokenizer and decoder
 *     steps (Sequences are flattened at load), post-processor prefix/suffix.
 *   - a bounded, direct-mapped cache word -> ids, guarded by a mutex that
 *     encode only try-locks (a busy cache means a call without cache).
 *
 * Encode state (tk_ctx) lives on the caller's stack and heap for one call.
 */
#ifndef OSP_TOKENIZER_INTERNAL_H
#define OSP_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include "core/core.h"
#include "text/tokenizer.h"

#define TK_NONE UINT32_MAX

/* ---- utilities (tokenizer_util.c) ---- */

typedef struct tk_buf {
    char *p;
    size_t n, cap;
} tk_buf;
osp_status tk_buf_reserve(tk_buf *b, size_t extra); /* room for n + extra (+1 for a NUL) */
osp_status tk_buf_put(tk_buf *b, const void *p, size_t n);
void tk_buf_free(tk_buf *b);

typedef struct tk_ivec {
    int32_t *p;
    size_t n, cap;
} tk_ivec;
osp_status tk_ivec_reserve(tk_ivec *v, size_t extra);
static inline osp_status tk_ivec_push(tk_ivec *v, int32_t x) {
    if (v->n == v->cap) OSP_TRY(tk_ivec_reserve(v, 1));
    v->p[v->n++] = x;
    return OSP_OK;
}
void tk_ivec_free(tk_ivec *v);

/* Chunked arena: pointers stay valid until tk_arena_free. */
typedef struct tk_chunk tk_chunk;
typedef struct tk_arena {
    tk_chunk *head;
    size_t chunk; /* size of the next chunk */
} tk_arena;
char *tk_arena_alloc(tk_arena *a, size_t n);
void tk_arena_free(tk_arena *a);
/* Forget every allocation but keep the newest chunk for reuse. */
void tk_arena_reset(tk_arena *a);

void *tk_grow(void *p, size_t n_old, size_t n_new, size_t elem); /* osp_malloc + copy + osp_free */
char *tk_strndup(const char *s, size_t n);

uint64_t tk_hash(const void *p, size_t n);
static inline uint64_t tk_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* UTF-8. Decoding helpers assume valid input. */
static inline int tk_u8len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
static inline uint32_t tk_u8dec(const char *s, int *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) { *len = 1; return u[0]; }
    if (u[0] < 0xE0) { *len = 2; return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F); }
    if (u[0] < 0xF0) {
        *len = 3;
        return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    }
    *len = 4;
    return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
           ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3F);
}
int tk_u8enc(uint32_t cp, char *out); /* 1..4 bytes */
size_t tk_utf8_valid_prefix(const char *s, size_t n); /* n when all valid */
int tk_utf8_seq_len(const char *s, size_t n);         /* valid sequence at s: its length, else <= 0 */
/* Rust's String::from_utf8_lossy: each maximal invalid subpart -> U+FFFD. */
osp_status tk_utf8_lossy(const char *s, size_t n, tk_buf *out);
/* Trailing bytes that are a proper prefix of a valid sequence (0..3). */
size_t tk_utf8_incomplete_tail(const char *s, size_t n);

/* Character classes as Rust's char methods define them (via utf8proc). */
int tk_is_white_space(uint32_t cp); /* char::is_whitespace (White_Space) */
int tk_is_numeric(uint32_t cp);     /* char::is_numeric: Nd, Nl, No */
int tk_is_punct(uint32_t cp);       /* ASCII punctuation or P* */
int tk_is_word(uint32_t cp);        /* regex \w */

/* The GPT-2 byte <-> unicode alphabet of ByteLevel. */
uint32_t tk_byte_cp(unsigned b);   /* the char standing for byte b */
int tk_cp_to_byte(uint32_t cp); /* -1 if not in the alphabet */

/* ---- patterns: a literal string or a PCRE2 regex (tokenizer_util.c) ---- */

typedef struct tk_pattern {
    int is_regex;
    char *s; /* literal (or the regex source, for messages) */
    size_t len;
    pcre2_code *re;
} tk_pattern;

typedef struct tk_span {
    uint32_t a, b;
} tk_span;
typedef struct tk_spans {
    tk_span *p;
    size_t n, cap;
} tk_spans;

/* Per-call regex state. */
typedef struct tk_rx {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
} tk_rx;
osp_status tk_rx_init(tk_rx *rx);
void tk_rx_free(tk_rx *rx);

osp_status tk_regex_compile(const char *src, size_t len, const char *what, pcre2_code **out);
osp_status tk_pattern_init(tk_pattern *p, const char *s, size_t len, int is_regex, const char *what);
void tk_pattern_free(tk_pattern *p);
/* Non-overlapping matches of p in s, left to right, appended to out. */
osp_status tk_pattern_find(const tk_pattern *p, const char *s, size_t n, tk_rx *rx, tk_spans *out);
osp_status tk_regex_find(const pcre2_code *re, const char *s, size_t n, tk_rx *rx, tk_spans *out);
osp_status tk_spans_push(tk_spans *v, uint32_t a, uint32_t b);

/* ---- pipeline steps ---- */

enum { TN_NFC, TN_NFD, TN_NFKC, TN_NFKD, TN_LOWER, TN_REPLACE, TN_PREPEND, TN_STRIP, TN_BERT, TN_PRECOMPILED };
enum { TK_BERT_CLEAN = 1, TK_BERT_CHINESE = 2, TK_BERT_ACCENTS = 4, TK_BERT_LOWER = 8 }; /* BertNormalizer's steps */
typedef struct tk_norm {
    int type;
    tk_pattern pat;
    char *content;      /* Precompiled: the charsmap's bytes (base64-decoded) */
    size_t content_len;
    int left, right;
    int flags;          /* BertNormalizer: TK_BERT_* */
} tk_norm;

enum { TB_REMOVED, TB_ISOLATED, TB_MERGED_PREV, TB_MERGED_NEXT, TB_CONTIGUOUS };
enum { TP_BYTELEVEL, TP_SPLIT, TP_METASPACE, TP_DIGITS, TP_PUNCT, TP_WHITESPACE, TP_WSPLIT };
enum { TK_PREPEND_NEVER, TK_PREPEND_FIRST, TK_PREPEND_ALWAYS };
typedef struct tk_pretok {
    int type;
    int behavior, invert;
    tk_pattern pat;
    int add_prefix_space, use_regex;
    uint32_t repl_cp;
    char repl[4];
    int repl_len;
    int prepend, split;
    int individual;
} tk_pretok;

enum { TD_BYTELEVEL, TD_BYTEFALLBACK, TD_FUSE, TD_STRIP, TD_REPLACE, TD_METASPACE, TD_WORDPIECE };
typedef struct tk_dec {
    int type;
    tk_pattern pat;
    char *content;
    size_t content_len;
    uint32_t cp; /* Strip content / Metaspace replacement */
    int start, stop;
    int prepend; /* Metaspace: prepend_scheme != never */
    int cleanup; /* WordPiece: transformers' clean_up_tokenization per token (content: the prefix) */
} tk_dec;

typedef struct tk_added {
    char *s;
    uint32_t len;
    int32_t id;
    uint8_t special, single_word, lstrip, rstrip, normalized;
} tk_added;

typedef struct tk_trie_node {
    int32_t child, sibling, tok; /* tok: index into added, -1 */
    uint8_t byte;
} tk_trie_node;
typedef struct tk_trie {
    tk_trie_node *nodes;
    int32_t n, cap;
    int32_t root[256];
    int used;
} tk_trie;

typedef struct tk_str {
    uint32_t off, len;
} tk_str;

typedef struct tk_pair_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX when empty */
    uint32_t rank;
    int32_t id;
} tk_pair_slot;

#define TK_CACHE_KEY 46
#define TK_CACHE_IDS 16
typedef struct tk_cache_ent {
    uint64_t h;
    uint8_t klen, nids;
    char key[TK_CACHE_KEY];
    int32_t ids[TK_CACHE_IDS];
} tk_cache_ent;

struct osp_tokenizer {
    osp_tokenizer_info info;
    char *name;

    /* model vocabulary */
    int32_t n_vocab;
    char *pool;
    size_t pool_n, pool_cap;
    tk_str *mstr;          /* [n_vocab] */
    uint64_t *vmap;        /* hash hi 32 | pool offset (0: empty) */
    uint32_t vmask;
    int32_t *cp_id; /* [0x10000] */

    /* merges */
    tk_pair_slot *pairs;
    uint32_t pmask;
    size_t n_pairs;

    /* the model: BPE (merges, the options below), WordPiece (cs_prefix, unk_id) or Unigram */
    int model;             /* TK_MODEL_* */
    int32_t wp_max_chars;  /* WordPiece: a longer word is one unk */
    double *uni_score;     /* [n_vocab] Unigram: each piece's score (log probability) */
    double uni_min_score;  /* Unigram: the lowest score (an unknown char costs it minus 10) */
    int32_t uni_max_len;   /* Unigram: the longest piece, in bytes */

    /* BPE options */
    int32_t unk_id;
    int fuse_unk, byte_fallback, ignore_merges;
    char *cs_prefix, *eow_suffix;
    size_t cs_prefix_len, eow_suffix_len;
    int32_t byte_tok[256];  /* <0xNN> tokens, -1 */
    int32_t bytechar_id[256]; /* token of ByteLevel's char for each byte, -1 */

    /* Words may be cut before `meta` (U+2581) when the char before it is
     * neither meta nor one of meta_bad: no merge joins across such a cut. */
    int split_meta, meta_scanned, meta_overflow;
    uint32_t meta_bad[16];
    int n_meta_bad;

    /* added tokens */
    tk_added *added;
    int32_t n_added;
    int32_t *added_of_id; /* [n_vocab] index into added, -1 */
    tk_trie trie_raw, trie_norm;

    /* pipeline */
    tk_norm *norm;
    int n_norm;
    tk_pretok *pre;
    int n_pre;
    tk_dec *dec;
    int n_dec, has_decoder;
    int32_t *pp_prefix, *pp_suffix;
    int n_prefix, n_suffix;
    pcre2_code *re_gpt2, *re_ws;

    /* cache */
    pthread_mutex_t cache_mu;
    tk_cache_ent *cache;
    uint32_t cache_mask;
};

/* ---- encode state (tokenizer.c) ---- */

typedef struct tk_piece {
    const char *s;
    uint32_t len;
    int32_t id;    /* >= 0: an added token, already resolved */
    uint8_t orig0; /* starts at offset 0 of the original text */
    uint8_t bl;    /* raw bytes still to be mapped by ByteLevel (deferred) */
} tk_piece;
typedef struct tk_pieces {
    tk_piece *p;
    size_t n, cap;
} tk_pieces;
osp_status tk_pieces_push(tk_pieces *v, tk_piece pc);

typedef struct tk_sym {
    int32_t c, prev, next;
    uint32_t len;
} tk_sym;
typedef struct tk_hent {
    uint32_t rank, pos;
    int32_t id, left, right;
} tk_hent;

typedef struct tk_ctx {
    const osp_tokenizer *t;
    tk_arena arena;
    tk_rx rx;
    tk_spans spans, segs, acc;
    tk_buf tmp, tmp2;
    tk_sym *sym;
    size_t sym_cap;
    tk_hent *heap;
    size_t heap_cap;
    int use_cache;
} tk_ctx;

/* ---- modules ---- */

/* tokenizer_json.c: a validating pull parser for the big file. */
typedef struct tk_json {
    const char *p, *beg, *end;
    const char *name;
} tk_json;
osp_status tkj_error(tk_json *j, const char *what);
void tkj_ws(tk_json *j);
osp_status tkj_skip(tk_json *j);
osp_status tkj_string(tk_json *j, tk_buf *out); /* decoded, out->n = length */
osp_status tkj_int(tk_json *j, int64_t *v);
osp_status tkj_expect(tk_json *j, char c);
/* Object / array iteration: call after '{' / '[' was consumed. Returns 1 when
 * a member follows (for objects the key is in *key and ':' consumed), 0 at
 * the end (closing bracket consumed), -1 on error (status in *st). */
int tkj_obj_next(tk_json *j, int *first, tk_buf *key, osp_status *st);
int tkj_arr_next(tk_json *j, int *first, osp_status *st);

/* tokenizer_load.c */
osp_status tk_vocab_find(const osp_tokenizer *t, const char *s, size_t n, int32_t *id);
static inline int32_t tk_vocab_get(const osp_tokenizer *t, const char *s, size_t n) {
    int32_t id;
    return tk_vocab_find(t, s, n, &id) == OSP_OK ? id : -1;
}
osp_status tk_vocab_build_map(osp_tokenizer *t);
osp_status tk_pairs_insert(osp_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id);
static inline const tk_pair_slot *tk_pairs_get(const osp_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = (uint32_t)tk_mix64(key) & t->pmask;
    for (;;) {
        const tk_pair_slot *s = &t->pairs[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & t->pmask;
    }
}
osp_status tk_finish_model(osp_tokenizer *t); /* cp_id, byte tables, meta split, cache */
osp_status tk_ids_resize(osp_tokenizer *t, int32_t n_vocab); /* grow the id range */
osp_status tk_pool_add(osp_tokenizer *t, int32_t id, const char *s, size_t n, uint32_t *off);

/* tokenizer_added.c */
osp_status tk_added_finish(osp_tokenizer *t); /* tries, per-id index; after normalizer */
void tk_added_free(osp_tokenizer *t);
osp_status tk_added_split(tk_ctx *c, const tk_trie *tr, const tk_piece *in, tk_pieces *out);

/* tokenizer_norm.c */
osp_status tk_norm_parse(osp_tokenizer *t, const void *json);
osp_status tk_normalize(tk_ctx *c, const char *s, size_t n, const char **out, size_t *out_n);
void tk_norm_free(tk_norm *n);

/* tokenizer_pretok.c */
osp_status tk_pretok_parse(osp_tokenizer *t, const void *json);
osp_status tk_pretokenize(tk_ctx *c, tk_pieces *a, tk_pieces *b, tk_pieces **result);
void tk_pretok_free(tk_pretok *p);
osp_status tk_split_spans(tk_ctx *c, const tk_piece *pc, const tk_spans *m, int behavior, int invert,
                          tk_pieces *out);
struct json_t;
osp_status tk_parse_prepend_scheme(osp_tokenizer *t, struct json_t *j, int *out);
osp_status tk_parse_pattern(osp_tokenizer *t, struct json_t *pat, const char *what, tk_pattern *out);

/* tokenizer_bpe.c */
osp_status tk_bpe_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out);
void tk_ctx_free_bpe(tk_ctx *c);

/* tokenizer_wordpiece.c: BertNormalizer, the WordPiece model */
enum { TK_MODEL_BPE, TK_MODEL_WORDPIECE, TK_MODEL_UNIGRAM };
osp_status tk_lowercase(tk_ctx *c, const char *s, size_t n, const char **o, size_t *on); /* tokenizer_norm.c */
osp_status tk_bert_normalize(tk_ctx *c, int flags, const char *s, size_t n, const char **o, size_t *on);
osp_status tk_wordpiece_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out);

/* tokenizer_unigram.c: the Unigram model (Viterbi), the Precompiled normalizer */
osp_status tk_unigram_parse_vocab(osp_tokenizer *t, tk_json *j); /* [[piece, score], ...] */
osp_status tk_unigram_piece(tk_ctx *c, const tk_piece *pc, tk_ivec *out);
osp_status tk_precompiled_parse(osp_tokenizer *t, tk_norm *st, const char *b64, size_t n);
osp_status tk_precompiled_normalize(tk_ctx *c, const tk_norm *st, const char *s, size_t n, const char **o,
                                    size_t *on);

/* tokenizer_decode.c */
osp_status tk_decoder_parse(osp_tokenizer *t, const void *json);
/* Decode `ids` (already filtered). first: the list starts the text (a
 * Metaspace decoder strips its first token's replacement only then).
 * *pending (may be NULL): the end of the text may still change when more
 * ids follow (an open byte-fallback run, an incomplete UTF-8 sequence). */
/* Working memory of tk_decode_ids kept between calls (the streaming
 * detokenizer decodes one small window per token without allocating). */
typedef struct tk_decode_scratch tk_decode_scratch;
tk_decode_scratch *tk_decode_scratch_new(void);
void tk_decode_scratch_free(tk_decode_scratch *s);
osp_status tk_decode_ids_s(const osp_tokenizer *t, const int32_t *ids, size_t n, int first, tk_buf *out,
                           int *pending, tk_decode_scratch *scratch);
osp_status tk_decode_ids(const osp_tokenizer *t, const int32_t *ids, size_t n, int first,
                         tk_buf *out, int *pending);
void tk_dec_free(tk_dec *d);
/* Why incremental decoding of this decoder chain would not be exact, or NULL. */
const char *tk_decoder_stream_problem(const osp_tokenizer *t);

/* tokenizer_post.c */
osp_status tk_post_parse(osp_tokenizer *t, const void *json);
osp_status tk_config_parse(osp_tokenizer *t, const char *cfg_text, size_t n); /* cfg_text may be NULL */

/* tokenizer.c */
osp_status tk_tokenizer_new(const char *name, osp_tokenizer **out);
osp_status tk_ctx_init(tk_ctx *c, const osp_tokenizer *t);
void tk_ctx_free(tk_ctx *c);

#endif
