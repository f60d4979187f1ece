/* grammar/vocab: the tokens' byte strings and their trie.
 *
 * The trie is built once per tokenizer: nodes in breadth-first order, a
 * node's children contiguous and sorted by byte, so the mask walk reads
 * them as one run. Tokens with the same bytes chain through dup_next.
 */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar_internal.h"
#include "text/tokenizer.h"

/* GPT-2's byte-to-unicode alphabet, inverted: code point -> byte, -1. */
static void bytelevel_inverse(int16_t inv[324]) {
    for (int i = 0; i < 324; i++) inv[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        if (keep) inv[b] = (int16_t)b;
        else inv[256 + n++] = (int16_t)b;
    }
}

static int utf8_next(const char *s, size_t n, size_t *i) {
    uint8_t c = (uint8_t)s[*i];
    int len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (*i + len > n) return -1;
    int cp = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (int k = 1; k < len; k++) cp = cp << 6 | ((uint8_t)s[*i + k] & 0x3f);
    *i += len;
    return cp;
}



static int by_bytes(const void *a, const void *b, void *arg) {
    const osp_grammar_vocab *sort_v = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = sort_v->tok_len[x], ly = sort_v->tok_len[y];
    int c = memcmp(sort_v->tok_bytes[x], sort_v->tok_bytes[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Preorder over ranges of the sorted tokens: a node is the range [lo, hi)
 * of tokens sharing its prefix of d bytes. */
typedef struct tbuild {
    osp_grammar_vocab *v;
    const int32_t *ord;
    gr_node *nodes;
    uint32_t n, cap;
} tbuild;

static void emit(tbuild *t, int32_t lo, int32_t hi, uint32_t d, uint8_t byte) {
    osp_grammar_vocab *v = t->v;
    if (t->n == t->cap) {
        gr_node *a = osp_malloc(OSP_POOL_MISC, sizeof(gr_node) * t->cap * 2);
        memcpy(a, t->nodes, sizeof(gr_node) * t->n);
        osp_free(t->nodes);
        t->nodes = a, t->cap *= 2;
    }
    uint32_t me = t->n++;
    t->nodes[me] = (gr_node){0, -1, byte};
    int32_t i = lo, last = -1;
    while (i < hi && v->tok_len[t->ord[i]] == d) { /* tokens ending here come first */
        if (last < 0) t->nodes[me].tok = t->ord[i];
        else v->dup_next[last] = t->ord[i];
        last = t->ord[i++];
    }
    while (i < hi) {
        uint8_t c = (uint8_t)v->tok_bytes[t->ord[i]][d];
        int32_t j = i;
        while (j < hi && (uint8_t)v->tok_bytes[t->ord[j]][d] == c) j++;
        emit(t, i, j, d + 1, c);
        i = j;
    }
    t->nodes[me].end = t->n;
}

static osp_status build_trie(osp_grammar_vocab *v) {
    int32_t n = 0;
    int32_t *ord = osp_malloc(OSP_POOL_MISC, sizeof(int32_t) * (v->n_tokens + 1));
    for (int32_t i = 0; i < v->n_tokens; i++)
        if (v->tok_bytes[i] && v->tok_len[i]) ord[n++] = i;
    qsort_r(ord, n, sizeof(int32_t), by_bytes, v);
    for (int32_t i = 0; i < v->n_tokens; i++) v->dup_next[i] = -1;
    tbuild t = {v, ord, osp_malloc(OSP_POOL_MISC, sizeof(gr_node) * 1024), 0, 1024};
    emit(&t, 0, n, 0, 0);
    osp_free(ord);
    v->nodes = t.nodes, v->n_nodes = t.n;
    return OSP_OK;
}

static osp_status vocab_alloc(int32_t n, int32_t eos, osp_grammar_vocab **out) {
    osp_grammar_vocab *v = osp_calloc(OSP_POOL_MISC, sizeof *v);
    v->n_tokens = n, v->eos_id = eos;
    v->tok_bytes = osp_calloc(OSP_POOL_MISC, sizeof(char *) * (n + 1));
    v->tok_len = osp_calloc(OSP_POOL_MISC, sizeof(uint32_t) * (n + 1));
    v->dup_next = osp_calloc(OSP_POOL_MISC, sizeof(int32_t) * (n + 1));
    v->cache = gr_cache_new();
    *out = v;
    return OSP_OK;
}

osp_status osp_grammar_vocab_new(int32_t n, const char *const *bytes, const uint32_t *lens, int32_t eos_id,
                                 osp_grammar_vocab **out) {
    if (n <= 0) return osp_err(OSP_ERR_INVALID, "grammar vocab: no tokens");
    osp_grammar_vocab *v;
    OSP_TRY(vocab_alloc(n, eos_id, &v));
    for (int32_t i = 0; i < n; i++) {
        if (!bytes[i] || i == eos_id) continue;
        v->tok_bytes[i] = osp_malloc(OSP_POOL_MISC, lens[i] + 1);
        memcpy(v->tok_bytes[i], bytes[i], lens[i]);
        v->tok_len[i] = lens[i];
        if ((int32_t)lens[i] > v->max_len) v->max_len = (int32_t)lens[i];
    }
    build_trie(v);
    *out = v;
    return OSP_OK;
}

osp_status osp_grammar_vocab_from_tokenizer(const osp_tokenizer *t, osp_grammar_vocab **out) {
    const osp_tokenizer_info *info = osp_tokenizer_get_info(t);
    int32_t n = info->vocab_size;
    int sp = osp_tokenizer_token_id(t, "<0x0A>", 6) >= 0; /* SentencePiece byte fallback */
    int16_t inv[324];
    bytelevel_inverse(inv);
    osp_grammar_vocab *v;
    OSP_TRY(vocab_alloc(n, info->eos_id, &v));
    char *buf = osp_malloc(OSP_POOL_MISC, 4096);
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = osp_tokenizer_token_text(t, i, &len);
        if (!s || !len || osp_tokenizer_is_special(t, i) || len > 1000) continue;
        size_t m = 0, j = 0;
        int ok = 1;
        if (sp) {
            unsigned hb;
            if (len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && sscanf(s + 3, "%2x", &hb) == 1) buf[m++] = (char)hb;
            else
                while (j < len) {
                    if (j + 3 <= len && !memcmp(s + j, "\xe2\x96\x81", 3)) buf[m++] = ' ', j += 3;
                    else buf[m++] = s[j++];
                }
        } else {
            while (j < len && ok) {
                int cp = utf8_next(s, len, &j);
                if (cp < 0 || cp >= 324 || inv[cp] < 0) ok = 0;
                else buf[m++] = (char)inv[cp];
            }
            if (!ok) memcpy(buf, s, len), m = len; /* an added token spelled as plain text */
        }
        v->tok_bytes[i] = osp_malloc(OSP_POOL_MISC, m + 1);
        memcpy(v->tok_bytes[i], buf, m);
        v->tok_len[i] = (uint32_t)m;
        if ((int32_t)m > v->max_len) v->max_len = (int32_t)m;
    }
    osp_free(buf);
    build_trie(v);
    *out = v;
    return OSP_OK;
}

void osp_grammar_vocab_free(osp_grammar_vocab *v) {
    if (!v) return;
    for (int32_t i = 0; i < v->n_tokens; i++) osp_free(v->tok_bytes[i]);
    gr_cache_free(v->cache);
    osp_free(v->tok_bytes), osp_free(v->tok_len), osp_free(v->dup_next), osp_free(v->nodes);
    osp_free(v);
}
int32_t osp_grammar_vocab_size(const osp_grammar_vocab *v) { return v->n_tokens; }
int32_t osp_grammar_vocab_eos(const osp_grammar_vocab *v) { return v->eos_id; }
